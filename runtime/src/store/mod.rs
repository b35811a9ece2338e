//! Where locks and completion markers live: the [`Store`] trait and what its operations answer.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::error::StoreError;
use crate::unit::{LockToken, MAX_KEY_LEN, UnitOfWork};

pub mod memory;
#[cfg(feature = "redis")]
pub mod redis;

/// A place that keeps, for each unit of work, a lock, a completion marker and a fencing counter.
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
    /// `lock_ttl`) and a new fencing token; otherwise how long the current holder's lock has
    /// left. If the lock already holds `token` (a repeated call) the answer is `Acquired` again
    /// with the same fencing token. `result_ttl` bounds how long the fencing counter is kept.
    async fn begin(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        lock_ttl: Duration,
        result_ttl: Duration,
    ) -> Result<Begin, StoreError>;

    /// Records success in one round trip. If the lock still holds `token`, stores `marker` for
    /// `result_ttl` and deletes the lock. Otherwise never touches the lock, stores `marker` only
    /// if no marker exists, and answers [`Finish::LockLost`]. Repeating a call that already
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
    /// The caller now holds the lock; `fencing_token` is greater than every token granted
    /// before for this unit.
    Acquired {
        /// The new fencing token.
        fencing_token: u64,
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
        /// Whether this call's marker was stored (no other marker existed).
        marker_written: bool,
    },
}

/// What a store holds for one unit of work, from [`Store::inspect`].
///
/// A unit can be both done and locked for a moment: a holder whose lock expired may store its
/// marker while a successor runs.
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
                result_ttl: Duration,
            ) -> Result<Begin, StoreError> {
                (**self).begin(unit, token, lock_ttl, result_ttl).await
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
