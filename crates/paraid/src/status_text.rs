//! `paraid status` and `paraid detail` for people: the array in a few lines and its members as a table, the way
//! `mdadm --detail` reads. `--json` has every field; the counters here are the ones an operator looks at first.

use serde_json::Value;

use crate::admin::{frontend_line, io_lines, progress_line};
use crate::units::format_bytes;

/// The lines of `paraid status` (without `--json`) for a status reply.
pub fn status_lines(reply: &Value) -> Vec<String> {
    let array = &reply["array"];
    let mut lines = vec![identity_line(array)];
    lines.push(format!("state: {}", state_summary(array)));
    lines.push(format!(
        "consistency: {}; parity: {}; rebuild/check speed: {}",
        text(&array["consistency_policy"]),
        text(&array["parity_backend"]),
        speed_summary(array)
    ));
    // A GPU backend says where its batches went; a CPU backend's detail is its name.
    if let Some(detail) = array["parity_detail"]
        .as_str()
        .filter(|d| Some(*d) != array["parity_backend"].as_str())
    {
        lines.push(format!("parity backend: {detail}"));
    }
    lines.push("slot  state       errors  member".to_string());
    for member in array["members"].as_array().into_iter().flatten() {
        let mut replacement = member["replacement"]
            .as_str()
            .map(|r| format!(" (being replaced by {r})"))
            .unwrap_or_default();
        if member["slow"].as_bool() == Some(true) {
            replacement.push_str(&format!(
                " (slow: {:.1} ms per I/O on average; reads are served around it)",
                member["latency_us"].as_f64().unwrap_or(0.0) / 1000.0
            ));
        } else if member["returning"].as_bool() == Some(true) {
            replacement.push_str(" (no longer slow: its reads come back to it over a few seconds)");
        }
        lines.push(format!(
            "{:>4}  {:<10}  {:>6}  {}{replacement}",
            member["slot"].as_u64().unwrap_or(0),
            text(&member["state"]),
            member["errors"].as_u64().unwrap_or(0),
            member_cell(member)
        ));
    }
    let spares = strings(&array["spares"]);
    lines.push(format!(
        "spares: {}",
        if spares.is_empty() {
            "none".to_string()
        } else {
            spares.join(", ")
        }
    ));
    lines.extend(frontend_line(&reply["frontend"]).map(|l| l.to_string()));
    lines.extend(progress_line(&array["progress"]).map(|l| format!("progress: {l}")));
    let queued = strings(&array["queued_jobs"]);
    if !queued.is_empty() {
        lines.push(format!("queued: {}", queued.join(", ")));
    }
    if let Some(line) = progress_line(&array["last_result"]) {
        let outcome = array["last_result"]["outcome"]
            .as_str()
            .map(|o| format!(" ({o})"))
            .unwrap_or_default();
        lines.push(format!("last job: {line}{outcome}"));
    }
    lines.extend(counter_lines(array));
    lines.extend(io_lines(&reply["io"]));
    lines
}

/// The lines of `paraid detail` (without `--json`): what a member set's superblocks say and what `serve` of it does.
pub fn detail_lines(detail: &Value) -> Vec<String> {
    let mut lines = vec![
        format!("{}, {}", identity_line(detail), text(&detail["state"])),
        format!("serve: {}", text(&detail["serve"])),
        "slot  state       member".to_string(),
    ];
    for member in detail["members"].as_array().into_iter().flatten() {
        lines.push(format!(
            "{:>4}  {:<10}  {}",
            member["slot"].as_u64().unwrap_or(0),
            text(&member["state"]),
            member_cell(member)
        ));
    }
    for stale in detail["stale"].as_array().into_iter().flatten() {
        lines.push(format!(
            "stale: {} (slot {}, events {}){}",
            text(&stale["path"]),
            stale["slot"],
            stale["events"],
            re_add_outlook(stale)
        ));
    }
    let spares = strings(&detail["spares"]);
    if !spares.is_empty() {
        lines.push(format!("spares: {}", spares.join(", ")));
    }
    lines
}

/// A JSON string as text, `?` where there is none.
/// What `paraid add` of stale member `stale` would rebuild, for `detail`.
fn re_add_outlook(stale: &Value) -> String {
    if stale["re_add_from_bitmap"].as_bool() != Some(true) {
        return String::new();
    }
    match stale["re_add_in_sync_below_bytes"].as_u64() {
        Some(bytes) => format!(
            "; `paraid add` re-adds it, rebuilt only where written since below byte {bytes} of its data area \
             (where its own rebuild had come when it left) and whole from there"
        ),
        None => "; `paraid add` re-adds it, rebuilt only where written since".to_string(),
    }
}

fn text(value: &Value) -> String {
    value.as_str().unwrap_or("?").to_string()
}

/// A JSON array of strings (spares, queued jobs) as texts.
fn strings(value: &Value) -> Vec<String> {
    value.as_array().into_iter().flatten().map(text).collect()
}

/// `raid6 array 'db' (UUID): 1 GiB, chunk 64 KiB, left-symmetric layout, events 7`: the first line of both views.
fn identity_line(array: &Value) -> String {
    let bytes = |v: &Value| format_bytes(v.as_u64().unwrap_or(0));
    format!(
        "{} array '{}' ({}): {}, chunk {}, {} layout, events {}",
        text(&array["level"]),
        text(&array["name"]),
        text(&array["uuid"]),
        bytes(&array["size_bytes"]),
        bytes(&array["chunk_bytes"]),
        text(&array["layout"]),
        array["events"]
    )
}

/// A member table's last column: the member's path (`-` for none) and, while it is rebuilt, how much is in sync.
fn member_cell(member: &Value) -> String {
    let path = member["path"]
        .as_str()
        .filter(|p| !p.is_empty())
        .unwrap_or("-");
    match member["recovery_offset_bytes"].as_u64() {
        Some(bytes) => format!("{path} ({} in sync)", format_bytes(bytes)),
        None => path.to_string(),
    }
}

/// An array state word (`clean`, `dirty`) as a person reads it: a served array is marked dirty until a clean stop
/// (how an unclean one is told at the next start), which is not damage.
pub fn state_words(state: &str) -> String {
    match state {
        "dirty" => "dirty (in use; made clean at a clean stop)".to_string(),
        other => other.to_string(),
    }
}

/// `dirty (serving), every member active`, `... degraded: slots [2] faulty`, or `FAILED ...`.
fn state_summary(array: &Value) -> String {
    let state = array["state"].as_str().unwrap_or("?");
    if array["failed"].as_bool() == Some(true) {
        return format!(
            "{state}; FAILED: beyond its tolerance, it serves nothing (every request fails)"
        );
    }
    let members = array["members"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    let not_active: Vec<String> = members
        .iter()
        .filter(|m| m["state"].as_str() != Some("active"))
        .map(|m| format!("slot {} {}", m["slot"], m["state"].as_str().unwrap_or("?")))
        .collect();
    let served = if array["read_only"].as_bool() == Some(true) {
        format!("{state}, served read-only (nothing is written to the members)")
    } else {
        state_words(state)
    };
    if not_active.is_empty() {
        format!("{served}, all {} members active", members.len())
    } else {
        format!(
            "{served}, degraded: {} of {} members active ({})",
            members.len() - not_active.len(),
            members.len(),
            not_active.join(", ")
        )
    }
}

fn speed_summary(array: &Value) -> String {
    let rate = |v: &Value| match v.as_u64() {
        Some(0) | None => "unlimited".to_string(),
        Some(b) => format!("{}/s", format_bytes(b)),
    };
    format!(
        "min {}, max {}",
        rate(&array["sync_speed_min_bytes_per_s"]),
        rate(&array["sync_speed_max_bytes_per_s"])
    )
}

/// The write-hole log, the bitmap, the stripe cache, stripe lock waits and write gathering, one line each where they
/// did anything.
fn counter_lines(array: &Value) -> Vec<String> {
    let n = |v: &Value| v.as_u64().unwrap_or(0);
    let integrity = &array["integrity"];
    let mut lines = vec![format!(
        "bitmap: {} of {} regions dirty ({} each), {} resync stripes, {} rewritten",
        n(&integrity["dirty_regions"]),
        n(&integrity["bitmap_regions"]),
        format_bytes(n(&integrity["region_bytes"])),
        n(&integrity["resync_stripes"]),
        n(&integrity["resync_rewritten"])
    )];
    if integrity["log_enabled"].as_bool() == Some(true) {
        lines.push(format!(
            "write-hole log: {} rounds, {} entries ({}), {} rides, {} stripes recovered at start",
            n(&integrity["log_rounds"]),
            n(&integrity["log_entries"]),
            format_bytes(n(&integrity["log_payload_bytes"])),
            n(&integrity["log_rides"]),
            n(&integrity["log_recovered_stripes"])
        ));
    }
    if integrity["journal"].as_bool() == Some(true) {
        lines.push(journal_line(integrity));
    }
    let cache = &array["stripe_cache"];
    if n(&cache["budget_bytes"]) > 0 {
        lines.push(format!(
            "stripe cache: {} of {} held, {} hits, {} misses",
            format_bytes(n(&cache["held_bytes"])),
            format_bytes(n(&cache["budget_bytes"])),
            n(&cache["hits"]),
            n(&cache["misses"])
        ));
    }
    let locks = &array["stripe_locks"];
    if n(&locks["waits"]) > 0 {
        lines.push(format!(
            "stripe locks: {} requests waited for a stripe another held, {:.1} ms in all, {} of them 1 ms or longer",
            n(&locks["waits"]),
            n(&locks["wait_us"]) as f64 / 1000.0,
            n(&locks["long_waits"])
        ));
    }
    let gather = &array["gather"];
    if n(&gather["full_stripes"]) > 0 || n(&gather["queued"]) > 0 {
        lines.push(format!(
            "write gathering: {} full stripes, {} timed out, {} gathers of writes queued on a busy stripe; {} writes \
             joined",
            n(&gather["full_stripes"]),
            n(&gather["timed_out"]),
            n(&gather["queued"]),
            n(&gather["joined"])
        ));
    }
    lines
}

/// Journal mode: which writes may be answered early, what the gate on spare CPU reads (the CPU, and where it
/// watches them the members' queues), and how many writes logged their data first, found the CPU busy, or found
/// the members queueing.
fn journal_line(integrity: &Value) -> String {
    let n = |v: &Value| v.as_u64().unwrap_or(0);
    let answers = match integrity["journal_answers"].as_str().unwrap_or("") {
        "spare-cpu" => match n(&integrity["spare_cpu_quota_millicpus"]) {
            0 => "gated on the machine's spare CPU".to_string(),
            quota => format!(
                "gated on spare CPU within a quota of {}.{:03} CPUs",
                quota / 1000,
                quota % 1000
            ),
        },
        "lone" => "for writes no other awaits an answer beside".to_string(),
        "every" => "for every small write".to_string(),
        other => other.to_string(),
    };
    let members = match integrity["member_load"].as_str().unwrap_or("") {
        "" => String::new(),
        load => format!(
            " and the members' queues (now {load}, busiest member {} % busy)",
            n(&integrity["member_busy_permille"]) / 10
        ),
    };
    let queued = match n(&integrity["log_members_queue"]) {
        0 if members.is_empty() => String::new(),
        queued => format!(", {queued} found the members queueing"),
    };
    format!(
        "journal: early answers {answers}{members}; {} writes logged their data first, {} found the CPU busy{queued}",
        n(&integrity["log_data_first"]),
        n(&integrity["log_cpu_busy"])
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_journal_line_says_what_the_gate_reads() {
        let mut integrity = json!({"journal": true, "journal_answers": "spare-cpu", "log_data_first": 12,
                                   "log_cpu_busy": 3, "spare_cpu_quota_millicpus": 0});
        assert_eq!(
            journal_line(&integrity),
            "journal: early answers gated on the machine's spare CPU; 12 writes logged their data first, 3 found \
             the CPU busy"
        );
        integrity["member_load"] = json!("saturated");
        integrity["member_busy_permille"] = json!(873);
        integrity["log_members_queue"] = json!(40);
        assert_eq!(
            journal_line(&integrity),
            "journal: early answers gated on the machine's spare CPU and the members' queues (now saturated, \
             busiest member 87 % busy); 12 writes logged their data first, 3 found the CPU busy, 40 found the \
             members queueing"
        );
        integrity["spare_cpu_quota_millicpus"] = json!(1500);
        assert!(
            journal_line(&integrity).starts_with(
                "journal: early answers gated on spare CPU within a quota of 1.500 CPUs and the members' queues"
            ),
            "{}",
            journal_line(&integrity)
        );
    }

    fn reply(members: Value, failed: bool) -> Value {
        json!({
            "array": {
                "level": "raid6", "name": "db", "uuid": "u", "size_bytes": 1u64 << 30, "chunk_bytes": 65536,
                "layout": "left-symmetric", "events": 7, "state": "dirty", "failed": failed,
                "consistency_policy": "ppl", "parity_backend": "avx2",
                "sync_speed_min_bytes_per_s": 67108864u64, "sync_speed_max_bytes_per_s": 0,
                "members": members, "spares": ["/srv/s0.img"], "progress": null, "last_result": null,
                "queued_jobs": ["rebuild slot 2", "check"],
                "integrity": {"log_enabled": true, "bitmap_regions": 64, "region_bytes": 8388608u64},
                "stripe_cache": {"budget_bytes": 0}, "gather": {}
            },
            "frontend": {"kind": "nbd", "uri": "nbd+unix:///?socket=/run/p.sock"},
            "io": {}
        })
    }

    /// Two active members, the second with `latency_us` and marked slow or not.
    fn two_members(latency_us: u64, slow: bool) -> Value {
        json!([
            {"slot": 0, "path": "/srv/m0.img", "state": "active", "errors": 0, "recovery_offset_bytes": null,
             "latency_us": 90, "slow": false},
            {"slot": 1, "path": "/srv/m1.img", "state": "active", "errors": 0, "recovery_offset_bytes": null,
             "latency_us": latency_us, "slow": slow},
        ])
    }

    #[test]
    fn a_slow_member_says_so() {
        let text = status_lines(&reply(two_members(21350, true), false)).join("\n");
        assert!(
            text.contains(
                "   1  active           0  /srv/m1.img (slow: 21.4 ms per I/O on average; reads are served around it)\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("   0  active           0  /srv/m0.img\n"),
            "{text}"
        );
    }

    #[test]
    fn a_member_getting_its_reads_back_says_so() {
        let mut status = reply(two_members(300, false), false);
        status["array"]["slow_member"] = json!({"slow_slot": null, "returning_slot": 1});
        status["array"]["members"][1]["returning"] = json!(true);
        let text = status_lines(&status).join("\n");
        assert!(
            text.contains(
                "   1  active           0  /srv/m1.img (no longer slow: its reads come back to it over a few seconds)\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("   0  active           0  /srv/m0.img\n"),
            "{text}"
        );
    }

    #[test]
    fn a_gpu_backend_says_where_its_batches_went() {
        let members = json!([
            {"slot": 0, "path": "/srv/m0.img", "state": "active", "errors": 0, "recovery_offset_bytes": null},
        ]);
        let cpu = status_lines(&reply(members.clone(), false)).join("\n");
        assert!(!cpu.contains("parity backend:"), "{cpu}");
        let mut reply = reply(members, false);
        reply["array"]["parity_backend"] = json!("auto");
        reply["array"]["parity_detail"] =
            json!("auto: GPU H200 for ...; batches so far: 512 GPU (512 in place), 2048 CPU");
        let text = status_lines(&reply).join("\n");
        assert!(
            text.contains("\nparity backend: auto: GPU H200 for ...; batches so far: 512 GPU (512 in place), 2048 CPU\n"),
            "{text}"
        );
    }

    /// The status text of a one-member array as it is, and with `array.KEY` set to `value`.
    fn quiet_and_with(key: &str, value: Value) -> (String, String) {
        let members = json!([
            {"slot": 0, "path": "/srv/m0.img", "state": "active", "errors": 0, "recovery_offset_bytes": null},
        ]);
        let quiet = status_lines(&reply(members.clone(), false)).join("\n");
        let mut reply = reply(members, false);
        reply["array"][key] = value;
        (quiet, status_lines(&reply).join("\n"))
    }

    #[test]
    fn writes_queued_on_a_busy_stripe_get_the_gathering_line() {
        let (quiet, text) = quiet_and_with(
            "gather",
            json!({"full_stripes": 0, "timed_out": 0, "joined": 9, "queued": 4}),
        );
        assert!(!quiet.contains("write gathering:"), "{quiet}");
        assert!(
            text.contains(
                "write gathering: 0 full stripes, 0 timed out, 4 gathers of writes queued on a busy stripe; 9 writes joined"
            ),
            "{text}"
        );
    }

    #[test]
    fn stripe_lock_waits_get_a_line_once_there_are_some() {
        let (quiet, text) = quiet_and_with(
            "stripe_locks",
            json!({"waits": 40, "wait_us": 12_345u64, "long_waits": 2}),
        );
        assert!(!quiet.contains("stripe locks:"), "{quiet}");
        assert!(
            text.contains(
                "stripe locks: 40 requests waited for a stripe another held, 12.3 ms in all, 2 of them 1 ms or longer"
            ),
            "{text}"
        );
    }

    #[test]
    fn a_read_only_array_says_so() {
        let members = json!([
            {"slot": 0, "path": "/srv/m0.img", "state": "active", "errors": 0, "recovery_offset_bytes": null},
            {"slot": 1, "path": "", "state": "missing", "errors": 0, "recovery_offset_bytes": null},
        ]);
        let mut reply = reply(members, false);
        reply["array"]["read_only"] = json!(true);
        reply["array"]["state"] = json!("clean");
        let text = status_lines(&reply).join("\n");
        assert!(
            text.contains(
                "clean, served read-only (nothing is written to the members), degraded: 1 of 2"
            ),
            "{text}"
        );
    }

    #[test]
    fn a_degraded_array_reads_as_one() {
        let members = json!([
            {"slot": 0, "path": "/srv/m0.img", "state": "active", "errors": 0, "recovery_offset_bytes": null,
             "replacement": "/srv/new0.img"},
            {"slot": 1, "path": "", "state": "missing", "errors": 0, "recovery_offset_bytes": null},
            {"slot": 2, "path": "/srv/n2.img", "state": "rebuilding", "errors": 3,
             "recovery_offset_bytes": 1048576u64},
        ]);
        let lines = status_lines(&reply(members, false));
        let text = lines.join("\n");
        assert_eq!(
            lines[0],
            "raid6 array 'db' (u): 1 GiB, chunk 64 KiB, left-symmetric layout, events 7"
        );
        assert!(
            text.contains("degraded: 1 of 3 members active (slot 1 missing, slot 2 rebuilding)"),
            "{text}"
        );
        assert!(text.contains("   1  missing          0  -\n"), "{text}");
        assert!(
            text.contains(
                "   0  active           0  /srv/m0.img (being replaced by /srv/new0.img)"
            ),
            "{text}"
        );
        assert!(
            text.contains("   2  rebuilding       3  /srv/n2.img (1 MiB in sync)"),
            "{text}"
        );
        assert!(
            text.contains("rebuild/check speed: min 64 MiB/s, max unlimited"),
            "{text}"
        );
        assert!(text.contains("spares: /srv/s0.img"), "{text}");
        assert!(text.contains("queued: rebuild slot 2, check"), "{text}");
        assert!(
            text.contains("served: NBD nbd+unix:///?socket=/run/p.sock"),
            "{text}"
        );
        assert!(text.contains("write-hole log: 0 rounds"), "{text}");
        assert!(
            !text.contains("stripe cache"),
            "an empty cache budget prints nothing: {text}"
        );
    }

    #[test]
    fn detail_lists_slots_stale_members_and_what_serve_does() {
        let detail = json!({
            "level": "raid5", "name": "db", "uuid": "u", "size_bytes": 3u64 << 20, "chunk_bytes": 65536,
            "layout": "left-symmetric", "events": 9, "state": "clean", "serve": "refused: ...",
            "members": [
                {"slot": 0, "path": "/srv/m0.img", "state": "active", "recovery_offset_bytes": null},
                {"slot": 1, "path": "", "state": "missing", "recovery_offset_bytes": null}
            ],
            "stale": [{"path": "/srv/m1.img", "slot": 1, "events": 4, "re_add_from_bitmap": false},
                      {"path": "/srv/m2.img", "slot": 2, "events": 8, "re_add_from_bitmap": true},
                      {"path": "/srv/m3.img", "slot": 3, "events": 7, "re_add_from_bitmap": true,
                       "re_add_in_sync_below_bytes": 1048576}],
            "spares": []
        });
        let text = detail_lines(&detail).join("\n");
        assert!(text.starts_with(
            "raid5 array 'db' (u): 3 MiB, chunk 64 KiB, left-symmetric layout, events 9, clean"
        ));
        assert!(text.contains("serve: refused: ..."), "{text}");
        assert!(text.contains("   1  missing     -\n"), "{text}");
        assert!(
            text.contains("stale: /srv/m1.img (slot 1, events 4)\n"),
            "{text}"
        );
        assert!(
            text.contains(
                "stale: /srv/m2.img (slot 2, events 8); `paraid add` re-adds it, rebuilt only where written \
                 since\n"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "stale: /srv/m3.img (slot 3, events 7); `paraid add` re-adds it, rebuilt only where written \
                 since below byte 1048576 of its data area"
            ),
            "{text}"
        );
        assert!(!text.contains("spares"), "{text}");
    }

    #[test]
    fn a_re_add_says_how_much_was_in_sync() {
        let progress = json!({"kind": "rebuild", "slot": 2, "done_bytes": 768u64 << 20,
                              "total_bytes": 1u64 << 30, "rate_bytes_per_s": 0, "in_sync_bytes": 700u64 << 20});
        let line = progress_line(&progress).expect("a line");
        assert!(
            line.starts_with(
                "rebuild slot 2: 75.0% (768 MiB of 1 GiB, 700 MiB of it in sync already (re-add))"
            ),
            "{line}"
        );
        let whole = json!({"kind": "rebuild", "slot": 2, "done_bytes": 0, "total_bytes": 1u64 << 30,
                           "rate_bytes_per_s": 0, "in_sync_bytes": 0});
        assert!(!progress_line(&whole).unwrap().contains("in sync"));
    }

    #[test]
    fn a_failed_array_says_it_serves_nothing() {
        let members = json!([{"slot": 0, "path": "", "state": "faulty", "errors": 9}]);
        let text = status_lines(&reply(members, true)).join("\n");
        assert!(text.contains("FAILED: beyond its tolerance"), "{text}");
    }
}
