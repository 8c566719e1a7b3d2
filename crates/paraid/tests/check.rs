//! `paraid check` finds silent corruption on a running array and `check --repair` fixes it: RAID6 names the bad
//! member of the stripe and rewrites it, so the member files again hold the written data and consistent parity.

mod common;

#[path = "common/format.rs"]
mod format;

use std::io::{Seek, SeekFrom, Write};

use common::*;

fn check(control: &str, repair: bool) -> serde_json::Value {
    let mut args = vec!["check", "--control", control, "--wait", "--json"];
    if repair {
        args.push("--repair");
    }
    let out = paraid(&args);
    assert!(
        out.status.success(),
        "paraid {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let last: serde_json::Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    assert_eq!(last["idle"].as_bool(), Some(true), "{text}");
    last["last_result"].clone()
}

#[test]
fn check_finds_and_repair_fixes_silent_corruption_on_raid6() {
    let scratch = Scratch::new("check");
    let members = scratch.members(6);
    create("6", "16K", "8M", &members);
    let before = format::read_array(&members);
    let array_bytes = before[0].array_bytes as usize;
    let (data_offset, chunk) = (before[0].data_offset_bytes, before[0].chunk_bytes);
    drop(before);
    let data = random_bytes(0xc4ec, array_bytes);
    let input = scratch.path("in.bin");
    std::fs::write(&input, &data).unwrap();
    let served = Served::start(&scratch.path("s.sock"), &members, &[]);
    client("nbdcopy", &[input.to_str().unwrap(), &served.uri()]);
    served.stop();

    // Silent corruption: flip bytes in one cell of three different stripes (rows 1, 5, 9) on three members.
    for (member, row) in [(0usize, 1u64), (3, 5), (5, 9)] {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .open(&members[member])
            .unwrap();
        file.seek(SeekFrom::Start(data_offset + row * chunk + 100))
            .unwrap();
        file.write_all(&[0xde, 0xad, 0xbe, 0xef]).unwrap();
    }

    let served = Served::start(&scratch.path("s.sock"), &members, &[]);
    let control = format!("{}.ctl", served.socket.display());
    let found = check(&control, false);
    assert_eq!(found["kind"].as_str(), Some("check"), "{found}");
    assert_eq!(
        found["mismatches"].as_u64(),
        Some(3),
        "three corrupted stripes: {found}"
    );
    assert_eq!(
        found["repaired"].as_u64(),
        Some(0),
        "a plain check repairs nothing: {found}"
    );
    let fixed = check(&control, true);
    assert_eq!(fixed["mismatches"].as_u64(), Some(3), "{fixed}");
    assert_eq!(fixed["repaired"].as_u64(), Some(3), "{fixed}");
    let again = check(&control, false);
    assert_eq!(
        again["mismatches"].as_u64(),
        Some(0),
        "clean after repair: {again}"
    );
    served.stop();

    let array = format::reassemble_and_check(&format::read_array(&members));
    assert!(array == data, "repaired array holds the written data");
}

/// A check asked for while one runs is refused with one line (a check never queues behind a rebuild either: a
/// degraded array is refused, `integrity_check.rs`).
#[test]
fn a_check_while_one_runs_is_refused() {
    let scratch = Scratch::new("check-busy");
    let members = scratch.members(4);
    create("5", "64K", "16M", &members);
    let served = Served::start(&scratch.path("s.sock"), &members, &[]);
    let control = format!("{}.ctl", served.socket.display());
    let slow = [
        "speed",
        "--control",
        &control,
        "--min",
        "64K",
        "--max",
        "64K",
    ];
    assert!(paraid(&slow).status.success());
    let out = paraid(&["check", "--control", &control]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("check started"));
    let out = paraid(&["check", "--control", &control, "--repair"]);
    assert!(!out.status.success(), "a second check must be refused");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("a check is already under way"), "{stderr}");
    served.stop();
}
