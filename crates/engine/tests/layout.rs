//! Exhaustive layout checks on small geometries: every member count 2..=16 the level allows, several chunk sizes,
//! every cell of a few rows (two full parity rotations).

use std::collections::HashMap;

use paraid_engine::layout::{ByteAddr, ChunkAddr, Geometry, Level, Role};

const LEVELS: [Level; 5] = [
    Level::Raid0,
    Level::Raid1,
    Level::Raid5,
    Level::Raid6,
    Level::Raid10,
];
const CHUNKS: [u64; 3] = [4096, 65536, 1 << 20];

fn geometries() -> impl Iterator<Item = Geometry> {
    LEVELS.into_iter().flat_map(|level| {
        (level.min_members()..=16).flat_map(move |members| {
            CHUNKS.into_iter().flat_map(move |chunk_bytes| {
                // Rows: a partial rotation, exactly two rotations, and two rotations plus one (odd cell counts).
                [1u64, 3, 2 * members as u64, 2 * members as u64 + 1]
                    .into_iter()
                    .map(move |rows| {
                        Geometry::new(level, members, chunk_bytes, rows * chunk_bytes)
                            .expect("valid geometry")
                    })
            })
        })
    })
}

/// Every data chunk copy and every parity chunk lands in its own cell; the cells used are exactly what the
/// level's capacity says; `role` is the inverse of the placement.
#[test]
fn cells_are_used_exactly_once() {
    let mut checked = 0;
    for g in geometries() {
        let mut owner: HashMap<ChunkAddr, Role> = HashMap::new();
        let mut claim = |addr: ChunkAddr, role: Role| {
            assert!(
                addr.member < g.members && addr.row < g.rows,
                "{g:?}: {role:?} outside at {addr:?}"
            );
            if let Some(previous) = owner.insert(addr, role) {
                panic!("{g:?}: {role:?} and {previous:?} collide at {addr:?}");
            }
        };
        for chunk in 0..g.data_chunks() {
            for copy in 0..g.copies() {
                claim(g.chunk_copy(chunk, copy), Role::Data { chunk, copy });
            }
        }
        if g.level.has_parity() {
            for stripe in 0..g.stripes() {
                claim(
                    ChunkAddr {
                        member: g.p_member(stripe),
                        row: stripe,
                    },
                    Role::P { stripe },
                );
                if g.level == Level::Raid6 {
                    claim(
                        ChunkAddr {
                            member: g.q_member(stripe),
                            row: stripe,
                        },
                        Role::Q { stripe },
                    );
                }
            }
        }
        let cells = g.members as u64 * g.rows;
        let used = owner.len() as u64;
        match g.level {
            // RAID10 leaves one cell unused when members * rows is odd.
            Level::Raid10 => assert_eq!(used, cells - cells % 2, "{g:?}"),
            _ => assert_eq!(used, cells, "{g:?}"),
        }
        assert_eq!(
            g.data_chunks() * g.copies() as u64 + g.stripes() * g.level.parity_chunks() as u64,
            used
        );
        for member in 0..g.members {
            for row in 0..g.rows {
                let addr = ChunkAddr { member, row };
                let expected = owner.get(&addr).copied().unwrap_or(Role::Unused);
                assert_eq!(g.role(addr), expected, "{g:?} at {addr:?}");
            }
        }
        checked += 1;
    }
    assert!(checked > 500, "only {checked} geometries");
}

/// Copies of one chunk are on different members (a member loss never takes all copies), and in RAID5/6 the
/// parity of a stripe is never on a member holding that stripe's data (nor P on Q's member).
#[test]
fn redundancy_is_on_distinct_members() {
    for g in geometries() {
        for chunk in 0..g.data_chunks() {
            let mut members: Vec<usize> = (0..g.copies())
                .map(|c| g.chunk_copy(chunk, c).member)
                .collect();
            members.sort_unstable();
            members.dedup();
            assert_eq!(members.len(), g.copies(), "{g:?} chunk {chunk}");
        }
        if !g.level.has_parity() {
            continue;
        }
        let k = g.data_per_stripe();
        for stripe in 0..g.stripes() {
            let mut members: Vec<usize> = (0..k + g.level.parity_chunks())
                .map(|i| g.stripe_member(stripe, i))
                .collect();
            for (i, &m) in members.iter().enumerate() {
                assert_eq!(
                    g.stripe_index(stripe, m),
                    i,
                    "{g:?} stripe {stripe}: stripe_index inverse"
                );
            }
            members.sort_unstable();
            members.dedup();
            assert_eq!(
                members.len(),
                g.members,
                "{g:?} stripe {stripe}: a member holds two chunks"
            );
        }
    }
}

/// The formulas of the issue (md's left-symmetric and near-2), computed independently here.
#[test]
fn placement_matches_the_md_formulas() {
    for g in geometries() {
        let n = g.members as u64;
        for chunk in 0..g.data_chunks() {
            match g.level {
                Level::Raid0 => {
                    assert_eq!(
                        g.chunk_copy(chunk, 0),
                        ChunkAddr {
                            member: (chunk % n) as usize,
                            row: chunk / n
                        }
                    )
                }
                Level::Raid1 => {
                    for copy in 0..g.members {
                        assert_eq!(
                            g.chunk_copy(chunk, copy),
                            ChunkAddr {
                                member: copy,
                                row: chunk
                            }
                        );
                    }
                }
                Level::Raid10 => {
                    for r in 0..2u64 {
                        let pos = 2 * chunk + r;
                        let expect = ChunkAddr {
                            member: (pos % n) as usize,
                            row: pos / n,
                        };
                        assert_eq!(g.chunk_copy(chunk, r as usize), expect);
                    }
                }
                Level::Raid5 | Level::Raid6 => {
                    let k = if g.level == Level::Raid5 {
                        n - 1
                    } else {
                        n - 2
                    };
                    let (s, i) = (chunk / k, chunk % k);
                    let p = n - 1 - s % n;
                    let skip = if g.level == Level::Raid5 { 1 } else { 2 };
                    let member = ((p + skip + i) % n) as usize;
                    assert_eq!(g.chunk_copy(chunk, 0), ChunkAddr { member, row: s });
                    assert_eq!(g.p_member(s), p as usize);
                    if g.level == Level::Raid6 {
                        assert_eq!(g.q_member(s), ((p + 1) % n) as usize);
                    }
                }
            }
        }
    }
}

/// The textbook left-symmetric RAID5 table of 4 members (md's default): D = data chunk number, P = parity.
#[test]
fn raid5_left_symmetric_table_of_four() {
    let table = [
        ["0", "1", "2", "P"],
        ["4", "5", "P", "3"],
        ["8", "P", "6", "7"],
        ["P", "9", "10", "11"],
    ];
    let g = Geometry::new(Level::Raid5, 4, 4096, 4 * 4096).expect("geometry");
    for (row, cells) in table.iter().enumerate() {
        for (member, cell) in cells.iter().enumerate() {
            let role = g.role(ChunkAddr {
                member,
                row: row as u64,
            });
            let text = match role {
                Role::Data { chunk, .. } => chunk.to_string(),
                Role::P { .. } => "P".to_string(),
                other => panic!("unexpected {other:?}"),
            };
            assert_eq!(&text, cell, "row {row} member {member}");
        }
    }
}

/// Byte level: every sampled array byte maps, per copy, to one member byte that maps back; consecutive bytes in
/// a chunk are consecutive on the member.
#[test]
fn byte_map_round_trips() {
    for g in geometries().filter(|g| g.chunk_bytes == 4096 && g.rows <= 3) {
        let array_bytes = g.array_bytes();
        let mut offset = 0u64;
        while offset < array_bytes {
            for copy in 0..g.copies() {
                let addr = g.map(offset, copy);
                assert!(addr.data_offset_bytes < g.member_data_bytes());
                assert_eq!(g.unmap(addr), Some((offset, copy)), "{g:?} byte {offset}");
                if offset % g.chunk_bytes != g.chunk_bytes - 1 {
                    let next = g.map(offset + 1, copy);
                    assert_eq!(
                        next,
                        ByteAddr {
                            member: addr.member,
                            data_offset_bytes: addr.data_offset_bytes + 1
                        }
                    );
                }
            }
            // A stride coprime to the chunk size visits every in-chunk offset class over the array.
            offset += 509;
        }
        // Chunk edges exactly.
        for chunk in 0..g.data_chunks() {
            for offset in [chunk * g.chunk_bytes, (chunk + 1) * g.chunk_bytes - 1] {
                assert_eq!(g.unmap(g.map(offset, 0)), Some((offset, 0)));
            }
        }
    }
}

#[test]
fn capacity_per_level() {
    for g in geometries() {
        let n = g.members as u64;
        let expect_chunks = match g.level {
            Level::Raid0 => n * g.rows,
            Level::Raid1 => g.rows,
            Level::Raid5 => (n - 1) * g.rows,
            Level::Raid6 => (n - 2) * g.rows,
            Level::Raid10 => n * g.rows / 2,
        };
        assert_eq!(g.data_chunks(), expect_chunks, "{g:?}");
        assert_eq!(g.array_bytes(), expect_chunks * g.chunk_bytes);
    }
}

/// Which sets of missing members each level survives, checked by brute force against the placement itself.
#[test]
fn survives_matches_brute_force() {
    for level in LEVELS {
        for members in level.min_members()..=8 {
            let g =
                Geometry::new(level, members, 4096, 2 * members as u64 * 4096).expect("geometry");
            for mask in 0u32..(1 << members) {
                let missing: Vec<bool> = (0..members).map(|m| mask & (1 << m) != 0).collect();
                let lost = missing.iter().filter(|m| **m).count();
                let every_chunk_readable = match level {
                    Level::Raid5 | Level::Raid6 => lost <= level.parity_chunks(),
                    _ => (0..g.data_chunks()).all(|c| {
                        (0..g.copies()).any(|copy| !missing[g.chunk_copy(c, copy).member])
                    }),
                };
                assert_eq!(
                    g.survives(&missing),
                    every_chunk_readable,
                    "{level} n={members} missing {missing:?}"
                );
            }
        }
    }
}

#[test]
fn bad_geometry_refused() {
    assert!(
        Geometry::new(Level::Raid5, 4, 12288, 1 << 20).is_err(),
        "non power of two"
    );
    assert!(
        Geometry::new(Level::Raid5, 4, 2048, 1 << 20).is_err(),
        "below 4 KiB"
    );
    assert!(
        Geometry::new(Level::Raid5, 4, 32 << 20, 1 << 30).is_err(),
        "above 16 MiB"
    );
    assert!(
        Geometry::new(Level::Raid5, 2, 4096, 1 << 20).is_err(),
        "too few for RAID5"
    );
    assert!(
        Geometry::new(Level::Raid6, 3, 4096, 1 << 20).is_err(),
        "too few for RAID6"
    );
    assert!(
        Geometry::new(Level::Raid1, 1, 4096, 1 << 20).is_err(),
        "too few for RAID1"
    );
    let passthrough = Geometry::new(Level::Raid0, 1, 4096, 1 << 20).expect("RAID0 of one member");
    assert_eq!(
        passthrough.array_bytes(),
        1 << 20,
        "a passthrough exposes its member whole"
    );
    assert!(
        Geometry::new(Level::Raid0, 65, 4096, 1 << 20).is_err(),
        "too many"
    );
    assert!(
        Geometry::new(Level::Raid0, 4, 65536, 4096).is_err(),
        "no room for a chunk"
    );
}

#[test]
fn level_parse_and_display() {
    for (word, level) in [
        ("0", Level::Raid0),
        ("raid1", Level::Raid1),
        ("RAID5", Level::Raid5),
        ("6", Level::Raid6),
    ] {
        assert_eq!(word.parse::<Level>(), Ok(level));
    }
    assert_eq!(
        "10".parse::<Level>().map(|l| l.to_string()),
        Ok("raid10".to_string())
    );
    let err = "raid7".parse::<Level>().expect_err("raid7");
    assert!(err.to_string().contains("raid7"), "{err}");
}
