//! Sixteen threads of mixed I/O through a day in an array's life, all while they run: a member's device dies
//! (every I/O fails), is evicted on its errors and a hot spare takes its slot; a second device dies, and a blank
//! member is rebuilt in its place; a live replacement copies a third slot, and an online repair goes over every
//! stripe. Each thread owns a stretch of the array and keeps a model of it: every read must match, and at the end
//! the whole stretch reads back as written and a final check finds every stripe's parity right. A watchdog
//! (`soak_common`) ends the process with the phase it hung in when nothing completes for `HANG` (the log's two
//! hangs of stop 22 were found by such a load). Power losses under such a load: `soak_crash.rs`.
//!
//! Run on RAID6 and RAID5, with a log ring of just over two requests and with the default ring, one log round in
//! flight and four, on members in memory and on member files (io_uring). `PARAID_SOAK_SECS=N` keeps each run under
//! load N seconds after its member events (default 3).

mod common;
mod integrity_common;
mod soak_common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use integrity_common::*;
use paraid_engine::fault::FaultyMembers;
use paraid_engine::member::{MemberFile, NewMember, UringMembers};
use paraid_engine::superblock::SlotState;
use soak_common::{
    draw_extent, env_u64, member_layout, Watchdog, CHUNK_BYTES, HANG, MEMBERS, STRETCH_STRIPES,
    THREADS,
};

#[test]
fn sixteen_threads_through_spare_takeover_death_rebuild_replacement_and_repair() {
    let _ = env_logger::builder().is_test(true).try_init();
    for (level, small_ring, rounds) in [
        (Level::Raid6, true, 1),
        (Level::Raid6, true, 4),
        (Level::Raid6, false, 1),
        (Level::Raid6, false, 4),
        (Level::Raid5, true, 4),
        (Level::Raid5, false, 1),
    ] {
        soak(level, small_ring, rounds, steady_load(), None);
    }
}

/// The same on member files (io_uring, the temporary directory): the members' real submission and completion
/// path, RAID6 with the small ring and four rounds in flight, RAID5 with the default ring and one.
#[test]
fn sixteen_threads_on_member_files() {
    let _ = env_logger::builder().is_test(true).try_init();
    for (level, small_ring, rounds) in [(Level::Raid6, true, 4), (Level::Raid5, false, 1)] {
        let dir = common::TempDir::new("soak");
        soak(level, small_ring, rounds, steady_load(), Some(&dir.0));
    }
}

/// How long each run goes on under plain load after its member events: `PARAID_SOAK_SECS`, else 3 s (CI).
fn steady_load() -> Duration {
    Duration::from_secs(env_u64("PARAID_SOAK_SECS").unwrap_or(3))
}

/// One run: the threads, the member events one after the other, then `steady` more of plain load. Members in
/// memory, or files in `files`.
fn soak(
    level: Level,
    small_ring: bool,
    rounds: usize,
    steady: Duration,
    files: Option<&std::path::Path>,
) {
    let what = format!(
        "{level}, {} ring, {rounds} round(s) in flight, members {}",
        if small_ring { "small" } else { "default" },
        if files.is_some() {
            "files"
        } else {
            "in memory"
        }
    );
    let (data_offset, member_bytes) = member_layout(level, small_ring);
    // A blank member to add: an image, or a new file of the members' size.
    let new_member = |label: &str| match files {
        None => NewMember::Image {
            label: label.into(),
            size_bytes: member_bytes,
        },
        Some(dir) => {
            let path = dir.join(format!("{label}.img"));
            let file = std::fs::File::create(&path).expect("create a member file");
            file.set_len(member_bytes).expect("size a member file");
            NewMember::Path(path)
        }
    };
    match files {
        None => soak_on(
            FaultyMembers::new(MemMembers::new(MEMBERS, member_bytes), 7),
            &what,
            (level, data_offset, rounds, steady),
            &new_member,
        ),
        Some(_) => {
            let members = (0..MEMBERS)
                .map(|i| match new_member(&format!("m{i}")) {
                    NewMember::Path(path) => {
                        Some(MemberFile::open(&path).expect("open a member file"))
                    }
                    NewMember::Image { .. } | NewMember::Existing { .. } => unreachable!("files"),
                })
                .collect();
            soak_on(
                FaultyMembers::new(UringMembers::new(members), 7),
                &what,
                (level, data_offset, rounds, steady),
                &new_member,
            )
        }
    }
}

/// The run of `soak` on `io`: (level, data offset, rounds in flight, steady load).
fn soak_on<M: MemberIo + 'static>(
    io: FaultyMembers<M>,
    what: &str,
    (level, data_offset, rounds, steady): (Level, u64, usize, Duration),
    new_member: &dyn Fn(&str) -> NewMember,
) {
    let io = Arc::new(io);
    paraid_engine::create_io_with_data_offset(io.as_ref(), level, CHUNK_BYTES, "soak", data_offset)
        .expect("create");
    let mut opts = options(true);
    opts.log_rounds_in_flight = Some(rounds);
    let array = Arc::new(assemble_io(io.clone(), opts).expect("assemble"));
    assert!(array.integrity().log_enabled, "{what}: the log is on");
    let stop = Arc::new(AtomicBool::new(false));
    let dog = Watchdog::start(what);
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let (array, stop, ops) = (array.clone(), stop.clone(), dog.ops.clone());
            let seed = t + 1000 * rounds as u64 + data_offset;
            std::thread::spawn(move || run_thread(&array, t, seed, &stop, &ops))
        })
        .collect();
    let enter = |during: &str| dog.enter(during);
    let watch = |during: &str| dog.watch(during);
    // Until no job runs or waits to run: `progress()` is None also between two queued jobs and before the first
    // starts, and a wait on it alone could end before the repair below ran (CI, stop 30: the replacement's rebuild
    // was the last result).
    let wait_job = |during: &str| {
        while !array.wait_idle(Duration::ZERO) {
            watch(during);
        }
    };
    watch("warm-up");
    // A hot spare, then slot 1's device dies (every I/O fails): evicted on its errors, its slot taken over by the
    // spare, which is rebuilt. The fault is the device's: the spare in its slot works.
    enter("adding a spare");
    let spare = array.add_member(new_member("spare")).expect("add a spare");
    assert_eq!(spare.rebuilding_slot(), None, "{what}: it waits as a spare");
    io.fail_device(1);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !array.spares().is_empty() {
        watch("slot 1's death");
        assert!(
            Instant::now() < deadline,
            "{what}: slot 1 was never evicted, or the spare never took it"
        );
    }
    wait_job("the spare's rebuild");
    // Slot 2's device dies too. Evicted, taken out, and a blank member is added in its slot and rebuilt.
    io.fail_device(2);
    let deadline = Instant::now() + Duration::from_secs(30);
    while array.slot_state(2) != SlotState::Faulty {
        watch("slot 2's death");
        assert!(
            Instant::now() < deadline,
            "{what}: slot 2 was never evicted"
        );
    }
    enter("removing slot 2");
    array.remove_member(2).expect("remove slot 2");
    enter("adding a blank member");
    array
        .add_member(new_member("new2"))
        .expect("add a blank member");
    wait_job("the rebuild of slot 2");
    // A live replacement of slot 3, then an online repair: it finds nothing on a consistent array.
    enter("replacing slot 3");
    array
        .replace_member(3, new_member("new3"))
        .expect("replace slot 3");
    wait_job("the replacement of slot 3");
    enter("starting a repair");
    array.start_check(true).expect("start a repair");
    wait_job("the repair");
    let repair = array.last_result().expect("the repair's result");
    assert_eq!(
        (repair.kind, repair.mismatches, repair.outcome.as_deref()),
        ("repair", 0, Some("completed")),
        "{what}: {repair:?}"
    );
    assert!(
        (0..MEMBERS).all(|s| array.slot_state(s) == SlotState::Active),
        "{what}: every slot active again"
    );
    let steady_until = Instant::now() + steady;
    while Instant::now() < steady_until {
        watch("steady load");
    }
    enter("the writers' last reads");
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().expect("thread");
    }
    enter("the final flush");
    array.flush().expect("flush");
    enter("the final check");
    array.start_check(false).expect("start the final check");
    assert!(array.wait_idle(HANG), "{what}: the final check ended");
    let ops = dog.count();
    drop(dog);
    let findings = array.check_findings();
    assert!(findings.is_empty(), "{what}: {findings:?}");
    let report = array.integrity();
    figure(
        "soak",
        &format!(
            "{what}: {} I/Os and steps from {THREADS} threads through a spare takeover, a member's death, a rebuild, a \
             live replacement and an online repair; log {} rounds, ring full {} times; final check clean",
            ops,
            report.log_rounds,
            report.log_retire_flushes
        ),
    );
}

/// One thread's load on its own stretch until `stop`: writes (a few FUA) of whole pages or any bytes, reads
/// checked against the model, flushes, write-zeroes; then the whole stretch read back.
fn run_thread(array: &Array, t: u64, seed: u64, stop: &AtomicBool, ops: &AtomicU64) {
    let stripe_bytes = array.geometry().stripe_bytes();
    let base = t * STRETCH_STRIPES * stripe_bytes;
    let stretch_bytes = STRETCH_STRIPES * stripe_bytes;
    let mut model = vec![0u8; stretch_bytes as usize];
    let mut rng = SplitMix64::new(seed);
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let (at, len) = draw_extent(&mut rng, stretch_bytes);
        let span = at as usize..(at + len) as usize;
        match rng.below(100) {
            op @ 0..=59 => {
                let mut buf = vec![0u8; len as usize];
                rng.fill(&mut buf);
                array.write(base + at, &buf, op < 5).expect("write");
                model[span].copy_from_slice(&buf);
            }
            60..=84 => {
                let mut got = vec![0u8; len as usize];
                array.read(base + at, &mut got).expect("read");
                assert!(
                    got == model[span],
                    "thread {t}, I/O {n}: read {at}+{len} differs"
                );
            }
            85..=92 => array.flush().expect("flush"),
            _ => {
                array
                    .write_zeroes(base + at, len, false)
                    .expect("write zeroes");
                model[span].fill(0);
            }
        }
        ops.fetch_add(1, Ordering::Relaxed);
    }
    let mut got = vec![0u8; stretch_bytes as usize];
    array.read(base, &mut got).expect("read the stretch");
    assert!(
        got == model,
        "thread {t}: its stretch reads back as written"
    );
}
