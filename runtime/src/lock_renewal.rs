//! [`LockRenewal`]: whether and how a task's lock is renewed while its body runs.

/// Whether and how a task's lock is renewed while its body runs, every third of its lock TTL,
/// so that a body longer than the TTL keeps it: [`Task::lock_renewal`](crate::Task::lock_renewal)
/// sets it for a task, `renew = "watchdog"` or `renew = "in_task"` for the attribute.
///
/// The two ways to renew differ in what a body may do and what each poll of it costs:
///
/// | | a body that blocks its thread | cost per poll of the body |
/// |---|---|---|
/// | [`Watchdog`](Self::Watchdog) | renewed through it | a hand-off to another thread and back |
/// | [`InTask`](Self::InTask) | stops its own renewals while it blocks | none |
///
/// ```
/// use std::time::Duration;
/// use idempotask::{LockRenewal, MemoryStore, Outcome, Task};
///
/// static EXPORT: Task = Task::new("export")
///     .lock_ttl(Duration::from_millis(150))
///     .lock_renewal(LockRenewal::InTask);
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idempotask::Error> {
/// let report = EXPORT
///     .call("2026-12")
///     .store(MemoryStore::new())
///     .run_reported(async {
///         tokio::time::sleep(Duration::from_millis(400)).await; // past the TTL, renewed
///         Ok::<_, idempotask::Error>(7)
///     })
///     .await?;
/// assert_eq!((report.value, report.outcome), (7, Outcome::Executed));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum LockRenewal {
    /// Not renewed (the default of a [`Task`](crate::Task)): the body has one lock TTL, after
    /// which another delivery may take the unit over.
    #[default]
    Off,
    /// Renewed by a watchdog task of its own on the runtime; on a multi-thread runtime each
    /// poll of the body runs in `tokio::task::block_in_place`.
    ///
    /// A body that blocks its thread (a synchronous call) stops neither the watchdog nor the
    /// timers and store replies it waits on, with any number of worker threads, one included.
    /// What it cannot renew through: a `current_thread` runtime whose only thread the body
    /// blocks. Blocking work is still best run with `tokio::task::spawn_blocking`, awaited
    /// from the body.
    ///
    /// The hand-off costs every poll of the body, blocking or not: about 20 µs per poll on a
    /// loaded two-core machine (`renewal-bench` in `idempotask-bench`: on the in-memory store,
    /// 64 calls in flight, renewed bodies of 4 awaits ran at 0.07× the speed of the same bodies
    /// unrenewed). Nothing next to a body that runs for seconds, which is what renewal is for.
    Watchdog,
    /// Renewed in the body's own task, polled next to the body each time it wakes: no task of
    /// its own and no hand-off, so a renewed body costs about what an unrenewed one does.
    ///
    /// The price is the guarantee for blocking bodies: a body that blocks its thread (a
    /// synchronous call longer than the lock TTL) stops its own renewals, and its lock can run
    /// out under it; the call then answers as for any lost lock. Choose it for bodies that only
    /// await, as async code should: an HTTP handler, whose blocking would stall every other
    /// request of its worker anyway, or a body whose blocking work goes through
    /// `tokio::task::spawn_blocking`.
    InTask,
}

impl LockRenewal {
    /// Whether the lock is renewed at all.
    ///
    /// ```
    /// use idempotask::LockRenewal;
    /// assert!(LockRenewal::InTask.is_on() && !LockRenewal::Off.is_on());
    /// ```
    #[must_use]
    pub const fn is_on(self) -> bool {
        !matches!(self, Self::Off)
    }
}
