//! `Export::write_arriving` (transmission.rs): a WRITE whose payload the server is still reading off the socket
//! counts as arriving, and stops counting before the export serves it. `Export::write_follows`: a WRITE that
//! continues the one being handed on, already in the socket behind it, is told before that one is served.
//! paraid's write gathering keeps a leader waiting while a continuation is on its way (engine `array/gather.rs`,
//! `Gatherer::parked`, `Table::following`).

mod common;

use std::thread;
use std::time::{Duration, Instant};

use common::*;
use paraid_nbd::proto::*;
use paraid_nbd::ServerConfig;

const SIZE: usize = 1 << 20;

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "timed out waiting for {what}"
        );
        thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn a_write_counts_as_arriving_while_its_payload_is_on_the_wire() {
    let (export, mut client, handle) = serve_recording(SIZE, small_config());
    let payload = pseudo_random_bytes(64 << 10, 7);
    let mut header = RawClient::request_bytes(0, CMD_WRITE, 1, 4096, payload.len() as u32);
    header.extend_from_slice(&payload[..1000]);
    client.send(&header).unwrap();
    wait_until("the server to read the header", || {
        export.arriving() == (1, 1)
    });
    // Half a payload in: still arriving, and nothing written yet.
    thread::sleep(Duration::from_millis(50));
    assert_eq!(export.arriving(), (1, 1));
    assert!(export.mutating_calls().is_empty());
    client.send(&payload[1000..]).unwrap();
    assert_eq!(client.simple_reply().unwrap(), (0, 1));
    assert_eq!(export.arriving(), (0, 1), "handed on before it was served");
    assert_eq!(export.contents()[4096..4096 + payload.len()], payload[..]);

    // A refused WRITE (past the end) is read off the socket and dropped: never told arriving.
    client
        .write_request(0, 2, SIZE as u64, &payload[..4096])
        .unwrap();
    let (error, reply_handle) = client.simple_reply().unwrap();
    assert_ne!(error, 0);
    assert_eq!(reply_handle, 2);
    assert_eq!(export.arriving(), (0, 1));

    disconnect(client, handle);
}

#[test]
fn a_connection_closed_mid_payload_leaves_nothing_arriving() {
    let (export, mut client, handle) = serve_recording(SIZE, small_config());
    let mut header = RawClient::request_bytes(0, CMD_WRITE, 1, 0, 8192);
    header.extend_from_slice(&[7u8; 100]);
    client.send(&header).unwrap();
    wait_until("the server to read the header", || {
        export.arriving() == (1, 1)
    });
    drop(client);
    let _ = handle.join().unwrap();
    assert_eq!(export.arriving(), (0, 1));
    assert!(export.mutating_calls().is_empty());
}

/// A continuation whose payload the connection cuts short while it is being merged is not told: the request it
/// would have been never comes.
#[test]
fn a_continuation_cut_short_while_merged_is_not_told() {
    let (export, mut client, handle) = serve_recording(SIZE, small_config());
    let mut bytes = RawClient::request_bytes(0, CMD_WRITE, 1, 0, 4096);
    bytes.extend(pseudo_random_bytes(4096, 1));
    bytes.extend(RawClient::request_bytes(0, CMD_WRITE, 2, 4096, 4096));
    bytes.extend_from_slice(&[7u8; 100]);
    // Whether the server reads before or after the close, it finds the second payload cut short.
    client.send(&bytes).unwrap();
    drop(client);
    let _ = handle.join().unwrap();
    assert!(export.follows().is_empty(), "{:?}", export.follows());
}

/// WRITEs sent in one piece (small: a few pages in all), so each is in the socket before the server reads the
/// one before it.
fn send_writes(client: &mut RawClient, requests: &[(u64, u64, usize)]) {
    let mut bytes = Vec::new();
    for &(handle, offset_bytes, length_bytes) in requests {
        bytes.extend(RawClient::request_bytes(
            0,
            CMD_WRITE,
            handle,
            offset_bytes,
            length_bytes as u32,
        ));
        bytes.extend(pseudo_random_bytes(length_bytes, handle));
    }
    client.send(&bytes).unwrap();
}

#[test]
fn a_write_that_continues_the_one_before_it_is_told_before_that_one_is_served() {
    // Merging off: each WRITE is served by itself.
    let config = ServerConfig {
        merge_write_bytes: 0,
        ..small_config()
    };
    let (export, mut client, handle) = serve_recording(SIZE, config);
    send_writes(
        &mut client,
        &[
            (1, 0, 4096),
            (2, 4096, 4096),
            // Not continuations: gaps, one backwards.
            (3, 200_000, 4096),
            (4, 100_000, 4096),
            (5, 300_000, 4096),
        ],
    );
    let mut answered = Vec::new();
    for _ in 0..5 {
        let (error, reply_handle) = client.simple_reply().unwrap();
        assert_eq!(error, 0);
        answered.push(reply_handle);
    }
    let follows = export.follows();
    assert_eq!(follows.len(), 1, "{follows:?}");
    assert_eq!(follows[0].0, 4096);
    assert_eq!(
        follows[0].1, 0,
        "told before the write it continues was served"
    );

    // A FUA continuation is not told (it is written at once, never gathered).
    let mut fua = RawClient::request_bytes(0, CMD_WRITE, 6, 400_000, 4096);
    fua.extend(pseudo_random_bytes(4096, 6));
    let mut next = RawClient::request_bytes(CMD_FLAG_FUA, CMD_WRITE, 7, 404_096, 4096);
    next.extend(pseudo_random_bytes(4096, 7));
    fua.extend(next);
    client.send(&fua).unwrap();
    for _ in 0..2 {
        assert_eq!(client.simple_reply().unwrap().0, 0);
    }
    assert_eq!(export.follows().len(), 1, "{:?}", export.follows());

    disconnect(client, handle);
}

#[test]
fn writes_merged_into_one_tell_nothing() {
    let (export, mut client, handle) = serve_recording(SIZE, small_config());
    send_writes(&mut client, &[(1, 0, 4096), (2, 4096, 4096)]);
    for _ in 0..2 {
        assert_eq!(client.simple_reply().unwrap().0, 0);
    }
    let writes = export.mutating_calls();
    assert_eq!(writes.len(), 1, "merged: {writes:?}");
    assert!(export.follows().is_empty(), "{:?}", export.follows());
    disconnect(client, handle);
}

/// A continuation too long to merge is told from what merging saw behind the write (no second look).
#[test]
fn a_continuation_too_long_to_merge_is_told() {
    let config = ServerConfig {
        merge_write_bytes: 8192,
        ..small_config()
    };
    let (export, mut client, handle) = serve_recording(SIZE, config);
    send_writes(&mut client, &[(1, 0, 4096), (2, 4096, 8192)]);
    for _ in 0..2 {
        assert_eq!(client.simple_reply().unwrap().0, 0);
    }
    assert_eq!(export.mutating_calls().len(), 2, "not merged");
    assert_eq!(export.follows(), vec![(4096, 0)]);
    disconnect(client, handle);
}
