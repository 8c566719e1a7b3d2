//! Merging of WRITEs that continue one another (transmission.rs, `merge_following_writes`): requests that have
//! arrived together are served as one export write, each still gets its own reply, and nothing that should stay
//! apart is merged (other flags, a gap, another command between, past the size limit).
//!
//! Every test sends all its requests in one `send` of less than 32 KiB: a Unix stream socket queues a send that
//! small as one buffer (larger ones are cut at about 36 KiB), so the server's first read takes all of it, what
//! has "arrived" when the server looks is fixed, and the export calls are exact.

mod common;

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use common::*;
use paraid_nbd::proto::*;
use paraid_nbd::{NbdError, ServerConfig};

const SIZE: usize = 1 << 20;
const PIECE: usize = 2048;

fn serve(
    merge_write_bytes: u32,
) -> (
    Arc<RecordingExport>,
    RawClient,
    JoinHandle<Result<(), NbdError>>,
) {
    serve_recording(
        SIZE,
        ServerConfig {
            merge_write_bytes,
            ..small_config()
        },
    )
}

/// One request of a batch: flags, kind, offset, length (WRITEs carry a payload made from their handle).
struct Req(u16, u16, u64, u32);

fn payload(handle: u64, len: u32) -> Vec<u8> {
    pseudo_random_bytes(len as usize, handle)
}

/// `reqs` on the wire, handles 1, 2, ...
fn wire_bytes(reqs: &[Req]) -> Vec<u8> {
    let mut bytes = Vec::new();
    for (n, Req(flags, kind, offset, len)) in reqs.iter().enumerate() {
        let handle = n as u64 + 1;
        bytes.extend(RawClient::request_bytes(
            *flags, *kind, handle, *offset, *len,
        ));
        if *kind == CMD_WRITE {
            bytes.extend(payload(handle, *len));
        }
    }
    bytes
}

/// `reqs` on the wire, small enough to arrive in one read.
fn batch_bytes(reqs: &[Req]) -> Vec<u8> {
    let bytes = wire_bytes(reqs);
    assert!(bytes.len() < 32 * 1024, "the batch must arrive in one read");
    bytes
}

/// Sends `reqs` in one send and returns the replies as (handle, error), sorted by handle.
fn send_batch(client: &mut RawClient, reqs: &[Req]) -> Vec<(u64, u32)> {
    client.send(&batch_bytes(reqs)).unwrap();
    let mut replies: Vec<(u64, u32)> = (0..reqs.len())
        .map(|_| {
            let (error, handle) = client.simple_reply().unwrap();
            (handle, error)
        })
        .collect();
    replies.sort();
    replies
}

/// The export's write calls as (offset, length, fua), sorted by offset.
fn writes(export: &RecordingExport) -> Vec<(u64, u64, bool)> {
    let mut writes: Vec<(u64, u64, bool)> = export
        .calls()
        .into_iter()
        .filter_map(|c| match c.kind {
            CallKind::Write { fua } => Some((c.offset_bytes, c.len_bytes, fua)),
            _ => None,
        })
        .collect();
    writes.sort();
    writes
}

fn all_ok(n: usize) -> Vec<(u64, u32)> {
    (1..=n as u64).map(|h| (h, 0)).collect()
}

/// What the export must hold after `reqs` (each WRITE's payload at its offset).
fn assert_contents(export: &RecordingExport, reqs: &[Req]) {
    let mut expected = vec![0u8; SIZE];
    for (n, Req(_, kind, offset, len)) in reqs.iter().enumerate() {
        if *kind == CMD_WRITE {
            let at = *offset as usize;
            expected[at..at + *len as usize].copy_from_slice(&payload(n as u64 + 1, *len));
        }
    }
    assert!(export.contents() == expected, "export contents differ");
}

fn write(offset: u64) -> Req {
    Req(0, CMD_WRITE, offset, PIECE as u32)
}

#[test]
fn writes_that_continue_one_another_become_one_export_write() {
    let (export, mut client, handle) = serve(1 << 20);
    let reqs: Vec<Req> = (0..8).map(|i| write(65536 + i * PIECE as u64)).collect();
    assert_eq!(send_batch(&mut client, &reqs), all_ok(8));
    assert_eq!(writes(&export), vec![(65536, 8 * PIECE as u64, false)]);
    assert_contents(&export, &reqs);
    disconnect(client, handle);
}

#[test]
fn merging_stops_at_the_size_limit() {
    let (export, mut client, handle) = serve(3 * PIECE as u32);
    let reqs: Vec<Req> = (0..8).map(|i| write(i * PIECE as u64)).collect();
    assert_eq!(send_batch(&mut client, &reqs), all_ok(8));
    let p = PIECE as u64;
    assert_eq!(
        writes(&export),
        vec![
            (0, 3 * p, false),
            (3 * p, 3 * p, false),
            (6 * p, 2 * p, false)
        ]
    );
    assert_contents(&export, &reqs);
    disconnect(client, handle);
}

#[test]
fn merging_off_serves_every_write_alone() {
    let (export, mut client, handle) = serve(0);
    let reqs: Vec<Req> = (0..4).map(|i| write(i * PIECE as u64)).collect();
    assert_eq!(send_batch(&mut client, &reqs), all_ok(4));
    let p = PIECE as u64;
    assert_eq!(
        writes(&export),
        (0..4).map(|i| (i * p, p, false)).collect::<Vec<_>>()
    );
    disconnect(client, handle);
}

#[test]
fn other_flags_gaps_and_other_commands_are_not_merged() {
    let (export, mut client, handle) = serve(1 << 20);
    let p = PIECE as u64;
    let reqs = vec![
        write(0),
        write(p),
        Req(CMD_FLAG_FUA, CMD_WRITE, 2 * p, PIECE as u32), // FUA: apart from the two before
        Req(CMD_FLAG_FUA, CMD_WRITE, 3 * p, PIECE as u32), // continues the FUA one
        write(4 * p),
        write(6 * p), // a gap
        Req(0, CMD_FLUSH, 0, 0),
        write(7 * p), // continues, but after a flush
        write(6 * p), // goes backwards
        Req(0, CMD_READ, 0, PIECE as u32),
        write(7 * p), // after a read
    ];
    let bytes = batch_bytes(&reqs);
    client.send(&bytes).unwrap();
    let mut replies = Vec::new();
    for _ in 0..reqs.len() {
        let (error, handle) = client.simple_reply().unwrap();
        if handle == 10 {
            client.read_bytes(PIECE).unwrap(); // the READ's data
        }
        replies.push((handle, error));
    }
    replies.sort();
    assert_eq!(replies, all_ok(reqs.len()));
    let mut expected = vec![
        (0, 2 * p, false),
        (2 * p, 2 * p, true),
        (4 * p, p, false),
        (6 * p, p, false),
        (7 * p, p, false),
        (6 * p, p, false),
        (7 * p, p, false),
    ];
    expected.sort();
    assert_eq!(writes(&export), expected);
    disconnect(client, handle);
}

#[test]
fn a_failed_merged_write_fails_every_request_in_it() {
    let (export, mut client, handle) = serve(1 << 20);
    *export.fail_with.lock().unwrap() = Some(|| std::io::Error::other("member gone"));
    let reqs: Vec<Req> = (0..5).map(|i| write(i * PIECE as u64)).collect();
    let eio = ErrorCode::Io.wire_value();
    assert_eq!(
        send_batch(&mut client, &reqs),
        (1..=5).map(|h| (h, eio)).collect::<Vec<_>>()
    );
    assert_eq!(writes(&export), vec![(0, 5 * PIECE as u64, false)]);
    *export.fail_with.lock().unwrap() = None;
    disconnect(client, handle);
}

#[test]
fn a_refused_write_is_not_merged_and_is_refused_alone() {
    let (export, mut client, handle) = serve(1 << 20);
    let p = PIECE as u64;
    // The second would end past the export: refused with ENOSPC by itself. The third continues the first, but
    // the refused one between them ends the merge.
    let reqs = vec![
        write(SIZE as u64 - 2 * p),
        Req(0, CMD_WRITE, SIZE as u64 - p, 2 * PIECE as u32),
        write(SIZE as u64 - p),
    ];
    let replies = send_batch(&mut client, &reqs);
    assert_eq!(
        replies,
        vec![(1, 0), (2, ErrorCode::NoSpc.wire_value()), (3, 0)]
    );
    assert_eq!(
        writes(&export),
        vec![(SIZE as u64 - 2 * p, p, false), (SIZE as u64 - p, p, false)]
    );
    assert_eq!(export.out_of_range_calls(), 0);
    disconnect(client, handle);
}

/// xorshift64: the seeded draws of the randomized test below.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Randomized: runs of WRITEs that continue one another (random lengths, FUA on some runs, flushes and other
/// commands between), never two covering the same byte, sent in pieces cut at random points (mid-header, mid-
/// payload) with pauses, so that requests arrive whole, in parts, or together. Every request must get exactly
/// one successful reply, the export must end holding every payload where it was written, and no export write
/// may exceed the limit or leave the export. Each seed replays exactly what it sent; a failure names its seed.
#[test]
fn randomly_cut_streams_of_writes_are_served_exactly() {
    let mut merged_somewhere = false;
    for seed in 1..=24u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let limit = [0u32, 8192, 65536, 1 << 20][(seed % 4) as usize];
        let (export, mut client, handle) = serve(limit);
        // Runs at random places of a shuffled list of 16 KiB-aligned slots, so no two writes overlap.
        let mut slots: Vec<u64> = (0..(SIZE as u64 / 16384)).collect();
        for i in (1..slots.len()).rev() {
            slots.swap(i, rng.below(i as u64 + 1) as usize);
        }
        let mut reqs: Vec<Req> = Vec::new();
        for slot in slots.iter().take(40) {
            let fua = if rng.below(4) == 0 { CMD_FLAG_FUA } else { 0 };
            let mut offset = slot * 16384;
            let end = offset + 16384;
            while offset < end {
                let len = (1 + rng.below(6000)).min(end - offset) as u32;
                reqs.push(Req(fua, CMD_WRITE, offset, len));
                offset += u64::from(len);
                if rng.below(10) == 0 {
                    reqs.push(Req(0, CMD_FLUSH, 0, 0));
                }
            }
        }
        let bytes = wire_bytes(&reqs);
        let mut at = 0;
        while at < bytes.len() {
            let piece = (1 + rng.below(20_000) as usize).min(bytes.len() - at);
            client.send(&bytes[at..at + piece]).unwrap();
            at += piece;
            if rng.below(3) == 0 {
                std::thread::sleep(Duration::from_micros(rng.below(300)));
            }
        }
        let mut replies: Vec<(u64, u32)> = (0..reqs.len())
            .map(|_| {
                let (error, handle) = client.simple_reply().unwrap();
                (handle, error)
            })
            .collect();
        replies.sort();
        assert_eq!(replies, all_ok(reqs.len()), "seed {seed}");
        assert_contents(&export, &reqs);
        let writes = writes(&export);
        let requested: Vec<&Req> = reqs.iter().filter(|r| r.1 == CMD_WRITE).collect();
        let written: u64 = writes.iter().map(|w| w.1).sum();
        let asked: u64 = requested.iter().map(|r| u64::from(r.3)).sum();
        assert_eq!(written, asked, "seed {seed}: every byte written once");
        assert_eq!(export.out_of_range_calls(), 0, "seed {seed}");
        let longest_request = requested.iter().map(|r| u64::from(r.3)).max().unwrap();
        assert!(
            writes
                .iter()
                .all(|w| w.1 <= u64::from(limit).max(longest_request)),
            "seed {seed}: an export write exceeds the merge limit {limit}"
        );
        if limit == 0 {
            assert_eq!(writes.len(), requested.len(), "seed {seed}: merging is off");
        }
        merged_somewhere |= writes.len() < requested.len();
        disconnect(client, handle);
    }
    assert!(
        merged_somewhere,
        "no seed merged anything: the test no longer exercises merging"
    );
}

/// Many small replies finishing at once (writes to scattered places and flushes, 32 in flight, 16 workers):
/// every reply must arrive. A reply left queued by the combining of replies (`ReplySink`) would stall the
/// client until its read timeout and fail here; an earlier draft of that combining did so under fio's commit
/// stream (a write and its flush in flight together).
#[test]
fn every_reply_arrives_when_many_finish_at_once() {
    let config = ServerConfig {
        workers_per_connection: 16,
        ..small_config()
    };
    let (_export, mut client, handle) = serve_recording(SIZE, config);
    let total = 100_000u64;
    let window = 32u64;
    let data = [0x5au8; 512];
    let send = |client: &mut RawClient, n: u64| {
        if n % 3 == 2 {
            client.request(0, CMD_FLUSH, n, 0, 0).unwrap();
        } else {
            // 512 bytes at the start of a scattered 2 KiB slot: no write continues another, so none merge.
            let offset = (n * 7919 % (SIZE as u64 / 2048)) * 2048;
            client.write_request(0, n, offset, &data).unwrap();
        }
    };
    for n in 0..window {
        send(&mut client, n);
    }
    let mut seen = vec![false; total as usize];
    for received in 0..total {
        let (error, h) = client
            .simple_reply()
            .unwrap_or_else(|e| panic!("reply {received} of {total} missing: {e}"));
        assert_eq!(error, 0);
        assert!(
            !std::mem::replace(&mut seen[h as usize], true),
            "handle {h} twice"
        );
        let next = received + window;
        if next < total {
            send(&mut client, next);
        }
    }
    disconnect(client, handle);
}

/// A client that sends requests but never reads a reply must meet backpressure: once the replies queued for the
/// sender pass their bound, workers wait for the socket instead of queueing more, stop taking requests, and
/// the client's sends block. (Without the bound, flushes would be read and answered into memory for as long
/// as the client kept sending.) Then it reads every reply and leaves cleanly.
#[test]
fn a_client_that_reads_no_replies_is_held_back() {
    let config = ServerConfig {
        workers_per_connection: 4,
        ..small_config()
    };
    let (_export, mut client, handle) = serve_recording(SIZE, config);
    let request = RawClient::request_bytes(0, CMD_FLUSH, 7, 0, 0);
    let batch: Vec<u8> = request.repeat(256);
    client.stream.set_nonblocking(true).unwrap();
    let limit_bytes = 64usize << 20; // 2.4 million flushes: far beyond any buffer on the way
    let mut sent_bytes = 0usize;
    let mut stalled_since: Option<std::time::Instant> = None;
    while sent_bytes < limit_bytes {
        match std::io::Write::write(&mut client.stream, &batch[sent_bytes % batch.len()..]) {
            Ok(n) => {
                sent_bytes += n;
                stalled_since = None;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                // Held back once the socket stays full for a while (the server stopped reading).
                let since = *stalled_since.get_or_insert_with(std::time::Instant::now);
                if since.elapsed() > Duration::from_millis(500) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => panic!("send: {e}"),
        }
    }
    assert!(
        sent_bytes < limit_bytes,
        "the server took {sent_bytes} bytes of requests without the client reading a reply"
    );
    // Finish the request cut short, then read every reply: the server drains and the connection ends cleanly.
    client.stream.set_nonblocking(false).unwrap();
    let partial = sent_bytes % request.len();
    if partial != 0 {
        client.send(&request[partial..]).unwrap();
        sent_bytes += request.len() - partial;
    }
    for _ in 0..sent_bytes / request.len() {
        assert_eq!(client.simple_reply().unwrap(), (0, 7));
    }
    disconnect(client, handle);
}
