//! Byte sizes as people type them: `64K`, `1M`, `4KiB`, `2G`, `4096`. Binary multiples (K = 1024), as mdadm.

/// Parses a size with an optional binary suffix (K, M, G, T, optionally followed by `iB` or `B`).
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let digits_end = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (digits, suffix) = trimmed.split_at(digits_end);
    if digits.is_empty() {
        return Err(format!(
            "'{text}' is not a size: expected a number with an optional K/M/G/T suffix"
        ));
    }
    let number: u64 = digits
        .parse()
        .map_err(|_| format!("'{text}' is too large a size"))?;
    let shift = match suffix.to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        "T" | "TB" | "TIB" => 40,
        _ => {
            return Err(format!(
                "'{text}' has an unknown size suffix '{suffix}': use K, M, G or T"
            ))
        }
    };
    number
        .checked_mul(1u64 << shift)
        .ok_or_else(|| format!("'{text}' is too large a size"))
}

/// Renders a byte count the way people read it: `64 KiB`, `1.5 GiB`.
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 || value.fract() == 0.0 {
        format!("{} {}", value as u64, UNITS[unit])
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_suffixes() {
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes("64K"), Ok(65536));
        assert_eq!(parse_bytes("64k"), Ok(65536));
        assert_eq!(parse_bytes("1MiB"), Ok(1 << 20));
        assert_eq!(parse_bytes("2G"), Ok(2 << 30));
        assert_eq!(parse_bytes("1T"), Ok(1 << 40));
    }

    #[test]
    fn rejects_nonsense() {
        assert!(parse_bytes("").is_err());
        assert!(parse_bytes("K").is_err());
        assert!(parse_bytes("12Q").is_err());
        assert!(parse_bytes("-5").is_err());
        assert!(parse_bytes("99999999999T").is_err());
    }

    #[test]
    fn formats_human_sizes() {
        assert_eq!(format_bytes(512), "512 B");
        assert_eq!(format_bytes(65536), "64 KiB");
        assert_eq!(format_bytes(3 << 29), "1.5 GiB");
    }
}
