//! Where the commands look: one Redis server, or every master of a Redis Cluster.
//!
//! The URL names one server. If that server answers `CLUSTER INFO`, it is a seed of a cluster:
//! the commands then use a [`RedisClusterStore`], which routes each unit to the master of its
//! slot, and `list` scans every master. Nothing has to be told which kind it is.

use idempotask::ops::{RedisKeys, Status};
use idempotask::store::{SharedStore, Store, UnitOfWork};
use idempotask::{RedisClusterStore, RedisStore, Task};
use redis::RedisError;
use redis::aio::ConnectionManager;
use redis::cluster_async::ClusterConnection;

use crate::exit::{Exit, Failure};
use crate::scan::Node;

/// The store and the namespace's layout, with the URL for error messages.
pub(crate) struct Target {
    backend: Backend,
    pub(crate) keys: RedisKeys,
    pub(crate) url: String,
}

/// The store, and a plain connection of the tool's own next to it for what the store does not
/// do (`SCAN`, the server's clock).
enum Backend {
    Server(RedisStore, ConnectionManager),
    // Boxed: the cluster store is several times the size of the server one.
    Cluster(Box<RedisClusterStore>, ClusterConnection),
}

/// `{GET fencing counter, TIME}` on the server that owns the unit (its clock, its counter).
const VALUE_AND_CLOCK: &str = "return {redis.call('GET', KEYS[1]), redis.call('TIME')}";

/// The fencing token of a lock's value (`L<token>.<fencing token>`); `None` for anything else.
pub(crate) fn lock_fencing_token(value: &[u8]) -> Option<u64> {
    let fence = value.strip_prefix(b"L")?.rsplit(|&b| b == b'.').next()?;
    (fence.len() < value.len() - 1)
        .then(|| std::str::from_utf8(fence).ok()?.parse().ok())
        .flatten()
}

impl Target {
    /// Input: a URL and a namespace. Output: a target on that server, or on its cluster.
    pub(crate) async fn connect(url: &str, namespace: &str) -> Result<Self, Failure> {
        let keys = RedisKeys::new(namespace).map_err(|err| Failure::usage(err.to_string()))?;
        let store = RedisStore::builder(url)
            .namespace(namespace)
            .connect()
            .await
            .map_err(|err| Failure::store(&err, url))?;
        let mut connection = redis::Client::open(url)
            .map_err(|err| redis_failure(url, "connect", &err))?
            .get_connection_manager()
            .await
            .map_err(|err| redis_failure(url, "connect", &err))?;
        // A cluster node answers a plain client too, but only for its own slots: ask first.
        // `CLUSTER INFO` rather than `INFO`, which ACL users without @dangerous may not run. A
        // standalone server refuses it ("cluster support disabled"); so may an ACL user's rights
        // on a standalone server, and on a cluster such a user would get typed `MOVED` errors
        // later rather than wrong answers, so any refusal means standalone.
        let cluster_info: Result<String, RedisError> = redis::cmd("CLUSTER")
            .arg("INFO")
            .query_async(&mut connection)
            .await;
        let is_cluster = match cluster_info {
            Ok(info) => info.contains("cluster_state:"),
            Err(err) if err.is_io_error() || err.is_timeout() || err.is_connection_dropped() => {
                return Err(redis_failure(url, "cluster info", &err));
            }
            Err(_) => false,
        };
        let backend = if is_cluster {
            let cluster = RedisClusterStore::builder([url])
                .namespace(namespace)
                .connect()
                .await
                .map_err(|err| Failure::store(&err, url))?;
            let connection = redis::cluster::ClusterClient::new(vec![url])
                .map_err(|err| redis_failure(url, "connect", &err))?
                .get_async_connection()
                .await
                .map_err(|err| redis_failure(url, "connect", &err))?;
            Backend::Cluster(Box::new(cluster), connection)
        } else {
            Backend::Server(store, connection)
        };
        Ok(Self {
            backend,
            keys,
            url: url.to_owned(),
        })
    }

    /// Whether the URL's server is part of a Redis Cluster.
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self.backend, Backend::Cluster(..))
    }

    fn store(&self) -> SharedStore {
        match &self.backend {
            Backend::Server(store, _) => SharedStore::new(store.clone()),
            Backend::Cluster(store, _) => SharedStore::new((**store).clone()),
        }
    }

    pub(crate) fn redis_failure(&self, operation: &'static str, err: &RedisError) -> Failure {
        redis_failure(&self.url, operation, err)
    }

    pub(crate) fn task_pattern(&self, task: &str) -> Result<String, Failure> {
        self.keys
            .task_pattern(task)
            .map_err(|err| Failure::usage(err.to_string()))
    }

    pub(crate) fn unit(&self, task: &str, key: &str) -> Result<UnitOfWork, Failure> {
        UnitOfWork::with_limit(task, key, self.store().max_key_len())
            .map_err(|err| Failure::usage(err.to_string()))
    }

    pub(crate) async fn status(&self, unit: &UnitOfWork) -> Result<Status, Failure> {
        Task::named(unit.task())
            .status(unit.key(), &self.store())
            .await
            .map_err(|err| match err {
                idempotask::Error::Store(err) => Failure::store(&err, &self.url),
                other => Failure::new(Exit::Error, "unreadable", other.to_string()),
            })
    }

    /// Deletes the unit's marker; `false` when there was none left to delete.
    pub(crate) async fn forget(&self, unit: &UnitOfWork) -> Result<bool, Failure> {
        self.store()
            .forget(unit)
            .await
            .map_err(|err| Failure::store(&err, &self.url))
    }

    /// How long ago the current lock was granted, for a lock with a fencing token: a token is
    /// the server's clock in microseconds when it is granted (or one more than the last token,
    /// when grants came faster), so `now - token` is the age. `None` for a lock without one
    /// (its task does not use fencing) or when the lock is gone.
    pub(crate) async fn token_age_ms(&self, unit: &UnitOfWork) -> Result<Option<u64>, Failure> {
        async fn ask(
            connection: &mut impl redis::aio::ConnectionLike,
            key: String,
        ) -> Result<(Option<Vec<u8>>, (u64, u64)), RedisError> {
            redis::Script::new(VALUE_AND_CLOCK)
                .key(key)
                .invoke_async(connection)
                .await
        }
        let key = self.keys.unit(unit);
        let reply = match &self.backend {
            Backend::Server(_, connection) => ask(&mut connection.clone(), key).await,
            Backend::Cluster(_, connection) => ask(&mut connection.clone(), key).await,
        };
        let (value, (secs, micros)) = reply.map_err(|err| self.redis_failure("token age", &err))?;
        let now_us = secs.saturating_mul(1_000_000).saturating_add(micros);
        Ok(value
            .as_deref()
            .and_then(lock_fencing_token)
            .map(|token| now_us.saturating_sub(token) / 1000))
    }

    /// The servers that hold keys: the one server, or every master of the cluster.
    pub(crate) async fn nodes(&self) -> Result<Vec<Node>, Failure> {
        match &self.backend {
            Backend::Server(_, connection) => Ok(vec![Node::Server(connection.clone())]),
            Backend::Cluster(store, connection) => {
                let masters = store
                    .masters()
                    .await
                    .map_err(|err| Failure::store(&err, &self.url))?;
                Ok(masters
                    .into_iter()
                    .map(|(host, port)| Node::Master {
                        connection: connection.clone(),
                        host,
                        port,
                    })
                    .collect())
            }
        }
    }
}

/// A failed Redis command as the CLI reports it, kind and all.
fn redis_failure(url: &str, operation: &'static str, err: &RedisError) -> Failure {
    let kind = if err.is_timeout() {
        idempotask::store::StoreErrorKind::Timeout
    } else if err.is_io_error() || err.is_connection_dropped() || err.is_connection_refusal() {
        idempotask::store::StoreErrorKind::Unreachable
    } else {
        idempotask::store::StoreErrorKind::Rejected
    };
    let store_err = idempotask::store::StoreError::new(operation, kind, err.to_string())
        .with_source(err.clone());
    Failure::store(&store_err, url)
}
