//! The partial parity log: its records are what docs/format.md says (read here by a reader of our own), concurrent
//! writers share log writes (group commit), the ring wraps and retires without losing anything, and it works on
//! member files.

mod common;
mod integrity_common;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use common::{crc32c_bitwise, forward_member_io, le32, le64};
use integrity_common::*;
use paraid_engine::superblock::Superblock;
use paraid_engine::{assemble, create, AddOutcome, CreateOptions, IoOp, IoReq, NewMember};
use paraid_parity::reference::Reference;
use paraid_parity::Backend;

/// An entry of a record, as the document describes it.
#[derive(Debug)]
struct DocEntry {
    seq: u64,
    stripe: u64,
    page_first: u64,
    pages: u64,
    modified: u64,
    /// Flags bit 0: whether the entry has a payload.
    payload: bool,
    /// The partial parities this record holds for it.
    pp: Option<Vec<u8>>,
    qp: Option<Vec<u8>>,
}

/// Every counting record of the ring in `image` (a member's bytes), following docs/format.md alone.
fn read_ring(image: &[u8], np: usize) -> (u64, Vec<DocEntry>) {
    let sb = Superblock::decode(image).expect("superblock");
    let ring = &image[sb.ppl_offset_bytes as usize..(sb.ppl_offset_bytes + sb.ppl_bytes) as usize];
    let page = 4096;
    let header = &ring[..page];
    let retired = if &header[0..8] == b"PARAIDPH"
        && header[16..32] == sb.uuid.0
        && le32(header, 4092) == crc32c_bitwise(&header[..4092])
    {
        le64(header, 32)
    } else {
        0
    };
    let mut entries = Vec::new();
    let mut at = page;
    while at + page <= ring.len() {
        let h = &ring[at..at + page];
        let payload_pages = le32(h, 40) as usize;
        let ok = &h[0..8] == b"PARAIDPL"
            && (le32(h, 8) == 1 || le32(h, 8) == 2)
            && h[16..32] == sb.uuid.0
            && le32(h, 4092) == crc32c_bitwise(&h[..4092])
            && at + page * (1 + payload_pages) <= ring.len();
        if !ok {
            at += page;
            continue;
        }
        let payload = &ring[at + page..at + page * (1 + payload_pages)];
        if le32(h, 44) != crc32c_bitwise(payload) || le64(h, 32) < retired {
            at += page;
            continue;
        }
        for e in 0..le32(h, 12) as usize {
            let b = 64 + 32 * e;
            let pages = le32(h, b + 12) as usize;
            let flags = h[b + 28];
            // Version 1: a payload is PP then (RAID6) QP; version 2: bits 1 and 2 say which of them it holds.
            let (has_pp, has_qp) = match (flags & 1 == 1, le32(h, 8)) {
                (false, _) => (false, false),
                (true, 1) => (true, np == 2),
                (true, _) => (flags & 2 != 0, flags & 4 != 0),
            };
            let mut at_payload = le32(h, b + 24) as usize * page;
            let mut take = |present: bool| {
                present.then(|| {
                    at_payload += pages * page;
                    payload[at_payload - pages * page..at_payload].to_vec()
                })
            };
            let (pp, qp) = (take(has_pp), take(has_qp));
            entries.push(DocEntry {
                seq: le64(h, 32),
                stripe: le64(h, b),
                page_first: le32(h, b + 8) as u64,
                pages: pages as u64,
                modified: le64(h, b + 16),
                payload: flags & 1 == 1,
                pp,
                qp,
            });
        }
        at += page * (1 + payload_pages);
    }
    (retired, entries)
}

/// The bytes `pages` (in-chunk pages) of the cell of stripe index `index` of `stripe`.
fn cell(
    images: &[Option<Vec<u8>>],
    g: &Geometry,
    stripe: u64,
    index: usize,
    pages: std::ops::Range<u64>,
) -> Vec<u8> {
    let image = images[g.stripe_member(stripe, index)]
        .as_ref()
        .expect("present");
    let at = (DEFAULT_DATA_OFFSET_BYTES + stripe * g.chunk_bytes + pages.start * 4096) as usize;
    image[at..at + ((pages.end - pages.start) * 4096) as usize].to_vec()
}

#[test]
fn log_records_read_back_as_documented() {
    for (level, members) in [(Level::Raid5, 4usize), (Level::Raid6, 6)] {
        let chunk = 16384u64;
        let (io, array) = mem_array(level, members, chunk, 16);
        let g = array.geometry();
        let k = g.data_per_stripe();
        let np = g.level.parity_chunks();
        let mut rng = SplitMix64::new(3);
        fill_flushed(&array, &mut rng);
        // 4 KiB into page 2 of data chunk 1 of stripe 5.
        let stripe = 5u64;
        let offset = (stripe * k as u64 + 1) * chunk + 2 * 4096;
        array.write(offset, &[0x5A; 4096], false).expect("write");
        let images = mem_images(&io);
        let logs_stripe = |member: usize| {
            let (_, entries) = read_ring(images[member].as_ref().expect("present"), np);
            entries.iter().any(|e| e.stripe == stripe)
        };
        // RAID6: PP on the P member, QP on the Q member. RAID5: the entry on the P member's ring or on the written
        // chunk's member's (ppl/spread.rs), one of them.
        let holders: Vec<usize> = match level {
            Level::Raid6 => (k..k + np).map(|i| g.stripe_member(stripe, i)).collect(),
            _ => {
                let on: Vec<usize> = [g.stripe_member(stripe, k), g.stripe_member(stripe, 1)]
                    .into_iter()
                    .filter(|&m| logs_stripe(m))
                    .collect();
                assert_eq!(
                    on.len(),
                    1,
                    "{level}: the entry on exactly one ring: {on:?}"
                );
                on
            }
        };
        for (n, &holder) in holders.iter().enumerate() {
            let (_, entries) = read_ring(images[holder].as_ref().expect("present"), np);
            let e = entries
                .iter()
                .filter(|e| e.stripe == stripe)
                .max_by_key(|e| e.seq)
                .unwrap_or_else(|| panic!("{level}: member {holder} logs stripe {stripe}"));
            assert_eq!(
                (e.page_first, e.pages, e.modified),
                (2, 1, 1 << 1),
                "{level}: {e:?}"
            );
            assert!(e.payload, "{level}: a partial write has a payload");
            // PP and QP: P and Q of the stripe with the modified chunk taken as zero. RAID6 splits them: PP on
            // the P member (n = 0), QP on the Q member (n = 1).
            let cells: Vec<Vec<u8>> = (0..k)
                .map(|i| {
                    if i == 1 {
                        vec![0u8; 4096]
                    } else {
                        cell(&images, &g, stripe, i, 2..3)
                    }
                })
                .collect();
            let refs: Vec<&[u8]> = cells.iter().map(|c| &c[..]).collect();
            let mut p = vec![0u8; 4096];
            let mut q = vec![0u8; 4096];
            if np == 2 {
                Reference.gen_pq(&refs, &mut p, &mut q);
            } else {
                Reference.gen_p(&refs, &mut p);
            }
            let (want_pp, want_qp) = (n == 0, n == 1);
            assert_eq!(
                (e.pp.is_some(), e.qp.is_some()),
                (want_pp, want_qp),
                "{level}: member {holder} holds the wrong partial parities"
            );
            if let Some(pp) = &e.pp {
                assert!(
                    pp[..] == p[..],
                    "{level}: PP = XOR of the chunks not written"
                );
            }
            if let Some(qp) = &e.qp {
                assert!(qp[..] == q[..], "{level}: QP");
            }
        }
        // The other members' rings do not hold this stripe.
        for m in (0..members).filter(|m| !holders.contains(m)) {
            let (_, entries) = read_ring(images[m].as_ref().expect("present"), np);
            assert!(entries.iter().all(|e| e.stripe != stripe || e.seq == 0));
        }
        // A clean stop retires everything: no record counts any more.
        array.stop().expect("stop");
        for image in mem_images(&io).iter().flatten() {
            let (retired, entries) = read_ring(image, np);
            assert!(
                retired > 0 && entries.is_empty(),
                "{level}: retired {retired}, {} left",
                entries.len()
            );
        }
    }
}

/// Members whose writes take a while (so that writers overlap), counting FUA writes before the data area.
struct Slow {
    inner: MemMembers,
}

impl MemberIo for Slow {
    forward_member_io!(inner);
    fn submit(&self, reqs: &mut [IoReq<'_>]) {
        if reqs.iter().any(|r| matches!(r.op, IoOp::Write { .. })) {
            std::thread::sleep(Duration::from_micros(500));
        }
        self.inner.submit(reqs);
    }
}

#[test]
fn concurrent_writers_share_log_writes() {
    let report = concurrent_partial_writes(None);
    let writes = 8 * 40;
    assert_eq!(
        report.log_entries, writes,
        "one entry per partial-stripe write"
    );
    assert!(
        report.log_rounds < writes,
        "{} commit rounds for {writes} writes: no sharing",
        report.log_rounds
    );
    figure(
        "group_commit",
        &format!(
            "{writes} partial-stripe writes from 8 threads: {} log rounds ({:.1} writes per round), {} \
             record writes",
            report.log_rounds,
            writes as f64 / report.log_rounds as f64,
            report.log_record_writes
        ),
    );
}

/// One round written at a time (the default on drives) gathers more writers per round, and so fewer record
/// writes, than four side by side (the default on members in memory): the same writes on the same slow members.
#[test]
fn one_round_in_flight_shares_more_than_four() {
    let one = concurrent_partial_writes(Some(1));
    let four = concurrent_partial_writes(Some(4));
    assert_eq!(one.log_entries, four.log_entries);
    assert!(
        one.log_rounds < four.log_rounds && one.log_record_writes < four.log_record_writes,
        "one in flight: {} rounds, {} record writes; four: {} rounds, {} record writes",
        one.log_rounds,
        one.log_record_writes,
        four.log_rounds,
        four.log_record_writes
    );
    figure(
        "rounds_in_flight",
        &format!(
            "320 partial-stripe writes from 8 threads: one round in flight {} rounds / {} record writes, four \
             {} / {}",
            one.log_rounds, one.log_record_writes, four.log_rounds, four.log_record_writes
        ),
    );
}

/// Members that hold every log record write while `closed` (a record's header page begins with its magic), so
/// that the writers arriving meanwhile queue for one round.
struct RecordGate {
    inner: MemMembers,
    closed: std::sync::Mutex<bool>,
    opened: std::sync::Condvar,
    held: std::sync::atomic::AtomicUsize,
}

impl MemberIo for RecordGate {
    forward_member_io!(inner);
    fn submit(&self, reqs: &mut [IoReq<'_>]) {
        let record = reqs
            .iter()
            .any(|r| matches!(r.op, IoOp::Write { buf, .. } if buf.starts_with(b"PARAIDPL")));
        if record {
            let mut closed = self.closed.lock().expect("gate");
            if *closed {
                self.held.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            while *closed {
                closed = self.opened.wait(closed).expect("gate");
            }
        }
        self.inner.submit(reqs);
    }
}

/// RAID5 of five, one round in flight: a write whose record is held, eight writes into other stripes queued
/// behind it meanwhile, then the gate opened. The log figures of those nine writes (two rounds).
fn gathered_round(spread: bool) -> paraid_engine::IntegrityReport {
    let chunk = 65536u64;
    let io = Arc::new(RecordGate {
        inner: MemMembers::new(5, member_bytes(chunk, 64)),
        closed: std::sync::Mutex::new(false),
        opened: std::sync::Condvar::new(),
        held: std::sync::atomic::AtomicUsize::new(0),
    });
    create_io(io.as_ref(), Level::Raid5, chunk, "gate").expect("create");
    let mut opts = options(true);
    opts.log_rounds_in_flight = Some(1);
    opts.log_spread = spread;
    let array = Arc::new(assemble_io(io.clone(), opts).expect("assemble"));
    // Whole stripes (nothing logged): the bitmap's regions are dirty before the gate closes.
    array
        .write(0, &vec![7u8; array.size_bytes() as usize], false)
        .expect("fill");
    array.flush().expect("flush");
    let before = array.integrity();
    *io.closed.lock().expect("gate") = true;
    let write = |stripe: u64| {
        let array = array.clone();
        std::thread::spawn(move || {
            let index = stripe % 4;
            let at = (stripe * 4 + index) * chunk + 4096 * (stripe % 16);
            array
                .write(at, &[stripe as u8; 4096], false)
                .expect("write");
        })
    };
    let mut writers = vec![write(0)];
    let started = std::time::Instant::now();
    while io.held.load(std::sync::atomic::Ordering::SeqCst) == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "no record reached the gate"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    writers.extend((1..=8).map(write));
    // Time for the eight to compute their entries and queue behind the held round.
    std::thread::sleep(Duration::from_millis(500));
    *io.closed.lock().expect("gate") = false;
    io.opened.notify_all();
    for w in writers {
        w.join().expect("writer");
    }
    let after = array.integrity();
    paraid_engine::IntegrityReport {
        log_rounds: after.log_rounds - before.log_rounds,
        log_entries: after.log_entries - before.log_entries,
        log_record_writes: after.log_record_writes - before.log_record_writes,
        log_entries_off_parity: after.log_entries_off_parity - before.log_entries_off_parity,
        ..Default::default()
    }
}

/// RAID5 entries that may go to the written chunk's member's ring as well as the P member's (ppl/spread.rs) let
/// a round of writers into different stripes share records: the same nine writes, the same two rounds (one held,
/// eight gathered behind it), fewer record writes.
#[test]
fn raid5_entries_off_the_parity_ring_share_records() {
    let spread = gathered_round(true);
    let parity = gathered_round(false);
    for (name, r) in [("spread", &spread), ("P rings only", &parity)] {
        assert_eq!(
            (r.log_entries, r.log_rounds),
            (9, 2),
            "{name}: nine entries in two rounds (the eight queued behind the held one): {r:?}"
        );
    }
    assert_eq!(
        parity.log_entries_off_parity, 0,
        "off: every entry on its P member's ring"
    );
    assert!(
        spread.log_entries_off_parity > 0,
        "no entry left the P member's ring"
    );
    assert!(
        spread.log_record_writes < parity.log_record_writes,
        "record writes: spread {}, P rings only {}",
        spread.log_record_writes,
        parity.log_record_writes
    );
    figure(
        "spread",
        &format!(
            "RAID5 of five, eight partial-stripe writes gathered in one round behind a held one: {} record writes \
             ({} stripes off the P ring) against {} with every entry on its P member's ring",
            spread.log_record_writes, spread.log_entries_off_parity, parity.log_record_writes
        ),
    );
}

/// The rule that keeps spreading safe (ppl/spread.rs): a stripe whose live entry is on one data member's ring
/// never gets a newer entry on another data member's ring. Otherwise, that member missing at restart, recovery
/// would apply the older entry, whose partial parity holds the chunk as it was before the newer write, and solve
/// the chunk to its old contents although the newer write was answered and reached every member.
/// RAID5 of four: in every stripe a write of chunk 1, then of chunk 0 (the same page), both answered and every
/// member write applied (a kill), no flush; then each member missing at restart in turn. Each stripe's first entry
/// may go to chunk 1's member's ring (ties between rings go round with the rounds, so some do); the second may
/// then go only there or to the P member's. With the rule taken out, most restarts lose a write.
#[test]
fn a_newer_entry_never_leaves_for_another_data_members_ring() {
    let chunk = 16384u64;
    let rows = 48u64;
    let (io, array) = mem_array(Level::Raid5, 4, chunk, rows);
    let g = array.geometry();
    let k = g.data_per_stripe();
    let mut rng = SplitMix64::new(29);
    let mut data = fill_flushed(&array, &mut rng);
    let page = 2 * 4096u64;
    let at = |stripe: u64, index: u64| ((stripe * k as u64 + index) * chunk + page) as usize;
    for stripe in 0..g.stripes() {
        for (index, byte) in [(1u64, 0x11u8), (0, 0x22)] {
            let at = at(stripe, index);
            array
                .write(at as u64, &[byte ^ stripe as u8; 4096], false)
                .expect("write");
            data[at..at + 4096].fill(byte ^ stripe as u8);
        }
    }
    let report = array.integrity();
    let images = mem_images(&io);
    drop(array); // no clean stop: a kill after every write was answered
    assert!(
        report.log_entries_off_parity > 0,
        "no entry left the P member's ring: nothing tested ({report:?})"
    );
    // Per stripe, its entries' rings and rounds: one on a data member's ring has every older one there too.
    let found: Vec<(usize, u64, u64)> = (0..4)
        .flat_map(|m| {
            let (_, entries) = read_ring(images[m].as_ref().expect("present"), 1);
            entries.into_iter().map(move |e| (m, e.stripe, e.seq))
        })
        .collect();
    let mut off_parity = 0;
    for &(ring, stripe, seq) in &found {
        if ring == g.stripe_member(stripe, k) {
            continue;
        }
        off_parity += 1;
        let elsewhere: Vec<(usize, u64)> = found
            .iter()
            .filter(|&&(r, s, q)| s == stripe && q < seq && r != ring)
            .map(|&(r, _, q)| (r, q))
            .collect();
        assert!(
            elsewhere.is_empty(),
            "stripe {stripe}: entry of round {seq} on data member {ring}'s ring, older ones on {elsewhere:?}"
        );
    }
    assert!(
        off_parity > 0,
        "no stripe with an entry off the P member's ring"
    );
    for missing in 0..4 {
        let mut images = images.clone();
        images[missing] = None;
        let (_io, array) = reassemble(images, true);
        let mut all = vec![0u8; array.size_bytes() as usize];
        array.read(0, &mut all).expect("read");
        let lost: Vec<u64> = (0..g.stripes())
            .filter(|&s| {
                (0..2).any(|i| all[at(s, i)..at(s, i) + 4096] != data[at(s, i)..at(s, i) + 4096])
            })
            .collect();
        assert!(
            lost.is_empty() && all == data,
            "member {missing} missing at restart: writes lost in stripes {lost:?}"
        );
    }
}

/// Eight threads, forty partial-stripe writes each, each thread its own stripes, on members slow enough that
/// writers meet in the log; `rounds` sets the log rounds in flight (None: the default).
fn concurrent_partial_writes(rounds: Option<usize>) -> paraid_engine::IntegrityReport {
    let io = Arc::new(Slow {
        inner: MemMembers::new(5, member_bytes(65536, 64)),
    });
    create_io(io.as_ref(), Level::Raid5, 65536, "group").expect("create");
    let mut opts = options(true);
    opts.log_rounds_in_flight = rounds;
    let array = Arc::new(assemble_io(io.clone(), opts).expect("assemble"));
    let threads = 8u64;
    let per_thread = 40u64;
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let array = array.clone();
            std::thread::spawn(move || {
                let mut rng = SplitMix64::new(t);
                let stripe_bytes = array.geometry().stripe_bytes();
                for i in 0..per_thread {
                    // Each thread its own stripes: no stripe lock waits, only the log to share.
                    let stripe = t + threads * (i % 8);
                    let at = stripe * stripe_bytes + rng.below(stripe_bytes / 4096 - 1) * 4096;
                    array.write(at, &[t as u8; 4096], false).expect("write");
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("writer");
    }
    array.integrity()
}

/// Thousands of partial writes without a flush fill the ring: it retires (flushing first) and wraps, and a
/// member lost afterwards still reads back everything.
#[test]
fn ring_wraps_and_retires() {
    let (io, array) = mem_array(Level::Raid6, 5, 65536, 64);
    // No background tick: its flushes would make room in the ring before retirement needs one.
    array.set_integrity_tick(false);
    let g = array.geometry();
    let mut rng = SplitMix64::new(9);
    let mut model = vec![0u8; array.size_bytes() as usize];
    for _ in 0..3000 {
        let at = rng.below(array.size_bytes() / 4096) * 4096;
        let mut buf = [0u8; 4096];
        rng.fill(&mut buf);
        array.write(at, &buf, false).expect("write");
        model[at as usize..at as usize + 4096].copy_from_slice(&buf);
    }
    let report = array.integrity();
    assert!(
        report.log_retirements > 0 && report.log_retire_flushes > 0,
        "{report:?}"
    );
    let ring_bytes = {
        let sb = Superblock::decode(&io.image(0).expect("present")).expect("sb");
        sb.ppl_bytes
    };
    assert!(
        report.log_payload_bytes > 3 * ring_bytes,
        "the log went round the ring"
    );
    drop(array); // killed
    for gone in 0..g.members {
        let mut images = mem_images(&io);
        images[gone] = None;
        let io = Arc::new(MemMembers::from_images(images));
        let array = assemble_io(io, options(true)).expect("degraded");
        let mut all = vec![0u8; model.len()];
        array.read(0, &mut all).expect("read");
        assert!(all == model, "without member {gone}");
    }
    figure(
        "ring_wraps",
        &format!(
            "3000 partial writes without a flush: {} bytes logged through a {} byte ring, {} retirements ({} with \
             a flush), every member lost in turn reads back intact",
            report.log_payload_bytes, ring_bytes, report.log_retirements, report.log_retire_flushes
        ),
    );
}

/// A client that never flushes leaves chunks that may not be durable, and the log then does a small write of their
/// stripes as a reconstruct-write (it must leave those chunks out of the partial parity, which a read-modify-write
/// cannot). The background tick flushes every member while that is so; a small write afterwards is a
/// read-modify-write again, and a tick with nothing to make durable flushes nothing.
#[test]
fn the_tick_flushes_so_that_small_writes_stay_read_modify_writes() {
    let (_io, array) = mem_array(Level::Raid5, 5, 65536, 8);
    array.set_integrity_tick(false);
    let chunk = 65536u64;
    let stripe_bytes = array.geometry().stripe_bytes();
    let mut model = vec![0u8; array.size_bytes() as usize];
    let mut write = |at: u64, buf: &[u8]| {
        array.write(at, buf, false).expect("write");
        model[at as usize..at as usize + buf.len()].copy_from_slice(buf);
    };
    // Stripe 0 written whole, then a page of its second chunk: nothing flushed, so the other chunks are dirty.
    write(0, &vec![0x11; stripe_bytes as usize]);
    write(chunk, &[0x22; 4096]);
    let report = array.integrity();
    assert_eq!(report.log_rmw_to_rcw, 1, "unflushed chunks: {report:?}");
    assert_eq!(report.log_tick_flushes, 0);
    array.run_integrity_tick().expect("tick");
    assert_eq!(array.integrity().log_tick_flushes, 1, "the tick flushed");
    // The same page of the third chunk: every other chunk is durable now.
    write(2 * chunk, &[0x33; 4096]);
    assert_eq!(
        array.integrity().log_rmw_to_rcw,
        1,
        "after the tick's flush the write is a read-modify-write"
    );
    array.run_integrity_tick().expect("tick"); // the third chunk's page was not durable: flushes
    array.run_integrity_tick().expect("tick"); // nothing left: does not
    assert_eq!(array.integrity().log_tick_flushes, 2);
    let mut all = vec![0u8; model.len()];
    array.read(0, &mut all).expect("read");
    assert!(all == model, "reads back what was written");
}

/// A stream entry reaches ahead (reads and logs the partial parity of up to sixteen pages past its write) only for
/// a stream seen twice in a row: a page written after another's, as random small writes land now and then, logs
/// an entry over its own page; a third page continuing both extends. The stripe's other chunk is flushed in
/// between, so that every write is a stream entry candidate (one chunk not durable: its own).
#[test]
fn a_stream_reaches_ahead_only_once_seen_twice() {
    let (_io, array) = mem_array(Level::Raid6, 6, 65536, 8);
    array.set_integrity_tick(false);
    let chunk = 65536u64;
    let mut model = vec![0u8; array.size_bytes() as usize];
    let mut write = |at: u64, fill: u8| {
        array.write(at, &[fill; 4096], false).expect("write");
        array.flush().expect("flush");
        model[at as usize..at as usize + 4096].fill(fill);
    };
    let entries_and_extensions = || {
        let report = array.integrity();
        (report.log_entries, report.log_stream_extensions)
    };
    // Stripe 0's second chunk: pages 4, then 5 (a page after another's), then 6.
    write(chunk + 4 * 4096, 0x41);
    write(chunk + 5 * 4096, 0x42);
    assert_eq!(
        entries_and_extensions(),
        (2, 0),
        "a page after another's reached ahead"
    );
    write(chunk + 6 * 4096, 0x43);
    assert_eq!(
        entries_and_extensions(),
        (3, 1),
        "the third page of a stream did not reach ahead"
    );
    // The next pages ride the extended entry.
    for (n, page) in (7..10u64).enumerate() {
        write(chunk + page * 4096, 0x44 + n as u8);
    }
    let rode = array.integrity();
    assert_eq!((rode.log_entries, rode.log_rides), (3, 3), "{rode:?}");
    let mut all = vec![0u8; model.len()];
    array.read(0, &mut all).expect("read");
    assert!(all == model, "reads back what was written");
}

/// Member files: the bitmap and the log go through io_uring with RWF_DSYNC; an unclean stop leaves the array
/// dirty with its regions marked, and it re-assembles with a member missing, every write intact.
#[test]
fn member_files_unclean_stop_then_member_missing() {
    unclean_stop_then_member_missing(true);
}

/// The same, re-assembled with the log turned off (`--consistency-policy bitmap`): the live records of the
/// unclean stop are still recovered before the array serves; only new writes go unlogged.
#[test]
fn member_files_unclean_stop_recovered_when_served_without_the_log() {
    unclean_stop_then_member_missing(false);
}

fn unclean_stop_then_member_missing(reassemble_with_log: bool) {
    let dir = std::env::temp_dir().join(format!(
        "paraid-integrity-{}-{reassemble_with_log}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let paths: Vec<PathBuf> = (0..4).map(|i| dir.join(format!("m{i}.img"))).collect();
    create(&CreateOptions {
        level: Level::Raid5,
        chunk_bytes: 8192,
        name: "files".to_string(),
        size_bytes: Some(member_bytes(8192, 32)),
        members: paths.clone(),
        force: false,
    })
    .expect("create");
    let array = assemble(&paths, options(true)).expect("assemble");
    let mut rng = SplitMix64::new(11);
    let mut model = vec![0u8; array.size_bytes() as usize];
    for i in 0..200 {
        let (offset, len) = extent(
            &mut rng,
            array.size_bytes(),
            array.geometry().stripe_bytes(),
        );
        let mut buf = vec![0u8; len];
        rng.fill(&mut buf);
        array.write(offset, &buf, i % 3 == 0).expect("write");
        model[offset as usize..offset as usize + len].copy_from_slice(&buf);
        if i % 50 == 49 {
            array.flush().expect("flush");
        }
    }
    let report = array.integrity();
    assert!(report.log_entries > 0 && report.dirty_regions > 0);
    drop(array); // no clean stop
    let sb = Superblock::decode(&std::fs::read(&paths[0]).expect("read")).expect("sb");
    assert_eq!(sb.state, paraid_engine::ArrayState::Dirty);
    let array =
        assemble(&paths[1..], options(reassemble_with_log)).expect("assemble without member 0");
    let mut all = vec![0u8; model.len()];
    array.read(0, &mut all).expect("read");
    assert!(all == model, "every write reads back with member 0 missing");
    let recovered = array.integrity().log_recovered_stripes;
    assert!(recovered > 0, "the live records were recovered");
    array.stop().expect("stop");
    let _ = std::fs::remove_dir_all(&dir);
    if !reassemble_with_log {
        return;
    }
    figure(
        "member_files",
        &format!(
            "{} log entries, {recovered} stripes recovered from the log at re-assembly",
            report.log_entries
        ),
    );
}

/// A RAID6 array with every stripe filled and flushed, then one 4 KiB write into page 2 of data chunk 1 of stripe
/// 5 (not flushed): the member images before and after that write, and the array's contents before it.
/// Member images (None: missing).
type Images = Vec<Option<Vec<u8>>>;

fn raid6_images_around_one_write() -> (Geometry, Images, Images, Vec<u8>) {
    let chunk = 16384u64;
    let (io, array) = mem_array(Level::Raid6, 6, chunk, 16);
    let g = array.geometry();
    let mut rng = SplitMix64::new(17);
    let data = fill_flushed(&array, &mut rng);
    let before = mem_images(&io);
    let offset = (5 * g.data_per_stripe() as u64 + 1) * chunk + 2 * 4096;
    array.write(offset, &[0x5A; 4096], false).expect("write");
    let after = mem_images(&io);
    drop(array); // no clean stop
    (g, before, after, data)
}

/// Re-assembles `images` with the members of stripe indices `missing` of `stripe` gone: the array (recovered from
/// its log) and everything it reads back.
fn reassembled_without(
    mut images: Images,
    g: &Geometry,
    stripe: u64,
    missing: &[usize],
) -> (Array, Vec<u8>) {
    for &i in missing {
        images[g.stripe_member(stripe, i)] = None;
    }
    let (_io, array) = reassemble(images, true);
    let mut all = vec![0u8; array.size_bytes() as usize];
    array.read(0, &mut all).expect("read");
    (array, all)
}

/// The bytes of the ring in a member's `image`.
fn ring_range(image: &[u8]) -> std::ops::Range<usize> {
    let sb = Superblock::decode(image).expect("superblock");
    sb.ppl_offset_bytes as usize..(sb.ppl_offset_bytes + sb.ppl_bytes) as usize
}

/// The half of a split RAID6 entry found without its other half on a present member belongs to a round whose
/// records were not all durable, so its in-place writes never started: recovery must not take it for a finished
/// entry. Here the power went after the P member's record (PP) was written and before the Q member's (QP) and any
/// in-place write. With two data chunks of the stripe missing, PP alone cannot solve them: the entry is dropped
/// and the stripe, consistent as it was, reconstructs them. With one missing, PP solves it.
#[test]
fn raid6_half_of_an_unfinished_round_is_not_taken_for_a_finished_one() {
    let (g, before, after, data) = raid6_images_around_one_write();
    let k = g.data_per_stripe();
    let stripe = 5u64;
    let p_member = g.stripe_member(stripe, k);
    for missing in [vec![0usize, 2], vec![0]] {
        let mut images = before.clone();
        let ring = ring_range(after[p_member].as_ref().expect("present"));
        images[p_member].as_mut().expect("present")[ring.clone()]
            .copy_from_slice(&after[p_member].as_ref().expect("present")[ring]);
        let (array, all) = reassembled_without(images, &g, stripe, &missing);
        assert!(
            all == data,
            "data chunks {missing:?} missing: the array reads back as it was before the unfinished write"
        );
        let report = array.integrity();
        assert_eq!(
            report.log_recovered_stripes,
            u64::from(missing.len() == 1),
            "data chunks {missing:?} missing: the half entry is used only where it solves the stripe"
        );
    }
}

/// With the Q member missing at restart, the P member's half (PP) is all recovery needs: the in-place write of
/// the data chunk was lost while the new P was durable, and a data chunk not being written is missing too. Without
/// PP it would be reconstructed from a P that no longer matches the data.
#[test]
fn raid6_half_solves_a_torn_stripe_when_the_other_parity_member_is_missing() {
    let (g, before, after, data) = raid6_images_around_one_write();
    let k = g.data_per_stripe();
    let stripe = 5u64;
    let written = g.stripe_member(stripe, 1);
    let mut images = after.clone();
    // The write's data page was not durable; P (and its log record) were.
    let at = (DEFAULT_DATA_OFFSET_BYTES + stripe * g.chunk_bytes + 2 * 4096) as usize;
    images[written].as_mut().expect("present")[at..at + 4096]
        .copy_from_slice(&before[written].as_ref().expect("present")[at..at + 4096]);
    let (array, all) = reassembled_without(images, &g, stripe, &[k + 1, 0]);
    assert!(
        all == data,
        "every chunk not being written reads back intact (the written page reads back old: its write was lost)"
    );
    assert_eq!(array.integrity().log_solved_chunks, 1);
}

/// A ring written by version 1 (each RAID6 entry whole, PP then QP, in the P and the Q member's rings) is still
/// recovered: the record of `raid6_images_around_one_write` rewritten as version 1 in both rings, then the torn
/// stripe of the test above with the Q member and a data member missing (PP solves it), and with two data members
/// missing (it takes PP and QP).
#[test]
fn version_1_records_are_recovered() {
    let (g, before, after, data) = raid6_images_around_one_write();
    let k = g.data_per_stripe();
    let stripe = 5u64;
    let holders = [g.stripe_member(stripe, k), g.stripe_member(stripe, k + 1)];
    let halves: Vec<(DocEntry, u64)> = holders
        .iter()
        .map(|&m| {
            let (_, entries) = read_ring(after[m].as_ref().expect("present"), 2);
            let e = entries
                .into_iter()
                .filter(|e| e.stripe == stripe)
                .max_by_key(|e| e.seq)
                .expect("an entry");
            let seq = e.seq;
            (e, seq)
        })
        .collect();
    let (pp, qp) = (
        halves[0].0.pp.clone().expect("PP on the P member"),
        halves[1].0.qp.clone().expect("QP on the Q member"),
    );
    let e = &halves[0].0;
    let uuid = Superblock::decode(after[holders[0]].as_ref().expect("present"))
        .expect("superblock")
        .uuid;
    // Version 1: header page, then PP and QP.
    let mut record = vec![0u8; 3 * 4096];
    record[0..8].copy_from_slice(b"PARAIDPL");
    record[8..12].copy_from_slice(&1u32.to_le_bytes());
    record[12..16].copy_from_slice(&1u32.to_le_bytes());
    record[16..32].copy_from_slice(&uuid.0);
    record[32..40].copy_from_slice(&halves[0].1.to_le_bytes());
    record[40..44].copy_from_slice(&2u32.to_le_bytes());
    record[64..72].copy_from_slice(&e.stripe.to_le_bytes());
    record[72..76].copy_from_slice(&(e.page_first as u32).to_le_bytes());
    record[76..80].copy_from_slice(&(e.pages as u32).to_le_bytes());
    record[80..88].copy_from_slice(&e.modified.to_le_bytes());
    record[92] = 1;
    record[4096..8192].copy_from_slice(&pp);
    record[8192..].copy_from_slice(&qp);
    let payload_crc = crc32c_bitwise(&record[4096..]);
    record[44..48].copy_from_slice(&payload_crc.to_le_bytes());
    let crc = crc32c_bitwise(&record[..4092]);
    record[4092..4096].copy_from_slice(&crc.to_le_bytes());
    let written = g.stripe_member(stripe, 1);
    let at = (DEFAULT_DATA_OFFSET_BYTES + stripe * g.chunk_bytes + 2 * 4096) as usize;
    for gone in [vec![k + 1, 0], vec![0, 2]] {
        let mut images = after.clone();
        for &m in &holders {
            let image = images[m].as_mut().expect("present");
            let ring = ring_range(image);
            // The ring header (version 1 as well) keeps its retired_seq; the records are replaced by ours.
            image[ring.start + 8..ring.start + 12].copy_from_slice(&1u32.to_le_bytes());
            let crc = crc32c_bitwise(&image[ring.start..ring.start + 4092]);
            image[ring.start + 4092..ring.start + 4096].copy_from_slice(&crc.to_le_bytes());
            image[ring.start + 4096..ring.end].fill(0);
            image[ring.start + 4096..ring.start + 4096 + record.len()].copy_from_slice(&record);
        }
        images[written].as_mut().expect("present")[at..at + 4096]
            .copy_from_slice(&before[written].as_ref().expect("present")[at..at + 4096]);
        let (array, all) = reassembled_without(images, &g, stripe, &gone);
        assert!(
            all == data,
            "stripe indices {gone:?} missing: every chunk not being written reads back intact"
        );
        assert_eq!(
            array.integrity().log_solved_chunks,
            gone.iter().filter(|&&i| i < k).count() as u64
        );
    }
}

/// A member rebuilt into its slot joins with an empty ring; the ring of the member it replaces held halves of live
/// RAID6 entries (QP of stripes whose Q member it was), whose PP halves stay on present members. Once the new
/// member is active, recovery would take such an entry for one whose round never finished (`pair_halves`), so the
/// join comes after every round was retired: no record counts in any ring afterwards, although the write before
/// it was never flushed by the client.
#[test]
fn a_member_rebuilt_into_its_slot_joins_after_every_round_was_retired() {
    let chunk = 16384u64;
    let rows = 16u64;
    let (io, array) = mem_array(Level::Raid6, 6, chunk, rows);
    let g = array.geometry();
    let k = g.data_per_stripe();
    fill_flushed(&array, &mut SplitMix64::new(23));
    let stripe = 5u64;
    array
        .write(
            (stripe * k as u64 + 1) * chunk + 2 * 4096,
            &[0x5A; 4096],
            false,
        )
        .expect("write");
    let q_member = g.stripe_member(stripe, k + 1);
    let live = |images: &Images, slot: usize| {
        read_ring(images[slot].as_ref().expect("present"), 2)
            .1
            .into_iter()
            .filter(|e| e.stripe == stripe)
            .count()
    };
    let before = mem_images(&io);
    assert!(
        live(&before, q_member) > 0 && live(&before, g.stripe_member(stripe, k)) > 0,
        "the write's entry is live on the P and the Q member"
    );
    array.fail_member(q_member).expect("fail");
    array.remove_member(q_member).expect("remove");
    let outcome = array
        .add_member(NewMember::Image {
            label: "new".to_string(),
            size_bytes: member_bytes(chunk, rows),
        })
        .expect("add");
    assert_eq!(outcome, AddOutcome::Rebuilding { slot: q_member });
    assert!(array.wait_idle(Duration::from_secs(30)), "rebuild finished");
    let after = mem_images(&io);
    for slot in 0..g.members {
        assert_eq!(
            live(&after, slot),
            0,
            "slot {slot} still holds a live entry"
        );
    }
}

/// A write whose window rides a stream entry in one stripe and logs an entry for another must not hold the
/// ridden round while it waits for its own: the wait may be for ring space that only retiring the ridden round
/// would free, and that round cannot retire before the writer completes. Found on tmpfs, where sixteen threads
/// of random 4 KiB writes hung for good: every writer and round leader waited, the oldest live round counting
/// the one writer that rode it.
///
/// One thread is enough: a stream entry in stripe 0 (its last data chunk, whole), then stream entries in
/// stripes with stripe 1's parity members until their rings are one entry short of full, then a write of the
/// last page of stripe 0 and the first of stripe 1. Stripe 0's part may ride the oldest round, stripe 1's needs
/// an entry, and there is no room for it without retiring that round. A watchdog turns a hang into a failure.
#[test]
fn a_window_that_rides_and_logs_never_waits_on_its_own_ride() {
    let fresh = || {
        let (_io, array) = mem_array(Level::Raid6, 6, 65536, 512);
        // No background tick: its flushes and retirements would make room at times of their own.
        array.set_integrity_tick(false);
        array
    };
    let stream_write = |array: &Array, stripe: u64| {
        let end = (stripe + 1) * array.geometry().stripe_bytes();
        array
            .write(end - 65536, &[stripe as u8; 65536], false)
            .expect("stream write");
    };
    // How many such entries fit in the ring before it first retires: stripe 0's, then those of stripes with
    // stripe 1's parity members (1 + members, 1 + 2 members, ...), so that it is their rings that fill.
    let period = {
        let g = fresh().geometry();
        let k = g.data_per_stripe();
        let period = g.members as u64;
        assert!((0..2).all(|i| g.stripe_member(1, k + i) == g.stripe_member(1 + period, k + i)));
        period
    };
    let fill = |array: &Array, count: Option<u64>| -> u64 {
        stream_write(array, 0);
        let mut n = 1u64;
        while count.map_or(array.integrity().log_retirements == 0, |c| n < c) {
            stream_write(array, 1 + n * period);
            n += 1;
            assert!(n < 80, "the ring never filled");
        }
        n
    };
    let fit = fill(&fresh(), None) - 1;
    let array = Arc::new(fresh());
    fill(&array, Some(fit));
    assert_eq!(
        array.integrity().log_retirements,
        0,
        "the ring is not full yet"
    );
    let stripe_bytes = array.geometry().stripe_bytes();
    let writer = {
        let array = array.clone();
        std::thread::spawn(move || {
            array
                .write(stripe_bytes - 4096, &[0xee; 8192], false)
                .expect("spanning write");
        })
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !writer.is_finished() {
        assert!(
            std::time::Instant::now() < deadline,
            "a write spanning stripes 0 and 1 did not finish in 30 s: the log is deadlocked ({:?})",
            array.integrity()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    writer.join().expect("writer");
    let report = array.integrity();
    assert!(report.log_retirements > 0, "{report:?}");
    let mut got = vec![0u8; 8192];
    array.read(stripe_bytes - 4096, &mut got).expect("read");
    assert!(got.iter().all(|&b| b == 0xee));
    figure(
        "ride_and_log",
        &format!(
            "{fit} stream entries fill the ring; a write riding the oldest of them and logging another stripe \
             completes ({} retirements)",
            report.log_retirements
        ),
    );
}

/// Sixteen threads of writes of 4-40 KiB, many crossing a stripe boundary, on a ring of just over the two
/// requests the log must hold, with one round and with four in flight: the ring is full most of the time, and
/// every writer must keep going (the two hangs of `a_window_that_rides_and_logs_never_waits_on_its_own_ride` and
/// `ppl::rounds::tests::a_leader_does_not_wait_for_room_on_a_round_it_is_a_writer_of` both lived here). Each
/// thread writes its own stretch of the array, which reads back as it last wrote it.
#[test]
fn sixteen_writers_keep_going_on_a_small_ring() {
    use std::sync::atomic::{AtomicU64, Ordering};
    let (threads, stretch_stripes) = (16u64, 8u64);
    for rounds in [1usize, 4] {
        let chunk = 16384u64;
        let members = 6usize;
        let rows = threads * stretch_stripes;
        let data_offset = paraid_engine::small_ring_data_offset_bytes(Level::Raid6, chunk, 0);
        let io = Arc::new(MemMembers::new(members, data_offset + rows * chunk));
        paraid_engine::create_io_with_data_offset(
            io.as_ref(),
            Level::Raid6,
            chunk,
            "small",
            data_offset,
        )
        .expect("create");
        let mut opts = options(true);
        opts.log_rounds_in_flight = Some(rounds);
        let array = Arc::new(assemble_io(io.clone(), opts).expect("assemble"));
        assert!(
            array.integrity().log_enabled,
            "the smallest ring the log works with keeps the log"
        );
        array.set_integrity_tick(false);
        let stripe_bytes = array.geometry().stripe_bytes();
        let finished = Arc::new(AtomicU64::new(0));
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let array = array.clone();
                let finished = finished.clone();
                std::thread::spawn(move || {
                    let base = t * stretch_stripes * stripe_bytes;
                    let len_bytes = stretch_stripes * stripe_bytes;
                    let mut model = vec![0u8; len_bytes as usize];
                    let mut rng = SplitMix64::new(t + 100 * rounds as u64);
                    for i in 0..300u64 {
                        let pages = 1 + rng.below(10);
                        let at = rng.below(len_bytes / 4096 - pages) * 4096;
                        let buf = vec![(i as u8) ^ (t as u8); (pages * 4096) as usize];
                        array.write(base + at, &buf, false).expect("write");
                        model[at as usize..(at + pages * 4096) as usize].copy_from_slice(&buf);
                    }
                    let mut got = vec![0u8; len_bytes as usize];
                    array.read(base, &mut got).expect("read");
                    assert!(
                        got == model,
                        "thread {t}: its stretch reads back as written"
                    );
                    finished.fetch_add(1, Ordering::SeqCst);
                })
            })
            .collect();
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        // Until every writer is done, or one ended without finishing (a panic, which its join reports).
        while handles.iter().any(|h| !h.is_finished()) {
            let ended = handles.iter().filter(|h| h.is_finished()).count() as u64;
            if ended > finished.load(Ordering::SeqCst) {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{rounds} round(s) in flight: {} of {threads} writers finished in 60 s: hung ({:?})",
                finished.load(Ordering::SeqCst),
                array.integrity()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        for h in handles {
            h.join().expect("writer");
        }
        let report = array.integrity();
        assert!(
            report.log_retire_flushes > 10,
            "the ring filled again and again: {report:?}"
        );
        figure(
            &format!("small_ring_{rounds}"),
            &format!(
                "16 threads x 300 writes of 4-40 KiB, RAID6, data offset {} KiB (the smallest ring), {rounds} \
                 round(s) in flight: {} rounds, {} times full, {} rides",
                data_offset / 1024,
                report.log_rounds,
                report.log_retire_flushes,
                report.log_rides
            ),
        );
    }
}

/// A full-stripe write into a stripe whose newest live entry is a whole marker (every chunk modified, no payload)
/// logs none: the marker already has recovery take the stripe's parity from its data, which is what the write
/// needs (a database's doublewrite area, rewritten whole over and over, logged one marker per write). Here the
/// second of two whole writes logs nothing; the power goes with it torn (some members hold it, the rest the first
/// write), and the array is assembled without a data member that got the new write, one that kept the old, P, or Q.
/// Every other stripe reads back, and each present chunk of the stripe holds the first write or the second.
#[test]
fn a_full_stripe_write_under_a_whole_marker_logs_none_and_survives_a_torn_write() {
    let chunk = 16384u64;
    let (io, array) = mem_array(Level::Raid6, 6, chunk, 16);
    array.set_integrity_tick(false);
    let g = array.geometry();
    let k = g.data_per_stripe();
    let stripe_bytes = g.stripe_bytes();
    let mut rng = SplitMix64::new(31);
    let data = fill_flushed(&array, &mut rng);
    let stripe = 5u64;
    let at = stripe * stripe_bytes;
    // A partial write (a live entry with partial parity), then the stripe written whole: a whole marker over it.
    array
        .write(at + 4096, &[0x11; 4096], false)
        .expect("partial write");
    let mut first = vec![0u8; stripe_bytes as usize];
    rng.fill(&mut first);
    array.write(at, &first, false).expect("first whole write");
    assert_eq!(
        array.integrity().log_markers_skipped,
        0,
        "the first whole write logs its marker"
    );
    let before = mem_images(&io);
    let mut second = vec![0u8; stripe_bytes as usize];
    rng.fill(&mut second);
    array.write(at, &second, false).expect("second whole write");
    let report = array.integrity();
    assert_eq!(
        report.log_markers_skipped, 1,
        "the second whole write logs no marker"
    );
    let after = mem_images(&io);
    drop(array); // no clean stop
                 // Torn: data chunks 0 and 1 and P got the second write; chunks 2 and 3 and Q kept the first.
    let got_new = [0usize, 1, k];
    let mut torn: Images = before.clone();
    for i in got_new {
        let member = g.stripe_member(stripe, i);
        torn[member] = after[member].clone();
    }
    for missing in [0usize, 2, k, k + 1] {
        let (array, all) = reassembled_without(torn.clone(), &g, stripe, &[missing]);
        let (s, e) = (at as usize, (at + stripe_bytes) as usize);
        assert!(
            all[..s] == data[..s] && all[e..] == data[e..],
            "stripe index {missing} missing: another stripe reads back changed"
        );
        for i in (0..k).filter(|&i| i != missing) {
            let c = (i as u64 * chunk) as usize;
            let piece = &all[s + c..s + c + chunk as usize];
            assert!(
                piece == &first[c..c + chunk as usize] || piece == &second[c..c + chunk as usize],
                "stripe index {missing} missing: chunk {i} holds neither whole write"
            );
        }
        array.stop().expect("stop");
    }
}
