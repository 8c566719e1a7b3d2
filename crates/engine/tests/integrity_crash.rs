//! Crashes at many points of a write workload, then re-assembly: with every member present the resync leaves
//! every stripe consistent and every FLUSH/FUA-acknowledged block intact; with members missing at restart
//! (RAID5: one, RAID6: one or two) the partial parity log keeps every acknowledged-and-durable block intact.
//! The same crashes without the log show the write hole the log closes.

mod integrity_common;

use std::time::Duration;

use integrity_common::*;
use paraid_engine::ArrayState;

struct Case {
    level: Level,
    members: usize,
    chunk: u64,
    rows: u64,
    /// The smallest log ring (RAID5/6): rounds find it full, retire and wrap within the workload.
    small_ring: bool,
}

const CASES: [Case; 8] = [
    Case {
        level: Level::Raid5,
        members: 4,
        chunk: 8192,
        rows: 8,
        small_ring: false,
    },
    Case {
        level: Level::Raid5,
        members: 5,
        chunk: 4096,
        rows: 8,
        small_ring: false,
    },
    Case {
        level: Level::Raid6,
        members: 5,
        chunk: 8192,
        rows: 8,
        small_ring: false,
    },
    Case {
        level: Level::Raid6,
        members: 6,
        chunk: 4096,
        rows: 8,
        small_ring: false,
    },
    Case {
        level: Level::Raid1,
        members: 3,
        chunk: 8192,
        rows: 8,
        small_ring: false,
    },
    Case {
        level: Level::Raid10,
        members: 4,
        chunk: 8192,
        rows: 8,
        small_ring: false,
    },
    Case {
        level: Level::Raid5,
        members: 5,
        chunk: 4096,
        rows: 12,
        small_ring: true,
    },
    Case {
        level: Level::Raid6,
        members: 7,
        chunk: 4096,
        rows: 12,
        small_ring: true,
    },
];

/// What one crash left, after re-assembly.
struct Outcome {
    durable_blocks: u64,
    violations: Vec<String>,
    /// Stripes still inconsistent after the resync (all members present) — must be none.
    inconsistent: usize,
    /// RAID6 with one member missing: stripes whose present parity disagrees after the resync — must be none.
    degraded_problems: Vec<String>,
    resync_stripes: u64,
    log_stripes: u64,
    /// Times a log round found the ring full and retired records to make room (before the crash).
    ring_full: u64,
}

/// Fills the array, runs a random workload (writes, FUA writes, flushes, discards), cuts the power after a
/// random number of member writes somewhere in it, crashes (each unflushed write kept, dropped or torn page by
/// page), drops the members in `gone` and re-assembles.
fn crash_once(case: &Case, seed: u64, gone: &[usize], log: bool) -> Outcome {
    let mut rng = SplitMix64::new(seed);
    let data_offset = if case.small_ring {
        paraid_engine::small_ring_data_offset_bytes(case.level, case.chunk, 0)
    } else {
        DEFAULT_DATA_OFFSET_BYTES
    };
    let (io, array) = crash_array_at(
        case.level,
        case.members,
        case.chunk,
        case.rows,
        log,
        data_offset,
    );
    let g = array.geometry();
    let size = array.size_bytes();
    let mut model = Model::new(size);
    let mut data = vec![0u8; size as usize];
    rng.fill(&mut data);
    array.write(0, &data, false).expect("fill");
    array.flush().expect("fill flush");
    model.write(0, &data, Some(false));
    model.flushed();
    // The power goes after this many more member writes: anywhere in the workload.
    io.cut_power_after_writes(rng.below(40 * case.members as u64));
    for _ in 0..40 {
        match rng.below(10) {
            0 => {
                if array.flush().is_err() {
                    break;
                }
                model.flushed();
            }
            1 => {
                let (offset, len) = extent(&mut rng, size, g.stripe_bytes());
                let ok = array.discard(offset, len as u64).is_ok();
                model.write(offset, &vec![0u8; len], ok.then_some(false));
                if !ok {
                    break;
                }
            }
            _ => {
                let (offset, len) = extent(&mut rng, size, g.stripe_bytes());
                let mut buf = vec![0u8; len];
                rng.fill(&mut buf);
                let fua = rng.one_in(4);
                let ok = array.write(offset, &buf, fua).is_ok();
                model.write(offset, &buf, ok.then_some(fua));
                if !ok {
                    break;
                }
            }
        }
    }
    let ring_full = array.integrity().log_retire_flushes;
    drop(array);
    io.cut_power();
    let mut images = io.crash(rng.next_u64(), CrashPolicy::Random).images;
    for &m in gone {
        images[m] = None;
    }
    let (io2, array) = reassemble(images, log);
    assert!(array.wait_idle(Duration::from_secs(30)), "resync finished");
    let mut all = vec![0u8; size as usize];
    array.read(0, &mut all).expect("read after crash");
    let (durable_blocks, violations) =
        model.check_after_crash(&all, |b| gone.contains(&member_of_block(&g, b)));
    let report = array.integrity();
    // The members left out at restart were never attached: their images are None.
    let images: Vec<Option<Vec<u8>>> = (0..case.members).map(|s| io2.image(s)).collect();
    let inconsistent = if gone.is_empty() {
        inconsistent_stripes(&g, data_offset, &images).len()
    } else {
        0
    };
    // RAID6 with one member missing still has redundancy: the resync must leave P and Q agreeing.
    let degraded_problems = if case.level == Level::Raid6 && gone.len() == 1 {
        degraded_parity_problems(&g, data_offset, &images, &all)
    } else {
        Vec::new()
    };
    array.stop().expect("clean stop");
    Outcome {
        durable_blocks,
        violations,
        inconsistent,
        degraded_problems,
        resync_stripes: report.resync_stripes,
        log_stripes: report.log_recovered_stripes,
        ring_full,
    }
}

/// Seeds per layout: `INTEGRITY_SEEDS` for longer runs.
fn seeds(default: u64) -> u64 {
    std::env::var("INTEGRITY_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

fn what(case: &Case, seed: u64, gone: &[usize], log: bool) -> String {
    format!(
        "{}/{} chunk {}{} seed {seed} missing {gone:?} log {log}",
        case.level,
        case.members,
        case.chunk,
        if case.small_ring { " small ring" } else { "" }
    )
}

#[test]
fn crash_then_resync_parity_matches_and_durable_blocks_intact() {
    let (mut crashes, mut durable, mut resynced, mut logged) = (0u64, 0u64, 0u64, 0u64);
    for case in &CASES {
        for seed in 0..seeds(12) {
            let out = crash_once(case, seed, &[], true);
            let w = what(case, seed, &[], true);
            assert!(out.violations.is_empty(), "{w}: {:?}", out.violations);
            assert_eq!(
                out.inconsistent, 0,
                "{w}: stripes inconsistent after resync"
            );
            crashes += 1;
            durable += out.durable_blocks;
            resynced += out.resync_stripes;
            logged += out.log_stripes;
        }
    }
    figure(
        "crash_then_resync",
        &format!(
            "{crashes} crashes over {} layouts, 0 violations, 0 inconsistent stripes after resync; {durable} \
             durable blocks verified; {resynced} stripes resynced, {logged} recovered from the log first",
            CASES.len()
        ),
    );
}

/// Members to drop at restart for `seed`: one for RAID5, one or two (every other seed) for RAID6.
fn lost_members(case: &Case, seed: u64) -> Vec<usize> {
    let n = case.members;
    let first = (seed as usize * 7 + 3) % n;
    if case.level == Level::Raid6 && seed % 2 == 1 {
        vec![first, (first + 1 + seed as usize % (n - 1)) % n]
    } else {
        vec![first]
    }
}

#[test]
fn crash_with_members_missing_at_restart_keeps_durable_blocks() {
    let (mut crashes, mut durable, mut solved, mut degraded_audited) = (0u64, 0u64, 0u64, 0u64);
    let mut ring_full = 0u64;
    for case in CASES.iter().filter(|c| c.level.has_parity()) {
        for seed in 0..seeds(24) {
            let gone = lost_members(case, seed);
            let out = crash_once(case, seed, &gone, true);
            let w = what(case, seed, &gone, true);
            assert!(out.violations.is_empty(), "{w}: {:?}", out.violations);
            assert!(
                out.degraded_problems.is_empty(),
                "{w}: parity disagrees after the resync: {:?}",
                out.degraded_problems
            );
            degraded_audited += u64::from(case.level == Level::Raid6 && gone.len() == 1);
            ring_full += out.ring_full;
            crashes += 1;
            durable += out.durable_blocks;
            solved += out.log_stripes;
        }
    }
    assert!(
        ring_full > 0,
        "the small rings filled and retired to make room"
    );
    figure(
        "crash_with_members_missing",
        &format!(
            "{crashes} crashes with 1 (RAID5/6) or 2 (RAID6) members missing at restart, 0 violations; {durable} \
             durable blocks verified; {solved} stripes recovered from the partial parity log; {degraded_audited} \
             RAID6 restarts with one member missing audited, P and Q agreeing in every stripe after the resync; \
             {ring_full} times a log round found a small ring full"
        ),
    );
}

/// The same crashes without the log: acknowledged, flushed data is lost — the write hole the log closes (this is
/// what makes the test above able to fail).
#[test]
fn without_the_log_the_write_hole_loses_durable_blocks() {
    let (mut crashes, mut bad_crashes) = (0u64, 0u64);
    for case in CASES.iter().filter(|c| c.level.has_parity()) {
        for seed in 0..24u64 {
            let gone = lost_members(case, seed);
            let out = crash_once(case, seed, &gone, false);
            crashes += 1;
            bad_crashes += (!out.violations.is_empty()) as u64;
        }
    }
    assert!(
        bad_crashes > 0,
        "no crash without the log lost data: the crash test cannot tell the log works"
    );
    figure(
        "without_the_log",
        &format!("{bad_crashes} of {crashes} crashes with members missing lost durable data without the log"),
    );
}

/// A clean stop after a crash-free run leaves the array clean with an empty bitmap; an unclean stop leaves it
/// dirty with the written regions marked.
#[test]
fn stop_clears_the_bitmap_and_kill_leaves_it() {
    let case = &CASES[0];
    let (io, array) = crash_array(case.level, case.members, case.chunk, case.rows, true);
    array.write(4096, &[1u8; 4096], false).expect("write");
    let report = array.integrity();
    assert_eq!(report.dirty_regions, 1);
    drop(array); // killed: nothing more is written
    let images = io.images();
    let bitmap_at = paraid_engine::superblock::BITMAP_OFFSET_BYTES as usize;
    for image in images.iter().flatten() {
        assert_eq!(image[bitmap_at] & 1, 1, "region 0 marked on every member");
    }
    let (io2, array) = reassemble(images, true);
    assert!(array.wait_idle(Duration::from_secs(10)));
    assert_eq!(array.last_result().map(|p| p.kind), Some("resync"));
    array.stop().expect("stop");
    for image in io2.images().iter().flatten() {
        let sb = paraid_engine::Superblock::decode(image).expect("superblock");
        assert_eq!(sb.state, ArrayState::Clean);
        let bitmap = &image[bitmap_at..bitmap_at + sb.bitmap_bytes as usize];
        assert!(bitmap.iter().all(|b| *b == 0), "bitmap cleared at stop");
    }
}
