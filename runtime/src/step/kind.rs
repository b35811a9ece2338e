//! [`StepErrorKind`]: why a step could not run or be replayed.

/// Why a step could not run or be replayed ([`Error::Step`](crate::Error::Step)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StepErrorKind {
    /// The journal's entry at this step's place belongs to another step: the body calls its
    /// steps in another order than the run that recorded them. Nothing ran; the journal is
    /// left as it is, and the unit is held: the call does not release its lock, which lapses
    /// into doubt, so that no delivery runs a body on a journal it does not match until an
    /// operator resolves the unit (records its result, or forgets it with its journal). A
    /// rerun of the body meanwhile stops here again.
    OrderChanged,
    /// The body called more steps than its task allows. Nothing ran.
    TooMany,
    /// A step was called while another step of the same body was running (two steps joined):
    /// a rerun could not tell their results apart. Nothing ran.
    Overlapping,
    /// The store does not record steps, or the call's database transaction gives no store
    /// to record them outside it
    /// ([`TransactionScope::step_store`](crate::store::TransactionScope::step_store)).
    /// Nothing ran.
    Unsupported,
    /// The step's effect happened but the store did not confirm its record (it failed or did
    /// not answer). The call keeps the unit in doubt instead of releasing it; inside a
    /// database transaction it rolls back, and the next delivery finds the step in doubt when
    /// the transaction's step store keeps an attempt (`idempotask-postgres` does), or runs it
    /// again when it keeps none.
    Unrecorded,
}
