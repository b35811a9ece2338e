//! Redis stores for [`idempotask`]: where locks and completion markers live when the
//! work runs on more than one process.
//!
//! - [`RedisStore`]: one Redis (7.0 or later) or Valkey (7.2 or later) server. A fresh
//!   execution costs two commands, a duplicate one.
//! - [`RedisClusterStore`]: a Redis Cluster; each unit of work is one key, in one slot.
//! - [`RedlockStore`]: a majority of independent servers, so that the loss of any minority
//!   loses no lock and no result.
//!
//! Each implements [`Store`](idempotask::store::Store) and passes the conformance suite of
//! [idempotask-conformance](https://docs.rs/idempotask-conformance);
//! [`RedisKeys`] is the key layout and [`operator`] the value layout, for operators and tools, with
//! the operator calls of [`RedisStore`] and [`RedisClusterStore`]: read one unit raw, forget
//! exactly what was shown, list one task's units.
//!
//! ```no_run
//! use idempotask::Task;
//!
//! static SEND_RECEIPT: Task = Task::new("send_receipt");
//!
//! # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! idempotask::install(idempotask_redis::RedisStore::connect("redis://127.0.0.1:6379").await?);
//! let receipt: u32 = SEND_RECEIPT
//!     .call("order-42")
//!     .run(async { Ok::<_, idempotask::Error>(1001) })
//!     .await?;
//! # let _ = receipt; Ok(()) }
//! ```
//!
//! # Features
//! - `tls`: `rediss://` URLs, through rustls with the ring provider; the system's roots are
//!   trusted, or a private CA given with `tls_root_certificate` on any of the three builders.
//!
//! # Settings
//! The three builders share their connection settings, with the same setters and defaults:
//! `namespace`, `connection_timeout`, `response_timeout`, `max_key_len` and (with `tls`)
//! `tls_root_certificate`; see [`RedisStoreBuilder`]. Each adds its own: the cluster's
//! [`retries`](RedisClusterStoreBuilder::retries), the quorum's
//! [`server_timeout`](RedlockStoreBuilder::server_timeout) and validity settings.
//!
//! # Rights
//! An ACL user needs `~idempotask:* +@read +@write +@scripting +@connection +time`;
//! [`RedisClusterStore`] also `+cluster|slots` (the slot map). `TIME` is there because fenced
//! grants, releases and `forget` read the server's clock from their scripts. A store checks at
//! connect that its scripts may run, and fails with a configuration error (not retryable) when
//! they may not.
//!
#![doc = include_str!("deployment.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use idempotask::operator::{Forgot, Resolution, Resolved};
use idempotask::store::StoreError;
use idempotask::store::UnitOfWork;
use protocol::{Protocol, check_namespace, connect_within, store_error};
use settings::{
    ConnectionSettings, DEFAULT_CONNECTION_TIMEOUT, DEFAULT_NAMESPACE, DEFAULT_RESPONSE_TIMEOUT,
    connection_setters,
};

mod batch;
mod cluster;
mod healing;
mod lock;
mod native_cas;
pub mod operator;
mod protocol;
mod quorum;
mod reply;
mod settings;
mod slow_path;
mod steps;
mod stored;

mod keys;
pub use cluster::{RedisClusterStore, RedisClusterStoreBuilder};
pub use keys::{ParsedKey, RedisKeys};
pub use quorum::{RedlockStore, RedlockStoreBuilder};

/// The first pause of the connection manager's reconnection back-off, at most.
const RECONNECT_FIRST_PAUSE: Duration = Duration::from_millis(100);
/// How many times the connection manager tries again to reconnect before the calls waiting
/// for it fail (the next call starts another round).
const RECONNECT_RETRIES: usize = 2;
/// Room in a connection's queue of commands not yet written. A command whose call is dropped
/// while it waits for room is never sent: under a burst of calls (hundreds of deliveries in
/// flight on one connection), the default 50 dropped the releases of quorum rounds given up on,
/// whose locks then kept every waiter busy for their whole TTL.
const PIPELINE_BUFFER: usize = 4096;

/// Implements [`Store`](idempotask::store::Store) for a wrapper of a [`Protocol`] in its `protocol` field.
macro_rules! delegate_store {
    ($ty:ty) => {
        impl ::idempotask::store::Store for $ty {
            fn max_key_len(&self) -> usize {
                self.protocol.max_key_len
            }
            fn batches_natively(&self) -> bool {
                self.protocol.pipelines
            }
            async fn begin(
                &self,
                unit: &::idempotask::store::UnitOfWork,
                token: &::idempotask::store::LockToken,
                lock_ttl: ::std::time::Duration,
                fencing: ::idempotask::store::Fencing,
            ) -> Result<::idempotask::store::Begin, ::idempotask::store::StoreError> {
                self.protocol.begin(unit, token, lock_ttl, fencing).await
            }
            async fn finish(
                &self,
                unit: &::idempotask::store::UnitOfWork,
                token: &::idempotask::store::LockToken,
                marker: &[u8],
                result_ttl: ::std::time::Duration,
            ) -> Result<::idempotask::store::Finish, ::idempotask::store::StoreError> {
                self.protocol.finish(unit, token, marker, result_ttl).await
            }
            async fn release(
                &self,
                unit: &::idempotask::store::UnitOfWork,
                token: &::idempotask::store::LockToken,
            ) -> Result<bool, ::idempotask::store::StoreError> {
                self.protocol.release(unit, token).await
            }
            async fn renew(
                &self,
                unit: &::idempotask::store::UnitOfWork,
                token: &::idempotask::store::LockToken,
                lock_ttl: ::std::time::Duration,
            ) -> Result<bool, ::idempotask::store::StoreError> {
                self.protocol.renew(unit, token, lock_ttl).await
            }
            async fn inspect(
                &self,
                unit: &::idempotask::store::UnitOfWork,
            ) -> Result<::idempotask::store::Inspection, ::idempotask::store::StoreError> {
                self.protocol.inspect(unit).await
            }
            async fn forget(
                &self,
                unit: &::idempotask::store::UnitOfWork,
            ) -> Result<bool, ::idempotask::store::StoreError> {
                self.protocol.forget(unit).await
            }
            fn records_steps(&self) -> bool {
                true
            }
            async fn read_journal(
                &self,
                unit: &::idempotask::store::UnitOfWork,
            ) -> Result<::idempotask::store::Journal, ::idempotask::store::StoreError> {
                self.protocol.read_journal(unit).await
            }
            async fn record_step(
                &self,
                unit: &::idempotask::store::UnitOfWork,
                token: &::idempotask::store::LockToken,
                entry: ::idempotask::store::StepEntry<'_>,
                lock_ttl: ::std::time::Duration,
            ) -> Result<bool, ::idempotask::store::StoreError> {
                self.protocol
                    .record_step(unit, token, entry, lock_ttl)
                    .await
            }
            async fn begin_batch(
                &self,
                claims: &[::idempotask::store::Claim<'_>],
                lock_ttl: ::std::time::Duration,
                fencing: ::idempotask::store::Fencing,
            ) -> Vec<Result<::idempotask::store::Begin, ::idempotask::store::StoreError>> {
                self.protocol.begin_batch(claims, lock_ttl, fencing).await
            }
            async fn finish_batch(
                &self,
                completions: &[::idempotask::store::Completion<'_>],
                result_ttl: ::std::time::Duration,
            ) -> Vec<Result<::idempotask::store::Finish, ::idempotask::store::StoreError>> {
                self.protocol.finish_batch(completions, result_ttl).await
            }
        }
    };
}
use delegate_store;

/// A store in Redis (7.0 or later; Valkey works too).
///
/// Each unit of work is one key, `idempotask:v2:<namespace>:<task>:<digest>` (see
/// [`RedisKeys`]), holding either its lock or its completion marker. A fresh execution costs two
/// commands and a duplicate one:
///
/// - `begin` is a plain `SET key <lock> NX GET PX <lock TTL>`: its reply is the unit's state
///   (nothing: the lock is ours; a marker: a duplicate; another lock: busy).
/// - `finish` replaces our lock with the marker: a plain `SET key <marker> IFEQ <lock>` on
///   servers that have it (Valkey 8.1+, Redis 8.4+), otherwise a small script (one `GET`, one
///   `SET`). Which one is found out once at connect, without `INFO` (an ACL user limited to
///   `~idempotask:*` with read, write and scripting rights is enough).
/// - Tasks with fencing ([`Task::fencing`](idempotask::Task::fencing)) begin with a script that
///   keeps the counter in the lock's value.
///
/// Redis 7.0 or later, or Valkey 7.2 or later, is needed (`SET … NX GET`).
///
/// # Behaviour
/// - One multiplexed [`ConnectionManager`] per store (clones share it): it reconnects by itself
///   after a dropped connection; the command that saw the drop fails with a
///   [`StoreError`] of kind `Unreachable`.
/// - Every store call has a response timeout
///   ([`DEFAULT_RESPONSE_TIMEOUT`](RedisStore::DEFAULT_RESPONSE_TIMEOUT)) that bounds the whole
///   call: its commands, a wait for the connection manager to reconnect, a reloaded script. A
///   stalled Redis fails the call with kind `Timeout` and `is_ambiguous() == true` instead of
///   hanging the task; a Redis that is down and refuses connections fails it sooner, with kind
///   `Unreachable` and not ambiguous (see [`RedisStoreBuilder::response_timeout`]).
/// - After a dropped connection the manager reconnects in the background, with a back-off of
///   at most half the response timeout (and at most 0.6 s), and a call waits for that round.
///   So while Redis is down and refuses connections, a call fails within the round, with kind
///   `Unreachable` and not ambiguous; a server that does not answer at all (a dropped network)
///   takes up to the response timeout.
/// - Scripts are loaded when the store connects; after a `SCRIPT FLUSH` or a restart the next
///   call reloads them by itself (one extra round trip).
/// - `forget` leaves a receipt for a minute next to the unit's key (see [`RedisKeys`]), so that
///   a client that re-sends it after losing the reply is told that the marker was deleted.
/// - `redis://user:password@host:port/db` authenticates with an ACL user; `rediss://` needs the
///   `tls` feature (a private CA is given with the builder's `tls_root_certificate`, there with
///   `tls` only).
///
/// ```no_run
/// # async fn start() -> Result<(), idempotask::store::StoreError> {
/// let store = idempotask_redis::RedisStore::builder("redis://127.0.0.1:6379")
///     .namespace("billing")
///     .response_timeout(std::time::Duration::from_millis(500))
///     .connect()
///     .await?;
/// idempotask::install(store);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisStore {
    protocol: Protocol<ConnectionManager>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("namespace", &self.protocol.namespace)
            .field("max_key_len", &self.protocol.max_key_len)
            .finish_non_exhaustive()
    }
}

/// Configures and connects a [`RedisStore`]; see [`RedisStore::builder`].
///
/// Its setters are those of every Redis store's builder, with the same defaults (the
/// `DEFAULT_*` constants of [`RedisStore`]).
#[derive(Debug, Clone)]
#[must_use]
pub struct RedisStoreBuilder {
    url: String,
    settings: ConnectionSettings,
}

impl RedisStore {
    /// The namespace used when none is configured.
    pub const DEFAULT_NAMESPACE: &str = DEFAULT_NAMESPACE;
    /// How long connecting to one server may take before it fails, by default.
    pub const DEFAULT_CONNECTION_TIMEOUT: Duration = DEFAULT_CONNECTION_TIMEOUT;
    /// How long one store call may take before it fails, by default.
    pub const DEFAULT_RESPONSE_TIMEOUT: Duration = DEFAULT_RESPONSE_TIMEOUT;

    /// Connects with the default settings.
    ///
    /// # Errors
    /// As [`RedisStoreBuilder::connect`].
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        Self::builder(url).connect().await
    }

    /// A builder with every setting at its default (see [`RedisStoreBuilder`]'s setters).
    pub fn builder(url: impl Into<String>) -> RedisStoreBuilder {
        RedisStoreBuilder {
            url: url.into(),
            settings: ConnectionSettings::default(),
        }
    }

    /// The namespace this store's keys live under.
    pub fn namespace(&self) -> &str {
        &self.protocol.namespace
    }

    /// The Redis key of `unit` (the layout of [`RedisKeys`]).
    pub fn key(&self, unit: &UnitOfWork) -> String {
        self.protocol.key(unit)
    }

    /// Whether the server has a native compare-and-set (`SET … IFEQ`, Valkey 8.1+ and Redis
    /// 8.4+), so that `finish` and `renew` run no script.
    pub fn native_compare_and_set(&self) -> bool {
        self.protocol.native_cas()
    }

    /// For operators: whether the server is standalone or a node of a Redis Cluster (which
    /// answers this store only for its own slots). It asks with commands a worker's ACL user
    /// may run (`CLUSTER SLOTS`, `CLUSTER INFO`, `READWRITE`), and answers
    /// [`Undetermined`](operator::ServerKind::Undetermined) rather than guess when none tells.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), idempotask::store::StoreError> {
    /// use idempotask_redis::operator::ServerKind;
    /// use idempotask_redis::{RedisClusterStore, RedisStore};
    ///
    /// let url = "redis://127.0.0.1:6379";
    /// let store = RedisStore::connect(url).await?;
    /// if store.server_kind().await? == ServerKind::ClusterNode {
    ///     let cluster = RedisClusterStore::connect([url]).await?;
    ///     # let _ = cluster;
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// A [`StoreError`] when the server cannot be reached.
    pub async fn server_kind(&self) -> Result<operator::ServerKind, StoreError> {
        self.protocol.server_kind().await
    }

    /// For operators: what `unit`'s key holds, raw (its bytes, a lock without an expiry, a key
    /// of another type), with the server's clock; changes nothing.
    ///
    /// ```no_run
    /// # async fn run(store: idempotask_redis::RedisStore) -> Result<(), Box<dyn std::error::Error>> {
    /// use idempotask::store::UnitOfWork;
    /// use idempotask_redis::operator::Stored;
    ///
    /// let unit = UnitOfWork::new("charge", "order-42")?;
    /// match store.read_unit(&unit).await?.stored() {
    ///     Stored::Marker { marker: Ok(marker), .. } => println!("done: {:?}", marker.result()),
    ///     Stored::Lock { lock_ttl_remaining, .. } => println!("locked for {lock_ttl_remaining:?}"),
    ///     other => println!("{other:?}"),
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// A [`StoreError`] when Redis cannot be reached or answers out of protocol.
    pub async fn read_unit(&self, unit: &UnitOfWork) -> Result<operator::Reading, StoreError> {
        self.protocol.read_unit(unit).await
    }

    /// For operators: deletes `unit`'s value only while it is still exactly `shown` (the bytes
    /// of a [`Stored::Marker`](operator::Stored::Marker) or [`Stored::Foreign`](operator::Stored::Foreign)
    /// an operator confirmed), so that a marker a delivery wrote meanwhile stays. A fenced
    /// marker leaves its counter, as [`forget`](idempotask::store::Store::forget) does, and the
    /// same receipt: a call re-sent after a lost reply answers as the first one did.
    ///
    /// ```no_run
    /// # async fn run(store: idempotask_redis::RedisStore) -> Result<(), Box<dyn std::error::Error>> {
    /// use idempotask::store::UnitOfWork;
    /// use idempotask::operator::Forgot;
    /// use idempotask_redis::operator::Stored;
    ///
    /// let unit = UnitOfWork::new("charge", "order-42")?;
    /// if let Stored::Marker { bytes, .. } = store.read_unit(&unit).await?.stored() {
    ///     // … shown to the operator, who confirmed …
    ///     assert_ne!(store.forget_exact(&unit, bytes).await?, Forgot::Changed);
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// A [`StoreError`] when Redis cannot be reached or answers out of protocol.
    pub async fn forget_exact(
        &self,
        unit: &UnitOfWork,
        shown: &[u8],
    ) -> Result<Forgot, StoreError> {
        self.protocol.forget_exact(unit, shown).await
    }

    /// For operators: resolves `unit`, [in doubt](idempotask::store::Doubt) with the lock
    /// `shown` (the bytes of a [`Stored::InDoubt`](operator::Stored::InDoubt) an operator
    /// confirmed), only while it still holds exactly that lock and the lock is still run out:
    /// [`Resolution::Record`] stores a completion marker in its place, so that every later
    /// delivery gets its result back; [`Resolution::Free`] deletes the lock (a fenced one
    /// leaves its counter, as a release does), so that the next delivery runs the work as new
    /// with no doubt; [`Resolution::RecordStep`] appends a step's entry to the unit's journal
    /// and deletes the lock, so that the next delivery replays that step and goes on after it.
    /// A unit that changed meanwhile (taken over, finished or renewed by its
    /// holder, resolved by someone else) is left alone: [`Resolved::Changed`]. The call leaves
    /// the same receipt as [`forget_exact`](Self::forget_exact): one re-sent after a lost reply
    /// answers as the first one did.
    ///
    /// ```no_run
    /// # async fn run(store: idempotask_redis::RedisStore) -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use idempotask::operator::{Marker, Resolution, Resolved};
    /// use idempotask::store::UnitOfWork;
    /// use idempotask_redis::operator::Stored;
    /// use serde_json::value::RawValue;
    ///
    /// let unit = UnitOfWork::new("charge", "order-42")?;
    /// if let Stored::InDoubt { bytes, fencing_token, .. } = store.read_unit(&unit).await?.stored() {
    ///     // … the payment provider says the charge went through …
    ///     let result = RawValue::from_string(r#"{"charge":"ch_1"}"#.to_owned())?;
    ///     let marker = Marker::encode_resolution(&unit, *fencing_token, &result);
    ///     let resolution = Resolution::record(marker, Duration::from_secs(24 * 60 * 60));
    ///     match store.resolve_exact(&unit, bytes, &resolution).await? {
    ///         Resolved::Recorded => println!("deliveries get the charge back"),
    ///         other => println!("left alone: {other:?}"),
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// A [`StoreError`] when Redis cannot be reached or answers out of protocol, and of kind
    /// `Configuration` for a marker that is not one for `unit`.
    pub async fn resolve_exact(
        &self,
        unit: &UnitOfWork,
        shown: &[u8],
        resolution: &Resolution,
    ) -> Result<Resolved, StoreError> {
        self.protocol.resolve_exact(unit, shown, resolution).await
    }

    /// For operators: every key of `task` in this namespace, found with `SCAN` (never `KEYS`)
    /// and each read once. The listing is not one snapshot: keys written while it runs may or
    /// may not be in it.
    ///
    /// ```no_run
    /// # async fn run(store: idempotask_redis::RedisStore) -> Result<(), idempotask::store::StoreError> {
    /// let listing = store.list_task("charge").await?;
    /// println!("{} keys, {} still there", listing.keys_seen, listing.units.len());
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// A [`StoreError`] of kind `Configuration` for a name no task can have, or when Redis
    /// cannot be reached.
    pub async fn list_task(&self, task: &str) -> Result<operator::Listing, StoreError> {
        self.protocol
            .list_on(task, |cmd| {
                let protocol = &self.protocol;
                async move { protocol.query(&cmd).await }
            })
            .await
    }

    /// For operators: whether `task` has any key at all in this namespace (`SCAN` stops at the
    /// first), released fenced locks included.
    ///
    /// ```no_run
    /// # async fn run(store: idempotask_redis::RedisStore) -> Result<(), idempotask::store::StoreError> {
    /// if !store.task_has_keys("charge").await? {
    ///     println!("no such task in namespace {}", store.namespace());
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`list_task`](Self::list_task).
    pub async fn task_has_keys(&self, task: &str) -> Result<bool, StoreError> {
        self.protocol
            .has_keys_on(task, |cmd| {
                let protocol = &self.protocol;
                async move { protocol.query(&cmd).await }
            })
            .await
    }
}

delegate_store!(RedisStore);

impl RedisStoreBuilder {
    connection_setters!();

    /// Connects, checks the server answers, and loads the scripts.
    ///
    /// # Errors
    /// A [`StoreError`] of kind `Configuration` for a bad URL, namespace or credentials, and
    /// `Unreachable` or `Timeout` when the server cannot be reached in time. The latter's
    /// `Display` is one line that names the URL (its password as `***`) and says that nothing
    /// answers there; for a server on this machine that refuses the connection, it adds the
    /// `redis-server` command that starts one.
    pub async fn connect(self) -> Result<RedisStore, StoreError> {
        let settings = &self.settings;
        check_namespace(&settings.namespace)?;
        let client = self
            .client()
            .map_err(|err| store_error("connect", &err, false))?;
        // A call that arrives while the manager reconnects waits for that round: its pauses
        // (jittered, doubling: at most 6 × the first one) take at most half the response
        // timeout, so that during an outage the call learns that connections are refused, a
        // failure that proves nothing was sent, before its response timeout runs out.
        let first_pause = RECONNECT_FIRST_PAUSE.min(settings.response_timeout() / 12);
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(settings.connection_timeout))
            .set_response_timeout(Some(settings.response_timeout()))
            .set_number_of_retries(RECONNECT_RETRIES)
            .set_min_delay(first_pause)
            .set_max_delay(Duration::from_secs(1))
            .set_pipeline_buffer_size(PIPELINE_BUFFER);
        // The manager retries its first connection; the whole attempt still gets one deadline.
        let deadline = settings.connection_timeout.saturating_mul(3);
        let connection = connect_within(
            deadline,
            client.get_connection_manager_with_config(config),
            false,
        )
        .await
        .map_err(|err| {
            reply::unanswered(
                &self.url,
                client.get_connection_info().addr(),
                deadline,
                err,
            )
        })?;
        let response_timeout = self.settings.response_timeout();
        let ConnectionSettings {
            namespace,
            max_key_len,
            ..
        } = self.settings;
        Ok(RedisStore {
            protocol: Protocol::new(
                connection,
                namespace,
                max_key_len,
                false,
                Some(response_timeout),
            )
            .await?
            .pipelining(),
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
        match self.settings.tls_certificates() {
            Some(certificates) => redis::Client::build_with_tls(self.url.as_str(), certificates),
            None => redis::Client::open(self.url.as_str()),
        }
    }
}
