//! `list`: one task's units as the store's [`Operator`](idempotask::operator::Operator) lists
//! them, page by page (Redis: `SCAN` on every server that holds keys; PostgreSQL: one query per
//! page), each turned into an [`Entry`].

use std::collections::BTreeMap;

use idempotask::operator::{Held, Listed, Marker, MarkerError};
use serde::Serialize;

use crate::stored::{preview, result_json};
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

/// Input: one unit of a listing. Output: its digest and entry, `None` for a unit that holds
/// neither a marker, a lock (held or in doubt) nor anything odd.
pub(crate) fn describe(listed: &Listed) -> Option<(String, Entry)> {
    let mut entry = Entry {
        key: None,
        digest: listed.digest.clone(),
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
    match &listed.held {
        Held::Nothing => return None,
        Held::Lock {
            fencing_token,
            lock_ttl_remaining: ttl,
            ..
        } => {
            entry.locked = true;
            entry.lock_ttl_ms = ttl.map(millis);
            entry.lock_expires = Some(ttl.is_some());
            entry.fencing_token = *fencing_token;
        }
        Held::InDoubt {
            fencing_token,
            expired_for,
            forgotten_in,
            ..
        } => {
            entry.in_doubt = true;
            entry.fencing_token = *fencing_token;
            entry.expired_for_ms = Some(millis(*expired_for));
            entry.forgotten_in_ms = Some(millis(*forgotten_in));
        }
        Held::Marker { ttl, marker, .. } => {
            entry.done = true;
            entry.marker_ttl_ms = ttl.map(millis);
            describe_marker(&mut entry, listed.own_marker(), marker);
        }
        Held::Foreign { bytes, .. } => {
            entry.problem = Some("unreadable");
            entry.error = Some(format!(
                "holds {}, which is not idempotask's",
                preview(bytes)
            ));
        }
        Held::OtherType { kind, .. } => {
            entry.problem = Some("wrong_type");
            entry.error = Some(format!(
                "a {kind} key; idempotask writes only strings, so something else uses this name"
            ));
        }
        // What a later version of the core shows: listed, as nothing a delivery can use.
        other => {
            entry.problem = Some("unreadable");
            entry.error = Some(format!("holds {other:?}"));
        }
    }
    // A key the store keeps beside the unit (a PostgreSQL row) is the unit's, whatever its
    // marker says.
    if entry.key.is_none() {
        entry.key.clone_from(&listed.key);
    }
    Some((listed.digest.clone(), entry))
}

/// Input: a done unit's entry, its marker if it is the unit's own, and what its marker decoded
/// to. Output: the entry with the marker's key, fencing token and result, or what is wrong.
fn describe_marker(entry: &mut Entry, own: Option<&Marker>, decoded: &Result<Marker, MarkerError>) {
    match (own, decoded) {
        (Some(marker), _) => {
            entry.key = Some(marker.key().to_owned());
            entry.fencing_token = marker.fencing_token();
            entry.result = Some(result_json(marker));
        }
        (None, Ok(marker)) => {
            entry.problem = Some("key_mismatch");
            entry.error = Some(format!(
                "the marker names key `{}`, whose digest is not this key's; a forged value or a digest collision (`status` refuses it, `forget --force` deletes it)",
                marker.key()
            ));
            entry.stored_key = Some(marker.key().to_owned());
        }
        (None, Err(err)) => {
            entry.problem = Some("unreadable");
            entry.error = Some(format!("unreadable marker: {err}"));
        }
    }
}
