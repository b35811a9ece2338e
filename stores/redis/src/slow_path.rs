//! The protocol's slow paths: `begin` when the unit is not free (held, done, or in doubt), the
//! fenced `begin`, `begin` on a server out of memory, and `finish` once the lock is gone.

use std::time::Duration;

use redis::Value;
use redis::aio::ConnectionLike;

use super::lock::{LOCK_TAG, RELEASED_TAG, key_millis, lock_parts, memory_millis, own_lock};
use super::protocol::{BEGIN, Protocol};
use super::reply::{foreign, is_out_of_memory, pttl, unexpected};
use idempotask::operator::Marker;
use idempotask::store::lock_lost_marker;
use idempotask::store::{Begin, Doubt, Fencing, Finish, LockToken};
use idempotask::store::{StoreError, StoreErrorKind};

/// `ms` milliseconds, from a script's integer reply.
fn millis(ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

impl<C: ConnectionLike + Clone + Send + Sync + 'static> Protocol<C> {
    /// Reads the unit's state after `begin` found something there.
    pub(super) async fn begin_found(
        &self,
        key: &str,
        token: &LockToken,
        lock_ms: u64,
        value: Vec<u8>,
    ) -> Result<Begin, StoreError> {
        match value.first() {
            Some(&Marker::TAG) => Ok(Begin::Done(value)),
            Some(&LOCK_TAG) => {
                if let Some(acquired) = own_lock(&value, token) {
                    // A `begin` sent again finds the lock an earlier request took, whose expiry
                    // counts from then: set it from now, so that the grant lasts the lock TTL
                    // from this request as the caller counts it (a quorum counts its
                    // validity from the round that found it).
                    if self
                        .renew_value("begin", key, &value, key_millis(token, lock_ms))
                        .await?
                    {
                        return Ok(acquired);
                    }
                    // Expired in between: nothing is held, ask again.
                    return Ok(Begin::busy(Some(Duration::ZERO)));
                }
                // Another holder's lock kept past its TTL may have run out: only the server's
                // clock tells, in the script.
                if lock_parts(&value).is_some_and(|parts| parts.memory_ms > 0) {
                    return self.begin_script(key, token, lock_ms, Fencing::Off).await;
                }
                // The slow path only: another holder's lock. How long it has left lets the
                // waiter ask again right when it expires.
                let reply = self
                    .query(redis::cmd("PTTL").arg(key))
                    .await
                    .map_err(|err| self.error("begin", key, &err))?;
                Ok(Begin::busy(pttl("begin", key, &reply)?))
            }
            // A released fenced lock: its counter must go on, which takes the script.
            Some(&RELEASED_TAG) => self.begin_script(key, token, lock_ms, Fencing::Off).await,
            _ => Err(foreign("begin", key, &value)),
        }
    }

    /// `begin` through the script `begin.lua`: a fenced grant, a released fenced lock's
    /// counter, or another holder's lock that may have run out (a unit in doubt).
    pub(super) async fn begin_script(
        &self,
        key: &str,
        token: &LockToken,
        lock_ms: u64,
        fencing: Fencing,
    ) -> Result<Begin, StoreError> {
        let flag = |on: bool| if on { "1" } else { "0" };
        let reply = self
            .invoke("begin", &BEGIN, key, |cmd| {
                cmd.arg(token.as_str())
                    .arg(lock_ms)
                    .arg(memory_millis(token))
                    .arg(flag(fencing == Fencing::On))
                    .arg(flag(token.takes_over_doubt()));
            })
            .await;
        let reply = match reply {
            Err(err) if is_out_of_memory(&err) => {
                return self.begin_read_only(key, token, err).await;
            }
            reply => reply?,
        };
        begin_script_answer(key, &reply)
    }

    /// `begin` on a server that refuses writes (`maxmemory` with `noeviction` refuses even a
    /// `SET NX` that would not write): a duplicate still gets its stored result, and a repeated
    /// call still finds its own lock; anything else fails closed with the refusal.
    pub(super) async fn begin_read_only(
        &self,
        key: &str,
        token: &LockToken,
        refusal: StoreError,
    ) -> Result<Begin, StoreError> {
        let reply = self
            .query(redis::cmd("GET").arg(key))
            .await
            .map_err(|err| self.error("begin", key, &err))?;
        if let Value::BulkString(value) = reply {
            if value.first() == Some(&Marker::TAG) {
                return Ok(Begin::Done(value));
            }
            if let Some(acquired) = own_lock(&value, token) {
                return Ok(acquired);
            }
        }
        Err(refusal)
    }

    /// `finish` once our lock is known to be gone: keep the result only where nobody else
    /// holds the unit.
    pub(super) async fn finish_lost(
        &self,
        key: &str,
        marker: &[u8],
        ttl: u64,
    ) -> Result<Finish, StoreError> {
        // What this delivery stores once its lock is gone says so, and tells a repeated finish
        // whether the first one completed or came too late.
        let lost_marker = lock_lost_marker(marker).ok_or_else(|| {
            StoreError::new(
                "finish",
                StoreErrorKind::Protocol,
                "the marker to store has no `|` after its header",
            )
        })?;
        let reply = self
            .query(
                redis::cmd("SET")
                    .arg(key)
                    .arg(&lost_marker)
                    .arg("NX")
                    .arg("GET")
                    .arg("PX")
                    .arg(ttl),
            )
            .await
            .map_err(|err| self.error("finish", key, &err))?;
        let lost = |marker_written| {
            Ok(if marker_written {
                Finish::lost_marker_written()
            } else {
                Finish::lost_nothing_written()
            })
        };
        match reply {
            Value::Nil => lost(true),
            Value::BulkString(value) if value == marker => Ok(Finish::Completed),
            Value::BulkString(value) if value == lost_marker => lost(true),
            Value::BulkString(value) if value.first() == Some(&RELEASED_TAG) => {
                // A released fenced lock holds only a counter: the result replaces it, unless
                // someone took the unit in between.
                let reply = self
                    .native(
                        "finish",
                        key,
                        redis::cmd("SET")
                            .arg(key)
                            .arg(&lost_marker)
                            .arg("IFEQ")
                            .arg(&value)
                            .arg("PX")
                            .arg(ttl),
                    )
                    .await?;
                lost(matches!(reply, Some(Value::Okay)))
            }
            Value::BulkString(_) => lost(false),
            other => Err(unexpected("finish", key, &other)),
        }
    }
}

/// What the script `begin.lua` answered, as a [`Begin`] for the unit at `key`.
pub(super) fn begin_script_answer(key: &str, reply: &Value) -> Result<Begin, StoreError> {
    let fence = |value: i64| u64::try_from(value).ok();
    let doubt = |expired: i64, earlier: i64| Doubt::new(fence(earlier), millis(expired.max(0)));
    if let Value::Array(items) = reply {
        match items.as_slice() {
            [Value::Int(1), Value::BulkString(marker)] => {
                return Ok(Begin::Done(marker.clone()));
            }
            [Value::Int(2), Value::Int(granted)] => {
                return Ok(Begin::acquired(fence(*granted)));
            }
            [Value::Int(3), pttl_value] => {
                return Ok(Begin::busy(pttl("begin", key, pttl_value)?));
            }
            [Value::Int(4)] => {
                return Err(StoreError::new(
                    "begin",
                    StoreErrorKind::Protocol,
                    format!("key `{key}` holds a value that is not idempotask's"),
                ));
            }
            [
                Value::Int(5),
                Value::Int(granted),
                Value::Int(expired),
                Value::Int(earlier),
            ] => {
                return Ok(Begin::taken_over(
                    fence(*granted),
                    doubt(*expired, *earlier),
                ));
            }
            [Value::Int(6), Value::Int(expired), Value::Int(earlier)] => {
                return Ok(Begin::InDoubt(doubt(*expired, *earlier)));
            }
            _ => {}
        }
    }
    Err(unexpected("begin", key, reply))
}
