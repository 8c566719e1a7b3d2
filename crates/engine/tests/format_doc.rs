//! A reader written from docs/format.md alone (its own CRC, its own offsets, its own layout formulas) finds every
//! array byte in the member files the engine wrote.

mod common;

use common::{crc32c_bitwise, le32, le64, reference, Rng, TempDir};
use paraid_engine::layout::Level;
use paraid_engine::{assemble, create, AssembleOptions, CreateOptions};

struct Member {
    bytes: Vec<u8>,
    level: u32,
    chunk: u64,
    n: u64,
    slot: u64,
    data_offset: u64,
    data_bytes: u64,
    array_bytes: u64,
}

fn parse(bytes: Vec<u8>) -> Member {
    assert_eq!(&bytes[0..8], b"PARAIDSB");
    assert_eq!(le32(&bytes, 8), 2, "format version");
    assert_eq!(
        crc32c_bitwise(&bytes[..4092]),
        le32(&bytes, 4092),
        "checksum"
    );
    assert_eq!(le32(&bytes, 184), 1024);
    Member {
        level: le32(&bytes, 80),
        chunk: le64(&bytes, 88),
        n: le32(&bytes, 96) as u64,
        slot: le32(&bytes, 100) as u64,
        data_offset: le64(&bytes, 104),
        data_bytes: le64(&bytes, 112),
        array_bytes: le64(&bytes, 120),
        bytes,
    }
}

/// (member slot, row) of copy `copy` of chunk `c`, per the document.
fn cell(level: u32, n: u64, c: u64, copy: u64) -> (u64, u64) {
    match level {
        0 => (c % n, c / n),
        1 => (copy, c),
        10 => {
            let p = 2 * c + copy;
            (p % n, p / n)
        }
        5 | 6 => {
            let k = if level == 5 { n - 1 } else { n - 2 };
            let (s, i) = (c / k, c % k);
            let pd = n - 1 - s % n;
            let skip = if level == 5 { 1 } else { 2 };
            ((pd + skip + i) % n, s)
        }
        other => panic!("level {other}"),
    }
}

#[test]
fn foreign_reader_finds_every_byte() {
    for (level, members, chunk) in [
        (Level::Raid0, 3, 4096u64),
        (Level::Raid1, 2, 8192),
        (Level::Raid5, 5, 16384),
        (Level::Raid6, 6, 4096),
        (Level::Raid10, 3, 8192),
    ] {
        let dir = TempDir::new("format-doc");
        let paths = dir.members(members);
        create(&CreateOptions {
            force: false,
            level,
            chunk_bytes: chunk,
            name: "doc".into(),
            size_bytes: Some((4 << 20) + 16 * chunk),
            members: paths.clone(),
        })
        .expect("create");
        let array = assemble(&paths, AssembleOptions::new(reference())).expect("assemble");
        let mut model = vec![0u8; array.size_bytes() as usize];
        Rng::new(members as u64).fill(&mut model);
        array.write(0, &model, false).expect("write");
        array.stop().expect("stop");

        // Members in slot order, found by their superblocks (the files are passed shuffled).
        let mut parsed: Vec<Member> = paths
            .iter()
            .rev()
            .map(|p| parse(std::fs::read(p).expect("read")))
            .collect();
        parsed.sort_by_key(|m| m.slot);
        let m0 = &parsed[0];
        let (lvl, n, c_bytes) = (m0.level, m0.n, m0.chunk);
        assert_eq!(lvl, level.code());
        assert_eq!(m0.array_bytes, model.len() as u64);
        let copies = match lvl {
            1 => n,
            10 => 2,
            _ => 1,
        };
        let mut x = 0u64;
        while x < m0.array_bytes {
            let (c, o) = (x / c_bytes, x % c_bytes);
            for copy in 0..copies {
                let (slot, row) = cell(lvl, n, c, copy);
                let m = &parsed[slot as usize];
                assert!(row * c_bytes < m.data_bytes);
                let at = (m.data_offset + row * c_bytes + o) as usize;
                assert_eq!(
                    m.bytes[at], model[x as usize],
                    "{level}: array byte {x} copy {copy}"
                );
            }
            x += 97; // a stride coprime to every chunk size visits every in-chunk offset class
        }
    }
}
