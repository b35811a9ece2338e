//! Text for people; the JSON documents are built next to the commands.

use std::fmt::Write;
use std::time::Duration;

use idempotask::ops::{Done, Marker, StoredResult};
use idempotask::store::UnitOfWork;
use serde_json::Value;

use crate::scan::Entry;
use crate::time::human;

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

pub(crate) fn done(unit: &UnitOfWork, done: &Done) -> String {
    let mut text = format!("{} {:?}: done\n", unit.task(), unit.key());
    if let Some(token) = done.marker.fencing_token() {
        let _ = writeln!(text, "  fencing token  {token}");
    }
    let _ = writeln!(text, "  result         {}", result_json(&done.marker));
    let expiry = done
        .ttl
        .map_or_else(|| "never".to_owned(), |ttl| format!("in {}", human(ttl)));
    let _ = write!(text, "  expires        {expiry}");
    text
}

pub(crate) fn locked(unit: &UnitOfWork, lock_ttl: Duration, age_ms: Option<u64>) -> String {
    let mut text = format!(
        "{} {:?}: locked (a delivery is running it)\n  lock expires   in {}",
        unit.task(),
        unit.key(),
        human(lock_ttl)
    );
    if let Some(age) = age_ms {
        let _ = write!(
            text,
            "\n  token age      about {}",
            human(Duration::from_millis(age))
        );
    }
    text
}

pub(crate) fn unknown(unit: &UnitOfWork, namespace: &str, task_has_keys: bool) -> String {
    let mut text = format!(
        "{} {:?}: unknown (never ran, failed, expired or forgotten); a delivery will run it",
        unit.task(),
        unit.key()
    );
    if !task_has_keys {
        let _ = write!(
            text,
            "\n  note: task `{}` has no keys at all in namespace `{namespace}`; check --task and --namespace",
            unit.task()
        );
    }
    text
}

pub(crate) fn listing(
    task: &str,
    namespace: &str,
    cluster_masters: Option<usize>,
    done: usize,
    locked: usize,
    entries: &[&Entry],
) -> String {
    let mut text = format!("{task} in namespace {namespace}: {done} done, {locked} locked");
    if let Some(masters) = cluster_masters {
        let _ = write!(text, " (on {masters} cluster masters)");
    }
    for entry in entries {
        let state = if entry.done { "done" } else { "locked" };
        let name = entry.key.as_ref().map_or_else(
            || format!("digest:{}", &entry.digest),
            |key| format!("{key:?}"),
        );
        let _ = write!(text, "\n{state:<6}  {name}");
        if let Some(token) = entry.fencing_token {
            let _ = write!(text, "  fencing token {token}");
        }
        if let Some(ms) = entry.lock_ttl_ms {
            let _ = write!(
                text,
                "  lock expires in {}",
                human(Duration::from_millis(ms))
            );
        }
        if let Some(err) = &entry.error {
            let _ = write!(text, "  unreadable marker: {err}");
        }
    }
    text
}
