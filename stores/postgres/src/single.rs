//! The single statements of `begin`, `finish` and `release`: what a call sends when the
//! store groups nothing (see [`group_commit`](crate::PostgresStoreBuilder::group_commit)),
//! what a group of one sends, and what a batch asks alone.

use std::time::Duration;

use idempotask::store::lock_lost_marker;
use idempotask::store::{Begin, Fencing, Finish, LockToken, StoreError, UnitOfWork};
use sqlx::{Row, SqlStr};

use crate::errors::store_error;
use crate::rows::{fence_param, millis};
use crate::store::{BeginStatements, PostgresStore};

impl PostgresStore {
    /// `begin` in its own statements on a connection of the store's pool, never grouped.
    pub(crate) async fn begin_alone(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        lock_ttl: Duration,
        fencing: Fencing,
    ) -> Result<Begin, StoreError> {
        let mut connection = self.acquire("begin").await?;
        self.run("begin", async {
            let fresh = match fencing {
                Fencing::On => &self.statements.begin_fresh_fenced,
                _ => &self.statements.begin_fresh,
            };
            let statements = BeginStatements {
                fresh,
                full: &self.statements.begin,
                take_over: &self.statements.take_over,
            };
            Self::begin_on(statements, &mut connection, unit, token, lock_ttl, fencing)
                .await
                .map(|(answer, _)| answer)
        })
        .await
    }

    /// `finish` in its own statements on a connection of the store's pool, never grouped.
    pub(crate) async fn finish_alone(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        marker: &[u8],
        result_ttl: Duration,
    ) -> Result<Finish, StoreError> {
        let Ok(fence) = fence_param(token) else {
            return Ok(Finish::lost_nothing_written());
        };
        let bind = |sql: &SqlStr| {
            sqlx::query(sql.clone())
                .bind(unit.task())
                .bind(unit.key().as_bytes())
                .bind(token.as_str())
                .bind(fence)
                .bind(marker)
                .bind(millis(result_ttl))
        };
        // The common case is a plain UPDATE of the caller's own live lock; the statement that
        // tells a lost lock from a repeated finish runs only when that found nothing.
        let mut connection = self.acquire("finish").await?;
        let held = self
            .run(
                "finish",
                bind(&self.statements.finish_held).execute(&mut *connection),
            )
            .await?;
        if held.rows_affected() == 1 {
            return Ok(Finish::Completed);
        }
        let lost_marker = lock_lost_marker(marker).unwrap_or_else(|| marker.to_vec());
        let row = self
            .run(
                "finish",
                bind(&self.statements.finish)
                    .bind(lost_marker)
                    .fetch_one(&mut *connection),
            )
            .await?;
        let flag = |name: &str| {
            row.try_get::<bool, _>(name)
                .map_err(|err| store_error("finish", &self.table, err))
        };
        let (written, held) = (flag("written")?, flag("held")?);
        let (repeated, repeated_late) = (flag("repeated")?, flag("repeated_late")?);
        Ok(match (written, held) {
            (true, true) => Finish::Completed,
            (true, false) => Finish::lost_marker_written(),
            (false, _) if repeated => Finish::Completed,
            (false, _) if repeated_late => Finish::lost_marker_written(),
            (false, _) => Finish::lost_nothing_written(),
        })
    }

    /// `release` in one statement on a connection of the store's pool.
    pub(crate) async fn release_alone(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
    ) -> Result<bool, StoreError> {
        let mut connection = self.acquire("release").await?;
        let released: i64 = self
            .run(
                "release",
                sqlx::query_scalar(self.statements.release.clone())
                    .bind(unit.task())
                    .bind(unit.key().as_bytes())
                    .bind(token.as_str())
                    .fetch_one(&mut *connection),
            )
            .await?;
        Ok(released > 0)
    }
}
