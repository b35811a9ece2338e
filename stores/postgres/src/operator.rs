//! For operators: what one unit's row holds, raw, the compare-and-forget of exactly the marker
//! an operator was shown, the resolution of a unit in doubt against exactly the lock an
//! operator was shown, and the listing of one task's units, page by page.
//!
//! [`PostgresStore::read_unit`](crate::PostgresStore::read_unit),
//! [`PostgresStore::forget_exact`](crate::PostgresStore::forget_exact),
//! [`PostgresStore::resolve_exact`](crate::PostgresStore::resolve_exact) and
//! [`PostgresStore::list_task`](crate::PostgresStore::list_task) answer with these types (and
//! [`Forgot`] and [`Resolved`],
//! the same on every backend). [`PostgresStore`] implements the core's
//! [`Operator`] with them, which the `idempotask` command is
//! built on.

use std::time::Duration;

use idempotask::operator::{
    Cursor, Forgot, Held, Listed, Operator, Page, Resolution, Resolved, Scope,
};
use idempotask::store::{
    Doubt, Journal, Store, StoreError, StoreErrorKind, UnitOfWork, check_task_name,
};
use sqlx::SqlStr;
use sqlx::postgres::PgRow;

use crate::PostgresStore;
use crate::errors::{store_error, unexpected};
use crate::rows::{Exact, doubt, get, left_duration, millis};

mod attempts;

/// One row of the store's table that counts: a unit of work that is locked, in doubt or done.
/// Rows whose expiry has passed count as absent and are never answered, except a lock that
/// ran out and is still remembered ([`UnitState::InDoubt`]).
///
/// ```no_run
/// # async fn run(store: idempotask_postgres::PostgresStore) -> Result<(), idempotask::store::StoreError> {
/// for unit in store.list_task("charge", None, 100).await? {
///     println!("{}: {:?}", String::from_utf8_lossy(&unit.key), unit.state);
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoredUnit {
    /// The caller's key, as stored (bytes: a key may hold any text).
    pub key: Vec<u8>,
    /// Whether it is locked, in doubt or done, and what that holds.
    pub state: UnitState,
}

/// What a row holds.
///
/// ```no_run
/// # async fn run(store: idempotask_postgres::PostgresStore, unit: idempotask::store::UnitOfWork) -> Result<(), Box<dyn std::error::Error>> {
/// use idempotask::operator::Marker;
/// use idempotask_postgres::operator::UnitState;
///
/// if let Some(row) = store.read_unit(&unit).await? {
///     match row.state {
///         UnitState::Done { marker, .. } => println!("{:?}", Marker::decode(&marker)?.result()),
///         UnitState::Locked { fencing_token, .. } => println!("locked, fence {fencing_token:?}"),
///         _ => {}
///     }
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum UnitState {
    /// A delivery holds the lock.
    #[non_exhaustive]
    Locked {
        /// The fencing token it was granted with, for a fenced task (from the table's
        /// sequence: it increases, but tells no time).
        fencing_token: Option<u64>,
        /// How long the lock has left.
        lock_ttl_remaining: Duration,
    },
    /// The unit is in doubt: its last lock ran out with neither a release nor a marker (or
    /// was released by a delivery that had itself taken the unit over in doubt), and the
    /// table still remembers it (for its holder's doubt memory). The next delivery takes
    /// it over and learns of it; until then its holder may still finish it. An operator who
    /// finds out whether its side effect happened resolves it
    /// ([`resolve_exact`](crate::PostgresStore::resolve_exact)).
    #[non_exhaustive]
    InDoubt {
        /// The token of that lock's holder, exactly as stored: what
        /// [`resolve_exact`](crate::PostgresStore::resolve_exact) compares.
        token: String,
        /// The fencing token that lock was granted with, for a fenced task.
        fencing_token: Option<u64>,
        /// How long ago the lock ran out, on the server's clock.
        expired_for: Duration,
        /// How long the table remembers it still; then the unit is free.
        forgotten_in: Duration,
    },
    /// The unit is done.
    #[non_exhaustive]
    Done {
        /// The completion marker's bytes, exactly as stored: what
        /// [`forget_exact`](crate::PostgresStore::forget_exact) compares. Decode them with
        /// [`Marker::decode`](idempotask::operator::Marker::decode).
        marker: Vec<u8>,
        /// How long the marker has left.
        ttl: Duration,
    },
}

impl PostgresStore {
    /// The most rows one [`list_task`](Self::list_task) page answers.
    pub const LIST_PAGE_MAX: usize = 10_000;

    /// For operators: `unit`'s row, raw (the marker's bytes, the lock's fencing token), when it
    /// is live or in doubt; `None` when it has none (never ran, released, expired or
    /// forgotten). Changes nothing.
    ///
    /// ```no_run
    /// # async fn run(store: idempotask_postgres::PostgresStore) -> Result<(), Box<dyn std::error::Error>> {
    /// use idempotask::store::UnitOfWork;
    /// use idempotask_postgres::operator::UnitState;
    ///
    /// let unit = UnitOfWork::new("charge", "order-42")?;
    /// match store.read_unit(&unit).await? {
    ///     Some(row) => match row.state {
    ///         UnitState::Done { ttl, .. } => println!("done, kept for {ttl:?}"),
    ///         UnitState::Locked { lock_ttl_remaining, .. } => println!("locked for {lock_ttl_remaining:?}"),
    ///         _ => {}
    ///     },
    ///     None => println!("unknown"),
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// A [`StoreError`] when the statement fails or its row is not one this store writes.
    pub async fn read_unit(&self, unit: &UnitOfWork) -> Result<Option<StoredUnit>, StoreError> {
        let mut connection = self.acquire("read").await?;
        let row = self
            .run(
                "read",
                sqlx::query(self.statements.read.clone())
                    .bind(unit.task())
                    .bind(unit.key().as_bytes())
                    .fetch_optional(&mut *connection),
            )
            .await?;
        let row = match row {
            Some(row) => Some(row),
            None => attempts::held_row(self, unit).await?,
        };
        row.map(|row| self.stored_unit(&row, "read")).transpose()
    }

    /// For operators: forgets `unit`'s marker only while it is still exactly `shown` (the
    /// bytes of a [`UnitState::Done`](UnitState::Done) an operator confirmed), in one
    /// statement, so that a marker a delivery wrote meanwhile stays; never a lock. A fenced
    /// unit's row keeps its fencing counter, as [`forget`](idempotask::store::Store::forget) leaves it.
    ///
    /// ```no_run
    /// # async fn run(store: idempotask_postgres::PostgresStore) -> Result<(), Box<dyn std::error::Error>> {
    /// use idempotask::store::UnitOfWork;
    /// use idempotask::operator::{Forgot, Resolution, Resolved};
    /// use idempotask_postgres::operator::UnitState;
    ///
    /// let unit = UnitOfWork::new("charge", "order-42")?;
    /// if let Some(row) = store.read_unit(&unit).await? {
    ///     if let UnitState::Done { marker, .. } = &row.state {
    ///         // … shown to the operator, who confirmed …
    ///         assert_ne!(store.forget_exact(&unit, marker).await?, Forgot::Changed);
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// A [`StoreError`] when the statement fails.
    pub async fn forget_exact(
        &self,
        unit: &UnitOfWork,
        shown: &[u8],
    ) -> Result<Forgot, StoreError> {
        let statement = sqlx::query(self.statements.forget_exact.clone())
            .bind(unit.task())
            .bind(unit.key().as_bytes())
            .bind(shown);
        Ok(
            match self
                .compare_and_set("forget", "forgotten", statement)
                .await?
            {
                Exact::Written => Forgot::Deleted,
                Exact::Changed => Forgot::Changed,
                Exact::Gone => Forgot::Gone,
            },
        )
    }

    /// For operators: resolves `unit`, [in doubt](idempotask::store::Doubt) with the lock
    /// whose token is `shown` (the `token` of a [`UnitState::InDoubt`](UnitState::InDoubt)
    /// an operator confirmed), in one statement, only while its row is still that lock, still
    /// run out and still remembered: [`Resolution::Record`] stores a completion marker in its
    /// place, kept for its result TTL, so that every later delivery gets its result back;
    /// [`Resolution::Free`] frees the unit (a fenced unit's row keeps its fencing counter, as
    /// a release leaves it), so that the next delivery runs the work as new with no doubt, and
    /// [`Resolution::FreeDiscardingSteps`] deletes the unit's journal with it;
    /// [`Resolution::RecordStep`] frees it so and appends a step's entry to its journal in the
    /// same statement, so that the next delivery replays that step and goes on after it. A
    /// unit that changed meanwhile (taken over, finished or renewed by its holder, resolved by
    /// someone else) is left alone: [`Resolved::Changed`]; one that became free (its memory
    /// ran out, or it was freed or released) is [`Resolved::Gone`].
    ///
    /// ```no_run
    /// # async fn run(store: idempotask_postgres::PostgresStore) -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use idempotask::operator::{Marker, Resolution, Resolved};
    /// use idempotask::store::UnitOfWork;
    /// use idempotask_postgres::operator::UnitState;
    /// use serde_json::value::RawValue;
    ///
    /// let unit = UnitOfWork::new("charge", "order-42")?;
    /// if let Some(row) = store.read_unit(&unit).await? {
    ///     if let UnitState::InDoubt { token, fencing_token, .. } = &row.state {
    ///         // … the payment provider says the charge went through …
    ///         let result = RawValue::from_string(r#"{"charge":"ch_1"}"#.to_owned())?;
    ///         let marker = Marker::encode_resolution(&unit, *fencing_token, &result);
    ///         let resolution = Resolution::record(marker, Duration::from_secs(24 * 60 * 60));
    ///         match store.resolve_exact(&unit, token, &resolution).await? {
    ///             Resolved::Recorded => println!("deliveries get the charge back"),
    ///             other => println!("left alone: {other:?}"),
    ///         }
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// A [`StoreError`] when the statement fails, and of kind `Configuration` for a marker
    /// that is not one for `unit` (nothing is sent then).
    pub async fn resolve_exact(
        &self,
        unit: &UnitOfWork,
        shown: &str,
        resolution: &Resolution,
    ) -> Result<Resolved, StoreError> {
        let step = resolution.step_to_record()?;
        let marker = match step {
            Some(_) => None,
            None => resolution.marker_to_store(unit)?,
        };
        let statement = |sql: &SqlStr| {
            sqlx::query(sql.clone())
                .bind(unit.task())
                .bind(unit.key().as_bytes())
                .bind(shown)
        };
        let (statement, resolved) = match (step, marker) {
            (Some((entry, kept_for)), _) => (
                statement(&self.statements.resolve_step)
                    .bind(entry)
                    .bind(millis(kept_for)),
                Resolved::StepRecorded,
            ),
            (None, Some((marker, result_ttl))) => (
                statement(&self.statements.resolve_record)
                    .bind(marker)
                    .bind(millis(result_ttl)),
                Resolved::Recorded,
            ),
            (None, None) if resolution.discards_steps() => (
                statement(&self.statements.resolve_free_discarding),
                Resolved::Freed,
            ),
            (None, None) => (statement(&self.statements.resolve_free), Resolved::Freed),
        };
        self.resolve_with(statement, resolved).await
    }

    /// Input: a resolution's compare-and-set statement, its parameters bound, and what it did
    /// when it wrote. Output: that, or what it found instead.
    async fn resolve_with(
        &self,
        statement: sqlx::query::Query<'_, sqlx::Postgres, sqlx::postgres::PgArguments>,
        resolved: Resolved,
    ) -> Result<Resolved, StoreError> {
        Ok(
            match self
                .compare_and_set("resolve", "resolved", statement)
                .await?
            {
                Exact::Written => resolved,
                Exact::Changed => Resolved::Changed,
                Exact::Gone => Resolved::Gone,
            },
        )
    }

    /// Input: one of the operator's compare-and-set statements, its parameters bound, and the
    /// column that counts the rows it wrote. Output: what it did, told by that count and its
    /// `present` column.
    async fn compare_and_set(
        &self,
        operation: &'static str,
        written: &str,
        statement: sqlx::query::Query<'_, sqlx::Postgres, sqlx::postgres::PgArguments>,
    ) -> Result<Exact, StoreError> {
        let mut connection = self.acquire(operation).await?;
        let row = self
            .run(operation, statement.fetch_one(&mut *connection))
            .await?;
        let written: i64 = get(&row, written, operation, &self.table)?;
        let present: bool = get(&row, "present", operation, &self.table)?;
        Ok(match (written > 0, present) {
            (true, _) => Exact::Written,
            (false, true) => Exact::Changed,
            (false, false) => Exact::Gone,
        })
    }

    /// For operators: one page of `task`'s units that are live or in doubt, in key order, at most `limit` of them
    /// (and at most [`LIST_PAGE_MAX`](Self::LIST_PAGE_MAX)), starting after the key `after`
    /// (`None`: from the first). One statement on the primary key per page; pass the last key
    /// of a page to get the next, until a page comes back shorter than asked. The pages are
    /// not one snapshot: rows written meanwhile may or may not appear.
    ///
    /// ```no_run
    /// # async fn run(store: idempotask_postgres::PostgresStore) -> Result<(), idempotask::store::StoreError> {
    /// let mut after: Option<Vec<u8>> = None;
    /// loop {
    ///     let page = store.list_task("charge", after.as_deref(), 1000).await?;
    ///     for unit in &page {
    ///         println!("{:?}: {:?}", String::from_utf8_lossy(&unit.key), unit.state);
    ///     }
    ///     if page.len() < 1000 {
    ///         break;
    ///     }
    ///     after = page.last().map(|unit| unit.key.clone());
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// A [`StoreError`] when the statement fails or a row is not one this store writes.
    pub async fn list_task(
        &self,
        task: &str,
        after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<StoredUnit>, StoreError> {
        let limit = i64::try_from(limit.clamp(1, Self::LIST_PAGE_MAX)).unwrap_or(1);
        let mut connection = self.acquire("list").await?;
        let rows = self
            .run(
                "list",
                sqlx::query(self.statements.list.clone())
                    .bind(task)
                    .bind(after.unwrap_or_default())
                    .bind(limit)
                    .fetch_all(&mut *connection),
            )
            .await?;
        let units: Vec<StoredUnit> = rows
            .iter()
            .map(|row| self.stored_unit(row, "list"))
            .collect::<Result<_, _>>()?;
        let attempts = attempts::held_rows(self, task, after, limit)
            .await?
            .iter()
            .map(|row| self.stored_unit(row, "list"))
            .collect::<Result<_, _>>()?;
        Ok(merged(units, attempts, limit))
    }

    /// Input: a row of `read` or `list`. Output: the unit it describes.
    fn stored_unit(&self, row: &PgRow, operation: &'static str) -> Result<StoredUnit, StoreError> {
        let key: Vec<u8> = get(row, "key", operation, &self.table)?;
        let state: String = get(row, "state", operation, &self.table)?;
        let fence: Option<i64> = get(row, "fence", operation, &self.table)?;
        let left: Option<i64> = get(row, "left_ms", operation, &self.table)?;
        let left = left.map(left_duration).unwrap_or_default();
        let in_doubt = doubt(row).map_err(|err| store_error(operation, &self.table, err))?;
        let state = match (state.as_str(), in_doubt) {
            ("locked", Some(doubt)) => {
                let token: Option<String> = get(row, "token", operation, &self.table)?;
                let forgotten_us: Option<i64> = get(row, "forgotten_us", operation, &self.table)?;
                UnitState::InDoubt {
                    token: token
                        .ok_or_else(|| unexpected(operation, "a lock in doubt without a token"))?,
                    fencing_token: doubt.fencing_token,
                    expired_for: doubt.expired_for,
                    forgotten_in: Duration::from_micros(
                        forgotten_us.unwrap_or_default().max(0).unsigned_abs(),
                    ),
                }
            }
            ("locked", None) => UnitState::Locked {
                fencing_token: fence.map(i64::unsigned_abs),
                lock_ttl_remaining: left,
            },
            ("done", _) => {
                let marker: Option<Vec<u8>> = get(row, "marker", operation, &self.table)?;
                UnitState::Done {
                    marker: marker
                        .ok_or_else(|| unexpected(operation, "a done row without a marker"))?,
                    ttl: left,
                }
            }
            (other, _) => {
                return Err(unexpected(operation, format!("a row in state `{other}`")));
            }
        };
        Ok(StoredUnit { key, state })
    }
}

impl From<UnitState> for Held {
    fn from(state: UnitState) -> Self {
        match state {
            UnitState::Locked {
                fencing_token,
                lock_ttl_remaining,
            } => Held::lock(fencing_token, Some(lock_ttl_remaining), None),
            UnitState::InDoubt {
                token,
                fencing_token,
                expired_for,
                forgotten_in,
            } => Held::in_doubt(
                token.into_bytes(),
                Doubt::new(fencing_token, expired_for),
                forgotten_in,
            ),
            UnitState::Done { marker, ttl } => Held::marker(marker, Some(ttl)),
        }
    }
}

/// Input: a page of the units table and one of the attempts table, each in key order and each
/// complete up to its last key. Output: both in key order, the unit's row first where a key is
/// in both, at most `limit`: every key up to the last is in one of them, so the page is complete
/// up to its last key too.
fn merged(units: Vec<StoredUnit>, attempts: Vec<StoredUnit>, limit: i64) -> Vec<StoredUnit> {
    if attempts.is_empty() {
        return units;
    }
    let mut all: Vec<StoredUnit> = units;
    let known: std::collections::BTreeSet<Vec<u8>> =
        all.iter().map(|unit| unit.key.clone()).collect();
    all.extend(
        attempts
            .into_iter()
            .filter(|unit| !known.contains(&unit.key)),
    );
    all.sort_by(|a, b| a.key.cmp(&b.key));
    all.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
    all
}

/// A cursor: the last key of the page before, in hexadecimal (a key may hold any bytes).
fn key_cursor(key: &[u8]) -> Cursor {
    use std::fmt::Write;
    let mut hex = String::with_capacity(2 * key.len());
    for byte in key {
        let _ = write!(hex, "{byte:02x}");
    }
    Cursor::new(hex)
}

/// Reads a [`key_cursor`]; `None` for text that is not one.
fn cursor_key(cursor: &Cursor) -> Option<Vec<u8>> {
    let hex = cursor.as_str().as_bytes();
    if hex.is_empty() || !hex.len().is_multiple_of(2) {
        return None;
    }
    hex.chunks(2)
        .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok())
        .collect()
}

/// The units are the rows of the store's table, in key order: a listing's cursor is the last
/// key of the page before, and each page one statement on the primary key, as
/// [`list_task`](PostgresStore::list_task) reads them. A lock in doubt is shown as its
/// holder's token, which [`resolve_exact`](PostgresStore::resolve_exact) compares.
impl Operator for PostgresStore {
    fn scope(&self) -> Scope {
        Scope::new("table", self.table()).with_max_key_len(Store::max_key_len(self))
    }

    fn location(&self, _unit: &UnitOfWork) -> String {
        format!("the row of table {}", self.table())
    }

    async fn journal(&self, unit: &UnitOfWork) -> Result<Journal, StoreError> {
        Store::read_journal(self, unit).await
    }

    async fn read(&self, unit: &UnitOfWork) -> Result<Held, StoreError> {
        let row = self.read_unit(unit).await?;
        Ok(row.map_or(Held::Nothing, |row| row.state.into()))
    }

    async fn list(
        &self,
        task: &str,
        from: Option<&Cursor>,
        limit: usize,
    ) -> Result<Page, StoreError> {
        let refused = |why: String| StoreError::new("list", StoreErrorKind::Configuration, why);
        check_task_name(task).map_err(|err| refused(err.to_string()))?;
        let after = from
            .map(|cursor| {
                cursor_key(cursor).ok_or_else(|| {
                    refused(format!(
                        "`{cursor}` is not a cursor of this store's listings (a key in hexadecimal); start from the first page, or pass the `next` of the page before"
                    ))
                })
            })
            .transpose()?;
        let limit = limit.clamp(1, Self::LIST_PAGE_MAX);
        let rows = self.list_task(task, after.as_deref(), limit).await?;
        let next = (rows.len() == limit)
            .then(|| rows.last().map(|row| key_cursor(&row.key)))
            .flatten();
        let keys_seen = rows.len();
        let units = rows
            .into_iter()
            .filter_map(|row| {
                // Keys are text when a delivery writes them; a row that holds no unit's key is
                // none of idempotask's units, and only counted.
                let key = String::from_utf8_lossy(&row.key).into_owned();
                let unit = UnitOfWork::with_limit(task, key, usize::MAX).ok()?;
                let listed = Listed::new(task, unit.digest(), row.state.into());
                Some(listed.with_key(unit.key()))
            })
            .collect();
        Ok(Page::new(units, keys_seen, next))
    }

    async fn forget_exact(&self, unit: &UnitOfWork, shown: &[u8]) -> Result<Forgot, StoreError> {
        PostgresStore::forget_exact(self, unit, shown).await
    }

    async fn resolve_exact(
        &self,
        unit: &UnitOfWork,
        shown: &[u8],
        resolution: &Resolution,
    ) -> Result<Resolved, StoreError> {
        // The token `read` showed; bytes that are no text are no token, so not the lock there.
        match std::str::from_utf8(shown) {
            Ok(token) => match attempts::attempt_xid(token) {
                Some(xid) => {
                    let (statement, resolved) = attempts::resolution(self, unit, xid, resolution)?;
                    self.resolve_with(statement, resolved).await
                }
                None => PostgresStore::resolve_exact(self, unit, token, resolution).await,
            },
            Err(_) => Ok(Resolved::Changed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_read_back_any_key_and_refuse_what_is_not_one() {
        for key in [&b"order-42"[..], b"\x00\xff|", "ключ".as_bytes()] {
            assert_eq!(cursor_key(&key_cursor(key)).as_deref(), Some(key));
        }
        for text in ["", "a", "zz", "0g", "é1", "-1"] {
            assert_eq!(cursor_key(&Cursor::new(text)), None, "{text}");
        }
    }
}
