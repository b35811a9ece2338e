//! Where the commands look: one Redis server, or every master of a Redis Cluster.
//!
//! The URL names one server. If that server is a cluster node (see [`crate::kind`]), it is a
//! seed of a cluster: the commands then use a [`RedisClusterStore`], which routes each unit to
//! the master of its slot, and `list` scans every master. Nothing has to be told which kind it
//! is.

use idempotask::store::{SharedStore, Store, UnitOfWork};
use idempotask_redis::RedisKeys;
use idempotask_redis::{RedisClusterStore, RedisStore};
use redis::aio::ConnectionManager;
use redis::cluster_async::ClusterConnection;
use redis::{RedisError, Value};

use crate::exit::{Exit, Failure};
use crate::kind::{ServerKind, detect};
use crate::scan::Node;
use crate::stored::{FORGET, Forgot, READ, Read};

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
        let is_cluster = detect(&mut connection, url).await? == ServerKind::Cluster;
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

    /// What the unit's key holds, and the clock of the server that owns it.
    pub(crate) async fn read(&self, key: &str) -> Result<Read, Failure> {
        let invocation = READ.key(key);
        let reply: Result<Value, RedisError> = match &self.backend {
            Backend::Server(_, connection) => {
                invocation.invoke_async(&mut connection.clone()).await
            }
            Backend::Cluster(_, connection) => {
                invocation.invoke_async(&mut connection.clone()).await
            }
        };
        let reply = reply.map_err(|err| self.redis_failure("read", &err))?;
        Read::from_reply(&reply).map_err(|why| Failure::new(Exit::Error, "redis", why))
    }

    /// Forgets the unit's key if it still holds exactly `shown`.
    pub(crate) async fn forget_exact(&self, key: &str, shown: &[u8]) -> Result<Forgot, Failure> {
        let mut invocation = FORGET.key(key);
        invocation.arg(shown);
        let reply: Result<i64, RedisError> = match &self.backend {
            Backend::Server(_, connection) => {
                invocation.invoke_async(&mut connection.clone()).await
            }
            Backend::Cluster(_, connection) => {
                invocation.invoke_async(&mut connection.clone()).await
            }
        };
        let reply = reply.map_err(|err| self.redis_failure("forget", &err))?;
        Forgot::from_reply(reply).ok_or_else(|| {
            Failure::new(
                Exit::Error,
                "redis",
                format!("unexpected reply {reply} to the forget script for `{key}`"),
            )
        })
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
pub(crate) fn redis_failure(url: &str, operation: &'static str, err: &RedisError) -> Failure {
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
