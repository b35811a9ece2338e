//! The journal of a transactional call's steps: recorded outside the caller's transaction, on
//! the store's own connections, while that transaction holds the unit.
//!
//! A step's effect (a charge, a mail) is outside the database, so its record must not be
//! undone by a rollback: the next delivery would run the effect again. The record therefore
//! commits on its own. The unit's lock, though, is the transaction's uncommitted row, which
//! another connection cannot see, and which it must not wait on (the transaction is waiting
//! for the step): the records check instead that the transaction that took the unit is still
//! running, by its id (see the statements' module).

use std::time::Duration;

use idempotask::store::{Begin, Fencing, Finish, Inspection, Journal, LockToken, StepEntry};
use idempotask::store::{Store, StoreError, StoreErrorKind, UnitOfWork};
use sqlx::Row;

use crate::PostgresStore;
use crate::errors::store_error;
use crate::rows::millis;

/// The store a [`PostgresTransaction`](crate::PostgresTransaction) hands the runner for its
/// body's steps: `PostgresStore`'s journal, written for the transaction `xid` rather than for
/// a lock token. Only the step operations (and `renew`, the fence) are its own; it takes,
/// finishes and forgets nothing.
#[derive(Debug, Clone)]
pub(crate) struct TransactionSteps {
    pub(crate) store: PostgresStore,
    /// The id of the caller's transaction (`pg_current_xact_id()`), once it took the unit.
    pub(crate) xid: i64,
}

impl TransactionSteps {
    /// Whether the caller's transaction still runs, and so holds its unit.
    async fn holds(&self) -> Result<bool, StoreError> {
        let store = &self.store;
        let mut connection = store.acquire("renew").await?;
        let row = store
            .run(
                "renew",
                sqlx::query(store.statements.transaction_holds.clone())
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

    async fn release(&self, _: &UnitOfWork, _: &LockToken) -> Result<bool, StoreError> {
        Err(not_here("release"))
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

    async fn read_journal(&self, unit: &UnitOfWork) -> Result<Journal, StoreError> {
        self.store.journal(unit).await
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
                sqlx::query(store.statements.record_step_in_transaction.clone())
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
