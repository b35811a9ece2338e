//! [`RedisClusterStore`]: the same locks and markers, spread over a Redis Cluster.

use std::collections::BTreeSet;

use redis::Value;
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo, SingleNodeRoutingInfo};

use super::delegate_store;
use super::healing::HealingConnection;
use super::operator::{Listing, Reading};
use super::protocol::{Protocol, check_namespace, connect_within, store_error};
use super::settings::{ConnectionSettings, connection_setters};
use idempotask::operator::{Forgot, Resolution, Resolved};
use idempotask::store::UnitOfWork;
use idempotask::store::{StoreError, StoreErrorKind};

/// How many times the cluster client re-sends one command, by default, after a redirect it
/// could not follow at once, a `TRYAGAIN` during a slot migration, or a lost node.
pub(crate) const DEFAULT_CLUSTER_RETRIES: u32 = 4;

/// A store in a Redis Cluster (7.0 or later; Valkey works too), through redis-rs's async
/// cluster client.
///
/// Keys, commands and replies are exactly those of [`RedisStore`](crate::RedisStore): each unit
/// of work is one key, so every command touches a single hash slot (no `CROSSSLOT` is possible)
/// and the units spread over all masters. A fresh execution still costs two commands and a
/// duplicate one.
///
/// # Behaviour
/// - One multiplexed cluster connection per store (clones share it). It learns the slot map
///   from any reachable seed node and follows `MOVED` and `ASK` redirects by itself, so a slot
///   migration costs extra round trips, not errors.
/// - While a slot is half migrated, a command may be answered with `ASK` or `TRYAGAIN`; the
///   client follows or re-sends it up to [`DEFAULT_RETRIES`](RedisClusterStore::DEFAULT_RETRIES) times, then the call fails
///   with a [`StoreError`] of kind `Rejected` that is safe to retry.
/// - The client re-sends a command after a timeout or a lost connection too, so a script may
///   run twice: every command recognises its own lock token (a repeated `begin` is `Acquired`
///   with the same fencing token, a repeated `finish` finds its own marker). For the same
///   reason every failure except a configuration error is reported as ambiguous.
/// - After a call timed out, the store builds a fresh cluster connection in the background
///   and uses it from then on, so that a connection stuck on a stale slot map cannot time out
///   every later call: without it, a slot migration under load leaves some finished bodies
///   with their marker not written (`tests/cluster_events.rs`).
/// - Each command waits at most the response timeout
///   ([`DEFAULT_RESPONSE_TIMEOUT`](crate::RedisStore::DEFAULT_RESPONSE_TIMEOUT)), redirects,
///   re-sends and reconnecting included (see [`RedisClusterStoreBuilder::response_timeout`]);
///   a cluster that lost a master fails calls for that master's slots with kind `Timeout`,
///   `Unreachable` or `Rejected` (`CLUSTERDOWN`) until a replica takes over. Nothing hangs and
///   the body never runs without a confirmed lock.
/// - The response timeout is the cluster client's overall response timeout. A store call is
///   one command in the common case; the slow paths send more (a `begin` that finds the unit
///   locked reads the lock's TTL, a script the node lost is loaded again). Every failure is
///   ambiguous, since the client may have sent the command before the failure it reports.
/// - `forget` leaves a receipt for a minute in the unit's slot (see
///   [`RedisKeys`](crate::RedisKeys)): a `forget` the client re-sent after losing the
///   reply is answered as the first run was (deleted), and deletes nothing more.
/// - The lock is as strong as one master: replication is asynchronous, so a lock or marker
///   written just before its master died may be missing on the promoted replica. The fencing
///   token, checked by the database the task writes to, is what stops the second holder.
/// - `redis://user:password@host:port` authenticates with an ACL user on every node;
///   `rediss://` needs the `tls` feature, and every node then speaks TLS (`tls-cluster yes`); a
///   private CA is given with the builder's `tls_root_certificate` (there with `tls` only).
///
/// ```no_run
/// # async fn start() -> Result<(), idempotask::store::StoreError> {
/// use idempotask_redis::RedisClusterStore;
///
/// let store = RedisClusterStore::builder([
///     "redis://10.0.0.1:6379",
///     "redis://10.0.0.2:6379",
///     "redis://10.0.0.3:6379",
/// ])
/// .namespace("billing")
/// .response_timeout(std::time::Duration::from_millis(500))
/// .connect()
/// .await?;
/// idempotask::install(store);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisClusterStore {
    pub(super) protocol: Protocol<HealingConnection>,
}

impl std::fmt::Debug for RedisClusterStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisClusterStore")
            .field("namespace", &self.protocol.namespace)
            .field("max_key_len", &self.protocol.max_key_len)
            .finish_non_exhaustive()
    }
}

/// Configures and connects a [`RedisClusterStore`]; see [`RedisClusterStore::builder`].
///
/// Its setters are those of every Redis store's builder, with the same defaults (see
/// [`RedisStoreBuilder`](crate::RedisStoreBuilder)), and [`retries`](Self::retries).
#[derive(Debug, Clone)]
#[must_use]
pub struct RedisClusterStoreBuilder {
    nodes: Vec<String>,
    settings: ConnectionSettings,
    retries: u32,
}

impl RedisClusterStore {
    /// How many times the cluster client re-sends one command, by default.
    pub const DEFAULT_RETRIES: u32 = DEFAULT_CLUSTER_RETRIES;

    /// Connects with the default settings, learning the cluster from any of the seed `nodes`.
    ///
    /// # Errors
    /// As [`RedisClusterStoreBuilder::connect`].
    pub async fn connect<I>(nodes: I) -> Result<Self, StoreError>
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        Self::builder(nodes).connect().await
    }

    /// A builder with every setting at its default (see [`RedisClusterStoreBuilder`]'s
    /// setters).
    ///
    /// `nodes` are seed URLs (`redis://host:port`); one reachable node is enough, the client
    /// finds the others through it. Give a few so that start-up survives one being down.
    pub fn builder<I>(nodes: I) -> RedisClusterStoreBuilder
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        RedisClusterStoreBuilder {
            nodes: nodes.into_iter().map(Into::into).collect(),
            settings: ConnectionSettings::default(),
            retries: DEFAULT_CLUSTER_RETRIES,
        }
    }

    /// The namespace this store's keys live under.
    pub fn namespace(&self) -> &str {
        &self.protocol.namespace
    }

    /// The Redis key of `unit` (the layout of [`RedisKeys`](crate::RedisKeys)).
    pub fn key(&self, unit: &UnitOfWork) -> String {
        self.protocol.key(unit)
    }

    /// Whether the cluster's nodes have a native compare-and-set (`SET … IFEQ`), as found out
    /// at connect; a node that turns out not to have it switches the store to the script.
    pub fn native_compare_and_set(&self) -> bool {
        self.protocol.native_cas()
    }

    /// The host and port of every master that serves slots, each once and sorted, as this
    /// store's cluster client addresses them: where tooling runs what works per node, such as
    /// `SCAN` or `INFO` (the `idempotask list` command scans each of them).
    ///
    /// The addresses come from the client's own slot map (a `PING` to every master), not from a
    /// fresh `CLUSTER SLOTS`: they are then exactly the ones redis-rs routes to by address, with
    /// its substitutions for an empty, unknown or wildcard endpoint already made.
    ///
    /// ```no_run
    /// # async fn run(store: idempotask_redis::RedisClusterStore) -> Result<(), idempotask::store::StoreError> {
    /// for (host, port) in store.masters().await? {
    ///     println!("master at {host}:{port}");
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// A [`StoreError`] when the cluster cannot be reached, or kind `Protocol` when the client's
    /// answer names no address it can read.
    pub async fn masters(&self) -> Result<Vec<(String, u16)>, StoreError> {
        let replies = self
            .protocol
            .connection
            .current()
            .route_command(
                redis::cmd("PING").clone(),
                RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None)),
            )
            .await
            .map_err(|err| store_error("masters", &err, false))?;
        master_addresses(&replies).ok_or_else(|| {
            StoreError::new(
                "masters",
                StoreErrorKind::Protocol,
                format!("unexpected reply to PING on every master: {replies:?}"),
            )
        })
    }
}

/// The operator calls: as [`RedisStore`](crate::RedisStore)'s, and `list_task` scans every
/// master.
impl RedisClusterStore {
    /// For operators: what `unit`'s key holds, raw, with the clock of the master that owns it;
    /// see [`RedisStore::read_unit`](crate::RedisStore::read_unit).
    ///
    /// ```no_run
    /// # async fn run(store: idempotask_redis::RedisClusterStore) -> Result<(), Box<dyn std::error::Error>> {
    /// let unit = idempotask::store::UnitOfWork::new("charge", "order-42")?;
    /// println!("{:?}", store.read_unit(&unit).await?.stored());
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// A [`StoreError`] when the cluster cannot be reached or answers out of protocol.
    pub async fn read_unit(&self, unit: &UnitOfWork) -> Result<Reading, StoreError> {
        self.protocol.read_unit(unit).await
    }

    /// For operators: deletes `unit`'s value only while it is still exactly `shown`; see
    /// [`RedisStore::forget_exact`](crate::RedisStore::forget_exact). The client may re-send
    /// the script; the receipt makes the second run answer as the first did.
    ///
    /// ```no_run
    /// # async fn run(store: idempotask_redis::RedisClusterStore, shown: Vec<u8>) -> Result<(), Box<dyn std::error::Error>> {
    /// let unit = idempotask::store::UnitOfWork::new("charge", "order-42")?;
    /// let forgot = store.forget_exact(&unit, &shown).await?;
    /// println!("{forgot:?}");
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// A [`StoreError`] when the cluster cannot be reached or answers out of protocol.
    pub async fn forget_exact(
        &self,
        unit: &UnitOfWork,
        shown: &[u8],
    ) -> Result<Forgot, StoreError> {
        self.protocol.forget_exact(unit, shown).await
    }

    /// For operators: resolves `unit`, in doubt with the lock `shown`, only while it still
    /// holds exactly that lock and the lock is still run out; see
    /// [`RedisStore::resolve_exact`](crate::RedisStore::resolve_exact). The client may re-send
    /// the script; the receipt makes the second run answer as the first did.
    ///
    /// ```no_run
    /// # async fn run(store: idempotask_redis::RedisClusterStore, shown: Vec<u8>) -> Result<(), Box<dyn std::error::Error>> {
    /// use idempotask::operator::{Resolution, Resolved};
    ///
    /// let unit = idempotask::store::UnitOfWork::new("charge", "order-42")?;
    /// // The charge did not go through: the next delivery runs it as new.
    /// let freed = store.resolve_exact(&unit, &shown, &Resolution::Free).await?;
    /// assert!(matches!(freed, Resolved::Freed | Resolved::Gone | Resolved::Changed));
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`RedisStore::resolve_exact`](crate::RedisStore::resolve_exact).
    pub async fn resolve_exact(
        &self,
        unit: &UnitOfWork,
        shown: &[u8],
        resolution: &Resolution,
    ) -> Result<Resolved, StoreError> {
        self.protocol.resolve_exact(unit, shown, resolution).await
    }

    /// For operators: every key of `task`, found with `SCAN` on each master in turn (a task's
    /// keys spread over all slots) and each read once.
    ///
    /// While slots move the masters are not scanned at one instant: a unit whose key moves
    /// from a master not scanned yet to one already scanned is missed, and one seen on both
    /// sides is counted once. List again once a resharding is over.
    ///
    /// ```no_run
    /// # async fn run(store: idempotask_redis::RedisClusterStore) -> Result<(), idempotask::store::StoreError> {
    /// let listing = store.list_task("charge").await?;
    /// println!("{} keys on {} masters", listing.keys_seen, listing.servers_scanned);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`masters`](Self::masters), and kind `Configuration` for a name no task can have.
    pub async fn list_task(&self, task: &str) -> Result<Listing, StoreError> {
        let mut listing = Listing::default();
        for (host, port) in self.masters().await? {
            let found = self
                .protocol
                .list_on(task, self.on_master(&host, port))
                .await?;
            listing.merge(found);
        }
        Ok(listing)
    }

    /// For operators: whether `task` has any key at all on any master.
    ///
    /// ```no_run
    /// # async fn run(store: idempotask_redis::RedisClusterStore) -> Result<(), idempotask::store::StoreError> {
    /// println!("{}", store.task_has_keys("charge").await?);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`list_task`](Self::list_task).
    pub async fn task_has_keys(&self, task: &str) -> Result<bool, StoreError> {
        for (host, port) in self.masters().await? {
            if self
                .protocol
                .has_keys_on(task, self.on_master(&host, port))
                .await?
            {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Sends a command to one master by its address, as the client names it.
    pub(super) fn on_master(
        &self,
        host: &str,
        port: u16,
    ) -> impl FnMut(
        redis::Cmd,
    ) -> std::pin::Pin<Box<dyn Future<Output = redis::RedisResult<Value>> + Send>> {
        let connection = self.protocol.connection.clone();
        let host = host.to_owned();
        move |cmd| {
            let mut connection = connection.current();
            let address = SingleNodeRoutingInfo::ByAddress {
                host: host.clone(),
                port,
            };
            Box::pin(async move {
                connection
                    .route_command(cmd, RoutingInfo::SingleNode(address))
                    .await
            })
        }
    }
}

/// Input: the cluster client's reply to a command sent to every master without a response
/// policy, a map from each master's `host:port` to its reply. Output: each master's host and
/// port, once, sorted; `None` when the reply is shaped otherwise.
fn master_addresses(replies: &Value) -> Option<Vec<(String, u16)>> {
    let Value::Map(replies) = replies else {
        return None;
    };
    let mut masters = BTreeSet::new();
    for (address, _) in replies {
        let address = match address {
            Value::BulkString(bytes) => std::str::from_utf8(bytes).ok()?,
            Value::SimpleString(text) => text.as_str(),
            _ => return None,
        };
        // The port follows the last colon, so an IPv6 host keeps its own colons.
        let (host, port) = address.rsplit_once(':')?;
        masters.insert((host.to_owned(), port.parse().ok()?));
    }
    Some(masters.into_iter().collect())
}

delegate_store!(RedisClusterStore);

impl RedisClusterStoreBuilder {
    connection_setters!();

    /// How many times the cluster client re-sends one command (default
    /// [`DEFAULT_RETRIES`](RedisClusterStore::DEFAULT_RETRIES)); the response timeout bounds them all.
    pub fn retries(mut self, retries: u32) -> Self {
        self.retries = retries;
        self
    }

    /// Connects to the cluster, reads its slot map, and loads the scripts on every node.
    ///
    /// # Errors
    /// A [`StoreError`] of kind `Configuration` for no seed node, a bad URL, namespace or
    /// credentials, and `Unreachable` or `Timeout` when no seed node answers in time.
    pub async fn connect(self) -> Result<RedisClusterStore, StoreError> {
        let settings = &self.settings;
        check_namespace(&settings.namespace)?;
        if self.nodes.is_empty() {
            return Err(StoreError::new(
                "connect",
                StoreErrorKind::Configuration,
                "no seed node given; pass at least one `redis://host:port` of the cluster",
            ));
        }
        let client = ClusterClient::builder(self.nodes.iter().map(String::as_str))
            .connection_timeout(settings.connection_timeout)
            .response_timeout(settings.response_timeout())
            .overall_response_timeout(Some(settings.response_timeout()))
            .retries(self.retries)
            // Re-sends after TRYAGAIN or a redirect come quickly: the defaults start at 1.28 s,
            // longer than the whole call may take.
            .min_retry_wait(10)
            .max_retry_wait(500)
            .retry_wait_formula(10, 2);
        let client = self
            .with_tls(client)
            .build()
            .map_err(|err| store_error("connect", &err, false))?;
        // The client tries every seed node; the whole attempt still gets one deadline.
        let deadline = settings.connection_timeout.saturating_mul(3);
        let connection = connect_within(deadline, client.get_async_connection(), false).await?;
        let connection = HealingConnection::new(client, connection, deadline);
        Ok(RedisClusterStore {
            // The client's overall response timeout bounds each command; a timeout of the
            // protocol's own around it would cut the call short before the healing
            // connection sees the client's timeout.
            protocol: Protocol::new(
                connection,
                self.settings.namespace,
                self.settings.max_key_len,
                true,
                None,
            )
            .await?,
        })
    }

    #[cfg(not(feature = "tls"))]
    #[allow(
        clippy::unused_self,
        reason = "the `tls` feature's version reads the seeds and the settings"
    )]
    fn with_tls(&self, client: ClusterClientBuilder) -> ClusterClientBuilder {
        client
    }

    /// The private CA, for seeds that are `rediss://`: the client then checks every node's
    /// certificate against it. (redis-rs would speak TLS to `redis://` seeds too once given
    /// certificates; those stay plain, as for the other stores.)
    #[cfg(feature = "tls")]
    fn with_tls(&self, client: ClusterClientBuilder) -> ClusterClientBuilder {
        // The first seed decides for all: redis-rs takes the cluster's TLS mode from it and
        // refuses seeds of the other scheme, a `Configuration` error at `connect`.
        let tls = self
            .nodes
            .first()
            .is_some_and(|url| url.starts_with("rediss:"));
        match self.settings.tls_certificates() {
            Some(certificates) if tls => client.certs(certificates),
            _ => client,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pong(address: &str) -> (Value, Value) {
        (
            Value::BulkString(address.as_bytes().to_vec()),
            Value::SimpleString("PONG".to_owned()),
        )
    }

    #[test]
    fn masters_are_read_once_each_from_the_clients_own_addresses() {
        let replies = Value::Map(vec![
            pong("127.0.0.1:7002"),
            pong("127.0.0.1:7000"),
            pong("::1:7004"),
        ]);
        assert_eq!(
            master_addresses(&replies),
            Some(vec![
                ("127.0.0.1".to_owned(), 7000),
                ("127.0.0.1".to_owned(), 7002),
                ("::1".to_owned(), 7004),
            ])
        );
    }

    #[tokio::test]
    async fn seeds_of_both_schemes_are_a_configuration_error() {
        let seeds = ["redis://127.0.0.1:1", "rediss://127.0.0.1:2"];
        let err = RedisClusterStore::builder(seeds)
            .connect()
            .await
            .expect_err("seeds with and without TLS");
        assert_eq!(err.kind(), StoreErrorKind::Configuration, "{err}");
    }

    #[test]
    fn a_reply_of_another_shape_is_refused() {
        assert_eq!(master_addresses(&Value::Int(3)), None);
        assert_eq!(master_addresses(&Value::Map(vec![pong("no-port")])), None);
        assert_eq!(
            master_addresses(&Value::Map(vec![pong("host:99999")])),
            None
        );
    }
}
