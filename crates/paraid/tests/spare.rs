//! A hot spare given to `paraid serve --spare` takes over a failed slot by itself, and the rebuilt array holds
//! the data and consistent parity.

mod common;

#[path = "common/format.rs"]
mod format;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;

/// Waits (30 s at most) until no job runs and every slot is active; returns the array's status.
fn wait_whole(control: &Path, what: &str) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let array = status(control);
        let all_active = array["members"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m["state"].as_str() == Some("active"));
        if array["progress"].is_null() && all_active {
            return array;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: the array was not whole within 30 s: {array}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_spare_given_at_start_takes_over_a_failed_slot() {
    let scratch = Scratch::new("spare");
    let members = scratch.members(4);
    create("5", "16K", "12M", &members);
    let spare = scratch.path("spare.img");
    std::fs::File::create(&spare)
        .unwrap()
        .set_len(12 << 20)
        .unwrap();
    let data = random_bytes(0x59a7e, 16 << 20);
    let input = scratch.path("in.bin");
    std::fs::write(&input, &data).unwrap();
    let served = Served::start(
        &scratch.path("s.sock"),
        &members,
        &["--spare", spare.to_str().unwrap()],
    );
    let control = PathBuf::from(format!("{}.ctl", served.socket.display()));
    client("nbdcopy", &[input.to_str().unwrap(), &served.uri()]);
    let array = status(&control);
    assert_eq!(
        array["spares"].as_array().map(|s| s.len()),
        Some(1),
        "{array}"
    );
    ctl(&control, &["fail", "1"]);
    let array = wait_whole(&control, "the spare's takeover");
    assert_eq!(
        array["spares"].as_array().map(|s| s.len()),
        Some(0),
        "the spare was used: {array}"
    );
    assert!(
        array["members"][1]["path"]
            .as_str()
            .unwrap()
            .ends_with("spare.img"),
        "{array}"
    );
    let back = nbdcopy_out(&served.uri(), &scratch.path("out.bin"));
    assert!(
        back[..data.len()] == data[..],
        "data after the automatic rebuild"
    );
    served.stop();
    let mut on_disk = members.clone();
    on_disk[1] = spare;
    format::reassemble_and_check(&format::read_array(&on_disk));
}

/// Members and spares named by relative paths from a directory other than the server's: `remove` detaches a hot
/// spare by its path, `fail` finds a member by a relative path.
#[test]
fn members_and_spares_are_named_by_paths_relative_to_the_caller() {
    let scratch = Scratch::new("spare-paths");
    let members = scratch.members(4);
    create("5", "16K", "12M", &members);
    // The server runs in /, given absolute paths; the commands below run in the scratch directory.
    let served = Served::start(&scratch.path("s.sock"), &members, &[]);
    let control = format!("{}.ctl", served.socket.display());
    let spare = scratch.path("spare.img");
    std::fs::File::create(&spare)
        .unwrap()
        .set_len(12 << 20)
        .unwrap();
    let here = |args: &[&str]| {
        std::process::Command::new(paraid_bin())
            .args(args)
            .current_dir(&scratch.dir)
            .output()
            .expect("running paraid")
    };
    let out = here(&["add", "--control", &control, "spare.img"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        status(Path::new(&control))["spares"]
            .as_array()
            .map(|s| s.len()),
        Some(1)
    );
    let out = here(&["remove", "--control", &control, "spare.img"]);
    assert!(
        out.status.success(),
        "remove a spare by path: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        status(Path::new(&control))["spares"]
            .as_array()
            .map(|s| s.len()),
        Some(0)
    );
    let out = here(&["fail", "--control", &control, "m2.img"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(status(Path::new(&control))["members"][2]["state"], "faulty");
    served.stop();
}

/// `paraid replace` copies a working member onto a new one while the array serves: status shows the replacement
/// beside the member until it takes over, then the new member in the slot; the data reads back unchanged.
#[test]
fn replace_builds_a_new_member_live_and_status_shows_it() {
    let scratch = Scratch::new("replace");
    let members = scratch.members(4);
    create("5", "64K", "16M", &members);
    let data = random_bytes(0x7e91ace, 24 << 20);
    let input = scratch.path("in.bin");
    std::fs::write(&input, &data).unwrap();
    let served = Served::start(&scratch.path("s.sock"), &members, &[]);
    let control = PathBuf::from(format!("{}.ctl", served.socket.display()));
    client("nbdcopy", &[input.to_str().unwrap(), &served.uri()]);
    let new = scratch.path("new1.img");
    std::fs::File::create(&new)
        .unwrap()
        .set_len(16 << 20)
        .unwrap();
    ctl(&control, &["speed", "--min", "1M", "--max", "1M"]);
    ctl(
        &control,
        &[
            "replace",
            members[1].to_str().unwrap(),
            new.to_str().unwrap(),
        ],
    );
    let array = status(&control);
    assert_eq!(array["members"][1]["state"], "active", "{array}");
    assert!(
        array["members"][1]["replacement"]
            .as_str()
            .is_some_and(|r| r.ends_with("new1.img")),
        "the replacement is shown beside the member: {array}"
    );
    ctl(&control, &["speed", "--min", "0", "--max", "0"]);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let array = status(&control);
        let path = array["members"][1]["path"]
            .as_str()
            .unwrap_or("")
            .to_string();
        if path.ends_with("new1.img") && array["progress"].is_null() {
            assert!(array["members"][1]["replacement"].is_null(), "{array}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the replacement did not take over in 30 s: {array}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let back = nbdcopy_out(&served.uri(), &scratch.path("out.bin"));
    assert!(back[..data.len()] == data[..], "data after the replacement");
    served.stop();
    let mut on_disk = members.clone();
    on_disk[1] = new;
    format::reassemble_and_check(&format::read_array(&on_disk));
}

/// A member failed and removed, then added back (`paraid add` of the same file): it is re-added to its slot and
/// rebuilt only where the array was written while it was out; the data reads back, and a reader written from
/// docs/format.md finds the member files consistent (parity over what the re-added member kept).
#[test]
fn a_member_added_back_is_re_added_and_rebuilt_only_where_written() {
    let scratch = Scratch::new("readd");
    let members = scratch.members(4);
    create("5", "16K", "12M", &members);
    let mut data = random_bytes(0x2ead, 16 << 20);
    let input = scratch.path("in.bin");
    std::fs::write(&input, &data).unwrap();
    let served = Served::start(&scratch.path("s.sock"), &members, &[]);
    let control = PathBuf::from(format!("{}.ctl", served.socket.display()));
    client("nbdcopy", &[input.to_str().unwrap(), &served.uri()]);
    // The bitmap's bits clear once the regions have been idle for 5 s with every member in sync.
    let deadline = Instant::now() + Duration::from_secs(30);
    while status(&control)["integrity"]["dirty_regions"].as_u64() != Some(0) {
        assert!(Instant::now() < deadline, "the bitmap never cleared");
        std::thread::sleep(Duration::from_millis(250));
    }
    let m1 = members[1].to_str().unwrap();
    ctl(&control, &["fail", m1]);
    ctl(&control, &["remove", m1]);
    // Written while m1 is out: one 64 KiB range, a region or two of the bitmap.
    client(
        "qemu-io",
        &[
            "-f",
            "raw",
            &served.uri(),
            "-c",
            "write -P 0x5a 1048576 65536",
        ],
    );
    data[1 << 20..(1 << 20) + 65536].fill(0x5a);
    let reply = ctl(&control, &["add", m1]);
    assert_eq!(reply["re_added"], true, "{reply}");
    assert_eq!(reply["rebuilding_slot"], 1, "{reply}");
    let array = wait_whole(&control, "the re-add");
    let in_sync = array["last_result"]["in_sync_bytes"].as_u64().unwrap();
    let member_bytes = array["last_result"]["total_bytes"].as_u64().unwrap();
    assert!(
        in_sync > member_bytes / 2 && in_sync < member_bytes,
        "{in_sync} of {member_bytes} bytes found in sync: {array}"
    );
    let back = nbdcopy_out(&served.uri(), &scratch.path("out.bin"));
    assert!(back[..data.len()] == data[..], "data after the re-add");
    served.stop();
    format::reassemble_and_check(&format::read_array(&members));
}
