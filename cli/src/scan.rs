//! `list`: one task's units as the store found them (Redis: `SCAN` on every server that holds
//! keys; PostgreSQL: one query per page), each turned into an [`Entry`].

use std::collections::BTreeMap;

use idempotask::operator::Marker;
use idempotask_postgres::operator::StoredUnit;
use serde::Serialize;

use crate::stored::{Seen, belongs_to, preview, result_json};
use crate::time::millis;

/// One unit of a task that is done, locked or in doubt, or a key under the task's pattern that
/// is odd.
#[derive(Debug, Serialize)]
pub(crate) struct Entry {
    /// The plain caller key, read from the marker (Redis) or the row (PostgreSQL); Redis locks
    /// alone do not know it, and a marker written for another key does not give its key to
    /// this one.
    pub(crate) key: Option<String>,
    /// The digest of the caller key, as in the Redis key.
    pub(crate) digest: String,
    pub(crate) done: bool,
    pub(crate) locked: bool,
    /// A lock that ran out without a release or a result, still remembered.
    pub(crate) in_doubt: bool,
    pub(crate) fencing_token: Option<u64>,
    pub(crate) result: Option<serde_json::Value>,
    pub(crate) marker_ttl_ms: Option<u64>,
    pub(crate) lock_ttl_ms: Option<u64>,
    /// For a lock: `false` when it has no expiry (and `lock_ttl_ms` is null).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) lock_expires: Option<bool>,
    /// For a unit in doubt: how long ago its lock ran out.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) expired_for_ms: Option<u64>,
    /// For a unit in doubt: how long the store remembers it still.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) forgotten_in_ms: Option<u64>,
    /// A stable word for what is wrong with the key: `unreadable`, `key_mismatch`,
    /// `wrong_type`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) problem: Option<&'static str>,
    /// For a `key_mismatch`: the caller key the marker names.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) stored_key: Option<String>,
    /// What is wrong with the key, in words.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<String>,
}

/// What the store found for one task.
#[derive(Debug, Default)]
pub(crate) struct Listing {
    /// Done, locked and in-doubt units and odd keys, by digest.
    pub(crate) entries: BTreeMap<String, Entry>,
    /// Every key of the task, released fenced locks included.
    pub(crate) keys_seen: usize,
    /// How many servers were scanned: 1, or a cluster's masters.
    pub(crate) servers_scanned: usize,
}

/// Input: a PostgreSQL row of `task`. Output: its digest and entry (the row names its key, so
/// the entry does too).
pub(crate) fn describe_row(task: &str, row: StoredUnit) -> Option<(String, Entry)> {
    let key = String::from_utf8_lossy(&row.key).into_owned();
    let digest = idempotask::store::UnitOfWork::with_limit(task, &key, usize::MAX)
        .map(|unit| unit.digest().to_owned())
        .ok()?;
    let mut entry = describe(task, &digest, Seen::from_postgres(Some(row)))?;
    // The row's key is the unit's, whatever its marker says.
    if entry.key.is_none() {
        entry.key = Some(key);
    }
    Some((digest, entry))
}

/// Input: a task, a digest and what its unit holds. Output: its entry, `None` for a unit that
/// holds neither a marker, a lock (held or in doubt) nor anything odd.
pub(crate) fn describe(task: &str, digest: &str, seen: Seen) -> Option<Entry> {
    let mut entry = Entry {
        key: None,
        digest: digest.to_owned(),
        done: false,
        locked: false,
        in_doubt: false,
        fencing_token: None,
        result: None,
        marker_ttl_ms: None,
        lock_ttl_ms: None,
        lock_expires: None,
        expired_for_ms: None,
        forgotten_in_ms: None,
        problem: None,
        stored_key: None,
        error: None,
    };
    match seen {
        Seen::Missing => return None,
        Seen::Lock {
            fencing_token, ttl, ..
        } => {
            entry.locked = true;
            entry.lock_ttl_ms = ttl.map(millis);
            entry.lock_expires = Some(ttl.is_some());
            entry.fencing_token = fencing_token;
        }
        Seen::InDoubt {
            fencing_token,
            expired_for,
            forgotten_in,
            ..
        } => {
            entry.in_doubt = true;
            entry.fencing_token = fencing_token;
            entry.expired_for_ms = Some(millis(expired_for));
            entry.forgotten_in_ms = Some(millis(forgotten_in));
        }
        Seen::Marker { ttl, marker, .. } => {
            entry.done = true;
            entry.marker_ttl_ms = ttl.map(millis);
            describe_marker(&mut entry, marker, task, digest);
        }
        Seen::Foreign { bytes } => {
            entry.problem = Some("unreadable");
            entry.error = Some(format!(
                "holds {}, which is not idempotask's",
                preview(&bytes)
            ));
        }
        Seen::OtherType(kind) => {
            entry.problem = Some("wrong_type");
            entry.error = Some(format!(
                "a {kind} key; idempotask writes only strings, so something else uses this name"
            ));
        }
    }
    Some(entry)
}

fn describe_marker(
    entry: &mut Entry,
    marker: Result<Marker, idempotask::operator::MarkerError>,
    task: &str,
    digest: &str,
) {
    match marker {
        Ok(marker) if belongs_to(&marker, task, digest) => {
            entry.key = Some(marker.key().to_owned());
            entry.fencing_token = marker.fencing_token();
            entry.result = Some(result_json(&marker));
        }
        Ok(marker) => {
            entry.problem = Some("key_mismatch");
            entry.error = Some(format!(
                "the marker names key `{}`, whose digest is not this key's; a forged value or a digest collision (`status` refuses it, `forget --force` deletes it)",
                marker.key()
            ));
            entry.stored_key = Some(marker.key().to_owned());
        }
        Err(err) => {
            entry.problem = Some("unreadable");
            entry.error = Some(format!("unreadable marker: {err}"));
        }
    }
}
