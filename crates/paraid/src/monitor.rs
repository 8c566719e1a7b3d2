//! `paraid monitor`: watches a running array through its control socket and reports what changes, as
//! `mdadm --monitor` does for md arrays: a line per event (or a JSON object with `--json`), and a program run for
//! each (`--program`), so that a failed drive pages someone instead of waiting for the next `paraid status`.
//!
//! Events are found by comparing two status snapshots (`events`, a pure function: the tests feed it snapshots),
//! taken `--delay-s` apart. Names follow mdadm's where it has one: `Fail`, `FailSpare`, `SpareActive`,
//! `DegradedArray`, `RebuildStarted`, `RebuildNN` (20, 40, 60, 80), `RebuildFinished` (for every background job:
//! rebuild, check, repair, resync, as mdadm reports resync and check under the same names), `DeviceDisappeared`
//! (the server is gone), `TestMessage` (`--test`); paraid's own: `ArrayFailed` (beyond its tolerance),
//! `CheckMismatches` (a check or repair that found parity not matching its data), `MemberErrors` (a member in
//! service failed I/Os: a drive going bad before it is evicted), `SlowMember` and `SlowMemberRecovered`. What a
//! poll cannot see: a job that started and ended between two snapshots is reported by its end alone, and of two
//! that ended between them only the later one (`last_result` holds one).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

use crate::cli::MonitorArgs;
use crate::commands::CommandResult;
use crate::control::request;

/// One change worth telling someone about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// mdadm's name where it has one (module doc).
    pub name: String,
    pub slot: Option<u64>,
    pub member: Option<String>,
    /// A sentence for people.
    pub detail: String,
}

impl Event {
    fn new(name: &str, slot: Option<u64>, member: Option<&str>, detail: String) -> Event {
        Event {
            name: name.to_string(),
            slot,
            member: member.map(str::to_string),
            detail,
        }
    }
}

/// Progress marks reported as `RebuildNN`, as mdadm's default `--increment` of 20.
const PERCENT_MARKS: [u64; 4] = [20, 40, 60, 80];

fn members(array: &Value) -> &[Value] {
    array["members"].as_array().map_or(&[], Vec::as_slice)
}

fn active_count(array: &Value) -> usize {
    members(array)
        .iter()
        .filter(|m| m["state"].as_str() == Some("active"))
        .count()
}

fn degraded(array: &Value) -> bool {
    active_count(array) < members(array).len()
}

/// The status entry of `slot`.
fn slot_member(array: &Value, slot: u64) -> Option<&Value> {
    members(array)
        .iter()
        .find(|m| m["slot"].as_u64() == Some(slot))
}

/// A path field of `slot`'s entry ("path", "replacement"), where it names one.
fn slot_path<'a>(array: &'a Value, slot: u64, field: &str) -> Option<&'a str> {
    slot_member(array, slot)
        .and_then(|m| m[field].as_str())
        .filter(|p| !p.is_empty())
}

fn member_path(array: &Value, slot: u64) -> Option<&str> {
    slot_path(array, slot, "path")
}

/// The member a job on `slot` writes: a live replacement's new member while it is built, else the slot's own.
fn job_target(array: &Value, slot: u64) -> Option<&str> {
    slot_path(array, slot, "replacement").or_else(|| member_path(array, slot))
}

fn slow_slot(array: &Value) -> Option<u64> {
    array["slow_member"]["slow_slot"].as_u64()
}

/// Which job a `progress` object is (its kind and slot): a new identity is a new job.
fn job(progress: &Value) -> Option<(String, Option<u64>)> {
    let kind = progress["kind"].as_str()?;
    Some((kind.to_string(), progress["slot"].as_u64()))
}

fn job_name(progress: &Value) -> String {
    match (progress["kind"].as_str(), progress["slot"].as_u64()) {
        (Some(kind), Some(slot)) => format!("{kind} of slot {slot}"),
        (Some(kind), None) => kind.to_string(),
        _ => "a job".to_string(),
    }
}

fn percent(progress: &Value) -> f64 {
    progress["percent"].as_f64().unwrap_or(0.0)
}

fn array_failed() -> Event {
    let detail = "the array is beyond its tolerance and serves nothing".to_string();
    Event::new("ArrayFailed", None, None, detail)
}

fn degraded_array(array: &Value) -> Event {
    let detail = format!(
        "{} of {} members active",
        active_count(array),
        members(array).len()
    );
    Event::new("DegradedArray", None, None, detail)
}

fn slow_member(array: &Value, slot: u64) -> Event {
    let detail = format!("slot {slot} is far slower than its peers; reads go around it");
    Event::new("SlowMember", Some(slot), member_path(array, slot), detail)
}

/// What the array's state says at the first look: the conditions that need someone now.
fn standing(array: &Value) -> Vec<Event> {
    let mut out = Vec::new();
    if array["failed"].as_bool() == Some(true) {
        out.push(array_failed());
    } else if degraded(array) {
        out.push(degraded_array(array));
    }
    out.extend(slow_slot(array).map(|slot| slow_member(array, slot)));
    out
}

/// The events between two snapshots of `status`'s `array` object (`before` None: the first look).
pub fn events(before: Option<&Value>, now: &Value) -> Vec<Event> {
    let Some(before) = before else {
        return standing(now);
    };
    let mut out = Vec::new();
    for member in members(now) {
        let Some(slot) = member["slot"].as_u64() else {
            continue;
        };
        let previous = slot_member(before, slot);
        let was = previous.and_then(|m| m["state"].as_str());
        let is = member["state"].as_str();
        let out_of_service = matches!(is, Some("faulty" | "missing"));
        // Counted per member: a new member in the slot starts from none.
        let errors_before = previous
            .filter(|m| m["path"] == member["path"])
            .and_then(|m| m["errors"].as_u64())
            .unwrap_or(0);
        let errors = member["errors"].as_u64().unwrap_or(0);
        // A member still in service that failed I/Os (past the retry): a drive going bad before it is evicted.
        if errors > errors_before && !out_of_service {
            out.push(Event::new(
                "MemberErrors",
                Some(slot),
                member_path(now, slot),
                format!(
                    "slot {slot}: {} failed I/Os since the last look ({errors} since the array started)",
                    errors - errors_before
                ),
            ));
        }
        match (was, is) {
            (Some("active"), _) if out_of_service => out.push(Event::new(
                "Fail",
                Some(slot),
                member_path(before, slot),
                match is {
                    Some("faulty") => format!("slot {slot} marked faulty"),
                    _ => format!("slot {slot} went missing"),
                },
            )),
            (Some("rebuilding"), _) if out_of_service => out.push(Event::new(
                "FailSpare",
                Some(slot),
                member_path(before, slot),
                format!("the member being rebuilt into slot {slot} failed"),
            )),
            // From rebuilding, or from out of service when the rebuild ran between two looks.
            (Some("rebuilding" | "faulty" | "missing"), Some("active")) => out.push(Event::new(
                "SpareActive",
                Some(slot),
                member_path(now, slot),
                format!("slot {slot} is rebuilt and active"),
            )),
            // A live replacement (`paraid replace`) took the slot over: the new member serves it.
            (Some("active"), Some("active"))
                if previous.map(|m| &m["path"]) != Some(&member["path"]) =>
            {
                out.push(Event::new(
                    "SpareActive",
                    Some(slot),
                    member_path(now, slot),
                    format!("slot {slot} is served by its replacement"),
                ))
            }
            _ => {}
        }
    }
    if now["failed"].as_bool() == Some(true) && before["failed"].as_bool() != Some(true) {
        out.push(array_failed());
    } else if degraded(now) && !degraded(before) {
        out.push(degraded_array(now));
    }
    out.extend(job_events(before, now));
    match (slow_slot(before), slow_slot(now)) {
        (was, Some(slot)) if was != Some(slot) => out.push(slow_member(now, slot)),
        (Some(slot), None) => out.push(Event::new(
            "SlowMemberRecovered",
            Some(slot),
            member_path(now, slot),
            format!("slot {slot} is no slower than its peers again"),
        )),
        _ => {}
    }
    out
}

/// Background jobs: one that ended (its `last_result` is new), one that started, the marks one passed.
fn job_events(before: &Value, now: &Value) -> Vec<Event> {
    let mut out = Vec::new();
    let result = &now["last_result"];
    if !result.is_null() && *result != before["last_result"] {
        let outcome = result["outcome"].as_str().unwrap_or("ended");
        let mut detail = format!("{} {outcome}", job_name(result));
        let mismatches = result["mismatches"].as_u64().unwrap_or(0);
        let checking = matches!(result["kind"].as_str(), Some("check" | "repair"));
        if checking {
            detail += &format!(
                ": {mismatches} mismatched stripes, {} repaired",
                result["repaired"].as_u64().unwrap_or(0)
            );
        }
        let unreadable = result["unreadable"].as_array().map_or(0, Vec::len);
        if unreadable > 0 {
            detail += &format!(", {unreadable} unreadable ranges");
        }
        out.push(Event::new(
            "RebuildFinished",
            result["slot"].as_u64(),
            result["slot"].as_u64().and_then(|s| member_path(now, s)),
            detail.clone(),
        ));
        if checking && mismatches > 0 {
            out.push(Event::new("CheckMismatches", None, None, detail));
        }
    }
    let progress = &now["progress"];
    let Some(running) = job(progress) else {
        return out;
    };
    let slot = progress["slot"].as_u64();
    let member = slot.and_then(|s| job_target(now, s));
    let previous = &before["progress"];
    let passed_from = if job(previous).as_ref() == Some(&running) {
        percent(previous)
    } else {
        out.push(Event::new(
            "RebuildStarted",
            slot,
            member,
            format!("{} started", job_name(progress)),
        ));
        0.0
    };
    let at = percent(progress);
    for mark in PERCENT_MARKS {
        if passed_from < mark as f64 && at >= mark as f64 {
            out.push(Event::new(
                &format!("Rebuild{mark}"),
                slot,
                member,
                format!("{} at {at:.0} %", job_name(progress)),
            ));
        }
    }
    out
}

fn unix_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Prints `event` and runs the program for it: `PROGRAM EVENT CONTROL [MEMBER]` (mdadm's order: event, array,
/// member), with the rest in `PARAID_*` variables. A program that cannot start or fails is reported on stderr;
/// monitoring goes on.
fn report(event: &Event, array: &Value, control: &Path, args: &MonitorArgs) {
    let name = array["name"].as_str().unwrap_or("");
    let uuid = array["uuid"].as_str().unwrap_or("");
    if args.json {
        println!(
            "{}",
            json!({"event": event.name, "array": name, "uuid": uuid, "control": control,
                   "slot": event.slot, "member": event.member, "detail": event.detail, "unix_s": unix_s()})
        );
    } else {
        let member = event
            .member
            .as_ref()
            .map_or(String::new(), |m| format!(" {m}"));
        println!(
            "paraid monitor: {} on array '{name}'{member}: {}",
            event.name, event.detail
        );
    }
    let Some(program) = &args.program else {
        return;
    };
    let mut command = Command::new(program);
    command
        .arg(&event.name)
        .arg(control)
        .args(event.member.iter())
        .env("PARAID_EVENT", &event.name)
        .env("PARAID_ARRAY", name)
        .env("PARAID_UUID", uuid)
        .env("PARAID_CONTROL", control)
        .env("PARAID_DETAIL", &event.detail)
        .env("PARAID_MEMBER", event.member.as_deref().unwrap_or(""))
        .env(
            "PARAID_SLOT",
            event.slot.map_or(String::new(), |s| s.to_string()),
        );
    match command.status() {
        Ok(status) if status.success() => {}
        Ok(status) => eprintln!(
            "paraid monitor: {} {}: {status}",
            program.display(),
            event.name
        ),
        Err(e) => eprintln!(
            "paraid monitor: cannot run {} for {}: {e}",
            program.display(),
            event.name
        ),
    }
}

/// Whether a server still listens on `control` (a reply that failed otherwise, a timeout of a busy server, is
/// not the server gone).
fn listening(control: &Path) -> bool {
    std::os::unix::net::UnixStream::connect(control).is_ok()
}

/// One array watched: its control socket and the last look at it.
struct Watched<'a> {
    control: &'a Path,
    before: Value,
}

fn look(control: &Path) -> Result<Value, String> {
    Ok(request(control, &json!({"op": "status"}))?["array"].clone())
}

pub fn run(args: MonitorArgs) -> CommandResult {
    if args.delay_s == 0 {
        return Err("--delay-s must be at least 1".to_string());
    }
    // Every array must answer the first look: a control socket named wrong is an error, not an event.
    let mut watched = Vec::new();
    for control in &args.control {
        watched.push(Watched {
            control,
            before: look(control)?,
        });
    }
    for w in &watched {
        if args.test {
            let test = "a test of the monitor's reports".to_string();
            report(
                &Event::new("TestMessage", None, None, test),
                &w.before,
                w.control,
                &args,
            );
        }
        for event in events(None, &w.before) {
            report(&event, &w.before, w.control, &args);
        }
    }
    if args.oneshot {
        return Ok(());
    }
    // Until the last array's server is gone.
    while !watched.is_empty() {
        std::thread::sleep(Duration::from_secs(args.delay_s));
        watched.retain_mut(|w| match look(w.control) {
            Ok(now) => {
                for event in events(Some(&w.before), &now) {
                    report(&event, &now, w.control, &args);
                }
                w.before = now;
                true
            }
            Err(_) if !listening(w.control) => {
                let gone = "the array's server is gone (stopped or killed)".to_string();
                report(
                    &Event::new("DeviceDisappeared", None, None, gone),
                    &w.before,
                    w.control,
                    &args,
                );
                false
            }
            Err(e) => {
                eprintln!("paraid monitor: {e}; trying again");
                true
            }
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(slot: u64, path: &str, state: &str) -> Value {
        json!({"slot": slot, "path": path, "state": state})
    }

    fn array(states: &[&str]) -> Value {
        let members: Vec<Value> = states
            .iter()
            .enumerate()
            .map(|(i, s)| member(i as u64, &format!("m{i}"), s))
            .collect();
        json!({"name": "a", "failed": false, "members": members, "progress": null, "last_result": null,
               "slow_member": {"slow_slot": null}})
    }

    fn names(events: &[Event]) -> Vec<&str> {
        events.iter().map(|e| e.name.as_str()).collect()
    }

    #[test]
    fn a_healthy_array_says_nothing_and_a_degraded_one_says_so_at_the_first_look() {
        let healthy = array(&["active"; 4]);
        assert!(events(None, &healthy).is_empty());
        assert!(events(Some(&healthy), &healthy).is_empty());
        let degraded = array(&["active", "missing", "active", "active"]);
        let first = events(None, &degraded);
        assert_eq!(names(&first), ["DegradedArray"]);
        assert_eq!(first[0].detail, "3 of 4 members active");
        // Still degraded: not said again.
        assert!(events(Some(&degraded), &degraded).is_empty());
    }

    #[test]
    fn a_member_failing_then_a_spare_rebuilding_it() {
        let healthy = array(&["active"; 4]);
        let failed = array(&["active", "active", "faulty", "active"]);
        let mut erring = healthy.clone();
        erring["members"][2]["errors"] = json!(3);
        let got = events(Some(&healthy), &erring);
        assert_eq!(names(&got), ["MemberErrors"]);
        assert_eq!(
            got[0].detail,
            "slot 2: 3 failed I/Os since the last look (3 since the array started)"
        );
        assert!(events(Some(&erring), &erring).is_empty());
        // Another member in the slot (a replacement took it over): its errors are its own.
        let mut replaced = erring.clone();
        replaced["members"][2]["path"] = json!("new");
        replaced["members"][2]["errors"] = json!(1);
        let got = events(Some(&erring), &replaced);
        assert_eq!(names(&got), ["MemberErrors", "SpareActive"]);
        assert_eq!(got[0].member.as_deref(), Some("new"));
        assert_eq!(
            got[0].detail,
            "slot 2: 1 failed I/Os since the last look (1 since the array started)"
        );
        let got = events(Some(&healthy), &failed);
        assert_eq!(names(&got), ["Fail", "DegradedArray"]);
        assert_eq!(
            (got[0].slot, got[0].member.as_deref()),
            (Some(2), Some("m2"))
        );

        let mut rebuilding = array(&["active", "active", "rebuilding", "active"]);
        rebuilding["members"][2]["path"] = json!("spare");
        rebuilding["progress"] = json!({"kind": "rebuild", "slot": 2, "percent": 45.0});
        let got = events(Some(&failed), &rebuilding);
        assert_eq!(names(&got), ["RebuildStarted", "Rebuild20", "Rebuild40"]);
        assert_eq!(got[0].member.as_deref(), Some("spare"));

        let mut further = rebuilding.clone();
        further["progress"]["percent"] = json!(85.0);
        assert_eq!(
            names(&events(Some(&rebuilding), &further)),
            ["Rebuild60", "Rebuild80"]
        );

        // A rebuild that ran between two looks: the slot went from faulty to active, the result is new.
        let mut quick = array(&["active"; 4]);
        quick["last_result"] = json!({"kind": "rebuild", "slot": 2, "outcome": "completed"});
        assert_eq!(
            names(&events(Some(&failed), &quick)),
            ["SpareActive", "RebuildFinished"]
        );

        let mut done = array(&["active"; 4]);
        done["members"][2]["path"] = json!("spare");
        done["last_result"] = json!({"kind": "rebuild", "slot": 2, "outcome": "completed", "percent": 100.0,
                                     "mismatches": 0, "repaired": 0, "unreadable": []});
        let got = events(Some(&further), &done);
        assert_eq!(names(&got), ["SpareActive", "RebuildFinished"]);
        assert_eq!(got[1].detail, "rebuild of slot 2 completed");
        assert!(
            events(Some(&done), &done).is_empty(),
            "the same result is not a new one"
        );
    }

    #[test]
    fn a_replacement_taking_its_slot_over() {
        let healthy = array(&["active"; 4]);
        let mut building = healthy.clone();
        building["members"][3]["replacement"] = json!("new3");
        building["progress"] = json!({"kind": "rebuild", "slot": 3, "percent": 1.0});
        let got = events(Some(&healthy), &building);
        assert_eq!(names(&got), ["RebuildStarted"]);
        assert_eq!(
            got[0].member.as_deref(),
            Some("new3"),
            "the member being built"
        );
        let mut replaced = healthy.clone();
        replaced["members"][3]["path"] = json!("new3");
        let got = events(Some(&healthy), &replaced);
        assert_eq!(names(&got), ["SpareActive"]);
        assert_eq!(
            (got[0].member.as_deref(), got[0].detail.as_str()),
            (Some("new3"), "slot 3 is served by its replacement")
        );
    }

    #[test]
    fn a_rebuild_target_failing_and_the_array_failing() {
        let rebuilding = array(&["active", "rebuilding", "active", "missing"]);
        let lost = array(&["active", "faulty", "active", "missing"]);
        assert_eq!(names(&events(Some(&rebuilding), &lost)), ["FailSpare"]);
        let mut beyond = array(&["active", "faulty", "faulty", "missing"]);
        beyond["failed"] = json!(true);
        assert_eq!(
            names(&events(Some(&lost), &beyond)),
            ["Fail", "ArrayFailed"]
        );
        assert_eq!(names(&events(None, &beyond)), ["ArrayFailed"]);
    }

    #[test]
    fn a_check_that_finds_mismatches_and_one_that_ends_between_looks() {
        let idle = array(&["active"; 4]);
        let mut checked = idle.clone();
        checked["last_result"] = json!({"kind": "check", "slot": null, "outcome": "completed",
                                        "mismatches": 3, "repaired": 0, "unreadable": []});
        let got = events(Some(&idle), &checked);
        assert_eq!(names(&got), ["RebuildFinished", "CheckMismatches"]);
        assert_eq!(
            got[1].detail,
            "check completed: 3 mismatched stripes, 0 repaired"
        );
        // A job ended and the next started between two looks: both said.
        let mut next = checked.clone();
        next["last_result"]["kind"] = json!("repair");
        next["last_result"]["mismatches"] = json!(0);
        next["progress"] = json!({"kind": "resync", "slot": null, "percent": 5.0});
        assert_eq!(
            names(&events(Some(&checked), &next)),
            ["RebuildFinished", "RebuildStarted"]
        );
    }

    #[test]
    fn a_slow_member_found_and_recovered() {
        let idle = array(&["active"; 4]);
        let mut slow = idle.clone();
        slow["slow_member"]["slow_slot"] = json!(1);
        let got = events(Some(&idle), &slow);
        assert_eq!(names(&got), ["SlowMember"]);
        assert_eq!(got[0].member.as_deref(), Some("m1"));
        assert_eq!(names(&events(Some(&slow), &idle)), ["SlowMemberRecovered"]);
        assert_eq!(names(&events(None, &slow)), ["SlowMember"]);
    }
}
