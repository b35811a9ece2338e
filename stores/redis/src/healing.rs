//! A cluster connection that replaces itself when it stops answering.
//!
//! A cluster connection whose slot map has gone wrong can keep failing every command: each one
//! times out, or comes back with a `MOVED` the client should have followed. Timeouts keep a
//! task from hanging, but the store would stay useless; so after such an error this wrapper
//! builds a fresh cluster connection in the background and swaps it in.
//!
//! `tests/cluster_events.rs` shows what it defends against: while slots move under load, a
//! connection without it keeps timing out on the moved units until their locks expire, and a
//! task whose body succeeded ends with its marker not written (`Outcome::MarkerNotWritten`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};

/// Input: a cluster client and its first connection.
/// Output: a connection whose commands go to the current cluster connection, and that starts a
/// replacement after a command timed out (one replacement at a time).
#[derive(Clone)]
pub(super) struct HealingConnection {
    client: ClusterClient,
    current: Arc<RwLock<ClusterConnection>>,
    replacing: Arc<AtomicBool>,
    connect_deadline: Duration,
}

impl HealingConnection {
    pub(super) fn new(
        client: ClusterClient,
        connection: ClusterConnection,
        connect_deadline: Duration,
    ) -> Self {
        Self {
            client,
            current: Arc::new(RwLock::new(connection)),
            replacing: Arc::new(AtomicBool::new(false)),
            connect_deadline,
        }
    }

    /// The cluster connection in use now.
    pub(super) fn current(&self) -> ClusterConnection {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn replace_in_background(&self) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.replacing.swap(true, Ordering::AcqRel) {
            return;
        }
        let this = self.clone();
        runtime.spawn(async move {
            let fresh =
                tokio::time::timeout(this.connect_deadline, this.client.get_async_connection())
                    .await;
            match fresh {
                Ok(Ok(connection)) => {
                    *this.current.write().unwrap_or_else(PoisonError::into_inner) = connection;
                    tracing::info!("replaced the Redis Cluster connection after a timeout");
                }
                Ok(Err(err)) => {
                    tracing::warn!(error = %err, "could not replace the Redis Cluster connection");
                }
                Err(_) => {
                    tracing::warn!("could not replace the Redis Cluster connection in time");
                }
            }
            this.replacing.store(false, Ordering::Release);
        });
    }

    fn check<T>(&self, result: redis::RedisResult<T>) -> redis::RedisResult<T> {
        if result.as_ref().is_err_and(is_stuck) {
            self.replace_in_background();
        }
        result
    }
}

/// A timeout, or a redirect the client should have followed itself: signs of a client whose
/// slot map no longer moves forward.
fn is_stuck(err: &redis::RedisError) -> bool {
    use redis::{ErrorKind, ServerErrorKind};
    err.is_timeout()
        || matches!(
            err.kind(),
            ErrorKind::Server(ServerErrorKind::Moved | ServerErrorKind::Ask)
                | ErrorKind::ClusterConnectionNotFound
        )
}

impl ConnectionLike for HealingConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        let mut connection = self.current();
        Box::pin(async move {
            let result = connection.req_packed_command(cmd).await;
            self.check(result)
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        let mut connection = self.current();
        Box::pin(async move {
            let result = connection
                .req_packed_commands(pipeline, offset, count)
                .await;
            self.check(result)
        })
    }

    fn get_db(&self) -> i64 {
        self.current().get_db()
    }
}
