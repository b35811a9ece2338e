//! What one unit holds, as the commands show it: the core's
//! [`Held`](idempotask::operator::Held), the same on every store, and the few readings of it
//! that `status`, `forget`, `list` and `resolve` share.

use idempotask::operator::{Marker, StoredResult};
use serde_json::Value;

/// A value for people: lossy UTF-8, quoted, cut after 60 characters.
pub(crate) fn preview(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let mut shown: String = text.chars().take(60).collect();
    if text.chars().nth(60).is_some() {
        shown.push('…');
    }
    format!("{shown:?}")
}

/// The stored result as JSON: the value itself, or `{"unstorable": reason}`.
pub(crate) fn result_json(marker: &Marker) -> Value {
    match marker.result() {
        StoredResult::Json(raw) => {
            serde_json::from_str(raw.get()).unwrap_or_else(|_| Value::String(raw.get().into()))
        }
        StoredResult::Unstorable(reason) => serde_json::json!({ "unstorable": reason }),
        _ => Value::Null,
    }
}
