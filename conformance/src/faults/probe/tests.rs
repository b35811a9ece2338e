//! The outcome oracle's bookkeeping of late writes.

use idempotask::MemoryStore;

use super::*;

const TTL: Duration = Duration::from_secs(30);

fn finish(token: &LockToken) -> Op {
    Op::Finish {
        token: token.clone(),
        marker: b"the call's result".to_vec(),
        result_ttl: TTL,
    }
}

/// Input: a store. Output: a probe whose call took the unit's lock and whose finish timed out,
/// left to apply after the next operation; the unit, and the call's lock token.
async fn a_finish_left_to_apply_late(store: &SharedStore) -> (Arc<Probe>, UnitOfWork, LockToken) {
    let unit = UnitOfWork::new("t", "k").unwrap();
    let token = LockToken::generate();
    let probe = Probe::new(
        Plan::Inject {
            at: 1,
            fault: Fault::AppliedLate,
        },
        TTL,
        Fencing::Off,
    );
    let begin = Op::Begin {
        token: token.clone(),
        lock_ttl: TTL,
        fencing: Fencing::Off,
    };
    IN_CALL
        .scope((), probe.perform(store, &unit, begin))
        .await
        .unwrap();
    let timed_out = IN_CALL
        .scope((), probe.perform(store, &unit, finish(&token)))
        .await;
    assert!(timed_out.is_err(), "{timed_out:?}");
    (probe, unit, token)
}

/// Input: the operation the call makes after its finish timed out and was left to apply
/// late, behind a renewal of its watchdog (a background operation: outside `IN_CALL`).
/// Output: whether the write counts as made before the call answered.
async fn written_before_the_answer(then: impl FnOnce(&LockToken) -> Op, by_the_call: bool) -> bool {
    let store = SharedStore::new(MemoryStore::new());
    let (probe, unit, token) = a_finish_left_to_apply_late(&store).await;
    let renew = Op::Renew {
        token: token.clone(),
        lock_ttl: TTL,
    };
    probe.perform(&store, &unit, renew).await.unwrap();
    let written = probe
        .written()
        .expect("the late finish applied behind the renewal");
    assert!(!written.before_the_answer, "{written:?}");
    let then = probe.perform(&store, &unit, then(&token));
    if by_the_call {
        IN_CALL.scope((), then).await.unwrap();
    } else {
        then.await.unwrap();
    }
    assert!(probe.violations().is_empty(), "{:?}", probe.violations());
    probe.written().unwrap().before_the_answer
}

#[tokio::test]
async fn a_late_write_counts_once_a_later_read_of_the_call_comes_after_it() {
    assert!(written_before_the_answer(finish, true).await);
    assert!(written_before_the_answer(|_| Op::Inspect, true).await);
}

#[tokio::test]
async fn a_late_write_that_no_read_of_the_call_saw_is_after_the_answer() {
    let renew = |token: &LockToken| Op::Renew {
        token: token.clone(),
        lock_ttl: TTL,
    };
    assert!(!written_before_the_answer(renew, true).await);
    // A read that is not the call's own (a background one) tells the call nothing.
    assert!(!written_before_the_answer(|_| Op::Inspect, false).await);
}

/// A memory store whose `finish`, once armed, applies and then waits for the test before it
/// answers: a caller can be dropped after the store applied the finish and before the harness
/// checked it.
#[derive(Debug, Clone)]
struct Gated {
    inner: MemoryStore,
    armed: Arc<std::sync::atomic::AtomicBool>,
    applied: Arc<tokio::sync::Notify>,
    answer: Arc<tokio::sync::Semaphore>,
}

impl Store for Gated {
    async fn begin(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        ttl: Duration,
        fencing: Fencing,
    ) -> Result<Begin, StoreError> {
        self.inner.begin(unit, token, ttl, fencing).await
    }

    async fn finish(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        marker: &[u8],
        ttl: Duration,
    ) -> Result<Finish, StoreError> {
        let finished = self.inner.finish(unit, token, marker, ttl).await;
        if self.armed.swap(false, std::sync::atomic::Ordering::SeqCst) {
            self.applied.notify_one();
            let _ = self.answer.acquire().await;
        }
        finished
    }

    async fn release(&self, unit: &UnitOfWork, token: &LockToken) -> Result<bool, StoreError> {
        self.inner.release(unit, token).await
    }

    async fn renew(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        self.inner.renew(unit, token, ttl).await
    }

    async fn inspect(&self, unit: &UnitOfWork) -> Result<Inspection, StoreError> {
        self.inner.inspect(unit).await
    }

    async fn forget(&self, unit: &UnitOfWork) -> Result<bool, StoreError> {
        self.inner.forget(unit).await
    }
}

/// The watchdog's renewal lets a late finish through, and the watchdog is aborted (its body
/// ended) after the store applied that finish and before the harness checked it: the write
/// is still seen, and the call's re-sent finish that finds it counts it before the answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_write_is_seen_when_the_operation_that_let_it_through_is_dropped() {
    let gated = Gated {
        inner: MemoryStore::new(),
        armed: Arc::default(),
        applied: Arc::default(),
        answer: Arc::new(tokio::sync::Semaphore::new(0)),
    };
    let store = SharedStore::new(gated.clone());
    let (probe, unit, token) = a_finish_left_to_apply_late(&store).await;
    gated.armed.store(true, std::sync::atomic::Ordering::SeqCst);
    let renewal = {
        let (probe, store, unit) = (Arc::clone(&probe), store.clone(), unit.clone());
        let renew = Op::Renew {
            token: token.clone(),
            lock_ttl: TTL,
        };
        tokio::spawn(async move { probe.perform(&store, &unit, renew).await })
    };
    gated.applied.notified().await;
    renewal.abort();
    assert!(renewal.await.unwrap_err().is_cancelled());
    gated.answer.add_permits(1);
    // The call's re-sent finish finds its marker; by then the late one was checked.
    IN_CALL
        .scope((), probe.perform(&store, &unit, finish(&token)))
        .await
        .unwrap();
    assert!(probe.violations().is_empty(), "{:?}", probe.violations());
    let written = probe.written().expect("the late finish's write was seen");
    assert!(written.before_the_answer, "{written:?}");
}
