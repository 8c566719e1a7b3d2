//! Client side of the management commands: each sends one request to a running array's control socket and prints
//! the reply (text, or `--json`).

use std::io::{IsTerminal, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::cli::{
    AddArgs, CheckArgs, MemberArgs, MetricsArgs, ReplaceArgs, SpeedArgs, StatusArgs, StopArgs,
};
use crate::commands::CommandResult;
use crate::control::request;
use crate::units::{format_bytes, parse_bytes};

fn print_reply(reply: &Value, json_out: bool, text: impl FnOnce(&Value)) {
    if json_out {
        println!("{reply}");
    } else {
        text(reply);
    }
}

pub fn status(args: StatusArgs) -> CommandResult {
    if args.watch {
        return watch(&args.control, args.json);
    }
    let reply = request(&args.control, &json!({"op": "status"}))?;
    print_reply(&reply, args.json, |reply| {
        for line in crate::status_text::status_lines(reply) {
            println!("{line}");
        }
    });
    Ok(())
}

pub fn metrics(args: MetricsArgs) -> CommandResult {
    let reply = request(&args.control, &json!({"op": "status"}))?;
    print!("{}", crate::prometheus::exposition(&reply));
    Ok(())
}

/// `served: ublk /dev/ublkb7 (id 7, taken over after a crash of paraid)` or `served: NBD nbd+unix:///...`, with
/// `; write-back on` when `--write-back` is.
pub fn frontend_line(frontend: &Value) -> Option<String> {
    let line = match frontend["kind"].as_str()? {
        "ublk" => format!(
            "served: ublk {} (id {}{})",
            frontend["device"].as_str().unwrap_or("?"),
            frontend["ublk_id"],
            if frontend["survives_server_crash"].as_bool() == Some(true) {
                ", taken over after a crash of paraid"
            } else {
                ""
            }
        ),
        "nbd" => format!("served: NBD {}", frontend["uri"].as_str().unwrap_or("?")),
        "fuse" => format!(
            "served: the file {} (FUSE)",
            frontend["file"].as_str().unwrap_or("?")
        ),
        _ => return None,
    };
    // Said because it changes what a kill of paraid may lose (writes answered and not yet flushed).
    Some(if frontend["write_back"].as_bool() == Some(true) {
        format!("{line}; write-back on")
    } else {
        line
    })
}

/// One line per kind of request served so far: `io write: 1,204 requests, 18.8 MiB, latency us mean 310, p50
/// 263, p99 1,023, max 4,351`.
pub fn io_lines(io: &Value) -> Vec<String> {
    let Some(kinds) = io.as_object() else {
        return Vec::new();
    };
    let us = |v: &Value| {
        v.as_f64()
            .map_or("-".to_string(), |v| group_digits(v.round() as u64))
    };
    kinds
        .iter()
        .filter(|(_, stats)| stats["requests"].as_u64().unwrap_or(0) > 0)
        .map(|(kind, stats)| {
            let latency = &stats["latency_us"];
            let errors = match stats["errors"].as_u64().unwrap_or(0) {
                0 => String::new(),
                n => format!(", {} failed", group_digits(n)),
            };
            format!(
                "io {kind}: {} requests, {}{errors}, latency us mean {}, p50 {}, p99 {}, max {}",
                group_digits(stats["requests"].as_u64().unwrap_or(0)),
                format_bytes(stats["bytes"].as_u64().unwrap_or(0)),
                us(&latency["mean"]),
                us(&latency["p50"]),
                us(&latency["p99"]),
                us(&latency["max"]),
            )
        })
        .collect()
}

/// 1234567 as "1,234,567".
fn group_digits(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// One line for a progress object: `rebuild slot 3: 45.2% (1.2 GiB of 2.6 GiB), 812 MiB/s, ETA 12 s`.
pub fn progress_line(progress: &Value) -> Option<String> {
    let kind = progress["kind"].as_str()?;
    let done = progress["done_bytes"].as_u64().unwrap_or(0);
    let total = progress["total_bytes"].as_u64().unwrap_or(0).max(1);
    let rate = progress["rate_bytes_per_s"].as_u64().unwrap_or(0);
    let slot = progress["slot"]
        .as_u64()
        .map(|s| format!(" slot {s}"))
        .unwrap_or_default();
    let eta = progress["eta_s"]
        .as_u64()
        .map(|s| format!(", ETA {s} s"))
        .unwrap_or_default();
    let mismatches = match progress["mismatches"].as_u64() {
        Some(n) if kind != "rebuild" => format!(
            ", {n} mismatches, {} repaired",
            progress["repaired"].as_u64().unwrap_or(0)
        ),
        _ => String::new(),
    };
    let in_sync = match progress["in_sync_bytes"].as_u64() {
        Some(n) if n > 0 => format!(", {} of it in sync already (re-add)", format_bytes(n)),
        _ => String::new(),
    };
    Some(format!(
        "{kind}{slot}: {:.1}% ({} of {}{in_sync}), {}/s{eta}{mismatches}",
        done as f64 * 100.0 / total as f64,
        format_bytes(done),
        format_bytes(total),
        format_bytes(rate)
    ))
}

/// Follows the array's progress until it is idle: a redrawn bar on a terminal, one line (or JSON object) a second
/// otherwise; ends with the finished run's result.
fn watch(control: &Path, json_out: bool) -> CommandResult {
    let terminal = std::io::stdout().is_terminal() && !json_out;
    let mut last_print = Instant::now() - Duration::from_secs(10);
    loop {
        let reply = request(control, &json!({"op": "status"}))?;
        let progress = &reply["array"]["progress"];
        if progress.is_null() {
            if terminal {
                println!();
            }
            let result = &reply["array"]["last_result"];
            if json_out {
                println!("{}", json!({"idle": true, "last_result": result}));
            } else if let Some(line) = progress_line(result) {
                println!("finished: {line}");
            } else {
                println!("idle");
            }
            return Ok(());
        }
        if terminal {
            let done = progress["done_bytes"].as_u64().unwrap_or(0) as f64;
            let total = progress["total_bytes"].as_u64().unwrap_or(1).max(1) as f64;
            let width = 30;
            let filled = ((done / total) * width as f64).round() as usize;
            print!(
                "\r[{}{}] {}\x1b[K",
                "#".repeat(filled.min(width)),
                " ".repeat(width - filled.min(width)),
                progress_line(progress).unwrap_or_default()
            );
            let _ = std::io::stdout().flush();
        } else if last_print.elapsed() >= Duration::from_secs(1) {
            if json_out {
                println!("{progress}");
            } else {
                println!("{}", progress_line(progress).unwrap_or_default());
            }
            last_print = Instant::now();
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A member as the server should see it: a slot number as given, a path made absolute here (the server's working
/// directory is not the caller's).
fn member_field(member: &str) -> String {
    if member.parse::<usize>().is_ok() {
        return member.to_string();
    }
    std::fs::canonicalize(member)
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| member.to_string())
}

/// Sends `op` for the member `args` names; without --json prints `paraid: MEMBER (slot N) ` and what `done` says
/// of the reply.
fn member_op(op: &str, args: MemberArgs, done: impl Fn(&Value) -> &'static str) -> CommandResult {
    let reply = request(
        &args.control,
        &json!({"op": op, "member": member_field(&args.member)}),
    )?;
    print_reply(&reply, args.json, |reply| {
        println!(
            "paraid: {} (slot {}) {}",
            args.member,
            reply["slot"],
            done(reply)
        );
    });
    Ok(())
}

pub fn fail(args: MemberArgs) -> CommandResult {
    member_op("fail", args, |reply| match reply["state_before"].as_str() {
        Some("faulty") => "was faulty already; nothing changed",
        Some("missing") => "was missing already; nothing changed",
        _ => "marked faulty; its chunks are now served from the other members",
    })
}

pub fn remove(args: MemberArgs) -> CommandResult {
    member_op("remove", args, |_| "removed from the array")
}

pub fn add(args: AddArgs) -> CommandResult {
    let path =
        std::fs::canonicalize(&args.path).map_err(|e| format!("{}: {e}", args.path.display()))?;
    let reply = request(&args.control, &json!({"op": "add", "path": path}))?;
    print_reply(&reply, args.json, |reply| {
        match reply["rebuilding_slot"].as_u64() {
            Some(slot) if reply["re_added"].as_bool() == Some(true) => println!(
                "paraid: {} re-added to slot {slot}, which it left: only the regions written since are rebuilt",
                path.display()
            ),
            Some(slot) => println!(
                "paraid: {} added and is being rebuilt as slot {slot}",
                path.display()
            ),
            None => println!("paraid: {} added as a hot spare", path.display()),
        }
    });
    Ok(())
}

pub fn replace(args: ReplaceArgs) -> CommandResult {
    let with =
        std::fs::canonicalize(&args.with).map_err(|e| format!("{}: {e}", args.with.display()))?;
    let reply = request(
        &args.control,
        &json!({"op": "replace", "member": member_field(&args.member), "path": with}),
    )?;
    print_reply(&reply, args.json, |reply| {
        println!(
            "paraid: rebuilding slot {} onto {}; {} keeps serving until it is done",
            reply["slot"],
            with.display(),
            args.member
        )
    });
    Ok(())
}

pub fn check(args: CheckArgs) -> CommandResult {
    let reply = request(
        &args.control,
        &json!({"op": "check", "repair": args.repair}),
    )?;
    if !args.wait {
        print_reply(&reply, args.json, |reply| {
            let what = if args.repair {
                "check and repair"
            } else {
                "check"
            };
            let when = match reply["queued_behind"].as_str() {
                Some(job) => format!("queued: it starts when the {job} under way is done"),
                None => "started".to_string(),
            };
            println!(
                "paraid: {what} {when}; follow it with: paraid status --watch --control {}",
                args.control.display()
            )
        });
        return Ok(());
    }
    watch(&args.control, args.json)
}

pub fn speed(args: SpeedArgs) -> CommandResult {
    let min = parse_bytes(&args.min).map_err(|e| format!("--min: {e}"))?;
    let max = parse_bytes(&args.max).map_err(|e| format!("--max: {e}"))?;
    if max != 0 && min > max {
        return Err(format!("--min {} is above --max {}", args.min, args.max));
    }
    let reply = request(
        &args.control,
        &json!({"op": "speed", "min_bytes_per_s": min, "max_bytes_per_s": max}),
    )?;
    print_reply(&reply, args.json, |_| {
        let max_text = if max == 0 {
            "unlimited".to_string()
        } else {
            format!("{}/s", format_bytes(max))
        };
        println!(
            "paraid: rebuild/check speed: at least {}/s, at most {max_text}",
            format_bytes(min)
        )
    });
    Ok(())
}

/// Asks the server to stop, waits for its process to exit, then reads what the stop left in the members'
/// superblocks (what a script needs to know before it reuses them).
pub fn stop(args: StopArgs) -> CommandResult {
    let stopping = request(&args.control, &json!({"op": "stop"}))?;
    let members: Vec<std::path::PathBuf> = stopping["members"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m.as_str())
        .map(std::path::PathBuf::from)
        .collect();
    let pid = stopping["server_pid"]
        .as_u64()
        .ok_or("the server did not say which process it is")? as i32;
    let started = Instant::now();
    let mut told = false;
    while process_running(pid) {
        if let Some(limit_s) = args.timeout_s {
            if started.elapsed() >= Duration::from_secs(limit_s) {
                // The stop was asked for and goes on: killing the server now would leave the array dirty (its
                // next start resyncs), which is the caller's choice to make, not ours.
                return Err(format!(
                    "the server (pid {pid}) was asked to stop but has not exited within {limit_s} s; it goes on \
                     stopping (flushing its members: one may be slow or hung); killing it leaves the array dirty, \
                     to be resynced at its next start"
                ));
            }
        }
        if !told && started.elapsed() > Duration::from_secs(10) {
            eprintln!("paraid: waiting for the server (pid {pid}) to finish stopping");
            told = true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // The stop has happened; what it left is read back from the members it wrote to (none: the array had failed,
    // every member was out).
    let mut reply = json!({"ok": true, "stopped": true, "server_pid": pid});
    // An array beyond its tolerance is stopped as it is, and its members in service may still say dirty: what
    // the caller must know is that it failed (the server said so when asked to stop).
    let failed = stopping["failed"].as_bool() == Some(true);
    let text = if members.is_empty() || failed {
        reply["state"] = json!("failed");
        format!(
            "paraid: stopped (the server, pid {pid}, has exited); the array had failed, beyond its tolerance: it \
             was not marked clean (`paraid detail` of its members says what `serve` of them does)"
        )
    } else {
        match paraid_engine::inspect(&members) {
            Err(e) => {
                reply["state"] = Value::Null;
                reply["read_back_error"] = json!(e.to_string());
                format!("paraid: stopped (the server, pid {pid}, has exited); its members cannot be read back: {e}")
            }
            Ok(detail) => {
                let (name, state) = (detail.identity.name, detail.identity.state);
                reply["name"] = json!(name);
                reply["state"] = json!(state);
                if state == paraid_engine::ArrayState::Clean {
                    format!("paraid: array '{name}' stopped; it is marked clean on every member")
                } else {
                    format!(
                        "paraid: array '{name}' stopped, but it is still marked {} (see the server's log); the next \
                         start resyncs its dirty regions",
                        crate::commands::json_word(&state)
                    )
                }
            }
        }
    };
    print_reply(&reply, args.json, |_| println!("{text}"));
    Ok(())
}

/// Whether process `pid` still runs: it exists and is not a zombie (a server started by a parent that has not
/// yet waited for it has exited all the same).
fn process_running(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state letter follows the command name, which is in parentheses and may hold anything.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next())
            .is_some_and(|state| !matches!(state, 'Z' | 'X' | 'x')),
        // With /proc mounted, no entry means no process.
        Err(_) if Path::new("/proc/self/stat").exists() => false,
        // SAFETY: kill with signal 0 only checks that the process exists.
        Err(_) => unsafe { libc::kill(pid, 0) == 0 },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_frontend_line_says_when_write_back_is_on() {
        let nbd =
            json!({"kind": "nbd", "uri": "nbd+unix:///?socket=/run/p.sock", "write_back": true});
        assert_eq!(
            frontend_line(&nbd).as_deref(),
            Some("served: NBD nbd+unix:///?socket=/run/p.sock; write-back on")
        );
        let ublk =
            json!({"kind": "ublk", "device": "/dev/ublkb3", "ublk_id": 3, "write_back": false});
        assert_eq!(
            frontend_line(&ublk).as_deref(),
            Some("served: ublk /dev/ublkb3 (id 3)")
        );
        let fuse = json!({"kind": "fuse", "file": "/srv/array.img", "write_back": false});
        assert_eq!(
            frontend_line(&fuse).as_deref(),
            Some("served: the file /srv/array.img (FUSE)")
        );
        assert_eq!(frontend_line(&json!({})), None);
    }
}
