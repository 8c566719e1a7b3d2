//! Fault matrix rows about data that is silently wrong: bit flips at rest within the level's tolerance (row 6)
//! and misdirected member I/O (row 9).

mod common_sim;

use std::time::Duration;

use common_sim::*;
use paraid_parity::CheckOutcome;

/// Plants one flipped bit in `per_stripe` distinct members of each of `stripes` stripes (as a write that stored
/// corrupted bytes would), directly on the media. Returns (stripe, slot) of every plant.
fn plant(
    filled: &Filled,
    io: &Stack,
    stripes: &[u64],
    per_stripe: usize,
    seed: u64,
) -> Vec<(u64, usize)> {
    let g = filled.geometry;
    let mut rng = SplitMix64::new(seed);
    let mut planted = Vec::new();
    for &stripe in stripes {
        let mut slots: Vec<usize> = (0..g.members).collect();
        for _ in 0..per_stripe {
            let slot = slots.remove(rng.below(slots.len() as u64) as usize);
            let at = filled.data_offset_bytes + stripe * g.chunk_bytes + rng.below(g.chunk_bytes);
            let mut byte =
                io.inner().image(slot).expect("present")[at as usize..at as usize + 1].to_vec();
            byte[0] ^= 1 << rng.below(8);
            // The bit is flipped on the medium: nothing in the cache can hide it.
            io.inner().poke(slot, at, &byte);
            planted.push((stripe, slot));
        }
    }
    planted
}

/// Runs a check (or repair) job to its end and returns its final figures.
fn run_check(array: &Array, repair: bool) -> paraid_engine::Progress {
    array.start_check(repair).expect("start the check");
    assert!(array.wait_idle(Duration::from_secs(60)), "check finished");
    let done = array.last_result().expect("a check ran");
    assert_eq!(done.kind, if repair { "repair" } else { "check" });
    assert_eq!(done.outcome.as_deref(), Some("completed"), "{done:?}");
    done
}

/// Row 6: bits flipped at rest in one member per stripe (within every redundant level's tolerance), planted on
/// the media so nothing cached hides them. The oracle (the reference check over the raw images) sees every one;
/// the engine's check must count exactly those stripes and, for RAID6, name the member; repair must then leave
/// every stripe consistent, and RAID6 must restore the data itself (it knows which chunk was wrong).
#[test]
fn row06_silent_corruption_within_tolerance() {
    let (mut injected, mut detected, mut named, mut repaired) = (0u64, 0u64, 0u64, 0u64);
    for (level, members) in [
        (Level::Raid5, 5usize),
        (Level::Raid6, 6),
        (Level::Raid1, 3),
        (Level::Raid10, 4),
    ] {
        let filled = Filled::new(level, members, 8192, 8, 600 + members as u64);
        let g = filled.geometry;
        let io = std::sync::Arc::new(FaultyMembers::new(
            CrashMembers::from_images(filled.base.to_vec()),
            0,
        ));
        // Plant before assembly (at rest), in every other stripe (RAID1/10: every other chunk's row).
        let units: Vec<u64> = (0..g.rows).step_by(2).collect();
        let planted = plant(&filled, &io, &units, 1, members as u64);
        injected += planted.len() as u64;
        let oracle = audit_images(&g, filled.data_offset_bytes, &io.inner().images(), None);
        if g.level.has_parity() {
            for (stripe, slot) in &planted {
                let found = oracle.bad_stripes.iter().find(|(s, _)| s == stripe);
                assert!(
                    found.is_some(),
                    "{level}: stripe {stripe} corruption on {slot} invisible"
                );
                if level == Level::Raid6 {
                    let index = g.stripe_index(*stripe, *slot);
                    assert_eq!(found.map(|f| f.1), Some(CheckOutcome::BadChunk(index)));
                }
            }
        }
        let array = assemble_io(io.clone(), AssembleOptions::new(reference())).expect("assemble");
        let found = run_check(&array, false);
        let findings = array.check_findings();
        let what = format!("{level}/{members}");
        if g.level.has_parity() {
            assert_eq!(
                found.mismatches,
                planted.len() as u64,
                "{what}: {findings:?}"
            );
            for (stripe, slot) in &planted {
                let f = findings
                    .iter()
                    .find(|f| f.stripe == *stripe)
                    .unwrap_or_else(|| panic!("{what}: stripe {stripe} not reported"));
                if level == Level::Raid6 {
                    assert_eq!(
                        f.slot,
                        Some(*slot),
                        "{what}: stripe {stripe}: bad member named"
                    );
                    named += 1;
                }
            }
        } else {
            // Mirrors: a flipped bit in one copy makes its chunk's copies differ.
            assert!(found.mismatches > 0, "{what}: copies differ");
            assert!(
                found.mismatches <= planted.len() as u64,
                "{what}: {findings:?}"
            );
        }
        detected += found.mismatches;
        let fixed = run_check(&array, true);
        repaired += fixed.repaired;
        assert_eq!(
            fixed.repaired, found.mismatches,
            "{what}: every mismatch repaired"
        );
        let again = run_check(&array, false);
        assert_eq!(again.mismatches, 0, "{what}: consistent after repair");
        if level == Level::Raid6 {
            let mut model = filled.model();
            verify_all(&array, &mut model, "RAID6 after repair");
        }
        array.stop().expect("stop");
        let audit = audit_images(
            &g,
            filled.data_offset_bytes,
            &io.inner().images(),
            (level == Level::Raid6).then_some(&filled.contents[..]),
        );
        assert!(audit.clean(), "{what}: after repair: {}", audit.describe());
    }
    figure(
        "6",
        "row06_silent_corruption_within_tolerance",
        &format!(
            "injected {injected} (one member per stripe, RAID5/6/1/10), detected {detected} (mirrors count a chunk \
             once), RAID6 bad member named {named}; repaired {repaired}; consistent after repair, RAID6 data restored"
        ),
    );
}

/// Row 9, reads: a member serves some reads from the wrong offset (one row off). Without per-block tags the engine
/// cannot tell: this measures that known limit. Every misdirected read hands back wrong data silently, and the
/// harness's model catches each one.
#[test]
fn row09_misdirected_read_is_a_known_limit() {
    let filled = Filled::new(Level::Raid5, 4, 8192, 8, 900);
    let (io, array) = assemble_cow(&filled.base, &[], 9, reference()).expect("assemble");
    io.add(
        Scope::slot(1).ops(OpKinds::READ),
        Fault::Misdirect {
            shift_bytes: filled.geometry.chunk_bytes as i64,
            one_in: 3,
        },
    );
    let mut model = filled.model();
    let (reads, failed) = read_each_block(&array, &mut model);
    let injected = io.counts().misdirected_reads;
    assert!(injected > 0, "misdirected reads injected");
    assert!(
        failed.is_empty(),
        "the engine reported no error (it cannot know)"
    );
    assert_eq!(
        reads.wrong, injected,
        "every misdirected block read returned another row's bytes, and the model caught it"
    );
    figure(
        "9",
        "row09_misdirected_read_is_a_known_limit",
        &format!(
            "misdirected reads: {injected} injected, 0 detected by the engine (no per-block tags: known limit), \
             {} caught by the harness model",
            reads.wrong
        ),
    );
}

/// Row 9, writes: a member stores writes one row off. The stripe it meant to update keeps stale data and the one
/// it hit gets foreign data: both are parity mismatches. The engine's check must report every stripe the oracle
/// (the reference check over raw images) finds.
#[test]
fn row09_misdirected_write_detected_by_check() {
    let filled = Filled::new(Level::Raid6, 6, 8192, 8, 990);
    let g = filled.geometry;
    let io = std::sync::Arc::new(FaultyMembers::new(
        CrashMembers::from_images(filled.base.to_vec()),
        9,
    ));
    let array = assemble_io(io.clone(), AssembleOptions::new(reference())).expect("assemble");
    let rule = io.add(
        Scope::slot(2).ops(OpKinds::WRITE).row_limit(RowLimit {
            data_offset_bytes: filled.data_offset_bytes,
            chunk_bytes: g.chunk_bytes,
            max_slots: 1,
        }),
        Fault::Misdirect {
            shift_bytes: g.chunk_bytes as i64,
            one_in: 2,
        },
    );
    let mut model = filled.model();
    let mut rng = SplitMix64::new(3);
    for _ in 0..24 {
        random_write(&array, &mut model, &mut rng);
    }
    io.remove(rule);
    let injected = io.counts().misdirected_writes;
    assert!(injected > 0);
    array.flush().expect("flush");
    let oracle = audit_images(&g, filled.data_offset_bytes, &io.inner().images(), None);
    assert!(
        !oracle.bad_stripes.is_empty(),
        "the oracle sees the misdirected writes"
    );
    let found = run_check(&array, false);
    let reported: Vec<u64> = array.check_findings().iter().map(|f| f.stripe).collect();
    let missed: Vec<u64> = oracle
        .bad_stripes
        .iter()
        .map(|(s, _)| *s)
        .filter(|s| !reported.contains(s))
        .collect();
    assert!(missed.is_empty(), "stripes the check missed: {missed:?}");
    assert_eq!(found.mismatches, oracle.bad_stripes.len() as u64);
    figure(
        "9",
        "row09_misdirected_write_detected_by_check",
        &format!(
            "{injected} misdirected writes left {} inconsistent stripes; the engine's check reported {} of them \
             (detection rate {:.0} %)",
            oracle.bad_stripes.len(),
            oracle.bad_stripes.len() - missed.len(),
            100.0 * (oracle.bad_stripes.len() - missed.len()) as f64 / oracle.bad_stripes.len() as f64
        ),
    );
}

/// Repair rewrites what a check found wrong; the rewrite must be durable like any acknowledged fix: after a power
/// loss right after the repair, a check must find nothing. Repair once wrote without flushing (the corruption
/// came back, and a member lost later reconstructed from it); its rewrites now use FUA.
#[test]
fn row06_repair_survives_power_loss() {
    let mut cases = 0;
    for (level, members) in [(Level::Raid5, 5usize), (Level::Raid6, 6)] {
        let filled = Filled::new(level, members, 8192, 8, 77);
        let g = filled.geometry;
        let io = std::sync::Arc::new(FaultyMembers::new(
            CrashMembers::from_images(filled.base.to_vec()),
            0,
        ));
        for row in [1u64, 5] {
            let slot = g.p_member(row);
            let at = filled.data_offset_bytes + row * g.chunk_bytes + 100;
            let mut byte =
                io.inner().image(slot).expect("present")[at as usize..at as usize + 1].to_vec();
            byte[0] ^= 0x40;
            io.inner().poke(slot, at, &byte);
        }
        let array = assemble_io(io.clone(), AssembleOptions::new(reference())).expect("assemble");
        array.start_check(true).expect("repair");
        assert!(array.wait_idle(std::time::Duration::from_secs(60)));
        assert_eq!(array.last_result().expect("ran").repaired, 2);
        drop(array);
        io.inner().cut_power();
        let after = io.inner().crash(0, CrashPolicy::DropAll).images;
        let audit = audit_images(&g, filled.data_offset_bytes, &after, Some(&filled.contents));
        assert!(
            audit.clean(),
            "{level}: the repair did not survive the power loss: {}",
            audit.describe()
        );
        cases += 1;
    }
    println!("{cases} repairs durable");
}
