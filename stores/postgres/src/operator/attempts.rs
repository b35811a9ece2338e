//! Units held in doubt at a step inside a transaction, for the operator: a transactional
//! execution that died in its steps leaves its attempt (`<table>_runs`) and no lock in the
//! units table, so reads, listings and resolutions look there too (see the statements'
//! `attempts` module). Such a unit is shown as a lock in doubt whose token is the attempt's:
//! the rows here are those of the operator's reads of the units table.

use idempotask::operator::{Resolution, Resolved};
use idempotask::store::{StoreError, StoreErrorKind, UnitOfWork};
use sqlx::postgres::{PgArguments, PgRow};
use sqlx::{Postgres, query::Query};

use crate::PostgresStore;
use crate::rows::millis;
use crate::statements::TOKEN_PREFIX;

/// `unit`'s attempt in doubt, as a row of the operator's `read`, if it has one.
pub(super) async fn held_row(
    store: &PostgresStore,
    unit: &UnitOfWork,
) -> Result<Option<PgRow>, StoreError> {
    let statement = store.statements.attempts.read.clone();
    let mut connection = store.acquire("read").await?;
    store
        .run(
            "read",
            sqlx::query(statement)
                .bind(unit.task())
                .bind(unit.key().as_bytes())
                .fetch_optional(&mut *connection),
        )
        .await
}

/// Up to `limit` of `task`'s attempts in doubt after the key `after`, in key order, as rows of
/// the operator's `list`.
pub(super) async fn held_rows(
    store: &PostgresStore,
    task: &str,
    after: Option<&[u8]>,
    limit: i64,
) -> Result<Vec<PgRow>, StoreError> {
    let statement = store.statements.attempts.list.clone();
    let mut connection = store.acquire("list").await?;
    store
        .run(
            "list",
            sqlx::query(statement)
                .bind(task)
                .bind(after.unwrap_or_default())
                .bind(limit)
                .fetch_all(&mut *connection),
        )
        .await
}

/// Input: a resolution of `unit`'s attempt in doubt of the transaction `xid` (its token, as
/// shown). Output: the compare-and-set statement that carries it out, its parameters bound,
/// and what it did when it wrote. A unit's own result cannot stand in for the held step's
/// here: the marker would have to be written in the units table, whose row a new delivery's
/// transaction may hold.
pub(super) fn resolution<'q>(
    store: &'q PostgresStore,
    unit: &'q UnitOfWork,
    xid: i64,
    resolution: &'q Resolution,
) -> Result<(Query<'q, Postgres, PgArguments>, Resolved), StoreError> {
    let held = &store.statements.attempts;
    let statement = |sql: &sqlx::SqlStr| {
        sqlx::query(sql.clone())
            .bind(unit.task())
            .bind(unit.key().as_bytes())
            .bind(xid)
    };
    Ok(match resolution.step_to_record()? {
        Some((entry, kept_for)) => (
            statement(&held.step).bind(entry).bind(millis(kept_for)),
            Resolved::StepRecorded,
        ),
        None if resolution.marker_to_store(unit)?.is_some() => {
            return Err(StoreError::new(
                "resolve",
                StoreErrorKind::Configuration,
                "the unit is held at a step of a transaction that died: record that step's result (`--step-result`) or free it (`--free`, `--free --discard-steps`)",
            ));
        }
        None if resolution.discards_steps() => (statement(&held.free_discarding), Resolved::Freed),
        None => (statement(&held.free), Resolved::Freed),
    })
}

/// The transaction's id in a token [`held_row`] showed; `None` for the token of a lock.
pub(super) fn attempt_xid(token: &str) -> Option<i64> {
    token.strip_prefix(TOKEN_PREFIX)?.parse().ok()
}
