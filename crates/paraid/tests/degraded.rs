//! Drives failing under real clients: fio (--verify=crc32c) keeps passing while a member is failed mid-run and
//! while a rebuild onto a hot spare runs; after the rebuild nbdcopy reads back byte-identical data, and the member
//! files (read by docs/format.md alone) hold consistent parity on every stripe.

mod common;

#[path = "common/format.rs"]
mod format;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

fn fio_verify(uri: &str, name: &str, rw: &str, offset: &str, size: &str) -> Child {
    Command::new("fio")
        .args([
            &format!("--name={name}"),
            "--ioengine=nbd",
            &format!("--uri={uri}"),
            &format!("--rw={rw}"),
            "--bs=4k",
            &format!("--offset={offset}"),
            &format!("--size={size}"),
            "--iodepth=16",
            "--verify=crc32c",
            "--do_verify=1",
            "--verify_fatal=1",
            "--verify_state_save=0",
            "--output-format=json",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("fio")
}

fn assert_fio_ok(child: Child, what: &str) {
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "fio {what} failed: {text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_str(&text[text.find('{').unwrap()..]).unwrap();
    assert_eq!(
        report["jobs"][0]["error"].as_i64(),
        Some(0),
        "fio {what}: {text}"
    );
    assert!(
        report["jobs"][0]["read"]["io_bytes"].as_u64().unwrap() > 0,
        "fio {what} verified nothing"
    );
}

#[test]
fn fio_verify_survives_member_failure_and_rebuild_onto_a_spare() {
    let scratch = Scratch::new("degraded");
    let members = scratch.members(6);
    create("6", "64K", "40M", &members);
    let spare = scratch.path("spare.img");
    std::fs::File::create(&spare)
        .unwrap()
        .set_len(40 << 20)
        .unwrap();
    let served = Served::start(&scratch.path("s.sock"), &members, &[]);
    let control = PathBuf::from(format!("{}.ctl", served.socket.display()));
    let uri = served.uri();

    // 1. A member fails in the middle of a verified random-write run.
    let fio = fio_verify(&uri, "fail-mid-run", "randwrite", "0", "48M");
    std::thread::sleep(Duration::from_millis(300));
    let reply = ctl(&control, &["fail", "2"]);
    assert_eq!(reply["slot"].as_u64(), Some(2));
    assert_fio_ok(fio, "while member 2 failed");
    let array = status(&control);
    assert_eq!(
        array["members"][2]["state"].as_str(),
        Some("faulty"),
        "{array}"
    );
    let degraded = nbdcopy_out(&uri, &scratch.path("degraded.bin"));

    // 2. A spare is added while a second verified run goes on: the rebuild runs under it (throttled so it
    //    overlaps), then at full speed to the end.
    ctl(&control, &["speed", "--min", "1M", "--max", "6M"]);
    let reply = ctl(&control, &["remove", "2"]);
    assert_eq!(reply["slot"].as_u64(), Some(2));
    let fio = fio_verify(&uri, "during-rebuild", "randrw", "64M", "32M");
    let reply = ctl(&control, &["add", spare.to_str().unwrap()]);
    assert_eq!(reply["rebuilding_slot"].as_u64(), Some(2), "{reply}");
    let during = status(&control);
    assert_eq!(
        during["progress"]["kind"].as_str(),
        Some("rebuild"),
        "{during}"
    );
    assert_fio_ok(fio, "during the rebuild");
    let still = status(&control);
    assert!(
        !still["progress"].is_null(),
        "the throttled rebuild outlasted the fio run: {still}"
    );
    ctl(&control, &["speed", "--min", "1M", "--max", "0"]);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let array = status(&control);
        if array["progress"].is_null() {
            assert!(
                array["members"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .all(|m| m["state"].as_str() == Some("active")),
                "{array}"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "rebuild did not finish within 60 s: {array}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let watched = paraid(&["status", "--watch", "--control", control.to_str().unwrap()]);
    assert!(
        String::from_utf8_lossy(&watched.stdout).contains("rebuild"),
        "status --watch reports the finished rebuild"
    );

    // 3. After the rebuild, the array reads back what it held while degraded, apart from the range the second
    //    fio run rewrote (its own verify covered that).
    let rebuilt = nbdcopy_out(&uri, &scratch.path("rebuilt.bin"));
    assert_eq!(rebuilt.len(), degraded.len());
    let (lo, hi) = (64 << 20, 96 << 20);
    assert!(
        rebuilt[..lo] == degraded[..lo] && rebuilt[hi..] == degraded[hi..],
        "rebuilt array differs"
    );
    served.stop();

    // 4. The members on disk: the spare now holds slot 2, and every stripe's P and Q are right.
    let mut on_disk = members.clone();
    on_disk[2] = spare.clone();
    let read = format::read_array(&on_disk);
    let array = format::reassemble_and_check(&read);
    assert!(
        array == rebuilt,
        "member files disagree with what the array served"
    );

    // 5. The rebuilt member is really right: fail two others and read everything back by reconstruction.
    let served = Served::start(&scratch.path("s.sock"), &on_disk, &[]);
    let control = PathBuf::from(format!("{}.ctl", served.socket.display()));
    ctl(&control, &["fail", "0"]);
    ctl(&control, &["fail", "4"]);
    let reconstructed = nbdcopy_out(&served.uri(), &scratch.path("reconstructed.bin"));
    assert!(
        reconstructed == rebuilt,
        "reads reconstructed with the rebuilt member differ"
    );
    served.stop();
}

#[test]
fn management_commands_refuse_bad_requests_with_one_line() {
    let scratch = Scratch::new("mgmt");
    let members = scratch.members(4);
    create("5", "64K", "16M", &members);
    let served = Served::start(&scratch.path("s.sock"), &members, &[]);
    let control = format!("{}.ctl", served.socket.display());
    let cases: [(&[&str], &str); 5] = [
        (&["fail", "--control", &control, "9"], "slot 9"),
        (
            &["fail", "--control", &control, "/nonexistent/m.img"],
            "not a member",
        ),
        (
            &[
                "speed",
                "--control",
                &control,
                "--min",
                "10M",
                "--max",
                "1M",
            ],
            "above",
        ),
        (
            &["add", "--control", &control, "/nonexistent/new.img"],
            "nonexistent",
        ),
        (
            &[
                "speed",
                "--control",
                &control,
                "--min",
                "fast",
                "--max",
                "1M",
            ],
            "fast",
        ),
    ];
    for (args, needle) in cases {
        let out = paraid(args);
        assert!(!out.status.success(), "{args:?} should fail");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(stderr.trim().lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
    // RAID5 tolerates one failure: failing a second member is refused, and the array keeps serving.
    let out = paraid(&["fail", "--control", &control, "1"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("marked faulty"));
    // Failing it again changes nothing and says so.
    let out = paraid(&["fail", "--control", &control, "1"]);
    assert!(out.status.success());
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("was faulty already; nothing changed"),
        "{said}"
    );
    assert_eq!(
        ctl(Path::new(&control), &["fail", "1"])["state_before"],
        "faulty"
    );
    let out = paraid(&["fail", "--control", &control, "3"]);
    assert!(
        !out.status.success(),
        "failing a second RAID5 member must be refused"
    );
    client("nbdinfo", &[&served.uri()]);
    served.stop();
}
