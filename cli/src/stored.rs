//! What one unit's key holds, read raw with one script, and the compare-and-forget of exactly
//! those bytes.
//!
//! The store's own `inspect` folds away what an operator needs to see: a lock without an
//! expiry reads as one about to expire, a key of another type fails the read, and the bytes
//! themselves are not returned, so a `forget` after a confirmation could not tell whether the
//! value it deletes is still the one it showed. [`Stored`] keeps all of that.

use std::sync::LazyLock;
use std::time::Duration;

use idempotask::ops::{Marker, MarkerError};
use idempotask::store::UnitOfWork;
use redis::{Script, Value};

use crate::target::lock_fencing_token;

/// The source of the read script; a pipeline sends it with `EVAL`, since a pipeline cannot
/// load a script on demand.
pub(crate) const READ_LUA: &str = include_str!("read.lua");
pub(crate) static READ: LazyLock<Script> = LazyLock::new(|| Script::new(READ_LUA));
pub(crate) static FORGET: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("forget.lua")));

/// One key as the read script saw it, with the server's clock at that instant.
#[derive(Debug)]
pub(crate) struct Read {
    pub(crate) stored: Stored,
    /// The server's `TIME` in microseconds, from the same script as the value.
    pub(crate) now_us: u64,
}

/// What a unit's key holds.
#[derive(Debug)]
pub(crate) enum Stored {
    /// Nothing.
    Missing,
    /// A released fenced lock's counter (`T<fence>`): the unit is neither done nor locked.
    Released,
    /// A lock: a delivery is running the work.
    Lock {
        fencing_token: Option<u64>,
        /// `None` when the key has no expiry, which idempotask never leaves on a lock.
        ttl: Option<Duration>,
    },
    /// A completion marker (a value that starts with `D`), readable or not.
    Marker {
        bytes: Vec<u8>,
        ttl: Option<Duration>,
        marker: Result<Marker, MarkerError>,
    },
    /// A string that is neither a marker nor a lock.
    Foreign { bytes: Vec<u8> },
    /// A key of another type (`hash`, `list`, …); idempotask writes only strings.
    OtherType(String),
}

impl Read {
    /// Input: the read script's reply. Output: what it says, or why the reply is not one.
    pub(crate) fn from_reply(reply: &Value) -> Result<Self, String> {
        let unexpected = || format!("unexpected reply to the read script: {reply:?}");
        let Value::Array(items) = reply else {
            return Err(unexpected());
        };
        let [kind, value, pttl, time] = items.as_slice() else {
            return Err(unexpected());
        };
        let kind = text(kind).ok_or_else(unexpected)?;
        let ttl = match pttl {
            Value::Int(ms) => u64::try_from(*ms).ok().map(Duration::from_millis),
            _ => return Err(unexpected()),
        };
        let now_us = match time {
            Value::Array(parts) => match parts.as_slice() {
                [secs, micros] => number(secs)
                    .zip(number(micros))
                    .map(|(secs, micros)| secs.saturating_mul(1_000_000).saturating_add(micros))
                    .ok_or_else(unexpected)?,
                _ => return Err(unexpected()),
            },
            _ => return Err(unexpected()),
        };
        let stored = match (kind.as_str(), value) {
            ("none", _) => Stored::Missing,
            ("string", Value::BulkString(bytes)) => classify(bytes, ttl),
            // Expired between `TYPE` and `GET` cannot happen inside a script; anything else is
            // a reply this build does not know.
            ("string", _) => return Err(unexpected()),
            (other, _) => Stored::OtherType(other.to_owned()),
        };
        Ok(Self { stored, now_us })
    }
}

fn classify(bytes: &[u8], ttl: Option<Duration>) -> Stored {
    match bytes.first() {
        Some(b'D') => Stored::Marker {
            bytes: bytes.to_vec(),
            ttl,
            marker: Marker::decode(bytes),
        },
        Some(b'L') => Stored::Lock {
            fencing_token: lock_fencing_token(bytes),
            ttl,
        },
        Some(b'T') => Stored::Released,
        _ => Stored::Foreign {
            bytes: bytes.to_vec(),
        },
    }
}

fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
        Value::SimpleString(text) => Some(text.clone()),
        _ => None,
    }
}

fn number(value: &Value) -> Option<u64> {
    match value {
        Value::Int(n) => u64::try_from(*n).ok(),
        other => text(other)?.parse().ok(),
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

/// What the compare-and-forget did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Forgot {
    /// The value was still the one shown; it is gone.
    Deleted,
    /// The key was gone already (expired, or forgotten by someone else).
    Gone,
    /// The key holds another value now; nothing was deleted.
    Changed,
}

impl Forgot {
    pub(crate) fn from_reply(reply: i64) -> Option<Self> {
        match reply {
            1 => Some(Self::Deleted),
            0 => Some(Self::Gone),
            -1 => Some(Self::Changed),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(kind: &str, value: Value, pttl: i64) -> Value {
        Value::Array(vec![
            Value::SimpleString(kind.into()),
            value,
            Value::Int(pttl),
            Value::Array(vec![
                Value::BulkString(b"1700000000".to_vec()),
                Value::BulkString(b"250".to_vec()),
            ]),
        ])
    }

    #[test]
    fn a_lock_without_an_expiry_has_no_ttl() {
        let read =
            Read::from_reply(&reply("string", Value::BulkString(b"Labc.7".to_vec()), -1)).unwrap();
        assert!(matches!(
            read.stored,
            Stored::Lock {
                fencing_token: Some(7),
                ttl: None
            }
        ));
        assert_eq!(read.now_us, 1_700_000_000_000_250);
    }

    #[test]
    fn other_types_and_foreign_strings_are_named() {
        let hash = Read::from_reply(&reply("hash", Value::Nil, -1)).unwrap();
        assert!(matches!(hash.stored, Stored::OtherType(kind) if kind == "hash"));
        let foreign =
            Read::from_reply(&reply("string", Value::BulkString(b"OK".to_vec()), 5)).unwrap();
        assert!(matches!(foreign.stored, Stored::Foreign { .. }));
        let gone = Read::from_reply(&reply("none", Value::Nil, -2)).unwrap();
        assert!(matches!(gone.stored, Stored::Missing));
        assert!(Read::from_reply(&Value::Int(1)).is_err());
    }
}
