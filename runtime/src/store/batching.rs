//! [`BatchingStore`]: a store whose concurrent `begin`s and `finish`es go to the store it wraps
//! as batches, one round trip for as many calls as arrived together.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{oneshot, watch};

use super::{Begin, Claim, Completion, Fencing, Finish, Inspection, Journal, StepEntry, Store};
use crate::error::{StoreError, StoreErrorKind};
use crate::unit::{LockToken, UnitOfWork};

/// The most units one batch carries; more calls waiting go in the next one.
const MAX_BATCH: usize = 256;

/// A store that sends the `begin`s and `finish`es its callers make at the same time to the
/// store it wraps as one [`begin_batch`](Store::begin_batch) or
/// [`finish_batch`](Store::finish_batch) each: group commit, as a database does it.
///
/// A call that finds no batch of its kind in flight is sent at once, as a batch of one; the
/// calls that arrive while a batch is in flight wait for it to come back and then go together,
/// so a queue consumer handling 64 messages of one fetch pays a handful of round trips instead
/// of 128, with no timer and no added wait when the store is idle. Each call gets its own
/// answer, exactly the one its unit's single call would have had (the wrapped store's
/// `begin_batch` promises that). `release`, `renew`, `inspect` and `forget` go straight
/// through, except that a `release` waits for a batched `begin` of its unit that it could
/// overtake. It needs a tokio runtime, as the runner does.
///
/// What it costs: one batch of each kind is in flight at a time, so a call may wait for the
/// batch in flight before its own is sent, and a batch's answers come back together, when its
/// slowest unit is answered (a `PTTL` for another holder's lock, a row-lock wait). A lock's
/// lease is counted from the moment the call was made, so waiting only shortens the lease the
/// caller counts, never lengthens it; a grant that comes back with less than the runner's
/// floor left is released and the body does not run. Use it over a store that batches
/// natively (`RedisStore`: one pipeline; `PostgresStore`: one statement and one commit, and
/// which groups its own calls this way by default) with many calls in flight; over a store that answers a batch one unit at a time (the trait's
/// default: `MemoryStore`, `RedisClusterStore`, `RedlockStore`) it would only put every call
/// behind the others.
///
/// A call dropped while it waits is left out of the next batch; one dropped after its batch
/// was sent is in flight, as a dropped single call's command is, and the runner's release of
/// it waits until that batch's answer is in, so that it cannot reach the store first (a
/// release of a unit in no batch in flight goes at once). A batch lost with its sender (the
/// wrapped store panicked, the runtime shut down) answers each of its calls an ambiguous
/// error, and the next calls get a new sender.
///
/// ```
/// use idempotask::store::BatchingStore;
/// use idempotask::{MemoryStore, Task};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idempotask::Error> {
/// let store = BatchingStore::new(MemoryStore::new());
/// let task = Task::new("charge");
/// let first: u8 = task.call("order-1").store(store.clone()).run(async { Ok::<_, idempotask::Error>(1) }).await?;
/// let again: u8 = task.call("order-1").store(store).run(async { Ok::<_, idempotask::Error>(2) }).await?;
/// assert_eq!((first, again), (1, 1));
/// # Ok(()) }
/// ```
pub struct BatchingStore<S> {
    shared: Arc<Shared<S>>,
}

impl<S> Clone for BatchingStore<S> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S: fmt::Debug> fmt::Debug for BatchingStore<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("BatchingStore")
            .field(&self.shared.store)
            .finish()
    }
}

struct Shared<S> {
    store: S,
    begins: Lane<BeginRequest>,
    finishes: Lane<FinishRequest>,
    /// The number of the last begin batch that came back (or was lost): a release whose unit
    /// is in a batch in flight waits until that batch's number is reached.
    begins_back: watch::Sender<u64>,
}

/// One kind of call waiting to be sent, and whether a flusher is sending them.
struct Lane<R> {
    state: Mutex<LaneState<R>>,
}

struct LaneState<R> {
    waiting: Vec<R>,
    flushing: bool,
    /// How many batches were taken from this lane.
    taken: u64,
    /// For begins: the units of the batches in flight, each with its batch's number. A list,
    /// not a map: every call adds to it and only a `release` looks a unit up, so hashing each
    /// unit on its way in would cost every message what only a release needs.
    in_flight: Vec<(UnitOfWork, u64)>,
}

impl<R> Lane<R> {
    fn new() -> Self {
        Self {
            state: Mutex::new(LaneState {
                waiting: Vec::new(),
                flushing: false,
                taken: 0,
                in_flight: Vec::new(),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LaneState<R>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `request`; answers whether the caller must start a flusher (none is running).
    fn push(&self, request: R) -> bool {
        let mut state = self.lock();
        state.waiting.push(request);
        !std::mem::replace(&mut state.flushing, true)
    }

    /// Up to [`MAX_BATCH`] waiting requests, oldest first, and the batch's number, with the
    /// units `unit_of` names marked in flight; none (and the flusher stops) when nothing waits.
    fn take(&self, unit_of: impl Fn(&R) -> Option<&UnitOfWork>) -> (Vec<R>, u64) {
        let mut state = self.lock();
        if state.waiting.is_empty() {
            state.flushing = false;
            return (Vec::new(), state.taken);
        }
        let len = state.waiting.len().min(MAX_BATCH);
        let taken: Vec<R> = state.waiting.drain(..len).collect();
        state.taken += 1;
        let number = state.taken;
        for request in &taken {
            if let Some(unit) = unit_of(request) {
                state.in_flight.push((unit.clone(), number));
            }
        }
        (taken, number)
    }

    /// The batch `number` came back: its units are no longer in flight.
    fn back(&self, number: u64) {
        self.lock().in_flight.retain(|(_, batch)| *batch != number);
    }

    /// The number of the batch in flight that carries `unit`, if any.
    fn carrying(&self, unit: &UnitOfWork) -> Option<u64> {
        self.lock()
            .in_flight
            .iter()
            .find_map(|(carried, batch)| (carried == unit).then_some(*batch))
    }

    /// After a flusher ended before its work was done: nothing is in flight any more, and
    /// answers whether a new flusher must take over the requests still waiting (`restart`),
    /// else drops them (their callers hear that their batch was lost) and marks the lane idle.
    /// Also answers the number of the last batch taken, which counts as back now.
    fn settle(&self, restart: bool) -> (bool, u64) {
        let mut state = self.lock();
        state.in_flight.clear();
        if restart && !state.waiting.is_empty() {
            return (true, state.taken);
        }
        state.waiting.clear();
        state.flushing = false;
        (false, state.taken)
    }
}

/// Owned by a flusher from the moment it is spawned, so that a flusher that ends before its
/// work is done (the wrapped store panicked, or its runtime shut down, even before its first
/// poll) leaves no caller waiting forever: the batch it carried is lost (its callers' answers
/// are dropped, and they hear so), a release waiting for that batch goes on, and the calls
/// that arrived meanwhile get a new flusher after a panic, or are failed when the runtime is
/// going away.
struct Flusher<S: Store> {
    shared: Arc<Shared<S>>,
    begins: bool,
    done: bool,
}

impl<S: Store> Flusher<S> {
    /// Spawns the flusher of the begins (`begins`) or of the finishes.
    fn spawn(shared: Arc<Shared<S>>, begins: bool) {
        let flusher = Self {
            shared,
            begins,
            done: false,
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                if begins {
                    runtime.spawn(flusher.flush_begins());
                } else {
                    runtime.spawn(flusher.flush_finishes());
                }
            }
            // Dropped undone: its lane's callers hear their batch was lost.
            Err(_) => drop(flusher),
        }
    }
}

impl<S: Store> Drop for Flusher<S> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        // A panic in the wrapped store leaves the runtime running: the calls that arrived
        // meanwhile get a new flusher. A flusher dropped undone otherwise is a runtime going
        // away, where a new one would be dropped as well.
        let restart = std::thread::panicking() && tokio::runtime::Handle::try_current().is_ok();
        let shared = Arc::clone(&self.shared);
        if self.begins {
            let (restart, taken) = shared.begins.settle(restart);
            shared
                .begins_back
                .send_modify(|back| *back = (*back).max(taken));
            if restart {
                Self::spawn(shared, true);
            }
        } else if shared.finishes.settle(restart).0 {
            Self::spawn(shared, false);
        }
    }
}

struct BeginRequest {
    unit: UnitOfWork,
    token: LockToken,
    lock_ttl: Duration,
    fencing: Fencing,
    answer: oneshot::Sender<Result<Begin, StoreError>>,
}

struct FinishRequest {
    unit: UnitOfWork,
    token: LockToken,
    marker: Vec<u8>,
    result_ttl: Duration,
    answer: oneshot::Sender<Result<Finish, StoreError>>,
}

impl<S: Store> BatchingStore<S> {
    /// Batches the concurrent `begin`s and `finish`es made through it to `store`.
    pub fn new(store: S) -> Self {
        Self {
            shared: Arc::new(Shared {
                store,
                begins: Lane::new(),
                finishes: Lane::new(),
                begins_back: watch::channel(0).0,
            }),
        }
    }

    /// The store it sends the batches to.
    pub fn inner(&self) -> &S {
        &self.shared.store
    }

    /// Waits until the batch in flight that carries a `begin` of `unit`, if any, has come
    /// back; at once when none does. Its [`release`](Store::release) waits so before it goes
    /// to the wrapped store, so that it cannot reach the store before the lock it releases; a
    /// store that batches its own calls through a `BatchingStore` and releases them itself
    /// waits the same way.
    ///
    /// ```
    /// use idempotask::store::{BatchingStore, UnitOfWork};
    /// use idempotask::MemoryStore;
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let store = BatchingStore::new(MemoryStore::new());
    /// // No begin of this unit is in flight: answers at once.
    /// store.begun(&UnitOfWork::new("charge", "order-1").unwrap()).await;
    /// # }
    /// ```
    pub async fn begun(&self, unit: &UnitOfWork) {
        // Only the batch that carries this unit: a release of a unit in no batch goes at once.
        if let Some(number) = self.shared.begins.carrying(unit) {
            let mut back = self.shared.begins_back.subscribe();
            // The sender lives as long as `self`: `wait_for` cannot fail while it is borrowed.
            let _ = back.wait_for(|back| *back >= number).await;
        }
    }
}

impl<S: Store> Flusher<S> {
    /// Sends the waiting begins, batch after batch, until none waits.
    async fn flush_begins(mut self) {
        loop {
            let (taken, number) = self.shared.begins.take(|request| Some(&request.unit));
            if taken.is_empty() {
                self.done = true;
                return;
            }
            // A caller that gave up before its request was sent is left out.
            let mut requests: Vec<BeginRequest> = taken
                .into_iter()
                .filter(|request| !request.answer.is_closed())
                .collect();
            // One batch per lock TTL and fencing: a batch shares them.
            while !requests.is_empty() {
                let (lock_ttl, fencing) = (requests[0].lock_ttl, requests[0].fencing);
                let (group, rest): (Vec<_>, Vec<_>) = requests.into_iter().partition(|request| {
                    request.lock_ttl == lock_ttl && request.fencing == fencing
                });
                requests = rest;
                let claims: Vec<Claim<'_>> = group
                    .iter()
                    .map(|request| Claim::new(&request.unit, &request.token))
                    .collect();
                let answers = self
                    .shared
                    .store
                    .begin_batch(&claims, lock_ttl, fencing)
                    .await;
                drop(claims);
                answer_each(group, answers, "begin", |request| request.answer);
            }
            self.shared.begins.back(number);
            self.shared
                .begins_back
                .send_modify(|back| *back = (*back).max(number));
        }
    }

    /// Sends the waiting finishes, batch after batch, until none waits. A finish is sent even
    /// when its caller gave up: the body ran, so its result is recorded (the runner records a
    /// dropped call's result in the background the same way).
    async fn flush_finishes(mut self) {
        loop {
            let (mut requests, _) = self.shared.finishes.take(|_| None);
            if requests.is_empty() {
                self.done = true;
                return;
            }
            while !requests.is_empty() {
                let result_ttl = requests[0].result_ttl;
                let (group, rest): (Vec<_>, Vec<_>) = requests
                    .into_iter()
                    .partition(|request| request.result_ttl == result_ttl);
                requests = rest;
                let completions: Vec<Completion<'_>> = group
                    .iter()
                    .map(|request| Completion::new(&request.unit, &request.token, &request.marker))
                    .collect();
                let answers = self
                    .shared
                    .store
                    .finish_batch(&completions, result_ttl)
                    .await;
                drop(completions);
                answer_each(group, answers, "finish", |request| request.answer);
            }
        }
    }
}

/// Hands each request its answer; a store that answered fewer than it was asked fails the
/// rest closed, as ambiguous (the batch may have applied them).
fn answer_each<R, T>(
    requests: Vec<R>,
    answers: Vec<Result<T, StoreError>>,
    operation: &'static str,
    sender: impl Fn(R) -> oneshot::Sender<Result<T, StoreError>>,
) {
    let mut answers = answers.into_iter();
    for request in requests {
        let answer = answers.next().unwrap_or_else(|| {
            Err(StoreError::ambiguous(
                operation,
                StoreErrorKind::Protocol,
                "the store's batch answered fewer units than it was given",
            ))
        });
        // A caller that gave up meanwhile no longer listens.
        let _ = sender(request).send(answer);
    }
}

/// The answer of a call whose batch was lost with its flusher (a panic in the wrapped store, a
/// runtime shutting down): it may have been applied.
fn lost(operation: &'static str) -> StoreError {
    StoreError::ambiguous(
        operation,
        StoreErrorKind::Unreachable,
        "the batch that carried this call was lost before it answered",
    )
}

impl<S: Store> Store for BatchingStore<S> {
    fn max_key_len(&self) -> usize {
        self.shared.store.max_key_len()
    }

    async fn begin(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        lock_ttl: Duration,
        fencing: Fencing,
    ) -> Result<Begin, StoreError> {
        let (answer, answered) = oneshot::channel();
        let request = BeginRequest {
            unit: unit.clone(),
            token: token.clone(),
            lock_ttl,
            fencing,
            answer,
        };
        if self.shared.begins.push(request) {
            Flusher::spawn(Arc::clone(&self.shared), true);
        }
        answered.await.unwrap_or_else(|_| Err(lost("begin")))
    }

    async fn finish(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        marker: &[u8],
        result_ttl: Duration,
    ) -> Result<Finish, StoreError> {
        let (answer, answered) = oneshot::channel();
        let request = FinishRequest {
            unit: unit.clone(),
            token: token.clone(),
            marker: marker.to_vec(),
            result_ttl,
            answer,
        };
        if self.shared.finishes.push(request) {
            Flusher::spawn(Arc::clone(&self.shared), false);
        }
        answered.await.unwrap_or_else(|_| Err(lost("finish")))
    }

    async fn release(&self, unit: &UnitOfWork, token: &LockToken) -> Result<bool, StoreError> {
        self.begun(unit).await;
        self.shared.store.release(unit, token).await
    }

    async fn renew(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        lock_ttl: Duration,
    ) -> Result<bool, StoreError> {
        self.shared.store.renew(unit, token, lock_ttl).await
    }

    async fn inspect(&self, unit: &UnitOfWork) -> Result<Inspection, StoreError> {
        self.shared.store.inspect(unit).await
    }

    async fn forget(&self, unit: &UnitOfWork) -> Result<bool, StoreError> {
        self.shared.store.forget(unit).await
    }

    fn records_steps(&self) -> bool {
        self.shared.store.records_steps()
    }

    async fn read_journal(&self, unit: &UnitOfWork) -> Result<Journal, StoreError> {
        self.shared.store.read_journal(unit).await
    }

    async fn record_step(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        entry: StepEntry<'_>,
        lock_ttl: Duration,
    ) -> Result<bool, StoreError> {
        self.shared
            .store
            .record_step(unit, token, entry, lock_ttl)
            .await
    }

    async fn begin_batch(
        &self,
        claims: &[Claim<'_>],
        lock_ttl: Duration,
        fencing: Fencing,
    ) -> Vec<Result<Begin, StoreError>> {
        self.shared
            .store
            .begin_batch(claims, lock_ttl, fencing)
            .await
    }

    async fn finish_batch(
        &self,
        completions: &[Completion<'_>],
        result_ttl: Duration,
    ) -> Vec<Result<Finish, StoreError>> {
        self.shared
            .store
            .finish_batch(completions, result_ttl)
            .await
    }
}

#[cfg(test)]
mod tests;
