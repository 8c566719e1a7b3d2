//! `paraid monitor` against a running array: a member failed, a spare rebuilt into its slot, a check that finds
//! corruption, the server stopped: each reported once, in order, on stdout (`--json`) and to the program.

mod common;

#[path = "common/format.rs"]
mod format;

use std::io::{Seek, SeekFrom, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// Waits (60 s at most) for `done`; on a timeout says what the program had been given by then (`log`).
fn wait_until(what: &str, log: &Path, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(
            Instant::now() < deadline,
            "{what}: not within 60 s; the program was given: {:?}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `paraid monitor --json --delay-s 1` with `args`, its stdout piped.
fn spawn_monitor(args: &[&str]) -> std::process::Child {
    Command::new(paraid_bin())
        .args(["monitor", "--json", "--delay-s", "1"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawning paraid monitor")
}

/// Events that depend on the machine's timing, not on what a test does: a member on tmpfs is found slow when the
/// machine is loaded enough that its I/Os take far longer than the others' (CI's two cores, a build beside it),
/// and recovered once the load passes (a run of CI saw "SlowMemberRecovered" after a left-out "SlowMember").
fn timing_dependent(event: &str) -> bool {
    matches!(event, "SlowMember" | "SlowMemberRecovered")
}

/// The event names of `events.txt` lines (`EVENT CONTROL [MEMBER]`, what the program was given), without the
/// timing-dependent ones.
fn program_events(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| l.split(' ').next().unwrap_or("").to_string())
        .filter(|e| !timing_dependent(e))
        .collect()
}

#[test]
fn monitor_reports_a_failure_a_rebuild_a_check_and_the_server_going() {
    let scratch = Scratch::new("monitor");
    let members = scratch.members(4);
    create("5", "16K", "8M", &members);
    let (data_offset, chunk, array_bytes) = {
        let m = &format::read_array(&members)[0];
        (m.data_offset_bytes, m.chunk_bytes, m.array_bytes as usize)
    };
    let served = Served::start(&scratch.path("s.sock"), &members, &[]);
    let control = scratch.path("s.sock.ctl");
    let input = scratch.path("in.bin");
    std::fs::write(&input, random_bytes(0x6d6f, array_bytes)).unwrap();
    client("nbdcopy", &[input.to_str().unwrap(), &served.uri()]);

    let log = scratch.path("events.txt");
    let program = scratch.path("alert.sh");
    std::fs::write(
        &program,
        format!(
            "#!/bin/sh\necho \"$@\" \"slot=$PARAID_SLOT\" >> {}\n",
            log.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(
        &program,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let monitor = spawn_monitor(&[
        "--test",
        "--control",
        control.to_str().unwrap(),
        "--program",
        program.to_str().unwrap(),
    ]);
    wait_until("the test message", &log, || {
        program_events(&log) == ["TestMessage"]
    });

    // Jobs slow enough for the monitor's looks (a second apart) to see them run: 4 MiB to rebuild at 1 MiB/s, a check at 4 MiB/s.
    ctl(&control, &["speed", "--min", "1M", "--max", "1M"]);
    ctl(&control, &["fail", members[1].to_str().unwrap()]);
    wait_until("the failure reported", &log, || {
        program_events(&log).len() >= 3
    });
    let spare = scratch.path("spare.img");
    std::fs::File::create(&spare)
        .unwrap()
        .set_len(8 << 20)
        .unwrap();
    ctl(&control, &["add", spare.to_str().unwrap()]);
    wait_until("the rebuild's end reported", &log, || {
        program_events(&log).contains(&"RebuildFinished".to_string())
    });

    // Silent corruption under the running array (the page cache is shared: the server reads what was
    // written here), then a check.
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .open(&members[2])
        .unwrap();
    file.seek(SeekFrom::Start(data_offset + 3 * chunk + 64))
        .unwrap();
    file.write_all(&[0xde, 0xad, 0xbe, 0xef]).unwrap();
    file.sync_all().unwrap();
    drop(file);
    ctl(&control, &["speed", "--min", "1M", "--max", "4M"]);
    let out = paraid(&["check", "--control", control.to_str().unwrap(), "--wait"]);
    assert!(out.status.success());
    wait_until("the check's end reported", &log, || {
        program_events(&log).contains(&"CheckMismatches".to_string())
    });
    served.stop();

    let output = monitor.wait_with_output().expect("monitor");
    assert!(output.status.success(), "monitor exit: {}", output.status);
    let events: Vec<serde_json::Value> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap_or_else(|e| panic!("{e}: {l}"))
        })
        .filter(|e| !timing_dependent(e["event"].as_str().unwrap_or("")))
        .collect();
    let names: Vec<&str> = events
        .iter()
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    // The marks a rebuild passes depend on the polls' timing; the rest is exact.
    let fixed: Vec<&str> = names
        .iter()
        .copied()
        .filter(|n| !n.starts_with("Rebuild") || *n == "RebuildFinished" || *n == "RebuildStarted")
        .collect();
    assert_eq!(
        fixed,
        [
            "TestMessage",
            "Fail",
            "DegradedArray",
            "RebuildStarted",
            "SpareActive",
            "RebuildFinished",
            "RebuildStarted",
            "RebuildFinished",
            "CheckMismatches",
            "DeviceDisappeared"
        ],
        "{names:?}"
    );
    let fail = &events[names.iter().position(|n| *n == "Fail").unwrap()];
    assert_eq!(fail["slot"].as_u64(), Some(1), "{fail}");
    assert!(
        fail["member"].as_str().unwrap().ends_with("m1.img"),
        "{fail}"
    );
    let mismatches = &events[names.iter().position(|n| *n == "CheckMismatches").unwrap()];
    assert_eq!(
        mismatches["detail"].as_str(),
        Some("check completed: 1 mismatched stripes, 0 repaired"),
        "{mismatches}"
    );
    // The program saw the same events, the member as its third argument.
    assert_eq!(program_events(&log), names);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.lines()
            .any(|l| l.starts_with("Fail ") && l.contains("m1.img") && l.ends_with("slot=1")),
        "{text}"
    );
}

#[test]
fn monitor_oneshot_reports_a_degraded_array_and_exits() {
    let scratch = Scratch::new("monitor-oneshot");
    let members = scratch.members(4);
    create("6", "16K", "8M", &members);
    let served = Served::start(&scratch.path("s.sock"), &members[..3], &[]);
    let control = scratch.path("s.sock.ctl");
    let out = paraid(&[
        "monitor",
        "--oneshot",
        "--control",
        control.to_str().unwrap(),
    ]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        text.trim(),
        "paraid monitor: DegradedArray on array 'paraid': 3 of 4 members active",
        "{text}"
    );
    served.stop();
    let out = paraid(&[
        "monitor",
        "--oneshot",
        "--control",
        control.to_str().unwrap(),
    ]);
    assert!(!out.status.success(), "no server: an error");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cannot reach the array's control socket"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Two arrays watched by one monitor: each event names its array's control socket, one server going leaves the
/// other watched, and the monitor ends with the last.
#[test]
fn monitor_watches_several_arrays_until_the_last_is_gone() {
    let scratch = Scratch::new("monitor-two");
    let all = scratch.members(4);
    let (a_members, b_members) = all.split_at(2);
    create("1", "16K", "8M", a_members);
    create("1", "16K", "8M", b_members);
    let a = Served::start(&scratch.path("a.sock"), a_members, &[]);
    let b = Served::start(&scratch.path("b.sock"), b_members, &[]);
    let (a_control, b_control) = (scratch.path("a.sock.ctl"), scratch.path("b.sock.ctl"));
    let monitor = spawn_monitor(&[
        "--control",
        a_control.to_str().unwrap(),
        "--control",
        b_control.to_str().unwrap(),
    ]);
    std::thread::sleep(Duration::from_millis(1500));
    a.stop();
    std::thread::sleep(Duration::from_millis(1500));
    ctl(&b_control, &["fail", b_members[1].to_str().unwrap()]);
    std::thread::sleep(Duration::from_millis(1500));
    b.stop();
    let output = monitor.wait_with_output().expect("monitor");
    assert!(output.status.success(), "monitor exit: {}", output.status);
    let events: Vec<(String, String)> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|l| {
            let e: serde_json::Value =
                serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"));
            let control = e["control"].as_str().unwrap().to_string();
            let which = if control == a_control.to_str().unwrap() {
                "a"
            } else {
                "b"
            };
            (which.to_string(), e["event"].as_str().unwrap().to_string())
        })
        .collect();
    let expected: Vec<(String, String)> = [
        ("a", "DeviceDisappeared"),
        ("b", "Fail"),
        ("b", "DegradedArray"),
        ("b", "DeviceDisappeared"),
    ]
    .iter()
    .map(|(w, e)| (w.to_string(), e.to_string()))
    .collect();
    assert_eq!(events, expected);
}
