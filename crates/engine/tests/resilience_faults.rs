//! Faults during a rebuild (faults.md rows 7 and 12) and rebuilds on real member files.
//!
//! * Latent sector errors on a survivor: RAID6 finishes the rebuild (the bad pages are one more erasure, and are
//!   rewritten); RAID5 reports exactly the array bytes that became unreadable, never activates the new member,
//!   never serves a wrong byte, and finishes after a restart once the survivor reads again.
//! * Another member failing mid-rebuild: RAID6 goes on, RAID5 stops serving (every request fails).
//! * The new member failing: the rebuild is aborted, the array serves on degraded.
//! * Files: spares given at assembly, a spare found among the member paths, rebuild, restart from the files.

mod common;
mod resilience_common;

use std::path::PathBuf;
use std::time::Duration;

use common::{data_areas, filled, read_files, reference, verify_members, Rng, TempDir};
use paraid_engine::layout::{Geometry, Level};
use paraid_engine::member::NewMember;
use paraid_engine::superblock::DEFAULT_DATA_OFFSET_BYTES;
use paraid_engine::{
    assemble, create, examine, AddOutcome, Array, AssembleOptions, CreateOptions, EngineError,
    SlotState,
};
use resilience_common::{assemble_flaky, Flaky};

const WAIT: Duration = Duration::from_secs(30);
const PAGE: u64 = 4096;

fn blank(chunk: u64, rows: u64) -> NewMember {
    NewMember::Image {
        label: "new".to_string(),
        size_bytes: DEFAULT_DATA_OFFSET_BYTES + chunk * rows,
    }
}

fn verify_whole(array: &Array, io: &Flaky, model: &[u8], what: &str) {
    let mut all = vec![0u8; model.len()];
    array.read(0, &mut all).expect("read");
    assert!(all == model, "{what}: contents");
    let g = array.geometry();
    for s in 0..g.members {
        assert_eq!(array.slot_state(s), SlotState::Active, "{what}: slot {s}");
    }
    let images: Vec<Option<Vec<u8>>> = (0..g.members).map(|s| io.inner.image(s)).collect();
    verify_members(
        &g,
        &data_areas(&images, array.data_offset_bytes(), &g),
        model,
    );
}

/// Member byte range of pages `pages` at page `page` of row `row`.
fn member_pages(g: &Geometry, row: u64, page: u64, pages: u64) -> std::ops::Range<u64> {
    let at = DEFAULT_DATA_OFFSET_BYTES + row * g.chunk_bytes + page * PAGE;
    at..at + pages * PAGE
}

/// What a RAID5 rebuild of `target` loses when survivor `bad` cannot read `ranges`: for every unreadable page,
/// the same page of the data chunks on `bad` and on `target`, as merged array byte ranges.
fn expected_unreadable(
    g: &Geometry,
    target: usize,
    bad: usize,
    ranges: &[std::ops::Range<u64>],
) -> Vec<(u64, u64)> {
    let mut pages: Vec<u64> = Vec::new();
    for chunk in 0..g.data_chunks() {
        let addr = g.chunk_copy(chunk, 0);
        if addr.member != bad && addr.member != target {
            continue;
        }
        for p in 0..g.chunk_bytes / PAGE {
            let at = DEFAULT_DATA_OFFSET_BYTES + addr.row * g.chunk_bytes + p * PAGE;
            if ranges.iter().any(|r| r.start <= at && at < r.end) {
                pages.push(chunk * g.chunk_bytes + p * PAGE);
            }
        }
    }
    pages.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::new();
    for at in pages {
        match merged.last_mut() {
            Some((m, len)) if *m + *len == at => *len += PAGE,
            _ => merged.push((at, PAGE)),
        }
    }
    merged
}

#[test]
fn row07_raid5_rebuild_reports_exactly_the_unreadable_bytes() {
    for (members, chunk, target, bad) in [
        (4usize, 8192u64, 1usize, 3usize),
        (3, 16384, 0, 2),
        (5, 4096, 4, 0),
    ] {
        let rows = 16;
        let (images, model) = filled(Level::Raid5, members, chunk, rows, 700 + members as u64);
        let (io, array) = assemble_flaky(&images);
        let g = array.geometry();
        array.fail_member(target).expect("fail");
        array.remove_member(target).expect("remove");
        // A page inside a row, and a run crossing from one row into the next.
        let pages_per_chunk = chunk / PAGE;
        let ranges = vec![
            member_pages(&g, 3, pages_per_chunk / 2, 1),
            member_pages(&g, 9, pages_per_chunk - 1, 2),
        ];
        for r in &ranges {
            io.bad_reads(bad, r.clone());
        }
        array.add_member(blank(chunk, rows)).expect("add");
        assert!(array.wait_idle(WAIT));
        let result = array.last_result().expect("result");
        let expected = expected_unreadable(&g, target, bad, &ranges);
        assert!(!expected.is_empty());
        assert_eq!(
            result.unreadable, expected,
            "raid5/{members}: unreadable ranges"
        );
        assert!(
            result
                .outcome
                .as_deref()
                .unwrap_or("")
                .starts_with("aborted"),
            "{result:?}"
        );
        // The new member is never activated; reads fail exactly on the lost bytes, never return wrong data.
        assert_eq!(array.slot_state(target), SlotState::Rebuilding);
        let mut block = vec![0u8; PAGE as usize];
        for at in (0..array.size_bytes()).step_by(PAGE as usize) {
            let lost = expected.iter().any(|(o, l)| *o <= at && at < o + l);
            match array.read(at, &mut block) {
                Ok(()) => {
                    assert!(!lost, "raid5/{members}: a lost block at {at} was served");
                    assert!(
                        block == model[at as usize..(at + PAGE) as usize],
                        "wrong block at {at}"
                    );
                }
                Err(e) => assert!(lost, "raid5/{members}: block at {at} failed: {e}"),
            }
        }
        // After a restart with the survivor readable again, the rebuild resumes and completes.
        array.stop().expect("stop");
        let checkpoint = {
            let image = io.inner.image(bad).expect("survivor");
            let sb = paraid_engine::Superblock::decode(&image[..4096]).expect("sb");
            assert_eq!(sb.slots[target].state, SlotState::Rebuilding);
            sb.slots[target].recovery_offset_bytes
        };
        assert_eq!(
            checkpoint,
            3 * chunk,
            "checkpoint stops before the first unreadable row"
        );
        let images: Vec<Option<Vec<u8>>> = (0..members).map(|s| io.inner.image(s)).collect();
        let (io, array) = assemble_flaky(&images);
        assert!(array.wait_idle(WAIT));
        assert_eq!(
            array.last_result().and_then(|r| r.outcome),
            Some("completed".to_string())
        );
        verify_whole(
            &array,
            &io,
            &model,
            &format!("raid5/{members} after the restart"),
        );
    }
}

#[test]
fn row07_raid6_rebuild_finishes_through_latent_sector_errors() {
    let (members, chunk, rows) = (5usize, 8192u64, 16u64);
    let (images, model) = filled(Level::Raid6, members, chunk, rows, 777);
    let (io, array) = assemble_flaky(&images);
    let g = array.geometry();
    array.fail_member(2).expect("fail");
    array.remove_member(2).expect("remove");
    io.bad_reads(4, member_pages(&g, 5, 0, 3));
    io.bad_reads(0, member_pages(&g, 11, 1, 1));
    assert_eq!(
        array.add_member(blank(chunk, rows)).expect("add"),
        AddOutcome::Rebuilding { slot: 2 }
    );
    assert!(array.wait_idle(WAIT));
    let result = array.last_result().expect("result");
    assert_eq!(result.outcome.as_deref(), Some("completed"), "{result:?}");
    assert!(result.unreadable.is_empty());
    assert!(io.failed(4) > 0 && io.failed(0) > 0, "the errors were met");
    verify_whole(
        &array,
        &io,
        &model,
        "raid6 rebuilt around latent sector errors",
    );
}

/// Row 12: another member dies at several points of a rebuild. RAID6 finishes (and the second slot is rebuilt
/// after); RAID5 stops serving, and no block is read wrong before it does.
#[test]
fn row12_member_fails_during_rebuild() {
    let (chunk, rows) = (16384u64, 192u64); // 3 MiB per member: batches of 1 MiB
    for level in [Level::Raid6, Level::Raid5] {
        for fraction in [0.3f64, 0.6] {
            let members = 5;
            let (images, model) = filled(level, members, chunk, rows, 1200);
            let (io, array) = assemble_flaky(&images);
            array.fail_member(1).expect("fail");
            array.remove_member(1).expect("remove");
            array.set_sync_speed(4 << 20, 4 << 20);
            array.add_member(blank(chunk, rows)).expect("add");
            let total = rows * chunk;
            let mut at = 0;
            for _ in 0..1000 {
                std::thread::sleep(Duration::from_millis(2));
                match array.progress() {
                    Some(p) => at = p.done_bytes,
                    // Not started yet (queued), or already done.
                    None if array.last_result().is_none() => continue,
                    None => at = total,
                }
                if at as f64 >= fraction * total as f64 {
                    break;
                }
            }
            assert!(
                at < total,
                "{level}: the rebuild ended before the failure point"
            );
            io.kill(3);
            // Foreground reads meet the dead member too.
            let mut block = vec![0u8; 65536];
            let mut served = 0;
            for off in (0..array.size_bytes()).step_by(65536) {
                if array.read(off, &mut block).is_ok() {
                    assert!(
                        block == model[off as usize..off as usize + 65536],
                        "{level}: wrong read"
                    );
                    served += 1;
                }
            }
            assert!(array.wait_idle(WAIT));
            let result = array.last_result().expect("result");
            if level == Level::Raid6 {
                assert_eq!(result.outcome.as_deref(), Some("completed"), "{result:?}");
                assert_eq!(array.slot_state(1), SlotState::Active);
                assert_eq!(array.slot_state(3), SlotState::Faulty);
                io.heal();
                array.remove_member(3).expect("remove");
                array.add_member(blank(chunk, rows)).expect("add");
                assert!(array.wait_idle(WAIT));
                verify_whole(
                    &array,
                    &io,
                    &model,
                    &format!("raid6, failure at {fraction}"),
                );
            } else {
                assert!(
                    result
                        .outcome
                        .as_deref()
                        .unwrap_or("")
                        .starts_with("aborted"),
                    "{result:?}"
                );
                assert!(array.detail().failed);
                assert!(array.read(0, &mut block).is_err());
                let _ = served;
            }
        }
    }
}

/// The member being rebuilt fails: its rebuild is aborted, the slot is faulty again, the array serves on.
#[test]
fn new_member_failing_aborts_its_rebuild() {
    let (chunk, rows) = (16384u64, 256u64);
    let (images, model) = filled(Level::Raid5, 4, chunk, rows, 1300);
    let (io, array) = assemble_flaky(&images);
    array.fail_member(0).expect("fail");
    array.remove_member(0).expect("remove");
    array.set_sync_speed(8 << 20, 8 << 20);
    array.add_member(blank(chunk, rows)).expect("add");
    while array.progress().is_none_or(|p| p.done_bytes == 0) {
        assert!(
            array.last_result().is_none(),
            "the rebuild ended before the failure"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    io.bad_writes(0);
    assert!(array.wait_idle(WAIT));
    let result = array.last_result().expect("result");
    assert!(
        result
            .outcome
            .as_deref()
            .unwrap_or("")
            .starts_with("aborted"),
        "{result:?}"
    );
    assert_eq!(array.slot_state(0), SlotState::Faulty);
    let mut all = vec![0u8; model.len()];
    array.read(0, &mut all).expect("serves degraded");
    assert!(all == model);
}

fn options(level: Level, members: Vec<PathBuf>) -> CreateOptions {
    CreateOptions {
        level,
        chunk_bytes: 65536,
        name: "resilience".to_string(),
        size_bytes: Some(DEFAULT_DATA_OFFSET_BYTES + 2 * 1024 * 1024),
        members,
        force: false,
    }
}

/// Real files: a spare given at assembly takes over a failed member; the array restarts from the files with the
/// spare in the slot, and the files alone (read directly) hold the data with right parity. A spare that was
/// added at run time is recognised among plain member paths after a restart.
#[test]
fn files_spare_takes_over_and_survives_a_restart() {
    for level in [Level::Raid5, Level::Raid10] {
        let dir = TempDir::new("resilience-files");
        let paths = dir.members(4);
        create(&options(level, paths.clone())).expect("create");
        let spare = dir.path("spare.img");
        std::fs::write(
            &spare,
            vec![0u8; (DEFAULT_DATA_OFFSET_BYTES + 2 * 1024 * 1024) as usize],
        )
        .expect("spare");
        let mut opts = AssembleOptions::new(reference());
        opts.spares = vec![spare.clone()];
        let array = assemble(&paths, opts).expect("assemble");
        assert_eq!(array.spares(), vec![spare.display().to_string()]);
        let mut model = vec![0u8; array.size_bytes() as usize];
        Rng::new(3).fill(&mut model);
        array.write(0, &model, false).expect("write");
        array.fail_member(2).expect("fail");
        assert!(array.wait_idle(WAIT));
        assert_eq!(array.slot_state(2), SlotState::Active);
        assert_eq!(array.detail().members[2].path, spare.display().to_string());
        // A second spare, added while running.
        let spare2 = dir.path("spare2.img");
        std::fs::write(
            &spare2,
            vec![0u8; (DEFAULT_DATA_OFFSET_BYTES + 2 * 1024 * 1024) as usize],
        )
        .expect("spare2");
        assert!(matches!(
            array
                .add_member(NewMember::Path(spare2.clone()))
                .expect("add"),
            AddOutcome::Spare { .. }
        ));
        array.stop().expect("stop");
        assert_eq!(examine(&spare).expect("examine").slot, 2);
        assert!(examine(&spare2).expect("examine spare").slot >= 4);

        let now: Vec<PathBuf> = vec![
            paths[0].clone(),
            paths[1].clone(),
            spare.clone(),
            paths[3].clone(),
        ];
        let files = read_files(&now);
        let g = paraid_engine::Geometry::new(level, 4, 65536, 2 * 1024 * 1024).expect("geometry");
        verify_members(
            &g,
            &data_areas(&files, DEFAULT_DATA_OFFSET_BYTES, &g),
            &model,
        );
        // The old member 2 is stale: refused by name.
        match assemble(&paths, AssembleOptions::new(reference())) {
            Err(EngineError::TrustStaleMember { slot: 2, path, .. }) => assert_eq!(path, paths[2]),
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("stale member trusted"),
        }
        // With the spare among the member paths: recognised as a spare.
        let mut with_spare = now.clone();
        with_spare.push(spare2.clone());
        let array = assemble(&with_spare, AssembleOptions::new(reference())).expect("reassemble");
        assert_eq!(array.spares(), vec![spare2.display().to_string()]);
        let mut all = vec![0u8; model.len()];
        array.read(0, &mut all).expect("read");
        assert!(all == model, "{level}: after restart");
        array.stop().expect("stop");
    }
}
