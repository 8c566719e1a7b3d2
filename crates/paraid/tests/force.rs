//! An array that failed from a condition every member shared (their file system full: each member's writes
//! failed in turn, and the members recorded one another as failed) is refused at the next start, with a line
//! saying what `serve --force` would do, and `serve --force` brings it back with every acknowledged write
//! (`--force --read-only` shows it first without writing a byte).

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::*;

/// Unmounts on drop (also when the test fails).
struct Mounted(PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// Writes 1 MiB pieces (piece i: bytes from a generator seeded with i), each followed by a flush, until one
/// fails; prints how many were acknowledged.
const WRITE_UNTIL_FULL: &str = "
import random
n = 0
for i in range(h.get_size() >> 20):
    try:
        h.pwrite(random.Random(i).randbytes(1 << 20), i << 20)
        h.flush()
    except nbd.Error:
        break
    n += 1
print(n)
";

/// Reads the first `pieces` back; prints how many differ from what was written.
fn count_wrong(pieces: usize) -> String {
    format!(
        "
import random
print(sum(h.pread(1 << 20, i << 20) != random.Random(i).randbytes(1 << 20) for i in range({pieces})))
"
    )
}

fn nbdsh(uri: &str, script: &str) -> String {
    client("nbdsh", &["-u", uri, "-c", script])
        .trim()
        .to_string()
}

#[test]
fn an_array_failed_by_a_full_file_system_comes_back_with_force() {
    let scratch = Scratch::new("force");
    let dir = scratch.path("small");
    std::fs::create_dir_all(&dir).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=40m", "tmpfs"])
        .arg(&dir)
        .status();
    if !matches!(mounted, Ok(status) if status.success()) {
        println!(
            "skipped: cannot mount a 40 MiB tmpfs at {} (needs root)",
            dir.display()
        );
        return;
    }
    let _unmount = Mounted(dir.clone());
    let members: Vec<PathBuf> = (0..3).map(|i| dir.join(format!("m{i}.img"))).collect();
    create("5", "64K", "32M", &members);
    let served = Served::start(&scratch.path("a.sock"), &members, &[]);
    let written: usize = nbdsh(&served.uri(), WRITE_UNTIL_FULL).parse().unwrap();
    assert!(
        written > 4,
        "only {written} MiB written before the file system was full"
    );
    let control = format!("{}.ctl", served.socket.display());
    let out = paraid(&["stop", "--control", &control, "--json"]);
    let reply: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(reply["state"].as_str(), Some("failed"), "{reply}");
    drop(served);

    // Room again; the members record one another as failed.
    let grown = Command::new("mount")
        .args(["-o", "remount,size=200m"])
        .arg(&dir)
        .status()
        .unwrap();
    assert!(grown.success());
    let socket = scratch.path("b.sock");
    let out = paraid_with_paths(&["serve", "--socket", socket.to_str().unwrap()], &members);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "a failed array started without --force"
    );
    assert!(
        stderr.contains("array failed") && stderr.contains("`paraid serve --force` starts it from"),
        "{stderr}"
    );
    let out = paraid_with_paths(&["detail"], &members);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("`paraid serve --force` starts it from"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );

    // `--force --read-only` first: a look at what the forced start would serve (the log's recovery of the
    // stripes being written when it failed applied in memory), written nowhere: the members stay byte for byte as
    // they were, and the array still needs --force afterwards.
    let before: Vec<Vec<u8>> = members.iter().map(|m| std::fs::read(m).unwrap()).collect();
    let served = Served::start(&socket, &members, &["--force", "--read-only"]);
    let wrong = nbdsh(&served.uri(), &count_wrong(written));
    assert_eq!(
        wrong, "0",
        "acknowledged pieces read back wrong with --force --read-only"
    );
    served.stop();
    for (i, m) in members.iter().enumerate() {
        assert!(
            std::fs::read(m).unwrap() == before[i],
            "member {i} changed with --read-only"
        );
    }
    let out = paraid_with_paths(&["serve", "--socket", socket.to_str().unwrap()], &members);
    assert!(
        !out.status.success(),
        "the read-only forced start changed the array"
    );

    let served = Served::start(&socket, &members, &["--force"]);
    let wrong = nbdsh(&served.uri(), &count_wrong(written));
    assert_eq!(
        wrong, "0",
        "acknowledged pieces read back wrong after --force"
    );
    // The member that left first is rebuilt; the array is then whole, reads the same, and stops clean.
    let control = PathBuf::from(format!("{}.ctl", socket.display()));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let status = ctl(&control, &["status"]);
        let slots = status["array"]["members"].as_array().unwrap().clone();
        if slots.iter().all(|m| m["state"].as_str() == Some("active")) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no rebuild within 60 s: {status}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let wrong = nbdsh(&served.uri(), &count_wrong(written));
    assert_eq!(
        wrong, "0",
        "acknowledged pieces read back wrong after the rebuild"
    );
    let reply = ctl(&control, &["stop"]);
    assert_eq!(reply["state"].as_str(), Some("clean"), "{reply}");
    drop(served);
    let out = paraid_with_paths(&["detail", "--json"], &members);
    let detail: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        detail["members"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m["state"].as_str() == Some("active")),
        "{detail}"
    );
}
