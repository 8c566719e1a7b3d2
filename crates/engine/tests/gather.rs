//! Write gathering (engine `array/gather.rs`): sequential partial-stripe writes in flight together become
//! full-stripe writes, every byte lands where its write put it, parity stays right, and a failure reaches
//! every gathered write.

mod common;
mod integrity_common;

use std::sync::mpsc::sync_channel;
use std::sync::{Arc, Mutex};

use common::{data_areas, mem_array, verify_members, Rng};
use integrity_common::{member_of_block, CrashPolicy, Model, SplitMix64};
use paraid_engine::layout::Level;
use paraid_engine::superblock::DEFAULT_DATA_OFFSET_BYTES;
use paraid_engine::{Array, EngineError, MemMembers};
use std::time::Duration;

const CHUNK_BYTES: u64 = 64 << 10;

/// Each write's outcome, by its index in the stream (filled in by the worker that ran it).
type Outcomes = Arc<Mutex<Vec<Option<Result<(), EngineError>>>>>;

/// Writes `writes` (offset, bytes) in order through `depth` worker threads fed from a queue `depth` deep, as an
/// NBD client at that queue depth would; returns each write's outcome, in the order given.
fn pipelined(
    array: &Arc<Array>,
    writes: Vec<(u64, Vec<u8>)>,
    depth: usize,
) -> Vec<Result<(), EngineError>> {
    let count = writes.len();
    let outcomes: Outcomes = Arc::new(Mutex::new((0..count).map(|_| None).collect()));
    let (send, receive) = sync_channel::<(usize, u64, Vec<u8>)>(depth);
    let receive = Arc::new(Mutex::new(receive));
    let workers: Vec<_> = (0..depth)
        .map(|_| {
            let (array, receive, outcomes) = (array.clone(), receive.clone(), outcomes.clone());
            std::thread::spawn(move || loop {
                let next = receive.lock().unwrap().recv();
                let Ok((i, offset, bytes)) = next else { return };
                let outcome = array.write(offset, &bytes, false);
                outcomes.lock().unwrap()[i] = Some(outcome);
            })
        })
        .collect();
    for (i, (offset, bytes)) in writes.into_iter().enumerate() {
        send.send((i, offset, bytes)).expect("workers alive");
    }
    drop(send);
    for w in workers {
        w.join().expect("worker");
    }
    let outcomes = std::mem::take(&mut *outcomes.lock().unwrap());
    outcomes
        .into_iter()
        .map(|o| o.expect("every write ran"))
        .collect()
}

/// A sequential stream of `piece_bytes` writes from byte 0 over `stripes` stripes, random contents.
fn stream(stripe_bytes: u64, stripes: u64, piece_bytes: u64, seed: u64) -> Vec<(u64, Vec<u8>)> {
    let mut rng = Rng::new(seed);
    (0..stripes * stripe_bytes / piece_bytes)
        .map(|i| {
            let mut bytes = vec![0u8; piece_bytes as usize];
            rng.fill(&mut bytes);
            (i * piece_bytes, bytes)
        })
        .collect()
}

fn model_of(writes: &[(u64, Vec<u8>)], size_bytes: u64) -> Vec<u8> {
    let mut model = vec![0u8; size_bytes as usize];
    for (offset, bytes) in writes {
        model[*offset as usize..*offset as usize + bytes.len()].copy_from_slice(bytes);
    }
    model
}

/// Sends the writes `round` makes (each round covers the same bytes with new data) through `pipelined` at
/// `depth` until the array has gathered a full stripe, at most 20 rounds; returns the last round's model and the
/// rounds sent. The timing of threads decides how many writes gather: a leader waits at most 20 ms for the rest
/// of its stripe, and on a loaded 2-core machine the next writer may not run that soon, so one round may gather
/// none.
fn stream_until_gathered(
    array: &Arc<Array>,
    depth: usize,
    round: impl Fn(u64) -> Vec<(u64, Vec<u8>)>,
) -> (Vec<u8>, u64) {
    let mut model = Vec::new();
    let mut rounds = 0;
    while rounds < 20 && array.gather_stats().full_stripes == 0 {
        let writes = round(rounds);
        model = model_of(&writes, array.size_bytes());
        for outcome in pipelined(array, writes, depth) {
            outcome.expect("write");
        }
        rounds += 1;
    }
    (model, rounds)
}

/// The array reads back `model`; flushed and closed, every stripe of the members' images has parity matching
/// `model`.
fn reads_back_with_parity(io: &MemMembers, array: Arc<Array>, model: &[u8], what: &str) {
    let g = array.geometry();
    let mut back = vec![0u8; array.size_bytes() as usize];
    array.read(0, &mut back).expect("read");
    assert!(back == model, "{what}: contents differ");
    array.flush().expect("flush");
    drop(array);
    let images: Vec<Option<Vec<u8>>> = (0..g.members).map(|s| io.image(s)).collect();
    verify_members(
        &g,
        &data_areas(&images, DEFAULT_DATA_OFFSET_BYTES, &g),
        model,
    );
}

#[test]
fn a_pipelined_stream_of_half_stripe_writes_becomes_full_stripe_writes() {
    for (level, members) in [(Level::Raid6, 6), (Level::Raid5, 5)] {
        let (io, array) = mem_array(level, members, CHUNK_BYTES, 64);
        let array = Arc::new(array);
        let g = array.geometry();
        let stripe_bytes = CHUNK_BYTES * g.data_per_stripe() as u64;
        let (model, rounds) = stream_until_gathered(&array, 8, |round| {
            stream(stripe_bytes, 64, stripe_bytes / 2, 7 + round)
        });
        let stats = array.gather_stats();
        assert!(
            stats.full_stripes >= 1,
            "{level}, {rounds} rounds: {stats:?}"
        );
        assert!(stats.joined >= stats.full_stripes, "{level}: {stats:?}");
        eprintln!("{level}: {stats:?} after {rounds} round(s)");
        reads_back_with_parity(&io, array, &model, &format!("{level}"));
    }
}

/// Streams whose requests do not divide the stripe: a request's piece in its last stripe leads that stripe's
/// gather and the next request's piece in its first stripe completes it (128 KiB requests into 192 KiB stripes,
/// 1 MiB requests into 320 KiB stripes), with the whole stripes between written at once.
#[test]
fn unaligned_streams_gather_across_request_boundaries() {
    for (level, members, piece_bytes) in [
        (Level::Raid5, 4usize, 128u64 << 10),
        (Level::Raid6, 7, 1 << 20),
    ] {
        let (io, array) = mem_array(level, members, CHUNK_BYTES, 96);
        let array = Arc::new(array);
        let size = array.size_bytes();
        let (model, rounds) = stream_until_gathered(&array, 8, |round| {
            let mut rng = Rng::new(members as u64 + 100 * round);
            (0..size / piece_bytes)
                .map(|i| {
                    let mut bytes = vec![0u8; piece_bytes as usize];
                    rng.fill(&mut bytes);
                    (i * piece_bytes, bytes)
                })
                .collect()
        });
        let stats = array.gather_stats();
        assert!(
            stats.full_stripes >= 1,
            "{level}/{members}, {rounds} rounds: {stats:?}"
        );
        reads_back_with_parity(&io, array, &model, &format!("{level}/{members}"));
    }
}

#[test]
fn quarter_stripe_writes_gather_by_more_than_two() {
    let (_io, array) = mem_array(Level::Raid6, 6, CHUNK_BYTES, 64);
    let array = Arc::new(array);
    let stripe_bytes = CHUNK_BYTES * 4;
    let (model, rounds) = stream_until_gathered(&array, 16, |round| {
        stream(stripe_bytes, 64, stripe_bytes / 4, 11 + round)
    });
    let mut back = vec![0u8; array.size_bytes() as usize];
    array.read(0, &mut back).expect("read");
    assert!(back == model, "contents differ");
    let stats = array.gather_stats();
    assert!(stats.full_stripes >= 1, "{rounds} rounds: {stats:?}");
}

/// At queue depth 1 the next write cannot come before this one is answered: nobody waits for it.
#[test]
fn a_write_alone_in_flight_never_waits() {
    let (_io, array) = mem_array(Level::Raid6, 6, CHUNK_BYTES, 16);
    let stripe_bytes = CHUNK_BYTES * 4;
    let writes = stream(stripe_bytes, 16, stripe_bytes / 2, 3);
    for (offset, bytes) in &writes {
        array.write(*offset, bytes, false).expect("write");
    }
    let stats = array.gather_stats();
    assert_eq!(
        (stats.full_stripes, stats.timed_out, stats.joined),
        (0, 0, 0)
    );
    let mut back = vec![0u8; array.size_bytes() as usize];
    array.read(0, &mut back).expect("read");
    assert!(back == model_of(&writes, array.size_bytes()));
}

/// A degraded array (one member missing) gathers too, and what it wrote reads back.
#[test]
fn a_degraded_array_gathers_and_reads_back() {
    let (io, array) = mem_array(Level::Raid5, 5, CHUNK_BYTES, 64);
    drop(array);
    io.remove(2);
    let array = Arc::new(
        paraid_engine::assemble_io(
            io.clone(),
            paraid_engine::AssembleOptions::new(common::reference()),
        )
        .expect("assemble degraded"),
    );
    let stripe_bytes = CHUNK_BYTES * 4;
    let (model, rounds) = stream_until_gathered(&array, 8, |round| {
        stream(stripe_bytes, 64, stripe_bytes / 2, 5 + round)
    });
    let mut back = vec![0u8; array.size_bytes() as usize];
    array.read(0, &mut back).expect("read");
    assert!(back == model, "contents differ");
    assert!(
        array.gather_stats().full_stripes >= 1,
        "{rounds} rounds: {:?}",
        array.gather_stats()
    );
}

/// An array beyond tolerance fails every write, gathered ones included: none is acknowledged.
#[test]
fn every_gathered_write_gets_the_failure() {
    let (io, array) = mem_array(Level::Raid5, 5, CHUNK_BYTES, 64);
    let array = Arc::new(array);
    io.remove(1);
    io.remove(3);
    let stripe_bytes = CHUNK_BYTES * 4;
    let writes = stream(stripe_bytes, 32, stripe_bytes / 2, 9);
    let outcomes = pipelined(&array, writes, 8);
    let acknowledged = outcomes.iter().filter(|o| o.is_ok()).count();
    assert_eq!(
        acknowledged, 0,
        "writes to an array beyond tolerance were acknowledged"
    );
}

/// A stream whose client sends each write after the one before was answered (a database's log) never leads a
/// gather, even with other writes in flight beside it: its continuation cannot come while it waits (stop 56;
/// before, such a write led whenever anything else was in flight, and waited in vain).
#[test]
fn a_stream_written_one_at_a_time_never_leads_beside_other_writes() {
    let (_io, array) = mem_array(Level::Raid6, 6, CHUNK_BYTES, 64);
    let array = Arc::new(array);
    let stripe_bytes = CHUNK_BYTES * 4;
    let size = array.size_bytes();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Other writes kept in flight: random 4 KiB writes into the array's second half, from two threads.
    let others: Vec<_> = (0..2u64)
        .map(|t| {
            let (array, stop) = (array.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut rng = Rng::new(40 + t);
                let mut bytes = vec![0u8; 4096];
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    rng.fill(&mut bytes);
                    let block = size / 2 / 4096 + rng.below(size / 2 / 4096);
                    array.write(block * 4096, &bytes, false).expect("write");
                }
            })
        })
        .collect();
    let writes = stream(stripe_bytes, 16, stripe_bytes / 2, 5);
    let started = std::time::Instant::now();
    for (offset, bytes) in &writes {
        array.write(*offset, bytes, false).expect("write");
    }
    let took = started.elapsed();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for t in others {
        t.join().expect("writer");
    }
    let stats = array.gather_stats();
    assert_eq!((stats.full_stripes, stats.timed_out), (0, 0), "{stats:?}");
    eprintln!("{} stream writes in {took:?}", writes.len());
    let mut back = vec![0u8; stripe_bytes as usize * 16];
    array.read(0, &mut back).expect("read");
    assert!(back == model_of(&writes, stripe_bytes * 16)[..]);
}

/// Random small writes (not a stream) are never held back, and land.
#[test]
fn random_writes_do_not_lead_gathers() {
    let (_io, array) = mem_array(Level::Raid6, 6, CHUNK_BYTES, 64);
    let array = Arc::new(array);
    let size = array.size_bytes();
    let mut rng = Rng::new(21);
    let mut writes = Vec::new();
    let mut used = std::collections::HashSet::new();
    while writes.len() < 400 {
        let block = rng.below(size / 4096);
        if !used.insert(block) || used.contains(&(block.wrapping_sub(1))) {
            continue; // distinct blocks that never continue one another
        }
        let mut bytes = vec![0u8; 4096];
        rng.fill(&mut bytes);
        writes.push((block * 4096, bytes));
    }
    let model = model_of(&writes, size);
    for outcome in pipelined(&array, writes, 8) {
        outcome.expect("write");
    }
    let stats = array.gather_stats();
    assert_eq!((stats.full_stripes, stats.timed_out), (0, 0), "{stats:?}");
    let mut back = vec![0u8; size as usize];
    array.read(0, &mut back).expect("read");
    assert!(back == model);
}

/// Power lost in the middle of a pipelined stream whose stripes are being gathered, one member missing at restart:
/// every block flushed before reads back exactly, every other block reads one of the values written to it, except
/// blocks of the missing member that were being written (the documented write-hole limit, docs/reliability.md).
#[test]
fn power_loss_mid_stream_keeps_every_flushed_block() {
    let mut gathered = 0;
    for seed in 0..6u64 {
        let (io, array) = integrity_common::crash_array(Level::Raid6, 6, CHUNK_BYTES, 32, true);
        let array = Arc::new(array);
        let g = array.geometry();
        let size = array.size_bytes();
        let stripe_bytes = CHUNK_BYTES * 4;
        let mut model = Model::new(size);
        // A whole stream, acknowledged and flushed.
        let first = stream(stripe_bytes, 32, stripe_bytes / 2, seed);
        for outcome in pipelined(&array, first.clone(), 8) {
            outcome.expect("write before the power loss");
        }
        for (offset, bytes) in &first {
            model.write(*offset, bytes, Some(false));
        }
        array.flush().expect("flush");
        model.flushed();
        gathered += array.gather_stats().full_stripes;
        // A second stream over its first 24 stripes, of which the last 8 get only their first half (their
        // second halves stay durable while their stripes are written: the write hole's case), the power going
        // after a random number of member writes.
        let mut rng = SplitMix64::new(seed ^ 0x6a7e);
        io.cut_power_after_writes(rng.below(300));
        let second: Vec<(u64, Vec<u8>)> = stream(stripe_bytes, 24, stripe_bytes / 2, seed + 100)
            .into_iter()
            .filter(|(offset, _)| *offset < 16 * stripe_bytes || offset % stripe_bytes == 0)
            .collect();
        let outcomes = pipelined(&array, second.clone(), 8);
        for ((offset, bytes), outcome) in second.iter().zip(&outcomes) {
            model.write(*offset, bytes, outcome.is_ok().then_some(false));
        }
        drop(array);
        io.cut_power();
        let missing = rng.below(6) as usize;
        let mut images = io.crash(rng.next_u64(), CrashPolicy::Random).images;
        images[missing] = None;
        let (_io, array) = integrity_common::reassemble(images, true);
        assert!(array.wait_idle(Duration::from_secs(30)), "resync finished");
        let mut all = vec![0u8; size as usize];
        array.read(0, &mut all).expect("read after the power loss");
        let (durable_blocks, violations) =
            model.check_after_crash(&all, |b| member_of_block(&g, b) == missing);
        assert!(
            violations.is_empty(),
            "seed {seed}, member {missing} missing: {} violations, first {:?}",
            violations.len(),
            &violations[..violations.len().min(4)]
        );
        assert!(durable_blocks > 0);
    }
    assert!(gathered >= 1, "no stripe was gathered in any seed");
}

/// A stream the engine sees one request at a time (nothing else in flight: an emulated CPU reading each 1 MiB
/// payload off the socket) gathers where the frontend says the continuation has arrived
/// (`Array::note_write_follows`): the earlier request's last stripe waits for it, both are written as one full
/// stripe, and the earlier request is answered only then.
#[test]
fn a_write_whose_continuation_the_frontend_holds_leads_its_last_stripe() {
    let stripe_bytes = CHUNK_BYTES * 3;
    for told in [false, true] {
        let stats = continuations_reach_the_engine_late(stripe_bytes, told);
        let expected = if told { 4 } else { 0 };
        assert_eq!(
            (stats.full_stripes, stats.led_for_follower, stats.timed_out),
            (expected, expected, 0),
            "continuations told: {told}: {stats:?}"
        );
    }
}

/// Four pairs of requests, each pair a request and its continuation 3 ms later, nothing else in flight; with the
/// continuation told (`Array::note_write_follows`) before the first of each pair when `told`.
fn continuations_reach_the_engine_late(
    stripe_bytes: u64,
    told: bool,
) -> paraid_engine::GatherStats {
    let (io, array) = mem_array(Level::Raid6, 5, CHUNK_BYTES, 32);
    let array = Arc::new(array);
    // 1 1/2 stripes: each pair's first request ends in the middle of a stripe, its second at a stripe's end
    // (so that it leads nothing: its own continuation comes only after it is answered).
    let piece_bytes = stripe_bytes * 3 / 2;
    let writes = stream(stripe_bytes, 12, piece_bytes, 58);
    for pair in writes.chunks(2) {
        let [(first_at, first), (second_at, second)] = pair else {
            unreachable!("12 stripes of 1 1/2 stripe pieces: an even count")
        };
        assert_eq!(first_at + first.len() as u64, *second_at);
        if told {
            array.note_write_follows(*second_at);
        }
        let (array2, second, second_at) = (array.clone(), second.clone(), *second_at);
        let later = std::thread::spawn(move || {
            // The continuation reaches the engine a while after the write it continues.
            std::thread::sleep(Duration::from_millis(3));
            array2.write(second_at, &second, false)
        });
        let before = array.gather_stats();
        array.write(*first_at, first, false).expect("first");
        later.join().expect("second thread").expect("second");
        let after = array.gather_stats();
        assert_eq!(
            after.full_stripes - before.full_stripes,
            u64::from(told),
            "{after:?}"
        );
    }
    let stats = array.gather_stats();
    let model = model_of(&writes, array.size_bytes());
    reads_back_with_parity(&io, array, &model, "RAID6 of five");
    stats
}

/// A continuation told but never coming (its connection ended) holds a leader no longer than a gather waits,
/// and is then forgotten: the write lands alone.
#[test]
fn a_continuation_that_never_comes_holds_its_leader_only_briefly() {
    let (_io, array) = mem_array(Level::Raid6, 5, CHUNK_BYTES, 16);
    let stripe_bytes = CHUNK_BYTES * 3;
    let mut bytes = vec![0u8; (stripe_bytes + CHUNK_BYTES) as usize];
    Rng::new(5).fill(&mut bytes);
    array.note_write_follows(bytes.len() as u64);
    let started = std::time::Instant::now();
    array.write(0, &bytes, false).expect("write");
    let waited = started.elapsed();
    let stats = array.gather_stats();
    assert_eq!(
        (stats.led_for_follower, stats.timed_out),
        (1, 1),
        "{stats:?}"
    );
    assert!(waited < Duration::from_secs(1), "waited {waited:?}");
    // Forgotten: the next such write does not wait for it.
    std::thread::sleep(Duration::from_millis(30));
    array.write(0, &bytes, false).expect("again");
    assert_eq!(array.gather_stats().led_for_follower, 1);
    let mut back = vec![0u8; bytes.len()];
    array.read(0, &mut back).expect("read");
    assert!(back == bytes);
}
