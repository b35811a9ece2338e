//! The task-local context a running body can read: its key, fencing token and lock state.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::time::Instant;

use crate::error::{CallerKey, Error, lock_lost};
use crate::observe::KeyLogging;
use crate::step::cursor::{Cursor, StepLimits};
use crate::step::kind::StepErrorKind;
use crate::store::{Doubt, SharedStore, Store};
use crate::unit::{LockToken, UnitOfWork};

tokio::task_local! {
    static CONTEXT: TaskContext;
}

/// What a running idempotent task knows about its own execution.
///
/// Available through [`context()`] inside the body of a task run by idempotask (and nowhere
/// else). With fencing on, pass [`fencing_token`](Self::fencing_token) to downstream writes so
/// that a database can reject a writer whose lock was taken over; check [`lock_held`](Self::lock_held) before a
/// long step to stop early when the lock is gone.
///
/// ```
/// use idempotask::{MemoryStore, Task};
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let token = Task::new("report")
///     .fencing(true)
///     .call("2026-11")
///     .store(MemoryStore::new())
///     .run(async {
///         let ctx = idempotask::context().expect("inside a task");
///         assert_eq!(ctx.key(), "2026-11");
///         assert!(ctx.lock_held());
///         Ok::<_, idempotask::Error>(ctx.fencing_token())
///     })
///     .await
///     .unwrap();
/// assert!(token.is_some_and(|token| token > 0));
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct TaskContext {
    unit: UnitOfWork,
    fencing_token: Option<u64>,
    attempt: u32,
    lease: Arc<Lease>,
    /// Boxed: rare, and the context is part of every call's future.
    in_doubt: Option<Box<Doubt>>,
}

/// The locally known validity of the lock: acquired at `start`, valid until `start +
/// valid_for_ms` unless `lost`.
#[derive(Debug)]
pub(crate) struct Lease {
    start: Instant,
    valid_for_ms: AtomicU64,
    lost: AtomicBool,
    /// A reconcile function found the work done: its result is recorded instead of a body's.
    reconciled: AtomicBool,
    /// How [`TaskContext::fence`] asks the store; unset inside a database transaction whose
    /// scope records no steps (its lock lasts until the transaction ends: nobody can take the
    /// unit over meanwhile).
    fence: OnceLock<Fence>,
    /// A fence was refused: the call answers [`Error::LockNotHeld`], whatever the body returns.
    fenced_out: AtomicBool,
    /// Where the body's steps are in the unit's journal.
    pub(crate) steps: Mutex<Cursor>,
    /// How the task shows keys in logs and errors.
    logging: KeyLogging,
    /// The unit must not run again unseen, and why: a step's effect happened and its record was
    /// not confirmed, or the body's steps came in another order than its journal's. The call
    /// leaves the lock to lapse into doubt rather than release it, runs no further step and
    /// records no value of the body's.
    holds: OnceLock<StepErrorKind>,
}

/// What a fence needs to ask the store whether the lock is still this holder's: the lock's
/// token as granted, and the TTL a successful check renews it to; and what the body's steps
/// record under it, with their limits. Kept in the lease, which every execution allocates
/// already, and set once: a body that calls no step reads nothing else.
#[derive(Debug)]
pub(crate) struct Fence {
    store: SharedStore,
    token: LockToken,
    lock_ttl: Duration,
    steps: StepLimits,
}

impl Fence {
    pub(crate) fn store(&self) -> &SharedStore {
        &self.store
    }

    pub(crate) fn token(&self) -> &LockToken {
        &self.token
    }

    pub(crate) fn lock_ttl(&self) -> Duration {
        self.lock_ttl
    }

    /// The limits of the steps recorded under this fence.
    pub(crate) fn steps(&self) -> StepLimits {
        self.steps
    }

    pub(crate) fn new(
        store: &SharedStore,
        token: &LockToken,
        lock_ttl: Duration,
        steps: StepLimits,
    ) -> Self {
        Self {
            store: store.clone(),
            token: token.clone(),
            lock_ttl,
            steps,
        }
    }
}

impl Lease {
    /// A lease taken at `start` (just before the lock request was sent) for `ttl`.
    pub(crate) fn new(start: Instant, ttl: Duration, logging: KeyLogging) -> Self {
        Self {
            start,
            valid_for_ms: AtomicU64::new(millis(ttl)),
            lost: AtomicBool::new(false),
            reconciled: AtomicBool::new(false),
            fence: OnceLock::new(),
            fenced_out: AtomicBool::new(false),
            steps: Mutex::default(),
            logging,
            holds: OnceLock::new(),
        }
    }

    /// How the store is asked about this lease's lock; `None` inside a database transaction
    /// whose scope records no steps.
    pub(crate) fn fence(&self) -> Option<&Fence> {
        self.fence.get()
    }

    /// Whether the call leaves its lock to lapse into doubt (see [`hold`](Self::hold)).
    pub(crate) fn holds(&self) -> bool {
        self.holds.get().is_some()
    }

    /// The refusal of the first step that held the unit (see [`hold`](Self::hold)).
    pub(crate) fn held_by(&self) -> Option<StepErrorKind> {
        self.holds.get().copied()
    }

    /// Keeps the unit from running again unseen: the call does not release its lock, which
    /// lapses into doubt, where it stays until a result is recorded or an operator resolves it.
    pub(crate) fn hold(&self, kind: StepErrorKind) {
        let _ = self.holds.set(kind);
    }

    /// The call's error for a body that returned `Ok` after a refusal: [`Error::LockNotHeld`]
    /// after a fence's, or the step error of the refusal that held the unit, its value not the
    /// unit's result.
    pub(crate) fn refusal(&self, unit: &UnitOfWork, logging: KeyLogging) -> Error {
        match self.held_by() {
            Some(kind) if !self.was_fenced_out() => Error::Step {
                task: unit.task().to_owned(),
                key: CallerKey::plain(unit.key()).shown_as(logging),
                kind,
                reason: "the body returned Ok after a step was refused: its value is not recorded, and the unit stays held until it is resolved".to_owned(),
            },
            _ => lock_lost(unit, logging),
        }
    }

    /// Whether a fence was refused during this execution.
    pub(crate) fn was_fenced_out(&self) -> bool {
        self.fenced_out.load(Ordering::Acquire)
    }

    /// Lets [`TaskContext::fence`] check this lease against the store; set once, when the
    /// lock's token is final (granted, with the doubt it took over).
    pub(crate) fn arm_fence(&self, fence: Fence) {
        let _ = self.fence.set(fence);
    }

    /// Extends the lease after a renewal that was sent at `sent` for `ttl`.
    pub(crate) fn renewed(&self, sent: Instant, ttl: Duration) {
        let until = millis(sent.saturating_duration_since(self.start) + ttl);
        self.valid_for_ms.fetch_max(until, Ordering::AcqRel);
    }

    /// Marks the lock as lost for good.
    pub(crate) fn is_lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }

    pub(crate) fn lose(&self) {
        self.lost.store(true, Ordering::Release);
    }

    pub(crate) fn expires_at(&self) -> Instant {
        let valid_for = Duration::from_millis(self.valid_for_ms.load(Ordering::Acquire));
        expiry(self.start, valid_for)
    }

    /// How long ago the lock was asked for: how much of its TTL the holder has used.
    pub(crate) fn age(&self) -> Duration {
        self.start.elapsed()
    }

    pub(crate) fn reconcile(&self) {
        self.reconciled.store(true, Ordering::Release);
    }

    pub(crate) fn reconciled(&self) -> bool {
        self.reconciled.load(Ordering::Acquire)
    }

    pub(crate) fn held(&self) -> bool {
        !self.lost.load(Ordering::Acquire) && Instant::now() < self.expires_at()
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// `start + ttl` with `ttl` at most [`MAX_TTL`](crate::MAX_TTL): never an overflow, whatever TTL
/// a caller passed.
pub(crate) fn expiry(start: Instant, ttl: Duration) -> Instant {
    let ttl = crate::ttl::clamp_ttl(ttl);
    start
        .checked_add(ttl)
        .or_else(|| start.checked_add(Duration::from_secs(365 * 24 * 3600)))
        .unwrap_or(start)
}

impl TaskContext {
    pub(crate) fn new(
        unit: UnitOfWork,
        fencing_token: Option<u64>,
        attempt: u32,
        lease: Arc<Lease>,
    ) -> Self {
        Self {
            unit,
            fencing_token,
            attempt,
            lease,
            in_doubt: None,
        }
    }

    pub(crate) fn lease(&self) -> &Lease {
        &self.lease
    }

    pub(crate) fn unit(&self) -> &UnitOfWork {
        &self.unit
    }

    pub(crate) fn logging(&self) -> KeyLogging {
        self.lease.logging
    }

    /// The context of a body that runs on a unit taken over in doubt.
    pub(crate) fn with_doubt(mut self, in_doubt: Option<Box<Doubt>>) -> Self {
        self.in_doubt = in_doubt;
        self
    }

    /// The task's stable name.
    pub fn task(&self) -> &str {
        self.unit.task()
    }

    /// The caller's idempotency key.
    pub fn key(&self) -> &str {
        self.unit.key()
    }

    /// This execution's fencing token, when its task uses fencing
    /// ([`Task::fencing`](crate::Task::fencing)): greater than that of every earlier execution
    /// of the same unit of work. `None` when the task does not use fencing.
    pub fn fencing_token(&self) -> Option<u64> {
        self.fencing_token
    }

    /// Whether this unit is [in doubt](Doubt): an earlier delivery's lock ran out on the
    /// store's clock without a release or a result (its worker was killed, frozen or cut off
    /// after it began), so its side effect may have happened. What the store knows of it, to
    /// ask the downstream system (a payment provider's lookup by idempotency key) before doing
    /// the work again; `None` when the unit was free.
    ///
    /// ```
    /// use idempotask::{MemoryStore, Task};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let in_doubt = Task::new("charge")
    ///     .call("order-1")
    ///     .store(MemoryStore::new())
    ///     .run(async {
    ///         Ok::<_, idempotask::Error>(idempotask::context().unwrap().in_doubt().is_some())
    ///     })
    ///     .await
    ///     .unwrap();
    /// assert!(!in_doubt, "a first delivery is never in doubt");
    /// # }
    /// ```
    pub fn in_doubt(&self) -> Option<Doubt> {
        self.in_doubt.as_deref().copied()
    }

    /// Which request for the lock succeeded (1 when it was free at once).
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// Whether this execution still holds its lock, as far as this process knows: false once
    /// the lock TTL has run out without a successful renewal, or a renewal found it taken.
    pub fn lock_held(&self) -> bool {
        self.lease.held()
    }

    /// Checks against the store, before a side effect, that this execution still holds its
    /// lock. A holder whose lock the store no longer holds (a pause past the lock TTL, and
    /// another delivery took the unit over or the store forgot the lock; an operator resolved
    /// the unit) gets [`Error::LockNotHeld`] and must not start the effect; otherwise the lock
    /// is renewed to the task's full lock TTL, so the effect has that long before anyone else
    /// can take the unit over.
    ///
    /// One store command (a renewal by the lock's token); [`lock_held`](Self::lock_held) is the
    /// free but local answer. A lock that ran out may still be this holder's, when the store
    /// remembers it and nobody took the unit over ([`Task::doubt_memory`](crate::Task::doubt_memory)):
    /// then the fence renews it and answers `Ok`. Once a fence is refused, the call answers
    /// `Error::LockNotHeld` whatever the body returns after it, so that a queue consumer
    /// redelivers the message after the current holder instead of counting a failure. Inside
    /// a transactional call ([`Call::run_in_transaction`](crate::Call::run_in_transaction))
    /// the transaction holds the unit until it ends, and a fence answers `Ok` without a
    /// command. A pause between the fence and the effect's arrival is out of any client's
    /// sight: pass the [`fencing_token`](Self::fencing_token) to a downstream system that can
    /// check it.
    ///
    /// # Errors
    /// [`Error::LockNotHeld`] when the store no longer holds the lock, or this process already
    /// found it lost; [`Error::Store`] when the store could not answer (the effect must not
    /// start either: the check failed closed).
    ///
    /// ```
    /// use idempotask::{MemoryStore, Task};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idempotask::Error> {
    /// let receipt = Task::new("checkout")
    ///     .call("order-7")
    ///     .store(MemoryStore::new())
    ///     .run(async {
    ///         let ctx = idempotask::context().expect("inside a task");
    ///         // ... the charge ...
    ///         ctx.fence().await?; // still ours: nobody took over while the charge ran
    ///         Ok::<_, idempotask::Error>("receipt mailed".to_owned())
    ///     })
    ///     .await?;
    /// assert_eq!(receipt, "receipt mailed");
    /// # Ok(()) }
    /// ```
    pub async fn fence(&self) -> Result<(), Error> {
        let Some(fence) = self.lease.fence.get() else {
            return Ok(());
        };
        if self.lease.is_lost() {
            return Err(self.fence_refused());
        }
        let sent = Instant::now();
        match fence
            .store
            .renew(&self.unit, &fence.token, fence.lock_ttl)
            .await
        {
            // The watchdog may have found the lock gone while this renewal was in flight.
            Ok(true) if !self.lease.is_lost() => {
                self.lease.renewed(sent, fence.lock_ttl);
                Ok(())
            }
            Ok(_) => Err(self.fence_refused()),
            Err(err) => Err(Error::Store(err)),
        }
    }

    /// Marks the lease lost and refused at a fence; the error the body gets for it.
    pub(crate) fn fence_refused(&self) -> Error {
        self.lease.lose();
        self.lease.fenced_out.store(true, Ordering::Release);
        tracing::warn!(
            task = self.unit.task(),
            key = self.lease.logging.show(&self.unit),
            "the lock is no longer this delivery's; the body stops there"
        );
        lock_lost(&self.unit, self.lease.logging)
    }

    /// The body's value is the one a reconcile function found, not a new execution's.
    pub(crate) fn mark_reconciled(&self) {
        self.lease.reconcile();
    }

    pub(crate) async fn scope<F: Future>(self, body: F) -> F::Output {
        CONTEXT.scope(self, body).await
    }
}

/// The context of the idempotent task running on this tokio task, if any.
pub fn context() -> Option<TaskContext> {
    CONTEXT.try_with(Clone::clone).ok()
}
