//! [`PostgresStoreBuilder`]: the table's name, the store's own pool, the migration, and the
//! check that it ran.

use std::time::Duration;

use sqlx::postgres::PgPool;

use super::PostgresStore;
use super::errors::store_error;
use super::statements::Statements;
use super::table::{DEFAULT_TABLE, TableName};
use idempotask::store::{BatchingStore, Store};
use idempotask::store::{MAX_KEY_LEN, UnitOfWork};
use idempotask::store::{StoreError, StoreErrorKind};

/// Configures a [`PostgresStore`]: see [`PostgresStore::builder`].
#[derive(Debug, Clone)]
#[must_use]
pub struct PostgresStoreBuilder {
    pub(super) pool: PgPool,
    pub(super) table: String,
    pub(super) response_timeout: Duration,
    pub(super) max_key_len: usize,
    pub(super) max_connections: Option<u32>,
    pub(super) group_commit: bool,
}

/// How long a statement of the store's may wait on a row lock in the server: four fifths of
/// the response timeout, so that the server ends the wait, and answers that nothing was taken,
/// before the client stops listening (the rest covers the round trip and the statement).
pub(crate) fn lock_timeout(response_timeout: Duration) -> Duration {
    response_timeout.saturating_sub(response_timeout / 5)
}

impl PostgresStore {
    /// A builder on the application's `pool` with the defaults: table
    /// [`DEFAULT_TABLE`](Self::DEFAULT_TABLE), timeout
    /// [`DEFAULT_RESPONSE_TIMEOUT`](Self::DEFAULT_RESPONSE_TIMEOUT), keys up to
    /// [`MAX_KEY_LEN`] bytes, a pool of the store's own as large as `pool` (see
    /// [Connections](Self#connections)).
    pub fn builder(pool: PgPool) -> PostgresStoreBuilder {
        PostgresStoreBuilder {
            pool,
            table: DEFAULT_TABLE.to_owned(),
            response_timeout: Self::DEFAULT_RESPONSE_TIMEOUT,
            max_key_len: MAX_KEY_LEN,
            max_connections: None,
            group_commit: true,
        }
    }
}

impl PostgresStoreBuilder {
    /// The table (`name` or `schema.name`, lower-case letters, digits and `_`; default
    /// [`DEFAULT_TABLE`](PostgresStore::DEFAULT_TABLE)). Several applications can share a
    /// database with a table each.
    pub fn table(mut self, name: &str) -> Self {
        name.clone_into(&mut self.table);
        self
    }

    /// How long one statement may take, waiting for a connection of the store's pool included
    /// (default [`DEFAULT_RESPONSE_TIMEOUT`](PostgresStore::DEFAULT_RESPONSE_TIMEOUT)). A
    /// statement's wait on a row lock ends in the server at four fifths of it.
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// How many connections the store's own pool opens at most (at least 1; default:
    /// [`DEFAULT_MAX_CONNECTIONS`](PostgresStore::DEFAULT_MAX_CONNECTIONS), or the
    /// application's pool's `max_connections` when that is smaller).
    ///
    /// The store's statements run on a pool of their own, opened with the application's
    /// pool's settings, so that bodies using the application's pool cannot starve them: a
    /// `begin` stuck behind the bodies fails, and a successful body whose `finish` cannot get
    /// a connection is not recorded and runs again on redelivery. Each call holds one
    /// connection only while a statement runs, so a few connections serve many calls; the
    /// connections are opened when needed.
    ///
    /// The server's `max_connections` must allow for them next to the application's:
    /// [`connect`](Self::connect) reads it, and logs a warning when the two pools together can
    /// open more connections than the server takes. A server that refuses a connection
    /// (`too many clients already`) makes a statement fail with a `Configuration` error that
    /// says so, rather than a timeout to retry.
    ///
    /// ```no_run
    /// # async fn f(pool: sqlx::PgPool) -> Result<(), idempotask::store::StoreError> {
    /// // 64 connections for the bodies, 16 for the store's statements.
    /// let store = idempotask_postgres::PostgresStore::builder(pool) // max_connections(64)
    ///     .max_connections(16)
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn max_connections(mut self, max: u32) -> Self {
        self.max_connections = Some(max.max(1));
        self
    }

    /// Whether the `begin`s and `finish`es of calls in flight at the same time are sent
    /// together (default: on): group commit, as [`BatchingStore`] does it, inside the store.
    ///
    /// Each statement of the store's commits on its own and waits for the WAL to be flushed
    /// to disk, and the store's pool has few connections: one call at a time per connection,
    /// that bounds how many commits one flush serves. Grouped, a call that finds no `begin`
    /// (or `finish`) of the store's in flight is sent at once, alone, as it would be without
    /// grouping, so an idle store adds no wait; the calls made while one is in flight wait for
    /// it to come back and then go together, as one
    /// [`begin_batch`](idempotask::store::Store::begin_batch) (one statement and one commit,
    /// for as many units as can be taken in one; see its docs) or one
    /// [`finish_batch`](idempotask::store::Store::finish_batch). Each call gets the answer it
    /// would have had alone; one unit's failure, or its wait on a row lock, fails no other.
    /// What it costs is a batch's: a call may wait for the batch in flight, and a batch's
    /// answers come back together (see [`BatchingStore`]).
    ///
    /// `release`, `renew`, `inspect`, the steps and the operator's reads are never grouped
    /// (a `release` waits for a grouped `begin` of its unit that is in flight, so that it
    /// cannot overtake it); nor is
    /// [`run_in_transaction`](idempotask::Call::run_in_transaction), whose statements run in
    /// the caller's transaction and commit with it. `begin_batch` and `finish_batch` go
    /// straight to the server, so a store behind a [`BatchingStore`] of its own (as the queue
    /// consumers put it) sends that one's batches as they are.
    ///
    /// A batch statement is planned by the server for each batch, for the table as it is then
    /// (it goes as the unnamed statement, never as a prepared one kept on the connection): a
    /// plan kept from the time the table was empty read the whole table for every batch once
    /// it had grown, and a store that grouped by default fell behind round after round in the
    /// bench (docs/performance-postgres.md) until this was found. Turn grouping off to send
    /// each call's statements alone, one commit each, for instance to compare:
    ///
    /// ```no_run
    /// # async fn f(pool: sqlx::PgPool) -> Result<(), idempotask::store::StoreError> {
    /// let store = idempotask_postgres::PostgresStore::builder(pool)
    ///     .group_commit(false)
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn group_commit(mut self, on: bool) -> Self {
        self.group_commit = on;
        self
    }

    /// The longest caller key accepted, in bytes (default
    /// [`MAX_KEY_LEN`](idempotask::store::MAX_KEY_LEN)), at most
    /// [`LONGEST_KEY`](PostgresStore::LONGEST_KEY): a primary key entry must fit in a third of
    /// a PostgreSQL page.
    pub fn max_key_len(mut self, max: usize) -> Self {
        self.max_key_len = max.min(PostgresStore::LONGEST_KEY);
        self
    }

    /// The SQL that creates the table and the fencing sequence (and the
    /// schema, for a `schema.table` name), for a migration tool of your own, and adds the
    /// columns of this version to a table of an earlier one. Every statement is `IF NOT
    /// EXISTS` (the column is added only when the catalog says it is missing), so running it
    /// again changes nothing and takes no lock on an up-to-date table.
    ///
    /// # Errors
    /// `Configuration` for an unusable table name.
    pub fn migration_sql(&self) -> Result<String, StoreError> {
        Ok(TableName::parse(&self.table)?.migration())
    }

    /// Runs [`migration_sql`](Self::migration_sql) in one transaction.
    ///
    /// # Errors
    /// `Configuration` for an unusable table name or missing rights; `Unreachable` when the
    /// server cannot be reached.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let name = TableName::parse(&self.table)?;
        let mut tx = self
            .pool
            .begin()
            .await
            .map_err(|err| store_error("migrate", &name.display(), err))?;
        // A simple-query batch: several statements, no parameters.
        sqlx::raw_sql(sqlx::AssertSqlSafe(name.migration()))
            .execute(&mut *tx)
            .await
            .map_err(|err| store_error("migrate", &name.display(), err))?;
        tx.commit()
            .await
            .map_err(|err| store_error("migrate", &name.display(), err))
    }

    /// Opens the store's pool, checks through it that the table (with this version's
    /// columns) and its fencing sequence exist, and builds the store.
    ///
    /// # Errors
    /// `Configuration` for an unusable table name, or a table that does not exist yet or is
    /// of an earlier version (run [`migrate`](Self::migrate) first); `Unreachable` or
    /// `Timeout` when the server does not answer.
    pub async fn connect(self) -> Result<PostgresStore, StoreError> {
        let name = TableName::parse(&self.table)?;
        let settings = self.pool.options();
        let application = settings.get_max_connections();
        let max = self
            .max_connections
            .unwrap_or_else(|| application.min(PostgresStore::DEFAULT_MAX_CONNECTIONS));
        let connections = settings
            .clone()
            .max_connections(max)
            .min_connections(settings.get_min_connections().min(max))
            .connect_lazy_with(self.pool.connect_options().as_ref().clone());
        let store = PostgresStore {
            statements: Statements::new(&name, lock_timeout(self.response_timeout)),
            table: name.display(),
            pool: self.pool,
            connections,
            diagnosis: super::checkout::Diagnosis::default(),
            response_timeout: self.response_timeout,
            max_key_len: self.max_key_len,
            group: None,
        };
        // Any unit will do: the statement fails on a missing table.
        let probe = UnitOfWork::new("idempotask", "connect-probe").map_err(|err| {
            StoreError::new("connect", StoreErrorKind::Configuration, err.to_string())
        })?;
        let checked = async {
            store.inspect(&probe).await?;
            store
                .run(
                    "connect",
                    sqlx::query(store.statements.schema_probe.clone()).execute(&store.connections),
                )
                .await?;
            attempts_writable(&store).await
        };
        checked
            .await
            .map_err(|err| StoreError::new("connect", err.kind(), err.to_string()))?;
        warn_if_pools_overflow(&store.connections, application, max).await;
        let group = self.group_commit.then(|| BatchingStore::new(store.clone()));
        Ok(PostgresStore { group, ..store })
    }
}

/// Checks the attempts table (`<table>_runs`), which only a transactional call's first step
/// writes: that it exists with its columns, and that the store's user may read and write it,
/// so that a deployment that lacks it fails here rather than at that step.
async fn attempts_writable(store: &PostgresStore) -> Result<(), StoreError> {
    let probe = store.statements.attempts.probe.clone();
    let row = store
        .run("connect", sqlx::query(probe).fetch_one(&store.connections))
        .await?;
    let writable: Option<bool> = crate::rows::get(&row, "writable", "connect", store.table())?;
    if writable == Some(true) {
        return Ok(());
    }
    Err(StoreError::new(
        "connect",
        StoreErrorKind::Configuration,
        format!(
            "the store's user may not read and write the attempts table `{}_runs` (written by transactional calls with steps): grant it SELECT, INSERT, UPDATE, DELETE there, as the deployment notes say",
            store.table()
        ),
    ))
}

/// Logs a warning when the application's pool (`application` connections) and the store's
/// (`own`) can together open more connections than the server takes from ordinary users:
/// once both are full, new connections are refused (`too many clients already`), which
/// sqlx's pools wait out until they time out. Whatever the server does not say is left
/// unchecked.
async fn warn_if_pools_overflow(connections: &PgPool, application: u32, own: u32) {
    let limits: Result<(i32, i32), sqlx::Error> = sqlx::query_as(
        "SELECT current_setting('max_connections')::int, current_setting('superuser_reserved_connections')::int",
    )
    .fetch_one(connections)
    .await;
    let Ok((server, reserved)) = limits else {
        return;
    };
    let takes = u32::try_from(server.saturating_sub(reserved)).unwrap_or(0);
    if application.saturating_add(own) > takes {
        tracing::warn!(
            server_max_connections = server,
            superuser_reserved_connections = reserved,
            application_pool = application,
            store_pool = own,
            "the application's pool and the store's can open more connections than the server takes; once they are all open, new connections are refused: lower `PostgresStoreBuilder::max_connections` or the application's pool, or raise the server's `max_connections`"
        );
    }
}
