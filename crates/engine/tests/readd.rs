//! A member that comes back to the slot it left (md's re-add with a write-intent bitmap): while a slot is out the
//! bitmap keeps every bit, so the member, added back, is rebuilt only in the regions written since; everywhere
//! else it already holds the array's bytes. Each test proves that by taking other members out afterwards and
//! reading every byte back, so the array serves the skipped regions from the returning member alone.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::{reference, Rng, TempDir};
use paraid_engine::layout::Level;
use paraid_engine::{
    assemble, AddOutcome, Array, AssembleOptions, EngineError, NewMember, Progress,
};

const CHUNK_BYTES: u64 = 16 << 10;
const MEMBER_BYTES: u64 = 8 << 20;
/// Each level with redundancy, with a member count it takes.
const EVERY_LEVEL: [(Level, usize); 4] = [
    (Level::Raid1, 2),
    (Level::Raid5, 4),
    (Level::Raid6, 5),
    (Level::Raid10, 4),
];

fn create_array(dir: &TempDir, level: Level, members: usize) -> Vec<PathBuf> {
    dir.create_array(level, members, CHUNK_BYTES, MEMBER_BYTES)
}

fn open(paths: &[PathBuf]) -> Array {
    let array = assemble(paths, AssembleOptions::new(reference())).expect("assemble");
    // The bitmap's lazy clear after 0 s of idleness, so that any bit a tick may clear is cleared.
    array.set_bitmap_idle_clear(Duration::ZERO);
    array
}

/// A blank file in `dir` big enough to be a member of the arrays these tests create.
fn blank_member(dir: &TempDir, name: &str) -> PathBuf {
    let path = dir.path(name);
    std::fs::File::create(&path)
        .and_then(|f| f.set_len(MEMBER_BYTES + (8 << 20)))
        .expect("blank member file");
    path
}

/// Assembles with re-add: a stale member is rebuilt (from the bitmap where it qualifies), not refused.
fn assemble_re_add(paths: &[PathBuf]) -> Array {
    assemble(
        paths,
        AssembleOptions {
            re_add: true,
            ..AssembleOptions::new(reference())
        },
    )
    .expect("assemble with re-add")
}

/// Writes the whole array with random bytes; returns them.
fn fill(array: &Array, seed: u64) -> Vec<u8> {
    let mut model = vec![0u8; array.size_bytes() as usize];
    Rng::new(seed).fill(&mut model);
    for (i, piece) in model.chunks(1 << 20).enumerate() {
        array.write((i << 20) as u64, piece, false).expect("fill");
    }
    array.flush().expect("flush");
    // Whole, idle and flushed: the tick clears the fill's bits (after a millisecond: the clock the bitmap
    // compares writes and flushes by counts milliseconds, and a write in the flush's millisecond keeps its bit).
    tick(array);
    assert_eq!(
        array.integrity().dirty_regions,
        0,
        "the fill's bits were not cleared"
    );
    model
}

/// A few small writes at spread offsets (each touching one bitmap region), applied to `model` too.
fn scattered_writes(array: &Array, model: &mut [u8], seed: u64, count: usize) {
    let mut rng = Rng::new(seed);
    let size = model.len() as u64;
    for _ in 0..count {
        let len = 1 + rng.below(8192);
        let at = rng.below(size - len);
        let mut data = vec![0u8; len as usize];
        rng.fill(&mut data);
        array.write(at, &data, false).expect("write while degraded");
        model[at as usize..(at + len) as usize].copy_from_slice(&data);
    }
    array.flush().expect("flush");
}

/// `slot` failed and removed (as `paraid fail` and `remove` do), then `count` scattered writes while it is out.
fn take_out_and_write(array: &Array, slot: usize, model: &mut [u8], seed: u64, count: usize) {
    array.fail_member(slot).expect("fail");
    array.remove_member(slot).expect("remove");
    scattered_writes(array, model, seed, count);
}

/// One background tick, a few milliseconds after the last write (see `fill`).
fn tick(array: &Array) {
    std::thread::sleep(Duration::from_millis(3));
    array.run_integrity_tick().expect("tick");
}

fn rebuild_result(array: &Array) -> Progress {
    assert!(
        array.wait_idle(Duration::from_secs(60)),
        "rebuild still running"
    );
    let last = array.last_result().expect("a rebuild result");
    assert_eq!(
        (last.kind, last.outcome.as_deref()),
        ("rebuild", Some("completed")),
        "{last:?}"
    );
    last
}

fn assert_reads(array: &Array, model: &[u8], what: &str) {
    let mut back = vec![0u8; model.len()];
    array.read(0, &mut back).expect("read");
    if let Some(at) = back.iter().zip(model).position(|(a, b)| a != b) {
        panic!("{what}: byte {at} differs from what was written");
    }
}

/// Slots other than `returned` to take out afterwards, as many as the level tolerates.
fn others(level: Level, members: usize, returned: usize) -> Vec<usize> {
    let take = if level == Level::Raid6 { 2 } else { 1 };
    (0..members)
        .filter(|s| *s != returned)
        .filter(|s| {
            // RAID1/10: the other copy of what the returned member holds.
            level != Level::Raid10 || (*s / 2 == returned / 2)
        })
        .take(take)
        .collect()
}

#[test]
fn a_member_back_in_its_slot_is_rebuilt_only_where_written_every_level() {
    for (level, members) in EVERY_LEVEL {
        let what = format!("{level} of {members}");
        let dir = TempDir::new("readd");
        let paths = create_array(&dir, level, members);
        let array = open(&paths);
        let mut model = fill(&array, level as u64);
        let returned = 1;
        take_out_and_write(&array, returned, &mut model, 7, 5);
        // Degraded, the tick clears no bit: the regions written since slot 1 left stay marked.
        tick(&array);
        let dirty = array.integrity().dirty_regions;
        assert!(dirty > 0, "{what}: no bit kept while degraded");

        let outcome = array
            .add_member(NewMember::Path(paths[returned].clone()))
            .expect("add back");
        assert_eq!(outcome, AddOutcome::ReAdded { slot: returned }, "{what}");
        let last = rebuild_result(&array);
        let member_bytes = array.geometry().member_data_bytes();
        assert!(
            last.in_sync_bytes > member_bytes / 2 && last.in_sync_bytes < member_bytes,
            "{what}: {} of {member_bytes} bytes found in sync",
            last.in_sync_bytes
        );
        assert_reads(&array, &model, &what);
        // Whole again: the bits may go.
        tick(&array);
        assert_eq!(array.integrity().dirty_regions, 0, "{what}");

        // The returned member now serves alone what the others held: every byte it skipped must be right.
        for slot in others(level, members, returned) {
            array.fail_member(slot).expect("fail another");
        }
        assert_reads(
            &array,
            &model,
            &format!("{what}, served from the returned member"),
        );
        array.stop().expect("stop");
    }
}

#[test]
fn writes_during_the_rebuild_of_a_returning_member_reach_it() {
    let dir = TempDir::new("readd-busy");
    let paths = create_array(&dir, Level::Raid5, 4);
    let array = open(&paths);
    let mut model = fill(&array, 3);
    take_out_and_write(&array, 2, &mut model, 11, 3);
    // Slow enough that the writes below meet rows before, inside and after the batch being built.
    array.set_sync_speed(2 << 20, 2 << 20);
    let outcome = array
        .add_member(NewMember::Path(paths[2].clone()))
        .expect("add back");
    assert_eq!(outcome, AddOutcome::ReAdded { slot: 2 });
    let mut rng = Rng::new(99);
    let size = model.len() as u64;
    while array.progress().is_some() {
        let len = 1 + rng.below(20_000);
        let at = rng.below(size - len);
        let mut data = vec![0u8; len as usize];
        rng.fill(&mut data);
        array
            .write(at, &data, false)
            .expect("write during the rebuild");
        model[at as usize..(at + len) as usize].copy_from_slice(&data);
        std::thread::sleep(Duration::from_millis(2));
    }
    array.set_sync_speed(0, 0);
    let last = rebuild_result(&array);
    assert!(last.in_sync_bytes > 0, "{last:?}");
    assert_reads(&array, &model, "after the rebuild");
    array.fail_member(0).expect("fail another");
    assert_reads(&array, &model, "served from the returned member");
}

#[test]
fn a_member_whose_slot_was_rebuilt_since_is_rebuilt_whole() {
    let dir = TempDir::new("readd-replaced");
    let paths = create_array(&dir, Level::Raid5, 4);
    let spare = blank_member(&dir, "spare.img");
    let array = open(&paths);
    let mut model = fill(&array, 5);
    array.fail_member(1).expect("fail");
    array.remove_member(1).expect("remove");
    // Another member takes the slot and is rebuilt; the array is whole, the bits are cleared.
    assert_eq!(
        array.add_member(NewMember::Path(spare)).expect("add"),
        AddOutcome::Rebuilding { slot: 1 }
    );
    rebuild_result(&array);
    tick(&array);
    // The new one goes too.
    take_out_and_write(&array, 1, &mut model, 13, 3);
    // The first member comes back: the slot no longer names it, and what it holds is older than the bits.
    let outcome = array
        .add_member(NewMember::Path(paths[1].clone()))
        .expect("add back");
    assert_eq!(outcome, AddOutcome::Rebuilding { slot: 1 });
    let last = rebuild_result(&array);
    assert_eq!(last.in_sync_bytes, 0, "{last:?}");
    array.fail_member(0).expect("fail another");
    assert_reads(&array, &model, "served from the member rebuilt whole");
}

#[test]
fn a_member_left_out_of_a_clean_stop_is_re_added_at_assembly() {
    let dir = TempDir::new("readd-assembly");
    let paths = create_array(&dir, Level::Raid6, 5);
    let array = open(&paths);
    let mut model = fill(&array, 17);
    take_out_and_write(&array, 3, &mut model, 19, 4);
    array.stop().expect("a clean stop, degraded: the bits stay");

    // Without re-add the stale member is refused, as before.
    match assemble(&paths, AssembleOptions::new(reference())) {
        Err(EngineError::TrustStaleMember { slot: 3, .. }) => {}
        other => panic!(
            "expected the stale member refused, got {:?}",
            other.map(|_| ())
        ),
    }
    let array = assemble_re_add(&paths);
    let last = rebuild_result(&array);
    assert!(last.in_sync_bytes > 0, "{last:?}");
    assert_reads(&array, &model, "after the re-add");
    array.fail_member(0).expect("fail");
    array.fail_member(1).expect("fail");
    assert_reads(&array, &model, "served from the re-added member");
}

#[test]
fn a_re_add_stopped_midway_resumes_where_the_bitmap_marks_writes() {
    let dir = TempDir::new("readd-resume");
    let paths = create_array(&dir, Level::Raid5, 4);
    let array = open(&paths);
    let mut model = fill(&array, 23);
    take_out_and_write(&array, 2, &mut model, 29, 20);
    array.set_sync_speed(1 << 20, 1 << 20);
    assert_eq!(
        array
            .add_member(NewMember::Path(paths[2].clone()))
            .expect("add back"),
        AddOutcome::ReAdded { slot: 2 }
    );
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        array.progress().is_some(),
        "the rebuild ended before the stop"
    );
    array.stop().expect("stop in the middle of the rebuild");
    let sb = paraid_engine::examine(&paths[0]).expect("examine");
    let entry = &sb.slots[2];
    assert_eq!(
        entry.state,
        paraid_engine::superblock::SlotState::Rebuilding
    );
    assert!(entry.rebuild_from_bitmap, "{entry:?}");
    assert!(entry.recovery_offset_bytes > 0, "{entry:?}");

    let array = open(&paths);
    let last = rebuild_result(&array);
    assert!(
        last.in_sync_bytes > 0,
        "the resumed rebuild skipped nothing: {last:?}"
    );
    assert_reads(&array, &model, "after the resumed re-add");
    array.fail_member(1).expect("fail another");
    assert_reads(&array, &model, "served from the re-added member");
}

/// A blank member added into slot 1 of a fresh `level` array (slot 1 taken out first) and failed once a third of
/// its whole rebuild is done, then removed, and writes made while it is out. Returns the array, its member paths
/// (slot 1's the blank member's), the model and the checkpoint the blank member's own superblock holds.
fn fail_in_the_middle_of_a_rebuild(
    dir: &TempDir,
    level: Level,
    members: usize,
) -> (Array, Vec<PathBuf>, Vec<u8>, u64) {
    let what = format!("{level} of {members}");
    let mut paths = create_array(dir, level, members);
    let blank = blank_member(dir, "blank.img");
    let array = open(&paths);
    let mut model = fill(&array, 31);
    take_out_and_write(&array, 1, &mut model, 37, 3);
    // A checkpoint after every batch, and slow enough to be caught a third of the way.
    array.set_rebuild_checkpoint_bytes(CHUNK_BYTES);
    array.set_sync_speed(4 << 20, 4 << 20);
    assert_eq!(
        array
            .add_member(NewMember::Path(blank.clone()))
            .expect("add a blank member"),
        AddOutcome::Rebuilding { slot: 1 },
        "{what}"
    );
    let member_bytes = array.geometry().member_data_bytes();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while array
        .progress()
        .is_some_and(|p| p.done_bytes < member_bytes / 3)
    {
        assert!(std::time::Instant::now() < deadline, "{what}: no progress");
        std::thread::sleep(Duration::from_millis(10));
    }
    array.fail_member(1).expect("fail the member being rebuilt");
    assert!(array.wait_idle(Duration::from_secs(60)), "{what}");
    array.remove_member(1).expect("remove it");
    array.set_sync_speed(0, 0);
    let own = paraid_engine::examine(&blank).expect("examine the blank member");
    let checkpoint_bytes = own.slots[1].recovery_offset_bytes;
    assert!(
        own.slots[1].state == paraid_engine::superblock::SlotState::Rebuilding
            && checkpoint_bytes > 0
            && checkpoint_bytes < member_bytes,
        "{what}: its own superblock says {:?}",
        own.slots[1]
    );
    scattered_writes(&array, &mut model, 41, 6);
    paths[1] = blank;
    (array, paths, model, checkpoint_bytes)
}

/// The rebuild that brings the member of `fail_in_the_middle_of_a_rebuild` back found some rows in sync, none at
/// or past its checkpoint; every byte reads back, also served from it alone.
fn assert_back_from_a_broken_off_rebuild(
    array: &Array,
    model: &[u8],
    checkpoint_bytes: u64,
    what: &str,
) {
    let last = rebuild_result(array);
    assert!(
        last.in_sync_bytes > 0 && last.in_sync_bytes <= checkpoint_bytes,
        "{what}: {} bytes found in sync, its checkpoint was at {checkpoint_bytes}",
        last.in_sync_bytes
    );
    assert_reads(array, model, what);
    let g = array.geometry();
    for slot in others(g.level, g.members, 1) {
        array.fail_member(slot).expect("fail another");
    }
    assert_reads(
        array,
        model,
        &format!("{what}, served from the member back from a broken-off rebuild"),
    );
}

/// A new member that fails in the middle of its whole rebuild and comes back holds the rows below the last
/// checkpoint it was told (built and flushed before that checkpoint was written): they are rebuilt only where the
/// bitmap marks writes since it left, the rest whole.
#[test]
fn a_member_that_left_in_the_middle_of_its_rebuild_keeps_the_rows_below_its_checkpoint() {
    for (level, members) in EVERY_LEVEL {
        let what = format!("{level} of {members}");
        let dir = TempDir::new("readd-midway");
        let (array, paths, model, checkpoint_bytes) =
            fail_in_the_middle_of_a_rebuild(&dir, level, members);
        let outcome = array
            .add_member(NewMember::Path(paths[1].clone()))
            .expect("add it back");
        assert_eq!(outcome, AddOutcome::ReAdded { slot: 1 }, "{what}");
        assert_back_from_a_broken_off_rebuild(&array, &model, checkpoint_bytes, &what);
        array.stop().expect("stop");
    }
}

/// The same member offered back at assembly (re-add) after a clean stop without it.
#[test]
fn a_member_that_left_in_the_middle_of_its_rebuild_is_re_added_at_assembly() {
    let dir = TempDir::new("readd-midway-assembly");
    let (array, paths, model, checkpoint_bytes) =
        fail_in_the_middle_of_a_rebuild(&dir, Level::Raid6, 5);
    array.stop().expect("a clean stop, degraded");
    // `paraid detail` says what a re-add would rebuild.
    let detail = paraid_engine::inspect(&paths).expect("inspect");
    let stale: Vec<_> = detail
        .stale
        .iter()
        .map(|m| (m.slot, m.re_add_from_bitmap, m.re_add_in_sync_below_bytes))
        .collect();
    assert_eq!(stale, [(1, true, Some(checkpoint_bytes))]);
    let array = assemble_re_add(&paths);
    assert_back_from_a_broken_off_rebuild(&array, &model, checkpoint_bytes, "at assembly");
}
