//! The seam for stores whose lock and marker live inside a scope the body writes in too: a
//! database transaction.

use std::future::Future;
use std::time::Duration;

use crate::error::StoreError;
use crate::store::{Begin, Fencing, SharedStore};
use crate::unit::{LockToken, MAX_KEY_LEN, UnitOfWork};

/// One transaction of a store that keeps units of work in the same database as the body's
/// writes, so that the body's writes and the unit's completion marker commit together or not
/// at all. [`Call::run_in_transaction`](crate::Call::run_in_transaction) drives it.
///
/// `idempotask-postgres` implements it for a PostgreSQL transaction; a store of one's own on
/// another transactional database implements it the same way. The runner is the same as for
/// [`Store`](crate::store::Store): spans, metrics, marker checks, fencing and outcomes are
/// the core's, the implementation only speaks to its database.
///
/// # Contract
/// - [`begin`](Self::begin) takes the unit's lock *inside the transaction* (in one attempt:
///   the runner does not retry inside a transaction). A lock held by another open transaction
///   is waited on until that transaction ends, then the answer reflects how it ended:
///   [`Begin::Done`] if it committed, [`Begin::Acquired`] if it rolled back. A lock held by a
///   plain ([`Store::begin`](crate::store::Store::begin)) call is [`Begin::Busy`] at once:
///   waiting inside a transaction could hold row locks that keep that holder from recording.
/// - [`handle`](Self::handle) is what the body writes with, inside the same transaction.
/// - [`commit`](Self::commit) replaces the transaction's own lock with `marker` (kept for
///   `result_ttl`) and commits. When it answers `Ok`, the body's writes and the marker are
///   durable; when it fails, neither is, unless the error is
///   [ambiguous](StoreError::is_ambiguous) (the commit may have applied).
/// - [`abort`](Self::abort) rolls back. Dropping the value must roll back too (a dropped call
///   stores nothing), which is what database drivers do with a dropped transaction.
/// - [`step_store`](Self::step_store), once the lock is taken and before the body runs, gives
///   the store that records the body's steps *outside* the transaction, so that a step's record
///   outlives a rollback as its effect does (see its contract). Without one (the default), the
///   body's steps fail with [`StepErrorKind::Unsupported`](crate::StepErrorKind::Unsupported).
///
/// ```
/// use std::time::Duration;
/// use idempotask::store::{Begin, Fencing, LockToken, StoreError, TransactionScope, UnitOfWork};
///
/// /// A "database" whose transactions are a list of writes, committed into `committed`.
/// #[derive(Debug, Default)]
/// struct Writes {
///     pending: Vec<String>,
///     committed: Vec<String>,
/// }
///
/// impl TransactionScope for &mut Writes {
///     type Handle = Vec<String>;
///
///     async fn begin(&mut self, _: &UnitOfWork, _: &LockToken, _: Duration, _: Fencing)
///         -> Result<Begin, StoreError> {
///         Ok(Begin::acquired(None))
///     }
///
///     fn handle(&mut self) -> &mut Vec<String> {
///         &mut self.pending
///     }
///
///     async fn commit(self, _: &UnitOfWork, _: &LockToken, _: &[u8], _: Duration)
///         -> Result<(), StoreError> {
///         self.committed.append(&mut self.pending);
///         Ok(())
///     }
///
///     async fn abort(self) {
///         self.pending.clear();
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idempotask::Error> {
/// let mut database = Writes::default();
/// let moved: u32 = idempotask::Task::new("transfer")
///     .call("transfer-77")
///     .run_in_transaction(&mut database, async |writes| {
///         writes.push("debit 1".to_owned());
///         writes.push("credit 2".to_owned());
///         Ok::<_, idempotask::Error>(500)
///     })
///     .await?;
/// assert_eq!((moved, database.committed.len()), (500, 2));
/// # Ok(()) }
/// ```
pub trait TransactionScope: Send {
    /// What the body writes with, inside the transaction (a database connection).
    type Handle: Send + ?Sized;

    /// The longest caller key this store accepts, in bytes.
    fn max_key_len(&self) -> usize {
        MAX_KEY_LEN
    }

    /// Takes the unit's lock inside the transaction for `token` (expiring after `lock_ttl` for
    /// plain calls that look at it), with a new fencing token when `fencing` is
    /// [`Fencing::On`]; or answers the stored marker, or that a plain call holds the lock.
    fn begin(
        &mut self,
        unit: &UnitOfWork,
        token: &LockToken,
        lock_ttl: Duration,
        fencing: Fencing,
    ) -> impl Future<Output = Result<Begin, StoreError>> + Send;

    /// The connection the body writes with.
    fn handle(&mut self) -> &mut Self::Handle;

    /// Replaces the transaction's lock with `marker`, kept for `result_ttl`, and commits.
    fn commit(
        self,
        unit: &UnitOfWork,
        token: &LockToken,
        marker: &[u8],
        result_ttl: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Rolls the transaction back: nothing of it is kept.
    fn abort(self) -> impl Future<Output = ()> + Send;

    /// The store that keeps the journal of the body's steps while this transaction holds the
    /// unit taken by [`begin`](Self::begin); asked once, after `begin` answered
    /// [`Begin::Acquired`], before the body runs. `None`, the default: the body's steps fail
    /// closed with [`StepErrorKind::Unsupported`](crate::StepErrorKind::Unsupported) before
    /// their effects run.
    ///
    /// # Contract
    /// - Its [`record_step`](crate::store::Store::record_step) commits on its own, outside the
    ///   transaction: a step's effect is outside it too, so its record must survive a rollback
    ///   (the next delivery replays it instead of running the effect again). It records only
    ///   while this transaction is open and holds the unit (whatever token it is given), at
    ///   the journal's next position, and never waits on a lock this transaction holds: the
    ///   transaction is waiting for the step, so such a wait would never end.
    /// - Its [`read_journal`](crate::store::Store::read_journal) reads the committed journal,
    ///   as [`Store::read_journal`](crate::store::Store::read_journal) does.
    /// - Its [`renew`](crate::store::Store::renew) answers whether this transaction still holds
    ///   the unit (what [`TaskContext::fence`](crate::TaskContext::fence) asks).
    /// - The marker stays the transaction's: [`commit`](Self::commit) writes it, and the
    ///   journal is left to run out, as [`Store::finish`](crate::store::Store::finish) may.
    /// - The transaction's lock leaves no trace when its worker dies: a store that keeps a
    ///   trace of its own (an attempt, written at the body's first `read_journal`) answers
    ///   the next holder's `read_journal` [in doubt](crate::store::Journal::in_doubt) when the
    ///   earlier execution died in its steps, so that the step after the journal's last entry
    ///   gets its policy. Its [`release`](crate::store::Store::release) is then called once
    ///   the transaction was rolled back after the body ended cleanly with no step in doubt
    ///   (an `Err`, no step holding the unit): the trace goes, since no effect is half done.
    ///   A store that keeps none answers `release` with `Ok(false)` or an error, which the
    ///   runner logs and otherwise ignores.
    ///
    /// # Errors
    /// When the store cannot say which transaction holds the unit; the call rolls back.
    fn step_store(
        &mut self,
    ) -> impl Future<Output = Result<Option<SharedStore>, StoreError>> + Send {
        std::future::ready(Ok(None))
    }
}
