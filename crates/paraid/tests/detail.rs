//! `paraid detail` describes a member set that `serve` refuses (stale members, too many missing) instead of
//! refusing too, and its `serve` line says what `serve` of the same paths then does; `examine` in text form lists
//! the slot table entries in use.

mod common;

use std::path::PathBuf;

use common::*;

fn detail(paths: &[PathBuf]) -> serde_json::Value {
    let out = paraid_with_paths(&["detail", "--json"], paths);
    assert!(
        out.status.success(),
        "paraid detail: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("detail --json prints JSON")
}

/// Whether `paraid serve` of `paths` starts; stopped cleanly at once when it does. Returns its error otherwise.
fn serve_refusal(scratch: &Scratch, paths: &[PathBuf]) -> Option<String> {
    let socket = scratch.path("probe.sock");
    let _ = std::fs::remove_file(&socket);
    let mut child = std::process::Command::new(paraid_bin())
        .arg("serve")
        .arg("--socket")
        .arg(&socket)
        .args(paths)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawning paraid serve");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(!status.success(), "serve exited 0 without serving");
            let out = child.wait_with_output().unwrap();
            return Some(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        if std::os::unix::net::UnixStream::connect(&socket).is_ok() {
            drop(Served {
                child: Some(child),
                socket,
            });
            return None;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "serve neither served nor failed in 30 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
fn detail_reports_what_serve_refuses_and_agrees_with_it() {
    let scratch = Scratch::new("detail");
    let members = scratch.members(4);
    create("5", "64K", "16M", &members);
    let whole = detail(&members);
    assert_eq!(whole["serve"], "starts with every member", "{whole}");
    assert_eq!(whole["state"], "clean");
    assert!(serve_refusal(&scratch, &members).is_none());
    // examine's text lists the slot table entries in use (four), not the 60 unused ones.
    let examined = paraid_with_paths(&["examine"], &members[..1]);
    let text = String::from_utf8_lossy(&examined.stdout);
    assert_eq!(text.matches("state=active").count(), 4, "{text}");
    assert!(
        text.contains("entry=3") && !text.contains("unused"),
        "{text}"
    );

    // Served without m3 and written to: m3 misses writes and becomes stale.
    let served = Served::start(&scratch.path("s.sock"), &members[..3], &[]);
    client(
        "nbdsh",
        &[
            "-u",
            &served.uri(),
            "-c",
            "h.pwrite(b'x' * 65536, 0); h.flush()",
        ],
    );
    served.stop();

    let all = detail(&members);
    let stale = all["stale"].as_array().expect("stale list");
    assert_eq!(stale.len(), 1, "{all}");
    assert_eq!(stale[0]["path"], members[3].display().to_string());
    assert_eq!(stale[0]["slot"], 3);
    assert!(stale[0]["events"].as_u64().unwrap() < all["events"].as_u64().unwrap());
    // Left out since creation, the bitmap has marked everything written without it: `paraid add` re-adds it.
    assert_eq!(stale[0]["re_add_from_bitmap"], true, "{all}");
    // It was active when it left: in sync outside the bitmap everywhere, not only below a rebuild checkpoint.
    assert!(stale[0]["re_add_in_sync_below_bytes"].is_null(), "{all}");
    assert_eq!(all["members"][3]["state"], "missing", "{all}");
    assert_eq!(all["members"][3]["path"], "");
    let outlook = all["serve"].as_str().unwrap();
    assert!(outlook.starts_with("refused: "), "{outlook}");
    assert!(
        outlook.contains("stale") && outlook.contains("starts degraded: slots [3]"),
        "{outlook}"
    );
    let refusal = serve_refusal(&scratch, &members).expect("serve refuses a stale member");
    assert!(
        refusal.contains("m3.img") && refusal.contains("stale"),
        "{refusal}"
    );

    // Two missing: beyond RAID5's tolerance.
    let two_missing = detail(&members[..2]);
    let outlook = two_missing["serve"].as_str().unwrap();
    assert!(
        outlook.starts_with("refused: slots [2, 3] have no member"),
        "{outlook}"
    );
    assert!(serve_refusal(&scratch, &members[..2]).is_some());

    // Without the stale member: degraded, and serve starts.
    let degraded = detail(&members[..3]);
    let outlook = degraded["serve"].as_str().unwrap();
    assert!(
        outlook.starts_with("starts degraded: slots [3] missing"),
        "{outlook}"
    );
    assert!(degraded["stale"].as_array().unwrap().is_empty());
    assert!(serve_refusal(&scratch, &members[..3]).is_none());

    // Members of two arrays cannot be described at all (bad_input.rs checks the message).
    let other = scratch.members(8)[4..].to_vec();
    create("5", "64K", "16M", &other);
    let mut mixed = members[..3].to_vec();
    mixed.push(other[0].clone());
    assert!(!paraid_with_paths(&["detail"], &mixed).status.success());
}

/// `create` tells the stripe a filesystem should align to on RAID5/6 (text: the mkfs.xfs line; `--json`:
/// `stripe_bytes`), and nothing of the kind for a level without parity.
#[test]
fn create_tells_the_stripe_a_filesystem_should_align_to() {
    let scratch = Scratch::new("create-stripe");
    let members = scratch.members(6);
    let out = paraid_with_paths(
        &["create", "--level", "6", "--chunk", "4K", "--size", "32M"],
        &members,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("a stripe holds 16 KiB of data (4 chunks)")
            && text.contains("mkfs.xfs -d su=4k,sw=4 and mount -o swalloc"),
        "{text}"
    );
    let out = paraid_with_paths(
        &[
            "create", "--level", "5", "--chunk", "64K", "--size", "32M", "--force", "--json",
        ],
        &members,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let value: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("create --json prints JSON");
    assert_eq!(value["stripe_bytes"], 5 * 65536);
    let out = paraid_with_paths(
        &[
            "create", "--level", "10", "--chunk", "64K", "--size", "32M", "--force",
        ],
        &members[..4],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!String::from_utf8_lossy(&out.stdout).contains("stripe holds"));
}
