//! The `memserve` example as a separate process: started by nbdinfo/nbdsh through socket activation
//! (`nbdinfo -- [ memserve ... ]`, LISTEN_PID/LISTEN_FDS with descriptor 3), and on a Unix socket stopped by
//! SIGTERM.

mod common;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use common::*;

const LIMIT: Duration = Duration::from_secs(60);

fn memserve() -> PathBuf {
    example("memserve")
}

#[test]
fn nbdinfo_starts_memserve_by_socket_activation() {
    if !have("nbdinfo") {
        return;
    }
    let server = memserve();
    let text = run_ok(
        Command::new("nbdinfo")
            .args(["--json", "--", "["])
            .arg(&server)
            .args(["--size", "24M", "--name", "act", "]"]),
        LIMIT,
    );
    let info: serde_json::Value = serde_json::from_str(&text).unwrap();
    let disk = &info["exports"][0];
    assert_eq!(disk["export-size"], 24u64 << 20);
    assert_eq!(disk["export-name"], "act");
    assert_eq!(disk["can_multi_conn"], true);
    assert_eq!(info["structured"], true);
}

#[test]
fn nbdsh_writes_and_reads_through_socket_activation() {
    if !have("nbdsh") {
        return;
    }
    let server = memserve();
    let script = format!(
        r#"
h.connect_systemd_socket_activation([{server:?}, "--size", "4M", "--read-only"])
assert h.is_read_only()
assert h.get_size() == 4 << 20
assert h.pread(4096, 4096) == bytes(4096)
try:
    h.set_strict_mode(0)
    h.pwrite(b"x" * 512, 0)
    raise AssertionError("write to a read-only export succeeded")
except nbd.Error as e:
    assert e.errno in (errno.EPERM, "EPERM"), e.errno
print("activated-ok")
"#
    );
    let output = run_ok(
        Command::new("nbdsh")
            .arg("-c")
            .arg(format!("import errno, nbd\n{script}")),
        LIMIT,
    );
    assert!(output.contains("activated-ok"), "{output}");
}

#[test]
fn memserve_on_a_unix_socket_stops_cleanly_on_sigterm() {
    if !have("qemu-io") {
        return;
    }
    let dir = TempDir::new("memserve");
    let socket = dir.join("m.sock");
    let mut child = Command::new(memserve())
        .args(["--size", "8M", "--unix"])
        .arg(&socket)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !socket.exists() {
        assert!(
            Instant::now() < deadline,
            "memserve never created its socket"
        );
        thread::sleep(Duration::from_millis(10));
    }
    let uri = format!("nbd+unix:///?socket={}", socket.display());
    let output = run_ok(
        Command::new("qemu-io").args([
            "-f",
            "raw",
            &uri,
            "-c",
            "write -P 0x3c 12345 6789",
            "-c",
            "read -P 0x3c 12345 6789",
        ]),
        LIMIT,
    );
    assert!(!output.contains("Pattern verification failed"), "{output}");

    // SAFETY: signalling the child we started, by its pid.
    assert_eq!(
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) },
        0
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("memserve did not stop within 5 s of SIGTERM");
        }
        thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "memserve exited with {status}");
    assert!(!socket.exists(), "memserve must remove its socket file");
}
