//! The journals of steps: reading a unit's journal and recording a step, each one statement on
//! the steps table (see the statements' module for the SQL and its concurrency).

use std::time::Duration;

use idempotask::store::{Journal, LockToken, StepEntry, StoreError, UnitOfWork};
use sqlx::Row;

use crate::PostgresStore;
use crate::errors::{store_error, unexpected};
use crate::rows::{fence_param, get, millis};
use crate::store::renewal;

impl PostgresStore {
    /// The unit's journal: one `SELECT` of its live entries, in order. Its positions are
    /// `0..n` (a record keeps them so); a journal with a gap is refused rather than replayed
    /// with a step missing.
    pub(crate) async fn journal(&self, unit: &UnitOfWork) -> Result<Journal, StoreError> {
        let mut connection = self.acquire("read_journal").await?;
        let rows = self
            .run(
                "read_journal",
                sqlx::query(self.statements.read_journal.clone())
                    .bind(unit.task())
                    .bind(unit.key().as_bytes())
                    .fetch_all(&mut *connection),
            )
            .await?;
        let mut entries = Vec::with_capacity(rows.len());
        for row in rows {
            let position: i32 = get(&row, "position", "read_journal", &self.table)?;
            if usize::try_from(position).ok() != Some(entries.len()) {
                return Err(unexpected(
                    "read_journal",
                    format!(
                        "the journal has an entry at position {position} after {} entries",
                        entries.len()
                    ),
                ));
            }
            entries.push(get(&row, "entry", "read_journal", &self.table)?);
        }
        Ok(Journal::from_entries(entries))
    }

    /// Records `entry` for the holder of `token`, and renews its lock to `lock_ttl`: one
    /// statement. A fencing token or a position beyond the columns' range was never granted or
    /// reached, so it records nothing.
    pub(crate) async fn append_step(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        entry: StepEntry<'_>,
        lock_ttl: Duration,
    ) -> Result<bool, StoreError> {
        let (Ok(fence), Ok(position)) = (fence_param(token), i32::try_from(entry.position)) else {
            return Ok(false);
        };
        let mut connection = self.acquire("record_step").await?;
        let row = self
            .run(
                "record_step",
                renewal(&self.statements.record_step, unit, token, fence, lock_ttl)
                    .bind(position)
                    .bind(entry.bytes)
                    .bind(millis(entry.kept_for))
                    .fetch_one(&mut *connection),
            )
            .await?;
        row.try_get("recorded")
            .map_err(|err| store_error("record_step", &self.table, err))
    }
}
