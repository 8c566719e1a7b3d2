//! Fault matrix rows about reading around bad spots of survivors: latent sector errors (row 7) and failures
//! during rebuild or check (row 12).

mod common_sim;

use std::time::Duration;

use common_sim::*;
use paraid_engine::{AddOutcome, NewMember};

/// The member byte range of `pages` pages at page `page` of cell (`row`) on a member.
fn cell_pages(filled: &Filled, row: u64, page: u64, pages: u64) -> std::ops::Range<u64> {
    let at = filled.data_offset_bytes + row * filled.geometry.chunk_bytes + page * 4096;
    at..at + pages * 4096
}

/// Array blocks a degraded RAID5 (slot `gone` missing) cannot serve when survivor `bad` fails reads in `ranges`:
/// the blocks on `bad` in those ranges, and the blocks of `gone` whose reconstruction needs them (same row, same
/// in-chunk page).
/// Every read of `slot` that touches one of `ranges` fails (latent sector errors that a rewrite does not heal).
fn reads_fail_on<M: paraid_engine::MemberIo>(
    io: &FaultyMembers<M>,
    slot: usize,
    ranges: &[std::ops::Range<u64>],
) {
    let mut scope = Scope::slot(slot).ops(OpKinds::READ);
    for r in ranges {
        scope = scope.range(r.clone());
    }
    io.add(
        scope,
        Fault::FailFrom {
            nth: 1,
            count: Count::Global,
        },
    );
}

fn unreadable_raid5(
    filled: &Filled,
    gone: usize,
    bad: usize,
    ranges: &[std::ops::Range<u64>],
) -> Vec<u64> {
    let g = filled.geometry;
    let blocks = g.array_bytes() / 4096;
    (0..blocks)
        .filter(|b| {
            let at = g.map(b * 4096, 0);
            let member_at = filled.data_offset_bytes + at.data_offset_bytes;
            let hit = ranges.iter().any(|r| r.contains(&member_at));
            hit && (at.member == bad || at.member == gone)
        })
        .collect()
}

/// Row 7 in a degraded RAID5 (one member missing): survivors with latent sector errors (EIO on chosen ranges).
/// Exactly the unreadable blocks must fail (the bad spots' own blocks and the missing member's blocks that
/// need them), every other block must read right: never wrong data.
#[test]
fn row07_latent_sector_error_degraded_read_raid5() {
    let (mut reported, mut expected_total, mut cases) = (0usize, 0usize, 0);
    for (members, chunk, rows) in [(4usize, 8192u64, 8u64), (5, 16384, 6), (3, 4096, 12)] {
        let filled = Filled::new(Level::Raid5, members, chunk, rows, 700 + members as u64);
        let g = filled.geometry;
        let pages_per_chunk = chunk / 4096;
        for gone in 0..members {
            let bad = (gone + 1 + cases % (members - 1)) % members;
            // Two bad spots: a page inside a cell, and a run crossing from one cell into the next.
            let ranges = vec![
                cell_pages(&filled, 1, pages_per_chunk / 2, 1),
                cell_pages(&filled, g.rows - 2, pages_per_chunk - 1, 2),
            ];
            let (io, array) =
                assemble_cow(&filled.base, &[gone], 0, reference()).expect("assemble");
            reads_fail_on(&io, bad, &ranges);
            let mut model = filled.model();
            let (reads, failed) = read_each_block(&array, &mut model);
            let expected = unreadable_raid5(&filled, gone, bad, &ranges);
            assert_eq!(
                reads.wrong, 0,
                "RAID5/{members} without {gone}, bad spots on {bad}"
            );
            assert_eq!(
                failed, expected,
                "RAID5/{members} without {gone}, bad spots on {bad}: unreadable blocks"
            );
            assert!(!expected.is_empty());
            reported += failed.len();
            expected_total += expected.len();
            cases += 1;
        }
    }
    figure(
        "7",
        "row07_latent_sector_error_degraded_read_raid5",
        &format!(
            "{cases} degraded RAID5 cases: {reported} unreadable blocks reported, {expected_total} expected \
             (exactly those), 0 wrong reads"
        ),
    );
}

/// Row 7 for RAID6 with one member missing: a latent sector error on a survivor is one more erasure, still within
/// tolerance, so every block must read right.
#[test]
fn row07_latent_sector_error_degraded_read_raid6() {
    let mut cases = 0;
    for (members, chunk) in [(5usize, 8192u64), (6, 4096)] {
        let filled = Filled::new(Level::Raid6, members, chunk, 8, 770 + members as u64);
        for gone in 0..members {
            let bad = (gone + 2) % members;
            let range = cell_pages(&filled, 2, 0, 2);
            let (io, array) =
                assemble_cow(&filled.base, &[gone], 0, reference()).expect("assemble");
            io.add(
                Scope::slot(bad).ops(OpKinds::READ).range(range),
                Fault::FailFrom {
                    nth: 1,
                    count: Count::Global,
                },
            );
            let mut model = filled.model();
            let (reads, failed) = read_each_block(&array, &mut model);
            assert_eq!(reads.wrong, 0);
            assert!(
                failed.is_empty(),
                "RAID6 without {gone}, bad spot on {bad}: {failed:?}"
            );
            cases += 1;
        }
    }
    figure(
        "7",
        "row07_latent_sector_error_degraded_read_raid6",
        &format!("{cases} degraded RAID6 cases with a latent sector error: every block read right"),
    );
}

/// Merges sorted 4 KiB blocks into array byte ranges `(offset, len)`.
fn block_ranges(blocks: &[u64]) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for &b in blocks {
        match out.last_mut() {
            Some((at, len)) if *at + *len == b * 4096 => *len += 4096,
            _ => out.push((b * 4096, 4096)),
        }
    }
    out
}

/// Adds a blank member to `array` (it takes the missing or faulty slot), waits for the rebuild, and returns its
/// final progress.
fn rebuild_onto_blank(
    array: &Array,
    filled: &Filled,
    expect_slot: usize,
) -> paraid_engine::Progress {
    let size_bytes = filled
        .base
        .iter()
        .flatten()
        .map(|i| i.len() as u64)
        .max()
        .expect("a member");
    match array
        .add_member(NewMember::Image {
            label: format!("new{expect_slot}"),
            size_bytes,
        })
        .expect("add a blank member")
    {
        AddOutcome::Rebuilding { slot } => assert_eq!(slot, expect_slot),
        other => panic!("the blank member should take slot {expect_slot}: {other:?}"),
    }
    assert!(array.wait_idle(Duration::from_secs(60)), "rebuild finished");
    let progress = array.last_result().expect("a rebuild ran");
    assert_eq!(progress.kind, "rebuild");
    progress
}

/// Row 7 during a rebuild: a blank member replaces a missing one while a survivor has latent sector errors.
/// RAID6 finishes the rebuild (the bad spots are one more erasure) and the rebuilt array is consistent; RAID5
/// reports exactly the unreadable array ranges, never activates the half-built member, serves every other block
/// right and fails exactly those.
#[test]
fn row07_latent_sector_error_during_rebuild() {
    let (mut reported, mut expected_total, mut cases) = (0usize, 0usize, 0);
    let (mut raid6_cases, mut raid6_done, mut raid5_cases) = (0, 0, 0);
    for (level, members, chunk) in [
        (Level::Raid5, 4usize, 8192u64),
        (Level::Raid5, 5, 16384),
        (Level::Raid6, 5, 8192),
        (Level::Raid6, 6, 4096),
    ] {
        let filled = Filled::new(level, members, chunk, 8, 7700 + members as u64);
        let g = filled.geometry;
        let pages_per_chunk = chunk / 4096;
        for gone in 0..members {
            let bad = (gone + 1 + cases % (members - 1)) % members;
            let ranges = vec![
                cell_pages(&filled, 2, pages_per_chunk / 2, 1),
                cell_pages(&filled, g.rows - 2, pages_per_chunk - 1, 2),
            ];
            let mut images = filled.base.to_vec();
            images[gone] = None;
            let (io, array) = assemble_images(images, 0, reference()).expect("degraded");
            reads_fail_on(&io, bad, &ranges);
            let what = format!("{level}/{members}: rebuilding {gone}, bad spots on {bad}");
            let progress = rebuild_onto_blank(&array, &filled, gone);
            let mut model = filled.model();
            if level == Level::Raid6 {
                assert_eq!(progress.outcome.as_deref(), Some("completed"), "{what}");
                assert!(
                    progress.unreadable.is_empty(),
                    "{what}: {:?}",
                    progress.unreadable
                );
                assert_eq!(array.slot_state(gone), SlotState::Active, "{what}");
                verify_all(&array, &mut model, &what);
                drop(array);
                let audit = audit_images(
                    &g,
                    filled.data_offset_bytes,
                    &io.inner().images(),
                    Some(&filled.contents),
                );
                assert!(audit.clean(), "{what}: {}", audit.describe());
                raid6_done += 1;
                raid6_cases += 1;
            } else {
                raid5_cases += 1;
                let expected = unreadable_raid5(&filled, gone, bad, &ranges);
                assert_eq!(
                    progress.unreadable,
                    block_ranges(&expected),
                    "{what}: unreadable ranges"
                );
                assert_ne!(
                    array.slot_state(gone),
                    SlotState::Active,
                    "{what}: nothing guessed is served"
                );
                let (reads, failed) = read_each_block(&array, &mut model);
                assert_eq!(reads.wrong, 0, "{what}");
                assert_eq!(failed, expected, "{what}: unreadable blocks");
                reported += progress
                    .unreadable
                    .iter()
                    .map(|r| (r.1 / 4096) as usize)
                    .sum::<usize>();
                expected_total += expected.len();
            }
            cases += 1;
        }
    }
    figure(
        "7",
        "row07_latent_sector_error_during_rebuild",
        &format!(
            "{cases} rebuilds over a survivor with bad spots: RAID6 completed {raid6_done} of {raid6_cases} \
             (parity and data consistent after); RAID5 ({raid5_cases} rebuilds) reported {reported} unreadable blocks, {expected_total} \
             expected (exactly those), target never activated; 0 wrong reads"
        ),
    );
}

/// Row 12, rebuild: a RAID6 rebuild while another member dies at its n-th I/O (a random point of the rebuild's
/// progress, every n over a range), and a rebuild cut by a power loss after its k-th member write (every k) and
/// resumed from its checkpoint at re-assembly. Either way the rebuild ends with every block right and, with all
/// members present, parity matching data.
#[test]
fn row12_failure_during_rebuild() {
    let (level, members, chunk, rows) = (Level::Raid6, 6usize, 4096u64, 160u64);
    let filled = Filled::new(level, members, chunk, rows, 1200);
    let g = filled.geometry;
    let gone = 1;
    let mut second_failures = 0;
    let mut power_cuts = 0;
    let mut resumed = 0;
    // Another member failing at its n-th I/O after the rebuild starts, for every I/O the rebuild makes of it.
    let victim = 4;
    let victim_ios = {
        let mut images = filled.base.to_vec();
        images[gone] = None;
        let (io, array) = assemble_images(images, 0, reference()).expect("degraded");
        let counter = io.add(
            Scope::slot(victim),
            Fault::Delay {
                delay: Duration::ZERO,
                one_in: 1,
                sleep: false,
            },
        );
        rebuild_onto_blank(&array, &filled, gone);
        io.rule_counts(counter).expect("rule").matched
    };
    assert!(victim_ios > 0);
    for nth in 1..=victim_ios {
        let mut images = filled.base.to_vec();
        images[gone] = None;
        let (io, array) = assemble_images(images, 0, reference()).expect("degraded");
        io.add(
            Scope::slot(victim),
            Fault::FailFrom {
                nth,
                count: Count::Global,
            },
        );
        let progress = rebuild_onto_blank(&array, &filled, gone);
        let what = format!("member {victim} dies at its I/O #{nth} of the rebuild of {gone}");
        assert_eq!(progress.outcome.as_deref(), Some("completed"), "{what}");
        assert_eq!(array.slot_state(gone), SlotState::Active, "{what}");
        let mut model = filled.model();
        let (reads, failed) = read_each_block(&array, &mut model);
        assert_eq!((reads.wrong, failed.len()), (0, 0), "{what}");
        assert_eq!(array.slot_state(victim), SlotState::Faulty, "{what}");
        drop(array);
        let mut after = io.inner().images();
        after[victim] = None;
        let audit = audit_images(&g, filled.data_offset_bytes, &after, Some(&filled.contents));
        assert!(audit.clean(), "{what}: {}", audit.describe());
        second_failures += 1;
    }
    // The member writes of one rebuild (adding the member included), from a dry run: which are superblock
    // writes (member offset 0), so that cut points inside one multi-member superblock update can be told apart.
    let superblock_writes: Vec<bool> = {
        let mut images = filled.base.to_vec();
        images[gone] = None;
        let (io, array) = assemble_images(images, 0, reference()).expect("degraded");
        io.add(
            Scope::all().ops(OpKinds::WRITE | OpKinds::DISCARD),
            Fault::Delay {
                delay: Duration::ZERO,
                one_in: 1,
                sleep: false,
            },
        );
        let before = io.inner().writes_done();
        rebuild_onto_blank(&array, &filled, gone);
        let log = io.injections();
        assert_eq!(log.len() as u64, io.inner().writes_done() - before);
        log.iter()
            .map(|i| i.op == paraid_engine::MemberOp::Write && i.offset_bytes == 0)
            .collect()
    };
    let rebuild_writes = superblock_writes.len() as u64;
    assert!(rebuild_writes > 2);
    for cut_after in 0..rebuild_writes {
        let mut images = filled.base.to_vec();
        images[gone] = None;
        let (io, array) = assemble_images(images, 0, reference()).expect("degraded");
        io.inner().cut_power_after_writes(cut_after);
        let size_bytes = filled.base[0].as_ref().expect("member").len() as u64;
        let added = array.add_member(NewMember::Image {
            label: "new".to_string(),
            size_bytes,
        });
        if added.is_ok() {
            array.wait_idle(Duration::from_secs(60));
        }
        drop(array);
        io.inner().cut_power();
        let what = format!("power cut after {cut_after} of {rebuild_writes} rebuild writes");
        let mut crashed = io.inner().crash(cut_after, CrashPolicy::Random).images;
        // A new member whose superblock never reached it is a blank device: the admin leaves it out (assembly
        // refuses a member without a superblock).
        if crashed[gone]
            .as_ref()
            .is_some_and(|image| &image[..8] != b"PARAIDSB")
        {
            crashed[gone] = None;
        }
        let (io2, array) = match assemble_images(crashed, 0, reference()) {
            Ok(a) => a,
            Err(e) => panic!("{what}: re-assembly: {e}"),
        };
        let state = array.slot_state(gone);
        if state == SlotState::Rebuilding {
            resumed += 1;
        }
        match state {
            SlotState::Active => {}
            // The new member's superblock made it: the rebuild resumes from its checkpoint at assembly.
            SlotState::Rebuilding => assert!(
                array.wait_idle(Duration::from_secs(60)),
                "{what}: resumed rebuild finished"
            ),
            // The power went before the new member was recorded: add another.
            _ => {
                rebuild_onto_blank(&array, &filled, gone);
            }
        }
        assert_eq!(array.slot_state(gone), SlotState::Active, "{what}");
        let mut model = filled.model();
        let (reads, failed) = read_each_block(&array, &mut model);
        assert_eq!((reads.wrong, failed.len()), (0, 0), "{what}");
        array.stop().expect("stop");
        let audit = audit_images(
            &g,
            filled.data_offset_bytes,
            &io2.inner().images(),
            Some(&filled.contents),
        );
        assert!(audit.clean(), "{what}: {}", audit.describe());
        power_cuts += 1;
    }
    figure(
        "12",
        "row12_failure_during_rebuild",
        &format!(
            "RAID6/6, {rows} rows: {second_failures} second-member failures (at each of its {victim_ios} I/Os during \
             the rebuild; completed degraded, 0 wrong), {power_cuts} power cuts, one after each member write of the rebuild, superblock updates included ({resumed} resumed \
             from the checkpoint at re-assembly); parity and data consistent after every one"
        ),
    );
}

/// Row 12, check: another member fails at each I/O a check makes of it. The check stops (a degraded array is not
/// checked) or finishes, the failed member is evicted, and every block still reads right; a rebuild onto a blank
/// member then leaves the array consistent.
#[test]
fn row12_failure_during_check() {
    let (level, members, chunk, rows) = (Level::Raid6, 5usize, 4096u64, 160u64);
    let filled = Filled::new(level, members, chunk, rows, 1212);
    let g = filled.geometry;
    let victim = 3;
    let victim_ios = {
        let (io, array) = assemble_images(filled.base.to_vec(), 0, reference()).expect("assemble");
        let counter = io.add(
            Scope::slot(victim),
            Fault::Delay {
                delay: Duration::ZERO,
                one_in: 1,
                sleep: false,
            },
        );
        array.start_check(false).expect("check");
        assert!(array.wait_idle(Duration::from_secs(60)));
        io.rule_counts(counter).expect("rule").matched
    };
    assert!(victim_ios > 0);
    let (mut aborted, mut completed) = (0, 0);
    // Ten progress points spread over the check (each costs a rebuild afterwards).
    let points: Vec<u64> = (0..10u64).map(|i| 1 + i * (victim_ios - 1) / 9).collect();
    for &nth in &points {
        let (io, array) = assemble_images(filled.base.to_vec(), 0, reference()).expect("assemble");
        let dying = io.add(
            Scope::slot(victim),
            Fault::FailFrom {
                nth,
                count: Count::Global,
            },
        );
        array.start_check(false).expect("check");
        assert!(array.wait_idle(Duration::from_secs(60)));
        let done = array.last_result().expect("the check ran");
        let what = format!("member {victim} dies at its I/O #{nth} of a check: {done:?}");
        match done.outcome.as_deref() {
            Some("completed") => completed += 1,
            Some(o) if o.starts_with("aborted") => aborted += 1,
            other => panic!("{what}: unexpected outcome {other:?}"),
        }
        assert_eq!(done.mismatches, 0, "{what}: no mismatch invented");
        let mut model = filled.model();
        let (reads, failed) = read_each_block(&array, &mut model);
        assert_eq!((reads.wrong, failed.len()), (0, 0), "{what}");
        assert_eq!(array.slot_state(victim), SlotState::Faulty, "{what}");
        array.remove_member(victim).expect("remove the dead member");
        // The dead member is gone; its replacement in the same slot is healthy.
        io.remove(dying);
        let progress = rebuild_onto_blank(&array, &filled, victim);
        assert_eq!(progress.outcome.as_deref(), Some("completed"), "{what}");
        verify_all(&array, &mut model, &what);
        array.stop().expect("stop");
        let mut images = io.inner().images();
        images.truncate(members);
        let audit = audit_images(
            &g,
            filled.data_offset_bytes,
            &images,
            Some(&filled.contents),
        );
        assert!(audit.clean(), "{what}: {}", audit.describe());
    }
    figure(
        "12",
        "row12_failure_during_check",
        &format!(
            "RAID6/5, {rows} rows: a member dying at {} points spread over its {victim_ios} I/Os of a check: \
             {aborted} checks stopped, {completed} finished; 0 wrong reads, 0 invented mismatches; rebuilt and consistent after each",
            points.len()
        ),
    );
}

/// Engine bug reproducer (kept out of the suite): a rebuild (onto a blank member, or a live replacement) writes
/// the new member without ever flushing it, then marks it active. Members have volatile write caches (the fault
/// model in docs/reliability.md), so a power loss after the rebuild "completed" drops what it wrote: the array
/// assembles with the new member trusted and serves zeros where the data was.
#[test]
fn rebuilt_member_survives_power_loss() {
    for level in [Level::Raid1, Level::Raid5, Level::Raid6, Level::Raid10] {
        for live in [false, true] {
            let filled = Filled::new(level, 4, 8192, 4, 7);
            let mut images = filled.base.to_vec();
            if !live {
                images[0] = None;
            }
            let (io, array) = assemble_images(images, 0, reference()).expect("assemble");
            let size_bytes = filled.base[1].as_ref().expect("member").len() as u64;
            let member = NewMember::Image {
                label: "new".to_string(),
                size_bytes,
            };
            if live {
                array.replace_member(0, member).expect("replace");
            } else {
                array.add_member(member).expect("add");
            }
            assert!(array.wait_idle(Duration::from_secs(60)));
            assert_eq!(array.slot_state(0), SlotState::Active, "rebuilt");
            drop(array);
            io.inner().cut_power();
            let mut after = io.inner().crash(0, CrashPolicy::DropAll).images;
            after.truncate(4);
            let (_io, array) = assemble_images(after, 0, reference()).expect("re-assembly");
            let mut all = vec![0u8; array.size_bytes() as usize];
            array.read(0, &mut all).expect("read");
            assert!(
                all == filled.contents,
                "{level}, {}: block {:?} lost with the power after the rebuild completed",
                if live {
                    "live replacement"
                } else {
                    "rebuild onto a blank member"
                },
                first_wrong_block(&all, &filled.contents)
            );
        }
    }
}

/// Engine bug reproducer (kept out of the suite): `replace_member` on RAID0 is accepted, its rebuild job aborts
/// ("RAID0 keeps no redundancy to rebuild from", though a live replacement could copy the member itself) and a
/// second, phantom job stays pending forever: `wait_idle` never returns true.
#[test]
fn raid0_replace_member_ends() {
    let filled = Filled::new(Level::Raid0, 2, 16384, 4, 7);
    let (_io, array) = assemble_images(filled.base.to_vec(), 0, reference()).expect("assemble");
    let size_bytes = filled.base[1].as_ref().expect("member").len() as u64;
    let outcome = array.replace_member(
        0,
        NewMember::Image {
            label: "new".to_string(),
            size_bytes,
        },
    );
    if outcome.is_ok() {
        assert!(
            array.wait_idle(Duration::from_secs(10)),
            "the replacement's job never ends: {:?}, last {:?}",
            array.progress(),
            array.last_result()
        );
    }
}

/// A write planned while its chunk's slot was still rebuilding (the row already rebuilt, so the chunk goes to the
/// new member in place) and landing after the rebuild's final flush: the log counted that chunk as missing (its
/// new value in the partial parity) and nothing tracked its page as unflushed, so once the slot was active a
/// power loss could drop the page while the log entry assumed it durable; with another member missing at restart,
/// its chunk was then solved from that mismatch (found by the concurrent simulation, seed 102624). The rebuild now
/// lets writes in flight finish before its final flushes.
///
/// Set-up: RAID6 of 4 (stripe 0: data on slots 1 and 2, P on 3, Q on 0), slots 1 and 2 missing, a blank member
/// rebuilds slot 1; reads of rows 64.. on slot 0 are slowed so the rebuild is caught half-way; then stripe 0's
/// chunk on slot 1 is written, and that write is held back until after the rebuild's final flushes.
#[test]
fn write_landing_after_a_rebuild_completes_survives_power_loss() {
    let (chunk_bytes, rows) = (4096u64, 128u64);
    let filled = Filled::new(Level::Raid6, 4, chunk_bytes, rows, 11);
    let g = filled.geometry;
    assert_eq!((g.stripe_member(0, 0), g.stripe_member(0, 1)), (1, 2));
    let mut images = filled.base.to_vec();
    images[1] = None;
    images[2] = None;
    let (io, array) =
        assemble_images(images, 0, reference()).expect("assemble without slots 1 and 2");
    let slow_rows =
        filled.data_offset_bytes + 64 * chunk_bytes..filled.data_offset_bytes + rows * chunk_bytes;
    hold_back(&io, Scope::slot(0).ops(OpKinds::READ).range(slow_rows), 150);
    let size_bytes = filled.base[0].as_ref().expect("member").len() as u64;
    let outcome = array
        .add_member(NewMember::Image {
            label: "new1".to_string(),
            size_bytes,
        })
        .expect("add a blank member");
    assert!(
        matches!(outcome, AddOutcome::Rebuilding { slot: 1 }),
        "{outcome:?}"
    );
    let waited = std::time::Instant::now();
    while array
        .progress()
        .is_none_or(|p| p.done_bytes < 64 * chunk_bytes)
    {
        assert!(
            waited.elapsed() < Duration::from_secs(30),
            "rebuild reached row 64"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(array.slot_state(1), SlotState::Rebuilding);
    // The write's chunk lands 0.5 s late; the new member's bitmap and log ring (written after the rebuild's final
    // flushes, before the slot turns active) 1 s late: the chunk lands between the two.
    let data_at = filled.data_offset_bytes;
    hold_back(
        &io,
        Scope::slot(1)
            .ops(OpKinds::WRITE)
            .range(data_at..data_at + chunk_bytes),
        500,
    );
    hold_back(
        &io,
        Scope::slot(1).ops(OpKinds::WRITE).range(0..data_at),
        1000,
    );
    let new_chunk = vec![0xA5u8; chunk_bytes as usize];
    std::thread::scope(|s| {
        let writer = s.spawn(|| array.write(0, &new_chunk, false));
        assert!(array.wait_idle(Duration::from_secs(60)), "rebuild finished");
        writer
            .join()
            .expect("writer")
            .expect("write stripe 0's chunk on slot 1");
    });
    assert_eq!(array.slot_state(1), SlotState::Active, "rebuilt");
    assert_eq!(
        array.last_result().and_then(|p| p.outcome).as_deref(),
        Some("completed")
    );

    // Power loss: every write not flushed is lost. Slot 2 stays missing.
    io.inner().cut_power();
    drop(array);
    let mut after = io.inner().crash(0, CrashPolicy::DropAll).images;
    after.truncate(4);
    assert!(after[2].is_none());
    let (_io, array) = assemble_images(after, 1, reference()).expect("re-assembly without slot 2");
    let mut all = vec![0u8; array.size_bytes() as usize];
    array.read(0, &mut all).expect("read");
    let chunk = chunk_bytes as usize;
    assert!(
        all[..chunk] == filled.contents[..chunk] || all[..chunk] == new_chunk[..],
        "the chunk written is neither old nor new"
    );
    assert!(
        all[chunk..] == filled.contents[chunk..],
        "block {:?} (beyond the chunk written) is wrong after the power loss",
        first_wrong_block(&all[chunk..], &filled.contents[chunk..]).map(|b| b + 1)
    );
}

/// The new member fails after its data is rebuilt, in the rebuild's last steps: its final flush, or the writes
/// of its write-intent bitmap and partial parity log ring (`member_joined`). Either failure aborts the rebuild
/// where it is noticed; the slot must then stay out of the array (faulty), never be named active, and the array
/// keeps serving the right data degraded.
#[test]
fn new_member_failing_as_it_joins_is_not_made_active() {
    let (chunk_bytes, rows) = (4096u64, 128u64);
    for (what, ops, area) in [
        ("its final flush", OpKinds::FLUSH, None),
        ("its bitmap and log ring", OpKinds::WRITE, Some(8192..)),
    ] {
        let filled = Filled::new(Level::Raid6, 4, chunk_bytes, rows, 13);
        let mut images = filled.base.to_vec();
        images[1] = None;
        let (io, array) = assemble_images(images, 0, reference()).expect("assemble without slot 1");
        // Slot 0's reads of the second half are slowed so the rule below is added while the rebuild runs.
        let data_at = filled.data_offset_bytes;
        let slow_rows = data_at + 64 * chunk_bytes..data_at + rows * chunk_bytes;
        hold_back(&io, Scope::slot(0).ops(OpKinds::READ).range(slow_rows), 100);
        let size_bytes = filled.base[0].as_ref().expect("member").len() as u64;
        let outcome = array
            .add_member(NewMember::Image {
                label: "new1".to_string(),
                size_bytes,
            })
            .expect("add a blank member");
        assert!(
            matches!(outcome, AddOutcome::Rebuilding { slot: 1 }),
            "{outcome:?}"
        );
        let waited = std::time::Instant::now();
        while array
            .progress()
            .is_none_or(|p| p.done_bytes < 64 * chunk_bytes)
        {
            assert!(
                waited.elapsed() < Duration::from_secs(30),
                "rebuild reached row 64"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        let scope = Scope::slot(1).ops(ops);
        let scope = match area {
            Some(area) => scope.range(area.start..data_at),
            None => scope,
        };
        io.add(
            scope,
            Fault::FailFrom {
                nth: 1,
                count: Count::Global,
            },
        );
        assert!(
            array.wait_idle(Duration::from_secs(60)),
            "{what}: rebuild ended"
        );
        let result = array.last_result().expect("a rebuild result");
        assert_ne!(
            result.outcome.as_deref(),
            Some("completed"),
            "{what} failed, yet the rebuild completed: {result:?}"
        );
        assert_eq!(
            array.slot_state(1),
            SlotState::Faulty,
            "{what} failed: the new member must not serve"
        );
        let mut all = vec![0u8; array.size_bytes() as usize];
        array.read(0, &mut all).expect("degraded read");
        assert!(
            all == filled.contents,
            "{what}: block {:?} wrong",
            first_wrong_block(&all, &filled.contents)
        );
    }
}
