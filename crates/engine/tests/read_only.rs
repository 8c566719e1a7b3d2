//! An array served read-only (`AssembleOptions::read_only`, `paraid serve --read-only`, md's `--readonly`): it
//! reads as the array it is, degraded or after an unclean stop where that is safe, and writes nothing to any
//! member, superblocks, bitmap and log included. Each test compares the members byte for byte (files) or counts
//! every write and discard that reaches them (in memory) before and after.

mod common;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use common::{read_files, reference, Rng, TempDir};
use paraid_engine::fault::{Count, Fault, FaultyMembers, OpKinds, Scope};
use paraid_engine::layout::Level;
use paraid_engine::{
    assemble, assemble_io, create_io, Array, ArrayState, AssembleOptions, EngineError, MemMembers,
    NewMember, SlotState,
};

const CHUNK_BYTES: u64 = 16 << 10;
const MEMBER_BYTES: u64 = 8 << 20;

fn create_array(dir: &TempDir, level: Level, members: usize) -> Vec<PathBuf> {
    dir.create_array(level, members, CHUNK_BYTES, MEMBER_BYTES)
}

fn read_only() -> AssembleOptions {
    AssembleOptions {
        read_only: true,
        ..AssembleOptions::new(reference())
    }
}

/// Writes the whole array with random bytes and then `small_writes` scattered small writes (partial stripes:
/// logged, bits set), flushed; returns the bytes.
fn fill(array: &Array, seed: u64, small_writes: usize) -> Vec<u8> {
    let mut model = vec![0u8; array.size_bytes() as usize];
    let mut rng = Rng::new(seed);
    rng.fill(&mut model);
    for (i, piece) in model.chunks(1 << 20).enumerate() {
        array.write((i << 20) as u64, piece, false).expect("fill");
    }
    for _ in 0..small_writes {
        let len = 1 + rng.below(6000);
        let at = rng.below(model.len() as u64 - len) as usize;
        rng.fill(&mut model[at..at + len as usize]);
        array
            .write(at as u64, &model[at..at + len as usize], false)
            .expect("small write");
    }
    array.flush().expect("flush");
    model
}

fn assert_reads(array: &Array, model: &[u8], what: &str) {
    let mut back = vec![0u8; model.len()];
    for (i, piece) in back.chunks_mut(1 << 20).enumerate() {
        array.read((i << 20) as u64, piece).expect("read");
    }
    assert!(back == model, "{what}: the array read back other bytes");
    // And a few odd pieces, across chunk and stripe boundaries.
    let mut rng = Rng::new(model.len() as u64);
    for _ in 0..64 {
        let len = 1 + rng.below(70_000) as usize;
        let at = rng.below((model.len() - len) as u64) as usize;
        let mut piece = vec![0u8; len];
        array.read(at as u64, &mut piece).expect("read a piece");
        assert!(
            piece == model[at..at + len],
            "{what}: {len} bytes at {at} differ"
        );
    }
}

fn assert_read_only_refusal<T: std::fmt::Debug>(result: Result<T, EngineError>, what: &str) {
    match result {
        Err(EngineError::ChangeReadOnly { .. }) => {}
        other => panic!("{what} on a read-only array: {other:?}, expected ChangeReadOnly"),
    }
}

/// Every change a client or an administrator can ask for is refused; a check (reads only) runs.
fn assert_refuses_changes(array: &Array, spare: PathBuf) {
    assert_read_only_refusal(array.write(0, &[1u8; 4096], false), "write");
    assert_read_only_refusal(array.write(4096, &[1u8; 512], true), "FUA write");
    assert_read_only_refusal(array.discard(0, 1 << 20), "discard");
    assert_read_only_refusal(array.write_zeroes(0, 1 << 20, false), "write zeroes");
    assert_read_only_refusal(array.fail_member(1), "fail");
    assert_read_only_refusal(array.remove_member(1), "remove");
    assert_read_only_refusal(array.add_member(NewMember::Path(spare.clone())), "add");
    assert_read_only_refusal(array.replace_member(1, NewMember::Path(spare)), "replace");
    assert_read_only_refusal(array.start_check(true), "repair");
    array.flush().expect("a flush has nothing to do");
}

#[test]
fn member_files_served_read_only_stay_byte_for_byte() {
    for level in [Level::Raid5, Level::Raid6, Level::Raid1, Level::Raid10] {
        let dir = TempDir::new("ro-clean");
        let paths = create_array(&dir, level, 4);
        let spare = dir.path("spare.img");
        std::fs::File::create(&spare)
            .unwrap()
            .set_len(MEMBER_BYTES)
            .unwrap();
        let array = assemble(&paths, AssembleOptions::new(reference())).expect("assemble");
        let model = fill(&array, 11, 40);
        assert_eq!(array.stop().expect("stop"), ArrayState::Clean);
        let before = read_files(&paths);

        let array = assemble(&paths, read_only()).expect("assemble read-only");
        assert!(array.is_read_only());
        assert_reads(&array, &model, &format!("{level} read-only"));
        assert_refuses_changes(&array, spare.clone());
        array.start_check(false).expect("a check only reads");
        assert!(array.wait_idle(Duration::from_secs(30)), "the check ends");
        let checked = array.last_result().expect("the check's figures");
        assert_eq!((checked.kind, checked.mismatches), ("check", 0), "{level}");
        // A writer cannot serve the members beside it; another read-only server can.
        match assemble(&paths, AssembleOptions::new(reference())) {
            Err(EngineError::OpenMember { source, .. }) => {
                assert!(source.to_string().contains("in use"), "{source}")
            }
            other => panic!(
                "a writer beside a read-only server: {:?}",
                other.map(|_| ())
            ),
        }
        let second = assemble(&paths, read_only()).expect("a second read-only server");
        assert_eq!(second.stop().expect("stop"), ArrayState::Clean);
        assert_eq!(array.stop().expect("stop"), ArrayState::Clean);
        assert!(
            read_files(&paths) == before,
            "{level}: a member file changed"
        );

        // It is the same array afterwards, for a writer too.
        let array = assemble(&paths, AssembleOptions::new(reference())).expect("assemble again");
        assert_reads(
            &array,
            &model,
            &format!("{level} after the read-only serve"),
        );
        array.stop().expect("stop");
    }
}

#[test]
fn a_degraded_array_served_read_only_solves_the_missing_members() {
    let dir = TempDir::new("ro-degraded");
    let paths = create_array(&dir, Level::Raid6, 6);
    let array = assemble(&paths, AssembleOptions::new(reference())).expect("assemble");
    let model = fill(&array, 12, 40);
    array.stop().expect("stop");
    let before = read_files(&paths);
    // Slots 1 and 4 not given: RAID6 solves both from P and Q.
    let given: Vec<PathBuf> = [0, 2, 3, 5].iter().map(|&i| paths[i].clone()).collect();
    let array = assemble(&given, read_only()).expect("assemble degraded, read-only");
    let detail = array.detail();
    assert_eq!(detail.members[1].state, SlotState::Missing);
    assert_eq!(detail.members[4].state, SlotState::Missing);
    assert_reads(&array, &model, "RAID6 read-only, two missing");
    assert_eq!(array.stop().expect("stop"), ArrayState::Clean);
    assert!(read_files(&paths) == before, "a member file changed");
}

#[test]
fn options_that_would_write_are_refused_before_anything_is_opened() {
    let dir = TempDir::new("ro-options");
    let paths = create_array(&dir, Level::Raid5, 4);
    let spare = dir.path("spare.img");
    std::fs::File::create(&spare)
        .unwrap()
        .set_len(MEMBER_BYTES)
        .unwrap();
    let before = read_files(&paths);
    for (what, opts) in [
        (
            "spares",
            AssembleOptions {
                spares: vec![spare.clone()],
                ..read_only()
            },
        ),
        (
            "re-add",
            AssembleOptions {
                re_add: true,
                ..read_only()
            },
        ),
    ] {
        match assemble(&paths, opts) {
            Err(e @ EngineError::AssembleReadOnly { .. }) => {
                assert!(e.to_string().contains("read-only"), "{what}: {e}")
            }
            other => panic!("{what} with read-only: {:?}", other.map(|_| ())),
        }
    }
    assert!(read_files(&paths) == before, "a member file changed");
}

/// After an unclean stop: the partial parity log's recovery is applied in memory only (the members stay as they
/// are, dirty for the next read-write start), so the array reads as a read-write start would serve it, with
/// every member and with members missing. RAID1/10 read, in the dirty regions, the copy a resync would copy from.
#[test]
fn after_an_unclean_stop_it_serves_what_a_read_write_start_would() {
    for (level, members, missing) in [
        (Level::Raid5, 4, vec![0]),
        (Level::Raid6, 5, vec![0, 3]),
        (Level::Raid1, 3, vec![0]),
        (Level::Raid10, 4, vec![1]),
    ] {
        let dir = TempDir::new("ro-dirty");
        let paths = create_array(&dir, level, members);
        let array = assemble(&paths, AssembleOptions::new(reference())).expect("assemble");
        let model = fill(&array, 13, 60);
        drop(array); // no clean stop: the superblocks stay dirty, bits and log records live
        let before = read_files(&paths);

        let array = assemble(&paths, read_only()).expect("assemble dirty, read-only");
        assert!(
            array.integrity().dirty_regions > 0,
            "{level}: the unclean stop left no dirty region to test"
        );
        assert_reads(&array, &model, &format!("{level} dirty, read-only"));
        assert_eq!(array.stop().expect("stop"), ArrayState::Dirty, "{level}");
        assert!(
            read_files(&paths) == before,
            "{level}: a member file changed"
        );

        let given: Vec<PathBuf> = (0..members)
            .filter(|i| !missing.contains(i))
            .map(|i| paths[i].clone())
            .collect();
        let array = assemble(&given, read_only()).expect("assemble dirty and degraded, read-only");
        if level.has_parity() {
            assert!(
                array.integrity().log_recovered_stripes > 0,
                "{level}: no stripe recovered from the log (in memory)"
            );
        }
        assert_reads(
            &array,
            &model,
            &format!("{level} dirty, missing {missing:?}, read-only"),
        );
        assert_eq!(array.stop().expect("stop"), ArrayState::Dirty, "{level}");
        assert!(
            read_files(&paths) == before,
            "{level}: a member file changed"
        );

        // The read-write start that follows serves the same bytes.
        let array = assemble(&given, AssembleOptions::new(reference())).expect("recover");
        assert_reads(
            &array,
            &model,
            &format!("{level} recovered without {missing:?}"),
        );
        array.stop().expect("stop");
    }
}

/// Without the partial parity log (consistency policy "bitmap", written so too) nothing can make the stripes
/// being written at a crash consistent: a dirty RAID5 with a member missing is refused read-only, writing nothing.
#[test]
fn without_the_log_a_dirty_degraded_array_is_refused() {
    let dir = TempDir::new("ro-nolog");
    let paths = create_array(&dir, Level::Raid5, 4);
    let no_log = || AssembleOptions {
        write_hole_log: false,
        ..AssembleOptions::new(reference())
    };
    let array = assemble(&paths, no_log()).expect("assemble");
    fill(&array, 16, 30);
    drop(array);
    let before = read_files(&paths);
    match assemble(
        &paths[1..],
        AssembleOptions {
            read_only: true,
            ..no_log()
        },
    ) {
        Err(e @ EngineError::AssembleReadOnly { .. }) => {
            assert!(e.to_string().contains("no partial parity log"), "{e}")
        }
        other => panic!(
            "dirty, degraded, no log, read-only: {:?}",
            other.map(|_| ())
        ),
    }
    assert!(read_files(&paths) == before, "a member file changed");
}

/// In-memory members behind a fault wrapper that counts every write and discard reaching them: a read-only array
/// sends none, also while a member fails (it is left out in memory) and while reads that member held are solved.
#[test]
fn no_write_or_discard_reaches_a_member_even_when_one_fails() {
    let member_bytes = paraid_engine::superblock::DEFAULT_DATA_OFFSET_BYTES + 64 * CHUNK_BYTES;
    let mem = MemMembers::new(6, member_bytes);
    create_io(&mem, Level::Raid6, CHUNK_BYTES, "ro").expect("create_io");
    let io = Arc::new(FaultyMembers::new(mem, 7));
    let array = assemble_io(io.clone(), AssembleOptions::new(reference())).expect("assemble_io");
    let model = fill(&array, 14, 40);
    array.stop().expect("stop");

    let writes = io.add(
        Scope::all().ops(OpKinds::WRITE | OpKinds::DISCARD),
        Fault::FailFrom {
            nth: 1,
            count: Count::Global,
        },
    );
    let array = assemble_io(io.clone(), read_only()).expect("assemble_io read-only");
    assert_reads(&array, &model, "RAID6 read-only");
    // Slot 3 fails one read and its retry: the chunk is solved, and not written back to slot 3 as a read-write
    // array would (read-error correction).
    let transient = io.add(
        Scope::slot(3).ops(OpKinds::READ),
        Fault::FailRun {
            nth: 1,
            times: 2,
            count: Count::Global,
        },
    );
    let g = array.geometry();
    let index = (0..g.data_per_stripe())
        .find(|&i| g.stripe_member(0, i) == 3)
        .expect("slot 3 holds a data chunk of stripe 0");
    let at = index * CHUNK_BYTES as usize;
    let mut block = vec![0u8; 4096];
    array
        .read(at as u64, &mut block)
        .expect("read around the error");
    assert!(block == model[at..at + 4096], "the block solved");
    assert_eq!(io.rule_counts(transient).expect("the rule").failed, 2);
    assert_eq!(array.detail().members[3].state, SlotState::Active);
    // Slot 2 dies: its reads fail from now on; the array leaves it out (in memory) and solves its chunks.
    io.add(
        Scope::slot(2).ops(OpKinds::READ),
        Fault::FailFrom {
            nth: 1,
            count: Count::Global,
        },
    );
    array.set_error_threshold(1);
    assert_reads(&array, &model, "RAID6 read-only, slot 2 failing");
    assert_eq!(array.detail().members[2].state, SlotState::Faulty);
    assert_refuses_changes(&array, PathBuf::from("/nonexistent"));
    assert_eq!(array.stop().expect("stop"), ArrayState::Clean);
    let counts = io.rule_counts(writes).expect("the rule");
    assert_eq!(
        counts.matched, 0,
        "writes or discards reached the members of a read-only array"
    );
}

/// Read-only after an unclean stop and without the log (consistency policy "bitmap"), a RAID5/6 read that would
/// solve a chunk of a stripe in a dirty region (its parity may disagree with its data: nothing recovered it)
/// fails instead of returning what parity says.
#[test]
fn a_dirty_stripe_is_not_solved_from_parity_read_only() {
    let member_bytes = paraid_engine::superblock::DEFAULT_DATA_OFFSET_BYTES + 64 * CHUNK_BYTES;
    let mem = MemMembers::new(4, member_bytes);
    create_io(&mem, Level::Raid5, CHUNK_BYTES, "ro").expect("create_io");
    let io = Arc::new(FaultyMembers::new(mem, 8));
    let no_log = || AssembleOptions {
        write_hole_log: false,
        ..AssembleOptions::new(reference())
    };
    let array = assemble_io(io.clone(), no_log()).expect("assemble_io");
    let model = fill(&array, 15, 0);
    // One more write of the first stripe's data chunk on slot 0 (its region dirty), then no clean stop.
    let chunk: Vec<u8> = model[..CHUNK_BYTES as usize].iter().map(|b| !b).collect();
    array.write(0, &chunk, false).expect("write");
    array.flush().expect("flush");
    drop(array);

    let array = assemble_io(
        io.clone(),
        AssembleOptions {
            read_only: true,
            ..no_log()
        },
    )
    .expect("assemble_io read-only");
    let mut back = vec![0u8; CHUNK_BYTES as usize];
    array.read(0, &mut back).expect("read");
    assert!(back == chunk, "the data chunk as written");
    io.add(
        Scope::slot(0).ops(OpKinds::READ),
        Fault::FailFrom {
            nth: 1,
            count: Count::Global,
        },
    );
    match array.read(0, &mut back) {
        Err(EngineError::ChangeReadOnly { .. }) => {}
        other => panic!("a dirty stripe's chunk solved from parity read-only: {other:?}"),
    }
    array.stop().expect("stop");
}
