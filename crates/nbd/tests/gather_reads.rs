//! Gathering of READs that arrived together (transmission.rs, `gather_following_reads`): they reach the export
//! in one `read_many` call, each still gets its own reply with its own bytes, a failed one fails alone, and
//! gathering stops at its limits (count, size of each read and of all, another command between).
//!
//! As in merge.rs, every test sends all its requests in one `send` of less than 32 KiB, so the server's first
//! read takes all of it and the export calls are exact.

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use common::*;
use paraid_nbd::proto::*;
use paraid_nbd::{Export, NbdError, ServerConfig};

const SIZE: usize = 4 << 20;

/// A recording export holding pseudo-random bytes, served with `gather_reads`, and a client past the handshake.
fn serve(
    gather_reads: usize,
    structured: bool,
) -> (
    Arc<RecordingExport>,
    RawClient,
    JoinHandle<Result<(), NbdError>>,
) {
    let (export, client, handle) = serve_recording_with(
        SIZE,
        ServerConfig {
            gather_reads,
            ..small_config()
        },
        structured,
    );
    export
        .write(0, &pseudo_random_bytes(SIZE, 7), false)
        .unwrap();
    (export, client, handle)
}

fn disconnect(mut client: RawClient, handle: JoinHandle<Result<(), NbdError>>) {
    client.request(0, CMD_DISC, 0, 0, 0).unwrap();
    assert!(client.closed_within(Duration::from_secs(5)));
    handle.join().unwrap().expect("clean disconnect");
}

/// READs (offset, length) with handles 1, 2, ..., sent in one send (a WRITE of 512 bytes where the length is 0).
fn send_reads(client: &mut RawClient, reads: &[(u64, u32)]) {
    let mut bytes = Vec::new();
    for (n, &(offset, len)) in reads.iter().enumerate() {
        let handle = n as u64 + 1;
        if len == 0 {
            bytes.extend(RawClient::request_bytes(0, CMD_WRITE, handle, offset, 512));
            // The bytes it already holds there: what any READ may see stays `expected`.
            bytes.extend(expected(offset, 512));
        } else {
            bytes.extend(RawClient::request_bytes(0, CMD_READ, handle, offset, len));
        }
    }
    assert!(bytes.len() < 32 * 1024, "the batch must arrive in one read");
    client.send(&bytes).unwrap();
}

/// Every reply to `reads` (simple replies): per handle, its error and its data.
fn simple_replies(client: &mut RawClient, reads: &[(u64, u32)]) -> HashMap<u64, (u32, Vec<u8>)> {
    let mut replies = HashMap::new();
    for _ in reads {
        let (error, handle) = client.simple_reply().unwrap();
        let len = reads[handle as usize - 1].1 as usize;
        let data = if error == 0 {
            client.read_bytes(len).unwrap()
        } else {
            Vec::new()
        };
        assert!(
            replies.insert(handle, (error, data)).is_none(),
            "handle {handle} answered twice"
        );
    }
    replies
}

/// The export's `read_many` batch sizes, smallest first: batches served by different workers may reach it in
/// either order.
fn sorted_batches(export: &RecordingExport) -> Vec<usize> {
    let mut batches = export.read_batches();
    batches.sort();
    batches
}

fn expected(offset: u64, len: u32) -> Vec<u8> {
    let all = pseudo_random_bytes(SIZE, 7);
    all[offset as usize..offset as usize + len as usize].to_vec()
}

/// Scattered 4 KiB reads, as a random-read client sends them.
fn scattered(count: usize, len: u32) -> Vec<(u64, u32)> {
    (0..count as u64)
        .map(|i| ((i * 7919 * 4096) % (SIZE as u64 - u64::from(len)), len))
        .collect()
}

#[test]
fn reads_that_arrived_together_reach_the_export_in_one_call_and_each_gets_its_bytes() {
    let (export, mut client, handle) = serve(16, false);
    let reads = scattered(8, 4096);
    send_reads(&mut client, &reads);
    let replies = simple_replies(&mut client, &reads);
    for (n, &(offset, len)) in reads.iter().enumerate() {
        let (error, data) = &replies[&(n as u64 + 1)];
        assert_eq!(*error, 0, "read {n}");
        assert!(*data == expected(offset, len), "read {n}: wrong bytes");
    }
    assert_eq!(export.read_batches(), vec![8]);
    assert_eq!(export.out_of_range_calls(), 0);
    disconnect(client, handle);
}

#[test]
fn a_read_that_fails_fails_alone() {
    let (export, mut client, handle) = serve(16, false);
    let reads = scattered(6, 4096);
    *export.fail_read_at.lock().unwrap() = Some(reads[3].0);
    send_reads(&mut client, &reads);
    let replies = simple_replies(&mut client, &reads);
    for (n, &(offset, len)) in reads.iter().enumerate() {
        let (error, data) = &replies[&(n as u64 + 1)];
        if n == 3 {
            assert_eq!(*error, libc::EIO as u32);
        } else {
            assert_eq!(*error, 0, "read {n}");
            assert!(*data == expected(offset, len), "read {n}: wrong bytes");
        }
    }
    assert_eq!(export.read_batches(), vec![6]);
    disconnect(client, handle);
}

#[test]
fn gathered_reads_come_back_as_structured_replies() {
    let (export, mut client, handle) = serve(16, true);
    // Lengths that are not whole pages: each read still lands in its own place.
    let reads: Vec<(u64, u32)> = vec![(4096, 512), (70_000, 1000), (1 << 20, 4096), (5, 3)];
    send_reads(&mut client, &reads);
    let mut seen = Vec::new();
    for _ in &reads {
        let reply = client.structured_reply().unwrap();
        let (offset, len) = reads[reply.handle as usize - 1];
        assert_eq!(reply.error, None);
        assert_eq!(reply.data.len(), 1);
        assert_eq!(reply.data[0].0, offset);
        assert!(
            reply.data[0].1 == expected(offset, len),
            "handle {}",
            reply.handle
        );
        seen.push(reply.handle);
    }
    seen.sort();
    assert_eq!(seen, vec![1, 2, 3, 4]);
    assert_eq!(export.read_batches(), vec![4]);
    disconnect(client, handle);
}

#[test]
fn gathering_stops_at_its_count_at_large_reads_and_at_other_commands() {
    // At most three per call.
    let (export, mut client, handle) = serve(3, false);
    let reads = scattered(8, 4096);
    send_reads(&mut client, &reads);
    simple_replies(&mut client, &reads);
    assert_eq!(sorted_batches(&export), vec![2, 3, 3]);
    disconnect(client, handle);

    // A read over 64 KiB goes alone; one of 64 KiB gathers, up to 512 KiB in all.
    let (export, mut client, handle) = serve(16, false);
    let mut reads = vec![(0, 128 << 10), (1 << 20, 4096)];
    reads.extend((0..10).map(|i| (i * (64 << 10), 64 << 10)));
    send_reads(&mut client, &reads);
    let replies = simple_replies(&mut client, &reads);
    for (n, &(offset, len)) in reads.iter().enumerate() {
        assert!(
            replies[&(n as u64 + 1)].1 == expected(offset, len),
            "read {n}"
        );
    }
    // The 128 KiB read is served by `read` (no batch); then the 4 KiB read leads 7 of 64 KiB (4 KiB + 7 x 64 KiB
    // fit in 512 KiB, an eighth would not), and the last three follow.
    assert_eq!(sorted_batches(&export), vec![3, 8]);
    disconnect(client, handle);

    // A WRITE between READs ends the gather (the READ after it may see the write).
    let (export, mut client, handle) = serve(16, false);
    let reads = vec![
        (0, 4096),
        (8192, 4096),
        (65536, 0),
        (65536, 4096),
        (4096, 4096),
    ];
    send_reads(&mut client, &reads);
    let replies = simple_replies(&mut client, &reads);
    assert!(replies.values().all(|(error, _)| *error == 0));
    assert_eq!(export.read_batches(), vec![2, 2]);
    disconnect(client, handle);
}

#[test]
fn gathering_off_serves_every_read_alone() {
    let (export, mut client, handle) = serve(0, false);
    let reads = scattered(5, 4096);
    send_reads(&mut client, &reads);
    let replies = simple_replies(&mut client, &reads);
    assert_eq!(replies.len(), 5);
    assert!(export.read_batches().is_empty());
    let read_calls = export
        .calls()
        .into_iter()
        .filter(|c| c.kind == CallKind::Read)
        .count();
    assert_eq!(read_calls, 5);
    disconnect(client, handle);
}
