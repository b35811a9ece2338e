//! [`MemoryStore`]: the store semantics in one process, with real expiry.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use tokio::time::Instant;

use super::{Begin, Finish, Inspection, Store};
use crate::error::StoreError;
use crate::unit::{LockToken, UnitOfWork};

/// How many operations pass between sweeps of expired entries.
const SWEEP_EVERY: u64 = 4096;

/// A store that lives in this process's memory.
///
/// Same semantics as [`RedisStore`](crate::RedisStore), including lock, marker and fencing
/// counter expiry (measured with `tokio::time`, so tests with a paused clock can advance it).
/// It is the embedded default for examples, tests and single-process programs; it protects
/// nothing across processes, and its markers are gone when the process exits.
///
/// # Behaviour
/// Operations never fail and never wait on I/O; expired entries are dropped when touched and
/// swept every few thousand operations. Clones share the same data.
///
/// ```
/// use idempotask::{MemoryStore, Task};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let store = MemoryStore::new();
/// let task = Task::new("send_welcome_mail");
/// let first: Result<u32, idempotask::Error> =
///     task.call("user-7").store(store.clone()).run(async { Ok(1) }).await;
/// let again: Result<u32, idempotask::Error> =
///     task.call("user-7").store(store.clone()).run(async { Ok(2) }).await;
/// assert_eq!((first.unwrap(), again.unwrap()), (1, 1));
/// # }
/// ```
#[derive(Debug, Clone, Default)]
pub struct MemoryStore {
    state: Arc<Mutex<State>>,
}

#[derive(Debug, Default)]
struct State {
    units: HashMap<(Box<str>, Box<str>), Entry>,
    operations: u64,
}

#[derive(Debug, Default)]
struct Entry {
    lock: Option<Expiring<LockToken>>,
    marker: Option<Expiring<Arc<[u8]>>>,
    fence: Option<Expiring<u64>>,
}

#[derive(Debug)]
struct Expiring<T> {
    value: T,
    until: Instant,
}

impl<T> Expiring<T> {
    fn new(value: T, ttl: Duration, now: Instant) -> Self {
        Self {
            value,
            until: now + ttl,
        }
    }
}

fn live<T>(slot: &mut Option<Expiring<T>>, now: Instant) -> Option<&mut Expiring<T>> {
    if slot.as_ref().is_some_and(|held| held.until <= now) {
        *slot = None;
    }
    slot.as_mut()
}

impl Entry {
    fn is_empty(&self) -> bool {
        self.lock.is_none() && self.marker.is_none() && self.fence.is_none()
    }
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn with_entry<R>(&self, unit: &UnitOfWork, op: impl FnOnce(&mut Entry, Instant) -> R) -> R {
        let now = Instant::now();
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.operations += 1;
        if state.operations.is_multiple_of(SWEEP_EVERY) {
            state.units.retain(|_, entry| {
                live(&mut entry.lock, now);
                live(&mut entry.marker, now);
                live(&mut entry.fence, now);
                !entry.is_empty()
            });
        }
        let id = (Box::from(unit.task()), Box::from(unit.digest()));
        let entry = state.units.entry(id).or_default();
        op(entry, now)
    }
}

/// The next fencing token after `last`: never below the wall clock in milliseconds, so tokens
/// keep increasing even after an idle unit's counter expired.
pub(crate) fn next_fencing_token(last: u64, now_millis: u64) -> u64 {
    last.saturating_add(1).max(now_millis)
}

fn unix_millis() -> u64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
}

#[async_trait]
impl Store for MemoryStore {
    async fn begin(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        lock_ttl: Duration,
        result_ttl: Duration,
    ) -> Result<Begin, StoreError> {
        Ok(self.with_entry(unit, |entry, now| {
            if let Some(marker) = live(&mut entry.marker, now) {
                return Begin::Done(marker.value.to_vec());
            }
            if let Some(lock) = live(&mut entry.lock, now) {
                return if lock.value == *token {
                    Begin::Acquired {
                        fencing_token: entry.fence.as_ref().map_or(0, |fence| fence.value),
                    }
                } else {
                    Begin::Busy {
                        lock_ttl_remaining: Some(lock.until.saturating_duration_since(now)),
                    }
                };
            }
            let last = live(&mut entry.fence, now).map_or(0, |fence| fence.value);
            let fencing_token = next_fencing_token(last, unix_millis());
            entry.lock = Some(Expiring::new(token.clone(), lock_ttl, now));
            entry.fence = Some(Expiring::new(
                fencing_token,
                lock_ttl.saturating_add(result_ttl),
                now,
            ));
            Begin::Acquired { fencing_token }
        }))
    }

    async fn finish(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        marker: &[u8],
        result_ttl: Duration,
    ) -> Result<Finish, StoreError> {
        Ok(self.with_entry(unit, |entry, now| {
            let ours = live(&mut entry.lock, now).is_some_and(|lock| lock.value == *token);
            if ours {
                entry.marker = Some(Expiring::new(Arc::from(marker), result_ttl, now));
                entry.lock = None;
                return Finish::Completed;
            }
            match live(&mut entry.marker, now) {
                Some(existing) if *existing.value == *marker => Finish::Completed,
                Some(_) => Finish::LockLost {
                    marker_written: false,
                },
                None => {
                    entry.marker = Some(Expiring::new(Arc::from(marker), result_ttl, now));
                    Finish::LockLost {
                        marker_written: true,
                    }
                }
            }
        }))
    }

    async fn release(&self, unit: &UnitOfWork, token: &LockToken) -> Result<bool, StoreError> {
        Ok(self.with_entry(unit, |entry, now| {
            let ours = live(&mut entry.lock, now).is_some_and(|lock| lock.value == *token);
            if ours {
                entry.lock = None;
            }
            ours
        }))
    }

    async fn renew(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        lock_ttl: Duration,
    ) -> Result<bool, StoreError> {
        Ok(
            self.with_entry(unit, |entry, now| match live(&mut entry.lock, now) {
                Some(lock) if lock.value == *token => {
                    lock.until = now + lock_ttl;
                    true
                }
                _ => false,
            }),
        )
    }

    async fn inspect(&self, unit: &UnitOfWork) -> Result<Inspection, StoreError> {
        Ok(self.with_entry(unit, |entry, now| {
            let marker = live(&mut entry.marker, now);
            Inspection {
                marker_ttl: marker
                    .as_ref()
                    .map(|marker| marker.until.saturating_duration_since(now)),
                marker: marker.map(|marker| marker.value.to_vec()),
                lock_ttl: live(&mut entry.lock, now)
                    .map(|lock| lock.until.saturating_duration_since(now)),
            }
        }))
    }

    async fn forget(&self, unit: &UnitOfWork) -> Result<bool, StoreError> {
        Ok(self.with_entry(unit, |entry, now| {
            let existed = live(&mut entry.marker, now).is_some();
            entry.marker = None;
            existed
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fencing_tokens_follow_the_clock_and_never_go_back() {
        assert_eq!(next_fencing_token(0, 1_000), 1_000);
        assert_eq!(next_fencing_token(1_000, 1_000), 1_001);
        assert_eq!(next_fencing_token(5_000, 1_000), 5_001);
        assert_eq!(next_fencing_token(u64::MAX, 1), u64::MAX);
    }

    #[tokio::test(start_paused = true)]
    async fn entries_expire_and_are_swept() {
        let store = MemoryStore::new();
        let unit = UnitOfWork::new("t", "k").unwrap();
        let token = LockToken::generate();
        let ttl = Duration::from_secs(1);
        store.begin(&unit, &token, ttl, ttl).await.unwrap();
        tokio::time::advance(Duration::from_secs(3)).await;
        let other = UnitOfWork::new("t", "other").unwrap();
        for _ in 0..SWEEP_EVERY {
            store.inspect(&other).await.unwrap();
        }
        let state = store.state.lock().unwrap();
        assert!(
            !state
                .units
                .keys()
                .any(|(_, digest)| &**digest == unit.digest()),
            "the expired unit is still held"
        );
    }
}
