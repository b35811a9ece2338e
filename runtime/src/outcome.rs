//! [`Outcome`] and [`Report`]: how a call's value came about.

/// What happened in one call, next to the value it returned; see [`Call::run_reported`](crate::Call::run_reported).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Report<T> {
    /// The body's value, or the stored one.
    pub value: T,
    /// How the value came about.
    pub outcome: Outcome,
    /// The fencing token of the execution that produced the value, when its task uses fencing.
    pub fencing_token: Option<u64>,
    /// How many times the call asked for the lock.
    pub attempts: u32,
    /// The body ran on a unit taken over [in doubt](crate::store::Doubt): what the store knew
    /// of the earlier delivery. `None` for a unit that was free, and for a replay.
    pub in_doubt: Option<crate::store::Doubt>,
}

/// How a call's value came about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// The body ran, its result was stored, and the lock was held until the store confirmed
    /// it: no other delivery could have run the body meanwhile.
    Executed,
    /// The unit was already done; the stored result was returned and the body did not run.
    Replayed,
    /// The unit was [in doubt](crate::store::Doubt), and the call's reconcile function
    /// ([`Call::reconcile`](crate::Call::reconcile)) found that the earlier delivery had done
    /// the work: the result it answered was stored, and the body did not run.
    Reconciled,
    /// The body ran but its lock had expired by the time it finished: another delivery may have
    /// run it too. Logged as a warning.
    ///
    /// Decided by the runner's clock as well as the store's answer: the lease starts when the
    /// lock is asked for, so it ends no later than the lock. A finish whose answer comes after
    /// the lease ended counts as lost even when the store answered that it completed (a store
    /// keeps a lapsed lock nobody took over as its holder's, and a client that re-sends a
    /// finish whose reply was lost gets the first one's answer): the lock may have been gone
    /// before the finish applied. A finish whose answer never came is read back once, so a
    /// marker that was stored is reported here, with `marker_written: true`, not as
    /// [`MarkerNotWritten`](Self::MarkerNotWritten).
    #[non_exhaustive]
    LockLost {
        /// Whether this execution's result was stored (no other result existed).
        marker_written: bool,
    },
    /// The body ran but the store could not be reached to record it within the lock TTL, and
    /// reading the unit back did not find its marker. The value is returned (the side effect
    /// did happen, and failing the delivery would only make the queue run it again); a later
    /// delivery may run the body again once the lock expires. Logged as a warning: a caller
    /// that must not go on without a recorded result checks for it in
    /// [`Call::run_reported`](crate::Call::run_reported)'s report (the Python package's
    /// `on_unrecorded="raise"` makes the same choice an exception).
    MarkerNotWritten,
}
