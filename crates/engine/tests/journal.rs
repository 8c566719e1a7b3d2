//! Journal mode (engine `array/ppl/`, `AssembleOptions::journal`; `WriteBack` with `Answer::FromLog`): the
//! partial parity log's entries also carry the new data of partial-stripe writes, a small write is answered once
//! its round is durable (before its in-place writes), and recovery rolls the data forward. What it must keep: every
//! write answered from the log reads back after a power loss that drops every member write not made durable, with
//! no flush and with members missing at restart; an older data entry never brings back what a newer write
//! replaced; writes the log cannot carry are answered only when done.

mod common;
mod common_sim;

use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::Duration;

use common::forward_member_io;
use common_sim::*;
use paraid_engine::fault::RateMembers;
use paraid_engine::member::MemberIo;
use paraid_engine::spare_cpu::Spare;
use paraid_engine::superblock::DEFAULT_DATA_OFFSET_BYTES;
use paraid_engine::{Answer, Answered, IoOp, IoReq, MemMembers, WriteBack, WriteBackConfig};

/// Small limits so that tests reach them.
const CONFIG: WriteBackConfig = WriteBackConfig {
    threads: 8,
    limit_bytes: 1 << 20,
    max_write_bytes: 128 << 10,
    answer: Answer::FromLog,
};

/// A fresh array on the stack with journal mode on.
fn journal_array(
    level: Level,
    members: usize,
    chunk_bytes: u64,
    rows: u64,
    seed: u64,
) -> (Arc<Stack>, Array) {
    journal_array_with(
        level,
        members,
        chunk_bytes,
        rows,
        seed,
        AssembleOptions::new(reference()),
    )
}

/// `journal_array` assembled with `opts` (journal mode set on).
fn journal_array_with(
    level: Level,
    members: usize,
    chunk_bytes: u64,
    rows: u64,
    seed: u64,
    opts: AssembleOptions,
) -> (Arc<Stack>, Array) {
    let io = Arc::new(FaultyMembers::new(
        CrashMembers::new(members, member_bytes(chunk_bytes, rows)),
        seed,
    ));
    create_io(io.as_ref(), level, chunk_bytes, "journal").expect("create_io");
    let opts = AssembleOptions {
        journal: true,
        ..opts
    };
    let array = assemble_io(io.clone(), opts).expect("assemble_io");
    (io, array)
}

/// Cuts the power (under `wb`, if the writes went through one: they may be held), lets it go, and returns the
/// members' images after a crash that treats each unflushed member write by `policy`.
fn power_loss(
    io: &Stack,
    wb: Option<WriteBack>,
    array: Array,
    seed: u64,
    policy: CrashPolicy,
) -> Vec<Option<Vec<u8>>> {
    io.inner().cut_power();
    if let Some(wb) = wb {
        let _ = wb.close();
    }
    drop(array);
    io.inner().crash(seed, policy).images
}

/// A power loss (under `wb`, if the writes went through one) that drops every member write not made durable, then
/// re-assembly with the slots in `missing` left out; the whole array is checked against `model` and returned.
fn drop_all_and_check(
    io: &Stack,
    wb: Option<WriteBack>,
    array: Array,
    seed: u64,
    missing: &[usize],
    model: &mut BlockModel,
    what: &str,
) -> Array {
    let images = power_loss(io, wb, array, seed, CrashPolicy::DropAll);
    assemble_and_check(images, missing, model, what)
}

/// Re-assembles `images` with the slots in `missing` left out; the whole array is checked against `model` and
/// returned.
fn assemble_and_check(
    mut images: Vec<Option<Vec<u8>>>,
    missing: &[usize],
    model: &mut BlockModel,
    what: &str,
) -> Array {
    for slot in missing {
        images[*slot] = None;
    }
    let (_io, array) =
        assemble_images(images, 0, reference()).unwrap_or_else(|e| panic!("{what}: {e}"));
    let mut all = vec![0u8; array.size_bytes() as usize];
    array.read(0, &mut all).expect("read");
    model
        .check_after_crash(&all)
        .unwrap_or_else(|m| panic!("{what}: {m}"));
    array
}

/// A fresh journal array (16 KiB chunks) whose stripe `stripe` holds random contents, durable (a FUA write).
struct DurableStripe {
    io: Arc<Stack>,
    array: Array,
    model: BlockModel,
    rng: SplitMix64,
    /// The stripe's first byte in the array.
    at: u64,
}

const STRIPE_TEST_CHUNK: u64 = 16384;

fn durable_stripe(level: Level, members: usize, seed: u64, stripe: u64) -> DurableStripe {
    let (io, array) = journal_array(level, members, STRIPE_TEST_CHUNK, 16, seed);
    let mut model = BlockModel::new(array.size_bytes());
    let mut rng = SplitMix64::new(seed + 1);
    let stripe_bytes = STRIPE_TEST_CHUNK * array.geometry().data_per_stripe() as u64;
    let at = stripe * stripe_bytes;
    let old = random_bytes(&mut rng, stripe_bytes as usize);
    array.write(at, &old, true).expect("write");
    model.write(at, &old, WriteOutcome::Acked { durable: true });
    DurableStripe {
        io,
        array,
        model,
        rng,
        at,
    }
}

/// As `durable_stripe` (written whole and flushed, then the tick off), on an array whose journal logs partial parity
/// alone wherever a stripe has no live entry: `journal_parity_alone`, a log always deep (`log_deep_writers` 0).
fn deep_journal_stripe(level: Level, members: usize, seed: u64, stripe: u64) -> DurableStripe {
    let opts = AssembleOptions {
        journal_parity_alone: true,
        log_deep_writers: Some(0),
        ..AssembleOptions::new(reference())
    };
    let (io, array) = journal_array_with(level, members, STRIPE_TEST_CHUNK, 16, seed, opts);
    // No background flush: it could retire an entry before the next write looks at it.
    array.set_integrity_tick(false);
    let mut model = BlockModel::new(array.size_bytes());
    let mut rng = SplitMix64::new(seed + 1);
    let stripe_bytes = STRIPE_TEST_CHUNK * array.geometry().data_per_stripe() as u64;
    let at = stripe * stripe_bytes;
    let full = random_bytes(&mut rng, stripe_bytes as usize);
    array.write(at, &full, false).expect("write");
    array.flush().expect("flush");
    model.write(at, &full, WriteOutcome::Acked { durable: true });
    DurableStripe {
        io,
        array,
        model,
        rng,
        at,
    }
}

/// Writes `bytes` at `at` through `Array::write_answering`: whether the write was answered from the log (before
/// its in-place writes) rather than once written.
fn answered_from_log(array: &Array, at: u64, bytes: &[u8]) -> bool {
    let answered = std::cell::Cell::new(false);
    array
        .write_answering(at, bytes, &|| answered.set(true))
        .expect("write");
    answered.get()
}

/// Small writes answered from the log while their in-place writes are still running (slow members), then a power
/// loss that drops every member write not made durable (the in-place writes are all lost; the log's rounds were
/// written with FUA): with no flush at all, every answered write reads back, also with members missing at
/// restart, and recovery says it rolled pages forward. With the roll forward taken out, this test fails.
#[test]
fn writes_answered_from_the_log_survive_a_power_loss_without_a_flush() {
    for (level, members, missing) in [
        (Level::Raid5, 5, vec![]),
        (Level::Raid5, 5, vec![1]),
        (Level::Raid6, 6, vec![]),
        (Level::Raid6, 6, vec![0]),
        (Level::Raid6, 6, vec![2, 5]),
    ] {
        let what = format!("{level} missing {missing:?}");
        let (io, array) = journal_array(level, members, 65536, 16, 3);
        let wb = WriteBack::new(&array, CONFIG);
        let mut model = BlockModel::new(array.size_bytes());
        let mut rng = SplitMix64::new(21);
        slow_writes(&io, 20);
        let mut from_log = 0;
        for _ in 0..16 {
            let (offset, len) = small_extent(&mut rng, array.size_bytes());
            let data = random_bytes(&mut rng, len);
            let answered = wb.write_answered(offset, &data, false).expect("write");
            let durable = answered == Answered::FromLog;
            from_log += usize::from(durable);
            model.write(offset, &data, WriteOutcome::Acked { durable });
        }
        assert!(
            from_log >= 12,
            "{what}: {from_log} of 16 small writes answered from the log"
        );
        assert!(
            wb.held() > 0,
            "{what}: writes still in place when the power goes"
        );
        let array = drop_all_and_check(&io, Some(wb), array, 5, &missing, &mut model, &what);
        assert!(
            array.integrity().log_pages_rolled_forward > 0,
            "{what}: recovery rolled nothing forward"
        );
    }
}

/// The same through `WriteBack::write_answering` (the NBD server's way: the writer's own thread writes, and is
/// told when it may reply): sixteen writers at once, the power cut once each was answered, while their in-place
/// writes are still running. The log never counts as deep here, so that every write is answered from it (a deep
/// log takes the partial parity alone: `a_deep_log_takes_the_partial_parity_alone_where_no_entry_is_live`).
#[test]
fn writes_answered_on_the_callers_thread_survive_a_power_loss() {
    for (level, members, missing) in [(Level::Raid5, 5, vec![1]), (Level::Raid6, 6, vec![2, 5])] {
        let what = format!("{level} missing {missing:?}");
        let opts = AssembleOptions {
            log_deep_writers: Some(usize::MAX),
            ..AssembleOptions::new(reference())
        };
        let (io, array) = journal_array_with(level, members, 65536, 16, 13, opts);
        let wb = WriteBack::new(&array, CONFIG);
        let mut model = BlockModel::new(array.size_bytes());
        let mut rng = SplitMix64::new(31);
        // Disjoint pages, one every 192 KiB of the array.
        let writes: Vec<(u64, Vec<u8>)> = (0..16u64)
            .map(|n| (n * 3 * 65536 + 4096 * (n % 4), random_bytes(&mut rng, 4096)))
            .collect();
        slow_writes(&io, 20);
        let (answers, answered) = std::sync::mpsc::channel::<usize>();
        std::thread::scope(|s| {
            for (n, (offset, data)) in writes.iter().enumerate() {
                let (wb, answers) = (&wb, answers.clone());
                s.spawn(move || {
                    // Cut off by the power loss after it was answered: its error is for write-back to keep.
                    let _ = wb.write_answering(*offset, data, false, &|| answers.send(n).unwrap());
                });
            }
            let mut got = Vec::new();
            while got.len() < writes.len() {
                got.push(
                    answered
                        .recv_timeout(Duration::from_secs(10))
                        .unwrap_or_else(|_| panic!("{what}: only {} writes answered", got.len())),
                );
            }
            assert!(
                wb.held() > 0,
                "{what}: writes still in place when the power goes"
            );
            io.inner().cut_power();
        });
        assert_eq!(wb.stats().answered_from_log, 16, "{what}");
        for (offset, data) in &writes {
            model.write(*offset, data, WriteOutcome::Acked { durable: true });
        }
        let array = drop_all_and_check(&io, Some(wb), array, 9, &missing, &mut model, &what);
        assert!(
            array.integrity().log_pages_rolled_forward > 0,
            "{what}: recovery rolled nothing forward"
        );
    }
}

/// An older data entry must not bring back what a newer write replaced: a write answered from the log, then (its
/// entry still live) a FUA write over it — a full-stripe write, or a partial one taking the ordinary path — and a
/// power loss dropping everything not durable. The FUA write's bytes read back, with and without a member missing.
#[test]
fn an_older_data_entry_never_rolls_back_a_newer_write() {
    for (level, members, missing, full_stripe) in [
        (Level::Raid5, 4, None, true),
        (Level::Raid5, 4, Some(0), true),
        (Level::Raid5, 4, None, false),
        (Level::Raid6, 5, Some(3), true),
        (Level::Raid6, 5, Some(1), false),
    ] {
        // Stripe 3's first page answered from the log, then the stripe, or two pages, written with FUA.
        answered_then_overwritten(level, members, missing, 4, true, |stripe_bytes| {
            if full_stripe {
                stripe_bytes as usize
            } else {
                8192
            }
        });
    }
}

/// One page answered from the log at the start of a stripe, then a write from the same place (FUA if `fua`,
/// `newer_len` bytes given the stripe's size) answered when written, and a power loss dropping every member
/// write not made durable; re-assembled with `missing` left out, the array must read back what was answered.
fn answered_then_overwritten(
    level: Level,
    members: usize,
    missing: Option<usize>,
    seed: u64,
    fua: bool,
    newer_len: impl Fn(u64) -> usize,
) {
    let what = format!("{level} missing {missing:?} seed {seed}");
    let chunk = 16384u64;
    let (io, array) = journal_array(level, members, chunk, 16, seed);
    let wb = WriteBack::new(&array, CONFIG);
    let mut model = BlockModel::new(array.size_bytes());
    let mut rng = SplitMix64::new(seed + 1);
    let stripe_bytes = chunk * (members - level.parity_chunks()) as u64;
    let at = 3 * stripe_bytes;
    let first = random_bytes(&mut rng, 4096);
    assert_eq!(
        wb.write_answered(at, &first, false).expect("write"),
        Answered::FromLog,
        "{what}"
    );
    model.write(at, &first, WriteOutcome::Acked { durable: true });
    let newer = random_bytes(&mut rng, newer_len(stripe_bytes));
    assert_eq!(
        wb.write_answered(at, &newer, fua).expect("write"),
        Answered::Written,
        "{what}: the second write is not answered from the log"
    );
    model.write(at, &newer, WriteOutcome::Acked { durable: fua });
    drop_all_and_check(
        &io,
        Some(wb),
        array,
        seed,
        missing.as_slice(),
        &mut model,
        &what,
    );
}

/// A write answered from the log leaves its chunk's page not yet durable; a later write of another chunk of the
/// stripe over the same page does not count that chunk as modified (its data entry carries it), so the later
/// entry's partial parity holds the first chunk's new contents. After a power loss dropping every member write
/// not made durable, with a third chunk's member missing at restart, recovery must solve the third chunk with the
/// first chunk as its data entry has it, not as its member kept it (the old contents). Counted as modified, the
/// first chunk's data entry could be retired by a flush while the later write was in flight, and the chunk solved
/// from parity that write tore (simulation seed 30660306). Without the data entry's contents in the solve, the
/// third chunk reads back garbage here; with the later write counting the first chunk as modified again, it does
/// a reconstruct-write (`log_rmw_to_rcw`).
#[test]
fn a_chunk_solved_from_the_log_sees_an_earlier_answered_chunk_as_its_data_entry_has_it() {
    // Five data chunks: a one-page write reads less as a read-modify-write than as a reconstruct-write.
    for (level, members) in [(Level::Raid5, 6), (Level::Raid6, 7)] {
        let what = format!("{level}");
        let chunk = STRIPE_TEST_CHUNK;
        let stripe = 3u64;
        let DurableStripe {
            io,
            array,
            mut model,
            mut rng,
            at,
        } = durable_stripe(level, members, 41, stripe);
        let g = array.geometry();
        // Page 1 of data chunks 0 and then 1, each answered from the log; the first done in place (not durable)
        // before the second starts.
        for index in 0..2u64 {
            let wb = WriteBack::new(&array, CONFIG);
            let offset = at + index * chunk + 4096;
            let page = random_bytes(&mut rng, 4096);
            assert_eq!(
                wb.write_answered(offset, &page, false).expect("write"),
                Answered::FromLog,
                "{what}: chunk {index}"
            );
            model.write(offset, &page, WriteOutcome::Acked { durable: true });
            wb.close().expect("done in place");
        }
        assert_eq!(
            array.integrity().log_rmw_to_rcw,
            0,
            "{what}: the second write counted the first chunk as modified"
        );
        let missing = g.stripe_member(stripe, 2);
        let wb = WriteBack::new(&array, CONFIG);
        let array = drop_all_and_check(&io, Some(wb), array, 41, &[missing], &mut model, &what);
        assert!(
            array.integrity().log_pages_rolled_forward > 0,
            "{what}: recovery rolled nothing forward"
        );
    }
}

/// Journal mode logs a small page-aligned write's data before the write reads anything and answers it then
/// (`log_data_first`); the window's partial parity follows before anything is written in place. The power cut
/// at the answer, before that partial parity or any in-place write: the write reads back after recovery, and so
/// does everything the stripe held, whichever one member of the stripe is missing at restart (RAID6: also two).
/// Without the roll forward from an entry that has no partial parity beside it, the write is lost here.
#[test]
fn a_write_answered_before_it_read_survives_a_power_loss_at_the_answer() {
    for (level, members) in [(Level::Raid5, 5), (Level::Raid6, 6)] {
        let mut missing_sets: Vec<Vec<usize>> = (0..members).map(|m| vec![m]).collect();
        if level == Level::Raid6 {
            missing_sets.push(vec![1, 4]);
        }
        for missing in missing_sets {
            let what = format!("{level}, stripe members {missing:?} missing");
            let stripe = 2u64;
            let DurableStripe {
                io,
                array,
                mut model,
                mut rng,
                at,
            } = durable_stripe(level, members, 50, stripe);
            let g = array.geometry();
            // Two pages of data chunk 1, answered from the log; the power goes as the answer is given.
            let offset = at + STRIPE_TEST_CHUNK + 8192;
            let pages = random_bytes(&mut rng, 8192);
            let answered = std::cell::Cell::new(false);
            let _ = array.write_answering(offset, &pages, &|| {
                answered.set(true);
                io.inner().cut_power();
            });
            assert!(answered.get(), "{what}: not answered");
            assert_eq!(array.integrity().log_data_first, 1, "{what}");
            model.write(offset, &pages, WriteOutcome::Acked { durable: true });
            drop(array);
            let images = io.inner().crash(52, CrashPolicy::DropAll).images;
            let slots: Vec<usize> = missing
                .iter()
                .map(|position| g.stripe_member(stripe, *position))
                .collect();
            let array = assemble_and_check(images, &slots, &mut model, &what);
            assert!(
                array.integrity().log_pages_rolled_forward > 0,
                "{what}: recovery rolled nothing forward"
            );
        }
    }
}

/// A write whose data the log does not carry (beyond its data budget) logs markers that void older data entries
/// of its chunks; before it does, what those entries' writes put in place is made durable (a flush), or a power
/// loss dropping both writes' in-place pages would bring back what was there before the older write, answered
/// from the log. Without that flush this test reads back zeros.
#[test]
fn markers_void_older_data_only_once_it_is_durable_in_place() {
    for (level, members, missing) in [
        (Level::Raid5, 4, None),
        (Level::Raid5, 4, Some(2)),
        (Level::Raid6, 5, Some(0)),
    ] {
        // From the stripe's start, one page beyond the data budget (one chunk per parity chunk): partial, not
        // carried, not FUA.
        answered_then_overwritten(level, members, missing, 10, false, |_| {
            (level.parity_chunks() * 4 + 1) * 4096
        });
    }
}

/// What the log cannot carry is answered when done: a FUA write, a write over a whole stripe, a write larger than
/// the log's data budget, and any write of a level without parity. Small writes are answered from the log.
#[test]
fn writes_the_log_cannot_carry_are_answered_when_written() {
    let (_io, array) = journal_array(Level::Raid5, 5, 16384, 16, 7);
    assert!(array.answers_from_log());
    assert!(array.integrity().journal);
    let wb = WriteBack::new(&array, CONFIG);
    let mut rng = SplitMix64::new(8);
    let stripe_bytes = 4 * 16384u64;
    let cases: [(&str, u64, usize, bool, Answered); 5] = [
        ("one page", 4096, 4096, false, Answered::FromLog),
        (
            "two chunks of a stripe",
            stripe_bytes + 8192,
            16384,
            false,
            Answered::FromLog,
        ),
        ("FUA", 8192, 4096, true, Answered::Written),
        (
            "a whole stripe",
            2 * stripe_bytes,
            stripe_bytes as usize,
            false,
            Answered::Written,
        ),
        // The data budget is one chunk per parity chunk: 4 pages here.
        (
            "beyond the data budget",
            5 * stripe_bytes,
            20480,
            false,
            Answered::Written,
        ),
    ];
    let mut model = vec![0u8; array.size_bytes() as usize];
    for (what, offset, len, fua, expected) in cases {
        let data = random_bytes(&mut rng, len);
        let answered = wb.write_answered(offset, &data, fua).expect(what);
        assert_eq!(answered, expected, "{what}");
        model[offset as usize..offset as usize + len].copy_from_slice(&data);
    }
    assert_eq!(wb.stats().answered_from_log, 2);
    wb.close().expect("close");
    let mut all = vec![0u8; model.len()];
    array.read(0, &mut all).expect("read");
    assert!(all == model, "the array reads back what was written");
    drop(array);

    let (_io, mirror) = journal_array(Level::Raid1, 2, 16384, 16, 9);
    assert!(
        !mirror.answers_from_log(),
        "RAID1 has no log to answer from"
    );
    let wb = WriteBack::new(&mirror, CONFIG);
    let data = random_bytes(&mut rng, 4096);
    assert_eq!(
        wb.write_answered(0, &data, false).expect("write"),
        Answered::Written
    );
    assert_eq!(
        wb.stats().held_writes,
        0,
        "nothing held where nothing is answered from a log"
    );
    wb.close().expect("close");
}

/// Power losses (unflushed member writes kept, dropped or torn) in the middle of a mix of small writes answered
/// from the log, FUA writes, larger writes and flushes, a member missing at restart: every write answered from the
/// log or with FUA, and everything flushed, reads back; nothing older comes back. Blocks at the partial parity
/// log's documented limit (a missing member's block being written by a write not answered from the log) are
/// forgiven, as everywhere.
#[test]
fn power_losses_in_journal_mode_keep_every_answered_write() {
    power_losses_keep_every_answered_write(false, false);
}

/// The same with lone answers (`AssembleOptions::journal_lone_answers`): half the writes go through
/// `write_answering` on the caller's thread (alone, so answered from the log), the rest through write-back,
/// which holds none of them there: they take the log's own way, partial parity alone in stripes without a live
/// data entry and no markers, beside data entries of the same stripes.
#[test]
fn power_losses_with_lone_answers_keep_every_answered_write() {
    power_losses_keep_every_answered_write(true, false);
}

/// The same with lone answers gated on spare CPU (`AssembleOptions::spare_cpu`, `PARAID_JOURNAL_LONE=auto`), the
/// gate a seeded stream of answers: writes through `write_answering` are answered from the log or take the log's
/// way as the gate says, write by write, beside each other in the same stripes, as a load crossing the gate's
/// thresholds makes them.
#[test]
fn power_losses_with_answers_gated_on_spare_cpu_keep_every_answered_write() {
    power_losses_keep_every_answered_write(true, true);
}

fn power_losses_keep_every_answered_write(lone_answers: bool, gated: bool) {
    let (mut crashes, mut answered_total, mut forgiven_total, mut parity_alone_total) =
        (0, 0, 0, 0);
    let (mut cpu_busy_total, mut off_parity_total) = (0, 0);
    for seed in 0..12u64 {
        let (level, members) = if seed % 2 == 0 {
            (Level::Raid6, 6)
        } else {
            (Level::Raid5, 5)
        };
        let gate = Arc::new(paraid_engine::spare_cpu::SeededSpareCpu::new(900 + seed));
        let opts = AssembleOptions {
            journal_lone_answers: lone_answers,
            spare_cpu: gated.then(|| gate.clone() as Arc<dyn paraid_engine::spare_cpu::SpareCpu>),
            ..AssembleOptions::new(reference())
        };
        let (io, array) = journal_array_with(level, members, 16384, 24, seed, opts);
        let wb = WriteBack::new(&array, CONFIG);
        let mut model = BlockModel::new(array.size_bytes());
        let mut rng = SplitMix64::new(300 + seed);
        slow_writes(&io, 1);
        let cut_after = 20 + rng.below(200);
        for step in 0..60u64 {
            if step == 30 {
                io.inner().cut_power_after_writes(cut_after);
            }
            let (offset, len, fua) = match rng.below(8) {
                0 => {
                    if wb.flush().is_ok() {
                        model.flushed();
                    }
                    continue;
                }
                1 => {
                    let (offset, len) = small_extent(&mut rng, array.size_bytes());
                    (offset, len, true)
                }
                2 => {
                    let (offset, len) = extent(&mut rng, array.size_bytes(), 4 * 16384 * 4);
                    (offset, len, false)
                }
                _ => {
                    let (offset, len) = small_extent(&mut rng, array.size_bytes());
                    (offset, len, false)
                }
            };
            let data = random_bytes(&mut rng, len);
            let written = if lone_answers && rng.below(2) == 0 {
                let early = std::cell::Cell::new(false);
                wb.write_answering(offset, &data, fua, &|| early.set(true))
                    .map(|()| {
                        if early.get() {
                            Answered::FromLog
                        } else {
                            Answered::Written
                        }
                    })
            } else {
                wb.write_answered(offset, &data, fua)
            };
            let outcome = match written {
                Ok(answered) => {
                    answered_total += usize::from(answered == Answered::FromLog);
                    WriteOutcome::Acked {
                        durable: fua || answered == Answered::FromLog,
                    }
                }
                Err(_) => WriteOutcome::Failed,
            };
            model.write(offset, &data, outcome);
        }
        parity_alone_total += array.integrity().log_parity_alone;
        off_parity_total += array.integrity().log_entries_off_parity;
        cpu_busy_total += array.integrity().log_cpu_busy;
        let images = power_loss(&io, Some(wb), array, seed, CrashPolicy::Random);
        let missing = (seed as usize) % members;
        let what = format!("seed {seed} {level}, member {missing} missing at restart");
        forgiven_total += check_with_a_member_missing(images, missing, &mut model, &what);
        crashes += 1;
    }
    assert_eq!(crashes, 12);
    assert!(
        answered_total > if lone_answers { 30 } else { 100 },
        "{answered_total} writes answered from the log"
    );
    if gated {
        assert!(
            cpu_busy_total > 30,
            "{cpu_busy_total} writes found the CPU busy"
        );
    } else {
        assert_eq!(cpu_busy_total, 0, "no gate, yet writes found the CPU busy");
    }
    if lone_answers {
        assert!(
            parity_alone_total > 50,
            "{parity_alone_total} writes logged their partial parity alone"
        );
        // RAID5 entries of partial parity alone may leave the P member's ring (ppl/spread.rs).
        assert!(
            off_parity_total > 0,
            "no RAID5 entry left the P member's ring"
        );
    }
    eprintln!(
        "{crashes} power losses in journal mode (lone answers {lone_answers}, gated {gated}), {answered_total} \
         writes answered from the log, {cpu_busy_total} found the CPU busy, {parity_alone_total} logged partial \
         parity alone ({off_parity_total} RAID5 stripes' entries off the P ring), {forgiven_total} blocks at the \
         write-hole limit"
    );
}

/// Members whose next log record write (a FUA write before the data area), once armed, waits until let go.
struct LogGate {
    inner: MemMembers,
    state: Mutex<GateState>,
    changed: Condvar,
}

#[derive(Default)]
struct GateState {
    armed: bool,
    holding: bool,
    let_go: bool,
}

/// A journal array created on a `LogGate` (`LogGate::new`) and assembled with `opts` (journal mode set on), its
/// background flush off (it would write the log meanwhile and retire rounds).
fn gated_journal_array(
    level: Level,
    members: usize,
    chunk_bytes: u64,
    opts: AssembleOptions,
) -> (Arc<LogGate>, Array) {
    let gate = LogGate::new(members, chunk_bytes);
    create_io(gate.as_ref(), level, chunk_bytes, "gate").expect("create_io");
    let opts = AssembleOptions {
        journal: true,
        ..opts
    };
    let array = assemble_io(gate.clone(), opts).expect("assemble_io");
    array.set_integrity_tick(false);
    (gate, array)
}

impl LogGate {
    /// Members in memory of 16 chunks each, the gate unarmed.
    fn new(members: usize, chunk_bytes: u64) -> Arc<LogGate> {
        Arc::new(LogGate {
            inner: MemMembers::new(members, DEFAULT_DATA_OFFSET_BYTES + 16 * chunk_bytes),
            state: Mutex::default(),
            changed: Condvar::new(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, GateState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Holds the next log write (again: a write let go before does not let this one through).
    fn arm(&self) {
        let mut st = self.lock();
        st.armed = true;
        st.let_go = false;
    }

    /// Whether a log write is held, waiting up to `limit` for one.
    fn wait_holding(&self, limit: Duration) -> bool {
        let (st, _) = self
            .changed
            .wait_timeout_while(self.lock(), limit, |st| !st.holding)
            .unwrap_or_else(|p| p.into_inner());
        st.holding
    }

    fn let_go(&self) {
        self.lock().let_go = true;
        self.changed.notify_all();
    }
}

impl MemberIo for LogGate {
    forward_member_io!(inner);
    fn submit(&self, reqs: &mut [IoReq<'_>]) {
        let log_write = reqs.iter().any(|r| {
            matches!(r.op, IoOp::Write { offset_bytes, fua: true, .. } if offset_bytes < DEFAULT_DATA_OFFSET_BYTES)
        });
        if log_write {
            let mut st = self.lock();
            if st.armed {
                st.armed = false;
                st.holding = true;
                self.changed.notify_all();
                while !st.let_go {
                    st = self.changed.wait(st).unwrap_or_else(|p| p.into_inner());
                }
                st.holding = false;
            }
        }
        self.inner.submit(reqs);
    }
}

/// A write answered from the log writes its partial parity after the answer, into space its data round set aside.
/// That record is not a round: with one round in flight (drives), a second writer's data round does not wait for
/// it. When it did, every write at queue depth 1 waited for the previous write's record as well as its own, and
/// the data first halved the journal's IOPS (writehole_cost, members bound by latency). Here the first writer's
/// record is held until the second writer was answered; while it counted as a round, the second never was.
#[test]
fn a_data_first_round_does_not_wait_for_an_earlier_writes_partial_parity_record() {
    for (level, members) in [(Level::Raid5, 5), (Level::Raid6, 6)] {
        let chunk_bytes = 16384;
        let opts = AssembleOptions {
            log_rounds_in_flight: Some(1),
            ..AssembleOptions::new(reference())
        };
        let (gate, array) = gated_journal_array(level, members, chunk_bytes, opts);
        let stripe_bytes = chunk_bytes * array.geometry().data_per_stripe() as u64;
        let (first, second) = (stripe_bytes + 4096, 3 * stripe_bytes + 8192);
        let (page_a, page_b) = (vec![0xa1u8; 4096], vec![0xb2u8; 4096]);
        let (array_ref, gate_ref) = (&array, gate.as_ref());
        let answered_second = std::thread::scope(|scope| {
            // Answered after its data round; the next log write, its partial parity record, is held.
            let a = scope.spawn(|| array_ref.write_answering(first, &page_a, &|| gate_ref.arm()));
            assert!(
                gate.wait_holding(Duration::from_secs(20)),
                "{level}: the first write's partial parity record never reached the members"
            );
            let (tx, rx) = mpsc::channel();
            let page_b = &page_b;
            let b = scope.spawn(move || {
                array_ref.write_answering(second, page_b, &|| {
                    let _ = tx.send(());
                })
            });
            let answered = rx.recv_timeout(Duration::from_secs(10)).is_ok();
            gate.let_go();
            a.join().expect("first writer").expect("first write");
            b.join().expect("second writer").expect("second write");
            answered
        });
        assert!(
            answered_second,
            "{level}: the second write's data round waited for the first write's partial parity record"
        );
        assert_eq!(array.integrity().log_data_first, 2, "{level}");
        for (at, page) in [(first, &page_a), (second, &page_b)] {
            let mut back = vec![0u8; 4096];
            array.read(at, &mut back).expect("read");
            assert!(back == *page, "{level}: byte {at} reads back other bytes");
        }
    }
}

/// Lone answers (`AssembleOptions::journal_lone_answers`): a write through `write_answering` while another awaits
/// its answer takes the log's own way: partial parity alone (its stripe has no live data entry, so no markers
/// either), answered when done, not from the log. The one awaiting (its data round's record held at the members)
/// is answered from the log once that record is let go.
#[test]
fn lone_answers_answer_only_a_write_no_other_awaits_beside() {
    for (level, members) in [(Level::Raid5, 5), (Level::Raid6, 6)] {
        let chunk_bytes = 16384;
        let opts = AssembleOptions {
            journal_lone_answers: true,
            log_rounds_in_flight: Some(4),
            ..AssembleOptions::new(reference())
        };
        let (gate, array) = gated_journal_array(level, members, chunk_bytes, opts);
        let stripe_bytes = chunk_bytes * array.geometry().data_per_stripe() as u64;
        let (first, second) = (stripe_bytes + 4096, 3 * stripe_bytes + 8192);
        let (page_a, page_b) = (vec![0xa1u8; 4096], vec![0xb2u8; 4096]);
        let (array_ref, gate_ref) = (&array, gate.as_ref());
        let (answered_first, answered_second) = std::thread::scope(|scope| {
            gate.arm();
            let (tx, rx) = mpsc::channel();
            let page_a = &page_a;
            let a = scope.spawn(move || {
                array_ref.write_answering(first, page_a, &|| {
                    let _ = tx.send(());
                })
            });
            assert!(
                gate_ref.wait_holding(Duration::from_secs(20)),
                "{level}: the first write's data round never reached the members"
            );
            let page_b = &page_b;
            let b = scope.spawn(move || {
                let early = std::cell::Cell::new(false);
                array_ref
                    .write_answering(second, page_b, &|| early.set(true))
                    .map(|()| early.get())
            });
            // The second write is counted as not lone when it is admitted; its own round may then wait for the
            // first's, held at the members.
            let deadline = std::time::Instant::now() + Duration::from_secs(20);
            while array_ref.integrity().log_not_lone == 0 && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
            let first_early_before = rx.try_recv().is_ok();
            gate_ref.let_go();
            a.join().expect("first writer").expect("first write");
            let second_early = b.join().expect("second writer").expect("second write");
            (!first_early_before && rx.try_recv().is_ok(), second_early)
        });
        assert!(
            answered_first,
            "{level}: the lone write was not answered from the log"
        );
        assert!(
            !answered_second,
            "{level}: a write beside one awaiting its answer was answered from the log"
        );
        let report = array.integrity();
        assert_eq!(report.log_not_lone, 1, "{level}");
        assert_eq!(report.log_data_first, 1, "{level}");
        assert_eq!(report.log_parity_alone, 1, "{level}");
        for (at, page) in [(first, &page_a), (second, &page_b)] {
            let mut back = vec![0u8; 4096];
            array.read(at, &mut back).expect("read");
            assert!(back == *page, "{level}: byte {at} reads back other bytes");
        }
    }
}

/// A gate on spare CPU whose level a test sets, counting how often it was asked.
#[derive(Default)]
struct CountingCpu {
    level: Mutex<Option<Spare>>,
    calls: std::sync::atomic::AtomicUsize,
}

impl CountingCpu {
    fn set(&self, level: Spare) {
        *self.level.lock().unwrap() = Some(level);
    }

    fn calls(&self) -> usize {
        self.calls.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl paraid_engine::spare_cpu::SpareCpu for CountingCpu {
    fn spare(&self) -> Spare {
        self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.level.lock().unwrap().expect("a level set")
    }
}

/// A gate on spare CPU (`AssembleOptions::spare_cpu`, `PARAID_JOURNAL_LONE=auto`) decides each early answer:
/// * `ForAll`: a write beside one awaiting its answer (the first's data round held at the members) is answered
///   from the log all the same (without a gate, `lone_answers_answer_only_a_write_no_other_awaits_beside`: not);
/// * `ForLone`: the lone rule holds: the write beside is not answered from the log and counts as not lone;
/// * `Busy`: even a lone write takes the log's own way (partial parity alone, answered when done), counted.
///
/// Every write reads back. The frontend is told to send every write through `write_answering` (the gate and the
/// engine's count of writes awaiting answers decide, not the frontend's look at its queue).
#[test]
fn a_gate_on_spare_cpu_decides_each_early_answer() {
    for (level, members) in [(Level::Raid5, 5), (Level::Raid6, 6)] {
        let chunk_bytes = 16384;
        let cpu = Arc::new(CountingCpu::default());
        let opts = AssembleOptions {
            journal_lone_answers: true,
            log_rounds_in_flight: Some(4),
            spare_cpu: Some(cpu.clone()),
            ..AssembleOptions::new(reference())
        };
        let (gate, array) = gated_journal_array(level, members, chunk_bytes, opts);
        assert!(array.answers_from_log(), "{level}");
        assert!(!array.answers_lone_writes_only(), "{level}");
        let stripe_bytes = chunk_bytes * array.geometry().data_per_stripe() as u64;
        let mut written: Vec<(u64, Vec<u8>)> = Vec::new();
        // Writes counted not lone, answered with their data first, and sent the log's way by a busy CPU.
        let ways = |array: &Array| {
            let r = array.integrity();
            (r.log_not_lone, r.log_data_first, r.log_cpu_busy)
        };
        // Two writes, the second beside the first awaiting its answer; whether each was answered from the log.
        let mut beside = |spare: Spare, stripe: u64| -> (bool, bool) {
            cpu.set(spare);
            let (first, second) = (
                stripe * stripe_bytes + 4096,
                (stripe + 2) * stripe_bytes + 8192,
            );
            let (page_a, page_b) = (vec![stripe as u8; 4096], vec![!(stripe as u8); 4096]);
            let (array_ref, gate_ref, cpu_ref) = (&array, gate.as_ref(), cpu.as_ref());
            let calls_before = cpu.calls();
            let answered = std::thread::scope(|scope| {
                gate_ref.arm();
                let (tx_a, rx_a) = mpsc::channel();
                let page_a = &page_a;
                let a = scope.spawn(move || {
                    array_ref.write_answering(first, page_a, &|| {
                        let _ = tx_a.send(());
                    })
                });
                assert!(
                    gate_ref.wait_holding(Duration::from_secs(20)),
                    "{level} {spare:?}: the first write's data round never reached the members"
                );
                let (tx_b, rx_b) = mpsc::channel();
                let page_b = &page_b;
                let b = scope.spawn(move || {
                    array_ref.write_answering(second, page_b, &|| {
                        let _ = tx_b.send(());
                    })
                });
                // The second write asked the gate (the step right before it counts as awaiting its answer) while
                // the first awaits its own, its round held.
                let deadline = std::time::Instant::now() + Duration::from_secs(20);
                while cpu_ref.calls() < calls_before + 2 && std::time::Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(1));
                }
                assert_eq!(
                    cpu_ref.calls(),
                    calls_before + 2,
                    "{level}: the second write never asked the gate"
                );
                std::thread::sleep(Duration::from_millis(50));
                gate_ref.let_go();
                a.join().expect("first writer").expect("first write");
                b.join().expect("second writer").expect("second write");
                (rx_a.try_recv().is_ok(), rx_b.try_recv().is_ok())
            });
            written.push((first, page_a));
            written.push((second, page_b));
            answered
        };
        assert_eq!(beside(Spare::ForAll, 1), (true, true), "{level}: ForAll");
        assert_eq!(ways(&array), (0, 2, 0), "{level}: ForAll");
        assert_eq!(beside(Spare::ForLone, 5), (true, false), "{level}: ForLone");
        assert_eq!(ways(&array), (1, 3, 0), "{level}: ForLone");
        // Busy: a lone write is not answered from the log.
        cpu.set(Spare::Busy);
        let (third, page_c) = (10 * stripe_bytes + 4096, vec![0xc3u8; 4096]);
        let early = std::cell::Cell::new(false);
        array
            .write_answering(third, &page_c, &|| early.set(true))
            .expect("third write");
        assert!(
            !early.get(),
            "{level}: answered from the log with the CPU busy"
        );
        written.push((third, page_c));
        assert_eq!(ways(&array), (1, 3, 1), "{level}: Busy");
        assert_eq!(array.integrity().log_parity_alone, 2, "{level}");
        for (at, page) in &written {
            let mut back = vec![0u8; 4096];
            array.read(*at, &mut back).expect("read");
            assert!(back == *page, "{level}: byte {at} reads back other bytes");
        }
    }
}

/// A journal write whose read-modify-write reads nothing (the stripe cache holds the old data and parity: a hot
/// page rewritten) has its partial parity at hand: it logs data and partial parity in one round and is answered
/// then, rather than logging its data first and its partial parity in a record more. The first write of the page
/// reads, so it logs its data first; the rewrites, once the cache keeps the stripe (one write in sixteen while it
/// serves nothing), do not. Every rewrite is still answered from the log, and all of them read back after a power
/// loss that drops every member write not made durable, with a member of the stripe missing at restart.
#[test]
fn a_rewrite_the_stripe_cache_covers_logs_data_and_partial_parity_in_one_round() {
    for (level, members) in [(Level::Raid5, 5), (Level::Raid6, 6)] {
        let chunk_bytes = STRIPE_TEST_CHUNK;
        let opts = AssembleOptions {
            stripe_cache_bytes: Some(8 << 20),
            ..AssembleOptions::new(reference())
        };
        let (io, array) = journal_array_with(level, members, chunk_bytes, 16, 61, opts);
        let g = array.geometry();
        let stripe = 1u64;
        let offset = stripe * chunk_bytes * g.data_per_stripe() as u64 + 4096;
        let mut model = BlockModel::new(array.size_bytes());
        let mut rng = SplitMix64::new(62);
        let rewrites = 40u64;
        for n in 0..rewrites {
            let page = random_bytes(&mut rng, 4096);
            assert!(
                answered_from_log(&array, offset, &page),
                "{level}: write {n} not answered from the log"
            );
            model.write(offset, &page, WriteOutcome::Acked { durable: true });
        }
        let data_first = array.integrity().log_data_first;
        assert!(
            (1..=17).contains(&data_first),
            "{level}: {data_first} of {rewrites} rewrites logged their data first"
        );
        assert!(
            array.detail().stripe_cache.hits > 0,
            "{level}: the cache served nothing"
        );
        let missing = [g.stripe_member(stripe, 0)];
        drop_all_and_check(
            &io,
            None,
            array,
            63,
            &missing,
            &mut model,
            &format!("{level}"),
        );
    }
}

/// With `journal_parity_alone` (on by default), where the log is deep (here always: `log_deep_writers` 0), a
/// journal write in a stripe without a live entry logs its partial parity alone, as the log does without the
/// journal, and is answered once written in place, not from the log. A write into a stripe whose entry is still
/// live carries its data as before (markers there would void a data entry whose pages may not be durable in
/// place). After a power loss that drops every member write not made durable, with a member of the stripe the
/// writes left alone missing at restart: the stripe's other chunks reconstruct intact (the partial parity), the
/// write answered from the log reads back, and the one answered when written reads back old or new.
#[test]
fn a_deep_log_takes_the_partial_parity_alone_where_no_entry_is_live() {
    for (level, members) in [(Level::Raid5, 5), (Level::Raid6, 6)] {
        let chunk_bytes = STRIPE_TEST_CHUNK;
        let stripe = 2u64;
        let DurableStripe {
            io,
            array,
            mut model,
            mut rng,
            at: stripe_at,
        } = deep_journal_stripe(level, members, 71, stripe);
        let g = array.geometry();
        let before = array.integrity();
        // Chunk 0 (no live entry), then chunk 1 (the first write's entry live).
        for (n, at) in [4096, chunk_bytes + 8192].into_iter().enumerate() {
            let page = random_bytes(&mut rng, 4096);
            let at = stripe_at + at;
            assert_eq!(
                answered_from_log(&array, at, &page),
                n == 1,
                "{level}: write {n} answered from the log or not, as its stripe's live entry says"
            );
            model.write(at, &page, WriteOutcome::Acked { durable: n == 1 });
        }
        let after = array.integrity();
        assert_eq!(
            after.log_parity_alone - before.log_parity_alone,
            1,
            "{level}"
        );
        assert_eq!(after.log_data_first, before.log_data_first, "{level}");
        let missing = [g.stripe_member(stripe, 2)];
        drop_all_and_check(
            &io,
            None,
            array,
            73,
            &missing,
            &mut model,
            &format!("{level}"),
        );
    }
}

/// A chunk's pages not yet durable are tracked per write: those a write answered from the log carried (recovery
/// rolls them forward) apart from those an earlier write left without its data in the log (partial parity alone,
/// or markers), where the two overlap the newer one deciding. Merged into one range counted as not carried, the
/// carried pages made a later entry of the stripe count their chunk as modified; a flush that did not wait for
/// that later write (one that makes room in the ring) then retired the data entry while the write was in flight,
/// and with the chunk's member missing at restart recovery solved the chunk from parity the write tore: an
/// answered write read back as bytes never written (simulation seed 30826522 with `journal_parity_alone`; seed
/// 30660306 was the same loss without the merge).
/// Here: A writes pages 0-1 of chunk 0 with its partial parity alone, B pages 1-3 of chunk 0 answered from the log,
/// C pages 1-3 of chunk 1 answered from the log. At C's answer a background tick flushes and retires A's and B's
/// rounds (it would wait for C, were C leaning on pages not durable: the symptom of the merge), and the power goes
/// after one more member write (C's in-place writes torn); chunk 0's member is missing at restart.
#[test]
fn carried_pages_stay_carried_beside_pages_a_write_left_out_of_the_log() {
    for (level, members) in [(Level::Raid5, 5), (Level::Raid6, 6)] {
        let chunk_bytes = STRIPE_TEST_CHUNK;
        let stripe = 2u64;
        let DurableStripe {
            io,
            array,
            mut model,
            mut rng,
            at,
        } = deep_journal_stripe(level, members, 81, stripe);
        let g = array.geometry();
        let before = array.integrity();
        // A and B: (offset in the stripe, bytes, answered from the log).
        for (n, (offset, len, from_log)) in [(0, 8192, false), (4096, 12288, true)]
            .into_iter()
            .enumerate()
        {
            let bytes = random_bytes(&mut rng, len);
            assert_eq!(
                answered_from_log(&array, at + offset, &bytes),
                from_log,
                "{level}: write {n}"
            );
            model.write(
                at + offset,
                &bytes,
                WriteOutcome::Acked { durable: from_log },
            );
        }
        assert_eq!(
            array.integrity().log_parity_alone - before.log_parity_alone,
            1,
            "{level}"
        );
        // C, with the tick on a thread of its own at the answer.
        let c = random_bytes(&mut rng, 12288);
        let (ticked_tx, ticked) = mpsc::channel();
        let tick_waited_for_c = std::cell::Cell::new(false);
        std::thread::scope(|scope| {
            let answered = std::cell::Cell::new(false);
            let _ = array.write_answering(at + chunk_bytes + 4096, &c, &|| {
                answered.set(true);
                let tx = ticked_tx.clone();
                let array = &array;
                scope.spawn(move || {
                    array.run_integrity_tick().expect("tick");
                    let _ = tx.send(());
                });
                if ticked.recv_timeout(Duration::from_secs(10)).is_ok() {
                    io.inner().cut_power_after_writes(1);
                } else {
                    tick_waited_for_c.set(true);
                }
            });
            assert!(answered.get(), "{level}: C not answered from the log");
        });
        assert!(
            !tick_waited_for_c.get(),
            "{level}: the background flush waited for C: C counted chunk 0's carried pages as not durable"
        );
        model.write(
            at + chunk_bytes + 4096,
            &c,
            WriteOutcome::Acked { durable: true },
        );
        let images = power_loss(&io, None, array, 83, CrashPolicy::KeepAll);
        let missing = [g.stripe_member(stripe, 0)];
        assemble_and_check(images, &missing, &mut model, &format!("{level}"));
    }
}

/// With `journal_parity_alone`, a deep log (here from one writer at work, `log_deep_writers` 1): the first write,
/// alone, logs its data first and is answered from the log; a second, in another stripe, is held in the log
/// after its answer (its partial parity record at the members), so the log is deep for the next two: one into the
/// first write's stripe, whose entry is live, carries its data and is answered from the log; one into a third
/// stripe logs its partial parity alone and is not.
#[test]
fn a_deep_log_carries_the_data_where_an_entry_is_live() {
    for (level, members) in [(Level::Raid5, 5), (Level::Raid6, 6)] {
        let chunk_bytes = 16384;
        let opts = AssembleOptions {
            journal_parity_alone: true,
            log_deep_writers: Some(1),
            // Rounds side by side: the held record does not hold back the others.
            log_rounds_in_flight: Some(4),
            ..AssembleOptions::new(reference())
        };
        let (gate, array) = gated_journal_array(level, members, chunk_bytes, opts);
        let stripe_bytes = chunk_bytes * array.geometry().data_per_stripe() as u64;
        let page = vec![0x5au8; 4096];
        let answered_from_log = |at: u64| answered_from_log(&array, at, &page);
        assert!(
            answered_from_log(stripe_bytes + 4096),
            "{level}: a write alone in the log was not answered from it"
        );
        assert_eq!(array.integrity().log_data_first, 1, "{level}");
        let (array_ref, gate_ref, page_ref) = (&array, gate.as_ref(), &page);
        let (into_live, elsewhere) = std::thread::scope(|scope| {
            // Answered after its data round; its partial parity record is held, and it stays at work in the log.
            let held = scope.spawn(|| {
                array_ref.write_answering(3 * stripe_bytes + 8192, page_ref, &|| gate_ref.arm())
            });
            assert!(
                gate.wait_holding(Duration::from_secs(20)),
                "{level}: the held write's partial parity record never reached the members"
            );
            let into_live = answered_from_log(stripe_bytes + 2 * 4096);
            let elsewhere = answered_from_log(5 * stripe_bytes + 4096);
            gate.let_go();
            held.join().expect("held writer").expect("held write");
            (into_live, elsewhere)
        });
        assert!(
            into_live,
            "{level}: a write into a stripe with a live entry did not carry its data"
        );
        assert!(
            !elsewhere,
            "{level}: a write into a stripe without one was answered from the log"
        );
        assert_eq!(array.integrity().log_parity_alone, 1, "{level}");
        for at in [
            stripe_bytes + 4096,
            stripe_bytes + 2 * 4096,
            3 * stripe_bytes + 8192,
            5 * stripe_bytes + 4096,
        ] {
            let mut back = vec![0u8; 4096];
            array.read(at, &mut back).expect("read");
            assert!(back == page, "{level}: byte {at} reads back other bytes");
        }
    }
}

/// Lone answers with a database's commit stream: writes its client waits for (`write_answering`, alone), each
/// starting within or right after the one before. The first is answered from the log (its data logged first);
/// the next, in a stripe without a live data entry, logs its partial parity alone as a stream entry, and those
/// after it ride or extend the stream entries, across a chunk boundary too, as with the log: they log nothing (or
/// a stream entry reaching ahead) and are answered once written in place. Beside a live data entry (a write
/// answered from the log into another chunk of the stripe) the stream's writes go back to the journal's way.
/// After a power loss keeping, dropping or tearing each unflushed member write, with each member missing at
/// restart in turn, every block flushed or answered from the log reads back. With stream entries off
/// (`AssembleOptions::log_streams`) every one of these writes is answered from the log.
#[test]
fn lone_answers_let_a_commit_stream_ride_its_stream_entries() {
    for (level, members) in [(Level::Raid6, 6), (Level::Raid5, 5)] {
        for streams in [true, false] {
            let chunk_bytes = 65536u64;
            let opts = AssembleOptions {
                journal_lone_answers: true,
                log_streams: streams,
                ..AssembleOptions::new(reference())
            };
            let (io, array) = journal_array_with(level, members, chunk_bytes, 16, 7, opts);
            // No background flush: it would retire the entries between the writes.
            array.set_integrity_tick(false);
            let k = array.geometry().data_per_stripe() as u64;
            let stripe_bytes = chunk_bytes * k;
            let mut model = BlockModel::new(array.size_bytes());
            let mut rng = SplitMix64::new(11);
            // Stripe 2 written whole and flushed: its chunks are what a member missing at restart must get back.
            let at = 2 * stripe_bytes;
            let whole = random_bytes(&mut rng, stripe_bytes as usize);
            array.write(at, &whole, false).expect("write");
            array.flush().expect("flush");
            model.write(at, &whole, WriteOutcome::Acked { durable: true });
            // The stream's first write, the last page of stripe 1: answered from the log.
            let first = random_bytes(&mut rng, 4096);
            assert!(
                answered_from_log(&array, at - 4096, &first),
                "{level}: the first commit"
            );
            model.write(at - 4096, &first, WriteOutcome::Acked { durable: true });
            // Then commits (a write, then a flush): the tail page rewritten and a page more, in turn, for 20 pages
            // of stripe 2: chunk 0, then chunk 1 (one write crosses into it).
            let mut from_log = 0;
            for step in 0..40u64 {
                let bytes = random_bytes(&mut rng, 4096 * (1 + (step % 2) as usize));
                let at_page = at + step / 2 * 4096;
                let answered = answered_from_log(&array, at_page, &bytes);
                from_log += usize::from(answered);
                model.write(at_page, &bytes, WriteOutcome::Acked { durable: answered });
                // A commit: the write, then a flush.
                array.flush().expect("flush");
                model.flushed();
            }
            let report = array.integrity();
            if streams {
                assert_eq!(
                    from_log, 0,
                    "{level}: a commit continuing the stream was answered from the log"
                );
                assert!(
                    report.log_rides >= 20,
                    "{level}: {} rides",
                    report.log_rides
                );
                assert!(
                    report.log_stream_extensions >= 2,
                    "{level}: {} stream entries reached ahead",
                    report.log_stream_extensions
                );
                assert_eq!(report.log_data_first, 1, "{level}");
            } else {
                assert_eq!(
                    from_log, 40,
                    "{level}: streams off, a waited-for write not answered from the log"
                );
                assert_eq!(report.log_rides, 0, "{level}");
            }
            // A write answered from the log into chunk 2 of the stripe (not sequential) leaves a live data entry
            // there: the stream's next write is answered from the log again (no ride beside it).
            let other = random_bytes(&mut rng, 4096);
            let at_other = at + 2 * chunk_bytes + 8192;
            assert!(
                answered_from_log(&array, at_other, &other),
                "{level}: a lone write into chunk 2"
            );
            model.write(at_other, &other, WriteOutcome::Acked { durable: true });
            let rides_before = array.integrity().log_rides;
            let next = random_bytes(&mut rng, 4096);
            let at_next = at + 20 * 4096;
            assert!(
                answered_from_log(&array, at_next, &next),
                "{level}: a stream's write beside a live data entry was not answered from the log"
            );
            model.write(at_next, &next, WriteOutcome::Acked { durable: true });
            assert_eq!(array.integrity().log_rides, rides_before, "{level}");
            for missing in 0..members {
                let images = io.inner().crash(missing as u64, CrashPolicy::Random).images;
                let what =
                    format!("{level}, streams {streams}, member {missing} missing at restart");
                check_with_a_member_missing(images, missing, &mut model.clone(), &what);
            }
            drop(array);
        }
    }
}

/// A sequential stream of writes longer than a commit stream's and short enough for the log to carry their data
/// (RAID6: a chunk and a half; RAID5, whose log carries one chunk of data: three quarters of one; four chunks to a
/// stripe) whose client waits for each, as `dd bs=... oflag=direct` does: a write that ends inside a stripe is
/// answered once written in place, as the log does, because the stream's next write lands in the same stripe and
/// would wait for the stripe lock behind this one's in-place writes after an early answer; a write that ends a
/// stripe is answered from the log (the next one goes to another stripe), and so is the stream's first. The last
/// write ends a stripe and is not flushed: after a power loss keeping, dropping or tearing each of its member
/// writes, with each member missing at restart in turn, it reads back (rolled forward from the log), and so does
/// every block written before it.
#[test]
fn a_sequential_stream_is_answered_early_only_where_a_write_ends_a_stripe() {
    for (level, members, write_bytes) in [(Level::Raid6, 6, 96 << 10), (Level::Raid5, 5, 48 << 10)]
    {
        let chunk_bytes = 65536u64;
        let opts = AssembleOptions {
            journal_lone_answers: true,
            ..AssembleOptions::new(reference())
        };
        let (io, array) = journal_array_with(level, members, chunk_bytes, 16, 9, opts);
        array.set_integrity_tick(false);
        let k = array.geometry().data_per_stripe() as u64;
        assert_eq!(k, 4, "{level}");
        let stripe_bytes = array.geometry().stripe_bytes();
        let mut model = BlockModel::new(array.size_bytes());
        let mut rng = SplitMix64::new(13);
        let mut from_log = Vec::new();
        let writes = 3 * stripe_bytes / write_bytes;
        for i in 0..writes {
            let at = stripe_bytes + i * write_bytes;
            let bytes = random_bytes(&mut rng, write_bytes as usize);
            let answered = answered_from_log(&array, at, &bytes);
            from_log.push(answered);
            model.write(at, &bytes, WriteOutcome::Acked { durable: answered });
            if i + 1 < writes {
                // Flushed and the log's records retired before the next write arrives, as the integrity tick
                // does on a running array between a client's writes (a live data entry in the stripe would send
                // the next write the journal's way whatever it continues).
                array.flush().expect("flush");
                model.flushed();
                array.run_integrity_tick().expect("integrity tick");
            }
        }
        let ends_a_stripe =
            |i: u64| (stripe_bytes + (i + 1) * write_bytes).is_multiple_of(stripe_bytes);
        let expected: Vec<bool> = (0..writes).map(|i| i == 0 || ends_a_stripe(i)).collect();
        assert_eq!(
            from_log, expected,
            "{level}: which writes of the stream were answered from the log"
        );
        for missing in 0..members {
            let images = io.inner().crash(missing as u64, CrashPolicy::Random).images;
            let what = format!("{level}, member {missing} missing at restart");
            check_with_a_member_missing(images, missing, &mut model.clone(), &what);
        }
        drop(array);
    }
}

/// Write-back asks the gate before it holds a write (`Array::early_answers_refused`): with the CPU busy a
/// write through `WriteBack::write_answering` (the NBD server's way) or `WriteBack::write` (the pool's) is neither
/// held nor answered early, and counts once as busy; with CPU to spare both are held and answered from the log.
/// Every write reads back, through write-back and through the array.
#[test]
fn write_back_holds_no_write_the_gate_sends_the_logs_way() {
    for (level, members) in [(Level::Raid5, 5), (Level::Raid6, 6)] {
        let chunk_bytes = 16384;
        let cpu = Arc::new(CountingCpu::default());
        let opts = AssembleOptions {
            journal_lone_answers: true,
            spare_cpu: Some(cpu.clone()),
            ..AssembleOptions::new(reference())
        };
        let (_gate, array) = gated_journal_array(level, members, chunk_bytes, opts);
        let wb = WriteBack::new(&array, CONFIG);
        let stripe_bytes = chunk_bytes * array.geometry().data_per_stripe() as u64;
        let mut written: Vec<(u64, Vec<u8>)> = Vec::new();
        // (held, answered from the log, counted busy) after each step.
        let counts = |wb: &WriteBack| {
            let s = wb.stats();
            (
                s.held_writes,
                s.answered_from_log,
                array.integrity().log_cpu_busy,
            )
        };
        cpu.set(Spare::Busy);
        let (at, page) = (stripe_bytes + 4096, vec![0x5au8; 4096]);
        let early = std::cell::Cell::new(false);
        wb.write_answering(at, &page, false, &|| early.set(true))
            .expect("write_answering, busy");
        assert!(!early.get(), "{level}: answered early with the CPU busy");
        written.push((at, page));
        assert_eq!(counts(&wb), (0, 0, 1), "{level}: write_answering, busy");
        let (at, page) = (3 * stripe_bytes + 8192, vec![0xa5u8; 4096]);
        let answered = wb.write_answered(at, &page, false).expect("write, busy");
        assert_eq!(answered, Answered::Written, "{level}: the pool's way, busy");
        written.push((at, page));
        assert_eq!(counts(&wb), (0, 0, 2), "{level}: write, busy");

        cpu.set(Spare::ForAll);
        let (at, page) = (5 * stripe_bytes + 4096, vec![0x3cu8; 4096]);
        let early = std::cell::Cell::new(false);
        wb.write_answering(at, &page, false, &|| early.set(true))
            .expect("write_answering, spare");
        assert!(early.get(), "{level}: not answered early with CPU to spare");
        written.push((at, page));
        assert_eq!(counts(&wb), (1, 1, 2), "{level}: write_answering, spare");
        let (at, page) = (7 * stripe_bytes + 8192, vec![0xc3u8; 4096]);
        let answered = wb.write_answered(at, &page, false).expect("write, spare");
        assert_eq!(
            answered,
            Answered::FromLog,
            "{level}: the pool's way, spare"
        );
        written.push((at, page));
        wb.flush().expect("flush");
        assert_eq!(counts(&wb), (2, 2, 2), "{level}: write, spare");
        for (at, page) in &written {
            let mut back = vec![0u8; 4096];
            wb.read(*at, &mut back).expect("read through write-back");
            assert!(back == *page, "{level}: byte {at} reads back other bytes");
            array.read(*at, &mut back).expect("read");
            assert!(
                back == *page,
                "{level}: byte {at} reads back other bytes from the array"
            );
        }
    }
}

/// At depth, with the CPU to spare (`Spare::ForAll`), a write beside others awaiting their answers is answered
/// from the log only where the members do not queue requests (array/queueing.rs): on members bound by their
/// request rate the writes find the members queueing and take the log's own way (counted `log_members_queue`),
/// while a lone write is still answered early; on members bound by their latency every write may be. Four writers
/// at depth on each kind, RAID5 and RAID6; every write reads back.
#[test]
fn at_depth_early_answers_go_where_the_members_do_not_queue() {
    const WRITERS: u64 = 4;
    const WRITES_EACH: u64 = 120;
    for (level, members) in [(Level::Raid5, 5), (Level::Raid6, 6)] {
        let chunk_bytes = 16384;
        let rows = 64;
        let bytes = member_bytes(chunk_bytes, rows);
        // Bound by their request rate: each read or write takes 400 µs of its member, one after another.
        let rate: Arc<dyn MemberIo> = Arc::new(RateMembers::new(
            MemMembers::new(members, bytes),
            Duration::from_micros(400),
        ));
        // Bound by their latency: every batch takes 400 µs, batches side by side.
        let latency = Arc::new(FaultyMembers::new(MemMembers::new(members, bytes), 1));
        latency.add(
            Scope::all(),
            Fault::Delay {
                delay: Duration::from_micros(400),
                one_in: 1,
                sleep: true,
            },
        );
        let latency: Arc<dyn MemberIo> = latency;
        for (kind, io) in [("rate-bound", rate), ("latency-bound", latency)] {
            create_io(io.as_ref(), level, chunk_bytes, "queues").expect("create_io");
            let cpu = Arc::new(CountingCpu::default());
            cpu.set(Spare::ForAll);
            let opts = AssembleOptions {
                journal: true,
                journal_lone_answers: true,
                spare_cpu: Some(cpu.clone()),
                watch_member_queues: true,
                ..AssembleOptions::new(reference())
            };
            let array = assemble_io(io.clone(), opts).expect("assemble_io");
            let pages = array.size_bytes() / 4096;
            let answered = std::sync::atomic::AtomicU64::new(0);
            std::thread::scope(|scope| {
                for writer in 0..WRITERS {
                    let (array, answered) = (&array, &answered);
                    scope.spawn(move || {
                        for n in 0..WRITES_EACH {
                            // Each writer its own pages, spread over the array.
                            let page = (n * 7919 * WRITERS + writer) % pages;
                            let page = page - page % WRITERS + writer;
                            let data = vec![(writer * 31 + n) as u8; 4096];
                            array
                                .write_answering(page * 4096, &data, &|| {
                                    answered.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                })
                                .expect("write");
                        }
                    });
                }
            });
            let r = array.integrity();
            eprintln!(
                "{level} {kind}: {} windows fitted, {} queueing; {} writes sent the log's way as the members \
                 queue, {} answered from the log, {} not lone",
                r.member_queue_windows,
                r.member_queue_windows_queueing,
                r.log_members_queue,
                answered.load(std::sync::atomic::Ordering::Relaxed),
                r.log_not_lone
            );
            assert!(
                r.member_queue_windows >= 3,
                "{level} {kind}: too few batches to fit"
            );
            assert_eq!(r.log_cpu_busy, 0, "{level} {kind}");
            if kind == "rate-bound" {
                assert!(
                    r.member_queue_windows_queueing * 2 > r.member_queue_windows,
                    "{level} {kind}: the members were seen queueing in too few windows"
                );
                assert!(
                    r.log_members_queue > WRITERS * WRITES_EACH / 4,
                    "{level} {kind}: too few writes took the log's way ({})",
                    r.log_members_queue
                );
            } else {
                assert_eq!(
                    r.member_queue_windows_queueing, 0,
                    "{level} {kind}: members serving side by side were seen queueing"
                );
                assert_eq!(r.log_members_queue, 0, "{level} {kind}");
                assert_eq!(r.log_not_lone, 0, "{level} {kind}");
            }
            for writer in 0..WRITERS {
                let mut last: std::collections::HashMap<u64, u8> = Default::default();
                for n in 0..WRITES_EACH {
                    let page = (n * 7919 * WRITERS + writer) % pages;
                    last.insert(page - page % WRITERS + writer, (writer * 31 + n) as u8);
                }
                for (page, value) in last {
                    let mut back = vec![0u8; 4096];
                    array.read(page * 4096, &mut back).expect("read");
                    assert!(
                        back.iter().all(|b| *b == value),
                        "{level} {kind}: page {page} reads back other bytes"
                    );
                }
            }
        }
    }
}

/// RAID5 in journal mode: partial parity entries may leave the P member's ring for a written chunk's member's
/// (ppl/spread.rs), as without the journal, beside data entries, which stay on the P member's ring and their
/// chunk's member's and count among their stripe's rings. A RAID5 of four, filled and flushed, then nothing
/// flushed: in even stripes chunk 0 answered from the log (a data entry), then chunk 2 written the log's way (the
/// gate says busy); in odd stripes chunks 1 and 2 the log's way, whose partial parity alone may leave the P ring.
/// After a kill (every member write applied), each member missing at restart in turn: every write reads back.
/// (Torn writes beside spread entries in journal mode are the power-loss tests' and the simulator's: their RAID5
/// rounds spread too.)
#[test]
fn raid5_journal_entries_leave_the_parity_ring_beside_data_entries_and_survive_a_kill() {
    let chunk_bytes = 16384u64;
    let cpu = Arc::new(CountingCpu::default());
    let opts = AssembleOptions {
        journal_lone_answers: true,
        spare_cpu: Some(cpu.clone()),
        ..AssembleOptions::new(reference())
    };
    let (io, array) = journal_array_with(Level::Raid5, 4, chunk_bytes, 24, 41, opts);
    array.set_integrity_tick(false);
    let g = array.geometry();
    let k = g.data_per_stripe() as u64;
    let mut model = BlockModel::new(array.size_bytes());
    let mut rng = SplitMix64::new(41);
    cpu.set(Spare::Busy);
    let fill = random_bytes(&mut rng, array.size_bytes() as usize);
    array.write(0, &fill, false).expect("fill");
    array.flush().expect("flush");
    model.write(0, &fill, WriteOutcome::Acked { durable: true });
    model.flushed();
    let mut answered_early = 0;
    for stripe in 0..g.stripes() {
        let writes: [(u64, Spare); 2] = if stripe % 2 == 0 {
            [(0, Spare::ForAll), (2, Spare::Busy)]
        } else {
            [(1, Spare::Busy), (2, Spare::Busy)]
        };
        for (index, spare) in writes {
            cpu.set(spare);
            let at = (stripe * k + index) * chunk_bytes + 4096 * (stripe % 4);
            let page = random_bytes(&mut rng, 4096);
            let early = std::cell::Cell::new(false);
            array
                .write_answering(at, &page, &|| early.set(true))
                .expect("write");
            answered_early += usize::from(early.get());
            model.write(at, &page, WriteOutcome::Acked { durable: true });
        }
    }
    let report = array.integrity();
    assert!(
        report.log_entries_off_parity > 0,
        "no entry left the P member's ring: nothing tested ({report:?})"
    );
    assert_eq!(
        answered_early as u64,
        g.stripes().div_ceil(2),
        "the even stripes' first writes are answered from the log (data entries)"
    );
    let images = io.inner().crash(1, CrashPolicy::KeepAll).images;
    drop(array);
    for missing in 0..4 {
        let mut model = model.clone();
        assemble_and_check(
            images.clone(),
            &[missing],
            &mut model,
            &format!("a kill, member {missing} missing at restart"),
        );
    }
}
