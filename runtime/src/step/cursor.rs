//! Where a body is in its unit's journal, and the limits its steps run under: what the call
//! sets up before the body runs.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

/// How many steps a body may record, unless its task says otherwise
/// ([`Task::max_steps`](crate::Task::max_steps)).
pub const DEFAULT_MAX_STEPS: u32 = 100;

/// How long one step's journal entry may be, in bytes, unless its task says otherwise
/// ([`Task::max_step_bytes`](crate::Task::max_step_bytes)).
pub const DEFAULT_MAX_STEP_BYTES: usize = 64 * 1024;

/// Where a body is in its journal; kept in the lease that every clone of its context shares.
#[derive(Debug, Default)]
pub(crate) struct Cursor {
    pub(super) armed: Option<Armed>,
    /// The journal as the store answered it at the body's first step; `None` until then.
    pub(super) recorded: Option<Vec<Vec<u8>>>,
    pub(super) next: u32,
    pub(super) running: bool,
}

/// What a step needs from its call, set once the lock is granted.
#[derive(Debug)]
pub(super) struct Armed {
    pub(super) kept_for: Duration,
    pub(super) max_steps: u32,
    pub(super) max_step_bytes: usize,
}

/// The settings a call's steps run with.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StepLimits {
    pub(crate) kept_for: Duration,
    pub(crate) max_steps: u32,
    pub(crate) max_step_bytes: usize,
}

impl Cursor {
    /// Lets the body's steps run, once the lock is granted.
    pub(crate) fn arm(cursor: &Mutex<Self>, limits: StepLimits) {
        let mut cursor = cursor.lock().unwrap_or_else(PoisonError::into_inner);
        cursor.armed = Some(Armed {
            kept_for: limits.kept_for,
            max_steps: limits.max_steps,
            max_step_bytes: limits.max_step_bytes,
        });
    }
}
