//! Many units in one round trip: what [`Store::begin_batch`](super::Store::begin_batch) and
//! [`Store::finish_batch`](super::Store::finish_batch) take for each unit.
//!
//! A queue consumer that fetches ten or a hundred messages at once would otherwise pay the
//! store's round trip, its syscalls and its reply parsing once per message. The batch methods
//! ask for every unit's lock (or record every unit's result) at once; each unit keeps its own
//! answer, lock token and fencing token, exactly as if it had been asked alone, and one unit's
//! failure never fails another's.

use crate::unit::{LockToken, UnitOfWork};

/// One unit of a [`begin_batch`](super::Store::begin_batch): the unit and the token its lock
/// is asked for, what [`Store::begin`](super::Store::begin) takes for it.
///
/// ```
/// use idempotask::store::{Claim, LockToken, UnitOfWork};
///
/// let unit = UnitOfWork::new("charge", "order-42")?;
/// let token = LockToken::generate();
/// let claim = Claim::new(&unit, &token);
/// assert_eq!(claim.unit.key(), "order-42");
/// # Ok::<(), idempotask::InvalidKey>(())
/// ```
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct Claim<'a> {
    /// The unit whose lock is asked for.
    pub unit: &'a UnitOfWork,
    /// The caller's token for it.
    pub token: &'a LockToken,
}

impl<'a> Claim<'a> {
    /// Asks for `unit`'s lock with `token`.
    pub fn new(unit: &'a UnitOfWork, token: &'a LockToken) -> Self {
        Self { unit, token }
    }
}

/// One unit of a [`finish_batch`](super::Store::finish_batch): the unit, the token of the lock
/// held for it and the marker that replaces that lock, what
/// [`Store::finish`](super::Store::finish) takes for it.
///
/// ```
/// use idempotask::store::{Completion, LockToken, UnitOfWork};
///
/// let unit = UnitOfWork::new("charge", "order-42")?;
/// let token = LockToken::generate();
/// let completion = Completion::new(&unit, &token, b"the marker");
/// assert_eq!(completion.marker, b"the marker");
/// # Ok::<(), idempotask::InvalidKey>(())
/// ```
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct Completion<'a> {
    /// The unit whose result is recorded.
    pub unit: &'a UnitOfWork,
    /// The token of the lock held for it (granted, with its fencing token if any).
    pub token: &'a LockToken,
    /// The completion marker's bytes.
    pub marker: &'a [u8],
}

impl<'a> Completion<'a> {
    /// Records `marker` for `unit`, in place of the lock `token` holds.
    pub fn new(unit: &'a UnitOfWork, token: &'a LockToken, marker: &'a [u8]) -> Self {
        Self {
            unit,
            token,
            marker,
        }
    }
}
