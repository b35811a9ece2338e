//! What `RedisStore` and `RedisClusterStore` share: the key layout, the commands, the replies.
//!
//! Both stores speak one protocol over different connections, so it lives here once, generic
//! over the connection: [`Protocol`] implements [`Store`] for any redis-rs async connection.
//!
//! Each unit of work is one key whose value is its whole state:
//! `L<token>[~<doubt memory>][.<fencing token>]` while locked (and, with a doubt memory, for
//! that long after the lock ran out: the unit is in doubt, see [`lock`](super::lock)), `T<fencing token>` after a fenced lock was released, or the marker (`D…`) once
//! done. The hot path is plain commands:
//!
//! | operation | command |
//! |---|---|
//! | begin | `SET key L<token> NX GET PX lock_ttl` (the reply is the unit's state) |
//! | begin, fenced; begin that finds a released fenced lock, or a lock kept past its TTL | script `begin.lua` (GET, PTTL, TIME, SET) |
//! | finish | `SET key <marker> IFEQ <lock> PX result_ttl` where the server has it (Valkey 8.1+, Redis 8.4+), else script `finish.lua` (GET, SET) |
//! | renew | `SET key <lock> IFEQ <lock> PX lock_ttl`, else script `renew.lua` |
//! | release, inspect, forget | scripts |
//! | the operator calls of [`operator`](crate::operator): read, forget exactly, resolve exactly, list | scripts `read.lua`, `forget_exact.lua`, `resolve_exact.lua`; `SCAN` |
//!
//! `forget` also writes a receipt next to the unit's key (see `forget.lua`), so that a re-sent
//! `forget` answers as the first one did.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{Cmd, ErrorKind, RedisError, Script, ServerErrorKind, Value};

use super::keys::{FORGET_RECEIPT_MS, PREFIX, forget_receipt_key, unit_key};
use super::lock::{holder_value, key_millis, lock_value};
use super::native_cas::NativeCas;
pub(super) use super::reply::store_error;
use super::reply::{foreign, is_out_of_memory, is_syntax_error, parse_flag, pttl, unexpected};
use super::stored::Stored;
use idempotask::store::{
    Begin, Doubt, Fencing, Finish, Inspection, Journal, StepEntry, Store, ttl_millis,
};
use idempotask::store::{LockToken, UnitOfWork};
use idempotask::store::{StoreError, StoreErrorKind};

pub(super) static BEGIN: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("begin.lua")));
pub(super) static FINISH: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("finish.lua")));
static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("release.lua")));
static RENEW: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("renew.lua")));
static INSPECT: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("inspect.lua")));
static FORGET: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("forget.lua")));
pub(super) static STEP: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("step.lua")));
/// The server clock, as the scripts read it: what `connect` checks the user's rights with.
static CLOCK: LazyLock<Script> = LazyLock::new(|| Script::new("return redis.call('TIME')"));

/// A namespace check with the error `connect` reports.
pub(super) fn check_namespace(namespace: &str) -> Result<(), StoreError> {
    idempotask::store::check_namespace(namespace)
        .map_err(|err| StoreError::new("connect", StoreErrorKind::Configuration, err.to_string()))
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
                format!("no connection within {} ms", deadline.as_millis()),
            )
        })?
        .map_err(|err| store_error("connect", &err, resends))
}

/// The ambiguous `Timeout` of a call cut short by the call timeout `limit`. The wait it cuts
/// short may have been for a reconnection (nothing sent yet) or for a reply (the command may
/// have run): nothing tells them apart from here, so it is ambiguous, as a response timeout is.
pub(super) fn timed_out(operation: &'static str, limit: Duration) -> StoreError {
    StoreError::ambiguous(
        operation,
        StoreErrorKind::Timeout,
        format!(
            "no answer within the response timeout of {} ms (reconnecting included)",
            limit.as_millis()
        ),
    )
}

/// The protocol over one connection `C`; the public stores wrap one of these.
///
/// Input: a redis-rs async connection (a `ConnectionManager`, a cluster connection).
/// Output: a [`Store`] whose every operation is one command in the common case.
#[derive(Clone)]
pub(super) struct Protocol<C> {
    pub(super) connection: C,
    pub(super) namespace: Arc<str>,
    pub(super) max_key_len: usize,
    /// Whether the connection re-sends commands by itself (the cluster client does, after a
    /// redirect or a lost connection): then no failure proves that nothing was applied.
    pub(super) resends: bool,
    /// How long one store call may take, its commands, a wait for a connection and reloaded
    /// scripts included; `None` where the connection bounds its calls itself (the cluster
    /// client's overall response timeout).
    pub(super) call_timeout: Option<Duration>,
    /// Whether the server has a native compare-and-set (`SET … IFEQ`).
    pub(super) native_cas: NativeCas,
    /// Whether a batch goes in one pipeline: on one server, yes; a cluster spreads a batch's
    /// keys over nodes, which one pipeline cannot carry.
    pub(super) pipelines: bool,
}

impl<C> std::fmt::Debug for Protocol<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Protocol")
            .field("namespace", &self.namespace)
            .field("max_key_len", &self.max_key_len)
            .field("native_cas", &self.native_cas.known())
            .finish_non_exhaustive()
    }
}

impl<C: ConnectionLike + Clone + Send + Sync + 'static> Protocol<C> {
    /// Connected: loads the scripts (on every node, for a cluster) so the first calls need no
    /// extra round trip, and finds out whether the server has `SET … IFEQ`.
    pub(super) async fn new(
        mut connection: C,
        namespace: String,
        max_key_len: usize,
        resends: bool,
        call_timeout: Option<Duration>,
    ) -> Result<Self, StoreError> {
        for script in [
            &*BEGIN, &*FINISH, &*RELEASE, &*RENEW, &*INSPECT, &*FORGET, &*STEP,
        ] {
            script
                .prepare_invoke()
                .load_async(&mut connection)
                .await
                .map_err(|err| store_error("connect", &err, resends))?;
        }
        // Fenced grants, releases and `forget` read the server clock from their scripts, and
        // `TIME` is in none of the categories an ACL user is usually given (`@fast` only): a
        // user without it would fail every fenced task, so `connect` says so now.
        if let Err(err) = CLOCK
            .prepare_invoke()
            .invoke_async::<Value>(&mut connection)
            .await
        {
            let err = store_error("connect", &err, resends);
            if err.kind() == StoreErrorKind::Configuration {
                return Err(StoreError::new(
                    "connect",
                    StoreErrorKind::Configuration,
                    format!(
                        "the Redis user may not run `TIME` from a script, which fenced tasks, releases and `forget` do; grant it with `+time` ({err})"
                    ),
                ));
            }
            return Err(err);
        }
        // `INFO` would tell the version, but it is `@dangerous` in ACL terms; a conditional SET
        // of a key that does not exist writes nothing and needs only the rights the store
        // needs anyway. The expiry makes sure of it on a server that would create the key.
        let probe: Result<Value, RedisError> = redis::cmd("SET")
            .arg(format!("{PREFIX}{namespace}:capability-probe"))
            .arg("x")
            .arg("IFEQ")
            .arg("y")
            .arg("PX")
            .arg(1)
            .query_async(&mut connection)
            .await;
        let native_cas = match probe {
            Ok(_) => true,
            Err(err) if is_syntax_error(&err) => false,
            // A cluster node reached through a plain connection (a tool that first asks what
            // it talks to) redirects the probe: the script works everywhere, so use it.
            Err(err)
                if matches!(
                    err.kind(),
                    ErrorKind::Server(ServerErrorKind::Moved | ServerErrorKind::Ask)
                ) =>
            {
                false
            }
            Err(err) => return Err(store_error("connect", &err, resends)),
        };
        Ok(Self {
            connection,
            namespace: namespace.into(),
            max_key_len,
            resends,
            call_timeout,
            native_cas: NativeCas::new(native_cas),
            pipelines: false,
        })
    }

    /// Sends each batch in one pipeline (a connection to one server).
    pub(super) fn pipelining(mut self) -> Self {
        self.pipelines = true;
        self
    }

    /// Whether `finish` and `renew` run as plain `SET … IFEQ` commands, as last found out.
    pub(super) fn native_cas(&self) -> bool {
        self.native_cas.known()
    }

    pub(super) fn key(&self, unit: &UnitOfWork) -> String {
        unit_key(&self.namespace, unit)
    }

    /// Runs one store call within the call timeout.
    ///
    /// Input: the future of a whole store call. Output: its answer, or an ambiguous `Timeout`
    /// once the call timeout passed. The wait it cuts short may have been for a reconnection
    /// (nothing sent yet) or for a reply (the command may have run): nothing tells them apart
    /// from here, so it is ambiguous, as a response timeout is.
    pub(super) async fn bounded<T>(
        &self,
        operation: &'static str,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let Some(limit) = self.call_timeout else {
            return call.await;
        };
        tokio::time::timeout(limit, call)
            .await
            .unwrap_or_else(|_| Err(timed_out(operation, limit)))
    }

    /// Sends one plain command.
    pub(super) async fn query(&self, cmd: &Cmd) -> Result<Value, RedisError> {
        let mut connection = self.connection.clone();
        cmd.query_async(&mut connection).await
    }

    /// Sends `EVALSHA` of `script` on `key` with the arguments `args` writes.
    ///
    /// The command is built directly rather than through redis-rs's `ScriptInvocation`, which
    /// copies every key and argument twice. A server that lost the script (`SCRIPT FLUSH`, a
    /// restart, a promoted replica) answers `NOSCRIPT` without running anything, so loading it
    /// and sending the same command again is safe.
    pub(super) async fn invoke(
        &self,
        operation: &'static str,
        script: &Script,
        key: &str,
        args: impl FnOnce(&mut Cmd),
    ) -> Result<Value, StoreError> {
        self.invoke_on(operation, script, &[key], args).await
    }

    /// [`invoke`](Self::invoke) of a script on several `keys` (one hash slot); errors name the
    /// first.
    pub(super) async fn invoke_on(
        &self,
        operation: &'static str,
        script: &Script,
        keys: &[&str],
        args: impl FnOnce(&mut Cmd),
    ) -> Result<Value, StoreError> {
        let key = keys.first().copied().unwrap_or_default();
        let keys_len: usize = keys.iter().map(|key| key.len()).sum();
        let mut cmd = Cmd::with_capacity(7 + keys.len(), keys_len + 160);
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
                    .map_err(|err| self.error(operation, key, &err))?;
                cmd.query_async(&mut connection).await
            }
            reply => reply,
        };
        reply.map_err(|err| self.error(operation, key, &err))
    }

    /// A redis-rs error as a [`StoreError`] that names `key` where the key is the problem.
    pub(super) fn error(&self, operation: &'static str, key: &str, err: &RedisError) -> StoreError {
        if err.code() == Some("WRONGTYPE") {
            return StoreError::new(
                operation,
                StoreErrorKind::Protocol,
                format!("key `{key}` holds a value of another type; it is not idempotask's"),
            )
            .with_source(err.clone());
        }
        store_error(operation, err, self.resends)
    }

    /// A plain `SET` that needs the native compare-and-set; `None` when the server turned out
    /// not to have it (a rolling upgrade, a failover to an older replica), which it says with a
    /// syntax error before doing anything.
    pub(super) async fn native(
        &self,
        operation: &'static str,
        key: &str,
        cmd: &Cmd,
    ) -> Result<Option<Value>, StoreError> {
        match self.query(cmd).await {
            Err(err) if is_syntax_error(&err) => {
                self.native_cas.refused();
                Ok(None)
            }
            Ok(reply) => {
                self.native_cas.answered();
                Ok(Some(reply))
            }
            Err(err) => Err(self.error(operation, key, &err)),
        }
    }
}

impl<C: ConnectionLike + Clone + Send + Sync + 'static> Store for Protocol<C> {
    fn max_key_len(&self) -> usize {
        self.max_key_len
    }

    async fn begin(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        lock_ttl: Duration,
        fencing: Fencing,
    ) -> Result<Begin, StoreError> {
        self.bounded("begin", self.begin_call(unit, token, lock_ttl, fencing))
            .await
    }

    async fn finish(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        marker: &[u8],
        result_ttl: Duration,
    ) -> Result<Finish, StoreError> {
        self.bounded("finish", self.finish_call(unit, token, marker, result_ttl))
            .await
    }

    async fn release(&self, unit: &UnitOfWork, token: &LockToken) -> Result<bool, StoreError> {
        self.bounded("release", self.release_call(unit, token))
            .await
    }

    async fn renew(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        lock_ttl: Duration,
    ) -> Result<bool, StoreError> {
        self.bounded("renew", self.renew_call(unit, token, lock_ttl))
            .await
    }

    async fn inspect(&self, unit: &UnitOfWork) -> Result<Inspection, StoreError> {
        self.bounded("inspect", self.inspect_call(unit)).await
    }

    async fn forget(&self, unit: &UnitOfWork) -> Result<bool, StoreError> {
        self.bounded("forget", self.forget_call(unit)).await
    }

    fn records_steps(&self) -> bool {
        true
    }

    async fn read_journal(&self, unit: &UnitOfWork) -> Result<Journal, StoreError> {
        self.bounded("read_journal", self.read_journal_call(unit))
            .await
    }

    async fn record_step(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        entry: StepEntry<'_>,
        lock_ttl: Duration,
    ) -> Result<bool, StoreError> {
        self.bounded(
            "record_step",
            self.record_step_call(unit, token, entry, lock_ttl),
        )
        .await
    }
}

/// The store calls, each without the call timeout that [`Store`] puts around it.
impl<C: ConnectionLike + Clone + Send + Sync + 'static> Protocol<C> {
    async fn begin_call(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        lock_ttl: Duration,
        fencing: Fencing,
    ) -> Result<Begin, StoreError> {
        let key = self.key(unit);
        let lock_ms = ttl_millis(lock_ttl);
        if fencing == Fencing::On {
            return self.begin_script(&key, token, lock_ms, fencing).await;
        }
        let mut cmd = Cmd::with_capacity(7, key.len() + 64);
        cmd.arg("SET")
            .arg(&key)
            .arg(lock_value(token))
            .arg("NX")
            .arg("GET")
            .arg("PX")
            .arg(key_millis(token, lock_ms));
        match self.query(&cmd).await {
            Ok(Value::Nil) => Ok(Begin::acquired(None)),
            Ok(Value::BulkString(value)) => self.begin_found(&key, token, lock_ms, value).await,
            Ok(other) => Err(unexpected("begin", &key, &other)),
            Err(err) => {
                let err = self.error("begin", &key, &err);
                if is_out_of_memory(&err) {
                    self.begin_read_only(&key, token, err).await
                } else {
                    Err(err)
                }
            }
        }
    }

    pub(super) async fn finish_call(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        marker: &[u8],
        result_ttl: Duration,
    ) -> Result<Finish, StoreError> {
        let key = self.key(unit);
        let lock = lock_value(token);
        let ttl = ttl_millis(result_ttl);
        if self.native_cas.try_now() {
            let mut cmd = Cmd::with_capacity(7, key.len() + marker.len() + lock.len() + 32);
            cmd.arg("SET")
                .arg(&key)
                .arg(marker)
                .arg("IFEQ")
                .arg(&lock)
                .arg("PX")
                .arg(ttl);
            match self.native("finish", &key, &cmd).await? {
                Some(Value::Okay) => return Ok(Finish::Completed),
                Some(Value::Nil) => return self.finish_lost(&key, marker, ttl).await,
                Some(other) => return Err(unexpected("finish", &key, &other)),
                None => {}
            }
        }
        let reply = self
            .invoke("finish", &FINISH, &key, |cmd| {
                cmd.arg(&lock).arg(marker).arg(ttl);
            })
            .await?;
        match reply {
            Value::Int(1) => Ok(Finish::Completed),
            Value::Int(2) => Ok(Finish::lost_marker_written()),
            Value::Int(3) => Ok(Finish::lost_nothing_written()),
            other => Err(unexpected("finish", &key, &other)),
        }
    }

    async fn release_call(&self, unit: &UnitOfWork, token: &LockToken) -> Result<bool, StoreError> {
        let key = self.key(unit);
        let reply = self
            .invoke("release", &RELEASE, &key, |cmd| {
                cmd.arg(holder_value(token));
            })
            .await?;
        parse_flag("release", &key, &reply)
    }

    async fn renew_call(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        lock_ttl: Duration,
    ) -> Result<bool, StoreError> {
        let key = self.key(unit);
        let lock = lock_value(token);
        self.renew_value(
            "renew",
            &key,
            lock.as_bytes(),
            key_millis(token, ttl_millis(lock_ttl)),
        )
        .await
    }

    /// Sets the expiry of the lock `lock` (its whole stored value) on `key` to `ttl` ms from
    /// now, if it is still there; answers whether it was.
    pub(super) async fn renew_value(
        &self,
        operation: &'static str,
        key: &str,
        lock: &[u8],
        ttl: u64,
    ) -> Result<bool, StoreError> {
        if self.native_cas.try_now() {
            let mut cmd = redis::cmd("SET");
            cmd.arg(key)
                .arg(lock)
                .arg("IFEQ")
                .arg(lock)
                .arg("PX")
                .arg(ttl);
            match self.native(operation, key, &cmd).await? {
                Some(Value::Okay) => return Ok(true),
                Some(Value::Nil) => return Ok(false),
                Some(other) => return Err(unexpected(operation, key, &other)),
                None => {}
            }
        }
        let reply = self
            .invoke(operation, &RENEW, key, |cmd| {
                cmd.arg(lock).arg(ttl);
            })
            .await?;
        parse_flag(operation, key, &reply)
    }

    async fn inspect_call(&self, unit: &UnitOfWork) -> Result<Inspection, StoreError> {
        let key = self.key(unit);
        let reply = self.invoke("inspect", &INSPECT, &key, |_| {}).await?;
        let Value::Array(items) = &reply else {
            return Err(unexpected("inspect", &key, &reply));
        };
        let [value, ttl] = items.as_slice() else {
            return Err(unexpected("inspect", &key, &reply));
        };
        let ttl = pttl("inspect", &key, ttl)?;
        let found = match value {
            Value::Nil => Ok(Inspection::default()),
            Value::BulkString(value) => match Stored::parse(value, ttl) {
                Stored::Marker { bytes, ttl, .. } => Ok(Inspection::done(bytes, ttl)),
                Stored::Lock {
                    lock_ttl_remaining, ..
                } => Ok(Inspection::locked(lock_ttl_remaining.unwrap_or_default())),
                Stored::InDoubt {
                    fencing_token,
                    expired_for,
                    ..
                } => Ok(Inspection::doubtful(Doubt::new(fencing_token, expired_for))),
                Stored::Released { .. } => Ok(Inspection::default()),
                _ => Err(foreign("inspect", &key, value)),
            },
            other => Err(unexpected("inspect", &key, other)),
        }?;
        if found.is_done() {
            // A finished unit's journal only waits to expire: its steps are over.
            return Ok(found);
        }
        Ok(found.with_journal(self.journal("inspect", &key).await?))
    }

    /// A nonce per call, not per command: a re-sent command carries the same one, and the
    /// receipt that its first run left tells the re-send that this call deleted the marker.
    async fn forget_call(&self, unit: &UnitOfWork) -> Result<bool, StoreError> {
        let key = self.key(unit);
        let receipt = forget_receipt_key(&self.namespace, &key);
        let journal = self.journal_key(&key);
        let nonce = format!("{:016x}", rand::random::<u64>());
        let reply = self
            .invoke_on("forget", &FORGET, &[&key, &receipt, &journal], |cmd| {
                cmd.arg(&nonce).arg(FORGET_RECEIPT_MS);
            })
            .await?;
        parse_flag("forget", &key, &reply)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_other_than_the_protocols_are_typed_errors() {
        assert!(parse_flag("release", "k", &Value::Okay).is_err());
        assert!(pttl("begin", "k", &Value::Int(-7)).is_err());
        let err = unexpected("finish", "idempotask:v2:ns:t:x", &Value::Int(9));
        assert_eq!(err.kind(), StoreErrorKind::Protocol);
        assert!(err.to_string().contains("idempotask:v2:ns:t:x"), "{err}");
        let err = foreign("begin", "k", b"\xffjunk");
        assert!(!err.is_ambiguous());
    }
}
