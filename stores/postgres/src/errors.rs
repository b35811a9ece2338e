//! sqlx's errors as [`StoreError`]s: what kind of failure, and whether the statement may have
//! taken effect.

use idempotask::store::{StoreError, StoreErrorKind};

/// Classifies a failed statement of `operation` on table `table`.
pub(super) fn store_error(operation: &'static str, table: &str, err: sqlx::Error) -> StoreError {
    let (kind, ambiguous, message) = classify(table, &err);
    StoreError::new(operation, kind, message)
        .ambiguous_if(ambiguous)
        .with_source(err)
}

/// What kind of failure `err` is, whether the statement may have taken effect, and what to
/// say of it.
pub(super) fn classify(table: &str, err: &sqlx::Error) -> (StoreErrorKind, bool, String) {
    match err {
        // The request may have reached the server before the connection broke.
        sqlx::Error::Io(_) => (StoreErrorKind::Unreachable, true, err.to_string()),
        sqlx::Error::Tls(_) => (StoreErrorKind::Unreachable, false, err.to_string()),
        // The pool never handed out a connection: nothing was sent.
        sqlx::Error::PoolTimedOut => (
            StoreErrorKind::Timeout,
            false,
            "no connection of the pool became free in time".to_owned(),
        ),
        sqlx::Error::PoolClosed => (
            StoreErrorKind::Configuration,
            false,
            "the connection pool was closed".to_owned(),
        ),
        sqlx::Error::Database(db) => database(db.as_ref(), table),
        sqlx::Error::Configuration(_) => (StoreErrorKind::Configuration, false, err.to_string()),
        sqlx::Error::Protocol(_)
        | sqlx::Error::ColumnDecode { .. }
        | sqlx::Error::ColumnNotFound(_)
        | sqlx::Error::Decode(_)
        | sqlx::Error::TypeNotFound { .. } => (StoreErrorKind::Protocol, true, err.to_string()),
        _ => (StoreErrorKind::Rejected, true, err.to_string()),
    }
}

/// A statement the server refused ran to no effect, so these are not ambiguous, except where
/// the server is shutting down.
fn database(db: &dyn sqlx::error::DatabaseError, table: &str) -> (StoreErrorKind, bool, String) {
    let code = db.code().unwrap_or_default();
    match &*code {
        // undefined_table, undefined_object (the sequence): the migration has not run;
        // undefined_column: the table is of an earlier version, and this one's migration
        // (which adds the column) has not run.
        "42P01" | "42704" | "42703" => (
            StoreErrorKind::Configuration,
            false,
            format!(
                "{}; create the table with `PostgresStore::migrate` or the SQL of `PostgresStore::migration_sql` (table `{table}`)",
                db.message()
            ),
        ),
        // insufficient_privilege: granting rights is the operator's business.
        "42501" => (
            StoreErrorKind::Configuration,
            false,
            db.message().to_owned(),
        ),
        // admin_shutdown, crash_shutdown: the server is going away, and may say so after the
        // statement's commit reached the log, so its fate is unknown.
        "57P01" | "57P02" => (StoreErrorKind::Unreachable, true, db.message().to_owned()),
        // too_many_connections: the server's `max_connections` is shared by every pool that
        // uses it. A spike passes (a retry finds room), a pool too large for the server does
        // not: retryable, with the remedy in the message for the second case.
        "53300" => (
            StoreErrorKind::Rejected,
            false,
            format!(
                "the server refused a connection: {} (SQLSTATE 53300); the store's pool and the application's must fit in the server's `max_connections` together: lower `PostgresStoreBuilder::max_connections` or the application's pool, or raise `max_connections`",
                db.message()
            ),
        ),
        // cannot_connect_now: not yet back; nothing ran.
        "57P03" => (StoreErrorKind::Unreachable, false, db.message().to_owned()),
        // query_canceled (statement_timeout), lock_not_available (lock_timeout).
        "57014" | "55P03" => (StoreErrorKind::Timeout, false, db.message().to_owned()),
        _ => (
            StoreErrorKind::Rejected,
            false,
            format!("{} (SQLSTATE {code})", db.message()),
        ),
    }
}

/// A reply this store's statements cannot give: a row of the wrong shape.
pub(super) fn unexpected(operation: &'static str, what: impl Into<String>) -> StoreError {
    StoreError::new(operation, StoreErrorKind::Protocol, what)
}
