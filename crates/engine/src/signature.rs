//! What else a member may hold: the on-disk signatures of filesystems, partition tables and other volume managers,
//! so that `create` refuses to overwrite them unless forced (as mdadm asks before it does). Signatures are the
//! documented magic numbers at their fixed offsets; a device that holds none of them is not proof of emptiness,
//! only of nothing recognised.

/// Bytes `create` reads from the start of a member to look for signatures: covers btrfs's superblock at 64 KiB.
pub(crate) const SCAN_BYTES: usize = 68 << 10;

/// (offset in bytes, magic bytes, what a user calls it). More specific entries first: an NTFS or FAT boot sector
/// also ends in the DOS signature.
const SIGNATURES: &[(usize, &[u8], &str)] = &[
    (0, b"XFSB", "an XFS filesystem"),
    (65536 + 64, b"_BHRfS_M", "a btrfs filesystem"),
    (1024 + 56, &[0x53, 0xef], "an ext2/3/4 filesystem"),
    (1024, &[0x10, 0x20, 0xf5, 0xf2], "an F2FS filesystem"),
    (0, b"LUKS\xba\xbe", "a LUKS encrypted volume"),
    (0, b"SQSH", "a squashfs image"),
    (512, b"LABELONE", "an LVM physical volume"),
    (
        4096,
        &[0xfc, 0x4e, 0x2b, 0xa9],
        "a Linux md RAID member (superblock 1.2)",
    ),
    (
        0,
        &[0xfc, 0x4e, 0x2b, 0xa9],
        "a Linux md RAID member (superblock 1.1)",
    ),
    (4096 - 10, b"SWAPSPACE2", "a swap area"),
    (512, b"EFI PART", "a GPT partition table"),
    (3, b"NTFS    ", "an NTFS filesystem"),
    (54, b"FAT", "a FAT filesystem"),
    (82, b"FAT32", "a FAT filesystem"),
    (510, &[0x55, 0xaa], "a DOS partition table or boot sector"),
];

/// The first known signature found in `head` (the member's first bytes, at most `SCAN_BYTES`).
pub(crate) fn foreign_signature(head: &[u8]) -> Option<&'static str> {
    SIGNATURES
        .iter()
        .find(|(offset, magic, _)| head.get(*offset..offset + magic.len()) == Some(*magic))
        .map(|(_, _, what)| *what)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_signature_is_found_at_its_offset_and_nowhere_else() {
        for (offset, magic, what) in SIGNATURES {
            let mut head = vec![0u8; SCAN_BYTES];
            head[*offset..offset + magic.len()].copy_from_slice(magic);
            assert_eq!(foreign_signature(&head), Some(*what), "{what} at {offset}");
            // One byte off is something else (or nothing).
            let mut shifted = vec![0u8; SCAN_BYTES];
            shifted[offset + 1..offset + 1 + magic.len()].copy_from_slice(magic);
            assert_ne!(
                foreign_signature(&shifted),
                Some(*what),
                "{what} found one byte off"
            );
        }
    }

    #[test]
    fn zeros_and_short_heads_hold_nothing() {
        assert_eq!(foreign_signature(&vec![0u8; SCAN_BYTES]), None);
        assert_eq!(foreign_signature(&[]), None);
        // A file shorter than an offset: the signature there is simply absent.
        assert_eq!(foreign_signature(&[0x55; 100]), None);
    }

    #[test]
    fn a_boot_sector_of_a_filesystem_is_named_for_the_filesystem() {
        let mut head = vec![0u8; SCAN_BYTES];
        head[3..11].copy_from_slice(b"NTFS    ");
        head[510..512].copy_from_slice(&[0x55, 0xaa]);
        assert_eq!(foreign_signature(&head), Some("an NTFS filesystem"));
    }
}
