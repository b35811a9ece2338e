//! Taking a connection of the store's pool within the response timeout, and saying why when the
//! pool cannot open one.
//!
//! sqlx's pool retries a server's refusal to open a connection until its deadline and then
//! reports only that it timed out. So a wait that is still going at half the response timeout
//! asks the server why with one connection of its own, beside the
//! wait and within the same deadline. One question runs at a time for the whole store and its
//! answer serves every waiter for a second: a server that refuses clients is not sent one more
//! attempt per waiter.

use std::sync::Arc;
use std::time::Duration;

use sqlx::Connection as _;
use sqlx::pool::PoolConnection;
use sqlx::{PgPool, Postgres};
use tokio::time::{Instant, timeout_at};

use super::errors::{classify, store_error};
use idempotask::store::{StoreError, StoreErrorKind};

/// How long one answer of the server about opening a connection serves other waiters.
const VERDICT_LIFETIME: Duration = Duration::from_secs(1);

/// The last answer of the server about opening a connection, shared by the store's clones.
#[derive(Debug, Default, Clone)]
pub(super) struct Diagnosis {
    last: Arc<tokio::sync::Mutex<Option<(Instant, Verdict)>>>,
}

/// What a connection attempt outside the pool came to.
#[derive(Debug, Clone)]
enum Verdict {
    /// The server took it: the pool is merely slow to open one.
    Takes,
    /// The server refused or could not be reached, for this reason.
    Refuses {
        kind: StoreErrorKind,
        message: String,
    },
}

/// A connection of `pool`, waited for until `response_timeout` has passed; `table` names the
/// store's table in errors. Nothing has been sent while waiting, so no error here is
/// ambiguous: the caller knows the statement never ran.
pub(super) async fn checkout(
    pool: &PgPool,
    diagnosis: &Diagnosis,
    operation: &'static str,
    table: &str,
    response_timeout: Duration,
) -> Result<PoolConnection<Postgres>, StoreError> {
    let deadline = Instant::now() + response_timeout;
    let acquire = pool.acquire();
    tokio::pin!(acquire);
    // Most waits end long before half the timeout; only a slow one is worth a question, asked
    // whether the pool looks full or not (connections being opened count in its size).
    let mut verdict = None;
    let first = timeout_at(deadline - response_timeout / 2, &mut acquire).await;
    let waited = if let Ok(answer) = first {
        answer
    } else {
        let question = diagnosis.ask(pool, deadline);
        tokio::pin!(question);
        loop {
            tokio::select! {
                answer = timeout_at(deadline, &mut acquire) => {
                    if let Ok(answer) = answer {
                        break answer;
                    }
                    let takes = matches!(verdict, Some(Some(Verdict::Takes)));
                    return Err(timed_out(pool, operation, response_timeout, takes));
                }
                answer = &mut question, if verdict.is_none() => {
                    // The server's own reason: fail now with it rather than at the deadline.
                    if let Some(Verdict::Refuses { kind, message }) = answer {
                        return Err(StoreError::new(operation, kind, message));
                    }
                    verdict = Some(answer);
                }
            }
        }
    };
    match waited {
        Ok(connection) => Ok(connection),
        // The pool's own `acquire_timeout` ran out first: the same question, if not yet asked.
        Err(sqlx::Error::PoolTimedOut) => {
            let answer = match verdict {
                Some(answer) => answer,
                None => diagnosis.ask(pool, deadline).await,
            };
            Err(match answer {
                Some(Verdict::Refuses { kind, message }) => {
                    StoreError::new(operation, kind, message)
                }
                answer => timed_out(
                    pool,
                    operation,
                    response_timeout,
                    matches!(answer, Some(Verdict::Takes)),
                ),
            })
        }
        Err(err) => Err(store_error(operation, table, err)),
    }
}

impl Diagnosis {
    /// The server's answer to one connection attempt made outside the pool before `deadline`,
    /// or one made by another waiter less than [`VERDICT_LIFETIME`] ago; `None` when none came
    /// in time.
    async fn ask(&self, pool: &PgPool, deadline: Instant) -> Option<Verdict> {
        let mut last = self.last.lock().await;
        if let Some((at, verdict)) = &*last
            && at.elapsed() < VERDICT_LIFETIME
        {
            return Some(verdict.clone());
        }
        let options = pool.connect_options();
        let attempt = timeout_at(deadline, sqlx::PgConnection::connect_with(&options)).await;
        let verdict = match attempt {
            Err(_) => return None,
            Ok(Ok(connection)) => {
                let _ = connection.close().await;
                Verdict::Takes
            }
            Ok(Err(err)) => {
                let (kind, _, message) = classify("", &err);
                Verdict::Refuses { kind, message }
            }
        };
        *last = Some((Instant::now(), verdict.clone()));
        Some(verdict)
    }
}

/// A wait for a connection that ran out; `server_takes` when the server, asked meanwhile, took
/// a connection.
fn timed_out(
    pool: &PgPool,
    operation: &'static str,
    response_timeout: Duration,
    server_takes: bool,
) -> StoreError {
    let max = pool.options().get_max_connections();
    let message = if pool.size() >= max {
        format!(
            "no connection of the store's pool became free within {} ms; nothing was sent (more statements at once than its {max} connections can take: raise `PostgresStoreBuilder::max_connections`)",
            response_timeout.as_millis(),
        )
    } else if server_takes {
        format!(
            "the store's pool could not open a connection within {} ms, though the server takes one; nothing was sent",
            response_timeout.as_millis()
        )
    } else {
        format!(
            "the store's pool could not open a connection within {} ms; nothing was sent",
            response_timeout.as_millis()
        )
    };
    StoreError::new(operation, StoreErrorKind::Timeout, message)
}
