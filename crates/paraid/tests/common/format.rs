//! An independent reader of paraid members, written from docs/format.md alone (not from the engine's code):
//! it parses superblocks, reassembles the array from the member files and checks every stripe's redundancy.
#![allow(dead_code)]

use std::path::PathBuf;

use paraid_parity::Backend;

pub struct Member {
    pub slot: usize,
    pub members: usize,
    pub level: u32,
    pub chunk_bytes: u64,
    pub data_offset_bytes: u64,
    pub data_bytes: u64,
    pub array_bytes: u64,
    pub events: u64,
    pub state: u32,
    pub bytes: Vec<u8>,
}

fn le_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

fn le_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

/// CRC-32C as the document gives it: reflected 0x82F63B78, init and final XOR 0xFFFFFFFF.
fn crc32c(bytes: &[u8]) -> u32 {
    let mut crc = 0xffff_ffffu32;
    for &b in bytes {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0x82f6_3b78
            } else {
                crc >> 1
            };
        }
    }
    crc ^ 0xffff_ffff
}

pub fn read_member(path: &PathBuf) -> Member {
    let bytes = std::fs::read(path).unwrap();
    let sb = &bytes[..4096];
    assert_eq!(&sb[0..8], b"PARAIDSB", "{}: magic", path.display());
    assert_eq!(
        le_u32(sb, 4092),
        crc32c(&sb[..4092]),
        "{}: checksum",
        path.display()
    );
    let version = le_u32(sb, 8);
    assert!(
        version == 1 || version == 2,
        "{}: format version {version}",
        path.display()
    );
    Member {
        level: le_u32(sb, 80),
        chunk_bytes: le_u64(sb, 88),
        members: le_u32(sb, 96) as usize,
        slot: le_u32(sb, 100) as usize,
        data_offset_bytes: le_u64(sb, 104),
        data_bytes: le_u64(sb, 112),
        array_bytes: le_u64(sb, 120),
        events: le_u64(sb, 128),
        state: le_u32(sb, 136),
        bytes,
    }
}

/// The members in slot order (asserting every slot is present exactly once and they agree on the geometry).
pub fn read_array(paths: &[PathBuf]) -> Vec<Member> {
    let mut members: Vec<Member> = paths.iter().map(read_member).collect();
    members.sort_by_key(|m| m.slot);
    for (i, m) in members.iter().enumerate() {
        assert_eq!(m.slot, i, "slots 0..n each once");
        assert_eq!(m.members, members.len());
        assert_eq!(m.chunk_bytes, members[0].chunk_bytes);
        assert_eq!(m.data_offset_bytes, members[0].data_offset_bytes);
        assert_eq!(m.data_bytes, members[0].data_bytes);
        assert_eq!(m.events, members[0].events, "events agree");
    }
    members
}

/// Cell (member, row) bytes.
fn cell(members: &[Member], member: usize, row: u64) -> &[u8] {
    let m = &members[member];
    let at = (m.data_offset_bytes + row * m.chunk_bytes) as usize;
    &m.bytes[at..at + m.chunk_bytes as usize]
}

/// Reassembles the whole array from the members by the document's geometry, and checks every stripe's parity
/// (RAID5/6, with the Reference backend) or that every copy agrees (RAID1/10). Returns the array bytes.
pub fn reassemble_and_check(members: &[Member]) -> Vec<u8> {
    let n = members.len();
    let c = members[0].chunk_bytes;
    let rows = members[0].data_bytes / c;
    let level = members[0].level;
    let mut array = Vec::with_capacity(members[0].array_bytes as usize);
    match level {
        0 => {
            for chunk in 0..n as u64 * rows {
                array.extend_from_slice(cell(
                    members,
                    (chunk % n as u64) as usize,
                    chunk / n as u64,
                ));
            }
        }
        1 => {
            for row in 0..rows {
                let first = cell(members, 0, row);
                for m in 1..n {
                    assert!(
                        cell(members, m, row) == first,
                        "RAID1 row {row}: member {m} differs from member 0"
                    );
                }
                array.extend_from_slice(first);
            }
        }
        10 => {
            for chunk in 0..(n as u64 * rows) / 2 {
                let (p0, p1) = (2 * chunk, 2 * chunk + 1);
                let a = cell(members, (p0 % n as u64) as usize, p0 / n as u64);
                let b = cell(members, (p1 % n as u64) as usize, p1 / n as u64);
                assert!(a == b, "RAID10 chunk {chunk}: copies differ");
                array.extend_from_slice(a);
            }
        }
        5 | 6 => {
            let k = if level == 5 { n - 1 } else { n - 2 };
            let reference = paraid_parity::reference::Reference;
            for s in 0..rows {
                let pd = n - 1 - (s % n as u64) as usize;
                let data_member = |i: usize| {
                    if level == 5 {
                        (pd + 1 + i) % n
                    } else {
                        (pd + 2 + i) % n
                    }
                };
                let mut stripe: Vec<&[u8]> =
                    (0..k).map(|i| cell(members, data_member(i), s)).collect();
                for d in &stripe {
                    array.extend_from_slice(d);
                }
                stripe.push(cell(members, pd, s));
                if level == 6 {
                    stripe.push(cell(members, (pd + 1) % n, s));
                }
                let outcome = reference.check(&stripe, level == 6);
                assert_eq!(
                    outcome,
                    paraid_parity::CheckOutcome::Consistent,
                    "stripe {s} parity (level {level})"
                );
            }
        }
        other => panic!("unknown level {other}"),
    }
    assert_eq!(
        array.len() as u64,
        members[0].array_bytes,
        "capacity formula"
    );
    array
}
