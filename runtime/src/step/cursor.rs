//! Where a body is in its unit's journal, and the limits its steps run under (set with the
//! call's fence before the body runs).

use std::time::Duration;

use crate::store::Doubt;

/// How many steps a body may record, unless its task says otherwise
/// ([`Task::max_steps`](crate::Task::max_steps)).
pub const DEFAULT_MAX_STEPS: u32 = 100;

/// How long one step's journal entry may be, in bytes, unless its task says otherwise
/// ([`Task::max_step_bytes`](crate::Task::max_step_bytes)).
pub const DEFAULT_MAX_STEP_BYTES: usize = 64 * 1024;

/// Where a body is in its journal; kept in the lease that every clone of its context shares,
/// and taken by its steps only: a body that calls none never locks it.
#[derive(Debug, Default)]
pub(crate) struct Cursor {
    /// The journal as the store answered it at the body's first step; `None` until then.
    pub(super) recorded: Option<Vec<Vec<u8>>>,
    /// The doubt the store answered with the journal: an earlier execution died with it as
    /// it is, so the step after its last entry is in doubt.
    pub(super) doubt: Option<Doubt>,
    pub(super) next: u32,
    pub(super) running: bool,
}

impl Cursor {
    /// Whether the journal came with a doubt that no step has settled: the body did not get
    /// past the step in doubt (it held, or its rerun or reconcile failed, or it never got
    /// there). Such an execution's end must leave the doubt for the next one.
    pub(crate) fn leaves_doubt(&self) -> bool {
        let Some(recorded) = &self.recorded else {
            return false;
        };
        self.doubt.is_some() && self.next as usize <= recorded.len()
    }
}

/// The settings a call's steps run with, set once with the call's fence
/// ([`Fence`](crate::context::Fence)).
#[derive(Debug, Clone, Copy)]
pub(crate) struct StepLimits {
    pub(crate) kept_for: Duration,
    pub(crate) max_steps: u32,
    pub(crate) max_step_bytes: usize,
    /// The task holds units in doubt ([`InDoubt::Hold`](crate::InDoubt::Hold)): a step that
    /// the journal says is in doubt (a transactional execution's, see
    /// [`Journal::in_doubt`](crate::store::Journal::in_doubt)) is held whatever its own
    /// policy, as `begin` holds such a unit before its body runs on the other paths.
    pub(crate) holds_doubt: bool,
    /// The task's [`hold_alert_after`](crate::Task::hold_alert_after): a step held on the
    /// journal's doubt counts as overdue past it, as a unit `begin` holds does.
    pub(crate) hold_alert_after: Option<Duration>,
}
