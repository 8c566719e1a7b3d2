//! The `nbd_load` example against the `memserve` example, both as separate processes: a sequential write run
//! whose data reads back intact, and a random read run.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;

const LIMIT: Duration = Duration::from_secs(60);

/// Runs nbd_load with `args` against `socket`, requiring success, and parses its JSON report.
fn nbd_load(socket: &Path, args: &[&str]) -> serde_json::Value {
    let stdout = run_ok(
        Command::new(example("nbd_load"))
            .arg("--socket")
            .arg(socket)
            .args(args)
            .arg("--json"),
        LIMIT,
    );
    eprintln!("nbd_load {args:?}: {}", stdout.trim());
    serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("nbd_load printed no JSON object ({e}): {stdout}"))
}

fn number(report: &serde_json::Value, key: &str) -> f64 {
    report[key]
        .as_f64()
        .unwrap_or_else(|| panic!("no number {key:?} in {report}"))
}

#[test]
fn sequential_write_reads_back_and_random_read_runs() {
    let server = MemServe::start("64M");

    let write = nbd_load(
        &server.socket,
        &[
            "--pattern",
            "write",
            "--bs",
            "256K",
            "--seconds",
            "1",
            "--verify",
        ],
    );
    assert_eq!(write["pattern"], "write");
    assert_eq!(number(&write, "bs_bytes"), (256 << 10) as f64);
    assert_eq!(number(&write, "mismatches"), 0.0, "{write}");
    assert!(number(&write, "bytes") > 0.0, "{write}");
    assert!(number(&write, "verified_bytes") > 0.0, "{write}");
    assert_eq!(number(&write, "verified_bytes") % (256 << 10) as f64, 0.0);

    let read = nbd_load(
        &server.socket,
        &[
            "--pattern",
            "randread",
            "--bs",
            "4K",
            "--seconds",
            "1",
            "--connections",
            "2",
            "--depth",
            "8",
        ],
    );
    assert_eq!(read["pattern"], "randread");
    assert!(number(&read, "iops") > 0.0, "{read}");
    assert!(number(&read, "bytes") > 0.0, "{read}");
    assert!(number(&read, "lat_p99_us") >= number(&read, "lat_p50_us"));
}

#[test]
fn several_connections_split_a_small_region_and_verify() {
    let server = MemServe::start("16M");
    // 4 MiB over 3 connections of 64 KiB blocks: shares of 21 blocks, wrapped many times in a second.
    let report = nbd_load(
        &server.socket,
        &[
            "--connections",
            "3",
            "--depth",
            "4",
            "--bs",
            "64K",
            "--size",
            "4M",
            "--seconds",
            "1",
            "--verify",
        ],
    );
    assert_eq!(number(&report, "mismatches"), 0.0, "{report}");
    assert_eq!(
        number(&report, "verified_bytes"),
        (3 * 21 * (64 << 10)) as f64,
        "{report}"
    );
}

#[test]
fn an_error_reply_is_a_hard_error() {
    let server = MemServe::start("64M");
    // Past the server's largest request: an NBD error reply, which must end the run with status 1.
    let output = run(
        Command::new(example("nbd_load"))
            .arg("--socket")
            .arg(&server.socket)
            .args(["--pattern", "read", "--bs", "64M", "--seconds", "1"]),
        LIMIT,
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("nbd_load: error:"), "{stderr}");
}

#[test]
fn passes_end_a_sequential_run_after_each_share_is_written_that_many_times() {
    let server = MemServe::start("16M");
    // 4 MiB over 2 connections of 64 KiB blocks: 32 blocks each; two passes write 128 blocks, then stop long
    // before the minute is up, and the last pass reads back intact.
    let started = Instant::now();
    let report = nbd_load(
        &server.socket,
        &[
            "--connections",
            "2",
            "--bs",
            "64K",
            "--size",
            "4M",
            "--passes",
            "2",
            "--seconds",
            "60",
            "--verify",
        ],
    );
    assert!(started.elapsed() < Duration::from_secs(30), "{report}");
    assert_eq!(number(&report, "bytes"), (8 << 20) as f64, "{report}");
    assert_eq!(
        number(&report, "verified_bytes"),
        (4 << 20) as f64,
        "{report}"
    );
    assert_eq!(number(&report, "mismatches"), 0.0, "{report}");
    // Random patterns have no passes: refused as a bad argument (exit status 2).
    let output = run(
        Command::new(example("nbd_load"))
            .arg("--socket")
            .arg(&server.socket)
            .args(["--pattern", "randwrite", "--passes", "1"]),
        LIMIT,
    );
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("--passes"));
}
