//! [`MemoryStore`]: the store semantics in one process, with real expiry.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

use super::{Begin, Doubt, Fencing, Finish, Inspection, Journal, StepEntry, Store};
use crate::context::expiry;
use crate::error::StoreError;
use crate::marker::{Marker, lock_lost_marker};
use crate::unit::{LockToken, UnitOfWork};

mod expiring;
mod operator;
mod steps;

use expiring::Expiring;

use steps::{Steps, journal_of};

/// How many expired entries one operation sweeps at most: the work under the lock stays small
/// whatever the size of the store.
const SWEEP_BUDGET: usize = 64;

/// How many operations pass between checks whether the map should give memory back.
const SHRINK_EVERY: u64 = 4096;

/// A store that lives in this process's memory.
///
/// Same semantics as [`RedisStore`](https://docs.rs/idempotask-redis/latest/idempotask_redis/struct.RedisStore.html), including lock, marker and fencing
/// counter expiry (measured with `tokio::time`, so tests with a paused clock can advance it).
/// It is the embedded default for examples, tests and single-process programs; it protects
/// nothing across processes, and its markers are gone when the process exits.
///
/// # Behaviour
/// Operations never fail and never wait on I/O. Expired entries are dropped when touched, and
/// each operation sweeps a few of those whose expiry has passed (indexed by the second they
/// expire in, so the work is what expired, never a walk over the whole store); after many have
/// expired the map gives its memory back. Clones share the same data.
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

/// A unit by its task and full caller key (a `UnitOfWork` compares and hashes by them): a
/// shared handle, so finding and filing an entry allocates nothing.
type UnitId = UnitOfWork;

#[derive(Debug, Default)]
struct State {
    units: HashMap<UnitId, Expiring<Entry>>,
    /// The journals of units with steps, apart from their locks: a journal outlives a release
    /// and a lapsed lock, until the unit's result is recorded.
    journals: HashMap<UnitId, Expiring<Steps>>,
    /// When each entry expires, by whole second since `epoch`: a second's units are swept once
    /// it has passed, so expiry costs what expired, not what the store holds. An entry whose
    /// expiry moved is listed again under its new second; the old listing finds it alive and
    /// drops only itself.
    expiries: BTreeMap<u64, Vec<UnitId>>,
    epoch: Option<Instant>,
    operations: u64,
}

impl State {
    /// The second of `expiries` that `instant` falls in.
    fn second(&mut self, instant: Instant) -> u64 {
        let epoch = *self.epoch.get_or_insert(instant);
        instant.saturating_duration_since(epoch).as_secs()
    }

    /// Drops up to [`SWEEP_BUDGET`] entries of seconds that have passed.
    fn sweep(&mut self, now: Instant) {
        let current = self.second(now);
        let mut budget = SWEEP_BUDGET;
        while budget > 0 {
            let Some(mut listed) = self.expiries.first_entry() else {
                return;
            };
            if *listed.key() >= current {
                return;
            }
            while budget > 0 {
                let Some(id) = listed.get_mut().pop() else {
                    break;
                };
                budget -= 1;
                if self.units.get(&id).is_some_and(|entry| entry.until <= now) {
                    self.units.remove(&id);
                }
                if self
                    .journals
                    .get(&id)
                    .is_some_and(|steps| steps.until <= now)
                {
                    self.journals.remove(&id);
                }
            }
            if listed.get().is_empty() {
                listed.remove();
            }
        }
    }

    /// Gives memory back after many entries expired: a map never shrinks by itself.
    fn shrink_if_sparse(&mut self) {
        let (len, capacity) = (self.units.len(), self.units.capacity());
        if capacity > 1024 && capacity > 4 * len {
            self.units.shrink_to(2 * len);
            self.expiries.retain(|_, ids| !ids.is_empty());
        }
    }
}

/// What one unit holds: like the single Redis key of a unit, one of three states.
#[derive(Debug)]
enum Entry {
    /// Held by `token` until `lapses_at`; after that, until the entry's expiry (the token's
    /// doubt memory later), a lock that ran out without a release or a marker: in doubt.
    Locked {
        token: LockToken,
        fencing_token: Option<u64>,
        lapses_at: Instant,
        /// The doubt this lock took over, if it did: a repeated `begin` answers it again, and a
        /// release leaves the lock to run out instead of freeing the unit.
        took_over: Option<Box<Doubt>>,
    },
    Done(Arc<[u8]>),
    /// A released fenced lock, kept so that the next grant's fencing token is higher.
    Released {
        fencing_token: u64,
    },
}

impl Entry {
    /// A lock's state at `now`: how long it has left while held, or, once it ran out (and
    /// is still remembered), the doubt it leaves. Other entries have no lock: zero left.
    fn lock_state(&self, now: Instant) -> Result<Duration, Doubt> {
        match self {
            Self::Locked {
                fencing_token,
                lapses_at,
                ..
            } if now >= *lapses_at => Err(Doubt::new(
                *fencing_token,
                now.saturating_duration_since(*lapses_at),
            )),
            Self::Locked { lapses_at, .. } => Ok(lapses_at.saturating_duration_since(now)),
            Self::Done(_) | Self::Released { .. } => Ok(Duration::ZERO),
        }
    }
}

/// How long a released fenced lock keeps its counter: until the wall clock has passed it, plus a
/// margin, after which the clock alone keeps new tokens higher.
const RELEASED_FOR: Duration = Duration::from_secs(1);

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs `op` on the unit's live entry (`None` if absent or expired); `op` may replace it.
    fn with_entry<R>(
        &self,
        unit: &UnitOfWork,
        op: impl FnOnce(&mut Option<Expiring<Entry>>, Instant) -> R,
    ) -> R {
        self.with_unit(unit, |slot, _, now| op(slot, now))
    }

    /// Runs `op` on the unit's entry and its journal of steps (`None` for a unit without
    /// one), under the state's lock.
    fn with_unit<R>(
        &self,
        unit: &UnitOfWork,
        op: impl FnOnce(&mut Option<Expiring<Entry>>, &mut Option<Expiring<Steps>>, Instant) -> R,
    ) -> R {
        let now = Instant::now();
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.operations += 1;
        state.sweep(now);
        if state.operations.is_multiple_of(SHRINK_EVERY) {
            state.shrink_if_sparse();
        }
        // The full caller key, not the digest: in memory there is no reason to accept even a
        // detectable collision.
        let id: UnitId = unit.clone();
        let mut slot = state.units.remove(&id).filter(|entry| entry.until > now);
        // Most units have no steps: their calls skip the second map.
        let mut journal = if state.journals.is_empty() {
            None
        } else {
            state.journals.remove(&id).filter(|steps| steps.until > now)
        };
        let before = (
            slot.as_ref().map(|entry| entry.until),
            journal.as_ref().map(|steps| steps.until),
        );
        let answer = op(&mut slot, &mut journal, now);
        let after = (
            slot.as_ref().map(|entry| entry.until),
            journal.as_ref().map(|steps| steps.until),
        );
        for (before, after) in [(before.0, after.0), (before.1, after.1)] {
            if let Some(until) = after.filter(|until| before != Some(*until)) {
                let second = state.second(until);
                state.expiries.entry(second).or_default().push(id.clone());
            }
        }
        if let Some(steps) = journal {
            state.journals.insert(id.clone(), steps);
        }
        if let Some(entry) = slot {
            state.units.insert(id, entry);
        }
        answer
    }
}

static HIGHEST_FENCING_TOKEN: AtomicU64 = AtomicU64::new(0);

/// The next fencing token after `last` (the unit's kept counter): above every token granted
/// before in this process and never below the wall clock in microseconds, so tokens keep
/// increasing across releases, expiries and stores.
fn next_fencing_token(last: u64) -> u64 {
    let floor = last.max(unix_micros());
    let previous = HIGHEST_FENCING_TOKEN
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |highest| {
            Some(highest.max(floor).saturating_add(1))
        })
        .unwrap_or_else(|highest| highest);
    previous.max(floor).saturating_add(1)
}

fn unix_micros() -> u64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    u64::try_from(since.as_micros()).unwrap_or(u64::MAX)
}

/// What a released fenced lock, or a forgotten fenced marker, leaves: its counter, until the
/// clock has passed it.
fn released(fencing_token: u64, now: Instant) -> Expiring<Entry> {
    let ahead = fencing_token.saturating_sub(unix_micros());
    Expiring::new(
        Entry::Released { fencing_token },
        RELEASED_FOR + Duration::from_micros(ahead),
        now,
    )
}

/// `token`'s lock with `fencing_token`, held for `lock_ttl` from `now` and remembered for the
/// token's doubt memory after that; `took_over` is the doubt it took over, if it did.
fn locked(
    token: &LockToken,
    fencing_token: Option<u64>,
    lock_ttl: Duration,
    now: Instant,
    took_over: Option<Box<Doubt>>,
) -> Expiring<Entry> {
    let lapses_at = expiry(now, lock_ttl);
    Expiring {
        value: Entry::Locked {
            token: token.clone(),
            fencing_token,
            lapses_at,
            took_over,
        },
        until: expiry(lapses_at, token.doubt_memory()),
    }
}

fn holds(slot: Option<&Expiring<Entry>>, token: &LockToken) -> bool {
    matches!(
        slot,
        Some(Expiring { value: Entry::Locked { token: held, fencing_token, .. }, .. })
            if held.as_str() == token.as_str() && *fencing_token == token.fencing_token()
    )
}

/// Renews the caller's lock (`holds` said it is the caller's) to `lock_ttl` from `now`,
/// keeping the doubt it took over.
fn relock(slot: &mut Option<Expiring<Entry>>, token: &LockToken, lock_ttl: Duration, now: Instant) {
    let took_over = match slot.take() {
        Some(Expiring {
            value: Entry::Locked { took_over, .. },
            ..
        }) => took_over,
        _ => None,
    };
    *slot = Some(locked(
        token,
        token.fencing_token(),
        lock_ttl,
        now,
        took_over,
    ));
}

impl Store for MemoryStore {
    async fn begin(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        lock_ttl: Duration,
        fencing: Fencing,
    ) -> Result<Begin, StoreError> {
        let begin = self.with_entry(unit, |slot, now| {
            let last = match slot.as_ref() {
                Some(Expiring {
                    value: Entry::Done(marker),
                    ..
                }) => {
                    return Begin::Done(marker.to_vec());
                }
                Some(Expiring {
                    value:
                        Entry::Locked {
                            token: held,
                            fencing_token,
                            took_over,
                            ..
                        },
                    ..
                }) if held.as_str() == token.as_str() => {
                    return Begin::Acquired {
                        fencing_token: *fencing_token,
                        in_doubt: took_over.clone(),
                    };
                }
                Some(Expiring {
                    value: held @ Entry::Locked { fencing_token, .. },
                    ..
                }) => {
                    let doubt = match held.lock_state(now) {
                        Ok(left) => return Begin::busy(Some(left)),
                        Err(doubt) => doubt,
                    };
                    if !token.takes_over_doubt() {
                        return Begin::InDoubt(doubt);
                    }
                    let fencing_token = (fencing == Fencing::On || fencing_token.is_some())
                        .then(|| next_fencing_token(fencing_token.unwrap_or(0)));
                    let doubt = Box::new(doubt);
                    *slot = Some(locked(
                        token,
                        fencing_token,
                        lock_ttl,
                        now,
                        Some(doubt.clone()),
                    ));
                    return Begin::Acquired {
                        fencing_token,
                        in_doubt: Some(doubt),
                    };
                }
                Some(Expiring {
                    value: Entry::Released { fencing_token },
                    ..
                }) => *fencing_token,
                None => 0,
            };
            // Like Redis: a unit whose counter is still kept goes on counting even when this
            // task did not ask for fencing.
            let fencing_token =
                (fencing == Fencing::On || last > 0).then(|| next_fencing_token(last));
            *slot = Some(locked(token, fencing_token, lock_ttl, now, None));
            Begin::acquired(fencing_token)
        });
        Ok(begin)
    }

    async fn finish(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        marker: &[u8],
        result_ttl: Duration,
    ) -> Result<Finish, StoreError> {
        // Written after the lock expired, the marker says so.
        let lost_marker = || lock_lost_marker(marker).unwrap_or_else(|| marker.to_vec());
        Ok(self.with_unit(unit, |slot, journal, now| {
            let answer = match slot.as_ref() {
                _ if holds(slot.as_ref(), token) => Finish::Completed,
                // Markers name their delivery: this delivery's, so a repeated finish.
                Some(Expiring {
                    value: Entry::Done(existing),
                    ..
                }) => {
                    return if **existing == *marker {
                        Finish::Completed
                    } else if **existing == *lost_marker() {
                        Finish::lost_marker_written()
                    } else {
                        Finish::lost_nothing_written()
                    };
                }
                Some(Expiring {
                    value: Entry::Locked { .. },
                    ..
                }) => {
                    return Finish::LockLost {
                        marker_written: false,
                    };
                }
                Some(Expiring {
                    value: Entry::Released { .. },
                    ..
                })
                | None => Finish::LockLost {
                    marker_written: true,
                },
            };
            let stored: Arc<[u8]> = if answer == Finish::Completed {
                Arc::from(marker)
            } else {
                Arc::from(lost_marker())
            };
            *slot = Some(Expiring::new(Entry::Done(stored), result_ttl, now));
            // The result replaces the steps' results.
            *journal = None;
            answer
        }))
    }

    async fn release(&self, unit: &UnitOfWork, token: &LockToken) -> Result<bool, StoreError> {
        Ok(self.with_entry(unit, |slot, now| {
            // The holder's token alone, whatever fencing token the lock was granted with: a
            // caller whose grant's reply was lost never learned it.
            let Some(Expiring {
                value:
                    Entry::Locked {
                        token: held,
                        fencing_token,
                        took_over,
                        lapses_at,
                    },
                ..
            }) = slot.as_mut()
            else {
                return false;
            };
            if held.as_str() != token.as_str() {
                return false;
            }
            if took_over.is_some() && *lapses_at <= now {
                return true;
            }
            if took_over.is_some() {
                // Only a result ends a doubt: the lock runs out now (if it has not yet) and is
                // remembered.
                let (held, fencing_token, took_over) =
                    (held.clone(), *fencing_token, took_over.take());
                *slot = Some(locked(&held, fencing_token, Duration::ZERO, now, took_over));
                return true;
            }
            *slot = fencing_token.map(|fencing_token| released(fencing_token, now));
            true
        }))
    }

    async fn renew(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        lock_ttl: Duration,
    ) -> Result<bool, StoreError> {
        Ok(self.with_entry(unit, |slot, now| {
            if !holds(slot.as_ref(), token) {
                return false;
            }
            relock(slot, token, lock_ttl, now);
            true
        }))
    }

    async fn inspect(&self, unit: &UnitOfWork) -> Result<Inspection, StoreError> {
        let inspection = self.with_unit(unit, |slot, journal, now| {
            let found = match slot.as_ref() {
                Some(
                    done @ Expiring {
                        value: Entry::Done(marker),
                        ..
                    },
                ) => Inspection::done(marker.to_vec(), Some(done.left(now))),
                Some(Expiring {
                    value: locked @ Entry::Locked { .. },
                    ..
                }) => match locked.lock_state(now) {
                    Ok(left) => Inspection::locked(left),
                    Err(doubt) => Inspection::doubtful(doubt),
                },
                Some(Expiring {
                    value: Entry::Released { .. },
                    ..
                })
                | None => Inspection::default(),
            };
            found.with_journal(journal_of(journal.as_ref()))
        });
        Ok(inspection)
    }

    async fn forget(&self, unit: &UnitOfWork) -> Result<bool, StoreError> {
        Ok(self.with_unit(unit, |slot, journal, now| {
            let Some(Expiring {
                value: Entry::Done(marker),
                ..
            }) = slot.as_ref()
            else {
                // A unit still running keeps its steps, as on every store.
                return false;
            };
            // Forgotten on purpose, the unit runs again from its first step.
            *journal = None;
            let fencing_token = Marker::decode(marker)
                .ok()
                .and_then(|marker| marker.fencing_token());
            *slot = fencing_token.map(|fencing_token| released(fencing_token, now));
            true
        }))
    }

    fn records_steps(&self) -> bool {
        true
    }

    async fn read_journal(&self, unit: &UnitOfWork) -> Result<Journal, StoreError> {
        Ok(self.with_unit(unit, |_, journal, _| journal_of(journal.as_ref())))
    }

    async fn record_step(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        entry: StepEntry<'_>,
        lock_ttl: Duration,
    ) -> Result<bool, StoreError> {
        Ok(self.with_unit(unit, |slot, journal, now| {
            if !holds(slot.as_ref(), token) {
                return false;
            }
            let recorded = steps::append(journal, entry, now);
            if recorded {
                relock(slot, token, lock_ttl, now);
            }
            recorded
        }))
    }
}

#[cfg(test)]
mod tests;
