//! Writes queued on a busy stripe, combined (engine `array/gather.rs`): partial writes that come for a stripe while
//! another partial write is at work in it are written together once it is free, as one read-modify-write with one
//! log entry. Every byte lands where its write put it, parity stays right, two extents in one chunk are written
//! apart, and after a power loss with a member missing every acknowledged and flushed block reads back.

mod common_sim;

use std::sync::Arc;
use std::time::Duration;

use common_sim::*;

const CHUNK_BYTES: u64 = 16 << 10;
const ROWS: u64 = 16;
/// The stripe the writes go to.
const STRIPE: u64 = 5;

/// A write: its array offset and bytes.
type Write = (u64, Vec<u8>);

/// The writes of one round into `STRIPE`: the holder's, into data chunk 0, then 4 KiB into every other data chunk
/// at page 2, plus one more into chunk 1 at page 0 and one into chunk 0 at page 3 (two extents of one chunk: written
/// apart).
fn round_writes(g: &Geometry, rng: &mut SplitMix64) -> (Write, Vec<Write>) {
    let base = STRIPE * g.stripe_bytes();
    let holder = (base + 4096, random_bytes(rng, 4096));
    let mut queued: Vec<Write> = (1..g.data_per_stripe() as u64)
        .map(|chunk| (base + chunk * CHUNK_BYTES + 8192, random_bytes(rng, 4096)))
        .collect();
    queued.push((base + CHUNK_BYTES, random_bytes(rng, 4096)));
    queued.push((base + 12288, random_bytes(rng, 2048)));
    (holder, queued)
}

/// Runs rounds of `round_writes` (the holder's write, then the others 10 ms later, each on its own thread, while
/// every member write takes `slow_ms` longer) until a round queued, at most 10; returns the rounds run. Every
/// write goes in the model as acknowledged.
fn queue_rounds(array: &Arc<Array>, io: &Stack, model: &mut BlockModel, slow_ms: u64) -> u64 {
    let g = array.geometry();
    let mut rng = SplitMix64::new(0xc0b1);
    let slow = slow_writes(io, slow_ms);
    let mut rounds = 0;
    while rounds < 10 && array.gather_stats().queued == 0 {
        rounds += 1;
        let (holder, queued) = round_writes(&g, &mut rng);
        std::thread::scope(|s| {
            let first = s.spawn(|| array.write(holder.0, &holder.1, false));
            std::thread::sleep(Duration::from_millis(10));
            let rest: Vec<_> = queued
                .iter()
                .map(|(offset, bytes)| s.spawn(move || array.write(*offset, bytes, false)))
                .collect();
            first.join().unwrap().expect("the holder's write");
            for r in rest {
                r.join().unwrap().expect("a queued write");
            }
        });
        for (offset, bytes) in std::iter::once(&holder).chain(&queued) {
            model.write(*offset, bytes, WriteOutcome::Acked { durable: false });
        }
    }
    io.remove(slow);
    rounds
}

#[test]
fn writes_queued_on_a_busy_stripe_are_written_together() {
    for (level, members) in [(Level::Raid6, 6), (Level::Raid5, 5)] {
        let (io, array) = new_array(level, members, CHUNK_BYTES, ROWS, 11, reference());
        let array = Arc::new(array);
        let g = array.geometry();
        let mut model = fill(&array, &mut SplitMix64::new(1));
        let entries_before = array.integrity().log_entries;
        let rounds = queue_rounds(&array, &io, &mut model, 30);
        let stats = array.gather_stats();
        eprintln!("{level}: {stats:?} after {rounds} round(s)");
        assert!(
            stats.queued >= 1,
            "{level}, {rounds} rounds: nothing queued: {stats:?}"
        );
        assert!(
            stats.joined >= 1,
            "{level}: a queued gather nobody joined: {stats:?}"
        );
        // Each round logs its holder's entry and its gathers'; written one by one it would log one per write.
        let writes = rounds * (g.data_per_stripe() as u64 + 2);
        let entries = array.integrity().log_entries - entries_before;
        assert!(
            entries < writes,
            "{level}: {entries} log entries for {writes} writes"
        );
        verify_all(
            &array,
            &mut model,
            &format!("{level} after combined writes"),
        );
        array.flush().expect("flush");
        let data_offset = array.data_offset_bytes();
        let settled = model.settled_bytes();
        drop(array);
        let audit = audit_images(&g, data_offset, &io.inner().images(), settled.as_deref());
        assert!(audit.clean(), "{level}: {audit:?}");
    }
}

/// With combining off (`AssembleOptions::combine_queued_writes`), the same writes queue on the stripe's lock one
/// by one: nothing is queued in a gather.
#[test]
fn with_combining_off_queued_writes_go_one_by_one() {
    let io = Arc::new(FaultyMembers::new(
        CrashMembers::new(6, member_bytes(CHUNK_BYTES, ROWS)),
        5,
    ));
    create_io(io.as_ref(), Level::Raid6, CHUNK_BYTES, "combine-off").expect("create_io");
    let mut opts = AssembleOptions::new(reference());
    opts.combine_queued_writes = false;
    let array = Arc::new(assemble_io(io.clone(), opts).expect("assemble_io"));
    let mut model = fill(&array, &mut SplitMix64::new(2));
    let rounds = queue_rounds(&array, &io, &mut model, 20);
    assert_eq!((rounds, array.gather_stats().queued), (10, 0));
    verify_all(&array, &mut model, "combining off");
}

/// Power lost while combined writes are written, one member missing at restart: every block acknowledged and
/// flushed before reads back exactly; the rest reads old or new (beyond the write-hole limit of the missing
/// member's own blocks being written).
#[test]
fn power_loss_during_combined_writes_keeps_every_flushed_block() {
    let mut queued = 0;
    for seed in 0..4u64 {
        let (io, array) = new_array(Level::Raid6, 6, CHUNK_BYTES, ROWS, seed, reference());
        let array = Arc::new(array);
        let g = array.geometry();
        let mut model = fill(&array, &mut SplitMix64::new(seed));
        let mut rng = SplitMix64::new(seed ^ 0x5eed);
        // Cut after a random number of member writes, within the round's (each round writes a few dozen).
        io.inner().cut_power_after_writes(rng.below(40));
        let slow = slow_writes(&io, 15);
        let (holder, rest) = round_writes(&g, &mut rng);
        let writer = &array;
        let outcomes: Vec<bool> = std::thread::scope(|s| {
            let first = s.spawn(|| writer.write(holder.0, &holder.1, false).is_ok());
            std::thread::sleep(Duration::from_millis(5));
            let others: Vec<_> = rest
                .iter()
                .map(|(offset, bytes)| s.spawn(move || writer.write(*offset, bytes, false).is_ok()))
                .collect();
            std::iter::once(first)
                .chain(others)
                .map(|h| h.join().unwrap())
                .collect()
        });
        io.remove(slow);
        queued += array.gather_stats().queued;
        for ((offset, bytes), ok) in std::iter::once(&holder).chain(&rest).zip(&outcomes) {
            let outcome = if *ok {
                WriteOutcome::Acked { durable: false }
            } else {
                WriteOutcome::Failed
            };
            model.write(*offset, bytes, outcome);
        }
        drop(array);
        io.inner().cut_power();
        let missing = rng.below(6) as usize;
        let mut images = io.inner().crash(rng.next_u64(), CrashPolicy::Random).images;
        images[missing] = None;
        let (_io, array) =
            assemble_images(images, seed, reference()).expect("assemble after the power loss");
        assert!(array.wait_idle(Duration::from_secs(30)), "resync finished");
        let mut all = vec![0u8; array.size_bytes() as usize];
        array.read(0, &mut all).expect("read after the power loss");
        let forgive = |block: u64| g.map(block * BLOCK_BYTES as u64, 0).member == missing;
        model
            .check_after_crash_forgiving(&all, forgive)
            .unwrap_or_else(|m| panic!("seed {seed}, member {missing} missing: {m}"));
    }
    eprintln!("{queued} gathers queued across the seeds");
}
