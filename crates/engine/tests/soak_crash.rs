//! Sixteen threads of mixed I/O through power losses. Each thread owns a stretch of the array and keeps a model of
//! what every 4 KiB block of it may hold after a crash (`integrity_common::Model`): its durable value (flushed by
//! the thread, or written FUA) and every value written since. The power goes after a random number of member
//! writes while all sixteen run, sometimes while a blank member is being rebuilt; every unflushed member write is
//! then kept, dropped or torn page by page; and when the array was whole, up to as many members as its level
//! tolerates are missing at restart (the write hole: the partial parity log must keep every durable block of
//! their stripes), or, after a crash during a rebuild, sometimes the member being rebuilt. After each restart
//! every stretch must read back within its model; missing members come back as blank ones, rebuilt under the next
//! stretch of load. At the end a check finds every stripe right (every pair of copies, RAID10). RAID6, RAID5 and
//! RAID10.
//!
//! What the simulator's power losses (batches of up to 24 writes, arrays of a few rows) do not reach: sixteen
//! writers at once, a log ring filled and retired under them, rebuilds they run over. `PARAID_SOAK_CRASHES=N` sets
//! the power losses per run (default 6), `PARAID_SOAK_SEED=N` the seed of its draws (default 0; the writers'
//! interleaving is not seeded, so a failure may need several runs to come back).

mod integrity_common;
mod soak_common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use integrity_common::*;
use paraid_engine::member::NewMember;
use paraid_engine::superblock::SlotState;
use soak_common::{
    draw_extent, env_u64, member_layout, Watchdog, CHUNK_BYTES, HANG, MEMBERS, STRETCH_STRIPES,
    THREADS,
};

#[test]
fn sixteen_threads_through_power_losses() {
    let _ = env_logger::builder().is_test(true).try_init();
    for (level, small_ring, rounds) in [
        (Level::Raid6, true, 4),
        (Level::Raid6, false, 1),
        (Level::Raid5, true, 1),
        (Level::Raid5, false, 4),
        (Level::Raid10, false, 1),
    ] {
        crash_soak(level, small_ring, rounds, crashes());
    }
}

/// Power losses per run: `PARAID_SOAK_CRASHES`, else 6.
fn crashes() -> u64 {
    env_u64("PARAID_SOAK_CRASHES").unwrap_or(6)
}

/// What the runs of one configuration did, for the figure.
#[derive(Default)]
struct Totals {
    ops: u64,
    durable_blocks: u64,
    missing_at_restart: u64,
    crashes_in_rebuild: u64,
    log_recovered_stripes: u64,
    /// RAID6 restarts with one member missing whose stripes were audited after the resync.
    degraded_audits: u64,
}

fn crash_soak(level: Level, small_ring: bool, rounds: usize, crashes: u64) {
    let seed = env_u64("PARAID_SOAK_SEED").unwrap_or(0);
    let what = if level.has_parity() {
        format!(
            "{level}, {} ring, {rounds} round(s) in flight, seed {seed}",
            if small_ring { "small" } else { "default" }
        )
    } else {
        format!("{level} (no log), seed {seed}")
    };
    let (data_offset, member_bytes) = member_layout(level, small_ring);
    let blank = |label: &str| NewMember::Image {
        label: label.to_string(),
        size_bytes: member_bytes,
    };
    let opts = || {
        let mut opts = options(true);
        opts.log_rounds_in_flight = Some(rounds);
        opts
    };
    let mut io = Arc::new(CrashMembers::new(MEMBERS, member_bytes));
    paraid_engine::create_io_with_data_offset(io.as_ref(), level, CHUNK_BYTES, "soak", data_offset)
        .expect("create");
    let mut array = Arc::new(assemble_io(io.clone(), opts()).expect("assemble"));
    assert_eq!(
        array.integrity().log_enabled,
        level.has_parity(),
        "{what}: the log is on where there is parity"
    );
    let g = array.geometry();
    let stretch_bytes = STRETCH_STRIPES * g.stripe_bytes();
    // Members that may be missing at restart, wherever they are (RAID10: one, whichever pair it is in).
    let tolerance = if level == Level::Raid6 { 2 } else { 1 };
    let mut rng = SplitMix64::new(
        (data_offset + rounds as u64 + 100 * tolerance)
            .wrapping_add(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15)),
    );
    let mut models: Vec<Model> = (0..THREADS).map(|_| Model::new(stretch_bytes)).collect();
    let dog = Watchdog::start(&what);
    let mut totals = Totals::default();

    for crash in 0..crashes {
        let stop = Arc::new(AtomicBool::new(false));
        let threads: Vec<_> = models
            .into_iter()
            .enumerate()
            .map(|(t, model)| {
                let (array, stop, ops) = (array.clone(), stop.clone(), dog.ops.clone());
                let seed = rng.next_u64();
                std::thread::spawn(move || {
                    let base = t as u64 * stretch_bytes;
                    run_thread(&array, base, seed, model, &stop, &ops)
                })
            })
            .collect();
        for _ in 0..rng.range(2, 8) {
            dog.watch("load");
        }
        // Sometimes a member fails and a blank one takes its slot: the power may go during its rebuild.
        // (No job running or queued: `progress()` alone is None also before a queued rebuild starts, and RAID5
        // would then lose a second member.)
        if rng.one_in(2) && array.wait_idle(std::time::Duration::ZERO) {
            let slot = rng.below(MEMBERS as u64) as usize;
            dog.enter("failing a member");
            array.fail_member(slot).expect("fail a member");
            array.remove_member(slot).expect("remove it");
            dog.enter("adding a blank member");
            array
                .add_member(blank(&format!("blank-{crash}")))
                .expect("add a blank member");
            for _ in 0..rng.range(0, 3) {
                dog.watch("load during a rebuild");
            }
        }
        let rebuilding: Vec<usize> = (0..MEMBERS)
            .filter(|&s| array.slot_state(s) != SlotState::Active)
            .collect();
        let whole = array.progress().is_none() && rebuilding.is_empty();
        totals.crashes_in_rebuild += u64::from(!whole);
        // The power goes after a few more member writes; every thread ends at its first failed I/O.
        dog.enter("the power loss");
        io.cut_power_after_writes(rng.below(64));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        while !threads.iter().all(|t| t.is_finished()) {
            if std::time::Instant::now() > deadline {
                io.cut_power();
            }
            dog.watch("the writers' ends after the power loss");
        }
        stop.store(true, Ordering::Relaxed);
        models = threads
            .into_iter()
            .map(|t| t.join().expect("a writer"))
            .collect();
        drop(array);

        // Restart: each unflushed member write kept, dropped or torn; when the array was whole, members missing; when
        // a member was being rebuilt, sometimes that one (the new drive pulled: the survivors hold everything).
        let mut images = io.crash(rng.next_u64(), CrashPolicy::Random).images;
        let mut gone: Vec<usize> = Vec::new();
        if !whole && rng.one_in(2) {
            gone = rebuilding;
        } else if whole {
            for _ in 0..rng.below(tolerance + 1) {
                let slot = rng.below(MEMBERS as u64) as usize;
                if !gone.contains(&slot) {
                    gone.push(slot);
                }
            }
        }
        for &slot in &gone {
            images[slot] = None;
        }
        totals.missing_at_restart += gone.len() as u64;
        dog.enter("re-assembly");
        io = Arc::new(CrashMembers::from_images(images));
        array = Arc::new(assemble_io(io.clone(), opts()).unwrap_or_else(|e| {
            panic!("{what}, power loss {crash} (missing {gone:?}): re-assembly: {e}")
        }));
        totals.log_recovered_stripes += array.integrity().log_recovered_stripes;
        dog.enter("the resync");
        assert!(array.wait_idle(HANG), "{what}: the resync ended");
        let block0 = |t: usize| (t as u64 * stretch_bytes) as usize / BLOCK;
        // The stretches side by side are the whole array: what it reads now, for the audit below.
        let mut read_back = vec![0u8; array.size_bytes() as usize];
        models = models
            .into_iter()
            .enumerate()
            .map(|(t, model)| {
                let mut got = vec![0u8; stretch_bytes as usize];
                array
                    .read(t as u64 * stretch_bytes, &mut got)
                    .unwrap_or_else(|e| {
                        panic!("{what}, power loss {crash}: thread {t}'s stretch: {e}")
                    });
                let (durable, violations) = model.check_after_crash(&got, |b| {
                    gone.contains(&member_of_block(&g, block0(t) + b))
                });
                assert!(
                    violations.is_empty(),
                    "{what}, power loss {crash} (missing {gone:?}), thread {t}: {violations:?}"
                );
                totals.durable_blocks += durable;
                read_back[(t as u64 * stretch_bytes) as usize..][..got.len()].copy_from_slice(&got);
                dog.enter("the read-back");
                // What it read is what it holds now, for good.
                let mut next = Model::new(stretch_bytes);
                next.write(0, &got, Some(true));
                next
            })
            .collect();
        // RAID6 with one member missing keeps redundancy: after the resync P and Q must agree with what the array
        // reads in every stripe, or a second failure would solve a stripe from the parity that disagrees.
        if level == Level::Raid6 && gone.len() == 1 {
            // The members left out at restart were never attached: their images are None.
            let images: Vec<Option<Vec<u8>>> = (0..MEMBERS).map(|s| io.image(s)).collect();
            let problems = degraded_parity_problems(&g, data_offset, &images, &read_back);
            assert!(
                problems.is_empty(),
                "{what}, power loss {crash} (missing {gone:?}): parity disagrees after the resync: {problems:?}"
            );
            totals.degraded_audits += 1;
        }
        // The missing members come back blank, rebuilt under the next load.
        for &slot in &gone {
            dog.enter("adding a blank member for a missing one");
            let added = array
                .add_member(blank(&format!("back-{crash}-{slot}")))
                .expect("add a blank member");
            assert!(
                added.rebuilding_slot().is_some(),
                "{what}: it takes a missing slot"
            );
        }
    }
    totals.ops = dog.count();

    dog.enter("the last rebuild");
    assert!(array.wait_idle(HANG), "{what}: the last rebuild ended");
    dog.enter("the final check");
    array.start_check(false).expect("start the final check");
    assert!(array.wait_idle(HANG), "{what}: the final check ended");
    let check = array.last_result().expect("the check's result");
    assert_eq!(
        (check.mismatches, check.outcome.as_deref()),
        (0, Some("completed")),
        "{what}: {check:?}"
    );
    for (t, model) in models.iter().enumerate() {
        let mut got = vec![0u8; stretch_bytes as usize];
        array
            .read(t as u64 * stretch_bytes, &mut got)
            .expect("read a stretch");
        let (_, violations) = model.check_after_crash(&got, |_| false);
        assert!(
            violations.is_empty(),
            "{what}: at the end, thread {t}: {violations:?}"
        );
    }
    Arc::into_inner(array)
        .expect("the writers are gone")
        .stop()
        .expect("a clean stop");
    figure(
        "soak_crash",
        &format!(
            "{what}: {crashes} power losses under {THREADS} threads ({} I/Os and steps), {} in a rebuild, {} members \
             missing at restart, {} stripes recovered from the log, {} durable blocks checked: all intact{}",
            totals.ops,
            totals.crashes_in_rebuild,
            totals.missing_at_restart,
            totals.log_recovered_stripes,
            totals.durable_blocks,
            if level == Level::Raid6 {
                format!(
                    "; {} restarts with one member missing audited: P and Q agree",
                    totals.degraded_audits
                )
            } else {
                String::new()
            }
        ),
    );
}

/// One thread's load on its stretch (at `base`) until `stop` or its first failed I/O (the power went): writes (a
/// few FUA) of whole pages or any bytes, reads checked against what it wrote, flushes, write-zeroes. Returns its
/// model of what a crash may leave.
fn run_thread(
    array: &Array,
    base: u64,
    seed: u64,
    mut model: Model,
    stop: &AtomicBool,
    ops: &AtomicU64,
) -> Model {
    let stretch_bytes = model.blocks() as u64 * BLOCK as u64;
    // What the stretch holds as the array serves it (the newest value of every block).
    let mut current = vec![0u8; stretch_bytes as usize];
    for b in 0..model.blocks() {
        current[b * BLOCK..(b + 1) * BLOCK].copy_from_slice(model.latest(b));
    }
    let mut rng = SplitMix64::new(seed);
    while !stop.load(Ordering::Relaxed) {
        let (at, len) = draw_extent(&mut rng, stretch_bytes);
        let span = at as usize..(at + len) as usize;
        let ok = match rng.below(100) {
            op @ 0..=59 => {
                let mut buf = vec![0u8; len as usize];
                rng.fill(&mut buf);
                let fua = op < 5;
                let ok = array.write(base + at, &buf, fua).is_ok();
                model.write(at, &buf, ok.then_some(fua));
                current[span].copy_from_slice(&buf);
                ok
            }
            60..=84 => {
                let mut got = vec![0u8; len as usize];
                let ok = array.read(base + at, &mut got).is_ok();
                assert!(
                    !ok || got == current[span],
                    "read {}+{len} differs from what was written",
                    base + at
                );
                ok
            }
            85..=92 => {
                let ok = array.flush().is_ok();
                if ok {
                    model.flushed();
                }
                ok
            }
            _ => {
                let ok = array.write_zeroes(base + at, len, false).is_ok();
                model.write(at, &vec![0u8; len as usize], ok.then_some(false));
                current[span].fill(0);
                ok
            }
        };
        if !ok {
            break;
        }
        ops.fetch_add(1, Ordering::Relaxed);
    }
    model
}
