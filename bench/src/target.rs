//! What the bench runs against: one Redis server, or a Redis Cluster (`--cluster`).

use idempotask_redis::RedisClusterStore;
use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{Cmd, ConnectionAddr, IntoConnectionInfo, Pipeline, RedisFuture, Value};

use super::BenchError;

/// The store's own multiplexed connection, which the hand-written pattern and `PING` share.
#[derive(Clone)]
pub(crate) enum Connection {
    Server(ConnectionManager),
    /// Routes each command by its key, as the cluster store does.
    Cluster(ClusterConnection),
}

impl Connection {
    /// One `PING` round trip to one server: on a cluster to a single master, since a plain
    /// `PING` would go to every master and wait for the slowest.
    pub(crate) async fn ping(&mut self) -> Result<(), BenchError> {
        match self {
            Self::Server(connection) => {
                let _: String = redis::cmd("PING").query_async(connection).await?;
            }
            Self::Cluster(connection) => {
                let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::RandomPrimary);
                connection
                    .route_command(redis::cmd("PING").clone(), routing)
                    .await?;
            }
        }
        Ok(())
    }
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Server(connection) => connection.req_packed_command(cmd),
            Self::Cluster(connection) => connection.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Server(connection) => connection.req_packed_commands(pipeline, offset, count),
            Self::Cluster(connection) => connection.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Server(connection) => connection.get_db(),
            Self::Cluster(connection) => connection.get_db(),
        }
    }
}

/// Input: the cluster store and the seed URL (for its credentials). Output: a connection of
/// its own to every master that serves slots, for `INFO`, `SCAN` and the like, whose figures
/// the bench adds up.
pub(crate) async fn masters(
    store: &RedisClusterStore,
    seed: &str,
) -> Result<Vec<ConnectionManager>, BenchError> {
    let seed = seed.into_connection_info()?;
    let mut connections = Vec::new();
    for (host, port) in store.masters().await? {
        // The seed's credentials, and its TLS settings if it has any.
        let addr = match seed.addr() {
            ConnectionAddr::TcpTls {
                insecure,
                tls_params,
                ..
            } => ConnectionAddr::TcpTls {
                host,
                port,
                insecure: *insecure,
                tls_params: tls_params.clone(),
            },
            _ => ConnectionAddr::Tcp(host, port),
        };
        let info = seed.clone().set_addr(addr);
        connections.push(redis::Client::open(info)?.get_connection_manager().await?);
    }
    Ok(connections)
}
