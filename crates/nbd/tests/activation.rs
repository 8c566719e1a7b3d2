//! The `memserve` example as a separate process: started by nbdinfo/nbdsh through socket activation
//! (`nbdinfo -- [ memserve ... ]`, LISTEN_PID/LISTEN_FDS with descriptor 3), and on a Unix socket stopped by
//! SIGTERM.

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

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
    let mut server = MemServe::start("8M");
    let socket = server.socket.clone();
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

    let status = server
        .stop()
        .expect("memserve did not stop within 5 s of SIGTERM");
    assert!(status.success(), "memserve exited with {status}");
    assert!(!socket.exists(), "memserve must remove its socket file");
}
