//! Random (version 4) UUIDs naming arrays and members.

use std::fmt;
use std::io::Read;

#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Uuid(pub [u8; 16]);

impl Uuid {
    /// 16 bytes from /dev/urandom with the RFC 4122 version (4) and variant bits set.
    pub fn random() -> std::io::Result<Uuid> {
        let mut bytes = [0u8; 16];
        std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
        bytes[6] = (bytes[6] & 0x0f) | 0x40;
        bytes[8] = (bytes[8] & 0x3f) | 0x80;
        Ok(Uuid(bytes))
    }

    pub fn is_nil(&self) -> bool {
        self.0 == [0u8; 16]
    }
}

impl fmt::Display for Uuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, b) in self.0.iter().enumerate() {
            if matches!(i, 4 | 6 | 8 | 10) {
                f.write_str("-")?;
            }
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Uuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl serde::Serialize for Uuid {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

#[cfg(test)]
mod tests {
    use super::Uuid;

    #[test]
    fn random_uuids_differ_and_format() {
        let a = Uuid::random().expect("urandom");
        let b = Uuid::random().expect("urandom");
        assert_ne!(a, b);
        let text = a.to_string();
        assert_eq!(text.len(), 36);
        assert_eq!(&text[14..15], "4", "version nibble in {text}");
        assert!(
            matches!(&text[19..20], "8" | "9" | "a" | "b"),
            "variant in {text}"
        );
    }
}
