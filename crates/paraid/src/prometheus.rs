//! `paraid metrics`: a running array's state and I/O counters in the Prometheus text exposition format (version
//! 0.0.4), for a scraper or node_exporter's textfile collector. Built from the control socket's status reply, so
//! it shows exactly what `paraid status --json` shows.

use std::fmt::Write;

use serde_json::Value;

/// Latency histogram bounds: 1 µs to about 67 s, powers of two. The array's histogram (metrics.rs) has bucket
/// edges at every power of two, so each cumulative count here is exact: the samples below 2^k µs.
const LATENCY_BOUND_POWERS: std::ops::Range<u32> = 0..27;

/// A label value with `\`, `"` and newlines escaped.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

struct Exposition {
    text: String,
    array: String,
}

impl Exposition {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.text, "# HELP {name} {help}");
        let _ = writeln!(self.text, "# TYPE {name} {kind}");
    }

    /// One sample; `labels` besides the array's name.
    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        let mut all = format!("array=\"{}\"", escape(&self.array));
        for (key, val) in labels {
            let _ = write!(all, ",{key}=\"{}\"", escape(val));
        }
        let _ = writeln!(self.text, "{name}{{{all}}} {value}");
    }
}

/// A JSON flag as a gauge: 1 when true, 0 otherwise (false or absent).
fn flag(v: &Value) -> f64 {
    if v.as_bool() == Some(true) {
        1.0
    } else {
        0.0
    }
}

fn number(v: &Value) -> f64 {
    v.as_f64().unwrap_or(0.0)
}

/// The exposition text for a status reply (`{"array": ..., "io": ...}`).
pub fn exposition(reply: &Value) -> String {
    let array = &reply["array"];
    let mut out = Exposition {
        text: String::new(),
        array: array["name"].as_str().unwrap_or("").to_string(),
    };
    out.family(
        "paraid_array_info",
        "gauge",
        "The array's identity and configuration (always 1).",
    );
    let level = array["level"].as_str().unwrap_or("");
    let uuid = array["uuid"].as_str().unwrap_or("");
    let policy = array["consistency_policy"].as_str().unwrap_or("");
    let backend = array["parity_backend"].as_str().unwrap_or("");
    out.sample(
        "paraid_array_info",
        &[
            ("uuid", uuid),
            ("level", level),
            ("consistency_policy", policy),
            ("parity_backend", backend),
        ],
        1.0,
    );
    let frontend = &reply["frontend"];
    if let Some(kind) = frontend["kind"].as_str() {
        out.family(
            "paraid_frontend_info",
            "gauge",
            "How the array is served: ublk (the block device), nbd (the URI) or fuse (the file) (always 1).",
        );
        let address = frontend["device"]
            .as_str()
            .or(frontend["uri"].as_str())
            .or(frontend["file"].as_str())
            .unwrap_or("");
        out.sample(
            "paraid_frontend_info",
            &[("kind", kind), ("address", address)],
            1.0,
        );
    }
    out.family(
        "paraid_array_size_bytes",
        "gauge",
        "Usable size of the array.",
    );
    out.sample("paraid_array_size_bytes", &[], number(&array["size_bytes"]));
    out.family(
        "paraid_array_failed",
        "gauge",
        "1 when more members are missing than the level tolerates (the array serves nothing).",
    );
    out.sample("paraid_array_failed", &[], flag(&array["failed"]));
    out.family(
        "paraid_array_read_only",
        "gauge",
        "1 when the array is served read-only (`serve --read-only`: nothing is written to the members).",
    );
    out.sample("paraid_array_read_only", &[], flag(&array["read_only"]));

    out.family("paraid_array_members", "gauge", "Member slots by state.");
    let members = array["members"].as_array().cloned().unwrap_or_default();
    let mut states: Vec<&str> = members.iter().filter_map(|m| m["state"].as_str()).collect();
    states.sort_unstable();
    states.dedup();
    for state in ["active", "faulty", "missing", "rebuilding"] {
        if !states.contains(&state) {
            states.push(state);
        }
    }
    for state in states {
        let n = members
            .iter()
            .filter(|m| m["state"].as_str() == Some(state))
            .count();
        out.sample("paraid_array_members", &[("state", state)], n as f64);
    }
    out.family(
        "paraid_array_spares",
        "gauge",
        "Hot spares waiting for a failed slot.",
    );
    let spares = array["spares"].as_array().map_or(0, Vec::len);
    out.sample("paraid_array_spares", &[], spares as f64);
    out.family(
        "paraid_member_errors_total",
        "counter",
        "I/O errors counted against each member slot.",
    );
    for m in &members {
        let slot = m["slot"].to_string();
        out.sample(
            "paraid_member_errors_total",
            &[("slot", &slot)],
            number(&m["errors"]),
        );
    }
    out.family(
        "paraid_member_latency_seconds",
        "gauge",
        "Moving average of each member's read and write latency (0 for members in memory).",
    );
    for m in &members {
        let slot = m["slot"].to_string();
        out.sample(
            "paraid_member_latency_seconds",
            &[("slot", &slot)],
            number(&m["latency_us"]) / 1e6,
        );
    }
    out.family(
        "paraid_member_slow",
        "gauge",
        "1 for the member far slower than the others, whose reads are served from the other members.",
    );
    for m in &members {
        let slot = m["slot"].to_string();
        let slow = if m["slow"].as_bool() == Some(true) {
            1.0
        } else {
            0.0
        };
        out.sample("paraid_member_slow", &[("slot", &slot)], slow);
    }
    out.family(
        "paraid_member_returning",
        "gauge",
        "1 for the member that is no longer slow and gets its reads back over a few seconds.",
    );
    for m in &members {
        let slot = m["slot"].to_string();
        let value = if m["returning"].as_bool() == Some(true) {
            1.0
        } else {
            0.0
        };
        out.sample("paraid_member_returning", &[("slot", &slot)], value);
    }
    out.family(
        "paraid_steered_reads_total",
        "counter",
        "Pieces of reads served around a slow member (from another copy, or solved and checked).",
    );
    out.sample(
        "paraid_steered_reads_total",
        &[],
        number(&array["slow_member"]["steered_reads"]),
    );
    out.family(
        "paraid_slow_member_probes_total",
        "counter",
        "Reads of the slow member made only to keep measuring it (a page every 100 ms while it is slow).",
    );
    out.sample(
        "paraid_slow_member_probes_total",
        &[],
        number(&array["slow_member"]["probes"]),
    );
    out.family(
        "paraid_slow_member_returns_total",
        "counter",
        "Times a member was found slow again soon after it left the slow state, and held slow longer each time.",
    );
    out.sample(
        "paraid_slow_member_returns_total",
        &[],
        number(&array["slow_member"]["returns"]),
    );
    let batches = &array["parity_batches"];
    if batches.is_object() {
        out.family(
            "paraid_parity_batches_total",
            "counter",
            "Batched stripe operations of a GPU parity backend by where they ran: gpu_staged (through pinned \
             slots), gpu_in_place (chunks in registered memory), cpu (not taken by the GPU, or after it failed).",
        );
        for place in ["gpu_staged", "gpu_in_place", "cpu"] {
            out.sample(
                "paraid_parity_batches_total",
                &[("where", place)],
                number(&batches[place]),
            );
        }
    }

    let progress = &array["progress"];
    out.family(
        "paraid_sync_progress_ratio",
        "gauge",
        "Fraction done of the running background job (rebuild, check, repair, resync); absent when idle.",
    );
    out.family(
        "paraid_sync_rate_bytes_per_second",
        "gauge",
        "Rate of the running background job.",
    );
    if let Some(kind) = progress["kind"].as_str() {
        let total = number(&progress["total_bytes"]).max(1.0);
        let done = number(&progress["done_bytes"]) / total;
        out.sample("paraid_sync_progress_ratio", &[("kind", kind)], done);
        let rate = number(&progress["rate_bytes_per_s"]);
        out.sample("paraid_sync_rate_bytes_per_second", &[("kind", kind)], rate);
    }

    let cache = &array["stripe_cache"];
    out.family(
        "paraid_stripe_cache_budget_bytes",
        "gauge",
        "Memory the stripe cache may use.",
    );
    out.sample(
        "paraid_stripe_cache_budget_bytes",
        &[],
        number(&cache["budget_bytes"]),
    );
    out.family(
        "paraid_stripe_cache_held_bytes",
        "gauge",
        "Memory the stripe cache holds.",
    );
    out.sample(
        "paraid_stripe_cache_held_bytes",
        &[],
        number(&cache["held_bytes"]),
    );
    out.family(
        "paraid_stripe_cache_lookups_total",
        "counter",
        "Reads of the write path, served by the stripe cache (hit) or the members (miss).",
    );
    out.sample(
        "paraid_stripe_cache_lookups_total",
        &[("result", "hit")],
        number(&cache["hits"]),
    );
    out.sample(
        "paraid_stripe_cache_lookups_total",
        &[("result", "miss")],
        number(&cache["misses"]),
    );

    let locks = &array["stripe_locks"];
    out.family(
        "paraid_stripe_lock_waits_total",
        "counter",
        "Requests that found a stripe they needed held by another write (or rebuild, check) and waited.",
    );
    out.sample(
        "paraid_stripe_lock_waits_total",
        &[],
        number(&locks["waits"]),
    );
    out.family(
        "paraid_stripe_lock_wait_seconds_total",
        "counter",
        "Time those requests waited for their stripes, summed.",
    );
    out.sample(
        "paraid_stripe_lock_wait_seconds_total",
        &[],
        number(&locks["wait_us"]) / 1e6,
    );
    out.family(
        "paraid_stripe_lock_long_waits_total",
        "counter",
        "Requests that waited 1 ms or longer for their stripes.",
    );
    out.sample(
        "paraid_stripe_lock_long_waits_total",
        &[],
        number(&locks["long_waits"]),
    );

    integrity_families(&mut out, &array["integrity"]);
    io_families(&mut out, &reply["io"]);
    out.text
}

/// The write-intent bitmap's dirty regions and what the partial parity log wrote (docs/reliability.md, "Write
/// hole"): how much the write-hole protection costs a workload, and how often writes ride a stream entry.
fn integrity_families(out: &mut Exposition, integrity: &Value) {
    if integrity.as_object().is_none() {
        return;
    }
    out.family(
        "paraid_bitmap_dirty_regions",
        "gauge",
        "Write-intent bitmap regions marked dirty (resynced after an unclean stop).",
    );
    out.sample(
        "paraid_bitmap_dirty_regions",
        &[],
        number(&integrity["dirty_regions"]),
    );
    let counters = [
        (
            "paraid_log_rounds_total",
            "log_rounds",
            "Partial parity log rounds written (one record per member, FUA).",
        ),
        (
            "paraid_log_entries_total",
            "log_entries",
            "Stripe entries logged.",
        ),
        (
            "paraid_log_rides_total",
            "log_rides",
            "Stripe writes that rode a live stream entry and logged nothing.",
        ),
        (
            "paraid_log_record_writes_total",
            "log_record_writes",
            "Log record writes to members.",
        ),
        (
            "paraid_log_payload_bytes_total",
            "log_payload_bytes",
            "Partial parity bytes logged.",
        ),
        (
            "paraid_log_retirements_total",
            "log_retirements",
            "Times the log retired its flushed records.",
        ),
    ];
    for (name, field, help) in counters {
        out.family(name, "counter", help);
        out.sample(name, &[], number(&integrity[field]));
    }
}

/// Requests, bytes, errors and the latency histogram per kind of request.
fn io_families(out: &mut Exposition, io: &Value) {
    let Some(kinds) = io.as_object() else {
        return;
    };
    let families = [
        (
            "paraid_io_requests_total",
            "requests",
            "Requests the array served, by kind.",
        ),
        (
            "paraid_io_bytes_total",
            "bytes",
            "Bytes of the requests the array served, by kind.",
        ),
        (
            "paraid_io_errors_total",
            "errors",
            "Requests the array failed, by kind.",
        ),
    ];
    for (name, key, help) in families {
        out.family(name, "counter", help);
        for (kind, stats) in kinds {
            out.sample(name, &[("kind", kind)], number(&stats[key]));
        }
    }
    let name = "paraid_io_latency_seconds";
    out.family(
        name,
        "histogram",
        "Time the array took to serve a request, by kind (from the NBD server handing it over to the reply).",
    );
    for (kind, stats) in kinds {
        let latency = &stats["latency_us"];
        let buckets: Vec<(u64, u64)> = latency["buckets"]
            .as_array()
            .map(|b| {
                b.iter()
                    .map(|pair| (pair[0].as_u64().unwrap_or(0), pair[1].as_u64().unwrap_or(0)))
                    .collect()
            })
            .unwrap_or_default();
        for power in LATENCY_BOUND_POWERS {
            let bound_us = 1u64 << power;
            // Bucket upper bounds are inclusive whole µs: below 2^k µs means at most 2^k - 1.
            let below: u64 = buckets
                .iter()
                .filter(|(upper, _)| *upper < bound_us)
                .map(|(_, n)| n)
                .sum();
            let le = format!("{}", bound_us as f64 / 1e6);
            out.sample(
                &format!("{name}_bucket"),
                &[("kind", kind), ("le", &le)],
                below as f64,
            );
        }
        let count: u64 = buckets.iter().map(|(_, n)| n).sum();
        out.sample(
            &format!("{name}_bucket"),
            &[("kind", kind), ("le", "+Inf")],
            count as f64,
        );
        out.sample(
            &format!("{name}_sum"),
            &[("kind", kind)],
            number(&latency["sum"]) / 1e6,
        );
        out.sample(&format!("{name}_count"), &[("kind", kind)], count as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_gpu_backend_counts_its_batches_by_where_they_ran() {
        let reply = json!({
            "array": {
                "name": "db", "members": [], "stripe_cache": {}, "integrity": {},
                "parity_batches": {"gpu_staged": 3, "gpu_in_place": 512, "cpu": 2048},
            },
            "io": {},
        });
        let text = exposition(&reply);
        for (place, count) in [("gpu_staged", 3), ("gpu_in_place", 512), ("cpu", 2048)] {
            assert!(
                text.contains(&format!(
                    "paraid_parity_batches_total{{array=\"db\",where=\"{place}\"}} {count}\n"
                )),
                "{text}"
            );
        }
        assert!(
            text.contains("# TYPE paraid_parity_batches_total counter\n"),
            "{text}"
        );
    }

    #[test]
    fn stripe_lock_waits_are_counters_with_the_wait_in_seconds() {
        let reply = json!({
            "array": {
                "name": "db", "members": [], "stripe_cache": {}, "integrity": {},
                "stripe_locks": {"waits": 12, "wait_us": 2_500_000u64, "long_waits": 3},
            },
            "io": {},
        });
        let text = exposition(&reply);
        for line in [
            "# TYPE paraid_stripe_lock_waits_total counter\n",
            "paraid_stripe_lock_waits_total{array=\"db\"} 12\n",
            "paraid_stripe_lock_wait_seconds_total{array=\"db\"} 2.5\n",
            "paraid_stripe_lock_long_waits_total{array=\"db\"} 3\n",
        ] {
            assert!(text.contains(line), "{line:?} missing from:\n{text}");
        }
    }

    #[test]
    fn label_values_are_escaped_and_a_running_job_is_shown() {
        let reply = json!({
            "array": {
                "name": "db \"main\"\\n",
                "level": "raid6",
                "failed": true,
                "members": [{"slot": 0, "state": "active", "errors": 2, "latency_us": 21500, "slow": true},
                            {"slot": 1, "state": "faulty", "errors": 9}],
                "slow_member": {"slow_slot": 0, "steered_reads": 42, "probes": 3, "returns": 2},
                "progress": {"kind": "rebuild", "done_bytes": 25, "total_bytes": 100, "rate_bytes_per_s": 7},
                "stripe_cache": {},
                "integrity": {"dirty_regions": 3, "log_rounds": 11, "log_rides": 5},
            },
            "io": {},
            "frontend": {"kind": "ublk", "device": "/dev/ublkb7", "ublk_id": 7},
        });
        let text = exposition(&reply);
        assert!(
            text.contains(&format!(
                "paraid_frontend_info{{{}kind=\"ublk\",address=\"/dev/ublkb7\"}} 1\n",
                r#"array="db \"main\"\\n","#
            )),
            "{text}"
        );
        let array = r#"array="db \"main\"\\n""#;
        assert!(
            text.contains(&format!("paraid_array_failed{{{array}}} 1\n")),
            "{text}"
        );
        assert!(text.contains(&format!(
            "paraid_array_members{{{array},state=\"faulty\"}} 1\n"
        )));
        assert!(text.contains(&format!(
            "paraid_member_errors_total{{{array},slot=\"1\"}} 9\n"
        )));
        assert!(
            text.contains(&format!(
                "paraid_member_latency_seconds{{{array},slot=\"0\"}} 0.0215\n"
            )),
            "{text}"
        );
        assert!(text.contains(&format!("paraid_member_slow{{{array},slot=\"0\"}} 1\n")));
        assert!(text.contains(&format!("paraid_member_slow{{{array},slot=\"1\"}} 0\n")));
        assert!(text.contains(&format!(
            "paraid_member_returning{{{array},slot=\"0\"}} 0\n"
        )));
        // Once member 0 is no longer slow and gets its reads back:
        let mut returning = reply.clone();
        returning["array"]["slow_member"] = json!({"slow_slot": null, "returning_slot": 0});
        returning["array"]["members"][0]["returning"] = json!(true);
        let returning_text = exposition(&returning);
        assert!(returning_text.contains(&format!(
            "paraid_member_returning{{{array},slot=\"0\"}} 1\n"
        )));
        assert!(returning_text.contains(&format!(
            "paraid_member_returning{{{array},slot=\"1\"}} 0\n"
        )));
        assert!(text.contains(&format!("paraid_steered_reads_total{{{array}}} 42\n")));
        assert!(text.contains(&format!("paraid_slow_member_probes_total{{{array}}} 3\n")));
        assert!(text.contains(&format!("paraid_slow_member_returns_total{{{array}}} 2\n")));
        assert!(
            !text.contains("paraid_parity_batches_total"),
            "a CPU backend keeps no batch counts"
        );
        assert!(text.contains(&format!(
            "paraid_sync_progress_ratio{{{array},kind=\"rebuild\"}} 0.25\n"
        )));
        assert!(text.contains(&format!(
            "paraid_sync_rate_bytes_per_second{{{array},kind=\"rebuild\"}} 7\n"
        )));
        assert!(text.contains(&format!("paraid_log_rides_total{{{array}}} 5\n")));
        assert!(text.contains(&format!("paraid_log_rounds_total{{{array}}} 11\n")));
        assert!(text.contains(&format!("paraid_bitmap_dirty_regions{{{array}}} 3\n")));
        assert!(
            !text.contains("paraid_io_requests_total{"),
            "no io, no samples"
        );
    }
}
