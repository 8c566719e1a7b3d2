//! Sizes on the examples' command lines: bytes, or a number with K, M or G (binary units).

/// `text` as bytes: digits, then optionally K, M or G (KiB, MiB, GiB).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let (digits, shift) = match text.chars().last() {
        Some('K' | 'k') => (&text[..text.len() - 1], 10),
        Some('M' | 'm') => (&text[..text.len() - 1], 20),
        Some('G' | 'g') => (&text[..text.len() - 1], 30),
        _ => (text, 0),
    };
    let value: u64 = digits.parse().map_err(|_| format!("bad size {text:?}"))?;
    value
        .checked_shl(shift)
        .filter(|v| v >> shift == value)
        .ok_or_else(|| format!("size {text:?} too large"))
}
