//! Rebuild onto spares and replacements: redundancy restored (every stripe's parity checked from the member
//! images with the reference backend), resumed from the superblock checkpoint after a stop, consistent while
//! foreground writes run, spares taking over by themselves, stale members refused or re-added.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{data_areas, mem_array, reference, verify_members, Rng};
use paraid_engine::layout::Level;
use paraid_engine::superblock::{Superblock, DEFAULT_DATA_OFFSET_BYTES};
use paraid_engine::{
    assemble_io, AddOutcome, Array, AssembleOptions, EngineError, MemMembers, NewMember, SlotState,
};

const WAIT: Duration = Duration::from_secs(30);

fn member_bytes(chunk_bytes: u64, rows: u64) -> u64 {
    DEFAULT_DATA_OFFSET_BYTES + rows * chunk_bytes
}

fn image(label: &str, chunk_bytes: u64, rows: u64) -> NewMember {
    NewMember::Image {
        label: label.to_string(),
        size_bytes: member_bytes(chunk_bytes, rows),
    }
}

/// Random contents over the whole array; returns the model.
fn fill(array: &Array, seed: u64) -> Vec<u8> {
    let mut model = vec![0u8; array.size_bytes() as usize];
    Rng::new(seed).fill(&mut model);
    array.write(0, &model, false).expect("fill");
    model
}

fn read_all(array: &Array) -> Vec<u8> {
    let mut all = vec![0u8; array.size_bytes() as usize];
    array.read(0, &mut all).expect("read all");
    all
}

/// Every member image of slots `0..members`, as the array's data slots hold them now.
fn slot_images(io: &MemMembers, members: usize) -> Vec<Option<Vec<u8>>> {
    (0..members).map(|s| io.image(s)).collect()
}

/// Reads the whole array and every member directly: data equals the model, every copy and every stripe's
/// parity (reference backend) is right on every member.
fn verify_whole(array: &Array, io: &MemMembers, model: &[u8], what: &str) {
    assert!(read_all(array) == model, "{what}: array contents differ");
    let g = array.geometry();
    for slot in 0..g.members {
        assert_eq!(
            array.slot_state(slot),
            SlotState::Active,
            "{what}: slot {slot}"
        );
    }
    let images = slot_images(io, g.members);
    assert!(
        images.iter().all(|i| i.is_some()),
        "{what}: a slot has no member"
    );
    verify_members(
        &g,
        &data_areas(&images, array.data_offset_bytes(), &g),
        model,
    );
}

/// Fails `slot`, checks degraded reads, adds a member (it takes the slot), waits for the rebuild, verifies.
fn fail_and_rebuild(level: Level, members: usize, chunk_bytes: u64, rows: u64, slot: usize) {
    let (io, array) = mem_array(level, members, chunk_bytes, rows);
    let model = fill(&array, 100 + slot as u64);
    array.fail_member(slot).expect("fail");
    assert_eq!(array.slot_state(slot), SlotState::Faulty);
    assert!(read_all(&array) == model, "{level}: degraded read");
    array.remove_member(slot).expect("remove");
    assert_eq!(array.slot_state(slot), SlotState::Missing);
    let outcome = array
        .add_member(image("new", chunk_bytes, rows))
        .expect("add");
    assert_eq!(outcome, AddOutcome::Rebuilding { slot });
    assert!(array.wait_idle(WAIT), "rebuild finished");
    let result = array.last_result().expect("a rebuild result");
    assert_eq!(result.kind, "rebuild");
    assert_eq!(result.slot, Some(slot));
    assert_eq!(result.outcome.as_deref(), Some("completed"), "{result:?}");
    assert_eq!(result.done_bytes, result.total_bytes);
    assert!(result.unreadable.is_empty());
    verify_whole(
        &array,
        &io,
        &model,
        &format!("{level}/{members} slot {slot} rebuilt"),
    );
}

#[test]
fn rebuild_restores_redundancy_every_level_and_slot() {
    for (level, members, chunk, rows) in [
        (Level::Raid5, 4, 16384u64, 24u64),
        (Level::Raid6, 5, 8192, 24),
        (Level::Raid1, 3, 8192, 16),
        (Level::Raid10, 4, 8192, 16),
        (Level::Raid10, 3, 4096, 15),
    ] {
        for slot in 0..members {
            fail_and_rebuild(level, members, chunk, rows, slot);
        }
    }
}

/// RAID6 with two members gone: both rebuilt, one after the other, onto two spares.
#[test]
fn raid6_two_spares_rebuild_two_slots() {
    let (chunk, rows) = (8192, 16);
    let (io, array) = mem_array(Level::Raid6, 6, chunk, rows);
    let model = fill(&array, 7);
    for label in ["s0", "s1"] {
        match array.add_member(image(label, chunk, rows)).expect("add") {
            AddOutcome::Spare { entry } => assert!(entry >= 6),
            other => panic!("expected a spare, got {other:?}"),
        }
    }
    assert_eq!(array.spares().len(), 2);
    // P and Q of stripe 0 are on slots 5 and 0.
    array.fail_member(5).expect("fail 5");
    array.fail_member(0).expect("fail 0");
    assert!(array.wait_idle(WAIT));
    assert!(array.spares().is_empty(), "both spares used");
    verify_whole(&array, &io, &model, "raid6 two slots rebuilt");
    let detail = array.detail();
    assert!(!detail.failed);
    assert!(detail.progress.is_none());
}

/// A spare given at assembly (a blank member beyond the member count) takes over a member failing by I/O errors.
#[test]
fn spare_at_assembly_takes_over_automatically() {
    let (chunk, rows) = (8192u64, 16u64);
    let (io, array) = mem_array(Level::Raid5, 4, chunk, rows);
    let model = fill(&array, 9);
    array.stop().expect("stop");
    let mut images = slot_images(&io, 4);
    images.push(Some(vec![0u8; member_bytes(chunk, rows) as usize]));
    let io = Arc::new(MemMembers::from_images(images));
    let array = assemble_io(io.clone(), AssembleOptions::new(reference())).expect("assemble");
    assert_eq!(array.spares(), vec!["mem4".to_string()]);
    array.fail_member(2).expect("fail");
    assert!(array.wait_idle(WAIT));
    assert_eq!(array.slot_state(2), SlotState::Active);
    assert!(array.spares().is_empty());
    verify_whole(&array, &io, &model, "spare took over");
    // The spare's superblock now names slot 2 and the array goes on after a restart.
    array.stop().expect("stop");
    let sb = Superblock::decode(&io.image(2).expect("slot 2")[..4096]).expect("superblock");
    assert_eq!(sb.slot, 2);
    assert_eq!(sb.slots[2].state, SlotState::Active);
    assert_eq!(
        sb.slots[4].state,
        paraid_engine::superblock::SlotState::Unused
    );
    let images = slot_images(&io, 4);
    let io = Arc::new(MemMembers::from_images(images));
    let array = assemble_io(io.clone(), AssembleOptions::new(reference())).expect("reassemble");
    verify_whole(&array, &io, &model, "after restart");
}

/// A rebuild stopped half-way keeps its checkpoint in the superblocks and resumes there after a restart.
#[test]
fn rebuild_resumes_from_checkpoint_after_stop() {
    let (chunk, rows) = (65536u64, 160u64); // 10 MiB per member
    let (io, array) = mem_array(Level::Raid5, 4, chunk, rows);
    let model = fill(&array, 11);
    array.fail_member(1).expect("fail");
    array.remove_member(1).expect("remove");
    // 4 MiB/s: the 10 MiB rebuild takes about 2.5 s.
    array.set_sync_speed(4 << 20, 4 << 20);
    array.add_member(image("new", chunk, rows)).expect("add");
    // Queued or running, the rebuild shows at once: a watcher never takes it for an idle array.
    assert_eq!(array.progress().map(|p| p.kind), Some("rebuild"));
    let total = rows * chunk;
    let mut seen = 0;
    for _ in 0..400 {
        std::thread::sleep(Duration::from_millis(10));
        if let Some(p) = array.progress() {
            assert_eq!(p.kind, "rebuild");
            assert_eq!(p.slot, Some(1));
            assert_eq!(p.total_bytes, total);
            seen = p.done_bytes;
            if seen >= total / 4 {
                break;
            }
        }
    }
    assert!(
        seen >= total / 4 && seen < total,
        "progress {seen} of {total}"
    );
    array.stop().expect("stop");
    let images = slot_images(&io, 4);
    let sb = Superblock::decode(&images[0].as_ref().expect("slot 0")[..4096]).expect("sb");
    assert_eq!(sb.slots[1].state, SlotState::Rebuilding);
    let checkpoint = sb.slots[1].recovery_offset_bytes;
    assert!(
        checkpoint >= seen && checkpoint < total,
        "checkpoint {checkpoint}, progress seen {seen}"
    );
    let new_sb = Superblock::decode(&images[1].as_ref().expect("slot 1")[..4096]).expect("sb");
    assert_eq!(new_sb.events, sb.events, "the rebuilding member is current");

    let io = Arc::new(MemMembers::from_images(images));
    let array = assemble_io(io.clone(), AssembleOptions::new(reference())).expect("reassemble");
    assert_eq!(array.slot_state(1), SlotState::Rebuilding);
    // Degraded reads are right while it resumes.
    assert!(read_all(&array) == model, "reads while resuming");
    assert!(array.wait_idle(WAIT));
    let result = array.last_result().expect("result");
    assert_eq!(result.outcome.as_deref(), Some("completed"));
    // The resumed run started at the checkpoint: its rate counts only what it did.
    assert_eq!(result.done_bytes, total);
    verify_whole(&array, &io, &model, "resumed rebuild");
}

/// Foreground writes from several threads while a rebuild runs: afterwards every byte and every parity is right.
#[test]
fn rebuild_while_writing_concurrently() {
    for level in [Level::Raid5, Level::Raid6, Level::Raid10] {
        let (chunk, rows) = (16384u64, 96u64);
        let (io, array) = mem_array(level, 5, chunk, rows);
        let model = Arc::new(Mutex::new(fill(&array, 13)));
        array.fail_member(3).expect("fail");
        array.remove_member(3).expect("remove");
        array.set_sync_speed(8 << 20, 8 << 20);
        let array = Arc::new(array);
        array.add_member(image("new", chunk, rows)).expect("add");
        let size = array.size_bytes();
        let threads: Vec<_> = (0..3u64)
            .map(|t| {
                let array = array.clone();
                let model = model.clone();
                std::thread::spawn(move || {
                    // Each thread owns a third of the array, so the model needs no ordering between them.
                    let part = size / 3;
                    let mut rng = Rng::new(1000 + t);
                    let mut writes = 0;
                    while array.progress().is_some() || writes < 20 {
                        let len = 1 + rng.below(40_000) as usize;
                        let offset = t * part + rng.below(part - len as u64);
                        let mut data = vec![0u8; len];
                        rng.fill(&mut data);
                        array
                            .write(offset, &data, false)
                            .expect("write during rebuild");
                        model.lock().expect("model")[offset as usize..offset as usize + len]
                            .copy_from_slice(&data);
                        writes += 1;
                        if writes > 5000 {
                            break;
                        }
                    }
                    writes
                })
            })
            .collect();
        let writes: u64 = threads.into_iter().map(|t| t.join().expect("writer")).sum();
        assert!(array.wait_idle(WAIT));
        assert!(writes >= 60, "{level}: {writes} writes");
        let model = model.lock().expect("model").clone();
        verify_whole(
            &array,
            &io,
            &model,
            &format!("{level}: rebuild under writes"),
        );
    }
}

/// Replace: the new member is built while the old one serves, then takes its slot; the old one is detached.
#[test]
fn replace_member_while_serving() {
    let (chunk, rows) = (8192u64, 32u64);
    for level in [Level::Raid5, Level::Raid1] {
        let (io, array) = mem_array(level, 3, chunk, rows);
        let mut model = fill(&array, 17);
        array
            .replace_member(1, image("replacement", chunk, rows))
            .expect("replace");
        // Writes during the replacement reach both.
        let mut rng = Rng::new(5);
        for _ in 0..20 {
            let len = 1 + rng.below(20_000) as usize;
            let offset = rng.below(array.size_bytes() - len as u64);
            let mut data = vec![0u8; len];
            rng.fill(&mut data);
            array.write(offset, &data, false).expect("write");
            model[offset as usize..offset as usize + len].copy_from_slice(&data);
        }
        assert!(array.wait_idle(WAIT));
        assert_eq!(
            array.last_result().and_then(|r| r.outcome),
            Some("completed".to_string())
        );
        assert_eq!(array.members().label(1), "replacement");
        assert!(array.spares().is_empty());
        verify_whole(&array, &io, &model, &format!("{level}: replaced"));
        // Replacing a member that is not active is refused.
        array.fail_member(0).expect("fail 0");
        assert!(matches!(
            array.replace_member(0, image("x", chunk, rows)),
            Err(EngineError::ChangeMember { slot: 0, .. })
        ));
    }
}

/// A member left out while the array ran degraded is refused by its events, naming it; asked to re-add it, the
/// array rebuilds it from scratch and is whole again.
#[test]
fn stale_member_refused_then_re_added() {
    let (chunk, rows) = (8192u64, 16u64);
    let (io, array) = mem_array(Level::Raid6, 5, chunk, rows);
    let mut model = fill(&array, 19);
    array.stop().expect("stop");
    let snapshot = io.image(4);
    let mut images = slot_images(&io, 5);
    images[4] = None;
    let io = Arc::new(MemMembers::from_images(images));
    let array = assemble_io(io.clone(), AssembleOptions::new(reference())).expect("degraded");
    let data = vec![0x5a; 50_000];
    array.write(12345, &data, false).expect("degraded write");
    model[12345..12345 + data.len()].copy_from_slice(&data);
    array.stop().expect("stop");

    let mut images = slot_images(&io, 5);
    images[4] = snapshot;
    match assemble_io(
        Arc::new(MemMembers::from_images(images.clone())),
        AssembleOptions::new(reference()),
    ) {
        Err(e @ EngineError::TrustStaleMember { slot: 4, .. }) => {
            let text = e.to_string();
            assert!(text.contains("mem4") && text.contains("stale"), "{text}");
        }
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("stale member trusted"),
    }
    let io = Arc::new(MemMembers::from_images(images));
    let mut opts = AssembleOptions::new(reference());
    opts.re_add = true;
    let array = assemble_io(io.clone(), opts).expect("re-add");
    assert_eq!(array.slot_state(4), SlotState::Rebuilding);
    assert!(read_all(&array) == model, "the stale member is never read");
    assert!(array.wait_idle(WAIT));
    verify_whole(&array, &io, &model, "re-added");
}
