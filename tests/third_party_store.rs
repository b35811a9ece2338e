//! A store written outside the runtime, as a third-party crate would write one: plain `async fn`s,
//! no `async-trait`, only idempotask's public API. It passes the shipped conformance suite.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idempotask::operator::Marker;
use idempotask::store::{Begin, Fencing, Finish, Inspection, Store};
use idempotask::store::{LockToken, StoreError, UnitOfWork};
use tokio::time::Instant;

/// What one unit holds, with its expiry.
#[derive(Debug, Clone)]
enum State {
    Locked {
        token: LockToken,
        until: Instant,
    },
    Done {
        marker: Vec<u8>,
        /// Written after its delivery's lock expired: a repeated finish says so again.
        late: bool,
        until: Instant,
    },
    /// A released fenced lock's counter.
    Counter {
        fence: u64,
        until: Instant,
    },
}

impl State {
    fn until(&self) -> Instant {
        match self {
            Self::Locked { until, .. } | Self::Done { until, .. } | Self::Counter { until, .. } => {
                *until
            }
        }
    }
}

/// A `HashMap` behind a mutex, keyed by task and plain key, and the highest fencing token the
/// store granted: units' counters expire, and tokens must still never go back.
#[derive(Debug, Clone, Default)]
struct MapStore(Arc<Mutex<HashMap<(String, String), State>>>, Arc<AtomicU64>);

impl MapStore {
    fn with<R>(&self, unit: &UnitOfWork, op: impl FnOnce(&mut Option<State>, Instant) -> R) -> R {
        let now = Instant::now();
        let mut map = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let id = (unit.task().to_owned(), unit.key().to_owned());
        let mut slot = map.remove(&id).filter(|state| state.until() > now);
        let answer = op(&mut slot, now);
        if let Some(state) = slot {
            map.insert(id, state);
        }
        answer
    }
}

fn clock_us() -> u64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    u64::try_from(since.as_micros()).unwrap_or(u64::MAX)
}

fn counter(fence: u64, now: Instant) -> State {
    let ahead = fence.saturating_sub(clock_us());
    State::Counter {
        fence,
        until: now + Duration::from_micros(ahead) + Duration::from_secs(1),
    }
}

fn holds(slot: Option<&State>, token: &LockToken) -> bool {
    matches!(slot, Some(State::Locked { token: held, .. }) if held == token)
}

impl Store for MapStore {
    async fn begin(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        lock_ttl: Duration,
        fencing: Fencing,
    ) -> Result<Begin, StoreError> {
        Ok(self.with(unit, |slot, now| {
            let last = match slot.as_ref() {
                Some(State::Done { marker, .. }) => return Begin::Done(marker.clone()),
                Some(State::Locked { token: held, .. }) if held.as_str() == token.as_str() => {
                    return Begin::acquired(held.fencing_token());
                }
                Some(State::Locked { until, .. }) => {
                    return Begin::busy(Some(until.saturating_duration_since(now)));
                }
                Some(State::Counter { fence, .. }) => Some(*fence),
                None => None,
            };
            let fence = (fencing == Fencing::On || last.is_some()).then(|| {
                let floor = last
                    .unwrap_or(0)
                    .max(clock_us())
                    .max(self.1.load(Ordering::Acquire));
                let fence = floor.saturating_add(1);
                self.1.fetch_max(fence, Ordering::AcqRel);
                fence
            });
            let granted = match fence {
                Some(fence) => token.clone().with_fencing_token(fence),
                None => token.clone(),
            };
            *slot = Some(State::Locked {
                token: granted,
                until: now + lock_ttl,
            });
            Begin::acquired(fence)
        }))
    }

    async fn finish(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        marker: &[u8],
        result_ttl: Duration,
    ) -> Result<Finish, StoreError> {
        Ok(self.with(unit, |slot, now| {
            let answer = match slot.as_ref() {
                _ if holds(slot.as_ref(), token) => Finish::Completed,
                Some(State::Done {
                    marker: stored,
                    late,
                    ..
                }) if stored == marker => {
                    return if *late {
                        Finish::lost_marker_written()
                    } else {
                        Finish::Completed
                    };
                }
                Some(State::Done { .. } | State::Locked { .. }) => {
                    return Finish::lost_nothing_written();
                }
                Some(State::Counter { .. }) | None => Finish::lost_marker_written(),
            };
            *slot = Some(State::Done {
                marker: marker.to_vec(),
                late: answer != Finish::Completed,
                until: now + result_ttl,
            });
            answer
        }))
    }

    async fn release(&self, unit: &UnitOfWork, token: &LockToken) -> Result<bool, StoreError> {
        Ok(self.with(unit, |slot, now| {
            // The token alone: the fencing token may not be known to a caller whose grant's
            // reply was lost.
            let Some(State::Locked { token: held, .. }) = slot.as_ref() else {
                return false;
            };
            if held.as_str() != token.as_str() {
                return false;
            }
            *slot = held.fencing_token().map(|fence| counter(fence, now));
            true
        }))
    }

    async fn renew(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        lock_ttl: Duration,
    ) -> Result<bool, StoreError> {
        Ok(self.with(unit, |slot, now| {
            let held = holds(slot.as_ref(), token);
            if let (true, Some(State::Locked { until, .. })) = (held, slot.as_mut()) {
                *until = now + lock_ttl;
            }
            held
        }))
    }

    async fn inspect(&self, unit: &UnitOfWork) -> Result<Inspection, StoreError> {
        Ok(self.with(unit, |slot, now| match slot.as_ref() {
            Some(State::Done { marker, until, .. }) => {
                Inspection::done(marker.clone(), Some(until.saturating_duration_since(now)))
            }
            Some(State::Locked { until, .. }) => {
                Inspection::locked(until.saturating_duration_since(now))
            }
            Some(State::Counter { .. }) | None => Inspection::empty(),
        }))
    }

    async fn forget(&self, unit: &UnitOfWork) -> Result<bool, StoreError> {
        Ok(self.with(unit, |slot, now| {
            let Some(State::Done { marker, .. }) = slot.as_ref() else {
                return false;
            };
            let fence = Marker::decode(marker).ok().and_then(|m| m.fencing_token());
            *slot = fence.map(|fence| counter(fence, now));
            true
        }))
    }
}

idempotask_conformance::conformance_tests!(((), MapStore::default()));
