//! `Export::write_arriving` (transmission.rs): a WRITE whose payload the server is still reading off the socket
//! counts as arriving, and stops counting before the export serves it. paraid's write gathering keeps a leader
//! waiting while a continuation is on its way (engine `array/gather.rs`, `Gatherer::parked`).

mod common;

use std::thread;
use std::time::{Duration, Instant};

use common::*;
use paraid_nbd::proto::*;

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

    client.request(0, CMD_DISC, 3, 0, 0).unwrap();
    assert!(client.closed_within(Duration::from_secs(5)));
    handle.join().unwrap().expect("clean disconnect");
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
