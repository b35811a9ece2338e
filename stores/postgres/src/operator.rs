//! For operators: what one unit's row holds, raw, the compare-and-forget of exactly the marker
//! an operator was shown, the resolution of a unit in doubt against exactly the lock an
//! operator was shown, and the listing of one task's units, page by page.
//!
//! [`PostgresStore::read_unit`](crate::PostgresStore::read_unit),
//! [`PostgresStore::forget_exact`](crate::PostgresStore::forget_exact),
//! [`PostgresStore::resolve_exact`](crate::PostgresStore::resolve_exact) and
//! [`PostgresStore::list_task`](crate::PostgresStore::list_task) answer with these types (and
//! [`Forgot`](idempotask::operator::Forgot) and [`Resolved`](idempotask::operator::Resolved),
//! the same on every backend); the `idempotask` command is built on them.

use std::time::Duration;

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
