//! Fault matrix row 11: a slow member (latency spikes on one member's I/O) must not fail anything, must not be
//! evicted, and must bound the array's tail latency to about the spikes themselves.

mod common_sim;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common_sim::*;

/// Runs a mixed workload of single-stripe reads and writes; returns each request's latency.
fn timed_workload(
    array: &Array,
    model: &mut BlockModel,
    seed: u64,
    requests: usize,
) -> Vec<Duration> {
    let g = array.geometry();
    let mut rng = SplitMix64::new(seed);
    let mut latencies = Vec::with_capacity(requests);
    for _ in 0..requests {
        let len = 1 + rng.below(g.stripe_bytes()) as usize;
        let offset = rng.below(g.array_bytes() - len as u64 + 1);
        if rng.one_in(2) {
            let mut data = vec![0u8; len];
            rng.fill(&mut data);
            let started = Instant::now();
            array
                .write(offset, &data, false)
                .expect("write under latency spikes");
            latencies.push(started.elapsed());
            model.write(offset, &data, WriteOutcome::Acked { durable: false });
        } else {
            latencies.push(timed_read(
                array,
                model,
                offset,
                len,
                "read under latency spikes",
            ));
        }
    }
    latencies
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let at = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[at]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

#[test]
fn row11_slow_member() {
    let spike = Duration::from_millis(20);
    let requests = 400;
    let filled = Filled::new(Level::Raid5, 4, 16384, 16, 1100);
    let mut report = Vec::new();
    let mut bounds = Vec::new();
    for spiky in [false, true] {
        let (io, array) = assemble_cow(&filled.base, &[], 11, reference()).expect("assemble");
        if spiky {
            io.add(
                Scope::slot(2),
                Fault::Delay {
                    delay: spike,
                    one_in: 10,
                    sleep: true,
                },
            );
        }
        let mut model = filled.model();
        let mut lat = timed_workload(&array, &mut model, 1111, requests);
        verify_all(&array, &mut model, "after the workload");
        for slot in 0..4 {
            assert_eq!(
                array.slot_state(slot),
                SlotState::Active,
                "no false failure"
            );
        }
        lat.sort();
        let (p50, p99, p999, max) = (
            percentile(&lat, 0.5),
            percentile(&lat, 0.99),
            percentile(&lat, 0.999),
            lat[lat.len() - 1],
        );
        let delayed = io.counts().delayed;
        if spiky {
            assert!(delayed > 0, "spikes injected");
            // A request is at most a read batch and a write batch: two spikes, plus what the run without spikes
            // needed, plus room for a loaded machine.
            let bound = 2 * spike + bounds[0] + Duration::from_millis(100);
            assert!(
                p999 <= bound,
                "p99.9 {:.1} ms beyond {:.1} ms",
                ms(p999),
                ms(bound)
            );
        }
        bounds.push(p999);
        report.push(format!(
            "{}: p50 {:.2} ms, p99 {:.2} ms, p99.9 {:.2} ms, max {:.2} ms{}",
            if spiky {
                "member 2 spiking"
            } else {
                "no spikes"
            },
            ms(p50),
            ms(p99),
            ms(p999),
            ms(max),
            if spiky {
                format!(" ({delayed} I/Os delayed {} ms)", spike.as_millis())
            } else {
                String::new()
            }
        ));
    }
    figure(
        "11",
        "row11_slow_member",
        &format!(
            "{requests} requests each, RAID5/4 in memory; {}; no request failed, no member evicted",
            report.join("; ")
        ),
    );
}

/// One read, checked against the model; how long it took.
fn timed_read(
    array: &Array,
    model: &mut BlockModel,
    offset: u64,
    len: usize,
    what: &str,
) -> Duration {
    let mut got = vec![0u8; len];
    let started = Instant::now();
    array
        .read(offset, &mut got)
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let took = started.elapsed();
    model
        .check_read(offset, &got)
        .unwrap_or_else(|m| panic!("{what}: {m}"));
    took
}

/// Reads, and their latencies, of random extents (the block model checks each one).
fn timed_reads(array: &Array, model: &mut BlockModel, seed: u64, reads: usize) -> Vec<Duration> {
    let g = array.geometry();
    let mut rng = SplitMix64::new(seed);
    let mut latencies = Vec::with_capacity(reads);
    for _ in 0..reads {
        let len = 1 + rng.below(g.stripe_bytes()) as usize;
        let offset = rng.below(g.array_bytes() - len as u64 + 1);
        latencies.push(timed_read(
            array,
            model,
            offset,
            len,
            "read around a slow member",
        ));
    }
    latencies.sort();
    latencies
}

/// Row 11, reads: once a member's latency stands far above its peers' (a few dozen of its I/Os), RAID6 and the
/// mirrors read around it, so a read no longer waits for its spikes; it stays in the array and is written as
/// before. RAID5 cannot check a chunk solved without it and keeps reading it.
#[test]
fn row11_reads_go_around_a_slow_member() {
    let spike = Duration::from_millis(20);
    let mut report = Vec::new();
    for (level, members) in [
        (Level::Raid6, 6),
        (Level::Raid10, 4),
        (Level::Raid1, 2),
        (Level::Raid5, 4),
    ] {
        let filled = Filled::new(level, members, 16384, 16, 1200);
        let (io, array) = assemble_cow(&filled.base, &[], 12, reference()).expect("assemble");
        let slow = 1;
        let spikes = io.add(
            Scope::slot(slow),
            Fault::Delay {
                delay: spike,
                one_in: 4,
                sleep: true,
            },
        );
        let spikes_so_far = || io.rule_counts(spikes).expect("rule").delayed;
        let mut model = filled.model();
        // Warm-up: the writes and reads that show the member slow.
        timed_workload(&array, &mut model, 1201, 60);
        let detail = array.detail();
        assert_eq!(
            detail.slow_member.slow_slot,
            Some(slow),
            "{level:?}: member {slow} found slow ({} us against {:?})",
            detail.members[slow].latency_us,
            detail
                .members
                .iter()
                .map(|m| m.latency_us)
                .collect::<Vec<_>>()
        );
        assert!(detail.members[slow].slow);
        let steered_before = detail.slow_member.steered_reads;
        let probes_before = detail.slow_member.probes;
        let reads_of_slow = count_reads(&io, slow);
        let delayed_before = spikes_so_far();
        let started = Instant::now();
        let reads = timed_reads(&array, &mut model, 1202, 300);
        let elapsed = started.elapsed();
        let slow_member = array.detail().slow_member;
        let steered = slow_member.steered_reads - steered_before;
        let probes = slow_member.probes - probes_before;
        let slow_read = io.rule_counts(reads_of_slow).expect("rule").matched;
        // Reads run one at a time and nothing else does I/O meanwhile but the prober: each spike injected now
        // held up one read or one probe.
        let spikes_met = spikes_so_far() - delayed_before;
        let (p50, p99, max) = (
            percentile(&reads, 0.5),
            percentile(&reads, 0.99),
            reads[reads.len() - 1],
        );
        verify_all(&array, &mut model, "after the reads");
        for slot in 0..members {
            assert_eq!(
                array.slot_state(slot),
                SlotState::Active,
                "no false failure"
            );
        }
        if level == Level::Raid5 {
            assert_eq!(steered, 0, "RAID5 reads are not steered");
            assert!(p99 >= spike, "RAID5 reads still meet the spikes");
        } else {
            assert!(
                steered > 0,
                "{level:?}: reads steered around the slow member"
            );
            // Only probes read the slow member, the prober's, one per 100 ms, beside the reads (none of which
            // waits for them): counted, not timed, since a loaded 2-core runner stalls a read by 10-15 ms now and
            // then (CI, stop 37), which says nothing about the steering. (Before stop 59 one steered read in 16
            // probed, and 4 of these 300 reads met a spike in debug builds: more than the 1 % a p99 hides.)
            assert_eq!(
                slow_read, probes,
                "{level:?}: member {slow} read {slow_read} times, {probes} of them probes"
            );
            assert!(spikes_met <= probes, "{level:?}: {spikes_met} spikes met");
            let probes_allowed = elapsed.as_millis() as u64 / 100 + 1;
            assert!(
                probes <= probes_allowed,
                "{level:?}: {probes} probes in {elapsed:?} (at most {probes_allowed})"
            );
        }
        report.push(format!(
            "{level:?}/{members}: read p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms, {steered} pieces read around it, \
             {probes} probes, {spikes_met} spikes met",
            ms(p50),
            ms(p99),
            ms(max)
        ));
    }
    figure(
        "11",
        "row11_reads_go_around_a_slow_member",
        &format!(
            "member 1 spiking 20 ms on 1 I/O in 4; 300 reads after 60 requests of warm-up: {}",
            report.join("; ")
        ),
    );
}

/// While the prober measures the slow member, no client read goes to it, however many are steered; without the
/// prober's clock (the simulator's setting), one steered read in 16 probes it instead.
#[test]
fn client_reads_probe_the_slow_member_only_where_no_prober_does() {
    for (interval, expect_client_probes) in
        [(Duration::from_secs(3600), false), (Duration::ZERO, true)]
    {
        let filled = Filled::new(Level::Raid6, 6, 16384, 16, 1250);
        let (io, array) = assemble_cow(&filled.base, &[], 12, reference()).expect("assemble");
        // Set before the member is found slow: the prober's first wait (100 ms) then gives way to this one.
        array.set_slow_probe_interval(interval);
        let slow = 1;
        every_io_late(&io, slow);
        let mut model = filled.model();
        timed_workload(&array, &mut model, 1251, 60);
        assert_eq!(
            array.detail().slow_member.slow_slot,
            Some(slow),
            "found slow"
        );
        let reads_of_slow = count_reads(&io, slow);
        let before = array.detail().slow_member;
        let _ = timed_reads(&array, &mut model, 1252, 320);
        let after = array.detail().slow_member;
        let steered = after.steered_reads - before.steered_reads;
        let probes = after.probes - before.probes;
        let slow_read = io.rule_counts(reads_of_slow).expect("rule").matched;
        assert!(steered >= 64, "{interval:?}: {steered} pieces steered");
        assert_eq!(slow_read, probes, "{interval:?}: only probes read it");
        if expect_client_probes {
            let decisions = steered + probes;
            assert!(
                probes >= decisions / 16 - 1 && probes <= decisions / 16 + 1,
                "one in 16: {probes} probes of {decisions}"
            );
        } else {
            assert_eq!(probes, 0, "no client read probes while the prober runs");
        }
    }
}

/// Every I/O of `slot` counts as 20 ms late (virtual delays: nothing sleeps), so the engine finds it slow.
fn every_io_late(io: &CowStack, slot: usize) {
    io.add(
        Scope::slot(slot),
        Fault::Delay {
            delay: Duration::from_millis(20),
            one_in: 1,
            sleep: false,
        },
    );
}

/// A RAID6 read solved around the slow member is checked against both parities: with the stripe's P rotten, it
/// does not check out, and the slow member's own (right) bytes are returned instead of a chunk solved from P.
#[test]
fn a_read_around_a_slow_member_that_does_not_check_out_reads_the_member() {
    let filled = Filled::new(Level::Raid6, 6, 16384, 16, 1300);
    let g = filled.geometry;
    let slow = 1;
    let chunk = g.chunk_bytes as usize;
    // Every stripe where the slow member holds data gets its P chunk rotted (a marker word in its first page).
    let mut images: Vec<Option<Vec<u8>>> = (*filled.base).clone();
    let mut rotten = Vec::new();
    for stripe in 0..g.rows {
        let holds_data = (0..g.data_per_stripe()).any(|i| g.stripe_member(stripe, i) == slow);
        if !holds_data {
            continue;
        }
        let p_member = g.stripe_member(stripe, g.data_per_stripe());
        let at = filled.data_offset_bytes as usize + stripe as usize * chunk;
        let image = images[p_member].as_mut().expect("present");
        image[at..at + 8].copy_from_slice(b"ROTTEN!!");
        rotten.push(stripe);
    }
    assert!(!rotten.is_empty());
    let base = Arc::new(images);
    let (io, array) = assemble_cow(&base, &[], 13, reference()).expect("assemble");
    every_io_late(&io, slow);
    let mut model = filled.model();
    let mut warm = 0;
    while array.detail().slow_member.slow_slot != Some(slow) {
        warm += 1;
        assert!(warm < 1000, "member {slow} never found slow");
        let mut page = vec![0u8; 4096];
        let offset = (warm * 4096) % (g.array_bytes() - 4096);
        array.read(offset, &mut page).expect("warm-up read");
        array.write(offset, &page, false).expect("warm-up write");
    }
    let mut got = vec![0u8; g.array_bytes() as usize];
    array.read(0, &mut got).expect("read everything");
    assert_eq!(
        first_wrong_block(&got, &filled.contents),
        None,
        "a chunk solved from rotten P was returned"
    );
    model.check_read(0, &got).unwrap_or_else(|m| panic!("{m}"));
    // The stripes whose P is intact were read around it.
    assert!(array.detail().slow_member.steered_reads > 0);
}

/// Row 11 with one member left: a RAID1 whose slow member is the only one active when it recovers leaves the slow
/// state with no peer to be measured against, and nothing fails (seed 60100647 of the simulator panicked there:
/// the others' median of no member); it returns at once, since no read could go around it.
#[test]
fn row11_a_slow_member_left_alone_recovers_without_peers() {
    let filled = Filled::new(Level::Raid1, 2, 16384, 16, 1200);
    let (io, array) = assemble_cow(&filled.base, &[], 12, reference()).expect("assemble");
    array.set_slow_probe_interval(Duration::from_millis(5));
    let spikes = io.add(Scope::slot(0), every_io_spike());
    let mut model = filled.model();
    timed_workload(&array, &mut model, 1501, 60);
    assert_eq!(array.detail().slow_member.slow_slot, Some(0), "found slow");
    array.fail_member(1).expect("fail the mirror");
    assert!(io.remove(spikes));
    // Quick again, alone: reads and writes reach it and it leaves the slow state (a review with it alone).
    timed_workload(&array, &mut model, 1502, 200);
    let slow_member = array.detail().slow_member;
    assert_eq!(slow_member.slow_slot, None);
    assert_eq!(
        slow_member.returning_slot, None,
        "alone, nothing to read around it: no gradual return"
    );
    verify_all(&array, &mut model, "with one member left");
}

/// The slot `recovered_slow_member` makes slow.
const RECOVERED_SLOT: usize = 1;

/// 20 ms on every I/O.
fn every_io_spike() -> Fault {
    Fault::Delay {
        delay: Duration::from_millis(20),
        one_in: 1,
        sleep: true,
    }
}

/// A RAID6 of six whose member `RECOVERED_SLOT` has just left the slow state (and so returns gradually).
struct Recovered {
    io: Arc<CowStack>,
    array: Array,
    model: BlockModel,
    /// From the spikes' end to the member leaving the slow state.
    left_after: Duration,
}

/// Member `RECOVERED_SLOT` slow on every I/O (`every_io_spike`) until a workload (`seed`) shows it slow, then
/// quick again until it leaves the slow state; the prober measures it every 5 ms, so that takes well under a
/// second.
fn recovered_slow_member(seed: u64) -> Recovered {
    let filled = Filled::new(Level::Raid6, 6, 16384, 16, 1200);
    let (io, array) = assemble_cow(&filled.base, &[], 12, reference()).expect("assemble");
    array.set_slow_probe_interval(Duration::from_millis(5));
    let spikes = io.add(Scope::slot(RECOVERED_SLOT), every_io_spike());
    let mut model = filled.model();
    timed_workload(&array, &mut model, seed, 60);
    assert_eq!(
        array.detail().slow_member.slow_slot,
        Some(RECOVERED_SLOT),
        "found slow"
    );
    assert!(io.remove(spikes), "the spikes were there");
    let waited = Instant::now();
    while array.detail().slow_member.slow_slot.is_some() {
        assert!(
            waited.elapsed() < Duration::from_secs(20),
            "member {RECOVERED_SLOT} still slow 20 s after it recovered"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    Recovered {
        io,
        array,
        model,
        left_after: waited.elapsed(),
    }
}

/// Row 11, a member that relapses while it returns: the first read of it as slow as a slow member's average makes
/// it slow again at once (held, counted as a return), not once its average shows it; reads go around it again.
#[test]
fn row11_a_returning_member_slow_again_is_found_by_its_first_slow_read() {
    let Recovered {
        io,
        array,
        mut model,
        ..
    } = recovered_slow_member(1401);
    let slow = RECOVERED_SLOT;
    let returns_before = array.detail().slow_member.returns;
    // Slow again while it returns: reads until one of them meets it.
    let spikes = io.add(Scope::slot(slow), every_io_spike());
    let g = array.geometry();
    let mut rng = SplitMix64::new(1402);
    let mut reads = 0;
    while io.rule_counts(spikes).expect("rule").delayed == 0 {
        reads += 1;
        assert!(reads <= 2000, "no read of member {slow} in {reads} reads");
        let len = 1 + rng.below(g.stripe_bytes()) as usize;
        let offset = rng.below(g.array_bytes() - len as u64 + 1);
        timed_read(&array, &mut model, offset, len, "read while it returns");
    }
    let detail = array.detail();
    assert_eq!(
        detail.slow_member.slow_slot,
        Some(slow),
        "one 20 ms read of member {slow} (its average {} us) made it slow again",
        detail.members[slow].latency_us
    );
    assert_eq!(
        detail.slow_member.returns,
        returns_before + 1,
        "counted as a return"
    );
    // Around it again: with the prober held off (an hour between probes, one in flight let finish), 100 reads
    // more meet no spike.
    array.set_slow_probe_interval(Duration::from_secs(3600));
    std::thread::sleep(Duration::from_millis(100));
    let met = io.rule_counts(spikes).expect("rule").delayed;
    timed_reads(&array, &mut model, 1403, 100);
    let met_now = io.rule_counts(spikes).expect("rule").delayed - met;
    assert_eq!(
        met_now, 0,
        "reads met member {slow}'s spikes after it was slow again"
    );
    assert!(io.remove(spikes));
    verify_all(&array, &mut model, "after the relapse");
}

/// Row 11, a member that recovers: once it leaves the slow state it gets a growing share of the reads the level
/// could serve around it (one in 16 the first second, then 8, 4, 2), not all of them at once, and all of them
/// after that (slow.rs, "Gradual return"). A rate-capped device given its whole share back at once queued it past
/// its rate and made every read queued there wait.
#[test]
fn row11_a_member_that_recovers_gets_its_reads_back_gradually() {
    let Recovered {
        io,
        array,
        mut model,
        left_after,
    } = recovered_slow_member(1301);
    let slow = RECOVERED_SLOT;
    let detail = array.detail();
    assert_eq!(detail.slow_member.returning_slot, Some(slow));
    for member in &detail.members {
        assert_eq!(
            member.returning,
            member.slot == slow,
            "only member {slow} is marked returning: {member:?}"
        );
    }
    // Its reads, and the pieces on it read around it, over a few hundred reads right after it left.
    let mut share = |seed: u64| {
        let steered_before = array.detail().slow_member.steered_reads;
        let reads_of_it = count_reads(&io, slow);
        timed_reads(&array, &mut model, seed, 200);
        let to_it = io.rule_counts(reads_of_it).expect("rule").matched;
        assert!(io.remove(reads_of_it));
        let around = array.detail().slow_member.steered_reads - steered_before;
        (to_it, around)
    };
    let started = Instant::now();
    let (to_it, around) = share(1302);
    let took = started.elapsed();
    let pieces = to_it + around;
    assert!(
        pieces >= 16,
        "{pieces} pieces on member {slow} in 200 reads"
    );
    assert!(to_it >= 1, "its share of the reads went to it");
    // One in 16 in its first second back, one in 8 in the next (a slow runner may cross into it).
    assert!(
        to_it <= pieces / 8 + 1,
        "member {slow} read for {to_it} of {pieces} pieces on it ({took:?} after it left, {left_after:?} after it \
         recovered)"
    );
    std::thread::sleep(Duration::from_secs(4));
    let (to_it, around) = share(1303);
    assert_eq!(
        around, 0,
        "4 s later every read of it goes to it ({to_it} did)"
    );
    assert!(to_it > 0);
    let slow_member = array.detail().slow_member;
    assert_eq!(slow_member.slow_slot, None);
    assert_eq!(slow_member.returning_slot, None, "the return is over");
    assert!(array.detail().members.iter().all(|m| !m.returning));
    verify_all(&array, &mut model, "after the return");
}

/// A rule that only counts the reads of `slot` (`rule_counts(..).matched`).
fn count_reads(io: &CowStack, slot: usize) -> paraid_engine::fault::RuleId {
    io.add(
        Scope::slot(slot).ops(OpKinds::READ),
        Fault::Delay {
            delay: Duration::ZERO,
            one_in: 1,
            sleep: false,
        },
    )
}

/// A commit stream (page after page of a chunk, each flushed) rides one log entry that reaches ahead by reading the
/// pages after it from the chunk's member and the parity members: not over stripes where one of them is the slow
/// member, whose reads each write would wait for. Elsewhere the entries still reach ahead.
#[test]
fn a_commit_stream_reaches_ahead_only_where_the_slow_member_is_not_read() {
    let filled = Filled::new(Level::Raid6, 6, 16384, 16, 1500);
    let g = filled.geometry;
    let (io, array) = assemble_cow(&filled.base, &[], 15, reference()).expect("assemble");
    let slow = 2;
    every_io_late(&io, slow);
    let mut model = filled.model();
    let mut rng = SplitMix64::new(1501);
    let mut page_write = |model: &mut BlockModel, offset: u64| {
        let mut data = vec![0u8; 4096];
        rng.fill(&mut data);
        array.write(offset, &data, false).expect("page write");
        array.flush().expect("flush");
        model.write(offset, &data, WriteOutcome::Acked { durable: true });
    };
    let chunks = g.array_bytes() / g.chunk_bytes;
    let mut warm = 0;
    while array.detail().slow_member.slow_slot != Some(slow) {
        warm += 1;
        assert!(warm < 1000, "member {slow} never found slow");
        page_write(&mut model, (warm % chunks) * g.chunk_bytes);
    }
    let reads_of_slow = count_reads(&io, slow);
    let extensions_before = array.integrity().log_stream_extensions;
    // A stream through each of the first twelve chunks: its four pages, one after another, each flushed.
    let pages_per_chunk = g.chunk_bytes / 4096;
    for chunk in 0..12u64.min(chunks) {
        for page in 0..pages_per_chunk {
            page_write(&mut model, chunk * g.chunk_bytes + page * 4096);
        }
    }
    let read = io.rule_counts(reads_of_slow).expect("rule").matched;
    let extensions = array.integrity().log_stream_extensions - extensions_before;
    io.remove(reads_of_slow);
    assert_eq!(read, 0, "a commit stream read the slow member");
    assert!(
        extensions > 0,
        "no stream entry reached ahead where the slow member is not read"
    );
    verify_all(&array, &mut model, "after the streams");
    figure(
        "11",
        "a_commit_stream_reaches_ahead_only_where_the_slow_member_is_not_read",
        &format!("RAID6/6: 12 chunks written as commit streams read the slow member 0 times; {extensions} entries reached ahead elsewhere"),
    );
}

/// Row 11, writes: a small write can update parity by reading the old data and parity it overwrites, or by
/// reading the rest of the stripe; the two read different chunks, and once a member is found slow the write takes
/// the way that reads nothing from it (its own write to the member stays). Each write is flushed, as a database
/// commits: with the partial parity log, a stripe holding chunks not yet flushed must be read whole (its partial
/// parity cannot lean on them), the slow member included; and no write continues another (commit streams: the
/// test above).
#[test]
fn small_writes_read_nothing_from_a_slow_member() {
    let mut report = Vec::new();
    for (level, members) in [(Level::Raid6, 6), (Level::Raid5, 4)] {
        let filled = Filled::new(level, members, 16384, 16, 1400);
        let g = filled.geometry;
        let (io, array) = assemble_cow(&filled.base, &[], 14, reference()).expect("assemble");
        let slow = 2;
        every_io_late(&io, slow);
        let mut model = filled.model();
        let mut rng = SplitMix64::new(1401);
        // The first page of random chunks: no write continues another (a commit stream's entry reaches ahead by
        // reading the pages after it from their data and parity members, slow or not).
        let chunks = g.array_bytes() / g.chunk_bytes;
        let mut page_write = |model: &mut BlockModel| {
            let offset = rng.below(chunks) * g.chunk_bytes;
            let mut data = vec![0u8; 4096];
            rng.fill(&mut data);
            array.write(offset, &data, false).expect("small write");
            array.flush().expect("flush");
            model.write(offset, &data, WriteOutcome::Acked { durable: true });
        };
        let mut warm = 0;
        while array.detail().slow_member.slow_slot != Some(slow) {
            warm += 1;
            assert!(warm < 1000, "{level:?}: member {slow} never found slow");
            page_write(&mut model);
        }
        let reads_of_slow = count_reads(&io, slow);
        let writes = 200;
        for _ in 0..writes {
            page_write(&mut model);
        }
        let read = io.rule_counts(reads_of_slow).expect("rule").matched;
        assert_eq!(array.integrity().log_stream_extensions, 0);
        assert_eq!(read, 0, "{level:?}: small writes read the slow member");
        io.remove(reads_of_slow);
        verify_all(&array, &mut model, "after the writes");
        report.push(format!(
            "{level:?}/{members}: found slow after {warm} page writes; {writes} page writes then read it 0 times"
        ));
    }
    figure(
        "11",
        "small_writes_read_nothing_from_a_slow_member",
        &report.join("; "),
    );
}

/// Row 11 under writes alone, on members driven through io_uring (files under /var/tmp, O_DIRECT): most batches of
/// member writes are waited for together and carry no time, and one in eight on each thread is timed request by
/// request (member/uring.rs, `waits_together`). Those timed batches must still find a member whose every data
/// write is 5 ms slower, with no read to measure it by (stop 61's first build, with no write batch timed, found
/// it only once reads came).
#[test]
fn row11_a_slow_member_is_found_under_writes_alone_on_ring_members() {
    use paraid_engine::member::MemberFile;
    use paraid_engine::superblock::DEFAULT_DATA_OFFSET_BYTES;
    use paraid_engine::UringMembers;

    let var_tmp = std::path::Path::new("/var/tmp");
    let dir = if var_tmp.is_dir() {
        var_tmp.to_path_buf()
    } else {
        std::env::temp_dir()
    }
    .join(format!("paraid-row11-ring-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("member directory");
    let (members, chunk) = (6usize, 16384u64);
    let member_bytes = DEFAULT_DATA_OFFSET_BYTES + 512 * chunk;
    let files: Vec<Option<MemberFile>> = (0..members)
        .map(|m| {
            let path = dir.join(format!("m{m}"));
            std::fs::File::create(&path)
                .and_then(|f| f.set_len(member_bytes))
                .expect("member file");
            Some(MemberFile::open(&path).expect("open member"))
        })
        .collect();
    if files.iter().flatten().any(|m| m.memory_backed) {
        println!(
            "skipped: {} is in memory, and members there do not use the ring",
            dir.display()
        );
        let _ = std::fs::remove_dir_all(&dir);
        return;
    }
    let io = Arc::new(FaultyMembers::new(UringMembers::new(files), 61));
    create_io(io.as_ref(), Level::Raid6, chunk, "row11-ring").expect("create");
    let array = assemble_io(io.clone(), AssembleOptions::new(reference())).expect("assemble");
    // Data writes only (the log, bitmap and superblocks sit below the data offset and stay quick).
    io.add(
        Scope::slot(2)
            .ops(OpKinds::WRITE)
            .range(DEFAULT_DATA_OFFSET_BYTES..member_bytes),
        Fault::Delay {
            delay: Duration::from_millis(5),
            one_in: 1,
            sleep: false,
        },
    );
    let stripe_bytes = array.geometry().stripe_bytes();
    let stripe: Vec<u8> = (0..stripe_bytes).map(|i| (i % 251) as u8).collect();
    let mut found_after = None;
    for i in 0..400u64 {
        let offset = (i % 512) * stripe_bytes;
        array
            .write(offset, &stripe, false)
            .expect("whole-stripe write");
        if array.detail().slow_member.slow_slot == Some(2) {
            found_after = Some(i + 1);
            break;
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    let writes =
        found_after.expect("member 2, 5 ms slower on every write, found slow under writes alone");
    println!("member 2 found slow after {writes} whole-stripe writes");
}
