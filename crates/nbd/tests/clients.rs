//! The server against real NBD clients we did not write: nbdinfo, nbdcopy, qemu-io, fio's nbd engine and nbdsh
//! (libnbd's Python shell), each against an in-process server on a temporary Unix socket (and one over TCP).

mod common;

use std::net::{SocketAddr, TcpListener};
use std::process::Command;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use common::*;
use paraid_nbd::{BoundListener, Listener, Server, ServerConfig};

const LIMIT: Duration = Duration::from_secs(60);

fn config() -> ServerConfig {
    ServerConfig {
        export_name: "disk".into(),
        description: "paraid-nbd test".into(),
        ..ServerConfig::default()
    }
}

fn nbdinfo_json(uri: &str) -> serde_json::Value {
    let text = run_ok(Command::new("nbdinfo").args(["--json", uri]), LIMIT);
    serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("nbdinfo --json output is not JSON ({e}):\n{text}"))
}

#[test]
fn nbdinfo_json_reports_size_flags_and_block_sizes() {
    if !have("nbdinfo") {
        return;
    }
    let export = RecordingExport::new(48 << 20);
    let server = UnixServer::start(export.clone(), config());
    let info = nbdinfo_json(&server.uri());
    assert_eq!(info["protocol"], "newstyle-fixed");
    assert_eq!(info["structured"], true);
    let disk = &info["exports"][0];
    assert_eq!(disk["export-size"], 48u64 << 20);
    assert_eq!(disk["description"], "paraid-nbd test");
    assert_eq!(disk["is_read_only"], false);
    for flag in [
        "can_flush",
        "can_fua",
        "can_trim",
        "can_zero",
        "can_multi_conn",
        "can_df",
    ] {
        assert_eq!(disk[flag], true, "{flag}");
    }
    assert_eq!(disk["can_fast_zero"], false);
    assert_eq!(disk["can_cache"], false);
    assert_eq!(disk["block_size_minimum"], 1);
    assert_eq!(disk["block_size_preferred"], 4096);
    assert_eq!(disk["block_size_maximum"], 32u64 << 20);
    assert!(
        export.calls().iter().all(|c| c.kind == CallKind::Read),
        "nbdinfo only reads"
    );

    // A read-only export that is not multi-connection safe says so.
    let export = RecordingExport::with(1 << 20, true, false);
    let server = UnixServer::start(
        export,
        ServerConfig {
            max_request_bytes: 1 << 20,
            ..config()
        },
    );
    let disk = &nbdinfo_json(&server.uri())["exports"][0];
    assert_eq!(disk["is_read_only"], true);
    assert_eq!(disk["can_multi_conn"], false);
    assert_eq!(disk["can_trim"], false);
    assert_eq!(disk["can_zero"], false);
    assert_eq!(disk["block_size_maximum"], 1u64 << 20);
}

#[test]
fn nbdcopy_round_trip_is_byte_identical() {
    if !have("nbdcopy") {
        return;
    }
    let size = 24 << 20;
    let export = RecordingExport::new(size);
    let server = UnixServer::start(export.clone(), config());
    let dir = TempDir::new("nbdcopy");
    let input = dir.join("in.bin");
    let output = dir.join("out.bin");
    let data = pseudo_random_bytes(size, 0x5eed);
    write_file(&input, &data);

    // nbdcopy opens several connections when the server offers CAN_MULTI_CONN, and many requests on each.
    run_ok(Command::new("nbdcopy").arg(&input).arg(server.uri()), LIMIT);
    assert!(
        export.contents() == data,
        "the export differs from the file copied in"
    );
    run_ok(
        Command::new("nbdcopy").arg(server.uri()).arg(&output),
        LIMIT,
    );
    let copied = std::fs::read(&output).unwrap();
    assert_eq!(copied.len(), size);
    assert!(copied == data, "the file copied out differs");
    assert_eq!(export.out_of_range_calls(), 0);
}

#[test]
fn qemu_io_patterns_at_odd_offsets_and_lengths() {
    if !have("qemu-io") {
        return;
    }
    let size = 8 << 20;
    let export = RecordingExport::new(size);
    let server = UnixServer::start(export.clone(), config());
    let writes: &[(u8, u64, u64)] = &[
        (0xab, 1000, 3333),
        (0xcd, 4999, 1),
        (0x11, 65_537, 200_001),
        (0x7e, size as u64 - 777, 777),
    ];
    let mut command = Command::new("qemu-io");
    command.args(["-f", "raw", &server.uri()]);
    for &(pattern, offset, len) in writes {
        command
            .arg("-c")
            .arg(format!("write -P {pattern:#x} {offset} {len}"));
    }
    for &(pattern, offset, len) in writes {
        command
            .arg("-c")
            .arg(format!("read -P {pattern:#x} {offset} {len}"));
    }
    command
        .arg("-c")
        .arg("read -P 0 0 1000")
        .arg("-c")
        .arg("read -P 0 5000 3000");
    command.arg("-c").arg("flush");
    let output = run_ok(&mut command, LIMIT);
    assert!(!output.contains("Pattern verification failed"), "{output}");
    assert_eq!(
        output.matches("read ").count(),
        writes.len() + 2,
        "{output}"
    );

    let contents = export.contents();
    for &(pattern, offset, len) in writes {
        let range = offset as usize..(offset + len) as usize;
        assert!(
            contents[range].iter().all(|&b| b == pattern),
            "pattern {pattern:#x} at {offset}"
        );
    }
    assert!(contents[..1000].iter().all(|&b| b == 0));
    assert_eq!(export.out_of_range_calls(), 0);
}

#[test]
fn fio_random_writes_verify_with_crc32c() {
    if !have("fio") {
        return;
    }
    let export = RecordingExport::new(16 << 20);
    let server = UnixServer::start(export.clone(), config());
    let dir = TempDir::new("fio"); // fio may leave files in its working directory
    let output = run_ok(
        Command::new("fio")
            .args([
                "--name=paraid-nbd",
                "--ioengine=nbd",
                &format!("--uri={}", server.uri()),
                "--rw=randwrite",
                "--bsrange=512-64k",
                "--size=16m",
                "--iodepth=16",
                "--verify=crc32c",
                "--verify_fatal=1",
                "--do_verify=1",
                "--runtime=20",
                "--verify_state_save=0",
            ])
            .current_dir(&dir.0),
        LIMIT,
    );
    assert!(output.contains("err= 0"), "{output}");
    assert!(
        !output.contains("verify:"),
        "fio reported a verify failure:\n{output}"
    );
    assert!(
        output.contains("READ:"),
        "fio must have read back to verify:\n{output}"
    );
    assert_eq!(export.out_of_range_calls(), 0);
    assert!(export.mutating_calls().len() > 100);
}

/// Runs a Python script in nbdsh (libnbd's shell; `h` is its handle, `URI` our server).
fn nbdsh(uri: &str, script: &str) -> String {
    let prelude = format!("import errno, time\nimport nbd\nURI = {uri:?}\n");
    run_ok(
        Command::new("nbdsh")
            .arg("-c")
            .arg(format!("{prelude}{script}")),
        LIMIT,
    )
}

#[test]
fn nbdsh_fua_trim_zeroes_flush_and_structured_replies() {
    if !have("nbdsh") {
        return;
    }
    let export = RecordingExport::new(4 << 20);
    let server = UnixServer::start(export.clone(), config());
    let script = r#"
h.set_strict_mode(0)  # let out-of-range requests reach the server
h.connect_uri(URI)
assert h.get_structured_replies_negotiated()
assert h.can_fua() and h.can_trim() and h.can_zero() and h.can_flush() and h.can_multi_conn()
assert not h.is_read_only()
assert h.get_size() == 4 << 20
h.pwrite(b"\xab" * 8192, 4096, nbd.CMD_FLAG_FUA)
assert h.pread(8192, 4096) == b"\xab" * 8192
h.zero(5000, 1000, nbd.CMD_FLAG_NO_HOLE | nbd.CMD_FLAG_FUA)  # count, offset
assert h.pread(8192, 4096) == bytes(1904) + b"\xab" * 6288
h.trim(4096, 8192, nbd.CMD_FLAG_FUA)
h.flush()
for call, code in [(lambda: h.pread(4096, (4 << 20) - 100), errno.EINVAL),
                   (lambda: h.pwrite(b"x" * 200, (4 << 20) - 100), errno.ENOSPC),
                   (lambda: h.zero(200, (4 << 20) - 100), errno.ENOSPC),
                   (lambda: h.pread(64 << 20, 0), errno.EINVAL)]:
    try:
        call()
        raise AssertionError("out-of-range request succeeded")
    except nbd.Error as e:
        # libnbd's Python binding gives the errno as its name, older ones as the number
        assert e.errno in (code, errno.errorcode[code]), (e.errno, code, str(e))
# still usable after the errors
h.pwrite(b"z" * 10, 123)
assert h.pread(10, 123) == b"z" * 10
print("nbdsh-ok")
"#;
    assert!(nbdsh(&server.uri(), script).contains("nbdsh-ok"));
    use CallKind::*;
    let kinds: Vec<CallKind> = export
        .mutating_calls()
        .into_iter()
        .map(|c| c.kind)
        .collect();
    assert_eq!(
        kinds,
        vec![
            Write { fua: true },
            WriteZeroes { fua: true },
            Trim,
            Write { fua: false }
        ]
    );
    assert!(export.calls().iter().any(|c| c.kind == Flush));
    assert_eq!(export.out_of_range_calls(), 0);

    // The same client without structured replies gets simple replies, errors included.
    let script = r#"
h.set_request_structured_replies(False)
h.set_strict_mode(0)
h.connect_uri(URI)
assert not h.get_structured_replies_negotiated()
assert h.pread(10, 123) == b"z" * 10
try:
    h.pread(4096, (4 << 20) - 1)
    raise AssertionError("out-of-range read succeeded")
except nbd.Error as e:
    assert e.errno in (errno.EINVAL, "EINVAL"), e.errno
assert h.pread(10, 123) == b"z" * 10
print("simple-ok")
"#;
    assert!(nbdsh(&server.uri(), script).contains("simple-ok"));
}

#[test]
fn two_clients_are_served_at_once() {
    if !have("nbdsh") {
        return;
    }
    let export = RecordingExport::new(1 << 20);
    let server = UnixServer::start(export.clone(), config());
    // Each client writes its mark, then waits until it sees the other's mark through its own connection: this
    // only finishes if both connections are served at the same time.
    let script = |mine: &str, my_offset: u32, theirs: &str, their_offset: u32| {
        format!(
            r#"
h.connect_uri(URI)
h.pwrite(b"{mine}" * 4096, {my_offset})
deadline = time.time() + 20
while h.pread(4096, {their_offset}) != b"{theirs}" * 4096:
    assert time.time() < deadline, "never saw the other client's write"
    time.sleep(0.01)
print("saw-{theirs}")
"#
        )
    };
    let uri = server.uri();
    let a = {
        let (uri, script) = (uri.clone(), script("A", 0, "B", 65536));
        thread::spawn(move || nbdsh(&uri, &script))
    };
    let b = {
        let (uri, script) = (uri.clone(), script("B", 65536, "A", 0));
        thread::spawn(move || nbdsh(&uri, &script))
    };
    assert!(a.join().unwrap().contains("saw-B"));
    assert!(b.join().unwrap().contains("saw-A"));
    let contents = export.contents();
    assert!(contents[..4096].iter().all(|&b| b == b'A'));
    assert!(contents[65536..65536 + 4096].iter().all(|&b| b == b'B'));
}

#[test]
fn tcp_listeners_serve_real_clients() {
    if !have("nbdinfo") || !have("qemu-io") {
        return;
    }
    // A listener the caller bound (port 0: the kernel picks).
    let export = RecordingExport::new(2 << 20);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = Arc::new(AtomicBool::new(false));
    let serving = {
        let server = Server::new(export.clone(), config());
        let shutdown = shutdown.clone();
        thread::spawn(move || server.serve_bound(BoundListener::Tcp(listener), shutdown))
    };
    let uri = format!("nbd://{addr}/disk");
    assert_eq!(nbdinfo_json(&uri)["exports"][0]["export-size"], 2u64 << 20);
    run_ok(
        Command::new("qemu-io").args(["-f", "raw", &uri, "-c", "write -P 0x42 777 5000"]),
        LIMIT,
    );
    assert!(export.contents()[777..5777].iter().all(|&b| b == 0x42));
    shutdown.store(true, std::sync::atomic::Ordering::SeqCst);
    serving.join().unwrap().unwrap();

    // `Listener::Tcp` binds the address itself (a port just found free).
    let addr: SocketAddr = {
        let probe = TcpListener::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap()
    };
    let shutdown = Arc::new(AtomicBool::new(false));
    let serving = {
        let server = Server::new(export.clone(), config());
        let shutdown = shutdown.clone();
        thread::spawn(move || server.serve(Listener::Tcp(addr), shutdown))
    };
    let uri = format!("nbd://{addr}");
    let mut info = None;
    for _ in 0..100 {
        let output = run(Command::new("nbdinfo").args(["--json", &uri]), LIMIT);
        if output.status.success() {
            info = Some(serde_json::from_slice::<serde_json::Value>(&output.stdout).unwrap());
            break;
        }
        thread::sleep(Duration::from_millis(20)); // not listening yet
    }
    assert_eq!(
        info.expect("nbdinfo never connected")["exports"][0]["export-size"],
        2u64 << 20
    );
    shutdown.store(true, std::sync::atomic::Ordering::SeqCst);
    serving.join().unwrap().unwrap();
}
