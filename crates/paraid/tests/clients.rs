//! Real NBD clients we did not write (libnbd's nbdinfo, nbdcopy and Python module, qemu-io, fio's nbd engine) against
//! `paraid serve` on a RAID6 of sparse files.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

use common::*;

fn detail_size_bytes(members: &[std::path::PathBuf]) -> u64 {
    let out = paraid_with_paths(&["detail", "--json"], members);
    assert!(
        out.status.success(),
        "paraid detail: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let value: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("detail --json prints JSON");
    value["size_bytes"].as_u64().expect("detail has size_bytes")
}

#[test]
fn nbdinfo_reports_size_and_flags() {
    let scratch = Scratch::new("nbdinfo");
    let members = scratch.members(6);
    create("6", "64K", "32M", &members);
    let expected_size = detail_size_bytes(&members);
    let served = Served::start(&scratch.path("s.sock"), &members, &[]);
    let text = client("nbdinfo", &["--json", &served.uri()]);
    let info: serde_json::Value = serde_json::from_str(&text).expect("nbdinfo --json prints JSON");
    let export = &info["exports"][0];
    assert_eq!(
        export["export-size"].as_u64(),
        Some(expected_size),
        "nbdinfo: {text}"
    );
    for flag in [
        "can_flush",
        "can_fua",
        "can_trim",
        "can_zero",
        "can_multi_conn",
    ] {
        assert_eq!(export[flag].as_bool(), Some(true), "{flag} in {text}");
    }
    assert_eq!(export["is_read_only"].as_bool(), Some(false), "{text}");
    served.stop();
}

#[test]
fn nbdinfo_with_socket_activation() {
    let scratch = Scratch::new("activation");
    let members = scratch.members(4);
    create("5", "16K", "16M", &members);
    let expected_size = detail_size_bytes(&members);
    let mut args: Vec<String> = vec!["--json".into(), "--".into(), "[".into()];
    args.push(paraid_bin().display().to_string());
    args.push("serve".into());
    args.extend(members.iter().map(|m| m.display().to_string()));
    args.push("]".into());
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let text = client("nbdinfo", &refs);
    let info: serde_json::Value = serde_json::from_str(&text).expect("nbdinfo --json prints JSON");
    assert_eq!(
        info["exports"][0]["export-size"].as_u64(),
        Some(expected_size),
        "{text}"
    );
    // The server stopped when nbdinfo closed it: the array must be marked clean again.
    let out = paraid_with_paths(&["examine", "--json"], &members[..1]);
    let sb: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(sb["state"].as_str(), Some("clean"), "{sb}");
}

#[test]
fn nbdcopy_round_trip_is_byte_identical() {
    let scratch = Scratch::new("nbdcopy");
    let members = scratch.members(6);
    create("6", "64K", "24M", &members);
    let size = detail_size_bytes(&members) as usize;
    let data = random_bytes(0x5eed_0001, size);
    let input = scratch.path("in.bin");
    std::fs::write(&input, &data).unwrap();
    let served = Served::start(&scratch.path("s.sock"), &members, &[]);
    client("nbdcopy", &[input.to_str().unwrap(), &served.uri()]);
    served.stop();
    // A fresh assembly reads it back: the data went to the members, not to a cache.
    let served = Served::start(&scratch.path("s.sock"), &members, &[]);
    let output = scratch.path("out.bin");
    client("nbdcopy", &[&served.uri(), output.to_str().unwrap()]);
    served.stop();
    let back = std::fs::read(&output).unwrap();
    assert_eq!(back.len(), data.len());
    assert!(back == data, "nbdcopy read back different bytes");
}

/// `nbdinfo --map --json` of the export: (offset, length, hole) per extent.
fn allocation_map(uri: &str) -> Vec<(u64, u64, bool)> {
    let text = client("nbdinfo", &["--map", "--json", uri]);
    let extents: serde_json::Value =
        serde_json::from_str(&text).expect("nbdinfo --map --json prints JSON");
    extents
        .as_array()
        .expect("a list of extents")
        .iter()
        .map(|e| {
            let kind = e["type"].as_u64().expect("type");
            // base:allocation: bit 0 hole, bit 1 zero; paraid reports both or neither.
            assert!(kind == 0 || kind == 3, "extent type {kind}: {text}");
            (
                e["offset"].as_u64().unwrap(),
                e["length"].as_u64().unwrap(),
                kind == 3,
            )
        })
        .collect()
}

/// What was written never shows as a hole; the holes cover all but a few chunks around the writes.
fn assert_map_matches(
    map: &[(u64, u64, bool)],
    size: u64,
    written: &[(u64, u64)],
    at_most_data: u64,
) {
    assert_eq!(
        map.iter().map(|(_, len, _)| len).sum::<u64>(),
        size,
        "{map:?}"
    );
    for (at, len, hole) in map {
        for (w_at, w_len) in written {
            let overlap = w_at < &(at + len) && *at < w_at + w_len;
            assert!(
                !(overlap && *hole),
                "written {w_at} (+{w_len}) inside the hole {at} (+{len})"
            );
        }
    }
    let data: u64 = map.iter().filter(|e| !e.2).map(|e| e.1).sum();
    assert!(
        data > 0 && data <= at_most_data,
        "{data} bytes allocated: {map:?}"
    );
}

/// NBD_CMD_BLOCK_STATUS through libnbd: `nbdinfo --map` sees the holes of a sparse RAID6, nbdcopy skips them
/// (its output file stays sparse) and still reads back every byte; with a member failed, its chunks are holes
/// where the rest of their rows is, and the copy is still byte-identical.
#[test]
fn nbdinfo_map_shows_holes_and_nbdcopy_skips_them() {
    let scratch = Scratch::new("blockstatus");
    let members = scratch.members(6);
    create("6", "64K", "32M", &members);
    let size = detail_size_bytes(&members);
    let served = Served::start(&scratch.path("s.sock"), &members, &[]);
    let uri = served.uri();
    assert_eq!(
        allocation_map(&uri),
        vec![(0, size, true)],
        "a new array is one hole"
    );

    let written: [(u64, u64, u8); 3] = [
        (1 << 20, 65536, 0x5a),
        (5_000_001, 4000, 0x3c),
        (size - 4096, 4096, 0x77),
    ];
    let mut args: Vec<String> = vec!["-f".into(), "raw".into(), uri.clone()];
    for (offset, len, pattern) in written {
        args.push("-c".into());
        args.push(format!("write -P {pattern:#x} {offset} {len}"));
    }
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    client("qemu-io", &refs);
    let mut model = vec![0u8; size as usize];
    for (offset, len, pattern) in written {
        model[offset as usize..(offset + len) as usize].fill(pattern);
    }
    let ranges: Vec<(u64, u64)> = written.iter().map(|(at, len, _)| (*at, *len)).collect();
    // Each write lies in one or two 64 KiB chunks.
    assert_map_matches(&allocation_map(&uri), size, &ranges, 6 * 65536);

    let output = scratch.path("out.bin");
    let back = nbdcopy_out(&uri, &output);
    assert!(back == model, "nbdcopy read back different bytes");
    let allocated = {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(&output).unwrap().blocks() * 512
    };
    assert!(
        allocated <= 1 << 20,
        "nbdcopy wrote {allocated} bytes of a {size}-byte array holding {} written: the holes were not skipped",
        6 * 65536
    );

    // Member 2 out: reads of its chunks solve them from the rest of their rows, so a chunk of it is a hole where
    // its row's other members are; only the written rows' chunks are allocated (a stripe is 4 x 64 KiB).
    let control = scratch.path("s.sock.ctl");
    ctl(&control, &["fail", members[2].to_str().unwrap()]);
    let degraded = allocation_map(&uri);
    assert_map_matches(&degraded, size, &ranges, 6 * 4 * 65536);
    std::fs::remove_file(&output).unwrap();
    assert!(
        nbdcopy_out(&uri, &output) == model,
        "nbdcopy of the degraded array differs"
    );
    served.stop();
}

#[test]
fn qemu_io_patterns_at_odd_offsets() {
    let scratch = Scratch::new("qemuio");
    let members = scratch.members(5);
    create("5", "4K", "16M", &members);
    let served = Served::start(&scratch.path("s.sock"), &members, &[]);
    let uri = served.uri();
    // (offset, length, pattern): unaligned, chunk-straddling, stripe-straddling, overlapping.
    let writes: [(u64, u64, u8); 6] = [
        (1000, 3333, 0xab),
        (4095, 2, 0x11),
        (12_287, 70_001, 0x5a),
        (65_536, 4096, 0xc3),
        (1 << 20, 1, 0xee),
        (77, 9000, 0x3c),
    ];
    let mut args: Vec<String> = vec!["-f".into(), "raw".into(), uri.clone()];
    for (offset, len, pattern) in writes {
        args.push("-c".into());
        args.push(format!("write -P {pattern:#x} {offset} {len}"));
    }
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    client("qemu-io", &refs);
    // Expected bytes: later writes overwrite earlier ones; check every written range against that model.
    let model_len = (1 << 20) + 1;
    let mut model = vec![0u8; model_len];
    for (offset, len, pattern) in writes {
        model[offset as usize..(offset + len) as usize].fill(pattern);
    }
    let mut check: Vec<String> = vec!["-f".into(), "raw".into(), uri];
    let mut start = 0usize;
    while start < model_len {
        let byte = model[start];
        let mut end = start;
        while end < model_len && model[end] == byte {
            end += 1;
        }
        check.push("-c".into());
        check.push(format!("read -P {byte:#x} {start} {}", end - start));
        start = end;
    }
    let reads = (check.len() - 3) / 2;
    let refs: Vec<&str> = check.iter().map(String::as_str).collect();
    let text = client("qemu-io", &refs);
    assert!(
        !text.contains("Pattern verification failed"),
        "qemu-io: {text}"
    );
    assert_eq!(
        text.matches("read ").count(),
        reads,
        "qemu-io ran every read: {text}"
    );
    served.stop();
}

/// Runs fio's nbd engine against `uri` with `rw` in pieces of `bs` over `size_mib` MiB at `iodepth`, then its
/// crc32c verify pass; asserts that fio saw no error and wrote and verified every byte.
fn fio_write_then_verify(uri: &str, rw: &str, bs: &str, size_mib: u64, iodepth: u32) {
    let text = client(
        "fio",
        &[
            "--name=verify",
            "--ioengine=nbd",
            &format!("--uri={uri}"),
            &format!("--rw={rw}"),
            &format!("--bs={bs}"),
            &format!("--size={size_mib}M"),
            &format!("--iodepth={iodepth}"),
            "--verify=crc32c",
            "--do_verify=1",
            "--verify_fatal=1",
            "--verify_state_save=0",
            "--output-format=json",
        ],
    );
    let report: serde_json::Value =
        serde_json::from_str(&text[text.find('{').unwrap()..]).expect("fio JSON");
    let job = &report["jobs"][0];
    assert_eq!(job["error"].as_i64(), Some(0), "fio: {text}");
    assert!(
        job["write"]["io_bytes"].as_u64().unwrap() >= size_mib << 20,
        "fio wrote everything: {text}"
    );
    assert!(
        job["read"]["io_bytes"].as_u64().unwrap() >= size_mib << 20,
        "fio verified everything: {text}"
    );
}

#[test]
fn fio_random_writes_verify() {
    let scratch = Scratch::new("fio");
    let members = scratch.members(6);
    create("6", "64K", "24M", &members);
    let served = Served::start(&scratch.path("s.sock"), &members, &[]);
    fio_write_then_verify(&served.uri(), "randwrite", "4k", 32, 16);
    served.stop();
}

/// Sequential writes in pieces that divide neither a chunk nor a stripe, many in flight: the server merges the
/// ones that arrive together into larger array writes (up to `--merge-write-kib`), and fio's verify pass reads
/// every piece back. Run with merging at its default and with a small limit (merges end mid-stripe).
#[test]
fn fio_sequential_pieces_merged_verify() {
    for merge_kib in ["1024", "24"] {
        let scratch = Scratch::new("fio-merge");
        let members = scratch.members(5);
        create("5", "16K", "24M", &members);
        let served = Served::start(
            &scratch.path("s.sock"),
            &members,
            &["--merge-write-kib", merge_kib],
        );
        fio_write_then_verify(&served.uri(), "write", "12k", 36, 32);
        served.stop();
    }
    // A limit past the largest request is refused before anything is assembled.
    let scratch = Scratch::new("fio-merge-bad");
    let members = scratch.members(3);
    create("5", "16K", "16M", &members);
    let out = paraid_with_paths(&["serve", "--merge-write-kib", "1048576"], &members);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--merge-write-kib 1048576: at most"),
        "{stderr}"
    );
}

#[test]
fn tcp_listener_serves_on_loopback() {
    let scratch = Scratch::new("tcp");
    let members = scratch.members(4);
    create("10", "64K", "16M", &members);
    let expected_size = detail_size_bytes(&members);
    // A port unlikely to be taken; a bare port means 127.0.0.1.
    let port = 20_000 + (std::process::id() % 20_000) as u16;
    let mut child = std::process::Command::new(paraid_bin())
        .args([
            "serve",
            "--listen",
            &port.to_string(),
            "--control",
            scratch.path("c.ctl").to_str().unwrap(),
        ])
        .args(&members)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "no TCP listener on 127.0.0.1:{port}"
        );
        assert!(child.try_wait().unwrap().is_none(), "paraid serve exited");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let text = client("nbdinfo", &["--json", &format!("nbd://127.0.0.1:{port}")]);
    let info: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        info["exports"][0]["export-size"].as_u64(),
        Some(expected_size),
        "{text}"
    );
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "serve stopped cleanly: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("nbd://127.0.0.1:{port}")),
        "{stderr}"
    );
    assert!(
        stderr.contains("paraid: stopped; the array is marked clean on every member"),
        "{stderr}"
    );
}

/// `--consistency-policy journal`: fio's random and sequential small writes at queue depth 1 verify; then small
/// writes of a pattern with no flush, and a SIGKILL of the server right after the last is answered: restarted
/// (the default policy), every byte written reads back. qemu-io writes with FUA, which journal mode answers once
/// in place, not from the log: `the_default_policy_keeps_every_answered_write_through_a_kill` kills the server
/// after writes answered from the log.
#[test]
fn journal_keeps_every_answered_write_through_a_kill_without_a_flush() {
    let scratch = Scratch::new("journal");
    let members = scratch.members(5);
    create("5", "64K", "24M", &members);
    let socket = scratch.path("s.sock");
    let served = Served::start(&socket, &members, &["--consistency-policy", "journal"]);
    let control = format!("{}.ctl", socket.display());
    let array = ctl(Path::new(&control), &["status"]);
    assert_eq!(array["array"]["consistency_policy"], "journal", "{array}");
    assert_eq!(array["frontend"]["write_back"], false, "{array}");
    fio_write_then_verify(&served.uri(), "randwrite", "4k", 8, 1);
    fio_write_then_verify(&served.uri(), "write", "12k", 8, 1);
    let array = ctl(Path::new(&control), &["status"]);
    assert!(
        array["array"]["integrity"]["log_entries"].as_u64() > Some(0),
        "{array}"
    );
    let writes: Vec<(u64, u64, u8)> = (0..48u64)
        .map(|n| {
            (
                (n * 40_960 + (n % 3) * 2048) % (16 << 20),
                4096 * (1 + n % 3),
                0x30 + n as u8,
            )
        })
        .collect();
    write_kill_and_read_back(&scratch, served, &members, &writes, false);
}

/// The default policy (the journal) keeps every write it answered through a SIGKILL, with no FUA and no flush
/// after them: a libnbd client (Python) writes 48 patterns one at a time, each after the last was answered, and
/// holds its connection open while the server is killed; served again, every byte reads back. Once with early
/// answers for every small write (`PARAID_JOURNAL_LONE=off`: the test must see writes answered from the log, as
/// qemu-io's writes with FUA never are), once with the gate on spare CPU deciding, as a user's server does.
#[test]
fn the_default_policy_keeps_every_answered_write_through_a_kill() {
    for (name, env) in [
        ("every", &[("PARAID_JOURNAL_LONE", "off")][..]),
        ("gated", &[][..]),
    ] {
        if std::env::var_os("PARAID_JOURNAL").is_some() || std::env::var_os("PARAID_PPL").is_some()
        {
            eprintln!("skipped: PARAID_JOURNAL or PARAID_PPL set, so the default policy is not the journal");
            return;
        }
        let scratch = Scratch::new(&format!("kill-{name}"));
        let members = scratch.members(6);
        create("6", "64K", "24M", &members);
        let socket = scratch.path("s.sock");
        let served = Served::start_with_env(&socket, &members, &[], env);
        let writes: Vec<(u64, u64, u8)> = (0..48u64)
            .map(|n| {
                (
                    (n * 53_248 + (n % 4) * 4096) % (16 << 20),
                    4096 * (1 + n % 3),
                    0x40 + n as u8,
                )
            })
            .collect();
        let script = "import nbd, sys\n\
            h = nbd.NBD()\n\
            h.connect_uri(sys.argv[1])\n\
            for w in sys.argv[2:]:\n    \
                off, ln, pat = (int(x) for x in w.split(':'))\n    \
                h.pwrite(bytes([pat]) * ln, off)\n\
            print('answered', flush=True)\n\
            sys.stdin.read()\n";
        let mut python = Command::new("python3")
            .env(
                "PATH",
                format!("/usr/bin:{}", std::env::var("PATH").unwrap_or_default()),
            )
            .arg("-c")
            .arg(script)
            .arg(served.uri())
            .args(writes.iter().map(|(o, l, p)| format!("{o}:{l}:{p}")))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 with libnbd (scripts/install-deps.sh --test installs it)");
        let mut line = String::new();
        BufReader::new(python.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("the client's line");
        assert_eq!(
            line.trim(),
            "answered",
            "{name}: the client did not finish its writes"
        );
        let control = format!("{}.ctl", socket.display());
        let integrity = ctl(Path::new(&control), &["status"])["array"]["integrity"].clone();
        assert_eq!(integrity["journal"], true, "{name}: {integrity}");
        if name == "every" {
            assert!(
                integrity["log_data_first"].as_u64() > Some(0),
                "{name}: no write was answered from the log: {integrity}"
            );
        }
        // The client still holds its connection when the server dies.
        kill_and_read_back(
            &scratch,
            served,
            &members,
            &writes,
            &format!("{name} ({integrity})"),
        );
        drop(python.stdin.take());
        let _ = python.wait();
    }
}

/// Writes `writes` (offset, length, pattern byte) one after another with qemu-io (then a flush if `flush`),
/// SIGKILLs the server, serves the members again (default policy) and checks every byte written reads back.
fn write_kill_and_read_back(
    scratch: &Scratch,
    served: Served,
    members: &[std::path::PathBuf],
    writes: &[(u64, u64, u8)],
    flush: bool,
) {
    let mut args: Vec<String> = vec!["-f".into(), "raw".into(), served.uri()];
    for (offset, len, pattern) in writes {
        args.push("-c".into());
        args.push(format!("write -P {pattern:#x} {offset} {len}"));
    }
    if flush {
        args.push("-c".into());
        args.push("flush".into());
    }
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    client("qemu-io", &refs);
    kill_and_read_back(scratch, served, members, writes, "qemu-io");
}

/// SIGKILLs the server, serves the members again (default policy) and checks every byte of `writes` (offset,
/// length, pattern byte) reads back; `what` names the case in a failure.
fn kill_and_read_back(
    scratch: &Scratch,
    mut served: Served,
    members: &[std::path::PathBuf],
    writes: &[(u64, u64, u8)],
    what: &str,
) {
    let socket = served.socket.clone();
    let mut child = served.child.take().expect("running");
    child.kill().expect("SIGKILL");
    child.wait().expect("reaped");
    drop(served);
    let served = Served::start(&socket, members, &[]);
    let mut model = vec![0u8; 16 << 20];
    for (offset, len, pattern) in writes {
        model[*offset as usize..(*offset + *len) as usize].fill(*pattern);
    }
    let got = nbdcopy_out(&served.uri(), &scratch.path("out.img"));
    for (offset, len, _) in writes {
        let range = *offset as usize..(*offset + *len) as usize;
        assert!(
            got[range.clone()] == model[range.clone()],
            "{what}: bytes {range:?} written before the kill read back wrong"
        );
    }
    served.stop();
}

/// `--write-back`: fio's random and sequential small writes at queue depth 1 (each answered while earlier ones are
/// still being written) verify; then writes of a pattern, a FLUSH, and a SIGKILL of the server: restarted without
/// write-back, every byte written before the flush reads back.
#[test]
fn write_back_verifies_and_keeps_flushed_writes_through_a_kill() {
    let scratch = Scratch::new("write-back");
    let members = scratch.members(6);
    create("6", "16K", "24M", &members);
    let socket = scratch.path("s.sock");
    let served = Served::start(&socket, &members, &["--write-back"]);
    let control = format!("{}.ctl", socket.display());
    assert_eq!(
        ctl(Path::new(&control), &["status"])["frontend"]["write_back"],
        serde_json::json!(true)
    );
    fio_write_then_verify(&served.uri(), "randwrite", "4k", 8, 1);
    fio_write_then_verify(&served.uri(), "write", "12k", 8, 1);
    // 4 KiB writes one after another (qemu-io waits for each), some overlapping, then a flush.
    let writes: Vec<(u64, u64, u8)> = (0..48u64)
        .map(|n| {
            (
                (n * 40_960 + (n % 3) * 2048) % (16 << 20),
                4096,
                0x10 + n as u8,
            )
        })
        .collect();
    write_kill_and_read_back(&scratch, served, &members, &writes, true);
}
