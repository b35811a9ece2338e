//! Where locks and completion markers live: the [`Store`] trait and what its operations answer.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::error::StoreError;
use crate::unit::{LockToken, MAX_KEY_LEN, UnitOfWork};

pub mod memory;
#[cfg(feature = "redis")]
pub mod redis;

/// A place that keeps, for each unit of work, either a lock or a completion marker (and, for
/// tasks that use fencing, the last fencing token granted).
///
/// Every operation concerns a single unit and is atomic with respect to that unit. Each one is
/// safe to repeat with the same arguments (a retry after a lost reply cannot take a second lock
/// or delete someone else's), which is what lets the task runner retry store calls at all.
///
/// The stores shipped are [`RedisStore`](crate::RedisStore) (the production one),
/// [`RedisClusterStore`](crate::RedisClusterStore) (the same on a Redis Cluster) and
/// [`MemoryStore`](crate::MemoryStore) (one process only). All pass the same conformance suite.
#[async_trait]
pub trait Store: Send + Sync + std::fmt::Debug {
    /// The longest caller key this store accepts, in bytes.
    fn max_key_len(&self) -> usize {
        MAX_KEY_LEN
    }

    /// One step of starting a unit of work, in one round trip:
    /// the stored marker if the unit is done; otherwise the lock for `token` (expiring after
    /// `lock_ttl`), with a new fencing token when `fencing` is [`Fencing::On`]; otherwise how
    /// long the current holder's lock has left. If the lock already holds `token` (a repeated
    /// call) the answer is `Acquired` again, with the same fencing token.
    async fn begin(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        lock_ttl: Duration,
        fencing: Fencing,
    ) -> Result<Begin, StoreError>;

    /// Records success in one round trip (where the lock is still held). If the lock still
    /// holds `token` (with its fencing token, if any), replaces it with `marker`, kept for
    /// `result_ttl`, and answers [`Finish::Completed`]. Otherwise never touches another
    /// holder's lock: with no lock and no marker it stores `marker` and answers
    /// [`Finish::LockLost`] with `marker_written: true`; with another holder's lock or another
    /// marker it stores nothing (`marker_written: false`). Repeating a call that already
    /// succeeded answers [`Finish::Completed`] again.
    async fn finish(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        marker: &[u8],
        result_ttl: Duration,
    ) -> Result<Finish, StoreError>;

    /// Deletes the lock if it still holds `token`; answers whether it did.
    async fn release(&self, unit: &UnitOfWork, token: &LockToken) -> Result<bool, StoreError>;

    /// Resets the lock's expiry to `lock_ttl` if it still holds `token`; answers whether it did.
    async fn renew(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        lock_ttl: Duration,
    ) -> Result<bool, StoreError>;

    /// What the store holds for `unit`, for operators (one round trip, changes nothing).
    async fn inspect(&self, unit: &UnitOfWork) -> Result<Inspection, StoreError>;

    /// Deletes the completion marker on purpose so that the work may run again; answers whether
    /// there was one. Locks are left alone.
    async fn forget(&self, unit: &UnitOfWork) -> Result<bool, StoreError>;
}

/// The answer of [`Store::begin`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Begin {
    /// The caller now holds the lock.
    Acquired {
        /// With [`Fencing::On`], the new fencing token: greater than every token granted before
        /// for this unit. `None` without fencing.
        fencing_token: Option<u64>,
    },
    /// The unit is done; these are the stored marker's bytes.
    Done(Vec<u8>),
    /// Another holder has the lock.
    Busy {
        /// How long that lock has left, when known.
        lock_ttl_remaining: Option<Duration>,
    },
}

/// The answer of [`Store::finish`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Finish {
    /// The marker is stored and the lock released.
    Completed,
    /// The lock had expired (and may be held by someone else): the work may have run twice.
    LockLost {
        /// Whether this call's marker was stored (the unit had neither a lock nor a marker).
        marker_written: bool,
    },
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

/// What a store holds for one unit of work, from [`Store::inspect`]: a marker, a lock, or
/// neither.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Inspection {
    /// The stored marker's bytes (decode with [`Marker::decode`](crate::Marker::decode)).
    pub marker: Option<Vec<u8>>,
    /// How long the marker has left, when it has an expiry.
    pub marker_ttl: Option<Duration>,
    /// How long the current lock has left, if the unit is locked.
    pub lock_ttl: Option<Duration>,
}

impl Inspection {
    /// Whether a completion marker exists.
    pub fn is_done(&self) -> bool {
        self.marker.is_some()
    }

    /// Whether a lock is held.
    pub fn is_locked(&self) -> bool {
        self.lock_ttl.is_some()
    }
}

macro_rules! forward_store {
    ($($ty:ty),*) => {$(
        #[async_trait]
        impl<S: Store + ?Sized> Store for $ty {
            fn max_key_len(&self) -> usize {
                (**self).max_key_len()
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
        }
    )*};
}

forward_store!(Arc<S>, Box<S>);

/// Milliseconds for a store command, at least 1 (a zero TTL would mean "no expiry" or an error).
pub(crate) fn ttl_millis(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1)
}
