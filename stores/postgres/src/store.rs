//! The store: [`PostgresStore`], its pool and its statements, and its [`Store`] implementation.

use std::time::Duration;

use idempotask::store::BatchingStore;
use idempotask::store::{Begin, Claim, Completion, Fencing, Finish, Inspection, Store};
use idempotask::store::{Journal, StepEntry};
use idempotask::store::{LockToken, UnitOfWork};
use idempotask::store::{StoreError, StoreErrorKind};
use sqlx::postgres::{PgConnection, PgPool};
use sqlx::{Row, SqlStr};

use crate::checkout;
use crate::errors::{store_error, unexpected};
use crate::rows::{
    Found, begin_answer, doubt, fence_param, fresh_answer, get, left_duration, memory_micros,
    millis, taken_over,
};
use crate::statements::Statements;
use crate::table::DEFAULT_TABLE;

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
/// [`PostgresStoreBuilder::migrate`](crate::PostgresStoreBuilder::migrate), or apply [`PostgresStoreBuilder::migration_sql`](crate::PostgresStoreBuilder::migration_sql) with the
/// migration tool you already use; [`connect`](crate::PostgresStoreBuilder::connect) checks it is
/// there.
///
/// # Connections
/// The builder takes your sqlx [`PgPool`], yours to configure (size, TLS, timeouts, hooks):
/// the transactions of [`run_in_transaction`](idempotask::Call::run_in_transaction) begin on it, and
/// [`migrate`](crate::PostgresStoreBuilder::migrate) runs on it. The store's own statements run on a
/// pool of the store's, opened with your pool's settings (connect options, `after_connect` and
/// the other hooks, `test_before_acquire`, lifetimes) and at most
/// [`max_connections`](crate::PostgresStoreBuilder::max_connections) connections
/// ([`DEFAULT_MAX_CONNECTIONS`](PostgresStore::DEFAULT_MAX_CONNECTIONS), 10, by default): bodies
/// that hold every connection of your pool cannot keep a `begin` from running or a successful
/// body's result from being recorded. Count those connections in the server's
/// `max_connections`: [`connect`](crate::PostgresStoreBuilder::connect) warns when the two pools
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
/// # Group commit
/// Every statement commits on its own and waits for the WAL to be flushed. So by default the
/// store sends the `begin`s (and the `finish`es) of calls in flight at the same time together,
/// as one [`begin_batch`](Store::begin_batch) (or [`finish_batch`](Store::finish_batch)): a
/// call that finds none in flight goes at once, alone; the ones made meanwhile go together when
/// it comes back, each with its own answer, as [`BatchingStore`] does it.
/// [`group_commit(false)`](crate::PostgresStoreBuilder::group_commit) sends each call alone.
///
/// # Behaviour
/// - Each statement gets the [response timeout](crate::PostgresStoreBuilder::response_timeout),
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
/// # Steps
/// A body's steps ([`TaskContext::step`](idempotask::TaskContext::step)) are recorded in a
/// second table, `<table>_steps`, one row per finished step: one `SELECT` reads a unit's
/// journal, one statement records a step under the lock (see *Steps* under
/// [Setting it up](crate#setting-it-up)). A unit without steps never touches it.
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
    pub(crate) pool: PgPool,
    /// The store's own connections, for its own statements.
    pub(crate) connections: PgPool,
    /// Why the store's pool could not open a connection, as the server last said.
    pub(crate) diagnosis: checkout::Diagnosis,
    pub(crate) table: String,
    pub(crate) statements: Statements,
    pub(crate) response_timeout: Duration,
    pub(crate) max_key_len: usize,
    /// The group commit of `begin` and `finish`: the same store without one, behind a
    /// [`BatchingStore`]; `None` when the builder turned it off (and in that inner store).
    pub(crate) group: Option<BatchingStore<PostgresStore>>,
}

impl PostgresStore {
    /// The table's name when none is configured.
    pub const DEFAULT_TABLE: &str = DEFAULT_TABLE;
    /// The longest caller key a store accepts, in bytes, whatever
    /// [`max_key_len`](crate::PostgresStoreBuilder::max_key_len) asks.
    pub const LONGEST_KEY: usize = 2048;
    /// How long one statement may take, connection checkout included, by default.
    pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);
    /// The most connections the store's own pool opens when
    /// [`max_connections`](crate::PostgresStoreBuilder::max_connections) does not say (fewer when the
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
    /// As [`PostgresStoreBuilder::connect`](crate::PostgresStoreBuilder::connect), and `Unreachable` when the server cannot be
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

    /// Deletes the rows whose lock or marker has expired, the expired entries of journals
    /// of steps (in the steps table) and the attempts of transactional executions whose doubt
    /// memory ran out (in the attempts table); answers how many rows in all.
    ///
    /// Expired rows already count as absent, so this only keeps the tables small: schedule it
    /// (every few minutes, say). It reads the table once, a range of blocks per statement, so
    /// each statement is short and locks only the rows it deletes. A fenced unit's row loses
    /// its fencing counter with it; the sequence keeps later tokens higher.
    ///
    /// # Errors
    /// A [`StoreError`] when a statement fails; the ranges before it stay purged.
    pub async fn purge_expired(&self) -> Result<u64, StoreError> {
        let units = self
            .purge_table(&self.statements.blocks, &self.statements.purge)
            .await?;
        let steps = self
            .purge_table(&self.statements.steps_blocks, &self.statements.purge_steps)
            .await?;
        let attempts = &self.statements.attempts;
        let attempts = self.purge_table(&attempts.blocks, &attempts.purge).await?;
        Ok(units + steps + attempts)
    }

    /// Runs `purge` on each range of [`PURGE_BLOCKS`] blocks of the table that `blocks`
    /// measures; answers how many rows it deleted.
    async fn purge_table(&self, blocks: &SqlStr, purge: &SqlStr) -> Result<u64, StoreError> {
        let blocks: i64 = self
            .run(
                "purge",
                sqlx::query_scalar(blocks.clone()).fetch_one(&self.connections),
            )
            .await?;
        let mut purged = 0;
        let mut start = 0;
        while start < blocks {
            let end = start + PURGE_BLOCKS;
            let deleted = self
                .run(
                    "purge",
                    sqlx::query(purge.clone())
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

    /// A connection of the store's pool, waited for at most the response timeout (see
    /// [`checkout`](checkout::checkout)).
    pub(crate) async fn acquire(
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
    pub(crate) async fn run<T>(
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
    /// written, and the answer is what the fresh statement read). With the answer, the
    /// transaction's id when the statement that answered reads it (the `_in_transaction` forms).
    pub(crate) async fn begin_on(
        statements: BeginStatements<'_>,
        connection: &mut PgConnection,
        unit: &UnitOfWork,
        token: &LockToken,
        lock_ttl: Duration,
        fencing: Fencing,
    ) -> Result<(Begin, Option<i64>), sqlx::Error> {
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
                Found::Answer(answer) => return Ok((answer, xid(&row))),
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
                        Found::Answer(answer) => return Ok((answer, xid(&row))),
                        Found::InDoubt(doubt) => doubt,
                        Found::Expired => continue,
                    }
                }
            };
            if !token.takes_over_doubt() {
                return Ok((Begin::InDoubt(doubt), None));
            }
            let row = ask(statements.take_over)
                .bind(fenced)
                .fetch_optional(&mut *connection)
                .await?;
            // None: another delivery took the unit over first, or its holder came back.
            if let Some(row) = row {
                return Ok((taken_over(&row)?, xid(&row)));
            }
        }
        Ok((Begin::busy(None), None))
    }
}

/// The `xid` column of an answer of `begin` inside a caller's transaction (see the statements'
/// `XID`); `None` for the other statements, which have no such column.
fn xid(row: &sqlx::postgres::PgRow) -> Option<i64> {
    row.try_get::<Option<i64>, _>("xid").ok().flatten()
}

/// `sql` with `renew`'s parameters bound (`$1` to `$6`: the unit, the lock's token and
/// fencing token, its new TTL and the token's doubt memory), for `renew` and for
/// `record_step`, which checks the lock the same way.
pub(crate) fn renewal<'q>(
    sql: &SqlStr,
    unit: &'q UnitOfWork,
    token: &'q LockToken,
    fence: Option<i64>,
    lock_ttl: Duration,
) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    sqlx::query(sql.clone())
        .bind(unit.task())
        .bind(unit.key().as_bytes())
        .bind(token.as_str())
        .bind(fence)
        .bind(millis(lock_ttl))
        .bind(memory_micros(token))
}

/// The statements of one `begin` (see [`Statements`]).
#[derive(Clone, Copy)]
pub(crate) struct BeginStatements<'s> {
    pub(crate) fresh: &'s SqlStr,
    pub(crate) full: &'s SqlStr,
    pub(crate) take_over: &'s SqlStr,
}

impl Store for PostgresStore {
    fn max_key_len(&self) -> usize {
        self.max_key_len
    }

    /// True: a batch is one statement for the units it can take in one (see
    /// [`begin_batch`](Self::begin_batch)).
    fn batches_natively(&self) -> bool {
        true
    }

    /// The units of the batch in one statement, one round trip and one commit: units with no
    /// row are taken, and a marker or another's live lock is answered, as `begin` would. Every
    /// other unit (an expired row, the caller's own lock, a unit in doubt to take over, a second
    /// claim of one unit) is then asked alone (distinct units at once, one unit's claims in
    /// order), so that each answer is exactly the one `begin` would have given. The
    /// statement's row-lock waits share one statement's bound; when the server refuses it for
    /// one unit's sake (a wait ran out, a deadlock with another batch, a `statement_timeout`),
    /// nothing was applied and every unit is asked alone. Fencing tokens are drawn in key
    /// order.
    async fn begin_batch(
        &self,
        claims: &[Claim<'_>],
        lock_ttl: Duration,
        fencing: Fencing,
    ) -> Vec<Result<Begin, StoreError>> {
        self.begin_together(claims, lock_ttl, fencing).await
    }

    /// The markers of the batch in one `UPDATE`, one round trip and one commit, over the
    /// caller's locks; a unit whose lock that statement did not find (lost, taken over, or
    /// already finished by a repeated call), or that is in the batch twice, is then finished
    /// alone, as `finish` tells those apart.
    async fn finish_batch(
        &self,
        completions: &[Completion<'_>],
        result_ttl: Duration,
    ) -> Vec<Result<Finish, StoreError>> {
        self.finish_together(completions, result_ttl).await
    }

    /// Through the store's [group commit](crate::PostgresStoreBuilder::group_commit) (the
    /// default): a call that finds no begin in flight goes at once, alone; the calls made
    /// while one is in flight go together as one [`begin_batch`](Self::begin_batch).
    async fn begin(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        lock_ttl: Duration,
        fencing: Fencing,
    ) -> Result<Begin, StoreError> {
        match &self.group {
            Some(group) => group.begin(unit, token, lock_ttl, fencing).await,
            None => self.begin_alone(unit, token, lock_ttl, fencing).await,
        }
    }

    /// Through the store's [group commit](crate::PostgresStoreBuilder::group_commit), as
    /// [`begin`](Self::begin).
    async fn finish(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        marker: &[u8],
        result_ttl: Duration,
    ) -> Result<Finish, StoreError> {
        match &self.group {
            Some(group) => group.finish(unit, token, marker, result_ttl).await,
            None => self.finish_alone(unit, token, marker, result_ttl).await,
        }
    }

    /// After the grouped `begin` of the same unit that may be in flight, if any.
    async fn release(&self, unit: &UnitOfWork, token: &LockToken) -> Result<bool, StoreError> {
        if let Some(group) = &self.group {
            group.begun(unit).await;
        }
        self.release_alone(unit, token).await
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
                renewal(&self.statements.renew, unit, token, fence, lock_ttl)
                    .execute(&mut *connection),
            )
            .await?;
        Ok(renewed.rows_affected() > 0)
    }

    /// The unit's row and, unless it is done, its journal of steps, in one statement.
    async fn inspect(&self, unit: &UnitOfWork) -> Result<Inspection, StoreError> {
        let mut connection = self.acquire("inspect").await?;
        let row = self
            .run(
                "inspect",
                sqlx::query(self.statements.inspect.clone())
                    .bind(unit.task())
                    .bind(unit.key().as_bytes())
                    .fetch_one(&mut *connection),
            )
            .await?;
        let journal: Option<Vec<Vec<u8>>> = get(&row, "journal", "inspect", &self.table)?;
        let journal = Journal::from_entries(journal.unwrap_or_default());
        let state: Option<String> = get(&row, "state", "inspect", &self.table)?;
        let Some(state) = state else {
            return Ok(Inspection::empty().with_journal(journal));
        };
        let left: Option<i64> = get(&row, "left_ms", "inspect", &self.table)?;
        let left = left.map(left_duration);
        let found = match state.as_str() {
            "done" => {
                let marker: Option<Vec<u8>> = get(&row, "marker", "inspect", &self.table)?;
                let marker =
                    marker.ok_or_else(|| unexpected("inspect", "a done row without a marker"))?;
                Inspection::done(marker, left)
            }
            "locked" => {
                match doubt(&row).map_err(|err| store_error("inspect", &self.table, err))? {
                    Some(doubt) => Inspection::doubtful(doubt),
                    None => Inspection::locked(left.unwrap_or_default()),
                }
            }
            other => return Err(unexpected("inspect", format!("a row in state `{other}`"))),
        };
        Ok(found.with_journal(journal))
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

    /// True: the journals are rows of the steps table (see [`read_journal`](Self::read_journal)
    /// and [`record_step`](Self::record_step)).
    fn records_steps(&self) -> bool {
        true
    }

    /// One `SELECT` of the steps table: the unit's entries that have not expired, in order.
    async fn read_journal(&self, unit: &UnitOfWork) -> Result<Journal, StoreError> {
        self.journal(unit).await
    }

    /// One statement: the lock checked as `renew` checks it, and renewed, the entry appended at
    /// its position, and the journal kept for the entry's `kept_for`, all or nothing.
    async fn record_step(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        entry: StepEntry<'_>,
        lock_ttl: Duration,
    ) -> Result<bool, StoreError> {
        self.append_step(unit, token, entry, lock_ttl).await
    }
}
