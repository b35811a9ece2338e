//! Units left in doubt: a delivery whose lock ran out with neither a release nor a marker (a
//! worker killed, frozen or cut off between its side effect and its marker), what the store
//! still knows of it, and what a task does when it finds one.

use std::time::Duration;

/// How long a store remembers a lock whose TTL ran out without a release or a marker, by
/// default: a day, as long as results are kept by default.
///
/// Within that time a delivery that takes the unit over learns that it is [in
/// doubt](Doubt); after it the store has forgotten the earlier attempt and the unit is simply
/// free. What the memory costs is one small value per unit left in doubt (a finished or
/// released unit leaves nothing behind).
pub const DEFAULT_DOUBT_MEMORY: Duration = Duration::from_secs(24 * 60 * 60);

/// What the store knows of an earlier delivery of the same unit whose lock ran out while it
/// was running: it was killed, frozen or cut off after it began, and nobody can tell whether
/// its side effect happened.
///
/// Expiry is judged on the store's clock, never a worker's. A delivery that released its lock
/// (the body failed, panicked, or the call was dropped) leaves no doubt, and a finished unit is
/// never in doubt. Only a result ends a doubt: a delivery that took a unit over in doubt and
/// then fails, panics, is dropped or cannot tell whether its `begin` applied leaves the unit in
/// doubt for the next one, with its own lock as the earlier attempt. A running body reads it from
/// [`TaskContext::in_doubt`](crate::TaskContext::in_doubt); what the task does about it is its
/// [`InDoubt`] policy.
///
/// ```
/// use std::time::Duration;
/// use idempotask::store::Doubt;
/// let doubt = Doubt::new(Some(1_764_460_000_123_456), Duration::from_secs(3));
/// assert_eq!(doubt.fencing_token, Some(1_764_460_000_123_456));
/// assert_eq!(doubt.expired_for, Duration::from_secs(3));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Doubt {
    /// The earlier delivery's fencing token, when its task used fencing: pass it to the
    /// downstream system to ask what that writer did. On the Redis stores and in memory it is
    /// the store's clock in microseconds when that lock was granted (or just above the token
    /// before it).
    pub fencing_token: Option<u64>,
    /// How long the earlier lock had been expired, on the store's clock, when this delivery
    /// took the unit over.
    pub expired_for: Duration,
}

impl Doubt {
    /// An earlier delivery with `fencing_token`, whose lock had been expired for
    /// `expired_for`.
    pub fn new(fencing_token: Option<u64>, expired_for: Duration) -> Self {
        Self {
            fencing_token,
            expired_for,
        }
    }
}

/// What a task does with a unit it finds [in doubt](Doubt)
/// ([`Task::in_doubt`](crate::Task::in_doubt), `in_doubt = "…"` on the attribute).
///
/// ```
/// use idempotask::{InDoubt, Task};
/// static SEND: Task = Task::new("send_order_confirmation").in_doubt(InDoubt::Hold);
/// assert_eq!(SEND.settings().in_doubt, InDoubt::Hold);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum InDoubt {
    /// Run the body again (the default, and what every system of this kind does): the body
    /// can read [`TaskContext::in_doubt`](crate::TaskContext::in_doubt) and ask the downstream
    /// system itself.
    #[default]
    Rerun,
    /// At most once: the body does not run again. The call fails with
    /// [`Error::InDoubt`](crate::Error::InDoubt), and the unit stays in doubt for every later
    /// delivery until an operator resolves it (records a result or frees it), or until the
    /// store's memory of it runs out ([`Task::doubt_memory`](crate::Task::doubt_memory)). A
    /// held delivery writes nothing: it asks the store with
    /// [`LockToken::leaving_doubt`](crate::store::LockToken::leaving_doubt).
    Hold,
}

impl InDoubt {
    /// The name used by the attribute, logs and metrics: `rerun` or `hold`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Rerun => "rerun",
            Self::Hold => "hold",
        }
    }
}
