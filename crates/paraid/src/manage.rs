//! What the control socket can ask of a running array. Each operation validates its arguments and answers
//! with a JSON object, or one line saying what is wrong.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use paraid_engine::{Array, NewMember};
use serde_json::{json, Value};

/// Operations that change the array run one at a time (the control socket answers each client on a thread of
/// its own): an `add` choosing a slot while another takes it, say.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

pub fn dispatch(op: &str, request: &Value, array: &Array) -> Result<Value, String> {
    let _one = (op != "status").then(|| ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner()));
    match op {
        "status" => status(array),
        "fail" => {
            let slot = resolve_member(request, array)?;
            // Failing a member that no longer serves changes nothing (as with mdadm); the reply says so.
            let state_before = array.slot_state(slot);
            array.fail_member(slot).map_err(|e| e.to_string())?;
            Ok(json!({ "slot": slot, "state_before": state_before }))
        }
        "remove" => {
            let slot = resolve_member(request, array)
                .or_else(|e| resolve_spare(request, array).ok_or(e))?;
            array.remove_member(slot).map_err(|e| e.to_string())?;
            Ok(json!({ "slot": slot }))
        }
        "add" => {
            let path = path_field(request)?;
            let outcome = array
                .add_member(NewMember::Path(path))
                .map_err(|e| e.to_string())?;
            Ok(
                json!({ "outcome": serde_json::to_value(&outcome).unwrap_or(Value::Null),
                       "rebuilding_slot": outcome.rebuilding_slot(),
                       "re_added": matches!(outcome, paraid_engine::AddOutcome::ReAdded { .. }) }),
            )
        }
        "replace" => {
            let slot = resolve_member(request, array)?;
            let path = path_field(request)?;
            array
                .replace_member(slot, NewMember::Path(path))
                .map_err(|e| e.to_string())?;
            Ok(json!({ "slot": slot }))
        }
        "check" => {
            let repair = request["repair"].as_bool().unwrap_or(false);
            // A rebuild or resync under way goes first; the check waits for it.
            let behind = array.progress().map(|p| p.kind);
            array.start_check(repair).map_err(|e| e.to_string())?;
            Ok(
                json!({ "started": if repair { "repair" } else { "check" }, "queued_behind": behind }),
            )
        }
        "speed" => {
            let min = u64_field(request, "min_bytes_per_s")?;
            let max = u64_field(request, "max_bytes_per_s")?;
            if max != 0 && min > max {
                return Err(format!(
                    "minimum speed {min} B/s is above the maximum {max} B/s"
                ));
            }
            array.set_sync_speed(min, max);
            Ok(json!({ "min_bytes_per_s": min, "max_bytes_per_s": max }))
        }
        "" => Err("the request has no \"op\"".to_string()),
        other => Err(format!("unknown operation '{other}'")),
    }
}

fn status(array: &Array) -> Result<Value, String> {
    let mut detail =
        serde_json::to_value(array.detail()).map_err(|e| format!("encoding the status: {e}"))?;
    detail["last_result"] = serde_json::to_value(array.last_result()).unwrap_or(Value::Null);
    for key in ["progress", "last_result"] {
        add_percent(&mut detail[key]);
    }
    Ok(json!({ "array": detail }))
}

/// `percent` beside `done_bytes` and `total_bytes`, as people read progress.
fn add_percent(progress: &mut Value) {
    if let (Some(done), Some(total)) = (
        progress["done_bytes"].as_u64(),
        progress["total_bytes"].as_u64(),
    ) {
        let percent = if total == 0 {
            100.0
        } else {
            done as f64 * 100.0 / total as f64
        };
        progress["percent"] = json!((percent * 10.0).round() / 10.0);
    }
}

fn u64_field(request: &Value, name: &str) -> Result<u64, String> {
    request[name]
        .as_u64()
        .ok_or_else(|| format!("the request needs \"{name}\" (a number of bytes per second)"))
}

fn path_field(request: &Value) -> Result<PathBuf, String> {
    request["path"]
        .as_str()
        .map(PathBuf::from)
        .ok_or_else(|| "the request needs \"path\" (the new member)".to_string())
}

/// A member named by slot number or by path (compared after resolving links, as the CLI sends canonical paths).
fn resolve_member(request: &Value, array: &Array) -> Result<usize, String> {
    let text = match &request["member"] {
        Value::String(text) => text.clone(),
        Value::Number(n) => n.to_string(),
        _ => {
            return Err("the request needs \"member\" (a slot number or a member path)".to_string())
        }
    };
    let detail = array.detail();
    if let Ok(slot) = text.parse::<usize>() {
        return if slot < detail.members.len() {
            Ok(slot)
        } else {
            Err(format!(
                "slot {slot} does not exist: the array has slots 0 to {}",
                detail.members.len() - 1
            ))
        };
    }
    let wanted = canonical(Path::new(&text));
    detail
        .members
        .iter()
        .find(|m| !m.path.is_empty() && canonical(Path::new(&m.path)) == wanted)
        .map(|m| m.slot)
        .ok_or_else(|| format!("{text} is not a member of this array"))
}

/// A hot spare named by path: its slot table entry.
fn resolve_spare(request: &Value, array: &Array) -> Option<usize> {
    let wanted = canonical(Path::new(request["member"].as_str()?));
    array
        .spare_entries()
        .into_iter()
        .find(|(_, label)| canonical(Path::new(label)) == wanted)
        .map(|(entry, _)| entry)
}

fn canonical(path: &Path) -> PathBuf {
    std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf())
}
