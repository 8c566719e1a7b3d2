//! What the control socket can ask of a running array. Each operation validates its arguments and answers
//! with a JSON object, or one line saying what is wrong.

use paraid_engine::Array;
use serde_json::{json, Value};

pub fn dispatch(op: &str, _request: &Value, array: &Array) -> Result<Value, String> {
    match op {
        "status" => status(array),
        "" => Err("the request has no \"op\"".to_string()),
        other => Err(format!("unknown operation '{other}'")),
    }
}

fn status(array: &Array) -> Result<Value, String> {
    let detail =
        serde_json::to_value(array.detail()).map_err(|e| format!("encoding the status: {e}"))?;
    Ok(json!({ "array": detail }))
}
