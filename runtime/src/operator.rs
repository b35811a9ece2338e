//! For operators: what a store holds for a unit ([`Status`], [`Marker`]), and what a
//! compare-and-forget did with it ([`Forgot`]).
//! [`Task::status`](crate::Task::status) answers it for one unit; the `idempotask` command line
//! tool is built on these and on each store crate's own layout (`idempotask_redis::RedisKeys`).

pub use crate::marker::{Marker, MarkerError, StoredResult};
pub use crate::status::{Done, Status};

/// What a store's compare-and-forget (`forget_exact` in `idempotask_redis` and
/// `idempotask_postgres`) did with the value an operator was shown.
///
/// The operator reads a unit, shows it, and asks to forget it only if it still holds exactly
/// what was shown; this says which of the three things happened. Treat a variant this version
/// does not know as [`Changed`](Self::Changed): nothing is known to be deleted.
///
/// ```
/// use idempotask::operator::Forgot;
///
/// fn say(forgot: Forgot) -> &'static str {
///     match forgot {
///         Forgot::Deleted => "forgotten; the next delivery runs it again",
///         Forgot::Gone => "expired or forgotten meanwhile",
///         _ => "it changed since it was shown; nothing deleted",
///     }
/// }
///
/// assert_eq!(say(Forgot::Gone), "expired or forgotten meanwhile");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Forgot {
    /// The value was still the one shown; it is gone (a fenced unit keeps its fencing counter).
    Deleted,
    /// The unit held nothing any more (it expired, or someone else forgot it).
    Gone,
    /// The unit holds something else now (another marker, a lock); nothing was deleted.
    Changed,
}
