//! Write-back (engine `array/write_back.rs`): small writes answered once held in memory. What it must keep: a
//! read never older than an answered write, writes to the same bytes in the order answered, every write answered
//! before a FLUSH durable when the flush returns (through a power loss, with a member missing at restart too), a
//! held write that fails reported by every flush after it, and memory bounded.

mod common_sim;

use common_sim::*;
use paraid_engine::{WriteBack, WriteBackConfig};
use std::sync::Arc;

/// Small limits so that tests reach them.
const CONFIG: WriteBackConfig = WriteBackConfig {
    threads: 8,
    limit_bytes: 1 << 20,
    max_write_bytes: 64 << 10,
    answer: paraid_engine::Answer::WhenHeld,
};

/// The end of a test with slow members: the slow rule taken away, write-back closed (no held write may have
/// failed), and the whole array read back against the model.
fn close_and_verify(
    io: &Stack,
    slow: paraid_engine::fault::RuleId,
    wb: WriteBack,
    array: &Array,
    model: &mut BlockModel,
    what: &str,
) {
    assert!(io.remove(slow), "{what}: the slow rule was there");
    wb.close()
        .unwrap_or_else(|e| panic!("{what}: a held write failed: {e}"));
    verify_all(array, model, what);
}

/// A write of 1-4 random pages anywhere (`small_extent`), not FUA, through `wb`; recorded in `model` as answered.
fn held_write(wb: &WriteBack, model: &mut BlockModel, rng: &mut SplitMix64, array_bytes: u64) {
    let (offset, len) = small_extent(rng, array_bytes);
    let data = random_bytes(rng, len);
    wb.write(offset, &data, false).expect("write");
    model.write(offset, &data, WriteOutcome::Acked { durable: false });
}

#[test]
fn writes_are_answered_while_held_and_read_back_as_answered() {
    let (io, array) = new_array(Level::Raid6, 6, 4096, 32, 1, reference());
    let wb = WriteBack::new(&array, CONFIG);
    assert_eq!(wb.threads(), 1, "the pool starts with one thread");
    let mut rng = SplitMix64::new(7);
    let mut model = BlockModel::new(array.size_bytes());
    let slow = slow_writes(&io, 20);
    let mut most_held = 0;
    for _ in 0..24 {
        held_write(&wb, &mut model, &mut rng, array.size_bytes());
        most_held = most_held.max(wb.held());
    }
    // A writer that waits for each answer (queue depth 1) still has several writes in the engine at once, each
    // on a thread of its own: the pool grew for them.
    assert!(most_held >= 4, "at most {most_held} writes held at once");
    assert!(
        (most_held..=CONFIG.threads).contains(&wb.threads()),
        "{} threads for at most {most_held} writes held at once",
        wb.threads()
    );
    // Read back at once, each range while writes may still be held: never older than what was answered.
    let mut rng = SplitMix64::new(7);
    for _ in 0..24 {
        let (offset, len) = small_extent(&mut rng, array.size_bytes());
        let _ = random_bytes(&mut rng, len);
        let mut got = vec![0u8; len];
        wb.read(offset, &mut got).expect("read");
        model
            .check_read(offset, &got)
            .unwrap_or_else(|m| panic!("read {offset}+{len}: {m}"));
    }
    let stats = wb.stats();
    assert_eq!(stats.held_writes + stats.passed_through, 24);
    assert!(stats.held_writes >= 8, "{stats:?}");
    assert!(stats.overlap_waits > 0, "no read waited for a held write");
    close_and_verify(&io, slow, wb, &array, &mut model, "after close");
}

#[test]
fn writes_to_the_same_bytes_land_in_the_order_answered() {
    let (io, array) = new_array(Level::Raid5, 5, 4096, 16, 2, reference());
    let wb = WriteBack::new(&array, CONFIG);
    slow_writes(&io, 5);
    let mut rng = SplitMix64::new(3);
    let mut last = Vec::new();
    // Overlapping writes of one to three pages around page 5, each answered before the one before it is
    // written in place.
    for n in 0..12u64 {
        let offset = (4 + n % 2) * 4096;
        let data = random_bytes(&mut rng, 4096 * (1 + (n % 3) as usize));
        wb.write(offset, &data, false).expect("write");
        last = vec![(offset, data)];
    }
    let (offset, data) = &last[0];
    let mut got = vec![0u8; data.len()];
    wb.read(*offset, &mut got).expect("read");
    assert!(got == *data, "the last write answered is what reads back");
    assert!(wb.stats().overlap_waits >= 8, "{:?}", wb.stats());
    wb.close().expect("close");
    drop(array);
    // Every write was written in place in order: the members hold the last one.
    let (_io, array) = assemble_images(io.inner().images(), 0, reference()).expect("assemble");
    let mut got = vec![0u8; data.len()];
    array.read(*offset, &mut got).expect("read");
    assert!(got == *data, "the members hold the last write answered");
}

/// Writes answered, then a flush while they are still held, then a power loss that drops every unflushed member
/// write: all of them read back (the flush waited for them), also with one or two members missing at restart.
#[test]
fn a_flush_makes_every_write_answered_before_it_durable() {
    for (level, members, missing) in [
        (Level::Raid5, 5, vec![]),
        (Level::Raid5, 5, vec![2]),
        (Level::Raid6, 6, vec![0, 4]),
        (Level::Raid1, 2, vec![1]),
    ] {
        let (io, array) = new_array(level, members, 8192, 24, 4, reference());
        let wb = WriteBack::new(&array, CONFIG);
        let mut model = BlockModel::new(array.size_bytes());
        let mut rng = SplitMix64::new(11);
        let slow = slow_writes(&io, 10);
        for _ in 0..20 {
            held_write(&wb, &mut model, &mut rng, array.size_bytes());
        }
        assert!(
            wb.held() > 0,
            "{level}: writes still held when the flush starts"
        );
        wb.flush().expect("flush");
        model.flushed();
        assert!(io.remove(slow));
        // More writes answered after the flush may be lost; they are not flushed.
        for _ in 0..6 {
            held_write(&wb, &mut model, &mut rng, array.size_bytes());
        }
        io.inner().cut_power();
        let _ = wb.close();
        drop(array);
        let mut images = io.inner().crash(5, CrashPolicy::DropAll).images;
        for slot in &missing {
            images[*slot] = None;
        }
        let (_io, array) = assemble_images(images, 0, reference())
            .unwrap_or_else(|e| panic!("{level} missing {missing:?}: {e}"));
        let mut all = vec![0u8; array.size_bytes() as usize];
        array.read(0, &mut all).expect("read");
        model
            .check_after_crash(&all)
            .unwrap_or_else(|m| panic!("{level} missing {missing:?}: {m}"));
    }
}

/// Power losses (unflushed member writes kept, dropped or torn) with writes held, flushes among them: what was
/// flushed or written FUA survives, nothing older comes back, and stripes the held writes were cut in are
/// consistent (a member missing at restart reads back right).
#[test]
fn power_losses_with_writes_held_keep_what_was_flushed() {
    let (mut crashes, mut forgiven_total) = (0, 0);
    let config = if std::env::var("WB_OFF").is_ok() {
        WriteBackConfig::OFF
    } else {
        CONFIG
    };
    let seeds: Vec<u64> = match std::env::var("WB_SEED") {
        Ok(s) => vec![s.parse().unwrap()],
        Err(_) => (0..12).collect(),
    };
    for seed in seeds {
        let (level, members) = if seed % 2 == 0 {
            (Level::Raid6, 6)
        } else {
            (Level::Raid5, 5)
        };
        let (io, array) = new_array(level, members, 4096, 24, seed, reference());
        let wb = WriteBack::new(&array, config);
        let mut model = BlockModel::new(array.size_bytes());
        let mut rng = SplitMix64::new(100 + seed);
        slow_writes(&io, 1);
        let cut_after = 20 + rng.below(200);
        for step in 0..60u64 {
            if step == 30 {
                // The power goes after a number of member writes from here on, while writes are held.
                io.inner().cut_power_after_writes(cut_after);
            }
            match rng.below(8) {
                0 => {
                    if wb.flush().is_ok() {
                        model.flushed();
                    }
                }
                1 => {
                    let (offset, len) = small_extent(&mut rng, array.size_bytes());
                    let data = random_bytes(&mut rng, len);
                    let outcome = match wb.write(offset, &data, true) {
                        Ok(()) => WriteOutcome::Acked { durable: true },
                        Err(_) => WriteOutcome::Failed,
                    };
                    model.write(offset, &data, outcome);
                }
                _ => {
                    let (offset, len) = extent(&mut rng, array.size_bytes(), 4 * 4096 * 4);
                    let data = random_bytes(&mut rng, len);
                    let outcome = match wb.write(offset, &data, false) {
                        Ok(()) => WriteOutcome::Acked { durable: false },
                        Err(_) => WriteOutcome::Failed,
                    };
                    model.write(offset, &data, outcome);
                }
            }
        }
        io.inner().cut_power();
        let _ = wb.close();
        drop(array);
        let images = io.inner().crash(seed, CrashPolicy::Random).images;
        let missing = (seed as usize) % members;
        let what = format!("seed {seed} {level}, member {missing} missing at restart");
        // As without write-back: blocks at the partial parity log's documented limit are forgiven.
        forgiven_total += check_with_a_member_missing(images, missing, &mut model, &what);
        crashes += 1;
    }
    assert_eq!(crashes, 12);
    eprintln!(
        "{crashes} power losses with writes held, {forgiven_total} blocks at the write-hole limit"
    );
}

/// A held write that fails in the background (the array went beyond its tolerance under it) is reported by the
/// next flush and every one after it, and by every other request (a read must not return what the lost write
/// replaced); `close` reports it too.
#[test]
fn a_held_write_that_fails_is_reported_by_every_flush_after_it() {
    let (io, array) = new_array(Level::Raid5, 4, 4096, 16, 5, reference());
    let wb = WriteBack::new(&array, CONFIG);
    wb.write(0, &[7u8; 4096], false).expect("write");
    wb.flush().expect("flush");
    for slot in [1, 2] {
        io.add(
            Scope::slot(slot),
            Fault::FailFrom {
                nth: 1,
                count: Count::PerSlot,
            },
        );
    }
    // Answered: the array still serves when it is taken.
    wb.write(4096, &[9u8; 8192], false).expect("write answered");
    for _ in 0..2 {
        match wb.flush() {
            Err(EngineError::WriteBehind { why }) => assert!(why.contains("4096"), "{why}"),
            other => panic!("flush after a lost write: {other:?}"),
        }
    }
    assert!(wb.write(65536, &[1u8; 4096], false).is_err());
    let mut page = [0u8; 4096];
    assert!(matches!(
        wb.read(4096, &mut page),
        Err(EngineError::WriteBehind { .. })
    ));
    assert!(matches!(
        wb.read(0, &mut page),
        Err(EngineError::WriteBehind { .. })
    ));
    assert!(wb.discard(0, 4096).is_err() && wb.write_zeroes(0, 4096, false).is_err());
    assert_eq!(wb.stats().failed_writes, 1);
    assert!(matches!(wb.close(), Err(EngineError::WriteBehind { .. })));
}

#[test]
fn fua_and_large_writes_are_not_held() {
    let (_io, array) = new_array(Level::Raid6, 6, 4096, 32, 6, reference());
    let wb = WriteBack::new(&array, CONFIG);
    let mut model = BlockModel::new(array.size_bytes());
    let mut rng = SplitMix64::new(9);
    let fua = random_bytes(&mut rng, 8192);
    wb.write(8192, &fua, true).expect("fua write");
    model.write(8192, &fua, WriteOutcome::Acked { durable: true });
    let large = random_bytes(&mut rng, CONFIG.max_write_bytes + 4096);
    wb.write(65536, &large, false).expect("large write");
    model.write(65536, &large, WriteOutcome::Acked { durable: false });
    assert_eq!(wb.stats().held_writes, 0);
    let small = random_bytes(&mut rng, 4096);
    wb.write(0, &small, false).expect("small write");
    model.write(0, &small, WriteOutcome::Acked { durable: false });
    assert_eq!(wb.stats().held_writes, 1);
    let off = WriteBack::new(&array, WriteBackConfig::OFF);
    off.write(4096, &small, false)
        .expect("write, write-back off");
    model.write(4096, &small, WriteOutcome::Acked { durable: false });
    assert_eq!(off.stats().held_writes, 0);
    off.close().expect("close");
    wb.close().expect("close");
    verify_all(&array, &mut model, "after close");
}

/// At most one held write per thread, and no more bytes than the limit: a write beyond either is written on the
/// writer's own thread (no waiting for room, no backlog for a flush to wait for).
#[test]
fn writes_beyond_the_threads_or_the_limit_take_the_ordinary_path() {
    let (io, array) = new_array(Level::Raid5, 5, 4096, 32, 7, reference());
    for config in [
        WriteBackConfig {
            threads: 3,
            ..CONFIG
        },
        WriteBackConfig {
            limit_bytes: 16384,
            ..CONFIG
        },
    ] {
        let wb = WriteBack::new(&array, config);
        let slow = slow_writes(&io, 5);
        let mut model = BlockModel::new(array.size_bytes());
        let mut rng = SplitMix64::new(13);
        for _ in 0..20 {
            held_write(&wb, &mut model, &mut rng, array.size_bytes());
            assert!(
                wb.held() <= 3.min(config.threads),
                "{config:?}: {} writes held",
                wb.held()
            );
        }
        let stats = wb.stats();
        assert!(
            stats.passed_through > 0 && stats.held_writes > 0,
            "{stats:?}"
        );
        assert_eq!(stats.passed_through + stats.held_writes, 20);
        close_and_verify(&io, slow, wb, &array, &mut model, &format!("{config:?}"));
    }
}

/// The pool starts with one thread and grows only while held writes wait for one: writes it does not hold (FUA,
/// large) and writes that find an idle thread start none, and it never passes the configured number.
#[test]
fn the_pool_grows_only_while_held_writes_wait_for_a_thread() {
    let (io, array) = new_array(Level::Raid6, 6, 4096, 32, 3, reference());
    let config = WriteBackConfig {
        threads: 4,
        ..CONFIG
    };
    let wb = WriteBack::new(&array, config);
    let mut model = BlockModel::new(array.size_bytes());
    let mut rng = SplitMix64::new(21);
    // Not held: FUA, and longer than `max_write_bytes`.
    let big = random_bytes(&mut rng, 2 * config.max_write_bytes);
    wb.write(0, &big, false).expect("large write");
    model.write(0, &big, WriteOutcome::Acked { durable: true });
    let page = random_bytes(&mut rng, 4096);
    let fua_at = 2 * config.max_write_bytes as u64;
    wb.write(fua_at, &page, true).expect("FUA write");
    model.write(fua_at, &page, WriteOutcome::Acked { durable: true });
    assert_eq!(wb.threads(), 1, "writes not held started a thread");
    // Held one at a time, each written before the next: the one thread serves them all.
    for _ in 0..6 {
        held_write(&wb, &mut model, &mut rng, array.size_bytes());
        wb.settle();
    }
    assert_eq!(wb.stats().held_writes, 6);
    assert_eq!(
        wb.threads(),
        1,
        "writes that found the thread idle started another"
    );
    // Members slowed: writes pile up behind the thread, and the pool grows to its limit and no further.
    let slow = slow_writes(&io, 20);
    for _ in 0..20 {
        held_write(&wb, &mut model, &mut rng, array.size_bytes());
        assert!(wb.threads() <= config.threads, "{} threads", wb.threads());
    }
    assert_eq!(wb.threads(), config.threads);
    close_and_verify(&io, slow, wb, &array, &mut model, "after close");
}

/// Discards, write-zeroes and block status over held writes wait for them: zeros after, and no hole reported
/// where a held write put data.
#[test]
fn discard_zeroes_and_block_status_see_held_writes() {
    let (io, array) = new_array(Level::Raid6, 6, 4096, 32, 8, reference());
    let wb = WriteBack::new(&array, CONFIG);
    let slow = slow_writes(&io, 20);
    wb.write(0, &[5u8; 8192], false).expect("write");
    wb.write_zeroes(0, 4096, false).expect("write zeroes");
    wb.write(65536, &[6u8; 4096], false).expect("write");
    wb.discard(65536, 4096).expect("discard");
    wb.write(131072, &[8u8; 4096], false).expect("write");
    let extents = wb.allocation(131072, 4096).expect("block status");
    assert!(
        !extents[0].hole,
        "a held write's range reported as a hole: {extents:?}"
    );
    assert!(io.remove(slow));
    let mut got = vec![1u8; 8192];
    wb.read(0, &mut got).expect("read");
    assert!(got[..4096].iter().all(|&b| b == 0) && got[4096..].iter().all(|&b| b == 5));
    wb.read(65536, &mut got[..4096]).expect("read");
    assert!(
        got[..4096].iter().all(|&b| b == 0),
        "the discard came after the write"
    );
    wb.read(131072, &mut got[..4096]).expect("read");
    assert!(got[..4096].iter().all(|&b| b == 8));
    assert!(wb.stats().overlap_waits >= 3, "{:?}", wb.stats());
    wb.close().expect("close");
}

/// The writes held when the process is killed, in a store that outlives it (held.rs): a kill (every member write
/// that completed kept, none after) loses every held write without the store, and none with it, written by the
/// next start before anything reads the array. A store the array has moved past since (a clean stop in
/// between), or another array's, is not written.
#[test]
fn held_writes_survive_a_kill_in_their_store_and_only_into_their_array() {
    use paraid_engine::array::held::{self, HeldRegion, HeldStore};
    for (level, members, missing) in [
        (Level::Raid5, 5, vec![]),
        (Level::Raid6, 6, vec![1]),
        (Level::Raid1, 2, vec![]),
    ] {
        let what = format!("{level} missing {missing:?}");
        let (io, array) = new_array(level, members, 8192, 24, 4, reference());
        let region = Arc::new(HeldRegion::in_memory(HeldStore::region_bytes(
            CONFIG.threads,
            CONFIG.max_write_bytes,
        )));
        let store = HeldStore::format(
            region.clone(),
            &array,
            CONFIG.threads,
            CONFIG.max_write_bytes,
        );
        let wb = WriteBack::with_store(&array, CONFIG, Some(store));
        let mut model = BlockModel::new(array.size_bytes());
        let mut rng = SplitMix64::new(23);
        for _ in 0..6 {
            held_write(&wb, &mut model, &mut rng, array.size_bytes());
        }
        wb.flush().expect("flush");
        model.flushed();
        let slow = slow_writes(&io, 50);
        for _ in 0..8 {
            held_write(&wb, &mut model, &mut rng, array.size_bytes());
        }
        let held_at_kill = wb.held();
        assert!(held_at_kill > 0, "{what}: writes held at the kill");
        // The kill: no member write from here on.
        io.inner().cut_power();
        let _ = wb.close();
        assert!(io.remove(slow));
        drop(array);
        let mut images = io.inner().crash(0, CrashPolicy::KeepAll).images;
        for slot in &missing {
            images[*slot] = None;
        }
        let left = HeldStore::leftover(&region).expect("a store");
        assert_eq!(
            left.writes.len(),
            held_at_kill,
            "{what}: every held write in the store"
        );

        // Without the store the kill lost answered writes.
        let (_io, bare) = assemble_images(images.clone(), 0, reference()).expect("assemble");
        let mut all = vec![0u8; bare.size_bytes() as usize];
        bare.read(0, &mut all).expect("read");
        let mut strict = model.clone();
        assert!(
            (0..all.len() / 4096).any(|b| strict
                .check_read(b as u64 * 4096, &all[b * 4096..(b + 1) * 4096])
                .is_err()),
            "{what}: the kill lost nothing without the store (nothing was held?)"
        );
        drop(bare);

        // With it: written at the start, every answered write reads back.
        let (_io, array) = assemble_images(images.clone(), 0, reference()).expect("assemble");
        let replayed = held::replay(&array, &region).expect("replay");
        assert_eq!(
            (replayed.written, replayed.dropped),
            (held_at_kill, 0),
            "{what}"
        );
        verify_all(&array, &mut model, &what);
        array.stop().expect("stop");

        // The array stopped cleanly since: the store is behind it and is not written again.
        let (io_stopped, array) =
            assemble_images(images.clone(), 0, reference()).expect("assemble");
        array.stop().expect("stop");
        let (_io, array) =
            assemble_images(io_stopped.inner().images(), 0, reference()).expect("assemble");
        let replayed = held::replay(&array, &region).expect("replay");
        assert_eq!(replayed.written, 0, "{what}: {replayed:?}");
        assert!(replayed.why_dropped.is_some(), "{what}");

        // Another array's store is not written into this one.
        let (_io, other) = new_array(level, members, 8192, 24, 4, reference());
        let (_io, array) = assemble_images(images, 0, reference()).expect("assemble");
        let foreign = Arc::new(HeldRegion::in_memory(region.len()));
        let store = HeldStore::format(
            foreign.clone(),
            &other,
            CONFIG.threads,
            CONFIG.max_write_bytes,
        );
        store.put(0, 1, 0, &[5u8; 4096]);
        let replayed = held::replay(&array, &foreign).expect("replay");
        assert_eq!(replayed.written, 0, "{what}: {replayed:?}");
    }
}
