//! A PostgreSQL store for [`idempotask`]: locks and completion markers in one table,
//! for services that have PostgreSQL and no Redis, and transactional completion for work that is
//! itself a write to the same database.
//!
//! - [`PostgresStore`] implements [`Store`]: every
//!   [`Task`](idempotask::Task) runs on it as on any store, a fresh execution in two statements
//!   and a duplicate in one.
//! - [`PostgresStore::transaction`] makes a [`PostgresTransaction`] of a sqlx transaction, for
//!   [`Call::run_in_transaction`](idempotask::Call::run_in_transaction): the body's writes and
//!   the unit's marker commit together, so a crash between the two cannot happen.
//!
//! - [`operator`]: for operators, what one unit's row holds raw, a forget of exactly the marker that
//!   was shown, the resolution of a unit in doubt against exactly the lock that was shown, and
//!   a task's units page by page (the `idempotask` command uses them).
//!
//! sqlx is part of this crate's public API (`PgPool`, `Transaction`, `PgConnection`): use the
//! sqlx 0.9 your service already has.
//!
#![doc = include_str!("deployment.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod builder;
mod checkout;
mod errors;
pub mod operator;
mod statements;
mod transactional;

pub use builder::PostgresStoreBuilder;
pub use transactional::PostgresTransaction;

use std::time::Duration;

use sqlx::postgres::{PgConnection, PgPool, PgRow};
use sqlx::{Row, SqlStr};

use errors::{store_error, unexpected};
use idempotask::operator::{Forgot, Resolution, Resolved};
use idempotask::store::lock_lost_marker;
use idempotask::store::{Begin, Doubt, Fencing, Finish, Inspection, Store, ttl_millis};
use idempotask::store::{LockToken, UnitOfWork};
use idempotask::store::{StoreError, StoreErrorKind};
use statements::{DEFAULT_TABLE, Statements};

/// How many times `begin` asks again when a concurrent writer committed between its snapshot
/// and its insert (the statement then sees neither its own row nor the other's).
const BEGIN_ATTEMPTS: u32 = 3;

/// How many blocks (8 KiB each by default) one `purge_expired` statement reads.
const PURGE_BLOCKS: i64 = 4096;

/// A store in one PostgreSQL table, for services that have PostgreSQL and no Redis.
///
/// One row per unit of work holds either the lock (token, lease expiry, fencing token) or the
/// completion marker; every operation is one statement in the common case, so a fresh task
/// costs two statements and a duplicate one, as on Redis (a `finish` after a lost lock, or a
/// `begin` that raced another writer, finds an expired row, repeats its own grant or takes over
/// a unit in doubt, adds one). Fencing tokens come from a sequence that
/// starts at the clock in microseconds, so they increase across all units, not only per unit. It passes the same conformance suite as the Redis
/// stores and works with every [`Task`](idempotask::Task).
///
/// For work that is itself a write to the same database,
/// [`Call::run_in_transaction`](idempotask::Call::run_in_transaction) goes further: the body's
/// writes and the marker commit in one transaction, so a crash between the two cannot happen.
///
/// # Setting up
/// The table is never created behind your back. Create it once with
/// [`PostgresStoreBuilder::migrate`], or apply [`PostgresStoreBuilder::migration_sql`] with the
/// migration tool you already use; [`connect`](PostgresStoreBuilder::connect) checks it is
/// there.
///
/// # Connections
/// The builder takes your sqlx [`PgPool`], yours to configure (size, TLS, timeouts, hooks):
/// the transactions of [`run_in_transaction`](idempotask::Call::run_in_transaction) begin on it, and
/// [`migrate`](PostgresStoreBuilder::migrate) runs on it. The store's own statements run on a
/// pool of the store's, opened with your pool's settings (connect options, `after_connect` and
/// the other hooks, `test_before_acquire`, lifetimes) and at most
/// [`max_connections`](PostgresStoreBuilder::max_connections) connections
/// ([`DEFAULT_MAX_CONNECTIONS`](PostgresStore::DEFAULT_MAX_CONNECTIONS), 10, by default): bodies
/// that hold every connection of your pool cannot keep a `begin` from running or a successful
/// body's result from being recorded. Count those connections in the server's
/// `max_connections`: [`connect`](PostgresStoreBuilder::connect) warns when the two pools
/// together can open more than the server takes. A wait for a connection that is still going
/// at half the response timeout asks the server why with one connection attempt outside the
/// pool (one at a time for the whole store, its answer reused for a second); when the wait runs
/// out and the server refuses new clients (`too many clients already`), the statement fails
/// with a `Rejected` error that says so, not a timeout: retryable, since a spike passes, and
/// with the remedy for a pool too large for the server.
///
/// sqlx pings each connection before handing it out unless told otherwise
/// (`PgPoolOptions::test_before_acquire(false)`): one more round trip per statement, on the
/// store's pool too.
///
/// # Behaviour
/// - Each statement gets the [response timeout](PostgresStoreBuilder::response_timeout),
///   waiting for a connection of the store's pool included. A wait for a connection that
///   runs out is a `Timeout` that sent nothing (not ambiguous); a statement that runs out is
///   an ambiguous `Timeout` (it may have applied).
/// - The response timeout ends the wait on the client only. So that no statement the client
///   gave up on goes on in the server, each one that can wait on a row lock (a row that a
///   [transactional delivery](idempotask::Call::run_in_transaction) holds until its transaction
///   ends) bounds that wait itself to four fifths of the response timeout, whatever
///   `lock_timeout` your connections have, and fails with a `Timeout` that is not ambiguous:
///   nothing was taken. It sets `lock_timeout` for that statement alone, with no extra round
///   trip. Maintenance that locks the whole table (`VACUUM FULL`, `CLUSTER`, `ALTER TABLE`)
///   is not bounded this way; run it when no tasks run.
/// - The statements of a transactional delivery run on its transaction and wait on another
///   delivery's row for as long as that transaction lasts.
///
/// # Expiry
/// Expired rows count as absent on every read, and a new lock takes an expired row's place.
/// Rows nobody asks for again stay until [`purge_expired`](Self::purge_expired) deletes them:
/// schedule it (every few minutes, say) as you would any cleanup job.
///
/// A lock that ran out with neither a release nor a marker is remembered for its token's
/// [doubt memory](idempotask::store::LockToken::doubt_memory), on the server's clock: until
/// then the unit is [in doubt](idempotask::store::Doubt), the row counts as there (for its
/// holder, for [`inspect`](Store::inspect) and the operator's reads, and for the purge), and the
/// delivery that takes it over is told, at the cost of one more statement (see
/// *Units in doubt* under [Setting it up](crate#setting-it-up)). Its lock carries that doubt
/// until a result is recorded: a repeated `begin` by its token answers it again, and its
/// release leaves the unit in doubt (the lock runs out now) instead of freeing it.
///
/// ```no_run
/// use idempotask::Task;
/// use idempotask_postgres::PostgresStore;
///
/// # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let pool = sqlx::PgPool::connect("postgres://app@db/app").await?;
/// let builder = PostgresStore::builder(pool);
/// builder.migrate().await?; // or apply builder.migration_sql() with your migration tool
/// let store = builder.connect().await?;
///
/// let sent: Result<u32, idempotask::Error> = Task::new("send_receipt")
///     .call("order-42")
///     .store(store.clone())
///     .run(async { Ok(1001) })
///     .await;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct PostgresStore {
    /// The application's pool, for the transactions of transactional deliveries.
    pool: PgPool,
    /// The store's own connections, for its own statements.
    connections: PgPool,
    /// Why the store's pool could not open a connection, as the server last said.
    diagnosis: checkout::Diagnosis,
    table: String,
    statements: Statements,
    response_timeout: Duration,
    max_key_len: usize,
}

impl PostgresStore {
    /// The table's name when none is configured.
    pub const DEFAULT_TABLE: &str = DEFAULT_TABLE;
    /// The longest caller key a store accepts, in bytes, whatever
    /// [`max_key_len`](PostgresStoreBuilder::max_key_len) asks.
    pub const LONGEST_KEY: usize = 2048;
    /// How long one statement may take, connection checkout included, by default.
    pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);
    /// The most connections the store's own pool opens when
    /// [`max_connections`](PostgresStoreBuilder::max_connections) does not say (fewer when the
    /// application's pool has fewer).
    ///
    /// A call holds one of them only for a statement of a fraction of a millisecond, twice per
    /// fresh execution and once per duplicate: ten connections carry the statements of
    /// thousands of calls a second, more than one server's CPU runs, while leaving a server's
    /// default `max_connections` (100) to the application.
    pub const DEFAULT_MAX_CONNECTIONS: u32 = 10;

    /// Connects a pool with sqlx's defaults, except that connections are not pinged before each
    /// statement, and checks that the default table exists.
    ///
    /// # Errors
    /// As [`PostgresStoreBuilder::connect`], and `Unreachable` when the server cannot be
    /// reached.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .test_before_acquire(false)
            .connect(url)
            .await
            .map_err(|err| store_error("connect", DEFAULT_TABLE, err))?;
        Self::builder(pool).connect().await
    }

    /// The application's pool the store was built on, for beginning the transactions of
    /// [`Call::run_in_transaction`](idempotask::Call::run_in_transaction). The store's own
    /// statements do not use it.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The table's name, as configured.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// Deletes the rows whose lock or marker has expired; answers how many.
    ///
    /// Expired rows already count as absent, so this only keeps the table small: schedule it
    /// (every few minutes, say). It reads the table once, a range of blocks per statement, so
    /// each statement is short and locks only the rows it deletes. A fenced unit's row loses
    /// its fencing counter with it; the sequence keeps later tokens higher.
    ///
    /// # Errors
    /// A [`StoreError`] when a statement fails; the ranges before it stay purged.
    pub async fn purge_expired(&self) -> Result<u64, StoreError> {
        let blocks: i64 = self
            .run(
                "purge",
                sqlx::query_scalar(self.statements.blocks.clone()).fetch_one(&self.connections),
            )
            .await?;
        let mut purged = 0;
        let mut start = 0;
        while start < blocks {
            let end = start + PURGE_BLOCKS;
            let deleted = self
                .run(
                    "purge",
                    sqlx::query(self.statements.purge.clone())
                        .bind(start)
                        .bind(end)
                        .execute(&self.connections),
                )
                .await?;
            purged += deleted.rows_affected();
            start = end;
        }
        Ok(purged)
    }

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
    pub async fn read_unit(
        &self,
        unit: &UnitOfWork,
    ) -> Result<Option<operator::StoredUnit>, StoreError> {
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
        row.map(|row| self.stored_unit(&row, "read")).transpose()
    }

    /// For operators: forgets `unit`'s marker only while it is still exactly `shown` (the
    /// bytes of a [`UnitState::Done`](operator::UnitState::Done) an operator confirmed), in one
    /// statement, so that a marker a delivery wrote meanwhile stays; never a lock. A fenced
    /// unit's row keeps its fencing counter, as [`forget`](Store::forget) leaves it.
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
    /// whose token is `shown` (the `token` of a [`UnitState::InDoubt`](operator::UnitState::InDoubt)
    /// an operator confirmed), in one statement, only while its row is still that lock, still
    /// run out and still remembered: [`Resolution::Record`] stores a completion marker in its
    /// place, kept for its result TTL, so that every later delivery gets its result back;
    /// [`Resolution::Free`] frees the unit (a fenced unit's row keeps its fencing counter, as
    /// a release leaves it), so that the next delivery runs the work as new with no doubt. A
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
        let marker = resolution.marker_to_store(unit)?;
        let statement = |sql: &SqlStr| {
            sqlx::query(sql.clone())
                .bind(unit.task())
                .bind(unit.key().as_bytes())
                .bind(shown)
        };
        let (statement, resolved) = match marker {
            Some((marker, result_ttl)) => (
                statement(&self.statements.resolve_record)
                    .bind(marker)
                    .bind(millis(result_ttl)),
                Resolved::Recorded,
            ),
            None => (statement(&self.statements.resolve_free), Resolved::Freed),
        };
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
    ) -> Result<Vec<operator::StoredUnit>, StoreError> {
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
        rows.iter()
            .map(|row| self.stored_unit(row, "list"))
            .collect()
    }

    /// Input: a row of `read` or `list`. Output: the unit it describes.
    fn stored_unit(
        &self,
        row: &PgRow,
        operation: &'static str,
    ) -> Result<operator::StoredUnit, StoreError> {
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
                operator::UnitState::InDoubt {
                    token: token
                        .ok_or_else(|| unexpected(operation, "a lock in doubt without a token"))?,
                    fencing_token: doubt.fencing_token,
                    expired_for: doubt.expired_for,
                    forgotten_in: Duration::from_micros(
                        forgotten_us.unwrap_or_default().max(0).unsigned_abs(),
                    ),
                }
            }
            ("locked", None) => operator::UnitState::Locked {
                fencing_token: fence.map(i64::unsigned_abs),
                lock_ttl_remaining: left,
            },
            ("done", _) => {
                let marker: Option<Vec<u8>> = get(row, "marker", operation, &self.table)?;
                operator::UnitState::Done {
                    marker: marker
                        .ok_or_else(|| unexpected(operation, "a done row without a marker"))?,
                    ttl: left,
                }
            }
            (other, _) => {
                return Err(unexpected(operation, format!("a row in state `{other}`")));
            }
        };
        Ok(operator::StoredUnit { key, state })
    }

    /// A connection of the store's pool, waited for at most the response timeout (see
    /// [`checkout`](checkout::checkout)).
    async fn acquire(
        &self,
        operation: &'static str,
    ) -> Result<sqlx::pool::PoolConnection<sqlx::Postgres>, StoreError> {
        checkout::checkout(
            &self.connections,
            &self.diagnosis,
            operation,
            &self.table,
            self.response_timeout,
        )
        .await
    }

    /// Runs one statement under the response timeout.
    async fn run<T>(
        &self,
        operation: &'static str,
        statement: impl Future<Output = Result<T, sqlx::Error>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.response_timeout, statement).await {
            Ok(result) => result.map_err(|err| store_error(operation, &self.table, err)),
            Err(_) => Err(StoreError::ambiguous(
                operation,
                StoreErrorKind::Timeout,
                format!("no answer within {} ms", self.response_timeout.as_millis()),
            )),
        }
    }

    /// `begin` with `statements`: on the store's connection, or their `_in_transaction` forms
    /// on a transaction's.
    ///
    /// The fresh statement answers the common cases (no row yet, another's live lock, a live
    /// marker) alone; an expired row or the caller's own lock goes to the full statement, and
    /// a unit in doubt to the takeover (unless the token leaves it in doubt: then nothing is
    /// written, and the answer is what the fresh statement read).
    async fn begin_on(
        statements: BeginStatements<'_>,
        connection: &mut PgConnection,
        unit: &UnitOfWork,
        token: &LockToken,
        lock_ttl: Duration,
        fencing: Fencing,
    ) -> Result<Begin, sqlx::Error> {
        let ask = |sql: &SqlStr| {
            sqlx::query(sql.clone())
                .bind(unit.task())
                .bind(unit.key().as_bytes())
                .bind(token.as_str())
                .bind(millis(lock_ttl))
                .bind(memory_micros(token))
        };
        let fenced = fencing == Fencing::On;
        for _ in 0..BEGIN_ATTEMPTS {
            let Some(row) = ask(statements.fresh)
                .fetch_optional(&mut *connection)
                .await?
            else {
                continue;
            };
            let doubt = match fresh_answer(&row)? {
                Found::Answer(answer) => return Ok(answer),
                Found::InDoubt(doubt) => doubt,
                Found::Expired => {
                    let row = ask(statements.full)
                        .bind(fenced)
                        .fetch_optional(&mut *connection)
                        .await?;
                    let Some(row) = row else {
                        continue;
                    };
                    match begin_answer(&row)? {
                        Found::Answer(answer) => return Ok(answer),
                        Found::InDoubt(doubt) => doubt,
                        Found::Expired => continue,
                    }
                }
            };
            if !token.takes_over_doubt() {
                return Ok(Begin::InDoubt(doubt));
            }
            let row = ask(statements.take_over)
                .bind(fenced)
                .fetch_optional(&mut *connection)
                .await?;
            // None: another delivery took the unit over first, or its holder came back.
            if let Some(row) = row {
                return taken_over(&row);
            }
        }
        Ok(Begin::busy(None))
    }
}

/// The statements of one `begin` (see [`Statements`]).
#[derive(Clone, Copy)]
struct BeginStatements<'s> {
    fresh: &'s SqlStr,
    full: &'s SqlStr,
    take_over: &'s SqlStr,
}

impl Store for PostgresStore {
    fn max_key_len(&self) -> usize {
        self.max_key_len
    }

    async fn begin(
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
            Self::begin_on(statements, &mut connection, unit, token, lock_ttl, fencing).await
        })
        .await
    }

    async fn finish(
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

    async fn release(&self, unit: &UnitOfWork, token: &LockToken) -> Result<bool, StoreError> {
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

    async fn renew(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        lock_ttl: Duration,
    ) -> Result<bool, StoreError> {
        let Ok(fence) = fence_param(token) else {
            return Ok(false);
        };
        let mut connection = self.acquire("renew").await?;
        let renewed = self
            .run(
                "renew",
                sqlx::query(self.statements.renew.clone())
                    .bind(unit.task())
                    .bind(unit.key().as_bytes())
                    .bind(token.as_str())
                    .bind(fence)
                    .bind(millis(lock_ttl))
                    .bind(memory_micros(token))
                    .execute(&mut *connection),
            )
            .await?;
        Ok(renewed.rows_affected() > 0)
    }

    async fn inspect(&self, unit: &UnitOfWork) -> Result<Inspection, StoreError> {
        let mut connection = self.acquire("inspect").await?;
        let row = self
            .run(
                "inspect",
                sqlx::query(self.statements.inspect.clone())
                    .bind(unit.task())
                    .bind(unit.key().as_bytes())
                    .fetch_optional(&mut *connection),
            )
            .await?;
        let Some(row) = row else {
            return Ok(Inspection::empty());
        };
        let state: String = get(&row, "state", "inspect", &self.table)?;
        let left: Option<i64> = get(&row, "left_ms", "inspect", &self.table)?;
        let left = left.map(left_duration);
        match state.as_str() {
            "done" => {
                let marker: Option<Vec<u8>> = get(&row, "marker", "inspect", &self.table)?;
                let marker =
                    marker.ok_or_else(|| unexpected("inspect", "a done row without a marker"))?;
                Ok(Inspection::done(marker, left))
            }
            "locked" => {
                match doubt(&row).map_err(|err| store_error("inspect", &self.table, err))? {
                    Some(doubt) => Ok(Inspection::doubtful(doubt)),
                    None => Ok(Inspection::locked(left.unwrap_or_default())),
                }
            }
            other => Err(unexpected("inspect", format!("a row in state `{other}`"))),
        }
    }

    async fn forget(&self, unit: &UnitOfWork) -> Result<bool, StoreError> {
        let mut connection = self.acquire("forget").await?;
        let forgotten: i64 = self
            .run(
                "forget",
                sqlx::query_scalar(self.statements.forget.clone())
                    .bind(unit.task())
                    .bind(unit.key().as_bytes())
                    .fetch_one(&mut *connection),
            )
            .await?;
        Ok(forgotten > 0)
    }
}

/// What an operator's compare-and-set statement did with the value shown.
enum Exact {
    /// The row was still that value, and it is written.
    Written,
    /// A row is there, but not that value; nothing was written.
    Changed,
    /// No row counts as there; nothing was written.
    Gone,
}

/// What a row of `begin_fresh` or `begin` comes to.
enum Found {
    /// The answer.
    Answer(Begin),
    /// The unit is in doubt: take it over, or leave it.
    InDoubt(Doubt),
    /// From `begin_fresh`: a row that only `begin` may take (expired, or the caller's own
    /// lock). From `begin`: never.
    Expired,
}

/// Reads the row `begin_fresh` answered.
fn fresh_answer(row: &PgRow) -> Result<Found, sqlx::Error> {
    let state: &str = row.try_get("state")?;
    if state == "acquired" {
        // A new row: it took nothing over.
        let fence: Option<i64> = row.try_get("fence")?;
        return Ok(Found::Answer(Begin::acquired(fence.map(i64::unsigned_abs))));
    }
    let mine: Option<bool> = row.try_get("mine")?;
    // The caller's own lock, in doubt or not, is the caller's to take again.
    let mine = state == "locked" && mine == Some(true);
    if !mine && let Some(doubt) = doubt(row)? {
        return Ok(Found::InDoubt(doubt));
    }
    let left: Option<i64> = row.try_get("left_ms")?;
    // Milliseconds rounded up: a row is live while any time is left.
    let live = left.is_some_and(|left| left > 0);
    if !live || mine {
        return Ok(Found::Expired);
    }
    begin_answer(row)
}

/// Reads the row `begin` answered (or `begin_fresh`, when it is one `begin` would answer
/// other than `acquired`).
fn begin_answer(row: &PgRow) -> Result<Found, sqlx::Error> {
    let state: &str = row.try_get("state")?;
    if let Some(doubt) = doubt(row)? {
        return Ok(Found::InDoubt(doubt));
    }
    let answer = match state {
        // A repeated grant of a lock that took the unit over in doubt answers that doubt again.
        "acquired" => granted(row)?,
        "done" => {
            let marker: Option<Vec<u8>> = row.try_get("marker")?;
            marker
                .map(Begin::Done)
                .ok_or_else(|| sqlx::Error::Protocol("a done row without a marker".to_owned()))?
        }
        "locked" => {
            let left: Option<i64> = row.try_get("left_ms")?;
            Begin::busy(left.map(left_duration))
        }
        other => return Err(sqlx::Error::Protocol(format!("a row in state `{other}`"))),
    };
    Ok(Found::Answer(answer))
}

/// Input: a row with `fence` and `doubt_us`. Output: the doubt it describes, if its unit is in
/// doubt (`doubt_us` not null).
fn doubt(row: &PgRow) -> Result<Option<Doubt>, sqlx::Error> {
    let expired_us: Option<i64> = row.try_get("doubt_us")?;
    let Some(expired_us) = expired_us else {
        return Ok(None);
    };
    let fence: Option<i64> = row.try_get("fence")?;
    Ok(Some(Doubt::new(
        fence.map(i64::unsigned_abs),
        Duration::from_micros(expired_us.max(0).unsigned_abs()),
    )))
}

/// Reads the row `take_over` answered: the new lock, and the lock it replaced.
fn taken_over(row: &PgRow) -> Result<Begin, sqlx::Error> {
    match granted(row)? {
        taken @ Begin::Acquired {
            in_doubt: Some(_), ..
        } => Ok(taken),
        _ => Err(sqlx::Error::Protocol(
            "a takeover that answered no lapse".to_owned(),
        )),
    }
}

/// Input: a row with `fence`, `earlier_fence` and `earlier_us` (of `take_over`, or an
/// `acquired` one of `begin`). Output: the lock granted, taken over in doubt when `earlier_us`
/// (how long the lock it replaced had run out) is not null.
fn granted(row: &PgRow) -> Result<Begin, sqlx::Error> {
    // Sequence values are positive; a negative one cannot come from this table.
    let fence: Option<i64> = row.try_get("fence")?;
    let fence = fence.map(i64::unsigned_abs);
    let expired_us: Option<i64> = row.try_get("earlier_us")?;
    let Some(expired_us) = expired_us else {
        return Ok(Begin::acquired(fence));
    };
    let replaced: Option<i64> = row.try_get("earlier_fence")?;
    Ok(Begin::taken_over(
        fence,
        Doubt::new(
            replaced.map(i64::unsigned_abs),
            Duration::from_micros(expired_us.max(0).unsigned_abs()),
        ),
    ))
}

fn get<'r, T>(
    row: &'r PgRow,
    column: &str,
    operation: &'static str,
    table: &str,
) -> Result<T, StoreError>
where
    T: sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
{
    row.try_get(column)
        .map_err(|err| store_error(operation, table, err))
}

/// A TTL as the statements take it: whole milliseconds, at least 1, at most
/// [`MAX_TTL`](idempotask::MAX_TTL) (PostgreSQL's timestamps end in the year 294276, so
/// `Duration::MAX` must not reach the server as it is).
fn millis(ttl: Duration) -> i64 {
    i64::try_from(ttl_millis(ttl)).unwrap_or(i64::MAX)
}

/// The token's doubt memory as the statements take it: whole microseconds (0: none), at most
/// [`MAX_TTL`](idempotask::MAX_TTL).
fn memory_micros(token: &LockToken) -> i64 {
    i64::try_from(token.doubt_memory().min(idempotask::MAX_TTL).as_micros()).unwrap_or(i64::MAX)
}

fn left_duration(millis: i64) -> Duration {
    Duration::from_millis(millis.max(0).unsigned_abs())
}

/// A fencing token beyond `bigint`: the sequence never granted it, so it holds no lock here.
#[derive(Debug)]
struct NeverGranted;

/// The token's fencing token as the `bigint` column holds it.
fn fence_param(token: &LockToken) -> Result<Option<i64>, NeverGranted> {
    token
        .fencing_token()
        .map(|fence| i64::try_from(fence).map_err(|_| NeverGranted))
        .transpose()
}
