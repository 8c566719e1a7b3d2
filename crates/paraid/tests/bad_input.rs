//! Bad input anywhere gets one clear error line, a non-zero exit, and nothing written.

mod common;

use std::path::{Path, PathBuf};

use common::*;

/// Every file's size and a hash of all its bytes: "nothing written". (A hash of every 61st byte, as before, missed
/// a superblock update: the event counter's bytes were not among them.)
fn snapshot(paths: &[PathBuf]) -> Vec<Option<(u64, u64)>> {
    paths
        .iter()
        .map(|p| {
            std::fs::read(p).ok().map(|bytes| {
                let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
                for word in bytes.chunks(8) {
                    let mut w = [0u8; 8];
                    w[..word.len()].copy_from_slice(word);
                    hash = (hash ^ u64::from_le_bytes(w)).wrapping_mul(0x100_0000_01b3);
                }
                (bytes.len() as u64, hash)
            })
        })
        .collect()
}

/// Asserts failure with exactly one `paraid: error:` line on stderr that mentions `needle`.
fn assert_one_error(out: &std::process::Output, needle: &str) {
    assert!(
        !out.status.success(),
        "expected failure, got success; stdout: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one error line expected, got: {stderr}");
    assert!(
        lines[0].starts_with("paraid: error:"),
        "error line: {stderr}"
    );
    assert!(
        lines[0].to_lowercase().contains(&needle.to_lowercase()),
        "error should mention '{needle}': {stderr}"
    );
}

#[test]
fn create_refuses_bad_geometry_and_writes_nothing() {
    let scratch = Scratch::new("badcreate");
    let members = scratch.members(4);
    let cases: [(&[&str], &str); 8] = [
        (
            &["--level", "6", "--chunk", "48K", "--size", "16M"],
            "power of two",
        ),
        (
            &["--level", "6", "--size", "16M", "--data-offset", "5000K"],
            "data offset",
        ),
        (
            &["--level", "6", "--size", "16M", "--data-offset", "2G"],
            "data offset",
        ),
        (
            &["--level", "6", "--size", "16M", "--data-offset", "lots"],
            "--data-offset",
        ),
        (
            &["--level", "6", "--chunk", "banana", "--size", "16M"],
            "banana",
        ),
        (&["--level", "7", "--chunk", "64K", "--size", "16M"], "7"),
        (&["--level", "6", "--chunk", "64K", "--size", "1M"], "small"),
        (&["--level", "6", "--chunk", "64K", "--size", "1Q"], "1Q"),
    ];
    for (args, needle) in cases {
        let mut all = vec!["create"];
        all.extend_from_slice(args);
        let out = paraid_with_paths(&all, &members);
        assert_one_error(&out, needle);
        for m in &members {
            assert!(
                !m.exists(),
                "{} was created by a refused command {all:?}",
                m.display()
            );
        }
    }
    // Too few members for RAID6.
    let out = paraid_with_paths(&["create", "--level", "6", "--size", "16M"], &members[..3]);
    assert_one_error(&out, "member");
    assert!(!members[0].exists());
    // A member that does not exist, without --size to create it.
    let out = paraid_with_paths(&["create", "--level", "5"], &members);
    assert_one_error(&out, &members[0].file_name().unwrap().to_string_lossy());
}

#[test]
fn create_refuses_the_same_member_twice() {
    let scratch = Scratch::new("twice");
    let mut members = scratch.members(3);
    for m in &members {
        std::fs::write(m, vec![7u8; 16 << 20]).unwrap();
    }
    members.push(members[1].clone());
    let before = snapshot(&members);
    let out = paraid_with_paths(&["create", "--level", "6"], &members);
    assert_one_error(&out, "m1.img");
    assert_eq!(
        snapshot(&members),
        before,
        "a refused create changed a member"
    );
}

#[test]
fn serve_examine_detail_refuse_foreign_mixed_duplicate_and_small_members() {
    let scratch = Scratch::new("badserve");
    let first = scratch.members(4);
    let second: Vec<PathBuf> = (0..4)
        .map(|i| scratch.path(&format!("other{i}.img")))
        .collect();
    create("5", "64K", "16M", &first);
    create("5", "64K", "16M", &second);
    let stranger = scratch.path("stranger.img");
    std::fs::write(&stranger, vec![0x42u8; 8 << 20]).unwrap();

    let mut everything: Vec<PathBuf> = first.clone();
    everything.extend(second.iter().cloned());
    everything.push(stranger.clone());
    let before = snapshot(&everything);

    // A file that is no member.
    let out = paraid_with_paths(&["examine"], std::slice::from_ref(&stranger));
    assert_one_error(&out, "stranger.img");
    let mut with_stranger = first[..3].to_vec();
    with_stranger.push(stranger.clone());
    let out = paraid_with_paths(
        &[
            "serve",
            "--socket",
            scratch.path("a.sock").to_str().unwrap(),
        ],
        &with_stranger,
    );
    assert_one_error(&out, "stranger.img");

    // Members of two different arrays.
    let mut mixed = first[..3].to_vec();
    mixed.push(second[3].clone());
    let out = paraid_with_paths(
        &[
            "serve",
            "--socket",
            scratch.path("b.sock").to_str().unwrap(),
        ],
        &mixed,
    );
    assert_one_error(&out, "array");
    let out = paraid_with_paths(&["detail"], &mixed);
    assert_one_error(&out, "array");

    // The same member twice.
    let mut twice = first.clone();
    twice[3] = first[0].clone();
    let out = paraid_with_paths(
        &[
            "serve",
            "--socket",
            scratch.path("c.sock").to_str().unwrap(),
        ],
        &twice,
    );
    assert_one_error(&out, "m0.img");

    assert_eq!(
        snapshot(&everything),
        before,
        "a refused command changed a member"
    );

    // A member too small for its superblock's geometry (truncated behind our back).
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&first[2])
        .unwrap();
    file.set_len(6 << 20).unwrap();
    drop(file);
    let out = paraid_with_paths(
        &[
            "serve",
            "--socket",
            scratch.path("d.sock").to_str().unwrap(),
        ],
        &first,
    );
    assert_one_error(&out, "m2.img is too small for its array");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("leave it out"),
        "the error says what to do"
    );
}

#[test]
fn bad_flags_are_one_line_errors() {
    let scratch = Scratch::new("flags");
    let members = scratch.members(4);
    create("6", "64K", "16M", &members);
    let out = paraid_with_paths(
        &[
            "serve",
            "--parity-backend",
            "fpga",
            "--socket",
            scratch.path("e.sock").to_str().unwrap(),
        ],
        &members,
    );
    assert_one_error(&out, "fpga");
    let out = paraid_with_paths(&["serve", "--listen", "nowhere"], &members);
    assert_one_error(&out, "nowhere");
    let socket = scratch.path("f.sock");
    let socket = socket.to_str().unwrap();
    for (flags, needle) in [
        (&["--workers", "0"][..], "--workers 0: 1 to 1024"),
        (&["--workers", "100000"][..], "--workers 100000"),
        (
            &["--ublk-depth", "8"][..],
            "--ublk-depth applies only with --ublk",
        ),
        (
            &["--ublk-id", "3"][..],
            "--ublk-id applies only with --ublk",
        ),
        (
            &["--stripe-cache-mib", "999999999"][..],
            "more than half of this machine's memory",
        ),
    ] {
        let mut args = vec!["serve", "--socket", socket];
        args.extend_from_slice(flags);
        let out = paraid_with_paths(&args, &members);
        assert_one_error(&out, needle);
    }
    // The refused serves left the array clean.
    let out = paraid_with_paths(&["examine", "--json"], &members[..1]);
    let sb: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(sb["state"].as_str(), Some("clean"), "{sb}");
}

/// With `--json` a failure is also one JSON object on stdout, `{"ok": false, "error": ...}`, beside the stderr line.
#[test]
fn failures_asked_for_as_json_are_json() {
    let scratch = Scratch::new("json-errors");
    let members = scratch.members(3);
    let none: &[PathBuf] = &[];
    for (args, paths, needle) in [
        (
            vec!["create", "--level", "9", "--json"],
            &members[..],
            "unknown RAID level",
        ),
        (
            vec!["status", "--control", "/nonexistent.ctl", "--json"],
            none,
            "cannot reach",
        ),
        (vec!["detail", "--json"], &members[..], "cannot stat"),
        (
            vec!["monitor", "--control", "/nonexistent.ctl", "--json"],
            none,
            "cannot reach",
        ),
        (
            vec![
                "monitor",
                "--control",
                "/nonexistent.ctl",
                "--delay-s",
                "0",
                "--json",
            ],
            none,
            "--delay-s must be at least 1",
        ),
    ] {
        let out = paraid_with_paths(&args, paths);
        assert_one_error(&out, needle);
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(text.lines().count(), 1, "{args:?}: {text}");
        let reply: serde_json::Value = serde_json::from_str(&text).expect("JSON on stdout");
        assert_eq!(reply["ok"], false, "{reply}");
        assert!(reply["error"].as_str().unwrap().contains(needle), "{reply}");
    }
    // Without --json, stdout stays empty.
    let out = paraid(&["status", "--control", "/nonexistent.ctl"]);
    assert!(out.stdout.is_empty());
}

#[test]
fn create_refuses_members_of_an_existing_array_without_force() {
    let scratch = Scratch::new("force");
    let members = scratch.members(4);
    create("5", "64K", "16M", &members);
    let before = snapshot(&members);
    let out = paraid_with_paths(&["create", "--level", "6", "--size", "16M"], &members);
    assert_one_error(&out, "already belongs");
    assert_eq!(
        snapshot(&members),
        before,
        "a refused create changed a member"
    );
    let out = paraid_with_paths(
        &["create", "--level", "6", "--size", "16M", "--force"],
        &members,
    );
    assert!(
        out.status.success(),
        "create --force: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = paraid_with_paths(&["examine", "--json"], &members[..1]);
    let sb: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(sb["level"].as_str(), Some("raid6"), "{sb}");
}

/// A member that holds a filesystem (made by mkfs.ext4, e2fsprogs) is refused without --force, unchanged.
#[test]
fn create_refuses_a_member_holding_a_filesystem_without_force() {
    let scratch = Scratch::new("foreign");
    let members = scratch.members(3);
    for m in &members {
        std::fs::File::create(m).unwrap().set_len(16 << 20).unwrap();
    }
    let mkfs = std::process::Command::new("mkfs.ext4")
        .args(["-q", "-F"])
        .arg(&members[1])
        .output()
        .expect("mkfs.ext4 (e2fsprogs) runs");
    assert!(
        mkfs.status.success(),
        "{}",
        String::from_utf8_lossy(&mkfs.stderr)
    );
    let before = snapshot(&members);
    let out = paraid_with_paths(&["create", "--level", "5"], &members);
    assert_one_error(&out, "m1.img holds an ext2/3/4 filesystem; give --force");
    assert_eq!(
        snapshot(&members),
        before,
        "a refused create changed a member"
    );
    let out = paraid_with_paths(&["examine"], &members[1..2]);
    assert_one_error(
        &out,
        "m1.img: not a paraid array member: it holds an ext2/3/4 filesystem",
    );
    let out = paraid_with_paths(&["create", "--level", "5", "--force"], &members);
    assert!(
        out.status.success(),
        "create --force: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Members served by one paraid are refused to a second `serve` and to `create --force` (two servers would each
/// keep parity over writes the other does not see); `detail` still reads them; after a stop they serve again.
#[test]
fn members_in_use_by_a_server_are_refused_to_another() {
    let scratch = Scratch::new("claimed");
    let members = scratch.members(4);
    create("5", "64K", "16M", &members);
    let served = Served::start(&scratch.path("a.sock"), &members, &[]);
    let second = scratch.path("b.sock");
    let out = paraid_with_paths(&["serve", "--socket", second.to_str().unwrap()], &members);
    assert_one_error(
        &out,
        "m0.img: in use: another process has it open as an array member",
    );
    assert!(!second.exists(), "the refused server listened");
    let out = paraid_with_paths(&["create", "--level", "6", "--force"], &members);
    assert_one_error(&out, "in use");
    let out = paraid_with_paths(&["detail", "--json"], &members);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    served.stop();
    Served::start(&second, &members, &[]).stop();
}

#[test]
fn serve_with_ublk_refuses_bad_settings_and_a_kernel_without_the_driver() {
    let scratch = Scratch::new("badublk");
    let members = scratch.members(4);
    create("6", "64K", "16M", &members);
    let before = snapshot(&members);

    // Settings out of range are refused before the array is touched.
    let out = paraid_with_paths(&["serve", "--ublk", "--ublk-depth", "0"], &members);
    assert_one_error(&out, "at least 1");
    let out = paraid_with_paths(&["serve", "--ublk", "--ublk-depth", "5000"], &members);
    assert_one_error(&out, "at most 4096");
    // A ublk setting without --ublk, and --ublk beside an NBD socket, are usage errors.
    for args in [
        &["serve", "--ublk-queues", "2"][..],
        &["serve", "--ublk-id", "3"][..],
        &["serve", "--ublk", "--socket", "/tmp/x.sock"][..],
    ] {
        let out = paraid_with_paths(args, &members);
        assert!(!out.status.success(), "{args:?} was accepted");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("--ublk"),
            "{args:?}: the usage error names --ublk: {stderr}"
        );
    }
    assert_eq!(
        snapshot(&members),
        before,
        "a refused serve wrote to a member"
    );

    // Without the driver (this host, CI): one clear line that says what to load, and the array left clean.
    if std::path::Path::new("/dev/ublk-control").exists() {
        println!("ublk: the missing-driver case skipped: this kernel has /dev/ublk-control");
        return;
    }
    let out = paraid_with_paths(
        &[
            "serve",
            "--ublk",
            "--control",
            scratch.path("u.ctl").to_str().unwrap(),
        ],
        &members,
    );
    assert_one_error(&out, "modprobe ublk_drv");
    let out = paraid_with_paths(&["ublk-delete", "3"], &[]);
    assert_one_error(&out, "modprobe ublk_drv");
    let out = paraid_with_paths(&["examine", "--json"], &members[..1]);
    let sb: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(sb["state"].as_str(), Some("clean"), "{sb}");
}

/// A member whose superblock is corrupted is named with what to do; the array starts without it, and the member
/// added back is rebuilt.
#[test]
fn a_member_with_a_corrupted_superblock_is_named_and_can_be_rebuilt() {
    use std::os::unix::fs::FileExt;
    let scratch = Scratch::new("corrupt-sb");
    let members = scratch.members(4);
    create("5", "64K", "16M", &members);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&members[2])
        .unwrap()
        .write_all_at(&[0xff, 0xff], 200)
        .unwrap();
    let out = paraid_with_paths(
        &[
            "serve",
            "--socket",
            scratch.path("a.sock").to_str().unwrap(),
        ],
        &members,
    );
    assert_one_error(&out, "m2.img: superblock checksum mismatch");
    assert!(String::from_utf8_lossy(&out.stderr).contains("leave it out"));
    let without: Vec<PathBuf> = [0, 1, 3].iter().map(|&i| members[i].clone()).collect();
    let served = Served::start(&scratch.path("b.sock"), &without, &[]);
    let control = format!("{}.ctl", served.socket.display());
    let reply = ctl(Path::new(&control), &["add", members[2].to_str().unwrap()]);
    assert_eq!(reply["rebuilding_slot"], 2, "{reply}");
    served.stop();
}

/// Two arrays of one name served without --socket meet at the same default socket: the second is refused with
/// what to do about it, before it is assembled (nothing written).
#[test]
fn a_second_array_of_the_same_name_is_told_to_give_a_socket() {
    let scratch = Scratch::new("same-name");
    let name = format!("same-name-{}", std::process::id());
    let (first, second) = (
        scratch.members(4)[..2].to_vec(),
        scratch.members(4)[2..].to_vec(),
    );
    for members in [&first, &second] {
        let out = paraid_with_paths(
            &["create", "--level", "1", "--size", "16M", "--name", &name],
            members,
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let default_socket = PathBuf::from(format!("/tmp/paraid-{name}.sock"));
    let mut child = std::process::Command::new(paraid_bin())
        .arg("serve")
        .args(&first)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("serve the first");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while std::os::unix::net::UnixStream::connect(&default_socket).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "the first array did not listen"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let events = || {
        let out = paraid_with_paths(&["examine", "--json"], &second[..1]);
        serde_json::from_slice::<serde_json::Value>(&out.stdout).expect("examine --json")["events"]
            .clone()
    };
    let before = events();
    let out = paraid_with_paths(&["serve"], &second);
    assert_eq!(
        events(),
        before,
        "the refused serve assembled the array (its superblocks were written)"
    );
    // Its own NBD socket, but the first server's control socket: refused the same way, with what to give.
    let own_socket = scratch.path("second.sock");
    let first_control = format!("{}.ctl", default_socket.display());
    let control_taken = paraid_with_paths(
        &[
            "serve",
            "--socket",
            own_socket.to_str().unwrap(),
            "--control",
            &first_control,
        ],
        &second,
    );
    assert_one_error(
        &control_taken,
        "another server already listens on this control socket (give this one --control PATH)",
    );
    assert_eq!(
        events(),
        before,
        "the serve refused for its control socket wrote"
    );
    assert!(!own_socket.exists(), "the refused server listened");
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    let stopped = child.wait().expect("the first server stops");
    assert_one_error(&out, "give this one --socket PATH");
    assert!(stopped.success(), "the first server stopped cleanly");
}

/// A file that is not a socket where `serve` would put its NBD or control socket is refused and left alone (a
/// connection to a regular file is refused as to a dead server's socket, which is removed), before the array is
/// assembled: nothing is written.
#[test]
fn serve_leaves_a_file_that_is_not_a_socket_alone() {
    let scratch = Scratch::new("notsocket");
    let members = scratch.members(3);
    create("5", "64K", "16M", &members);
    let precious = scratch.path("precious.txt");
    std::fs::write(&precious, b"keep me").unwrap();
    let before = snapshot(&members);
    let socket = scratch.path("a.sock");
    for (args, needle) in [
        (
            vec!["serve", "--socket", precious.to_str().unwrap()],
            "precious.txt: cannot use it for the socket",
        ),
        (
            vec![
                "serve",
                "--socket",
                socket.to_str().unwrap(),
                "--control",
                precious.to_str().unwrap(),
            ],
            "precious.txt: cannot use it for the control socket",
        ),
    ] {
        let out = paraid_with_paths(&args, &members);
        assert_one_error(&out, needle);
        assert_eq!(std::fs::read(&precious).unwrap(), b"keep me");
        assert!(!socket.exists(), "the refused server listened");
    }
    assert_eq!(
        snapshot(&members),
        before,
        "a refused serve wrote to a member"
    );
    // A stale control socket (its server gone) is no obstacle.
    let stale = scratch.path("stale.ctl");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    let served = Served::start(&socket, &members, &["--control", stale.to_str().unwrap()]);
    let reply = ctl(&stale, &["status"]);
    assert_eq!(reply["ok"], true, "{reply}");
    served.stop();
}

/// RAID0 keeps no redundancy: a spare could never be rebuilt onto, so none is taken (at start or later).
#[test]
fn raid0_takes_no_spare() {
    let scratch = Scratch::new("raid0-spare");
    let members = scratch.members(2);
    create("0", "64K", "16M", &members);
    let spare = scratch.path("spare.img");
    std::fs::File::create(&spare)
        .unwrap()
        .set_len(32 << 20)
        .unwrap();
    let before = snapshot(&members);
    let out = paraid_with_paths(
        &[
            "serve",
            "--socket",
            scratch.path("a.sock").to_str().unwrap(),
            "--spare",
            spare.to_str().unwrap(),
        ],
        &members,
    );
    assert_one_error(&out, "spares for raid0: it keeps no redundancy");
    assert_eq!(
        snapshot(&members),
        before,
        "a refused serve wrote to a member"
    );
    let served = Served::start(&scratch.path("b.sock"), &members, &[]);
    let control = format!("{}.ctl", served.socket.display());
    let out = paraid(&["add", "--control", &control, spare.to_str().unwrap()]);
    assert_one_error(&out, "raid0 keeps no redundancy");
    served.stop();
}

/// Where `serve` cannot listen (a TCP port in use, a socket or control path in a directory that does not exist),
/// it says so before the array is assembled: one line, nothing written.
#[test]
fn serve_refuses_where_it_cannot_listen_before_writing() {
    let scratch = Scratch::new("nolisten");
    let members = scratch.members(3);
    create("5", "64K", "16M", &members);
    let before = snapshot(&members);
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let missing_dir = scratch.path("no/such/dir");
    let socket_there = format!("{}/a.sock", missing_dir.display());
    let control_there = format!("{}/a.ctl", missing_dir.display());
    let socket = scratch.path("a.sock");
    for (args, needle) in [
        (
            vec!["serve", "--listen", port.as_str()],
            "address already in use",
        ),
        (
            vec!["serve", "--socket", socket_there.as_str()],
            "a.sock: cannot use it for the socket: its directory does not exist",
        ),
        (
            vec![
                "serve",
                "--socket",
                socket.to_str().unwrap(),
                "--control",
                control_there.as_str(),
            ],
            "a.ctl: cannot use it for the control socket: its directory does not exist",
        ),
    ] {
        let out = paraid_with_paths(&args, &members);
        assert_one_error(&out, needle);
    }
    assert_eq!(
        snapshot(&members),
        before,
        "a refused serve wrote to a member"
    );
    drop(taken);
}

#[test]
fn serve_over_fuse_refuses_other_frontends_beside_it_and_a_missing_folder() {
    let scratch = Scratch::new("badfuse");
    let members = scratch.members(4);
    create("6", "64K", "16M", &members);
    let before = snapshot(&members);
    // --fuse is a frontend of its own: beside an NBD socket, a TCP listener or ublk it is a usage error.
    for args in [
        &["serve", "--fuse", "/tmp/x.img", "--socket", "/tmp/x.sock"][..],
        &["serve", "--fuse", "/tmp/x.img", "--listen", "10809"][..],
        &["serve", "--fuse", "/tmp/x.img", "--ublk"][..],
    ] {
        let out = paraid_with_paths(args, &members);
        assert!(!out.status.success(), "{args:?} was accepted");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("--fuse"),
            "{args:?}: the usage error names --fuse: {stderr}"
        );
    }
    // A file in a folder that does not exist cannot be made to stand for the array: one line that says where.
    let missing = scratch.path("no/such/folder/array.img");
    let out = paraid_with_paths(&["serve", "--fuse", missing.to_str().unwrap()], &members);
    if unsafe { libc::geteuid() } == 0 && std::path::Path::new("/dev/fuse").exists() {
        assert_one_error(&out, "which is no folder");
    } else {
        assert_one_error(&out, "--fuse");
    }
    assert_eq!(
        snapshot(&members),
        before,
        "a refused serve wrote to a member"
    );
}
