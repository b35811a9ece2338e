//! [`BatchingStore`]: a store whose concurrent `begin`s and `finish`es go to the store it wraps
//! as batches, one round trip for as many calls as arrived together.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{oneshot, watch};

use super::{Begin, Claim, Completion, Fencing, Finish, Inspection, Store};
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
/// through, except that a `release` waits for a batched `begin` it may overtake.
///
/// What it costs: a call may wait for the batch in flight before its own is sent, at most one
/// round trip; a lock's lease is counted from the moment the call was made, so that wait only
/// shortens the lease the caller counts, never lengthens it. It pays where the wrapped store
/// batches (`RedisStore`: one pipeline) and many calls are in flight; with one call at a time
/// it adds a spawned task per call.
///
/// A call dropped while it waits is left out of the next batch; one dropped after its batch
/// was sent is in flight, as a dropped single call's command is, and the runner's release of
/// it waits until that batch's answer is in, so that it cannot reach the store first.
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
    /// How many begin batches were taken from the queue, and how many came back: a release
    /// waits until every batch taken before it came back.
    begins_sent: watch::Sender<(u64, u64)>,
}

/// One kind of call waiting to be sent, and whether a flusher is sending them.
struct Lane<R> {
    state: Mutex<LaneState<R>>,
}

struct LaneState<R> {
    waiting: Vec<R>,
    flushing: bool,
}

impl<R> Lane<R> {
    fn new() -> Self {
        Self {
            state: Mutex::new(LaneState {
                waiting: Vec::new(),
                flushing: false,
            }),
        }
    }

    /// Queues `request`; answers whether the caller must start a flusher (none is running).
    fn push(&self, request: R) -> bool {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.waiting.push(request);
        !std::mem::replace(&mut state.flushing, true)
    }

    /// Up to [`MAX_BATCH`] waiting requests, oldest first; none (and the flusher stops) when
    /// nothing waits.
    fn take(&self) -> Vec<R> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.waiting.is_empty() {
            state.flushing = false;
            return Vec::new();
        }
        let len = state.waiting.len().min(MAX_BATCH);
        state.waiting.drain(..len).collect()
    }

    /// After a flusher's panic: answers whether a new flusher must take over the requests
    /// that arrived meanwhile (they still wait), else marks the lane idle.
    fn restart(&self) -> bool {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.flushing = !state.waiting.is_empty();
        state.flushing
    }
}

/// Settles a lane when its flusher unwinds (the wrapped store panicked): the batch it carried
/// is lost (its callers hear so as their answers are dropped), a release waiting for it goes
/// on, and the calls that arrived meanwhile get a new flusher instead of waiting forever.
struct Unwinding<S: Store> {
    shared: Arc<Shared<S>>,
    begins: bool,
}

impl<S: Store> Drop for Unwinding<S> {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        let shared = Arc::clone(&self.shared);
        if self.begins {
            shared.begins_sent.send_modify(|(sent, back)| *back = *sent);
            if shared.begins.restart() {
                tokio::spawn(shared.flush_begins());
            }
        } else if shared.finishes.restart() {
            tokio::spawn(shared.flush_finishes());
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
                begins_sent: watch::channel((0, 0)).0,
            }),
        }
    }

    /// The store it sends the batches to.
    pub fn inner(&self) -> &S {
        &self.shared.store
    }
}

impl<S: Store> Shared<S> {
    /// Sends the waiting begins, batch after batch, until none waits.
    async fn flush_begins(self: Arc<Self>) {
        let _unwinding = Unwinding {
            shared: Arc::clone(&self),
            begins: true,
        };
        loop {
            let taken = self.begins.take();
            if taken.is_empty() {
                return;
            }
            self.begins_sent.send_modify(|(sent, _)| *sent += 1);
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
                let answers = self.store.begin_batch(&claims, lock_ttl, fencing).await;
                drop(claims);
                answer_each(group, answers, "begin", |request| request.answer);
            }
            self.begins_sent.send_modify(|(_, back)| *back += 1);
        }
    }

    /// Sends the waiting finishes, batch after batch, until none waits. A finish is sent even
    /// when its caller gave up: the body ran, so its result is recorded (the runner records a
    /// dropped call's result in the background the same way).
    async fn flush_finishes(self: Arc<Self>) {
        let _unwinding = Unwinding {
            shared: Arc::clone(&self),
            begins: false,
        };
        loop {
            let mut requests = self.finishes.take();
            if requests.is_empty() {
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
                let answers = self.store.finish_batch(&completions, result_ttl).await;
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

/// The answer of a call whose batch was lost with its flusher (a panic in the wrapped store):
/// it may have been applied.
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
            tokio::spawn(Arc::clone(&self.shared).flush_begins());
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
            tokio::spawn(Arc::clone(&self.shared).flush_finishes());
        }
        answered.await.unwrap_or_else(|_| Err(lost("finish")))
    }

    async fn release(&self, unit: &UnitOfWork, token: &LockToken) -> Result<bool, StoreError> {
        // A begin of this lock's may be in a batch sent before this release was asked for:
        // the release waits for every such batch to come back, so that it cannot reach the
        // store before the lock it releases.
        let mut sent = self.shared.begins_sent.subscribe();
        let target = sent.borrow().0;
        // The sender lives as long as `self`: `wait_for` cannot fail while it is borrowed.
        let _ = sent.wait_for(|(_, back)| *back >= target).await;
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
