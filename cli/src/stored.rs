//! What one unit holds, as the commands show it, whichever store it was read from.
//!
//! The store crates parse their own layouts ([`idempotask_redis::operator::Stored`], the rows
//! of [`idempotask_postgres::operator::StoredUnit`]); this is only the view the commands
//! render, so that `status`, `forget`, `list` and `resolve` are written once for every backend.

use std::time::Duration;

use idempotask::operator::{Marker, MarkerError, StoredResult};
use idempotask::store::UnitOfWork;
use idempotask_postgres::operator::{StoredUnit, UnitState};
use idempotask_redis::operator::{Reading, Stored};
use serde_json::Value;

/// What a unit holds, for the commands.
#[derive(Debug)]
pub(crate) enum Seen {
    /// Nothing (a released fenced lock's counter included: the unit is neither done, locked
    /// nor in doubt).
    Missing,
    /// A lock: a delivery is running the work.
    Lock {
        fencing_token: Option<u64>,
        /// `None` when the lock has no expiry, which idempotask never leaves on a lock.
        ttl: Option<Duration>,
        /// About how long ago the lock was granted, where the fencing token tells (Redis's
        /// tokens are the server's clock in microseconds).
        age_ms: Option<u64>,
    },
    /// A lock that ran out without a release or a marker, still remembered: the unit is in
    /// doubt (its delivery may have done its side effect) until an operator resolves it or the
    /// store forgets it.
    InDoubt {
        /// What `resolve` compares: the lock's value, exactly as stored (Redis), or its
        /// holder's token (PostgreSQL).
        bytes: Vec<u8>,
        fencing_token: Option<u64>,
        /// How long ago the lock ran out.
        expired_for: Duration,
        /// How long the store remembers it still.
        forgotten_in: Duration,
    },
    /// A completion marker, readable or not.
    Marker {
        bytes: Vec<u8>,
        ttl: Option<Duration>,
        marker: Result<Marker, MarkerError>,
    },
    /// A value that is neither a marker nor a lock.
    Foreign { bytes: Vec<u8> },
    /// A key of another type (`hash`, `list`, …); idempotask writes only strings.
    OtherType(String),
}

impl Seen {
    /// Input: what a Redis key holds and the server's clock. Output: the view of it.
    pub(crate) fn from_redis(stored: Stored, server_time_us: Option<u64>) -> Self {
        match stored {
            Stored::Lock {
                fencing_token,
                lock_ttl_remaining,
                ..
            } => Self::Lock {
                fencing_token,
                ttl: lock_ttl_remaining,
                age_ms: fencing_token
                    .zip(server_time_us)
                    .map(|(token, now)| now.saturating_sub(token) / 1000),
            },
            Stored::InDoubt {
                bytes,
                fencing_token,
                expired_for,
                forgotten_in,
                ..
            } => Self::InDoubt {
                bytes,
                fencing_token,
                expired_for,
                forgotten_in,
            },
            Stored::Marker {
                bytes, ttl, marker, ..
            } => Self::Marker { bytes, ttl, marker },
            Stored::Foreign { bytes, .. } => Self::Foreign { bytes },
            Stored::OtherType { kind, .. } => Self::OtherType(kind),
            // `Missing`, `Released`, and whatever a later layout adds that no delivery reads.
            _ => Self::Missing,
        }
    }

    /// A Redis reading, with the clock it was read by.
    pub(crate) fn from_reading(reading: Reading) -> Self {
        let now = reading.server_time_us();
        Self::from_redis(reading.into_stored(), Some(now))
    }

    /// Input: a PostgreSQL row of a unit, if there is one live. Output: the view of it.
    pub(crate) fn from_postgres(row: Option<StoredUnit>) -> Self {
        let Some(row) = row else {
            return Self::Missing;
        };
        match row.state {
            UnitState::Locked {
                fencing_token,
                lock_ttl_remaining,
                ..
            } => Self::Lock {
                fencing_token,
                ttl: Some(lock_ttl_remaining),
                // PostgreSQL's fencing tokens come from a sequence: they tell no age.
                age_ms: None,
            },
            UnitState::InDoubt {
                token,
                fencing_token,
                expired_for,
                forgotten_in,
                ..
            } => Self::InDoubt {
                bytes: token.into_bytes(),
                fencing_token,
                expired_for,
                forgotten_in,
            },
            UnitState::Done { marker, ttl, .. } => Self::Marker {
                marker: Marker::decode(&marker),
                bytes: marker,
                ttl: Some(ttl),
            },
            // A state a later store writes and this build cannot read: shown, never used.
            other => Self::Foreign {
                bytes: format!("{other:?}").into_bytes(),
            },
        }
    }
}

/// Whether a readable marker found under the key of `task`'s unit with `digest` was written
/// for that unit: its plain key hashes to the same digest.
pub(crate) fn belongs_to(marker: &Marker, task: &str, digest: &str) -> bool {
    UnitOfWork::with_limit(task, marker.key(), usize::MAX).is_ok_and(|unit| unit.digest() == digest)
}

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
