//! Array read/write on in-memory members for every level against a byte model; member bytes checked directly.

mod common;

use common::{mem_array, random_extent, verify_array_members, Rng};
use paraid_engine::layout::Level;
use paraid_engine::MemberIo;

const LEVELS: [Level; 5] = [
    Level::Raid0,
    Level::Raid1,
    Level::Raid5,
    Level::Raid6,
    Level::Raid10,
];

/// (members, chunk_bytes) per level: small and large chunks, odd and even counts, up to 16 members.
fn grid(level: Level) -> Vec<(usize, u64)> {
    let mut grid = vec![
        (3, 4096),
        (4, 65536),
        (5, 16384),
        (8, 4096),
        (16, 65536),
        (6, 1 << 20),
    ];
    if level == Level::Raid6 {
        grid[0] = (4, 4096);
    }
    if level == Level::Raid0 {
        grid.push((1, 16384)); // the passthrough: one member, no striping
    }
    grid
}

fn round_trip(level: Level, members: usize, chunk_bytes: u64, seed: u64) {
    let rows = if chunk_bytes >= 1 << 20 { 3 } else { 6 };
    let (io, array) = mem_array(level, members, chunk_bytes, rows);
    let g = array.geometry();
    let size = array.size_bytes();
    assert_eq!(size, g.array_bytes());
    let mut model = vec![0u8; size as usize];
    let mut rng = Rng::new(seed);
    let mut data = Vec::new();
    let ops = 60;
    for op in 0..ops {
        let (offset, len) = random_extent(&mut rng, size, g.stripe_bytes());
        data.resize(len, 0);
        rng.fill(&mut data);
        array.write(offset, &data, op % 7 == 0).expect("write");
        model[offset as usize..offset as usize + len].copy_from_slice(&data);
        let (offset, len) = random_extent(&mut rng, size, g.stripe_bytes());
        let mut got = vec![0u8; len];
        array.read(offset, &mut got).expect("read");
        assert!(
            got == model[offset as usize..offset as usize + len],
            "{level} n={members} chunk={chunk_bytes} op {op}"
        );
    }
    let mut all = vec![0u8; size as usize];
    array.read(0, &mut all).expect("read all");
    assert!(
        all == model,
        "{level} n={members} chunk={chunk_bytes}: full read"
    );
    array.flush().expect("flush");
    verify_array_members(&io, &array, &model);
    assert_eq!(io.slots(), members);
    array.stop().expect("stop");
}

#[test]
fn raid0_round_trips() {
    for (n, chunk) in grid(Level::Raid0) {
        round_trip(Level::Raid0, n, chunk, 1000 + n as u64);
    }
}

#[test]
fn raid1_round_trips() {
    for (n, chunk) in grid(Level::Raid1) {
        round_trip(Level::Raid1, n, chunk, 2000 + n as u64);
    }
}

#[test]
fn raid5_round_trips() {
    for (n, chunk) in grid(Level::Raid5) {
        round_trip(Level::Raid5, n, chunk, 5000 + n as u64);
    }
}

#[test]
fn raid6_round_trips() {
    for (n, chunk) in grid(Level::Raid6) {
        round_trip(Level::Raid6, n, chunk, 6000 + n as u64);
    }
}

#[test]
fn raid10_round_trips() {
    for (n, chunk) in grid(Level::Raid10) {
        round_trip(Level::Raid10, n, chunk, 10_000 + n as u64);
    }
}

#[test]
fn every_level_has_a_grid() {
    for level in LEVELS {
        assert!(grid(level).iter().all(|(n, _)| *n >= level.min_members()));
    }
}

/// Requests past the end are refused and write nothing.
#[test]
fn out_of_range_refused() {
    let (io, array) = mem_array(Level::Raid5, 4, 4096, 4);
    let size = array.size_bytes();
    let before: Vec<Option<Vec<u8>>> = (0..4).map(|s| io.image(s)).collect();
    let err = array
        .write(size - 10, &[1u8; 11], false)
        .expect_err("past the end");
    assert!(err.to_string().contains("past the array end"), "{err}");
    assert!(array.read(u64::MAX - 2, &mut [0u8; 8]).is_err());
    let after: Vec<Option<Vec<u8>>> = (0..4).map(|s| io.image(s)).collect();
    assert!(before == after, "a refused write changed a member");
    array
        .write(size - 10, &[1u8; 10], false)
        .expect("up to the end");
}
