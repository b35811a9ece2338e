//! What `RedisStore` and `RedisClusterStore` share: the key layout, the scripts, the replies.
//!
//! Both stores speak one protocol over different connections, so it lives here once, generic
//! over the connection: [`Protocol`] implements [`Store`] for any redis-rs async connection.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use async_trait::async_trait;
use redis::aio::ConnectionLike;
use redis::{Cmd, ErrorKind, RedisError, Script, ServerErrorKind, Value};

use super::keys::PREFIX;
use crate::error::{StoreError, StoreErrorKind};
use crate::store::{Begin, Finish, Inspection, Store, ttl_millis};
use crate::unit::{LockToken, NameKind, UnitOfWork, validate_name};

static BEGIN: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("begin.lua")));
static FINISH: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("finish.lua")));
static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("release.lua")));
static RENEW: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("renew.lua")));
static INSPECT: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("inspect.lua")));

/// The Redis keys of `unit` under `namespace`: lock, done marker, fencing counter.
///
/// All three share the hash tag `{<namespace>:<task>:<sha256 of the caller key>}`, so they live
/// in one Redis Cluster slot (no script can fail with `CROSSSLOT`) and the digest spreads units
/// over all slots; no caller text appears in them.
///
/// ```
/// use idempotask::UnitOfWork;
/// use idempotask::store::redis::key_names;
/// let [lock, done, fence] = key_names("billing", &UnitOfWork::new("charge", "order-42")?);
/// assert!(lock.starts_with("idempotask:v1:{billing:charge:") && lock.ends_with("}:lock"));
/// assert!(done.ends_with("}:done") && fence.ends_with("}:fence"));
/// # Ok::<(), idempotask::InvalidKey>(())
/// ```
pub fn key_names(namespace: &str, unit: &UnitOfWork) -> [String; 3] {
    [":lock", ":done", ":fence"].map(|suffix| key_name(namespace, unit, suffix))
}

/// One of `unit`'s keys: its hash tag then `suffix` (`:lock`, `:done` or `:fence`), so that a
/// call builds only the names it sends.
fn key_name(namespace: &str, unit: &UnitOfWork, suffix: &str) -> String {
    let parts = [
        PREFIX,
        namespace,
        ":",
        unit.task(),
        ":",
        unit.digest(),
        "}",
        suffix,
    ];
    // Pushed into a string of the exact size: `format!` here grew each name several times,
    // and the names are built on every call.
    let mut name = String::with_capacity(parts.iter().map(|part| part.len()).sum());
    for part in parts {
        name.push_str(part);
    }
    name
}

/// A namespace check with the error `connect` reports.
pub(super) fn check_namespace(namespace: &str) -> Result<(), StoreError> {
    validate_name(namespace, NameKind::Namespace).map_err(|err| {
        StoreError::new(
            "connect",
            StoreErrorKind::Configuration,
            false,
            err.to_string(),
        )
    })
}

/// Waits for `connect` for at most `deadline`, as a `connect` error when it takes longer.
pub(super) async fn connect_within<T>(
    deadline: Duration,
    connect: impl Future<Output = Result<T, RedisError>>,
    resends: bool,
) -> Result<T, StoreError> {
    tokio::time::timeout(deadline, connect)
        .await
        .map_err(|_| {
            StoreError::new(
                "connect",
                StoreErrorKind::Timeout,
                false,
                format!("no connection within {} ms", deadline.as_millis()),
            )
        })?
        .map_err(|err| store_error("connect", &err, resends))
}

/// The protocol over one connection `C`; the public stores wrap one of these.
///
/// Input: a redis-rs async connection (a `ConnectionManager`, a cluster connection).
/// Output: a [`Store`] whose every operation is one script call (`forget` one `DEL`).
#[derive(Clone)]
pub(super) struct Protocol<C> {
    pub(super) connection: C,
    pub(super) namespace: Arc<str>,
    pub(super) max_key_len: usize,
    /// Whether the connection re-sends commands by itself (the cluster client does, after a
    /// redirect or a lost connection): then no failure proves that nothing was applied.
    pub(super) resends: bool,
}

impl<C> std::fmt::Debug for Protocol<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Protocol")
            .field("namespace", &self.namespace)
            .field("max_key_len", &self.max_key_len)
            .finish_non_exhaustive()
    }
}

impl<C: ConnectionLike + Clone + Send + Sync + 'static> Protocol<C> {
    /// Connected: loads the scripts (on every node, for a cluster) so the first calls need no
    /// extra round trip.
    pub(super) async fn new(
        mut connection: C,
        namespace: String,
        max_key_len: usize,
        resends: bool,
    ) -> Result<Self, StoreError> {
        for script in [&*BEGIN, &*FINISH, &*RELEASE, &*RENEW, &*INSPECT] {
            script
                .prepare_invoke()
                .load_async(&mut connection)
                .await
                .map_err(|err| store_error("connect", &err, resends))?;
        }
        Ok(Self {
            connection,
            namespace: namespace.into(),
            max_key_len,
            resends,
        })
    }

    pub(super) fn keys(&self, unit: &UnitOfWork) -> [String; 3] {
        key_names(&self.namespace, unit)
    }

    fn key(&self, unit: &UnitOfWork, suffix: &str) -> String {
        key_name(&self.namespace, unit, suffix)
    }

    /// Sends `EVALSHA` of `script` with `keys` and the arguments `args` writes.
    ///
    /// The command is built directly rather than through redis-rs's `ScriptInvocation`, which
    /// copies every key and argument twice; on a fresh task that was about a sixth of the
    /// client's instructions. A server that lost the script (`SCRIPT FLUSH`, a restart, a
    /// promoted replica) answers `NOSCRIPT` without running anything, so loading it and sending
    /// the same command again is safe.
    async fn invoke(
        &self,
        operation: &'static str,
        script: &Script,
        keys: &[&str],
        args: impl FnOnce(&mut Cmd),
    ) -> Result<Value, StoreError> {
        let bytes = keys.iter().map(|key| key.len()).sum::<usize>() + 128;
        let mut cmd = Cmd::with_capacity(keys.len() + 6, bytes);
        cmd.arg("EVALSHA").arg(script.get_hash()).arg(keys.len());
        for key in keys {
            cmd.arg(*key);
        }
        args(&mut cmd);
        let mut connection = self.connection.clone();
        let reply = match cmd.query_async(&mut connection).await {
            Err(err) if err.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                script
                    .prepare_invoke()
                    .load_async(&mut connection)
                    .await
                    .map_err(|err| store_error(operation, &err, self.resends))?;
                cmd.query_async(&mut connection).await
            }
            reply => reply,
        };
        reply.map_err(|err| store_error(operation, &err, self.resends))
    }
}

#[async_trait]
impl<C: ConnectionLike + Clone + Send + Sync + 'static> Store for Protocol<C> {
    fn max_key_len(&self) -> usize {
        self.max_key_len
    }

    async fn begin(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        lock_ttl: Duration,
        result_ttl: Duration,
    ) -> Result<Begin, StoreError> {
        let [lock, done, fence] = self.keys(unit);
        let lock_ms = ttl_millis(lock_ttl);
        let fence_ms = ttl_millis(lock_ttl.saturating_add(result_ttl));
        let reply = self
            .invoke("begin", &BEGIN, &[&lock, &done, &fence], |cmd| {
                cmd.arg(token.as_str()).arg(lock_ms).arg(fence_ms);
            })
            .await?;
        parse_begin(&reply)
    }

    async fn finish(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        marker: &[u8],
        result_ttl: Duration,
    ) -> Result<Finish, StoreError> {
        let (lock, done) = (self.key(unit, ":lock"), self.key(unit, ":done"));
        let ttl = ttl_millis(result_ttl);
        let reply = self
            .invoke("finish", &FINISH, &[&lock, &done], |cmd| {
                cmd.arg(token.as_str()).arg(marker).arg(ttl);
            })
            .await?;
        parse_finish(&reply)
    }

    async fn release(&self, unit: &UnitOfWork, token: &LockToken) -> Result<bool, StoreError> {
        let lock = self.key(unit, ":lock");
        let reply = self
            .invoke("release", &RELEASE, &[&lock], |cmd| {
                cmd.arg(token.as_str());
            })
            .await?;
        parse_flag("release", &reply)
    }

    async fn renew(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        lock_ttl: Duration,
    ) -> Result<bool, StoreError> {
        let lock = self.key(unit, ":lock");
        let ttl = ttl_millis(lock_ttl);
        let reply = self
            .invoke("renew", &RENEW, &[&lock], |cmd| {
                cmd.arg(token.as_str()).arg(ttl);
            })
            .await?;
        parse_flag("renew", &reply)
    }

    async fn inspect(&self, unit: &UnitOfWork) -> Result<Inspection, StoreError> {
        let (lock, done) = (self.key(unit, ":lock"), self.key(unit, ":done"));
        let reply = self
            .invoke("inspect", &INSPECT, &[&lock, &done], |_| {})
            .await?;
        parse_inspect(&reply)
    }

    async fn forget(&self, unit: &UnitOfWork) -> Result<bool, StoreError> {
        let done = self.key(unit, ":done");
        let mut connection = self.connection.clone();
        let reply: Value = redis::cmd("DEL")
            .arg(&done)
            .query_async(&mut connection)
            .await
            .map_err(|err| store_error("forget", &err, self.resends))?;
        match reply {
            Value::Int(deleted) => Ok(deleted > 0),
            other => Err(unexpected("forget", &other)),
        }
    }
}

fn parse_begin(reply: &Value) -> Result<Begin, StoreError> {
    if let Value::Array(items) = reply {
        match items.as_slice() {
            [Value::Int(1), Value::BulkString(marker)] => return Ok(Begin::Done(marker.clone())),
            [Value::Int(2), Value::Int(fence)] => {
                if let Ok(fencing_token) = u64::try_from(*fence) {
                    return Ok(Begin::Acquired { fencing_token });
                }
            }
            [Value::Int(3), pttl_value] => {
                return Ok(Begin::Busy {
                    lock_ttl_remaining: pttl("begin", pttl_value)?,
                });
            }
            _ => {}
        }
    }
    Err(unexpected("begin", reply))
}

fn parse_finish(reply: &Value) -> Result<Finish, StoreError> {
    match reply {
        Value::Int(1) => Ok(Finish::Completed),
        Value::Int(2) => Ok(Finish::LockLost {
            marker_written: true,
        }),
        Value::Int(3) => Ok(Finish::LockLost {
            marker_written: false,
        }),
        other => Err(unexpected("finish", other)),
    }
}

fn parse_inspect(reply: &Value) -> Result<Inspection, StoreError> {
    let Value::Array(items) = reply else {
        return Err(unexpected("inspect", reply));
    };
    let [marker, marker_pttl, lock_pttl] = items.as_slice() else {
        return Err(unexpected("inspect", reply));
    };
    let marker = match marker {
        Value::BulkString(bytes) => Some(bytes.clone()),
        Value::Nil => None,
        other => return Err(unexpected("inspect", other)),
    };
    Ok(Inspection {
        marker,
        marker_ttl: pttl("inspect", marker_pttl)?,
        lock_ttl: pttl("inspect", lock_pttl)?,
    })
}

fn parse_flag(operation: &'static str, reply: &Value) -> Result<bool, StoreError> {
    match reply {
        Value::Int(0) => Ok(false),
        Value::Int(1) => Ok(true),
        other => Err(unexpected(operation, other)),
    }
}

/// A `PTTL` answer: `None` for a missing key (-2) or a key without expiry (-1).
fn pttl(operation: &'static str, reply: &Value) -> Result<Option<Duration>, StoreError> {
    match reply {
        Value::Int(-2 | -1) => Ok(None),
        Value::Int(ms) => u64::try_from(*ms)
            .map(|ms| Some(Duration::from_millis(ms)))
            .map_err(|_| unexpected(operation, reply)),
        other => Err(unexpected(operation, other)),
    }
}

fn unexpected(operation: &'static str, reply: &Value) -> StoreError {
    let mut shown = format!("{reply:?}");
    if shown.len() > 200 {
        let cut = (0..=200)
            .rev()
            .find(|&i| shown.is_char_boundary(i))
            .unwrap_or(0);
        shown.truncate(cut);
        shown.push('…');
    }
    // The script ran, so whatever it changed is unknown to us.
    StoreError::new(
        operation,
        StoreErrorKind::Protocol,
        true,
        format!("unexpected reply {shown}"),
    )
}

/// Classifies a redis-rs error; `ambiguous` when the command may have reached the server.
///
/// With `resends`, the client may have applied the command on an earlier try before the error
/// it reports (a timeout, then `CLUSTERDOWN` from the next node): only a refused configuration
/// proves that nothing was applied.
pub(super) fn store_error(operation: &'static str, err: &RedisError, resends: bool) -> StoreError {
    let (kind, ambiguous) = if err.is_timeout() {
        (StoreErrorKind::Timeout, true)
    } else if err.is_connection_refusal() {
        (StoreErrorKind::Unreachable, false)
    } else if err.is_io_error() || err.is_connection_dropped() {
        (StoreErrorKind::Unreachable, true)
    } else if matches!(err.code(), Some("NOAUTH" | "WRONGPASS" | "NOPERM")) {
        // Missing or wrong credentials, or an ACL user without the rights: fix the settings.
        (StoreErrorKind::Configuration, false)
    } else {
        match err.kind() {
            ErrorKind::AuthenticationFailed | ErrorKind::InvalidClientConfig => {
                (StoreErrorKind::Configuration, false)
            }
            ErrorKind::Server(ServerErrorKind::NoPerm) => (StoreErrorKind::Configuration, false),
            ErrorKind::ClusterConnectionNotFound => (StoreErrorKind::Unreachable, false),
            ErrorKind::Server(_) | ErrorKind::Extension => (StoreErrorKind::Rejected, false),
            _ => (StoreErrorKind::Protocol, true),
        }
    };
    let ambiguous = ambiguous || (resends && kind != StoreErrorKind::Configuration);
    StoreError::new(operation, kind, ambiguous, err.to_string()).with_source(err.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_other_than_the_scripts_are_protocol_errors() {
        for reply in [
            Value::Nil,
            Value::Int(7),
            Value::Array(vec![Value::Int(2), Value::Int(-5)]),
            Value::Array(vec![Value::Int(1)]),
        ] {
            let err = parse_begin(&reply).unwrap_err();
            assert_eq!(err.kind(), StoreErrorKind::Protocol, "{reply:?}");
        }
        assert!(parse_finish(&Value::Int(9)).is_err());
        assert!(parse_inspect(&Value::Array(vec![Value::Nil])).is_err());
        assert!(parse_flag("release", &Value::Okay).is_err());
    }

    #[test]
    fn keys_share_one_hash_tag() {
        let unit = UnitOfWork::new("charge", "order-{1}:x").unwrap();
        let [lock, done, fence] = key_names("billing", &unit);
        let tag = format!("idempotask:v1:{{billing:charge:{}}}", unit.digest());
        assert_eq!(lock, format!("{tag}:lock"));
        assert_eq!(done, format!("{tag}:done"));
        assert_eq!(fence, format!("{tag}:fence"));
    }
}
