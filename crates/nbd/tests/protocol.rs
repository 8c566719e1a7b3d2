//! The server against a byte-level client: handshake corners, malformed and hostile requests, pipelining, the
//! in-flight bound, export failures and shutdown. Every test also checks that the export never saw a call outside
//! its range.

mod common;

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use paraid_nbd::proto::*;
use paraid_nbd::{NbdError, Server, ServerConfig};

const SIZE: usize = 1 << 20;

fn setup(
    export: &Arc<RecordingExport>,
    config: ServerConfig,
) -> (RawClient, thread::JoinHandle<Result<(), NbdError>>) {
    let server = Arc::new(Server::new(export.clone(), config));
    connect_in_process(server, Arc::new(AtomicBool::new(false)))
}

fn connected(
    structured: bool,
) -> (
    Arc<RecordingExport>,
    RawClient,
    thread::JoinHandle<Result<(), NbdError>>,
) {
    let export = RecordingExport::new(SIZE);
    let (mut client, handle) = setup(&export, small_config());
    let (size, _) = client.handshake(structured).unwrap();
    assert_eq!(size, SIZE as u64);
    (export, client, handle)
}

fn disconnect(mut client: RawClient, handle: thread::JoinHandle<Result<(), NbdError>>) {
    client.request(0, CMD_DISC, 0, 0, 0).unwrap();
    assert!(
        client.closed_within(Duration::from_secs(5)),
        "server must close after NBD_CMD_DISC"
    );
    handle.join().unwrap().expect("a clean disconnect is Ok");
}

/// A valid read still works and returns what the export holds.
fn assert_usable(client: &mut RawClient, export: &RecordingExport, structured: bool) {
    client.write_request(0, 900, 512, &[0x5a; 100]).unwrap();
    if structured {
        assert_eq!(client.structured_reply().unwrap().error, None);
    } else {
        assert_eq!(client.simple_reply().unwrap(), (0, 900));
    }
    client.request(0, CMD_READ, 901, 500, 120).unwrap();
    let data = if structured {
        let reply = client.structured_reply().unwrap();
        assert_eq!((reply.handle, reply.error), (901, None));
        assert_eq!(reply.data.len(), 1);
        assert_eq!(reply.data[0].0, 500);
        reply.data[0].1.clone()
    } else {
        assert_eq!(client.simple_reply().unwrap(), (0, 901));
        client.read_bytes(120).unwrap()
    };
    let mut expected = vec![0u8; 120];
    expected[12..112].fill(0x5a);
    assert_eq!(data, expected);
    assert_eq!(&export.contents()[512..612], &[0x5a; 100]);
}

#[test]
fn bad_request_magic_disconnects_without_touching_the_export() {
    let (export, mut client, handle) = connected(false);
    let mut bytes = RawClient::request_bytes(0, CMD_WRITE, 1, 0, 16);
    bytes[0] ^= 0xff;
    bytes.extend_from_slice(&[0xee; 16]);
    client.send(&bytes).unwrap();
    assert!(client.closed_within(Duration::from_secs(5)));
    let result = handle.join().unwrap();
    assert!(
        matches!(result, Err(NbdError::RequestMagic { .. })),
        "{result:?}"
    );
    assert!(export.calls().is_empty(), "{:?}", export.calls());
    assert_eq!(export.contents(), vec![0; SIZE]);
}

#[test]
fn out_of_range_read_is_einval_and_the_connection_survives() {
    for structured in [false, true] {
        let (export, mut client, handle) = connected(structured);
        client
            .request(0, CMD_READ, 7, SIZE as u64 - 100, 4096)
            .unwrap();
        if structured {
            let reply = client.structured_reply().unwrap();
            assert_eq!(
                (reply.handle, reply.error),
                (7, Some(ErrorCode::Inval.wire_value()))
            );
            assert!(reply.data.is_empty());
        } else {
            assert_eq!(
                client.simple_reply().unwrap(),
                (ErrorCode::Inval.wire_value(), 7)
            );
        }
        assert_usable(&mut client, &export, structured);
        assert_eq!(export.out_of_range_calls(), 0);
        assert!(!export
            .calls()
            .iter()
            .any(|c| c.offset_bytes == SIZE as u64 - 100));
        disconnect(client, handle);
    }
}

#[test]
fn out_of_range_write_is_enospc_and_its_payload_is_skipped() {
    let (export, mut client, handle) = connected(false);
    client
        .write_request(0, 11, SIZE as u64 - 10, &[0xff; 4096])
        .unwrap();
    assert_eq!(
        client.simple_reply().unwrap(),
        (ErrorCode::NoSpc.wire_value(), 11)
    );
    client
        .request(0, CMD_WRITE_ZEROES, 12, SIZE as u64, 1)
        .unwrap();
    assert_eq!(
        client.simple_reply().unwrap(),
        (ErrorCode::NoSpc.wire_value(), 12)
    );
    client
        .request(0, CMD_TRIM, 13, SIZE as u64 + 4096, 4096)
        .unwrap();
    assert_eq!(
        client.simple_reply().unwrap(),
        (ErrorCode::Inval.wire_value(), 13)
    );
    // The 4096 payload bytes were skipped: the next header parses.
    assert_usable(&mut client, &export, false);
    assert_eq!(export.out_of_range_calls(), 0);
    assert!(!export.contents().contains(&0xff));
    disconnect(client, handle);
}

#[test]
fn offset_plus_length_overflow_is_refused() {
    let (export, mut client, handle) = connected(true);
    let near_end = u64::MAX - 100;
    client.request(0, CMD_READ, 21, near_end, 4096).unwrap();
    assert_eq!(
        client.structured_reply().unwrap().error,
        Some(ErrorCode::Inval.wire_value())
    );
    client.write_request(0, 22, near_end, &[1; 512]).unwrap();
    assert_eq!(
        client.structured_reply().unwrap().error,
        Some(ErrorCode::NoSpc.wire_value())
    );
    client
        .request(0, CMD_WRITE_ZEROES, 23, near_end, u32::MAX)
        .unwrap();
    assert_eq!(
        client.structured_reply().unwrap().error,
        Some(ErrorCode::NoSpc.wire_value())
    );
    client.request(0, CMD_TRIM, 24, u64::MAX, 1).unwrap();
    assert_eq!(
        client.structured_reply().unwrap().error,
        Some(ErrorCode::Inval.wire_value())
    );
    assert_usable(&mut client, &export, true);
    assert_eq!(export.out_of_range_calls(), 0);
    assert_eq!(
        export.mutating_calls().len(),
        1,
        "only assert_usable's write: {:?}",
        export.mutating_calls()
    );
    disconnect(client, handle);
}

#[test]
fn lengths_above_the_maximum_are_einval_or_end_the_connection() {
    let (export, mut client, handle) = connected(false);
    let max = small_config().max_request_bytes;
    // READ above the maximum: EINVAL, no payload either way.
    client.request(0, CMD_READ, 31, 0, max + 1).unwrap();
    assert_eq!(
        client.simple_reply().unwrap(),
        (ErrorCode::Inval.wire_value(), 31)
    );
    // WRITE above the maximum but small enough to skip: EINVAL, payload dropped.
    let payload = vec![0x77u8; max as usize + 1];
    client.write_request(0, 32, 0, &payload).unwrap();
    assert_eq!(
        client.simple_reply().unwrap(),
        (ErrorCode::Inval.wire_value(), 32)
    );
    assert_usable(&mut client, &export, false);
    assert!(!export.contents().contains(&0x77));

    // WRITE of nearly 4 GiB: reading it would be a denial of service, so the connection ends at once.
    client.request(0, CMD_WRITE, 33, 0, u32::MAX).unwrap();
    assert!(client.closed_within(Duration::from_secs(5)));
    let result = handle.join().unwrap();
    assert!(
        matches!(
            result,
            Err(NbdError::WritePayloadTooLarge {
                length_bytes: u32::MAX
            })
        ),
        "{result:?}"
    );
    assert_eq!(export.out_of_range_calls(), 0);
    assert!(export.calls().iter().all(|c| c.len_bytes <= 120));
}

#[test]
fn unknown_commands_and_flags_are_einval() {
    for structured in [false, true] {
        let (export, mut client, handle) = connected(structured);
        let refused: &[(u16, u16, u64, u32)] = &[
            (0, 42, 0, 512),                                // unknown command
            (0, CMD_CACHE, 0, 512),                         // not offered
            (0, CMD_BLOCK_STATUS, 0, 512),                  // no metadata context negotiated
            (0, CMD_RESIZE, 0, 512),                        // not offered
            (1 << 10, CMD_READ, 0, 512),                    // unknown flag
            (CMD_FLAG_NO_HOLE, CMD_TRIM, 0, 512),           // flag of another command
            (CMD_FLAG_FAST_ZERO, CMD_WRITE_ZEROES, 0, 512), // not offered
            (0, CMD_FLUSH, 4096, 0),                        // flush with an offset
        ];
        for (index, &(flags, kind, offset, len)) in refused.iter().enumerate() {
            let handle_id = 100 + index as u64;
            client.request(flags, kind, handle_id, offset, len).unwrap();
            let error = if structured {
                let reply = client.structured_reply().unwrap();
                assert_eq!(reply.handle, handle_id);
                reply.error
            } else {
                let (error, got) = client.simple_reply().unwrap();
                assert_eq!(got, handle_id);
                Some(error)
            };
            assert_eq!(
                error,
                Some(ErrorCode::Inval.wire_value()),
                "flags {flags:#x} kind {kind}"
            );
        }
        // DF is fine with structured replies, refused without.
        client.request(CMD_FLAG_DF, CMD_READ, 200, 0, 64).unwrap();
        if structured {
            let reply = client.structured_reply().unwrap();
            assert_eq!(reply.error, None);
            assert_eq!(reply.data, vec![(0, vec![0u8; 64])]);
        } else {
            assert_eq!(
                client.simple_reply().unwrap(),
                (ErrorCode::Inval.wire_value(), 200)
            );
        }
        assert_usable(&mut client, &export, structured);
        assert_eq!(export.mutating_calls().len(), 1);
        disconnect(client, handle);
    }
}

#[test]
fn fua_trim_zeroes_and_flush_reach_the_export() {
    let (export, mut client, handle) = connected(false);
    client
        .write_request(CMD_FLAG_FUA, 1, 4096, &[9; 4096])
        .unwrap();
    assert_eq!(client.simple_reply().unwrap(), (0, 1));
    client
        .request(
            CMD_FLAG_NO_HOLE | CMD_FLAG_FUA,
            CMD_WRITE_ZEROES,
            2,
            4096,
            1000,
        )
        .unwrap();
    assert_eq!(client.simple_reply().unwrap(), (0, 2));
    client
        .request(CMD_FLAG_FUA, CMD_TRIM, 3, 6000, 100)
        .unwrap();
    assert_eq!(client.simple_reply().unwrap(), (0, 3));
    client.request(0, CMD_FLUSH, 4, 0, 0).unwrap();
    assert_eq!(client.simple_reply().unwrap(), (0, 4));
    // Zero-length requests are answered without bothering the export.
    client.request(0, CMD_READ, 5, 100, 0).unwrap();
    assert_eq!(client.simple_reply().unwrap(), (0, 5));
    client.write_request(0, 6, 100, &[]).unwrap();
    assert_eq!(client.simple_reply().unwrap(), (0, 6));

    let calls = export.calls();
    use CallKind::*;
    let expected = vec![
        Call {
            kind: Write { fua: true },
            offset_bytes: 4096,
            len_bytes: 4096,
        },
        Call {
            kind: WriteZeroes { fua: true },
            offset_bytes: 4096,
            len_bytes: 1000,
        },
        Call {
            kind: Trim,
            offset_bytes: 6000,
            len_bytes: 100,
        },
        Call {
            kind: Flush,
            offset_bytes: 0,
            len_bytes: 0,
        }, // FUA on TRIM
        Call {
            kind: Flush,
            offset_bytes: 0,
            len_bytes: 0,
        },
    ];
    assert_eq!(calls, expected);
    let contents = export.contents();
    assert_eq!(&contents[4096..5096], &[0; 1000]);
    assert_eq!(&contents[5096..6000], &[9; 904]);
    assert_eq!(&contents[6000..6100], &[0; 100]);
    assert_eq!(&contents[6100..8192], &[9; 2092]);
    disconnect(client, handle);
}

#[test]
fn read_only_export_refuses_writes_with_eperm() {
    let export = RecordingExport::with(SIZE, true, false);
    let (mut client, handle) = setup(&export, small_config());
    let (_, flags) = client.handshake(false).unwrap();
    assert_ne!(flags & FLAG_READ_ONLY, 0);
    assert_eq!(
        flags & (FLAG_SEND_TRIM | FLAG_SEND_WRITE_ZEROES | FLAG_CAN_MULTI_CONN),
        0
    );
    client.write_request(0, 1, 0, &[1; 512]).unwrap();
    assert_eq!(
        client.simple_reply().unwrap(),
        (ErrorCode::Perm.wire_value(), 1)
    );
    client.request(0, CMD_TRIM, 2, 0, 512).unwrap();
    assert_eq!(
        client.simple_reply().unwrap(),
        (ErrorCode::Perm.wire_value(), 2)
    );
    client.request(0, CMD_WRITE_ZEROES, 3, 0, 512).unwrap();
    assert_eq!(
        client.simple_reply().unwrap(),
        (ErrorCode::Perm.wire_value(), 3)
    );
    client.request(0, CMD_READ, 4, 0, 512).unwrap();
    assert_eq!(client.simple_reply().unwrap(), (0, 4));
    assert_eq!(client.read_bytes(512).unwrap(), vec![0; 512]);
    assert!(export.mutating_calls().is_empty());
    disconnect(client, handle);
}

#[test]
fn export_errors_reach_the_client_as_nbd_errors() {
    let cases: [(fn() -> io::Error, ErrorCode); 4] = [
        (
            || io::Error::from_raw_os_error(libc::ENOSPC),
            ErrorCode::NoSpc,
        ),
        (|| io::Error::from_raw_os_error(libc::EIO), ErrorCode::Io),
        (
            || io::Error::from_raw_os_error(libc::EROFS),
            ErrorCode::Perm,
        ),
        (|| io::Error::other("engine says no"), ErrorCode::Io),
    ];
    for structured in [false, true] {
        for (make_error, code) in cases {
            let (export, mut client, handle) = connected(structured);
            *export.fail_with.lock().unwrap() = Some(make_error);
            client.request(0, CMD_READ, 1, 0, 4096).unwrap();
            client.write_request(0, 2, 0, &[3; 100]).unwrap();
            client.request(0, CMD_FLUSH, 3, 0, 0).unwrap();
            let mut seen = Vec::new();
            for _ in 0..3 {
                if structured {
                    let reply = client.structured_reply().unwrap();
                    assert!(reply.data.is_empty(), "a failed read sends no data");
                    seen.push((reply.handle, reply.error));
                } else {
                    let (error, handle) = client.simple_reply().unwrap();
                    seen.push((handle, Some(error)));
                }
            }
            seen.sort();
            let wire = Some(code.wire_value());
            assert_eq!(seen, vec![(1, wire), (2, wire), (3, wire)]);
            *export.fail_with.lock().unwrap() = None;
            assert_usable(&mut client, &export, structured);
            disconnect(client, handle);
        }
    }
}

#[test]
fn a_panicking_export_fails_the_request_with_eio_and_the_server_lives() {
    let (export, mut client, handle) = connected(true);
    export.panic_on_read.store(true, Ordering::SeqCst);
    client.request(0, CMD_READ, 1, 0, 512).unwrap();
    let reply = client.structured_reply().unwrap();
    assert_eq!(
        (reply.handle, reply.error),
        (1, Some(ErrorCode::Io.wire_value()))
    );
    export.panic_on_read.store(false, Ordering::SeqCst);
    assert_usable(&mut client, &export, true);
    disconnect(client, handle);
}

#[test]
fn pipelined_requests_all_get_their_own_reply() {
    let (export, mut client, handle) = connected(true);
    let count = 200u64;
    let mut batch = Vec::new();
    for i in 0..count {
        let offset = i * 4096;
        batch.extend_from_slice(&RawClient::request_bytes(
            CMD_FLAG_FUA * (i % 2) as u16,
            CMD_WRITE,
            i,
            offset,
            1000,
        ));
        batch.extend_from_slice(&vec![(i % 251) as u8 + 1; 1000]);
    }
    // Writes and replies overlap: send from one thread, read from this one.
    let mut sender = client.stream.try_clone().unwrap();
    let writer = thread::spawn(move || io::Write::write_all(&mut sender, &batch));
    let mut handles: Vec<u64> = (0..count)
        .map(|_| {
            let reply = client.structured_reply().unwrap();
            assert_eq!(reply.error, None);
            reply.handle
        })
        .collect();
    writer.join().unwrap().unwrap();
    handles.sort();
    assert_eq!(handles, (0..count).collect::<Vec<_>>());

    for i in 0..count {
        client
            .request(0, CMD_READ, 1000 + i, i * 4096, 1000)
            .unwrap();
    }
    let mut seen = 0;
    for _ in 0..count {
        let reply = client.structured_reply().unwrap();
        let i = reply.handle - 1000;
        assert_eq!(
            reply.data,
            vec![(i * 4096, vec![(i % 251) as u8 + 1; 1000])]
        );
        seen += 1;
    }
    assert_eq!(seen, count);
    assert_eq!(export.out_of_range_calls(), 0);
    disconnect(client, handle);
}

#[test]
fn bytes_in_flight_stay_within_the_configured_bound() {
    let export = RecordingExport::new(SIZE);
    *export.read_delay.lock().unwrap() = Duration::from_millis(20);
    let request_bytes = 64 * 1024u32;
    // Room for two requests (each also counts a 4 KiB overhead), with eight workers that could run eight.
    let config = ServerConfig {
        workers_per_connection: 8,
        max_request_bytes: request_bytes,
        max_in_flight_bytes: 2 * (u64::from(request_bytes) + 4096),
        ..small_config()
    };
    let (mut client, handle) = setup(&export, config);
    client.handshake(false).unwrap();
    for i in 0..24u64 {
        client
            .request(0, CMD_READ, i, i * 4096, request_bytes)
            .unwrap();
    }
    for _ in 0..24 {
        let (error, _) = client.simple_reply().unwrap();
        assert_eq!(error, 0);
        client.read_bytes(request_bytes as usize).unwrap();
    }
    let peak = export.peak_read_bytes_in_flight();
    assert!(
        peak <= 2 * u64::from(request_bytes),
        "peak {peak} bytes in flight"
    );
    assert!(peak >= u64::from(request_bytes));
    disconnect(client, handle);
}

#[test]
fn shutdown_lets_the_in_flight_request_finish_then_closes() {
    let export = RecordingExport::new(SIZE);
    *export.read_delay.lock().unwrap() = Duration::from_millis(400);
    let server = Arc::new(Server::new(export.clone(), small_config()));
    let shutdown = Arc::new(AtomicBool::new(false));
    let (mut client, handle) = connect_in_process(server, shutdown.clone());
    client.handshake(false).unwrap();
    client.request(0, CMD_READ, 77, 0, 4096).unwrap();
    thread::sleep(Duration::from_millis(100)); // the read is now executing
    let started = Instant::now();
    shutdown.store(true, Ordering::SeqCst);
    assert_eq!(
        client.simple_reply().unwrap(),
        (0, 77),
        "the in-flight read is answered"
    );
    assert_eq!(client.read_bytes(4096).unwrap(), vec![0; 4096]);
    assert!(client.closed_within(Duration::from_secs(5)));
    handle.join().unwrap().unwrap();
    // Generous for a loaded 2-core CI machine; a server that ignored the flag would hang here for good.
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "took {:?}",
        started.elapsed()
    );
}

#[test]
fn serve_returns_promptly_on_shutdown_with_idle_and_handshaking_clients() {
    let export = RecordingExport::new(SIZE);
    let mut server = UnixServer::start(export.clone(), small_config());
    let mut idle = RawClient::new(std::os::unix::net::UnixStream::connect(&server.socket).unwrap());
    idle.handshake(true).unwrap();
    let mut greeting_only =
        RawClient::new(std::os::unix::net::UnixStream::connect(&server.socket).unwrap());
    greeting_only.read_bytes(18).unwrap(); // never answers the greeting
    let socket = server.socket.clone();
    let (result, took) = server.stop();
    result.unwrap();
    // The flag is looked at every 100 ms; the margin is for a loaded CI machine.
    assert!(
        took < Duration::from_secs(3),
        "serve took {took:?} to return"
    );
    assert!(idle.closed_within(Duration::from_secs(5)));
    assert!(greeting_only.closed_within(Duration::from_secs(5)));
    assert!(!socket.exists(), "the socket file is removed");
}

/// A client that connects and never finishes the handshake is dropped after `handshake_timeout` (it would hold
/// one of the limited connection places for ever); one past the handshake may stay idle longer than that.
#[test]
fn a_client_silent_in_the_handshake_is_dropped_but_an_idle_session_is_not() {
    let export = RecordingExport::new(SIZE);
    let config = ServerConfig {
        handshake_timeout: Duration::from_millis(300),
        ..small_config()
    };
    let mut server = UnixServer::start(export.clone(), config);
    let mut silent =
        RawClient::new(std::os::unix::net::UnixStream::connect(&server.socket).unwrap());
    silent.read_bytes(18).unwrap(); // the greeting, never answered
    let mut idle = RawClient::new(std::os::unix::net::UnixStream::connect(&server.socket).unwrap());
    idle.handshake(true).unwrap();
    assert!(
        silent.closed_within(Duration::from_secs(5)),
        "a client silent in the handshake was kept"
    );
    thread::sleep(Duration::from_millis(600));
    assert_usable(&mut idle, &export, true);
    let (result, _) = server.stop();
    result.unwrap();
}

// ---------------------------------------------------------------------------------------------------------------
// Metadata contexts and NBD_CMD_BLOCK_STATUS

/// NBD_OPT_LIST_META_CONTEXT / NBD_OPT_SET_META_CONTEXT data: export name, then the queries.
fn meta_data(name: &str, queries: &[&str]) -> Vec<u8> {
    let mut data = (name.len() as u32).to_be_bytes().to_vec();
    data.extend_from_slice(name.as_bytes());
    data.extend_from_slice(&(queries.len() as u32).to_be_bytes());
    for query in queries {
        data.extend_from_slice(&(query.len() as u32).to_be_bytes());
        data.extend_from_slice(query.as_bytes());
    }
    data
}

/// The replies to one metadata context option: the contexts it named as (id, name), and the final reply type.
fn meta_replies(client: &mut RawClient, option: u32) -> (Vec<(u32, String)>, u32) {
    let mut contexts = Vec::new();
    loop {
        let reply = client.read_option_reply().unwrap();
        assert_eq!(reply.option, option);
        if reply.reply_type != REP_META_CONTEXT {
            return (contexts, reply.reply_type);
        }
        let id = u32::from_be_bytes(reply.data[0..4].try_into().unwrap());
        contexts.push((id, String::from_utf8(reply.data[4..].to_vec()).unwrap()));
    }
}

/// One block status reply: (context id, descriptors as (length, flags)), or the error value.
fn block_status_reply(client: &mut RawClient, handle: u64) -> Result<(u32, Vec<(u32, u32)>), u32> {
    let chunk = client.chunk().unwrap();
    assert_eq!(chunk.handle, handle);
    assert!(chunk.flags & REPLY_FLAG_DONE != 0, "one chunk, marked done");
    match chunk.chunk_type {
        REPLY_TYPE_BLOCK_STATUS => {
            let p = &chunk.payload;
            assert!(
                p.len() >= 12 && (p.len() - 4).is_multiple_of(8),
                "payload of {} bytes",
                p.len()
            );
            let id = u32::from_be_bytes(p[0..4].try_into().unwrap());
            let descriptors = p[4..]
                .chunks_exact(8)
                .map(|d| {
                    (
                        u32::from_be_bytes(d[0..4].try_into().unwrap()),
                        u32::from_be_bytes(d[4..8].try_into().unwrap()),
                    )
                })
                .collect();
            Ok((id, descriptors))
        }
        REPLY_TYPE_ERROR => Err(u32::from_be_bytes(chunk.payload[0..4].try_into().unwrap())),
        other => panic!("unexpected chunk type {other:#x}"),
    }
}

#[test]
fn base_allocation_is_negotiated_and_block_status_describes_the_export() {
    let export = RecordingExport::new(SIZE);
    let (mut client, handle) = setup(&export, small_config());
    client
        .greet(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES)
        .unwrap();

    // Before structured replies: refused, as the spec asks.
    client
        .send_option(OPT_LIST_META_CONTEXT, &meta_data("", &[]))
        .unwrap();
    assert_eq!(
        meta_replies(&mut client, OPT_LIST_META_CONTEXT),
        (vec![], REP_ERR_INVALID)
    );
    client.send_option(OPT_STRUCTURED_REPLY, &[]).unwrap();
    assert_eq!(client.read_option_reply().unwrap().reply_type, REP_ACK);

    // Listing: everything, the namespace, an exact name, a context this server does not know.
    let allocation = (0u32, "base:allocation".to_string());
    for queries in [
        &[][..],
        &["base:"],
        &["base:allocation"],
        &["x-other:thing", "base:"],
    ] {
        client
            .send_option(OPT_LIST_META_CONTEXT, &meta_data("disk", queries))
            .unwrap();
        assert_eq!(
            meta_replies(&mut client, OPT_LIST_META_CONTEXT),
            (vec![allocation.clone()], REP_ACK),
            "{queries:?}"
        );
    }
    client
        .send_option(OPT_LIST_META_CONTEXT, &meta_data("", &["x-other:thing"]))
        .unwrap();
    assert_eq!(
        meta_replies(&mut client, OPT_LIST_META_CONTEXT),
        (vec![], REP_ACK)
    );

    // Bad selections: an unknown export, data cut short, data with bytes past its queries.
    client
        .send_option(
            OPT_SET_META_CONTEXT,
            &meta_data("nope", &["base:allocation"]),
        )
        .unwrap();
    assert_eq!(
        meta_replies(&mut client, OPT_SET_META_CONTEXT),
        (vec![], REP_ERR_UNKNOWN)
    );
    let mut cut = meta_data("", &["base:allocation"]);
    cut.pop();
    client.send_option(OPT_SET_META_CONTEXT, &cut).unwrap();
    assert_eq!(
        meta_replies(&mut client, OPT_SET_META_CONTEXT),
        (vec![], REP_ERR_INVALID)
    );
    let mut long = meta_data("", &["base:allocation"]);
    long.push(0);
    client.send_option(OPT_SET_META_CONTEXT, &long).unwrap();
    assert_eq!(
        meta_replies(&mut client, OPT_SET_META_CONTEXT),
        (vec![], REP_ERR_INVALID)
    );

    // Selecting it: a nonzero id, which block status replies carry.
    client
        .send_option(OPT_SET_META_CONTEXT, &meta_data("", &["base:allocation"]))
        .unwrap();
    let (contexts, last) = meta_replies(&mut client, OPT_SET_META_CONTEXT);
    assert_eq!(last, REP_ACK);
    assert_eq!(contexts.len(), 1);
    let (id, name) = contexts[0].clone();
    assert_eq!(name, "base:allocation");
    assert_ne!(id, 0);
    client.go().unwrap();

    // Data in the second 4 KiB block of 8 KiB and a few bytes inside block 4; the memory export reports whole
    // zero blocks as NBD_STATE_ZERO.
    client.write_request(0, 1, 8192, &[0x11; 4096]).unwrap();
    client.structured_reply().unwrap();
    client.write_request(0, 2, 20000, &[0x22; 10]).unwrap();
    client.structured_reply().unwrap();
    client.request(0, CMD_BLOCK_STATUS, 3, 0, 32768).unwrap();
    assert_eq!(
        block_status_reply(&mut client, 3),
        Ok((
            id,
            vec![
                (8192, STATE_ZERO),
                (4096, 0),
                (4096, STATE_ZERO),
                (4096, 0),
                (12288, STATE_ZERO)
            ]
        ))
    );
    client
        .request(CMD_FLAG_REQ_ONE, CMD_BLOCK_STATUS, 4, 4096, 32768)
        .unwrap();
    assert_eq!(
        block_status_reply(&mut client, 4),
        Ok((id, vec![(4096, STATE_ZERO)]))
    );

    // Refusals, each answered with EINVAL, the connection going on: nothing to describe, beyond the end, a flag
    // the command does not take.
    for (flags, offset, len) in [
        (0, 0, 0),
        (0, SIZE as u64 - 4096, 8192),
        (CMD_FLAG_DF, 0, 4096),
    ] {
        client
            .request(flags, CMD_BLOCK_STATUS, 5, offset, len)
            .unwrap();
        assert_eq!(
            block_status_reply(&mut client, 5),
            Err(EINVAL_WIRE),
            "{flags} {offset} {len}"
        );
    }
    assert_usable(&mut client, &export, true);
    client.request(0, CMD_DISC, 6, 0, 0).unwrap();
    handle.join().unwrap().unwrap();
    assert_eq!(export.out_of_range_calls(), 0);

    // A session that selected no context is refused block status.
    let (mut plain, handle) = setup(&export, small_config());
    plain.handshake(true).unwrap();
    plain.request(0, CMD_BLOCK_STATUS, 7, 0, 4096).unwrap();
    assert_eq!(block_status_reply(&mut plain, 7), Err(EINVAL_WIRE));
    plain.request(0, CMD_DISC, 8, 0, 0).unwrap();
    handle.join().unwrap().unwrap();
}

/// EINVAL as the NBD wire carries it.
const EINVAL_WIRE: u32 = 22;

// ---------------------------------------------------------------------------------------------------------------
// Handshake

#[test]
fn options_list_info_structured_and_unknown() {
    let export = RecordingExport::new(SIZE);
    let (mut client, handle) = setup(&export, small_config());
    client.greet(FLAG_C_FIXED_NEWSTYLE).unwrap();

    client.send_option(OPT_LIST, &[]).unwrap();
    let server = client.read_option_reply().unwrap();
    assert_eq!(server.reply_type, REP_SERVER);
    assert_eq!(&server.data[0..4], &4u32.to_be_bytes());
    assert_eq!(&server.data[4..8], b"disk");
    assert_eq!(&server.data[8..], b"test disk");
    assert_eq!(client.read_option_reply().unwrap().reply_type, REP_ACK);

    client.send_option(OPT_LIST, b"junk").unwrap();
    assert_eq!(
        client.read_option_reply().unwrap().reply_type,
        REP_ERR_INVALID
    );

    for option in [OPT_STARTTLS, OPT_EXTENDED_HEADERS, 999] {
        client.send_option(option, b"some data").unwrap();
        let reply = client.read_option_reply().unwrap();
        assert_eq!((reply.option, reply.reply_type), (option, REP_ERR_UNSUP));
    }

    client
        .send_option(OPT_INFO, &RawClient::go_data("nope", &[]))
        .unwrap();
    assert_eq!(
        client.read_option_reply().unwrap().reply_type,
        REP_ERR_UNKNOWN
    );
    let mut truncated = RawClient::go_data("disk", &[INFO_NAME]);
    truncated.pop();
    client.send_option(OPT_INFO, &truncated).unwrap();
    assert_eq!(
        client.read_option_reply().unwrap().reply_type,
        REP_ERR_INVALID
    );

    client
        .send_option(
            OPT_INFO,
            &RawClient::go_data("disk", &[INFO_NAME, INFO_DESCRIPTION, INFO_BLOCK_SIZE]),
        )
        .unwrap();
    let mut infos = Vec::new();
    loop {
        let reply = client.read_option_reply().unwrap();
        if reply.reply_type == REP_ACK {
            break;
        }
        assert_eq!(reply.reply_type, REP_INFO);
        infos.push(reply.data);
    }
    let find = |kind: u16| {
        infos
            .iter()
            .find(|d| d[0..2] == kind.to_be_bytes())
            .cloned()
            .unwrap()
    };
    let info_export = find(INFO_EXPORT);
    assert_eq!(&info_export[2..10], &(SIZE as u64).to_be_bytes());
    let flags = u16::from_be_bytes([info_export[10], info_export[11]]);
    assert_eq!(flags & FLAG_SEND_DF, 0, "no DF before structured replies");
    assert_ne!(flags & FLAG_CAN_MULTI_CONN, 0);
    assert_eq!(&find(INFO_NAME)[2..], b"disk");
    assert_eq!(&find(INFO_DESCRIPTION)[2..], b"test disk");
    let block = find(INFO_BLOCK_SIZE);
    assert_eq!(
        &block[2..14],
        &[
            &1u32.to_be_bytes()[..],
            &4096u32.to_be_bytes(),
            &(1u32 << 20).to_be_bytes()
        ]
        .concat()[..]
    );

    client.send_option(OPT_STRUCTURED_REPLY, b"x").unwrap();
    assert_eq!(
        client.read_option_reply().unwrap().reply_type,
        REP_ERR_INVALID
    );
    client.send_option(OPT_STRUCTURED_REPLY, &[]).unwrap();
    assert_eq!(client.read_option_reply().unwrap().reply_type, REP_ACK);
    let (_, flags) = client.go().unwrap();
    assert_ne!(flags & FLAG_SEND_DF, 0);
    assert_usable(&mut client, &export, true);
    disconnect(client, handle);
}

#[test]
fn export_name_option_with_and_without_zero_padding() {
    for no_zeroes in [false, true] {
        let export = RecordingExport::new(SIZE);
        let (mut client, handle) = setup(&export, small_config());
        client
            .greet(FLAG_C_FIXED_NEWSTYLE | if no_zeroes { FLAG_C_NO_ZEROES } else { 0 })
            .unwrap();
        client.send_option(OPT_EXPORT_NAME, b"disk").unwrap();
        assert_eq!(client.u64().unwrap(), SIZE as u64);
        let flags = client.u16().unwrap();
        assert_ne!(flags & FLAG_HAS_FLAGS, 0);
        if !no_zeroes {
            assert_eq!(client.read_bytes(124).unwrap(), vec![0; 124]);
        }
        // The next bytes are the reply to our first request, not padding.
        assert_usable(&mut client, &export, false);
        disconnect(client, handle);
    }
}

#[test]
fn export_name_option_with_an_unknown_name_ends_the_session() {
    let export = RecordingExport::new(SIZE);
    let (mut client, handle) = setup(&export, small_config());
    client.greet(FLAG_C_FIXED_NEWSTYLE).unwrap();
    client.send_option(OPT_EXPORT_NAME, b"other").unwrap();
    assert!(client.closed_within(Duration::from_secs(5)));
    assert!(matches!(
        handle.join().unwrap(),
        Err(NbdError::HandshakeProtocol(_))
    ));
}

#[test]
fn abort_is_acknowledged_and_ends_cleanly() {
    let export = RecordingExport::new(SIZE);
    let (mut client, handle) = setup(&export, small_config());
    client.greet(FLAG_C_FIXED_NEWSTYLE).unwrap();
    client.send_option(OPT_ABORT, &[]).unwrap();
    let reply = client.read_option_reply().unwrap();
    assert_eq!((reply.option, reply.reply_type), (OPT_ABORT, REP_ACK));
    assert!(client.closed_within(Duration::from_secs(5)));
    handle.join().unwrap().unwrap();
}

#[test]
fn handshake_violations_drop_the_client() {
    let export = RecordingExport::new(SIZE);
    // Unknown client flag.
    let (mut client, handle) = setup(&export, small_config());
    client.greet(1 << 7).unwrap();
    assert!(client.closed_within(Duration::from_secs(5)));
    assert!(matches!(
        handle.join().unwrap(),
        Err(NbdError::HandshakeProtocol(_))
    ));
    // Option without IHAVEOPT.
    let (mut client, handle) = setup(&export, small_config());
    client.greet(FLAG_C_FIXED_NEWSTYLE).unwrap();
    client.send(&[0u8; 16]).unwrap();
    assert!(client.closed_within(Duration::from_secs(5)));
    assert!(matches!(
        handle.join().unwrap(),
        Err(NbdError::HandshakeProtocol(_))
    ));
    // Option claiming a huge length.
    let (mut client, handle) = setup(&export, small_config());
    client.greet(FLAG_C_FIXED_NEWSTYLE).unwrap();
    let mut bytes = IHAVEOPT.to_be_bytes().to_vec();
    bytes.extend_from_slice(&OPT_GO.to_be_bytes());
    bytes.extend_from_slice(&u32::MAX.to_be_bytes());
    client.send(&bytes).unwrap();
    assert!(client.closed_within(Duration::from_secs(5)));
    assert!(matches!(
        handle.join().unwrap(),
        Err(NbdError::HandshakeProtocol(_))
    ));
    // A client that leaves mid-handshake is no error.
    let (mut client, handle) = setup(&export, small_config());
    client.greet(FLAG_C_FIXED_NEWSTYLE).unwrap();
    drop(client);
    handle.join().unwrap().unwrap();
    assert!(export.calls().is_empty());
}

/// While one worker executes a slow request, the others go on reading and executing the next ones: four
/// pipelined reads that each take 400 ms are executed together, not one after another.
#[test]
fn slow_requests_run_concurrently_on_the_workers() {
    let export = RecordingExport::new(SIZE);
    *export.read_delay.lock().unwrap() = Duration::from_millis(400);
    // Four workers; READs not gathered (gather_reads.rs), so that each is a request of its own for the pool.
    let config = ServerConfig {
        gather_reads: 0,
        ..small_config()
    };
    let (mut client, handle) = setup(&export, config);
    client.handshake(false).unwrap();
    let started = Instant::now();
    for i in 0..4u64 {
        client.request(0, CMD_READ, i, i * 4096, 4096).unwrap();
    }
    let mut handles = Vec::new();
    for _ in 0..4 {
        let (error, handle) = client.simple_reply().unwrap();
        assert_eq!(error, 0);
        client.read_bytes(4096).unwrap();
        handles.push(handle);
    }
    let took = started.elapsed();
    handles.sort_unstable();
    assert_eq!(handles, vec![0, 1, 2, 3]);
    // Counted, not timed: the four reads were inside the export at once (one after another, the peak would be
    // one read). A wall-clock bound (under 1.2 s against 1.6 s serial) is what a loaded 2-core CI runner can
    // break, as it broke a latency bound in faults_latency (stop 38).
    assert_eq!(
        export.peak_read_bytes_in_flight(),
        4 * 4096,
        "four slow reads took {took:?}"
    );
    disconnect(client, handle);
}

/// The pool grows on demand up to its limit and never past it: eight pipelined slow reads against a limit of three
/// workers run three at a time (the peak bytes in flight inside the export are exactly three reads), and with a
/// limit of one they run one at a time.
#[test]
fn the_worker_pool_grows_to_its_limit_and_no_further() {
    for limit in [1usize, 3] {
        let export = RecordingExport::new(SIZE);
        *export.read_delay.lock().unwrap() = Duration::from_millis(150);
        let config = ServerConfig {
            workers_per_connection: limit,
            gather_reads: 0, // each READ a request of its own for the pool
            ..small_config()
        };
        let (mut client, handle) = setup(&export, config);
        client.handshake(false).unwrap();
        for i in 0..8u64 {
            client.request(0, CMD_READ, i, i * 4096, 4096).unwrap();
        }
        for _ in 0..8 {
            let (error, _) = client.simple_reply().unwrap();
            assert_eq!(error, 0);
            client.read_bytes(4096).unwrap();
        }
        assert_eq!(
            export.peak_read_bytes_in_flight(),
            limit as u64 * 4096,
            "limit {limit}"
        );
        disconnect(client, handle);
    }
}

/// Pipelined writes of many sizes land intact although each worker reuses one payload buffer: a write's bytes
/// are never those of another request read meanwhile.
#[test]
fn pipelined_writes_of_many_sizes_keep_their_own_payload() {
    let export = RecordingExport::new(SIZE);
    let (mut client, handle) = setup(&export, small_config());
    client.handshake(true).unwrap();
    let mut model = vec![0u8; SIZE];
    let count = 96u64;
    let extent = |i: u64| {
        let len = [1usize, 511, 4096, 4097, 16384, 20000][i as usize % 6];
        ((i * 7919 * 13) as usize % (SIZE - len), len)
    };
    for i in 0..count {
        let (offset, len) = extent(i);
        let payload: Vec<u8> = (0..len).map(|b| (b as u64 * 31 + i * 7) as u8).collect();
        client.write_request(0, i, offset as u64, &payload).unwrap();
        model[offset..offset + len].copy_from_slice(&payload);
    }
    let mut seen = vec![false; count as usize];
    for _ in 0..count {
        let reply = client.structured_reply().unwrap();
        assert_eq!(reply.error, None);
        seen[reply.handle as usize] = true;
    }
    assert!(seen.iter().all(|s| *s));
    // Workers run writes concurrently, so where two writes overlap either may land last: judge only the bytes
    // exactly one write touched.
    let contents = export.contents();
    let mut owners = vec![0u32; SIZE];
    for i in 0..count {
        let (offset, len) = extent(i);
        owners[offset..offset + len]
            .iter_mut()
            .for_each(|o| *o += 1);
    }
    let mut checked = 0usize;
    for (at, owners) in owners.iter().enumerate() {
        if *owners == 1 {
            assert_eq!(
                contents[at], model[at],
                "byte {at} written by one request only"
            );
            checked += 1;
        }
    }
    assert!(
        checked > SIZE / 8,
        "only {checked} bytes had a single writer"
    );
    assert_eq!(export.out_of_range_calls(), 0);
    disconnect(client, handle);
}

/// A zero-length READ under structured replies is one NBD_REPLY_TYPE_NONE chunk marked DONE with nothing after it:
/// the next reply starts right behind it. (The server sent the eight offset bytes of a data chunk after it, and
/// libnbd failed the connection's next reply on its magic.)
#[test]
fn a_zero_length_structured_read_is_one_none_chunk() {
    let (export, mut client, handle) = connected(true);
    client.request(0, CMD_READ, 1, 100, 0).unwrap();
    let chunk = client.chunk().unwrap();
    assert_eq!((chunk.handle, chunk.chunk_type), (1, REPLY_TYPE_NONE));
    assert_ne!(chunk.flags & REPLY_FLAG_DONE, 0);
    assert!(chunk.payload.is_empty());
    assert_usable(&mut client, &export, true);
    disconnect(client, handle);
}

/// A server that stops leaves a socket file alone that is no longer the one it bound: a server restarted on the
/// same path while the old one was still shutting down took the old file for a dead server's and replaced it, and
/// the old server's cleanup then removed the new server's socket, leaving it running but unreachable.
#[test]
fn a_stopping_server_leaves_a_newer_servers_socket_in_place() {
    let mut old = UnixServer::start(RecordingExport::new(SIZE), small_config());
    // The new server's bind replaces the file (here by hand: the old server still listens).
    std::fs::remove_file(&old.socket).unwrap();
    let new_server = Arc::new(Server::new(RecordingExport::new(SIZE), small_config()));
    let new_shutdown = Arc::new(AtomicBool::new(false));
    let new_thread = {
        let (socket, shutdown) = (old.socket.clone(), new_shutdown.clone());
        thread::spawn(move || new_server.serve(paraid_nbd::Listener::Unix(socket), shutdown))
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while !old.socket.exists() {
        assert!(Instant::now() < deadline, "the new server did not bind");
        thread::sleep(Duration::from_millis(10));
    }
    let (result, _) = old.stop();
    result.expect("the old server stops");
    assert!(
        old.socket.exists(),
        "the old server removed the new server's socket"
    );
    let stream =
        std::os::unix::net::UnixStream::connect(&old.socket).expect("the new server is reachable");
    let mut client = RawClient::new(stream);
    client
        .handshake(true)
        .expect("handshake with the new server");
    drop(client);
    new_shutdown.store(true, Ordering::SeqCst);
    new_thread
        .join()
        .expect("new server thread")
        .expect("new server");
    assert!(
        !old.socket.exists(),
        "the new server removed its own socket"
    );
}
