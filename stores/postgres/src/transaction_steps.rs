//! The journal of a transactional call's steps: recorded outside the caller's transaction, on
//! the store's own connections, while that transaction holds the unit.
//!
//! A step's effect (a charge, a mail) is outside the database, so its record must not be
//! undone by a rollback: the next delivery would run the effect again. The record therefore
//! commits on its own. The unit's lock, though, is the transaction's uncommitted row, which
//! another connection cannot see, and which it must not wait on (the transaction is waiting
//! for the step): the records check instead that the transaction that took the unit is still
//! running, by its id (see the statements' module).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use idempotask::store::{Begin, Doubt, Fencing, Finish, Inspection, Journal, LockToken};
use idempotask::store::{StepEntry, Store, StoreError, StoreErrorKind, UnitOfWork};
use sqlx::Row;
use sqlx::postgres::PgConnection;

use crate::PostgresStore;
use crate::errors::store_error;
use crate::rows::{self, get, millis};

/// The store a [`PostgresTransaction`](crate::PostgresTransaction) hands the runner for its
/// body's steps: `PostgresStore`'s journal, written for the transaction `xid` rather than for
/// a lock token. Only the step operations (and `renew`, the fence) are its own; it takes,
/// finishes and forgets nothing.
#[derive(Debug, Clone)]
pub(crate) struct TransactionSteps {
    pub(crate) store: PostgresStore,
    /// The id of the caller's transaction (`pg_current_xact_id()`), once it took the unit.
    pub(crate) xid: i64,
    /// The execution's attempt: its fencing token and doubt memory, and whether it opened
    /// (shared with the transaction, whose commit closes it).
    pub(crate) attempt: Attempt,
}

/// What the attempt of a transactional execution with steps keeps (see the statements'
/// `open_attempt`): written at the body's first step, outside the transaction, and deleted
/// when the execution ends cleanly, so that one that finds an earlier one knows it died.
#[derive(Debug, Clone, Default)]
pub(crate) struct Attempt {
    /// The fencing token the transaction took the unit with.
    pub(crate) fence: Option<i64>,
    /// How long a dead attempt is remembered, in µs (the task's doubt memory).
    pub(crate) memory_us: i64,
    /// Whether the attempt row was written: only then is there one to delete.
    pub(crate) opened: Arc<AtomicBool>,
}

impl TransactionSteps {
    /// Opens this execution's attempt: the doubt of an earlier one that died in its steps,
    /// if there was one. Refused when the transaction no longer runs: no step may start
    /// then, since no attempt would say that it did.
    async fn open_attempt(&self, unit: &UnitOfWork) -> Result<Option<Doubt>, StoreError> {
        let store = &self.store;
        let mut connection = store.acquire("read_journal").await?;
        let row = store
            .run(
                "read_journal",
                sqlx::query(store.statements.in_transaction.open_attempt.clone())
                    .bind(unit.task())
                    .bind(unit.key().as_bytes())
                    .bind(self.xid)
                    .bind(self.attempt.fence)
                    .bind(self.attempt.memory_us)
                    .fetch_one(&mut *connection),
            )
            .await?;
        let opened: bool = get(&row, "opened", "read_journal", store.table())?;
        if !opened {
            return Err(StoreError::new(
                "read_journal",
                StoreErrorKind::Rejected,
                "the transaction that held the unit ended: no step may start",
            ));
        }
        self.attempt.opened.store(true, Ordering::Release);
        rows::doubt(&row).map_err(|err| store_error("read_journal", store.table(), err))
    }

    /// Whether the caller's transaction still runs, and so holds its unit.
    async fn holds(&self) -> Result<bool, StoreError> {
        let store = &self.store;
        let mut connection = store.acquire("renew").await?;
        let row = store
            .run(
                "renew",
                sqlx::query(store.statements.in_transaction.holds.clone())
                    .bind(self.xid)
                    .fetch_one(&mut *connection),
            )
            .await?;
        row.try_get::<Option<bool>, _>("held")
            .map(|held| held == Some(true))
            .map_err(|err| store_error("renew", store.table(), err))
    }
}

/// What the runner never asks of this store: the transaction does these itself.
fn not_here(operation: &'static str) -> StoreError {
    StoreError::new(
        operation,
        StoreErrorKind::Configuration,
        "the journal of a transaction's steps only records steps; the transaction holds the unit",
    )
}

impl Store for TransactionSteps {
    fn max_key_len(&self) -> usize {
        self.store.max_key_len()
    }

    async fn begin(
        &self,
        _: &UnitOfWork,
        _: &LockToken,
        _: Duration,
        _: Fencing,
    ) -> Result<Begin, StoreError> {
        Err(not_here("begin"))
    }

    async fn finish(
        &self,
        _: &UnitOfWork,
        _: &LockToken,
        _: &[u8],
        _: Duration,
    ) -> Result<Finish, StoreError> {
        Err(not_here("finish"))
    }

    /// The execution ended cleanly and its transaction rolled back: its attempt goes, one
    /// statement, and only when it opened one.
    async fn release(&self, unit: &UnitOfWork, _: &LockToken) -> Result<bool, StoreError> {
        if !self.attempt.opened.load(Ordering::Acquire) {
            return Ok(false);
        }
        let store = &self.store;
        let mut connection = store.acquire("release").await?;
        let closed = store
            .run(
                "release",
                close_attempt(store, &mut connection, unit, self.xid),
            )
            .await?;
        Ok(closed)
    }

    /// The fence: the transaction's lock lasts until it ends, so there is nothing to renew,
    /// only whether it still runs to answer.
    async fn renew(&self, _: &UnitOfWork, _: &LockToken, _: Duration) -> Result<bool, StoreError> {
        self.holds().await
    }

    async fn inspect(&self, unit: &UnitOfWork) -> Result<Inspection, StoreError> {
        self.store.inspect(unit).await
    }

    async fn forget(&self, _: &UnitOfWork) -> Result<bool, StoreError> {
        Err(not_here("forget"))
    }

    fn records_steps(&self) -> bool {
        true
    }

    /// Opens the execution's attempt first: the journal is answered in doubt when an earlier
    /// execution died in its steps (the statement's reply lost, the same statement sent
    /// again answers the same doubt).
    async fn read_journal(&self, unit: &UnitOfWork) -> Result<Journal, StoreError> {
        let doubt = self.open_attempt(unit).await?;
        let journal = self.store.journal(unit).await?;
        Ok(match doubt {
            Some(doubt) => journal.in_doubt(doubt),
            None => journal,
        })
    }

    async fn record_step(
        &self,
        unit: &UnitOfWork,
        _: &LockToken,
        entry: StepEntry<'_>,
        _: Duration,
    ) -> Result<bool, StoreError> {
        let Ok(position) = i32::try_from(entry.position) else {
            return Ok(false);
        };
        let store = &self.store;
        let mut connection = store.acquire("record_step").await?;
        let row = store
            .run(
                "record_step",
                sqlx::query(store.statements.in_transaction.record.clone())
                    .bind(unit.task())
                    .bind(unit.key().as_bytes())
                    .bind(self.xid)
                    .bind(position)
                    .bind(entry.bytes)
                    .bind(millis(entry.kept_for))
                    .fetch_one(&mut *connection),
            )
            .await?;
        row.try_get("recorded")
            .map_err(|err| store_error("record_step", store.table(), err))
    }
}

/// Deletes the attempt of the transaction `xid`, on `connection` (inside that transaction, at
/// its commit, or on the store's own after its rollback): whether there was one.
pub(crate) async fn close_attempt(
    store: &PostgresStore,
    connection: &mut PgConnection,
    unit: &UnitOfWork,
    xid: i64,
) -> Result<bool, sqlx::Error> {
    let closed = sqlx::query(store.statements.in_transaction.close_attempt.clone())
        .bind(unit.task())
        .bind(unit.key().as_bytes())
        .bind(xid)
        .execute(connection)
        .await?;
    Ok(closed.rows_affected() > 0)
}
