//! The protocol's slow paths: `begin` when the unit is not free, the fenced `begin`, `begin` on
//! a server out of memory, and `finish` once the lock is gone.

use std::time::Duration;

use redis::Value;
use redis::aio::ConnectionLike;

use super::lock::{LOCK_TAG, RELEASED_TAG, own_lock};
use super::protocol::{BEGIN_FENCED, Protocol};
use super::reply::{foreign, is_out_of_memory, pttl, unexpected};
use idempotask::operator::Marker;
use idempotask::store::lock_lost_marker;
use idempotask::store::{Begin, Finish, LockToken};
use idempotask::store::{StoreError, StoreErrorKind};

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
                    if self.renew_value("begin", key, &value, lock_ms).await? {
                        return Ok(acquired);
                    }
                    // Expired in between: nothing is held, ask again.
                    return Ok(Begin::busy(Some(Duration::ZERO)));
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
            Some(&RELEASED_TAG) => self.begin_fenced(key, token, lock_ms).await,
            _ => Err(foreign("begin", key, &value)),
        }
    }

    pub(super) async fn begin_fenced(
        &self,
        key: &str,
        token: &LockToken,
        lock_ms: u64,
    ) -> Result<Begin, StoreError> {
        let reply = self
            .invoke("begin", &BEGIN_FENCED, key, |cmd| {
                cmd.arg(token.as_str()).arg(lock_ms);
            })
            .await;
        let reply = match reply {
            Err(err) if is_out_of_memory(&err) => {
                return self.begin_read_only(key, token, err).await;
            }
            reply => reply?,
        };
        if let Value::Array(items) = &reply {
            match items.as_slice() {
                [Value::Int(1), Value::BulkString(marker)] => {
                    return Ok(Begin::Done(marker.clone()));
                }
                [Value::Int(2), Value::Int(fence)] => {
                    if let Ok(fence) = u64::try_from(*fence) {
                        return Ok(Begin::acquired(Some(fence)));
                    }
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
                _ => {}
            }
        }
        Err(unexpected("begin", key, &reply))
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
