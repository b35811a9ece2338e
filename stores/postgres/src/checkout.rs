//! Taking a connection of the store's pool within the response timeout, and saying why when the
//! pool cannot open one.
//!
//! sqlx's pool retries a server's refusal to open a connection until its deadline and then
//! reports only that it timed out. So a wait that is still going at half the response timeout
//! asks the server why with one connection of its own, beside the wait and within the same
//! deadline; a wait that runs out then says why. One question runs at a time for the whole
//! store and its answer (no answer included) serves every waiter for a second: a server that
//! refuses clients, or does not answer, is not sent one more attempt per waiter.

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
    /// Not asked, or no answer in time.
    Unknown,
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
///
/// A server that refuses new clients does not end the wait early: a connection of the pool may
/// still come free before the deadline. Only a wait that runs out says why.
pub(super) async fn checkout(
    pool: &PgPool,
    diagnosis: &Diagnosis,
    operation: &'static str,
    table: &str,
    response_timeout: Duration,
) -> Result<PoolConnection<Postgres>, StoreError> {
    let started = Instant::now();
    let deadline = later(started, response_timeout);
    let acquire = pool.acquire();
    tokio::pin!(acquire);
    // Most waits end long before half the timeout; only a slow one is worth a question, asked
    // whether the pool looks full or not (connections being opened count in its size).
    let first = timeout_at(later(started, response_timeout / 2), &mut acquire).await;
    let (waited, verdict) = if let Ok(answer) = first {
        (answer, Verdict::Unknown)
    } else {
        let question = timeout_at(deadline, diagnosis.ask(pool, deadline));
        tokio::pin!(question);
        let mut verdict = None;
        loop {
            tokio::select! {
                answer = timeout_at(deadline, &mut acquire) => {
                    let verdict = verdict.unwrap_or(Verdict::Unknown);
                    match answer {
                        Ok(answer) => break (answer, verdict),
                        Err(_) => return Err(ran_out(pool, operation, response_timeout, verdict)),
                    }
                }
                answer = &mut question, if verdict.is_none() => {
                    verdict = Some(answer.unwrap_or(Verdict::Unknown));
                }
            }
        }
    };
    match waited {
        Ok(connection) => Ok(connection),
        // The pool's own `acquire_timeout` ran out first: the same question, if not yet asked.
        Err(sqlx::Error::PoolTimedOut) => {
            let verdict = match verdict {
                Verdict::Unknown => timeout_at(deadline, diagnosis.ask(pool, deadline))
                    .await
                    .unwrap_or(Verdict::Unknown),
                known => known,
            };
            Err(ran_out(pool, operation, response_timeout, verdict))
        }
        Err(err) => Err(store_error(operation, table, err)),
    }
}

/// `at` + `after`, or a time as good as never when that is past what an `Instant` holds (a
/// response timeout of `Duration::MAX` means no limit).
fn later(at: Instant, after: Duration) -> Instant {
    at.checked_add(after)
        .unwrap_or_else(|| at + Duration::from_secs(100 * 365 * 24 * 60 * 60))
}

/// The error of a wait for a connection that ran out: the server's refusal when it refuses new
/// clients (retryable, with its remedy), else a timeout.
fn ran_out(
    pool: &PgPool,
    operation: &'static str,
    response_timeout: Duration,
    verdict: Verdict,
) -> StoreError {
    match verdict {
        Verdict::Refuses { kind, message } => StoreError::new(
            operation,
            kind,
            format!(
                "no connection of the store's pool within {} ms, and the server refuses new clients: {message}",
                response_timeout.as_millis()
            ),
        ),
        Verdict::Takes => timed_out(pool, operation, response_timeout, true),
        Verdict::Unknown => timed_out(pool, operation, response_timeout, false),
    }
}

impl Diagnosis {
    /// The server's answer to one connection attempt made outside the pool before `deadline`,
    /// or the one another waiter got less than [`VERDICT_LIFETIME`] ago (an attempt that got
    /// no answer in time included, so that a server that does not answer is not sent one
    /// attempt per waiter).
    async fn ask(&self, pool: &PgPool, deadline: Instant) -> Verdict {
        let mut last = self.last.lock().await;
        if let Some((at, verdict)) = &*last
            && at.elapsed() < VERDICT_LIFETIME
        {
            return verdict.clone();
        }
        let options = pool.connect_options();
        let attempt = timeout_at(deadline, sqlx::PgConnection::connect_with(&options)).await;
        let verdict = match attempt {
            Err(_) => Verdict::Unknown,
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
        verdict
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
