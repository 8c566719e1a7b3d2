//! The control socket of a running array: `paraid status`, and clear refusals of bad requests.

mod common;

use std::io::{BufRead, BufReader, Write};

use common::*;

#[test]
fn status_reports_the_running_array() {
    let scratch = Scratch::new("status");
    let members = scratch.members(5);
    create("6", "32K", "16M", &members);
    let served = Served::start(&scratch.path("s.sock"), &members, &[]);
    let control = format!("{}.ctl", served.socket.display());
    let out = paraid(&["status", "--control", &control, "--json"]);
    assert!(
        out.status.success(),
        "status: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let reply: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let array = &reply["array"];
    assert_eq!(array["level"].as_str(), Some("raid6"), "{reply}");
    assert_eq!(array["chunk_bytes"].as_u64(), Some(32 << 10));
    assert_eq!(
        array["state"].as_str(),
        Some("dirty"),
        "a served array is dirty until stopped: {reply}"
    );
    let slots = array["members"].as_array().unwrap();
    assert_eq!(slots.len(), 5);
    assert!(
        slots.iter().all(|m| m["state"].as_str() == Some("active")),
        "{reply}"
    );

    // How it is served: the NBD socket a client connects to.
    let frontend = &reply["frontend"];
    assert_eq!(frontend["kind"].as_str(), Some("nbd"), "{reply}");
    let uri = format!("nbd+unix:///?socket={}", served.socket.display());
    assert_eq!(frontend["uri"].as_str(), Some(uri.as_str()), "{reply}");

    let text = paraid(&["status", "--control", &control]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("raid6"));
    assert!(text.contains(&format!("served: NBD {uri}")), "{text}");

    // Raw requests: bad JSON and unknown operations get {"ok": false, "error": ...}, and the socket keeps answering.
    let stream = std::os::unix::net::UnixStream::connect(&control).unwrap();
    let mut writer = stream.try_clone().unwrap();
    let mut reader = BufReader::new(stream);
    for (request, needle) in [
        ("not json", "not JSON"),
        ("{\"op\":\"explode\"}", "explode"),
        ("{}", "op"),
    ] {
        writer.write_all(format!("{request}\n").as_bytes()).unwrap();
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        let reply: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(reply["ok"].as_bool(), Some(false), "{line}");
        assert!(reply["error"].as_str().unwrap().contains(needle), "{line}");
    }
    served.stop();
    assert!(
        !std::path::Path::new(&control).exists(),
        "the control socket is removed at stop"
    );
    let out = paraid(&["status", "--control", &control]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("is `paraid serve` running?"));
}

#[test]
fn printing_into_a_closed_pipe_ends_quietly() {
    let scratch = Scratch::new("pipe");
    let members = scratch.members(4);
    create("5", "64K", "16M", &members);
    // `examine --json | head -c 1`: the reader leaves after one byte; paraid must not panic.
    let script = format!(
        "{} examine {} | head -c 1 >/dev/null; echo ${{PIPESTATUS[0]}}",
        paraid_bin().display(),
        members[0].display()
    );
    let out = std::process::Command::new("bash")
        .arg("-c")
        .arg(&script)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("panicked"),
        "paraid panicked on a closed pipe: {stderr}"
    );
}

/// `--stripe-cache-mib` sizes the stripe cache, `status --json` shows it and what it served: rewrites of one
/// block by a real client (qemu-io) read nothing from the members after the first; 0 turns it off; the default
/// is none for members in memory; a size that is not a number is refused.
#[test]
fn the_stripe_cache_is_sized_from_the_command_line_and_reported() {
    let scratch = Scratch::new("stripe-cache");
    let members = scratch.members(5);
    create("6", "32K", "16M", &members);
    let rewrite = |served: &Served| {
        let uri = served.uri();
        let mut args = vec!["-f", "raw", uri.as_str()];
        for command in [
            "write -P 1 8192 4096",
            "write -P 2 8192 4096",
            "write -P 3 8192 4096",
            "flush",
        ] {
            args.extend(["-c", command]);
        }
        client("qemu-io", &args);
        let control = std::path::PathBuf::from(format!("{}.ctl", served.socket.display()));
        status(&control)["stripe_cache"].clone()
    };
    // Serves the array with `flags`, rewrites a block, stops it; the cache's figures.
    let serve_and_rewrite = |flags: &[&str]| {
        let served = Served::start(&scratch.path("s.sock"), &members, flags);
        let cache = rewrite(&served);
        served.stop();
        cache
    };
    let cache = serve_and_rewrite(&["--stripe-cache-mib", "3"]);
    assert_eq!(cache["budget_bytes"].as_u64(), Some(3 << 20), "{cache}");
    assert!(
        cache["hits"].as_u64().unwrap() >= 4,
        "two rewrites, each served: {cache}"
    );
    assert!(cache["held_bytes"].as_u64().unwrap() > 0, "{cache}");

    let cache = serve_and_rewrite(&["--stripe-cache-mib", "0"]);
    assert_eq!(cache["budget_bytes"].as_u64(), Some(0), "{cache}");
    assert_eq!(cache["hits"].as_u64(), Some(0), "{cache}");

    // Without the flag (and without PARAID_STRIPE_CACHE_MIB): 64 MiB, but none where every member lives in
    // memory, as the scratch members do on tmpfs (a read there costs what the cache's copy costs).
    if std::env::var_os("PARAID_STRIPE_CACHE_MIB").is_none() {
        let in_memory = std::process::Command::new("stat")
            .args(["-f", "-c", "%T"])
            .arg(&members[0])
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "tmpfs");
        let cache = serve_and_rewrite(&[]);
        let expected = if in_memory { 0 } else { 64 << 20 };
        assert_eq!(cache["budget_bytes"].as_u64(), Some(expected), "{cache}");
    }

    let out = paraid_with_paths(&["serve", "--stripe-cache-mib", "lots"], &members);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--stripe-cache-mib"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `status` counts what the array served, per kind of request: a real client's (qemu-io) writes, reads and
/// flushes appear with their bytes and latency percentiles (`--json`), and as one line each in the text form.
#[test]
fn status_reports_the_io_served_with_latency() {
    let scratch = Scratch::new("io-metrics");
    let members = scratch.members(4);
    create("5", "32K", "16M", &members);
    let served = Served::start(&scratch.path("s.sock"), &members, &[]);
    let uri = served.uri();
    let mut args = vec!["-f", "raw", uri.as_str()];
    // 3 writes of 64 KiB, 2 reads of 4 KiB, 1 flush (qemu-io sends one request for each).
    for command in [
        "write -P 1 0 64k",
        "write -P 2 1M 64k",
        "write -P 3 2M 64k",
        "read -P 1 0 4k",
        "read -P 2 1M 4k",
        "flush",
    ] {
        args.extend(["-c", command]);
    }
    client("qemu-io", &args);
    let control = std::path::PathBuf::from(format!("{}.ctl", served.socket.display()));
    let io = ctl(&control, &["status"])["io"].clone();
    let write = &io["write"];
    assert_eq!(write["requests"].as_u64(), Some(3), "{io}");
    assert_eq!(write["bytes"].as_u64(), Some(3 * 65536), "{io}");
    assert_eq!(write["errors"].as_u64(), Some(0), "{io}");
    let latency = &write["latency_us"];
    let (p50, p99, max) = (
        latency["p50"].as_u64().unwrap(),
        latency["p99"].as_u64().unwrap(),
        latency["max"].as_u64().unwrap(),
    );
    assert!(p50 <= p99 && p99 <= max, "{latency}");
    assert!(latency["mean"].as_f64().unwrap() > 0.0, "{latency}");
    let counted: u64 = latency["buckets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b[1].as_u64().unwrap())
        .sum();
    assert_eq!(counted, 3, "{latency}");
    // qemu-io may read more than asked (probing); at least the two reads are there.
    assert!(io["read"]["requests"].as_u64().unwrap() >= 2, "{io}");
    assert!(io["flush"]["requests"].as_u64().unwrap() >= 1, "{io}");
    assert_eq!(io["trim"]["requests"].as_u64(), Some(0), "{io}");

    let out = paraid(&["status", "--control", control.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.lines()
            .any(|l| l.starts_with("io write: 3 requests, 192 KiB") && l.contains("p99")),
        "{text}"
    );
    assert!(
        !text.contains("io trim"),
        "kinds never served are left out: {text}"
    );
    served.stop();
}

/// `--consistency-policy` chooses between the partial parity log, the log as a journal of small writes' data (the
/// default), and the bitmap alone, and `status` says which is in force (RAID0 has none) and what the log
/// wrote; a policy paraid does not know is refused, and so is the journal with `--write-back`.
#[test]
fn the_consistency_policy_is_chosen_at_serve_and_reported() {
    let scratch = Scratch::new("policy");
    let members = scratch.members(4);
    create("6", "32K", "16M", &members);
    let policy_with = |flags: &[&str]| {
        let served = Served::start(&scratch.path("s.sock"), &members, flags);
        client(
            "qemu-io",
            &[
                "-f",
                "raw",
                served.uri().as_str(),
                "-c",
                "write -P 7 4096 8192",
            ],
        );
        let control = std::path::PathBuf::from(format!("{}.ctl", served.socket.display()));
        let array = status(&control);
        served.stop();
        (
            array["consistency_policy"].clone(),
            array["integrity"].clone(),
        )
    };
    // The default is the journal gated on spare CPU; with write-back (which answers a write once held in
    // memory, before the journal could) it is the log alone.
    if ["PARAID_PPL", "PARAID_JOURNAL", "PARAID_JOURNAL_LONE"]
        .iter()
        .all(|v| std::env::var_os(v).is_none())
    {
        let (policy, integrity) = policy_with(&[]);
        assert_eq!(policy, "journal");
        assert_eq!(integrity["journal_answers"], "spare-cpu", "{integrity}");
        // The CPU quota the gate reads beside the machine's idle share (0: none; a CI container may have one).
        assert!(
            integrity["spare_cpu_quota_millicpus"].is_u64(),
            "{integrity}"
        );
        assert_eq!(policy_with(&["--write-back"]).0, "ppl");
    }
    // The partial-stripe write is logged (one entry, PP and QP on the P and the Q member) only with the log.
    let (policy, integrity) = policy_with(&["--consistency-policy", "bitmap"]);
    assert_eq!(policy, "bitmap");
    assert_eq!(integrity["log_enabled"], false, "{integrity}");
    assert_eq!(integrity["log_entries"], 0, "{integrity}");
    let (policy, integrity) = policy_with(&["--consistency-policy", "ppl"]);
    assert_eq!(policy, "ppl");
    assert_eq!(integrity["log_enabled"], true, "{integrity}");
    assert_eq!(integrity["log_entries"], 1, "{integrity}");
    assert_eq!(integrity["log_record_writes"], 2, "{integrity}");
    assert_eq!(integrity["log_payload_bytes"], 2 * 8192, "{integrity}");
    assert_eq!(integrity["journal"], false, "{integrity}");
    // The journal adds a data entry (the write's 8 KiB) on the P and Q members' rings and on the data member's.
    let (policy, integrity) = policy_with(&["--consistency-policy", "journal"]);
    assert_eq!(policy, "journal");
    assert_eq!(integrity["journal"], true, "{integrity}");
    // Early answers as the machine's idle CPU allows, unless PARAID_JOURNAL_LONE pins a rule. A write not answered
    // early (the gate found the CPU busy, or qemu-io's writethrough sent it with FUA) takes the log's way: its
    // partial parity alone, as with ppl.
    if std::env::var_os("PARAID_JOURNAL_LONE").is_none() {
        assert_eq!(integrity["journal_answers"], "spare-cpu", "{integrity}");
    }
    let logs_way = integrity["log_parity_alone"] == 1;
    let records = if logs_way { 2 } else { 3 };
    assert_eq!(integrity["log_entries"], records - 1, "{integrity}");
    assert_eq!(integrity["log_record_writes"], records, "{integrity}");
    assert_eq!(
        integrity["log_payload_bytes"],
        records * 8192,
        "{integrity}"
    );

    let raid0 = scratch.members(2);
    let raid0: Vec<_> = raid0.iter().map(|m| m.with_extension("r0")).collect();
    create("0", "32K", "16M", &raid0);
    let served = Served::start(&scratch.path("r0.sock"), &raid0, &[]);
    let control = std::path::PathBuf::from(format!("{}.ctl", served.socket.display()));
    let array = status(&control);
    assert_eq!(array["consistency_policy"], "none");
    // The parity backend in one line: its name first (a GPU backend adds where its batches went).
    let (backend, detail) = (
        array["parity_backend"].as_str(),
        array["parity_detail"].as_str(),
    );
    assert!(
        backend.zip(detail).is_some_and(|(b, d)| d.starts_with(b)),
        "{array}"
    );
    // Batch counts from a GPU backend only (a CPU backend keeps none).
    let batches = &array["parity_batches"];
    assert!(
        batches.is_null()
            || ["gpu_staged", "gpu_in_place", "cpu"]
                .iter()
                .all(|k| batches[k].is_u64()),
        "{array}"
    );
    served.stop();

    let out = paraid_with_paths(&["serve", "--consistency-policy", "resync"], &members);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--consistency-policy"), "{stderr}");
    let out = paraid_with_paths(
        &["serve", "--consistency-policy", "journal", "--write-back"],
        &members,
    );
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--write-back") && stderr.contains("journal"),
        "{stderr}"
    );
}

/// `paraid metrics` prints the Prometheus text format: every line a comment or `name{labels} value`, each
/// family declared before its samples, the I/O counters equal to what `status --json` reports, and each latency
/// histogram cumulative, ending in +Inf at its count.
#[test]
fn metrics_are_printed_in_the_prometheus_text_format() {
    let scratch = Scratch::new("prometheus");
    let members = scratch.members(4);
    create("6", "32K", "16M", &members);
    let served = Served::start(&scratch.path("s.sock"), &members, &[]);
    let uri = served.uri();
    let mut args = vec!["-f", "raw", uri.as_str()];
    for command in ["write -P 1 0 64k", "write -P 2 1M 4k", "read 0 4k", "flush"] {
        args.extend(["-c", command]);
    }
    client("qemu-io", &args);
    let control = std::path::PathBuf::from(format!("{}.ctl", served.socket.display()));
    let out = paraid(&["metrics", "--control", control.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let io = ctl(&control, &["status"])["io"].clone();
    served.stop();

    let mut declared: Vec<String> = Vec::new();
    let mut samples: Vec<(String, String, f64)> = Vec::new(); // name, labels, value
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let name = rest.split(' ').next().unwrap();
            declared.push(name.to_string());
            continue;
        }
        if line.starts_with("# HELP ") {
            continue;
        }
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("bad line: {line}"));
        let (name, labels) = series
            .split_once('{')
            .unwrap_or_else(|| panic!("no labels: {line}"));
        assert!(labels.ends_with('}'), "{line}");
        assert!(
            name.chars().all(|c| c.is_ascii_lowercase() || c == '_'),
            "metric name: {line}"
        );
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| {
                name.strip_suffix(s)
                    .filter(|f| declared.iter().any(|d| d == f))
            })
            .unwrap_or(name);
        assert!(
            declared.iter().any(|d| d == family),
            "{name} sampled before its # TYPE"
        );
        let value: f64 = value.parse().unwrap_or_else(|_| panic!("value: {line}"));
        samples.push((name.to_string(), labels.to_string(), value));
    }
    let value = |name: &str, label_part: &str| -> f64 {
        samples
            .iter()
            .find(|(n, l, _)| n == name && l.contains(label_part))
            .unwrap_or_else(|| panic!("no {name} with {label_part}:\n{text}"))
            .2
    };
    assert_eq!(value("paraid_array_members", "state=\"active\""), 4.0);
    assert_eq!(value("paraid_array_failed", "array="), 0.0);
    assert_eq!(value("paraid_array_read_only", "array="), 0.0);
    for kind in ["write", "read", "flush"] {
        let label = format!("kind=\"{kind}\"");
        let requests = io[kind]["requests"].as_u64().unwrap() as f64;
        assert_eq!(
            value("paraid_io_requests_total", &label),
            requests,
            "{kind}"
        );
        assert_eq!(
            value("paraid_io_bytes_total", &label),
            io[kind]["bytes"].as_u64().unwrap() as f64
        );
        let buckets: Vec<f64> = samples
            .iter()
            .filter(|(n, l, _)| n == "paraid_io_latency_seconds_bucket" && l.contains(&label))
            .map(|s| s.2)
            .collect();
        assert_eq!(buckets.len(), 28, "27 bounds and +Inf for {kind}");
        assert!(
            buckets.windows(2).all(|w| w[0] <= w[1]),
            "{kind} buckets cumulative: {buckets:?}"
        );
        assert_eq!(
            *buckets.last().unwrap(),
            requests,
            "{kind}: +Inf is the count"
        );
        assert_eq!(value("paraid_io_latency_seconds_count", &label), requests);
        let sum = value("paraid_io_latency_seconds_sum", &label);
        let mean_s = io[kind]["latency_us"]["mean"].as_f64().unwrap() / 1e6;
        assert!((sum - mean_s * requests).abs() < 1e-6, "{kind}: sum {sum}");
    }
    assert_eq!(value("paraid_io_requests_total", "kind=\"write\""), 2.0);
}

/// `paraid stop` stops the server as SIGTERM does, returns only once it has exited (here a child of this test,
/// not yet waited for: a zombie counts as exited), and reports what the superblocks say then.
#[test]
fn stop_ends_the_server_and_reports_the_array_clean() {
    let scratch = Scratch::new("stop");
    let members = scratch.members(4);
    create("5", "64K", "16M", &members);
    let mut served = Served::start(&scratch.path("s.sock"), &members, &[]);
    let control = format!("{}.ctl", served.socket.display());
    let out = paraid(&["stop", "--control", &control, "--json"]);
    assert!(
        out.status.success(),
        "stop: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let reply: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(reply["stopped"], true, "{reply}");
    assert_eq!(reply["state"].as_str(), Some("clean"), "{reply}");
    let mut child = served.child.take().unwrap();
    let status = child
        .try_wait()
        .unwrap()
        .expect("paraid stop returned before the server exited");
    assert!(status.success(), "the server's exit: {status}");
    assert!(
        !std::path::Path::new(&control).exists(),
        "control socket left behind"
    );
    let out = paraid(&["examine", "--json", members[0].to_str().unwrap()]);
    let sb: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(sb["state"].as_str(), Some("clean"), "{sb}");
    // Nothing answers any more: a second stop says so.
    let out = paraid(&["stop", "--control", &control]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("is `paraid serve` running?"));
}

/// `paraid stop --timeout-s` gives up waiting for a server that does not exit, with a clear error (JSON for
/// `--json`) and exit status 1, instead of waiting for ever. The server here is a stand-in on the control socket
/// that acknowledges the stop and names a process that goes on running (a stop held up by a hung member).
#[test]
fn stop_gives_up_after_its_timeout_on_a_server_that_does_not_exit() {
    let scratch = Scratch::new("stop-timeout");
    let control = scratch.path("hung.ctl");
    let listener = std::os::unix::net::UnixListener::bind(&control).unwrap();
    let mut still_running = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    let pid = still_running.id();
    let stand_in = std::thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        let mut line = String::new();
        BufReader::new(stream.try_clone().unwrap())
            .read_line(&mut line)
            .unwrap();
        let reply = serde_json::json!({"ok": true, "server_pid": pid, "members": []});
        (&stream)
            .write_all(format!("{reply}\n").as_bytes())
            .unwrap();
        line
    });
    let started = std::time::Instant::now();
    let out = paraid(&[
        "stop",
        "--control",
        control.to_str().unwrap(),
        "--timeout-s",
        "1",
        "--json",
    ]);
    let waited = started.elapsed();
    let asked: serde_json::Value = serde_json::from_str(&stand_in.join().unwrap()).unwrap();
    assert_eq!(asked["op"], "stop", "{asked}");
    assert!(
        !out.status.success(),
        "stop succeeded with its server running"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "(pid {pid}) was asked to stop but has not exited within 1 s"
        )),
        "{stderr}"
    );
    let reply: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(reply["ok"], false, "{reply}");
    assert!(
        waited >= std::time::Duration::from_secs(1) && waited < std::time::Duration::from_secs(20),
        "gave up after {waited:?}"
    );
    assert!(
        still_running.try_wait().unwrap().is_none(),
        "stop must not kill the server"
    );
    still_running.kill().unwrap();
    still_running.wait().unwrap();
}

/// With a member faulty (its file truncated under the running server), `paraid stop` reads back only the members
/// the stop wrote to, and says the array is clean.
#[test]
fn stop_of_a_degraded_array_reads_back_its_active_members() {
    let scratch = Scratch::new("stop-degraded");
    let members = scratch.members(3);
    create("5", "64K", "16M", &members);
    let served = Served::start(&scratch.path("s.sock"), &members, &[]);
    let control = format!("{}.ctl", served.socket.display());
    let reply = ctl(std::path::Path::new(&control), &["fail", "1"]);
    assert_eq!(reply["slot"], 1, "{reply}");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&members[1])
        .unwrap()
        .set_len(1 << 20)
        .unwrap();
    let reply = ctl(std::path::Path::new(&control), &["stop"]);
    assert_eq!(reply["state"].as_str(), Some("clean"), "{reply}");
    drop(served);
}

/// A client that connects to the control socket and sends nothing holds up no other client (they were answered
/// one at a time: `status` waited 30 s, then failed), nor the stop.
#[test]
fn an_idle_control_client_holds_up_no_other() {
    let scratch = Scratch::new("idle-client");
    let members = scratch.members(3);
    create("5", "64K", "16M", &members);
    let served = Served::start(&scratch.path("s.sock"), &members, &[]);
    let control = format!("{}.ctl", served.socket.display());
    let idle = std::os::unix::net::UnixStream::connect(&control).unwrap();
    let started = std::time::Instant::now();
    let reply = ctl(std::path::Path::new(&control), &["status"]);
    assert_eq!(reply["ok"], true, "{reply}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(10),
        "status took {:?} beside an idle client",
        started.elapsed()
    );
    let reply = ctl(std::path::Path::new(&control), &["stop"]);
    assert_eq!(reply["state"].as_str(), Some("clean"), "{reply}");
    drop(idle);
    drop(served);
}

/// Under the default policy (the journal) the write-back pool that carries early answers (threads named
/// `paraid-wb*`) is started for a RAID6, which answers from its log, and not for a RAID10, which has no log to
/// answer from. It starts with one thread and grows only while held writes wait for one (up to 128): an idle
/// array has one.
#[test]
fn the_write_back_pool_starts_only_where_the_array_answers_from_its_log() {
    if ["PARAID_PPL", "PARAID_JOURNAL"]
        .iter()
        .any(|v| std::env::var_os(v).is_some())
    {
        eprintln!(
            "skipped: PARAID_PPL or PARAID_JOURNAL set, so the default policy is not the journal"
        );
        return;
    }
    let scratch = Scratch::new("pool");
    let pool_threads = |level: &str, members: &[std::path::PathBuf]| {
        create(level, "32K", "16M", members);
        let served = Served::start(&scratch.path(&format!("{level}.sock")), members, &[]);
        let pid = served.child.as_ref().expect("running").id();
        let count = std::fs::read_dir(format!("/proc/{pid}/task"))
            .expect("the server's threads")
            .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
            .filter(|comm| comm.starts_with("paraid-wb"))
            .count();
        served.stop();
        count
    };
    let raid6: Vec<std::path::PathBuf> = (0..4)
        .map(|n| scratch.path(&format!("r6-{n}.img")))
        .collect();
    let raid10: Vec<std::path::PathBuf> = (0..4)
        .map(|n| scratch.path(&format!("r10-{n}.img")))
        .collect();
    assert_eq!(pool_threads("6", &raid6), 1, "RAID6");
    assert_eq!(pool_threads("10", &raid10), 0, "RAID10");
}
