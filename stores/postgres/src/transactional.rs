//! Transactional completion: the body's database writes and the unit's marker commit together.
//!
//! The lock is the unit's row, inserted inside the caller's transaction: every other
//! transactional delivery of the same key inserts the same primary key and so waits on it until
//! this transaction ends (a plain one waits at most four fifths of the store's response
//! timeout). Commit makes
//! the writes and the marker visible at once; a rollback, an `Err`, a panic, a dropped future or
//! a dead worker leaves neither.

use std::sync::atomic::Ordering;
use std::time::Duration;

use idempotask::store::{Begin, Fencing, SharedStore, StoreError, TransactionScope};
use idempotask::store::{LockToken, UnitOfWork};
use sqlx::postgres::{PgConnection, Postgres};

use crate::PostgresStore;
use crate::errors::store_error;
use crate::rows::{fence_param, memory_micros, millis};
use crate::store::BeginStatements;
use crate::transaction_steps::{Attempt, TransactionSteps, close_attempt};

/// One PostgreSQL transaction in which a call takes its unit's row, runs its body and commits
/// the marker: what [`Call::run_in_transaction`](idempotask::Call::run_in_transaction) is given.
/// Made by [`PostgresStore::transaction`].
///
/// ```no_run
/// use idempotask::Task;
/// use idempotask_postgres::PostgresStore;
///
/// static TRANSFER: Task = Task::new("transfer");
///
/// # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
/// # let store = PostgresStore::connect("postgres://app@db/app").await?;
/// let transaction = store.pool().begin().await?;
/// let moved: u64 = TRANSFER
///     .call("transfer-77")
///     .run_in_transaction(store.transaction(transaction), async |db| {
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
///
/// # Behaviour
/// - The lock is the unit's row, inserted inside the transaction: every other transactional
///   delivery of the same key inserts the same primary key and so waits on it until this
///   transaction ends; a plain call waits at most four fifths of the store's response timeout,
///   then fails with a `Timeout` that is not ambiguous.
/// - Commit makes the writes and the marker visible at once; a rollback, an `Err`, a panic, a
///   dropped future or a dead worker leaves neither.
/// - The transaction comes from a pool (`pool.begin()`), so that a dropped one is rolled back
///   as its connection returns to the pool. Use the default isolation level, `READ
///   COMMITTED`: under `REPEATABLE READ` or `SERIALIZABLE` a delivery that waited on another's
///   row fails with a serialization error ([`Error::Store`](idempotask::Error::Store)) instead of
///   replaying; its redelivery replays.
/// - The marker and the commit get the store's response timeout; waiting for another
///   delivery's transaction does not.
/// - The body's steps ([`TaskContext::step`](idempotask::TaskContext::step)) are recorded
///   outside the transaction, each by one statement on a connection of the store's own pool,
///   accepted only while this transaction is still in progress: a rollback keeps them, as it
///   keeps their effects, and the next delivery replays them. The statement never touches the
///   unit's row, which this transaction holds, so it never waits on it. The statement that
///   takes the unit reads the transaction's id for them: no round trip of its own.
#[derive(Debug)]
pub struct PostgresTransaction<'s> {
    store: &'s PostgresStore,
    transaction: sqlx::Transaction<'static, Postgres>,
    /// The transaction's id, as the statement that took the unit read it.
    xid: Option<i64>,
    /// The attempt its steps open, if the body runs any (see `TransactionSteps`).
    attempt: Attempt,
}

impl PostgresStore {
    /// `transaction`, ready for [`Call::run_in_transaction`](idempotask::Call::run_in_transaction):
    /// the call's unit is kept in this store's table, inside `transaction`.
    pub fn transaction(
        &self,
        transaction: sqlx::Transaction<'static, Postgres>,
    ) -> PostgresTransaction<'_> {
        PostgresTransaction {
            store: self,
            transaction,
            xid: None,
            attempt: Attempt::default(),
        }
    }
}

impl TransactionScope for PostgresTransaction<'_> {
    type Handle = PgConnection;

    fn max_key_len(&self) -> usize {
        idempotask::store::Store::max_key_len(self.store)
    }

    async fn begin(
        &mut self,
        unit: &UnitOfWork,
        token: &LockToken,
        lock_ttl: Duration,
        fencing: Fencing,
    ) -> Result<Begin, StoreError> {
        let statements = &self.store.statements;
        let fresh = match fencing {
            Fencing::On => &statements.begin_fresh_fenced_in_transaction,
            _ => &statements.begin_fresh_in_transaction,
        };
        let statements = BeginStatements {
            fresh,
            full: &statements.begin_in_transaction,
            take_over: &statements.take_over_in_transaction,
        };
        let (answer, xid) = PostgresStore::begin_on(
            statements,
            &mut self.transaction,
            unit,
            token,
            lock_ttl,
            fencing,
        )
        .await
        .map_err(|err| store_error("begin", self.store.table(), err))?;
        self.xid = xid;
        if let Begin::Acquired { fencing_token, .. } = &answer {
            self.attempt.fence = fencing_token.and_then(|fence| i64::try_from(fence).ok());
            self.attempt.memory_us = memory_micros(token);
        }
        Ok(answer)
    }

    fn handle(&mut self) -> &mut PgConnection {
        &mut self.transaction
    }

    async fn commit(
        mut self,
        unit: &UnitOfWork,
        token: &LockToken,
        marker: &[u8],
        result_ttl: Duration,
    ) -> Result<(), StoreError> {
        let store = self.store;
        let completed = store
            .run("complete", async {
                // The attempt goes with the commit: committed, the execution ended cleanly.
                if let (true, Some(xid)) = (self.attempt.opened.load(Ordering::Acquire), self.xid) {
                    close_attempt(store, &mut self.transaction, unit, xid).await?;
                }
                complete(
                    store,
                    &mut self.transaction,
                    unit,
                    token,
                    marker,
                    result_ttl,
                )
                .await
            })
            .await;
        if let Err(err) = completed {
            let _ = self.transaction.rollback().await;
            return Err(err);
        }
        store.run("commit", self.transaction.commit()).await
    }

    /// The journal on the store's own connections, for this transaction's id, which the
    /// statement that took the unit read (asked for here only if it did not).
    async fn step_store(&mut self) -> Result<Option<SharedStore>, StoreError> {
        let store = self.store;
        let xid = match self.xid {
            Some(xid) => xid,
            None => {
                store
                    .run(
                        "begin",
                        sqlx::query_scalar("SELECT pg_current_xact_id()::text::bigint")
                            .fetch_one(&mut *self.transaction),
                    )
                    .await?
            }
        };
        // The id read here is the one the commit closes the attempt with.
        self.xid = Some(xid);
        Ok(Some(SharedStore::new(TransactionSteps {
            store: store.clone(),
            xid,
            attempt: self.attempt.clone(),
        })))
    }

    async fn abort(self) {
        // Whatever the statements locked goes now, not when the pool gets the connection back.
        let _ = self.transaction.rollback().await;
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
