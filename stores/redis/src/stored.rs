//! [`Stored`]: what one unit's key holds, parsed; shown to operators by
//! [`operator`](crate::operator) and read by the stores' own `inspect`.

use std::time::Duration;

use idempotask::operator::{Marker, MarkerError};

use super::lock::{LOCK_TAG, RELEASED_TAG, lock_parts};

/// What one unit's key holds: the value layout of the Redis stores, read in this one place.
///
/// A key holds a lock (`L<token>[~<doubt memory>][.<fencing token>]`, held, or run out and
/// remembered: in doubt), a released fenced lock's
/// counter (`T<fencing token>`) or a completion [`Marker`] (`D…`); anything else was not
/// written by idempotask.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Stored {
    /// Nothing.
    Missing,
    /// A released fenced lock's counter: the unit is neither done nor locked.
    #[non_exhaustive]
    Released {
        /// The last fencing token granted; `None` for a counter that does not read as one.
        fencing_token: Option<u64>,
    },
    /// A lock: a delivery is running the work.
    #[non_exhaustive]
    Lock {
        /// The fencing token it was granted with, for a fenced task.
        fencing_token: Option<u64>,
        /// How long the lock has left; `None` when the key has no expiry, which idempotask
        /// never leaves on a lock (something else changed it).
        lock_ttl_remaining: Option<Duration>,
    },
    /// A lock that ran out without a release or a marker, still remembered: the unit is in
    /// doubt (its delivery may or may not have done its side effect). The next delivery takes
    /// it over; an operator who finds out whether its side effect happened resolves it
    /// ([`resolve_exact`](crate::RedisStore::resolve_exact)).
    #[non_exhaustive]
    InDoubt {
        /// The lock's value, exactly as stored: what
        /// [`resolve_exact`](crate::RedisStore::resolve_exact) compares.
        bytes: Vec<u8>,
        /// The fencing token it was granted with, for a fenced task.
        fencing_token: Option<u64>,
        /// How long ago it ran out, on the server's clock.
        expired_for: Duration,
        /// How long the server remembers it still.
        forgotten_in: Duration,
    },
    /// A completion marker (a value that starts with `D`), readable or not.
    #[non_exhaustive]
    Marker {
        /// The value, exactly as stored: what [`forget_exact`](crate::RedisStore::forget_exact)
        /// compares.
        bytes: Vec<u8>,
        /// How long the marker has left; `None` when it has no expiry.
        ttl: Option<Duration>,
        /// The marker decoded, or why it cannot be.
        marker: Result<Marker, MarkerError>,
    },
    /// A string that is neither a marker nor a lock: not idempotask's.
    #[non_exhaustive]
    Foreign {
        /// The value, exactly as stored.
        bytes: Vec<u8>,
    },
    /// A key of another type (`hash`, `list`, …); idempotask writes only strings.
    #[non_exhaustive]
    OtherType {
        /// The type, as `TYPE` names it.
        kind: String,
    },
}

impl Stored {
    /// Input: a string value of a unit's key and its expiry (`None`: none, or unknown).
    /// Output: what the value is.
    ///
    /// ```
    /// use idempotask_redis::operator::Stored;
    /// use std::time::Duration;
    ///
    /// let ttl = Some(Duration::from_secs(30));
    /// match Stored::parse(b"Labc", ttl) {
    ///     Stored::Lock { fencing_token, lock_ttl_remaining, .. } => {
    ///         assert_eq!((fencing_token, lock_ttl_remaining), (None, ttl));
    ///     }
    ///     other => panic!("{other:?}"),
    /// }
    /// // Kept for 60 s after it runs out, with 20 s of its key left: ran out 40 s ago.
    /// match Stored::parse(b"Labc~60000", Some(Duration::from_secs(20))) {
    ///     Stored::InDoubt { expired_for, .. } => assert_eq!(expired_for, Duration::from_secs(40)),
    ///     other => panic!("{other:?}"),
    /// }
    /// ```
    pub fn parse(value: &[u8], ttl: Option<Duration>) -> Self {
        match value.first() {
            Some(&Marker::TAG) => Self::Marker {
                bytes: value.to_vec(),
                ttl,
                marker: Marker::decode(value),
            },
            Some(&LOCK_TAG) => {
                let parts = lock_parts(value);
                let fencing_token = parts.and_then(|parts| parts.fencing_token);
                match (parts, ttl) {
                    (Some(parts), Some(ttl)) => match parts.left(ttl) {
                        Ok(left) => Self::Lock {
                            fencing_token,
                            lock_ttl_remaining: Some(left),
                        },
                        Err(expired_for) => Self::InDoubt {
                            bytes: value.to_vec(),
                            fencing_token,
                            expired_for,
                            forgotten_in: ttl,
                        },
                    },
                    _ => Self::Lock {
                        fencing_token,
                        lock_ttl_remaining: ttl,
                    },
                }
            }
            Some(&RELEASED_TAG) => Self::Released {
                fencing_token: std::str::from_utf8(&value[1..])
                    .ok()
                    .and_then(|fence| fence.parse().ok()),
            },
            _ => Self::Foreign {
                bytes: value.to_vec(),
            },
        }
    }
}
