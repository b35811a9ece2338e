//! Transactional completion: the body's database writes and the unit's marker commit together.
//!
//! The lock is the unit's row, inserted inside the caller's transaction: every other
//! transactional delivery of the same key inserts the same primary key and so waits on it until
//! this transaction ends (a plain one waits up to the store's response timeout). Commit makes
//! the writes and the marker visible at once; a rollback, an `Err`, a panic, a dropped future or
//! a dead worker leaves neither.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use sqlx::postgres::{PgConnection, Postgres};
use tokio::time::Instant;
use tracing::Instrument;

use super::errors::store_error;
use super::{PostgresStore, fence_param, millis};
use crate::call::{Call, check_marker_key, codec, contended, failed};
use crate::context::{Lease, TaskContext};
use crate::error::{CodecErrorKind, Error};
use crate::marker::Marker;
use crate::observe::{Ending, Observation};
use crate::store::{Begin, Store};
use crate::unit::{LockToken, UnitOfWork};

/// The validity a transactional execution's context reports: its lock is the row lock, held
/// until the transaction ends, whatever the task's lock TTL.
const HELD_UNTIL_THE_TRANSACTION_ENDS: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

impl Call<'_> {
    /// Runs `body` inside `transaction` at most once for this key, and commits the body's
    /// writes together with the unit's completion marker: exactly once for work that is a
    /// write to the same PostgreSQL database as `store`'s table.
    ///
    /// The call owns the transaction: it commits it when the body succeeds and rolls it back
    /// otherwise, so start a fresh one for each call. The store set with
    /// [`store`](Self::store) or installed is not used; `store` names the table.
    ///
    /// # Behaviour
    /// - The unit's row is written first, inside the transaction. Another delivery of the
    ///   same key waits on that row until this transaction ends, then replays the stored
    ///   result if it committed, or runs if it rolled back. The wait is as long as the
    ///   transaction: keep the body to database work (an outbound call inside an open
    ///   transaction holds its row locks for as long as the call takes; keep those on
    ///   [`run`](Self::run), with a database constraint behind it).
    /// - Done already: the stored value, decoded; the transaction is rolled back and the body
    ///   does not run.
    /// - Locked by a plain (non-transactional) call of the same task: [`Error::Contended`] at
    ///   once, and the transaction is rolled back: waiting inside it could keep a row lock that
    ///   stops the plain holder from recording its result. Redeliver later; better, do not mix
    ///   the two paths for one task.
    /// - `Ok`: the marker is written and the transaction committed; the value is returned only
    ///   once the commit succeeded.
    /// - `Err`, a panic, or this future dropped: the transaction is rolled back (sqlx rolls
    ///   back a dropped transaction), nothing is stored, and the next delivery runs.
    /// - A crash anywhere before the commit: PostgreSQL aborts the transaction when the
    ///   connection drops, with the same effect.
    ///
    /// The transaction comes from a pool (`pool.begin()`), so that a dropped one is rolled back
    /// as its connection returns to the pool. Use the default isolation level, `READ
    /// COMMITTED`: under `REPEATABLE READ` or `SERIALIZABLE` a delivery that waited on
    /// another's row fails with a serialization error ([`Error::Store`]) instead of replaying;
    /// its redelivery replays. The marker and the commit get the store's response timeout;
    /// waiting for another delivery's transaction does not.
    ///
    /// # Errors
    /// The body's own error, or an [`Error`] converted into `E`: [`Error::Store`] when a
    /// statement or the commit fails (after a failed commit nothing was stored, unless the
    /// error says the outcome is unknown), [`Error::Contended`], [`Error::KeyReuse`] and the
    /// decoding errors of [`run`](Self::run).
    ///
    /// ```no_run
    /// use idempotask::{PostgresStore, Task};
    ///
    /// static TRANSFER: Task = Task::new("transfer");
    ///
    /// # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    /// # let store = PostgresStore::connect("postgres://app@db/app").await?;
    /// let transaction = store.pool().begin().await?;
    /// let moved: u64 = TRANSFER
    ///     .call("transfer-77")
    ///     .run_in_transaction(&store, transaction, async |db| {
    ///         sqlx::query("UPDATE accounts SET balance = balance - 500 WHERE id = 1")
    ///             .execute(&mut *db)
    ///             .await?;
    ///         sqlx::query("UPDATE accounts SET balance = balance + 500 WHERE id = 2")
    ///             .execute(&mut *db)
    ///             .await?;
    ///         Ok::<_, Box<dyn std::error::Error + Send + Sync>>(500)
    ///     })
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub async fn run_in_transaction<T, E, F>(
        self,
        store: &PostgresStore,
        transaction: sqlx::Transaction<'static, Postgres>,
        body: F,
    ) -> Result<T, E>
    where
        T: Serialize + DeserializeOwned,
        E: From<Error>,
        F: AsyncFnOnce(&mut PgConnection) -> Result<T, E>,
    {
        let observation = Observation::start(&self.task.name);
        let span = observation.span().clone();
        let result = self
            .run_transaction(store, transaction, body, &observation)
            .instrument(span)
            .await;
        match result {
            Ok((value, ending)) => {
                observation.ended(ending);
                Ok(value)
            }
            Err((err, ending)) => {
                observation.ended(ending);
                Err(err)
            }
        }
    }

    async fn run_transaction<T, E, F>(
        self,
        store: &PostgresStore,
        mut transaction: sqlx::Transaction<'static, Postgres>,
        body: F,
        observation: &Observation<'_>,
    ) -> Result<(T, Ending), (E, Ending)>
    where
        T: Serialize + DeserializeOwned,
        E: From<Error>,
        F: AsyncFnOnce(&mut PgConnection) -> Result<T, E>,
    {
        crate::names::claim(self.task).map_err(failed)?;
        let unit = UnitOfWork::with_limit(self.task.name(), self.key.as_str(), store.max_key_len())
            .map_err(|err| failed(Error::from(err)))?;
        observation.key(&unit, self.task.log_key);
        let token = LockToken::generate();
        let waiting = Instant::now();
        let claimed = self.claim(store, &mut transaction, &unit, &token).await;
        if let Ok(Claim::Replay { attempts, .. } | Claim::Run { attempts, .. })
        | Err(Error::Contended { attempts, .. }) = &claimed
        {
            observation.waited(*attempts, waiting.elapsed());
        }
        let claimed = match claimed {
            Ok(claimed) => claimed,
            Err(err) => {
                // Whatever the statement locked goes now, not when the pool gets the
                // connection back.
                let _ = transaction.rollback().await;
                return Err(failed(err));
            }
        };
        match claimed {
            Claim::Replay { marker, .. } => {
                observation.fencing_token(marker.fencing_token());
                // Nothing of this delivery's may commit; the body did not run.
                let _ = transaction.rollback().await;
                let value = self.replay(&unit, &marker).map_err(failed)?;
                Ok((value, Ending::Replayed))
            }
            Claim::Run {
                fencing_token,
                attempts,
            } => {
                observation.fencing_token(fencing_token);
                let lease = Arc::new(Lease::new(Instant::now(), HELD_UNTIL_THE_TRANSACTION_ENDS));
                let context = TaskContext::new(unit.clone(), fencing_token, attempts, lease);
                let running = Instant::now();
                let result = context.scope(body(&mut transaction)).await;
                observation.body_ran(running.elapsed());
                let value = match result {
                    Ok(value) => value,
                    Err(err) => {
                        let _ = transaction.rollback().await;
                        return Err((err, Ending::Failed));
                    }
                };
                let token = token.granted(fencing_token);
                let marker = self.marker_for(&unit, &token, &value);
                let result_ttl = self.task.result_ttl;
                let recorded = store
                    .run(
                        "complete",
                        complete(store, &mut transaction, &unit, &token, &marker, result_ttl),
                    )
                    .await;
                if let Err(err) = recorded {
                    let _ = transaction.rollback().await;
                    return Err(failed(Error::from(err)));
                }
                store
                    .run("commit", transaction.commit())
                    .await
                    .map_err(|err| failed(Error::from(err)))?;
                Ok((value, Ending::Executed))
            }
        }
    }

    /// Inserts the unit's row in the transaction, or finds the unit done or held by a plain
    /// call.
    async fn claim(
        &self,
        store: &PostgresStore,
        connection: &mut PgConnection,
        unit: &UnitOfWork,
        token: &LockToken,
    ) -> Result<Claim, Error> {
        let attempts = 1;
        let answer = PostgresStore::begin_on(
            &store.statements,
            connection,
            unit,
            token,
            self.task.lock_ttl,
            self.task.fencing,
        )
        .await
        .map_err(|err| store_error("begin", store.table(), err))?;
        match answer {
            Begin::Acquired { fencing_token } => Ok(Claim::Run {
                fencing_token,
                attempts,
            }),
            Begin::Done(bytes) => {
                let marker = Marker::decode(&bytes).map_err(|err| {
                    codec(
                        unit,
                        CodecErrorKind::Unreadable,
                        format!("the stored marker cannot be read: {err}"),
                    )
                })?;
                check_marker_key(unit, &marker)?;
                Ok(Claim::Replay { marker, attempts })
            }
            Begin::Busy { lock_ttl_remaining } => {
                Err(contended(unit, lock_ttl_remaining, attempts))
            }
        }
    }
}

/// Turns the transaction's own lock row into the marker.
async fn complete(
    store: &PostgresStore,
    connection: &mut PgConnection,
    unit: &UnitOfWork,
    token: &LockToken,
    marker: &[u8],
    result_ttl: Duration,
) -> Result<(), sqlx::Error> {
    let fence = fence_param(token)
        .map_err(|_| sqlx::Error::Protocol("a fencing token beyond bigint".to_owned()))?;
    let done = sqlx::query(store.statements.complete_in_transaction.clone())
        .bind(unit.task())
        .bind(unit.key().as_bytes())
        .bind(token.as_str())
        .bind(fence)
        .bind(marker)
        .bind(millis(result_ttl))
        .execute(connection)
        .await?;
    if done.rows_affected() == 1 {
        Ok(())
    } else {
        // Nobody else can change a row this transaction wrote and has not committed.
        Err(sqlx::Error::Protocol(
            "the transaction's own lock row is gone".to_owned(),
        ))
    }
}

enum Claim {
    Replay {
        marker: Marker,
        attempts: u32,
    },
    Run {
        fencing_token: Option<u64>,
        attempts: u32,
    },
}
