//! Where locks and completion markers live: the [`Store`] trait, what its operations answer,
//! and [`SharedStore`], any store behind one pointer.
//!
//! A store of one's own implements [`Store`] with plain `async fn`s and no other dependency:
//!
//! ```
//! use std::time::Duration;
//! use idempotask::store::{Begin, Fencing, Finish, Inspection, Store};
//! use idempotask::store::{LockToken, StoreError, StoreErrorKind, UnitOfWork};
//!
//! /// A store that is never reachable: every call fails closed.
//! #[derive(Debug)]
//! struct Unreachable;
//!
//! fn down(operation: &'static str) -> StoreError {
//!     StoreError::new(operation, StoreErrorKind::Unreachable, "the store is down")
//! }
//!
//! impl Store for Unreachable {
//!     async fn begin(&self, _: &UnitOfWork, _: &LockToken, _: Duration, _: Fencing)
//!         -> Result<Begin, StoreError> { Err(down("begin")) }
//!     async fn finish(&self, _: &UnitOfWork, _: &LockToken, _: &[u8], _: Duration)
//!         -> Result<Finish, StoreError> { Err(down("finish")) }
//!     async fn release(&self, _: &UnitOfWork, _: &LockToken) -> Result<bool, StoreError> {
//!         Err(down("release"))
//!     }
//!     async fn renew(&self, _: &UnitOfWork, _: &LockToken, _: Duration)
//!         -> Result<bool, StoreError> { Err(down("renew")) }
//!     async fn inspect(&self, _: &UnitOfWork) -> Result<Inspection, StoreError> {
//!         Err(down("inspect"))
//!     }
//!     async fn forget(&self, _: &UnitOfWork) -> Result<bool, StoreError> { Err(down("forget")) }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let ran: Result<u8, idempotask::Error> = idempotask::Task::new("t")
//!     .call("k")
//!     .store(Unreachable)
//!     .run(async { Ok(1) })
//!     .await;
//! assert!(matches!(ran, Err(idempotask::Error::Store(_))));
//! # }
//! ```
//!
//! The checks every store must pass are the
//! [`idempotask-conformance`](https://docs.rs/idempotask-conformance) crate
//! (`idempotask_conformance::conformance_tests!` in a store's tests).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

mod batch;
mod batching;
mod inspection;
mod journal;
mod local_cache;
pub(crate) mod memory;
mod shared;
mod transaction;

pub use crate::doubt::Doubt;
pub use crate::error::{StoreError, StoreErrorKind};
pub use crate::marker::lock_lost_marker;
pub use crate::unit::{
    LockToken, MAX_KEY_LEN, MAX_NAME_LEN, UnitOfWork, check_namespace, check_task_name,
};
pub use batch::{Claim, Completion};
pub use batching::BatchingStore;
pub use inspection::Inspection;
pub use journal::{Journal, StepEntry};
pub use local_cache::{DEFAULT_MAX_MARKER_BYTES, LocalResultCache};
pub use shared::SharedStore;
pub use transaction::TransactionScope;

/// A place that keeps, for each unit of work, either a lock or a completion marker (and, for
/// tasks that use fencing, the last fencing token granted).
///
/// Every operation concerns a single unit and is atomic with respect to that unit. Each one is
/// safe to repeat with the same arguments (a retry after a lost reply cannot take a second lock
/// or delete someone else's), which is what lets the task runner retry store calls at all.
///
/// The stores shipped are `MemoryStore` (one process only, in this crate), `RedisStore`,
/// `RedisClusterStore` and `RedlockStore` (a majority of independent servers) in
/// [idempotask-redis](https://docs.rs/idempotask-redis), and `PostgresStore` in
/// [idempotask-postgres](https://docs.rs/idempotask-postgres). All pass the same conformance
/// suite.
///
/// Implement it with `async fn`s (see the [module](self) docs); their futures must be `Send`,
/// because a call may be released in the background.
pub trait Store: Send + Sync + std::fmt::Debug + 'static {
    /// The longest caller key this store accepts, in bytes.
    fn max_key_len(&self) -> usize {
        MAX_KEY_LEN
    }

    /// Whether [`begin_batch`](Self::begin_batch) and [`finish_batch`](Self::finish_batch)
    /// answer a batch in fewer round trips than one call per unit (`RedisStore`: one
    /// pipeline). The queue consumers wrap such a store in [`BatchingStore`] unless told not
    /// to, so that the units of one fetch reach it together. The default, `false`, is right for
    /// a store that answers a batch one unit at a time: behind a `BatchingStore`, every call
    /// would wait for the others.
    fn batches_natively(&self) -> bool {
        false
    }

    /// One step of starting a unit of work, in one round trip:
    /// the stored marker if the unit is done; otherwise the lock for `token` (expiring after
    /// `lock_ttl`), with a new fencing token when `fencing` is [`Fencing::On`]; otherwise how
    /// long the current holder's lock has left. If the lock already holds `token` (a repeated
    /// call) the answer is `Acquired` again, with the same fencing token and the same doubt
    /// taken over, if any.
    ///
    /// A store that remembers locks past their TTL ([`LockToken::doubt_memory`]) keeps this
    /// lock for `lock_ttl` plus that memory, and judges every lock's expiry on its own clock.
    /// A lock whose TTL ran out, still remembered, is taken over (not busy), and the answer
    /// says so: `Acquired` with `in_doubt` ([`Begin::taken_over`]), since that holder neither
    /// released its lock nor wrote a marker; unless the token asks to leave such units alone
    /// ([`LockToken::leaving_doubt`]): then the answer is [`Begin::InDoubt`] and nothing is
    /// written. Until it is taken over, such a lock is still its
    /// holder's for `finish`, `renew` and `release`: nobody else ran. The lock that takes a
    /// unit over carries the doubt it found until a result is recorded (see `release`).
    fn begin(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        lock_ttl: Duration,
        fencing: Fencing,
    ) -> impl Future<Output = Result<Begin, StoreError>> + Send;

    /// Records success in one round trip (where the lock is still held). If the lock still
    /// holds `token` (with its fencing token, if any), replaces it with `marker`, kept for
    /// `result_ttl`, and answers [`Finish::Completed`]. Otherwise never touches another
    /// holder's lock: with no lock and no marker it stores `marker` and answers
    /// [`Finish::LockLost`] with `marker_written: true`; with another holder's lock or another
    /// marker it stores nothing (`marker_written: false`). Repeating a call that already
    /// succeeded answers [`Finish::Completed`] again.
    fn finish(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        marker: &[u8],
        result_ttl: Duration,
    ) -> impl Future<Output = Result<Finish, StoreError>> + Send;

    /// Deletes the lock if it still holds `token`, whatever fencing token it was granted with
    /// (the random token alone identifies the holder, and a caller whose grant's reply was lost
    /// releases without knowing the fencing token); answers whether it did. A fenced lock keeps
    /// its counter, so the next grant's fencing token is still higher. A lock that took the
    /// unit over in doubt is not deleted but left to run out now (remembered for its doubt
    /// memory, its expiry unchanged if it ran out already): only a result ends a doubt, and a
    /// holder that releases after a `begin` it could not confirm may have taken it over.
    fn release(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Resets the lock's expiry to `lock_ttl` if it still holds `token`; answers whether it did.
    fn renew(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        lock_ttl: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// What the store holds for `unit`, for operators (one round trip, changes nothing).
    fn inspect(
        &self,
        unit: &UnitOfWork,
    ) -> impl Future<Output = Result<Inspection, StoreError>> + Send;

    /// Deletes the completion marker on purpose so that the work may run again; answers whether
    /// there was one. Locks are left alone.
    fn forget(&self, unit: &UnitOfWork) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Whether this store keeps a journal of steps ([`record_step`](Self::record_step)). The
    /// runtime asks before a body's first step runs its effect, so that a store without
    /// journals fails the step closed instead of running an effect it cannot record. The
    /// default is `false`.
    fn records_steps(&self) -> bool {
        false
    }

    /// The journal of `unit`: the steps its holders recorded since it last had a result, first
    /// step first (empty for none), in one round trip. The runtime reads it once per
    /// execution, when the body's first step runs, so a unit without steps never pays for it;
    /// only the lock's holder appends, so what the holder reads stays true while it holds the
    /// lock. The default answers a [`StoreErrorKind::Configuration`] error, as
    /// [`record_step`](Self::record_step) does.
    fn read_journal(
        &self,
        unit: &UnitOfWork,
    ) -> impl Future<Output = Result<Journal, StoreError>> + Send {
        let _ = unit;
        std::future::ready(Err(no_steps("read_journal")))
    }

    /// Appends a finished step to the journal of `unit`, in one round trip, and renews the
    /// lock to `lock_ttl`: only while `token` (with its fencing token) holds the lock, and only
    /// at `entry.position` (the journal holds exactly that many entries). Answers whether the
    /// entry is recorded; `false` when the lock is no longer the caller's or another entry
    /// took that position, and nothing was written. The same entry written again at the same
    /// position (a retry whose first reply was lost) answers `true`.
    ///
    /// The journal outlives the lock (a release, a lapsed lock) for `entry.kept_for`, so that
    /// the next holder resumes from it; [`finish`](Self::finish) and [`forget`](Self::forget)
    /// drop it. The default answers a [`StoreErrorKind::Configuration`] error: the store does
    /// not record steps (see [`records_steps`](Self::records_steps)).
    fn record_step(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        entry: StepEntry<'_>,
        lock_ttl: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        let _ = (unit, token, entry, lock_ttl);
        std::future::ready(Err(no_steps("record_step")))
    }

    /// [`begin`](Self::begin) for each of `claims`, with the same `lock_ttl` and `fencing`, in
    /// as few round trips as the store can: the answer at index `i` is `claims[i]`'s, exactly
    /// what `begin` would have answered for it (its own lock, fencing token and doubt taken
    /// over). The claims apply in order, as if sent one after another: a unit claimed twice
    /// with two tokens is acquired by the first and busy for the second.
    ///
    /// One unit's failure is its answer alone, never another's: a unit whose key holds a value
    /// that is not idempotask's answers an error, the others their own answers. A round trip
    /// that fails as a whole (the connection dropped) answers that error for each unit it
    /// carried, ambiguous where any of them may have been applied, as `begin` would.
    ///
    /// The default ([`begin_each`]) asks for each unit in turn, one `begin` each; a store that can do better
    /// overrides it (`RedisStore`: one pipeline, one command per unit and one round trip in
    /// all). The answers are always as many as the claims.
    ///
    /// ```
    /// use std::time::Duration;
    /// use idempotask::MemoryStore;
    /// use idempotask::store::{Begin, Claim, Fencing, LockToken, Store, UnitOfWork};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = MemoryStore::new();
    /// let units = [UnitOfWork::new("charge", "order-1")?, UnitOfWork::new("charge", "order-2")?];
    /// let tokens = [LockToken::generate(), LockToken::generate()];
    /// let claims: Vec<_> = units.iter().zip(&tokens).map(|(unit, token)| Claim::new(unit, token)).collect();
    /// let answers = store.begin_batch(&claims, Duration::from_secs(30), Fencing::Off).await;
    /// assert!(answers.iter().all(|answer| matches!(answer, Ok(Begin::Acquired { .. }))));
    /// # Ok(()) }
    /// ```
    fn begin_batch(
        &self,
        claims: &[Claim<'_>],
        lock_ttl: Duration,
        fencing: Fencing,
    ) -> impl Future<Output = Vec<Result<Begin, StoreError>>> + Send {
        begin_each(self, claims, lock_ttl, fencing)
    }

    /// [`finish`](Self::finish) for each of `completions`, with the same `result_ttl`, in as
    /// few round trips as the store can: the answer at index `i` is `completions[i]`'s, exactly
    /// what `finish` would have answered for it. Applied in order, as if sent one after
    /// another; one unit's failure is its answer alone, and a round trip that fails as a whole
    /// answers that error for each unit it carried, as for
    /// [`begin_batch`](Self::begin_batch).
    ///
    /// The default ([`finish_each`]) records each unit in turn, one `finish` each; `RedisStore` sends one
    /// pipeline. The answers are always as many as the completions.
    ///
    /// ```
    /// use std::time::Duration;
    /// use idempotask::MemoryStore;
    /// use idempotask::store::{Begin, Completion, Fencing, Finish, LockToken, Store, UnitOfWork};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = MemoryStore::new();
    /// let unit = UnitOfWork::new("charge", "order-1")?;
    /// let token = LockToken::generate();
    /// store.begin(&unit, &token, Duration::from_secs(30), Fencing::Off).await?;
    /// let done = [Completion::new(&unit, &token, b"a marker")];
    /// let answers = store.finish_batch(&done, Duration::from_secs(3600)).await;
    /// assert_eq!(answers.len(), 1);
    /// assert!(matches!(answers[0], Ok(Finish::Completed)));
    /// # Ok(()) }
    /// ```
    fn finish_batch(
        &self,
        completions: &[Completion<'_>],
        result_ttl: Duration,
    ) -> impl Future<Output = Vec<Result<Finish, StoreError>>> + Send {
        finish_each(self, completions, result_ttl)
    }
}

/// [`Store::begin_batch`] one unit at a time: `store`'s `begin` for
/// each claim in turn. The trait's default, and the fallback of a store that batches only
/// where it can (`RedisClusterStore`, whose units spread over nodes).
///
/// ```
/// use std::time::Duration;
/// use idempotask::MemoryStore;
/// use idempotask::store::{Claim, Fencing, LockToken, UnitOfWork, begin_each};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let unit = UnitOfWork::new("charge", "order-1")?;
/// let token = LockToken::generate();
/// let answers = begin_each(&MemoryStore::new(), &[Claim::new(&unit, &token)], Duration::from_secs(30), Fencing::Off).await;
/// assert_eq!(answers.len(), 1);
/// # Ok(()) }
/// ```
pub async fn begin_each<S: Store + ?Sized>(
    store: &S,
    claims: &[Claim<'_>],
    lock_ttl: Duration,
    fencing: Fencing,
) -> Vec<Result<Begin, StoreError>> {
    let mut answers = Vec::with_capacity(claims.len());
    for claim in claims {
        answers.push(
            store
                .begin(claim.unit, claim.token, lock_ttl, fencing)
                .await,
        );
    }
    answers
}

/// [`Store::finish_batch`] one unit at a time: `store`'s `finish`
/// for each completion in turn, as [`begin_each`] does for a begin.
///
/// ```
/// use std::time::Duration;
/// use idempotask::MemoryStore;
/// use idempotask::store::{Completion, Finish, LockToken, UnitOfWork, finish_each};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let unit = UnitOfWork::new("charge", "order-1")?;
/// let token = LockToken::generate();
/// // Nobody held the unit: the result is kept, as a lock lost.
/// let answers = finish_each(&MemoryStore::new(), &[Completion::new(&unit, &token, b"D1|x|1")], Duration::from_secs(60)).await;
/// assert!(matches!(answers[0], Ok(Finish::LockLost { marker_written: true, .. })));
/// # Ok(()) }
/// ```
pub async fn finish_each<S: Store + ?Sized>(
    store: &S,
    completions: &[Completion<'_>],
    result_ttl: Duration,
) -> Vec<Result<Finish, StoreError>> {
    let mut answers = Vec::with_capacity(completions.len());
    for completion in completions {
        answers.push(
            store
                .finish(
                    completion.unit,
                    completion.token,
                    completion.marker,
                    result_ttl,
                )
                .await,
        );
    }
    answers
}

/// The answer of [`Store::begin`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Begin {
    /// The caller now holds the lock ([`Begin::acquired`] builds it).
    #[non_exhaustive]
    Acquired {
        /// With [`Fencing::On`], the new fencing token: greater than every token granted before
        /// for this unit. `None` without fencing.
        fencing_token: Option<u64>,
        /// The unit was taken over from a holder whose lock ran out without a release or a
        /// marker: what the store knows of it. `None` for a unit that was free. Boxed: rare,
        /// and the answer is part of every call's future.
        in_doubt: Option<Box<Doubt>>,
    },
    /// The unit is done; these are the stored marker's bytes.
    Done(Vec<u8>),
    /// The unit is in doubt (its last lock ran out without a release or a marker, and the
    /// store remembers it), and the token asked not to take it over
    /// ([`LockToken::leaving_doubt`]): nothing was written.
    InDoubt(Doubt),
    /// Another holder has the lock ([`Begin::busy`] builds it).
    #[non_exhaustive]
    Busy {
        /// How long that lock has left, when known.
        lock_ttl_remaining: Option<Duration>,
    },
}

impl Begin {
    /// The lock is the caller's, with the fencing token granted if the call asked for one.
    pub fn acquired(fencing_token: Option<u64>) -> Self {
        Self::Acquired {
            fencing_token,
            in_doubt: None,
        }
    }

    /// The lock is the caller's, taken over from a holder whose lock ran out without a
    /// release or a marker: the unit is in doubt.
    pub fn taken_over(fencing_token: Option<u64>, doubt: Doubt) -> Self {
        Self::Acquired {
            fencing_token,
            in_doubt: Some(Box::new(doubt)),
        }
    }

    /// Another holder has the lock, for `lock_ttl_remaining` more when the store knows.
    pub fn busy(lock_ttl_remaining: Option<Duration>) -> Self {
        Self::Busy { lock_ttl_remaining }
    }
}

/// The answer of [`Store::finish`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Finish {
    /// The marker is stored and the lock released.
    Completed,
    /// The lock had expired (and may be held by someone else): the work may have run twice.
    /// [`Finish::lost_marker_written`] and [`Finish::lost_nothing_written`] build it.
    #[non_exhaustive]
    LockLost {
        /// Whether this call's marker was stored (the unit had neither a lock nor a marker).
        marker_written: bool,
    },
}

impl Finish {
    /// The lock was gone and nobody held the unit: this call's marker was stored.
    pub fn lost_marker_written() -> Self {
        Self::LockLost {
            marker_written: true,
        }
    }

    /// The lock was gone and another holder's lock or marker is there: nothing was stored.
    pub fn lost_nothing_written() -> Self {
        Self::LockLost {
            marker_written: false,
        }
    }
}

/// Whether [`Store::begin`] grants a fencing token with the lock.
///
/// Fencing tokens increase strictly per unit of work across grants, releases and expiries, so a
/// database that remembers the highest token it saw can refuse a writer whose lock was taken
/// over. Keeping the counter costs the store some work on every fresh start, so tasks ask for it
/// ([`Task::fencing`](crate::Task::fencing), `fencing = true` on the attribute).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Fencing {
    /// No fencing token: the lock is a plain compare-and-set.
    #[default]
    Off,
    /// A fencing token with every grant.
    On,
}

impl<S: Store> Store for Arc<S> {
    fn max_key_len(&self) -> usize {
        (**self).max_key_len()
    }

    fn batches_natively(&self) -> bool {
        (**self).batches_natively()
    }

    async fn begin(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        lock_ttl: Duration,
        fencing: Fencing,
    ) -> Result<Begin, StoreError> {
        (**self).begin(unit, token, lock_ttl, fencing).await
    }

    async fn finish(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        marker: &[u8],
        result_ttl: Duration,
    ) -> Result<Finish, StoreError> {
        (**self).finish(unit, token, marker, result_ttl).await
    }

    async fn release(&self, unit: &UnitOfWork, token: &LockToken) -> Result<bool, StoreError> {
        (**self).release(unit, token).await
    }

    async fn renew(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        lock_ttl: Duration,
    ) -> Result<bool, StoreError> {
        (**self).renew(unit, token, lock_ttl).await
    }

    async fn inspect(&self, unit: &UnitOfWork) -> Result<Inspection, StoreError> {
        (**self).inspect(unit).await
    }

    async fn forget(&self, unit: &UnitOfWork) -> Result<bool, StoreError> {
        (**self).forget(unit).await
    }

    fn records_steps(&self) -> bool {
        (**self).records_steps()
    }

    async fn read_journal(&self, unit: &UnitOfWork) -> Result<Journal, StoreError> {
        (**self).read_journal(unit).await
    }

    async fn record_step(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        entry: StepEntry<'_>,
        lock_ttl: Duration,
    ) -> Result<bool, StoreError> {
        (**self).record_step(unit, token, entry, lock_ttl).await
    }

    async fn begin_batch(
        &self,
        claims: &[Claim<'_>],
        lock_ttl: Duration,
        fencing: Fencing,
    ) -> Vec<Result<Begin, StoreError>> {
        (**self).begin_batch(claims, lock_ttl, fencing).await
    }

    async fn finish_batch(
        &self,
        completions: &[Completion<'_>],
        result_ttl: Duration,
    ) -> Vec<Result<Finish, StoreError>> {
        (**self).finish_batch(completions, result_ttl).await
    }
}

/// Milliseconds for a store command: at least 1 (a zero TTL would mean "no expiry" or an
/// error), at most [`MAX_TTL`](crate::MAX_TTL) (past it, Redis refuses the expiry and
/// idempotency would silently stop).
///
/// ```
/// use std::time::Duration;
/// assert_eq!(idempotask::store::ttl_millis(Duration::from_micros(10)), 1);
/// assert_eq!(idempotask::store::ttl_millis(Duration::from_secs(2)), 2000);
/// ```
pub fn ttl_millis(ttl: Duration) -> u64 {
    u64::try_from(crate::ttl::clamp_ttl(ttl).as_millis())
        .unwrap_or(u64::MAX)
        .max(1)
}

/// The error of a step operation on a store that does not record steps.
fn no_steps(operation: &'static str) -> StoreError {
    StoreError::new(
        operation,
        StoreErrorKind::Configuration,
        "this store does not record steps",
    )
}
