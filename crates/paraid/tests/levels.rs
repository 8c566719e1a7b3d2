//! Every level, chunk sizes 4 KiB to 1 MiB, 1 (RAID0) or 3 to 16 members: data written through NBD by nbdcopy (a client we
//! did not write), the server stopped, then the member files read directly with docs/format.md's rules alone
//! (tests/common/format.rs): the array's bytes must be what was written and every stripe's parity must hold.

mod common;

#[path = "common/format.rs"]
mod format;

use common::*;

/// (level, members, chunk): each level at its smallest and largest member counts and every chunk size between.
fn grid() -> Vec<(&'static str, usize, &'static str)> {
    let mut cases = Vec::new();
    for (level, counts) in [
        ("0", [1, 5, 16]), // one member: the passthrough
        ("1", [3, 4, 16]),
        ("10", [3, 4, 16]),
        ("5", [3, 6, 16]),
        ("6", [4, 7, 16]),
    ] {
        for (i, chunk) in ["4K", "64K", "1M"].iter().enumerate() {
            // Every count with every chunk size would be 45 cases: rotate so each count meets two chunk sizes.
            cases.push((level, counts[i], *chunk));
            cases.push((level, counts[(i + 1) % 3], *chunk));
        }
    }
    cases
}

fn member_size(chunk: &str) -> &'static str {
    match chunk {
        "1M" => "12M",
        _ => "5M",
    }
}

#[test]
fn every_level_chunk_and_member_count_round_trips_and_keeps_parity() {
    let scratch = Scratch::new("levels");
    for (case, (level, count, chunk)) in grid().into_iter().enumerate() {
        let dir = scratch.path(&format!("case{case}"));
        std::fs::create_dir_all(&dir).unwrap();
        let members: Vec<_> = (0..count).map(|i| dir.join(format!("m{i}.img"))).collect();
        create(level, chunk, member_size(chunk), &members);
        let before = format::read_array(&members);
        let array_bytes = before[0].array_bytes as usize;
        drop(before);
        let data = random_bytes(0x1e7e1 + case as u64, array_bytes);
        let input = dir.join("in.bin");
        std::fs::write(&input, &data).unwrap();
        let served = Served::start(&dir.join("s.sock"), &members, &[]);
        client("nbdcopy", &[input.to_str().unwrap(), &served.uri()]);
        // A second, unaligned overwrite through qemu-io exercises partial-stripe writes (RMW/RCW).
        let offset = array_bytes / 3 + 777;
        let len = (array_bytes / 5).min(300_001);
        client(
            "qemu-io",
            &[
                "-f",
                "raw",
                &served.uri(),
                "-c",
                &format!("write -P 0x6b {offset} {len}"),
            ],
        );
        served.stop();

        let mut expected = data;
        expected[offset..offset + len].fill(0x6b);
        let members_read = format::read_array(&members);
        assert!(
            members_read.iter().all(|m| m.state == 0),
            "clean after stop: level {level} n {count} chunk {chunk}"
        );
        let array = format::reassemble_and_check(&members_read);
        assert!(array == expected, "level {level}, {count} members, chunk {chunk}: array bytes differ from what was written");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
