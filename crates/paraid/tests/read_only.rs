//! `paraid serve --read-only` under real clients: nbdinfo sees a read-only export, nbdcopy reads the array back
//! (also degraded), management commands that would write are refused with a clear error, and the member files
//! are byte for byte what they were before the serve.

mod common;

use std::path::{Path, PathBuf};

use common::*;

/// Writes `data` at offset 0 through a read-write serve and stops it cleanly.
fn write_through_serve(scratch: &Scratch, members: &[PathBuf], data: &[u8]) {
    let input = scratch.path("in.bin");
    std::fs::write(&input, data).unwrap();
    let served = Served::start(&scratch.path("rw.sock"), members, &[]);
    client("nbdcopy", &[input.to_str().unwrap(), &served.uri()]);
    served.stop();
}

fn control_of(served: &Served) -> PathBuf {
    PathBuf::from(format!("{}.ctl", served.socket.display()))
}

/// Runs a management command that must be refused; returns its error text.
fn refused(control: &Path, args: &[&str]) -> String {
    let mut all: Vec<&str> = vec![args[0], "--control", control.to_str().unwrap()];
    all.extend_from_slice(&args[1..]);
    let out = paraid(&all);
    assert!(
        !out.status.success(),
        "paraid {all:?} succeeded on a read-only array"
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_read_only_serve_reads_everything_and_writes_nothing() {
    let scratch = Scratch::new("ro-serve");
    let members = scratch.members(6);
    create("6", "64K", "16M", &members);
    let size = {
        let out = paraid_with_paths(&["detail", "--json"], &members);
        let detail: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        detail["size_bytes"].as_u64().unwrap() as usize
    };
    let data = random_bytes(77, size);
    write_through_serve(&scratch, &members, &data);
    let before: Vec<Vec<u8>> = members.iter().map(|m| std::fs::read(m).unwrap()).collect();

    // Slots 1 and 4 left out: degraded and read-only.
    let given: Vec<PathBuf> = [0, 2, 3, 5].iter().map(|&i| members[i].clone()).collect();
    let served = Served::start(&scratch.path("ro.sock"), &given, &["--read-only"]);
    let info: serde_json::Value =
        serde_json::from_str(&client("nbdinfo", &["--json", &served.uri()])).unwrap();
    let export = &info["exports"][0];
    assert_eq!(export["is_read_only"].as_bool(), Some(true), "{info}");
    assert_eq!(export["can_trim"].as_bool(), Some(false), "{info}");
    assert!(
        nbdcopy_out(&served.uri(), &scratch.path("out.bin")) == data,
        "the degraded read-only array read back other bytes"
    );
    // A client that asks to open it for writing is refused (the server's EPERM for a WRITE sent anyway is
    // paraid-nbd's `read_only_refuses_every_write_kind_with_eperm`; the engine's own refusal, tests/read_only.rs).
    let out = std::process::Command::new("qemu-io")
        .args(["-f", "raw", "-c", "write -P 0x55 0 4k", &served.uri()])
        .output()
        .expect("qemu-io");
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && text.contains("Permission denied"),
        "qemu-io opened a read-only export for writing: {text}"
    );
    let new_member = scratch.path("new.img");
    std::fs::File::create(&new_member)
        .unwrap()
        .set_len(16 << 20)
        .unwrap();
    let control = control_of(&served);
    let array = status(&control);
    assert_eq!(array["read_only"].as_bool(), Some(true), "{array}");
    let text = paraid(&["status", "--control", control.to_str().unwrap()]);
    assert!(
        String::from_utf8_lossy(&text.stdout).contains("served read-only"),
        "{}",
        String::from_utf8_lossy(&text.stdout)
    );
    let metrics = paraid(&["metrics", "--control", control.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&metrics.stdout);
    assert!(
        text.lines()
            .any(|l| l.starts_with("paraid_array_read_only{") && l.ends_with(" 1")),
        "{text}"
    );
    for args in [
        vec!["fail", "0"],
        vec!["remove", "1"],
        vec!["check", "--repair"],
        vec!["add", new_member.to_str().unwrap()],
    ] {
        let error = refused(&control, &args);
        assert!(error.contains("served read-only"), "{args:?}: {error}");
    }
    served.stop();
    for (i, m) in members.iter().enumerate() {
        assert!(std::fs::read(m).unwrap() == before[i], "member {i} changed");
    }

    // Every member, read-only: a check runs (it only reads) and finds parity consistent.
    let served = Served::start(&scratch.path("ro2.sock"), &members, &["--read-only"]);
    let control = control_of(&served);
    ctl(&control, &["check", "--wait"]);
    let result = &status(&control)["last_result"];
    assert_eq!(result["kind"].as_str(), Some("check"), "{result}");
    assert_eq!(result["mismatches"].as_u64(), Some(0), "{result}");
    served.stop();
    for (i, m) in members.iter().enumerate() {
        assert!(std::fs::read(m).unwrap() == before[i], "member {i} changed");
    }
}

#[test]
fn read_only_refusals_are_clear_and_write_nothing() {
    let scratch = Scratch::new("ro-refuse");
    let members = scratch.members(4);
    create("5", "64K", "16M", &members);
    let spare = scratch.path("spare.img");
    std::fs::File::create(&spare)
        .unwrap()
        .set_len(16 << 20)
        .unwrap();
    let socket = scratch.path("s.sock");
    let mut args: Vec<&str> = vec!["serve", "--socket", socket.to_str().unwrap(), "--read-only"];
    args.extend(["--spare", spare.to_str().unwrap()]);
    let out = paraid_with_paths(&args, &members);
    assert!(
        !out.status.success(),
        "--read-only with --spare was accepted"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cannot be used with"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Write-back holds writes; a read-only array takes none.
    let out = paraid_with_paths(
        &[
            "serve",
            "--socket",
            socket.to_str().unwrap(),
            "--read-only",
            "--write-back",
        ],
        &members,
    );
    assert!(
        !out.status.success()
            && String::from_utf8_lossy(&out.stderr).contains("cannot be used with"),
        "--read-only with --write-back: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Stopped uncleanly (SIGKILL after writes), then offered read-only without a member: the log's recovery
    // runs in memory and the data reads back; with the consistency policy "bitmap" (no log) it is refused, since
    // nothing could make the stripes being written at the crash consistent. Nothing is written either way.
    let mut served = Served::start(&socket, &members, &[]);
    let input = scratch.path("in.bin");
    let data = random_bytes(5, 1 << 20);
    std::fs::write(&input, &data).unwrap();
    client("nbdcopy", &[input.to_str().unwrap(), &served.uri()]);
    client("nbdsh", &["-u", &served.uri(), "-c", "h.flush()"]);
    let mut child = served.child.take().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    let before: Vec<Vec<u8>> = members.iter().map(|m| std::fs::read(m).unwrap()).collect();
    let served = Served::start(&socket, &members[1..], &["--read-only"]);
    let array = status(&control_of(&served));
    assert_eq!(array["state"].as_str(), Some("dirty"), "{array}");
    let mut back = nbdcopy_out(&served.uri(), &scratch.path("out.bin"));
    back.truncate(data.len());
    assert!(
        back == data,
        "the dirty degraded array read back other bytes"
    );
    served.stop();
    let out = paraid_with_paths(
        &[
            "serve",
            "--socket",
            socket.to_str().unwrap(),
            "--read-only",
            "--consistency-policy",
            "bitmap",
        ],
        &members[1..],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "a dirty degraded RAID5 without the log was served read-only"
    );
    assert!(
        stderr.contains("cannot serve the array read-only")
            && stderr.contains("not stopped cleanly"),
        "{stderr}"
    );
    for (i, m) in members.iter().enumerate() {
        assert!(std::fs::read(m).unwrap() == before[i], "member {i} changed");
    }
}
