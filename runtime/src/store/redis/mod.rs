//! [`RedisStore`]: locks and markers in Redis, one script call per protocol step.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use async_trait::async_trait;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{ErrorKind, RedisError, Script, ServerErrorKind, Value};

use super::{Begin, Finish, Inspection, Store, ttl_millis};
use crate::error::{StoreError, StoreErrorKind};
use crate::unit::{LockToken, MAX_KEY_LEN, NameKind, UnitOfWork, validate_name};

/// The namespace used when none is configured.
pub const DEFAULT_NAMESPACE: &str = "default";
/// How long connecting to Redis may take before it fails, by default.
pub const DEFAULT_CONNECTION_TIMEOUT: Duration = Duration::from_secs(2);
/// How long one command may wait for its reply before it fails, by default.
pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(2);

static BEGIN: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("begin.lua")));
static FINISH: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("finish.lua")));
static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("release.lua")));
static RENEW: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("renew.lua")));
static INSPECT: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("inspect.lua")));

/// A store in Redis (7.0 or later; Valkey works too).
///
/// Each unit of work has three keys that share one Redis Cluster hash slot:
/// `idempotask:v1:{<namespace>:<task>:<sha256 of the caller key>}:lock`, `…:done` and `…:fence`.
/// `begin`, `finish`, `release`, `renew` and `inspect` are one Lua script call each, so a fresh
/// execution costs two commands and a duplicate one.
///
/// # Behaviour
/// - One multiplexed [`ConnectionManager`] per store (clones share it): it reconnects by itself
///   after a dropped connection; the command that saw the drop fails with a
///   [`StoreError`] of kind `Unreachable`.
/// - Every command has a response timeout ([`DEFAULT_RESPONSE_TIMEOUT`]); a stalled Redis fails
///   the call with kind `Timeout` and `is_ambiguous() == true` instead of hanging the task.
/// - Scripts are loaded when the store connects; after a `SCRIPT FLUSH` or a restart the next
///   call reloads them by itself (one extra round trip).
/// - `redis://user:password@host:port/db` authenticates with an ACL user; `rediss://` needs the
///   `tls` feature.
///
/// ```no_run
/// # async fn start() -> Result<(), idempotask::StoreError> {
/// let store = idempotask::RedisStore::builder("redis://127.0.0.1:6379")
///     .namespace("billing")
///     .response_timeout(std::time::Duration::from_millis(500))
///     .connect()
///     .await?;
/// idempotask::install(store);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisStore {
    connection: ConnectionManager,
    namespace: Arc<str>,
    max_key_len: usize,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("namespace", &self.namespace)
            .field("max_key_len", &self.max_key_len)
            .finish_non_exhaustive()
    }
}

/// Configures and connects a [`RedisStore`]; see [`RedisStore::builder`].
#[derive(Debug, Clone)]
#[must_use]
pub struct RedisStoreBuilder {
    url: String,
    #[cfg(feature = "tls")]
    root_certificate: Option<Vec<u8>>,
    namespace: String,
    connection_timeout: Duration,
    response_timeout: Duration,
    max_key_len: usize,
}

impl RedisStore {
    /// Connects with the default settings.
    ///
    /// # Errors
    /// As [`RedisStoreBuilder::connect`].
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        Self::builder(url).connect().await
    }

    /// A builder with the defaults: namespace [`DEFAULT_NAMESPACE`], timeouts
    /// [`DEFAULT_CONNECTION_TIMEOUT`] and [`DEFAULT_RESPONSE_TIMEOUT`], keys up to
    /// [`MAX_KEY_LEN`] bytes.
    pub fn builder(url: impl Into<String>) -> RedisStoreBuilder {
        RedisStoreBuilder {
            url: url.into(),
            #[cfg(feature = "tls")]
            root_certificate: None,
            namespace: DEFAULT_NAMESPACE.to_owned(),
            connection_timeout: DEFAULT_CONNECTION_TIMEOUT,
            response_timeout: DEFAULT_RESPONSE_TIMEOUT,
            max_key_len: MAX_KEY_LEN,
        }
    }

    /// The namespace this store's keys live under.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The Redis keys of `unit`: lock, done marker, fencing counter.
    pub fn keys(&self, unit: &UnitOfWork) -> [String; 3] {
        key_names(&self.namespace, unit)
    }

    /// The underlying connection, for tooling that needs plain commands next to the store.
    pub fn connection(&self) -> ConnectionManager {
        self.connection.clone()
    }

    async fn invoke(
        &self,
        operation: &'static str,
        script: &Script,
        keys: &[&str],
        args: &[&str],
    ) -> Result<Value, StoreError> {
        let mut call = script.prepare_invoke();
        for key in keys {
            call.key(*key);
        }
        for arg in args {
            call.arg(*arg);
        }
        let mut connection = self.connection.clone();
        call.invoke_async(&mut connection)
            .await
            .map_err(|err| store_error(operation, &err))
    }
}

impl RedisStoreBuilder {
    /// The namespace that separates applications sharing one Redis (default `"default"`).
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// How long connecting may take (default [`DEFAULT_CONNECTION_TIMEOUT`]).
    pub fn connection_timeout(mut self, timeout: Duration) -> Self {
        self.connection_timeout = timeout;
        self
    }

    /// How long one command may wait for its reply (default [`DEFAULT_RESPONSE_TIMEOUT`]).
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// Trusts this CA (PEM) for `rediss://` instead of the system's roots: for a Redis behind a
    /// private certificate authority.
    #[cfg(feature = "tls")]
    pub fn tls_root_certificate(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.root_certificate = Some(pem.into());
        self
    }

    /// The longest caller key accepted, in bytes (default [`MAX_KEY_LEN`]).
    pub fn max_key_len(mut self, max: usize) -> Self {
        self.max_key_len = max;
        self
    }

    /// Connects, checks the server answers, and loads the scripts.
    ///
    /// # Errors
    /// A [`StoreError`] of kind `Configuration` for a bad URL, namespace or credentials, and
    /// `Unreachable` or `Timeout` when the server cannot be reached in time.
    pub async fn connect(self) -> Result<RedisStore, StoreError> {
        validate_name(&self.namespace, NameKind::Namespace).map_err(|err| {
            StoreError::new(
                "connect",
                StoreErrorKind::Configuration,
                false,
                err.to_string(),
            )
        })?;
        let client = self.client().map_err(|err| store_error("connect", &err))?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.connection_timeout))
            .set_response_timeout(Some(self.response_timeout))
            .set_number_of_retries(2)
            .set_max_delay(Duration::from_secs(1));
        let connect = client.get_connection_manager_with_config(config);
        // The manager retries its first connection; the whole attempt still gets one deadline.
        let deadline = self.connection_timeout.saturating_mul(3);
        let mut connection = tokio::time::timeout(deadline, connect)
            .await
            .map_err(|_| {
                StoreError::new(
                    "connect",
                    StoreErrorKind::Timeout,
                    false,
                    format!("no connection within {} ms", deadline.as_millis()),
                )
            })?
            .map_err(|err| store_error("connect", &err))?;
        for script in [&*BEGIN, &*FINISH, &*RELEASE, &*RENEW, &*INSPECT] {
            script
                .prepare_invoke()
                .load_async(&mut connection)
                .await
                .map_err(|err| store_error("connect", &err))?;
        }
        Ok(RedisStore {
            connection,
            namespace: self.namespace.into(),
            max_key_len: self.max_key_len,
        })
    }
}

impl RedisStoreBuilder {
    #[cfg(not(feature = "tls"))]
    fn client(&self) -> redis::RedisResult<redis::Client> {
        redis::Client::open(self.url.as_str())
    }

    #[cfg(feature = "tls")]
    fn client(&self) -> redis::RedisResult<redis::Client> {
        // rustls needs a process-wide crypto provider; another library may have installed one.
        let _ = rustls::crypto::ring::default_provider().install_default();
        match &self.root_certificate {
            Some(pem) => redis::Client::build_with_tls(
                self.url.as_str(),
                redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(pem.clone()),
                },
            ),
            None => redis::Client::open(self.url.as_str()),
        }
    }
}

#[async_trait]
impl Store for RedisStore {
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
        let lock_ms = ttl_millis(lock_ttl).to_string();
        let fence_ms = ttl_millis(lock_ttl.saturating_add(result_ttl)).to_string();
        let reply = self
            .invoke(
                "begin",
                &BEGIN,
                &[&lock, &done, &fence],
                &[token.as_str(), &lock_ms, &fence_ms],
            )
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
        let [lock, done, _] = self.keys(unit);
        let mut call = FINISH.prepare_invoke();
        call.key(&lock)
            .key(&done)
            .arg(token.as_str())
            .arg(marker)
            .arg(ttl_millis(result_ttl));
        let mut connection = self.connection.clone();
        let reply: Value = call
            .invoke_async(&mut connection)
            .await
            .map_err(|err| store_error("finish", &err))?;
        match reply {
            Value::Int(1) => Ok(Finish::Completed),
            Value::Int(2) => Ok(Finish::LockLost {
                marker_written: true,
            }),
            Value::Int(3) => Ok(Finish::LockLost {
                marker_written: false,
            }),
            other => Err(unexpected("finish", &other)),
        }
    }

    async fn release(&self, unit: &UnitOfWork, token: &LockToken) -> Result<bool, StoreError> {
        let [lock, _, _] = self.keys(unit);
        let reply = self
            .invoke("release", &RELEASE, &[&lock], &[token.as_str()])
            .await?;
        parse_flag("release", &reply)
    }

    async fn renew(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        lock_ttl: Duration,
    ) -> Result<bool, StoreError> {
        let [lock, _, _] = self.keys(unit);
        let ttl = ttl_millis(lock_ttl).to_string();
        let reply = self
            .invoke("renew", &RENEW, &[&lock], &[token.as_str(), &ttl])
            .await?;
        parse_flag("renew", &reply)
    }

    async fn inspect(&self, unit: &UnitOfWork) -> Result<Inspection, StoreError> {
        let [lock, done, _] = self.keys(unit);
        let reply = self
            .invoke("inspect", &INSPECT, &[&lock, &done], &[])
            .await?;
        let Value::Array(items) = &reply else {
            return Err(unexpected("inspect", &reply));
        };
        let [marker, marker_pttl, lock_pttl] = items.as_slice() else {
            return Err(unexpected("inspect", &reply));
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

    async fn forget(&self, unit: &UnitOfWork) -> Result<bool, StoreError> {
        let [_, done, _] = self.keys(unit);
        let mut connection = self.connection.clone();
        let deleted: i64 = redis::cmd("DEL")
            .arg(&done)
            .query_async(&mut connection)
            .await
            .map_err(|err| store_error("forget", &err))?;
        Ok(deleted > 0)
    }
}

/// The Redis keys of `unit` under `namespace`: lock, done marker, fencing counter.
///
/// All three share the hash tag `{<namespace>:<task>:<sha256 of the caller key>}`, so they live
/// in one Redis Cluster slot; no caller text appears in them.
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
    let tag = format!(
        "idempotask:v1:{{{namespace}:{}:{}}}",
        unit.task(),
        unit.digest()
    );
    [
        format!("{tag}:lock"),
        format!("{tag}:done"),
        format!("{tag}:fence"),
    ]
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
fn store_error(operation: &'static str, err: &RedisError) -> StoreError {
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
            ErrorKind::Server(_) | ErrorKind::Extension => (StoreErrorKind::Rejected, false),
            _ => (StoreErrorKind::Protocol, true),
        }
    };
    StoreError::new(operation, kind, ambiguous, err.to_string()).with_source(err.clone())
}
