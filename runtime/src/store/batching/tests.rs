use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use super::*;
use crate::MemoryStore;

const TTL: Duration = Duration::from_secs(30);

/// A `MemoryStore` that records the batches it is sent, holds each batch of begins until the
/// test lets it go (when gated), and panics on a batch when told to.
#[derive(Debug, Default)]
struct Recording {
    store: MemoryStore,
    begin_batches: Mutex<Vec<usize>>,
    finish_batches: Mutex<Vec<usize>>,
    releases: AtomicUsize,
    gate: Option<Arc<Semaphore>>,
    /// Signalled when a batch of begins has reached the store.
    arrived: Arc<tokio::sync::Notify>,
    panic_next: AtomicBool,
}

impl Recording {
    fn gated() -> (Self, Arc<Semaphore>) {
        let gate = Arc::new(Semaphore::new(0));
        let store = Self {
            gate: Some(Arc::clone(&gate)),
            ..Self::default()
        };
        (store, gate)
    }

    fn begin_batches(&self) -> Vec<usize> {
        self.begin_batches.lock().unwrap().clone()
    }
}

impl Store for Recording {
    async fn begin(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        lock_ttl: Duration,
        fencing: Fencing,
    ) -> Result<Begin, StoreError> {
        self.store.begin(unit, token, lock_ttl, fencing).await
    }
    async fn finish(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        marker: &[u8],
        result_ttl: Duration,
    ) -> Result<Finish, StoreError> {
        self.store.finish(unit, token, marker, result_ttl).await
    }
    async fn release(&self, unit: &UnitOfWork, token: &LockToken) -> Result<bool, StoreError> {
        self.releases.fetch_add(1, Ordering::SeqCst);
        self.store.release(unit, token).await
    }
    async fn renew(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        lock_ttl: Duration,
    ) -> Result<bool, StoreError> {
        self.store.renew(unit, token, lock_ttl).await
    }
    async fn inspect(&self, unit: &UnitOfWork) -> Result<Inspection, StoreError> {
        self.store.inspect(unit).await
    }
    async fn forget(&self, unit: &UnitOfWork) -> Result<bool, StoreError> {
        self.store.forget(unit).await
    }
    async fn begin_batch(
        &self,
        claims: &[Claim<'_>],
        lock_ttl: Duration,
        fencing: Fencing,
    ) -> Vec<Result<Begin, StoreError>> {
        self.begin_batches.lock().unwrap().push(claims.len());
        self.arrived.notify_one();
        assert!(
            !self.panic_next.swap(false, Ordering::SeqCst),
            "the store panicked, as the test asked"
        );
        if let Some(gate) = &self.gate {
            gate.acquire().await.unwrap().forget();
        }
        self.store.begin_batch(claims, lock_ttl, fencing).await
    }
    async fn finish_batch(
        &self,
        completions: &[Completion<'_>],
        result_ttl: Duration,
    ) -> Vec<Result<Finish, StoreError>> {
        self.finish_batches.lock().unwrap().push(completions.len());
        self.store.finish_batch(completions, result_ttl).await
    }
}

fn unit(key: &str) -> UnitOfWork {
    UnitOfWork::new("batching", key).unwrap()
}

fn marker(unit: &UnitOfWork) -> Vec<u8> {
    let key = unit.key();
    format!(r#"D{}|{key}|"done""#, key.len()).into_bytes()
}

#[tokio::test(flavor = "current_thread")]
async fn calls_made_together_go_as_one_batch_and_each_gets_its_own_answer() {
    let store = BatchingStore::new(Recording::default());
    let mut calls = JoinSet::new();
    for i in 0..11 {
        let store = store.clone();
        calls.spawn(async move {
            let unit = unit(&format!("together-{i}"));
            let token = LockToken::generate();
            let begun = store.begin(&unit, &token, TTL, Fencing::Off).await;
            let finished = store.finish(&unit, &token, &marker(&unit), TTL).await;
            (unit, begun, finished)
        });
    }
    while let Some(call) = calls.join_next().await {
        let (unit, begun, finished) = call.unwrap();
        assert!(matches!(begun, Ok(Begin::Acquired { .. })), "{begun:?}");
        assert_eq!(finished.unwrap(), Finish::Completed);
        let seen = store.inspect(&unit).await.unwrap();
        assert_eq!(seen.marker, Some(marker(&unit)));
    }
    // Every call pushed its begin before the flusher (spawned by the first) ran.
    assert_eq!(store.inner().begin_batches(), [11]);
    assert_eq!(*store.inner().finish_batches.lock().unwrap(), [11]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_that_arrive_while_a_batch_is_in_flight_go_in_the_next() {
    let (recording, gate) = Recording::gated();
    let arrived = Arc::clone(&recording.arrived);
    let store = BatchingStore::new(recording);
    let first = unit("first");
    let held = {
        let store = store.clone();
        let first = first.clone();
        tokio::spawn(async move {
            store
                .begin(&first, &LockToken::generate(), TTL, Fencing::Off)
                .await
        })
    };
    arrived.notified().await;
    // The first batch is in the store; a unit claimed twice and a free one wait behind it.
    let (a, b) = (LockToken::generate(), LockToken::generate());
    let second = unit("second");
    let claims = [
        (first.clone(), a),
        (first.clone(), b),
        (second, LockToken::generate()),
    ];
    let mut waiting = JoinSet::new();
    for (unit, token) in claims {
        let store = store.clone();
        waiting.spawn(async move { store.begin(&unit, &token, TTL, Fencing::Off).await });
    }
    // All three wait behind the first batch, and nothing more reaches the store meanwhile.
    while store.shared.begins.state.lock().unwrap().waiting.len() < 3 {
        tokio::task::yield_now().await;
    }
    assert_eq!(store.inner().begin_batches(), [1]);
    gate.add_permits(2);
    assert!(matches!(held.await.unwrap(), Ok(Begin::Acquired { .. })));
    let mut busy = 0;
    while let Some(answer) = waiting.join_next().await {
        match answer.unwrap().unwrap() {
            Begin::Busy { .. } => busy += 1,
            Begin::Acquired { .. } => {}
            other => panic!("{other:?}"),
        }
    }
    // `first` is held by the first call: both later claims of it are busy.
    assert_eq!(busy, 2);
    assert_eq!(store.inner().begin_batches(), [1, 3]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_dropped_before_its_batch_is_sent_is_left_out() {
    let (recording, gate) = Recording::gated();
    let arrived = Arc::clone(&recording.arrived);
    let store = BatchingStore::new(recording);
    let held = {
        let store = store.clone();
        tokio::spawn(async move {
            store
                .begin(&unit("held"), &LockToken::generate(), TTL, Fencing::Off)
                .await
        })
    };
    arrived.notified().await;
    let dropped = unit("dropped");
    let waiting = {
        let (store, dropped) = (store.clone(), dropped.clone());
        tokio::spawn(async move {
            store
                .begin(&dropped, &LockToken::generate(), TTL, Fencing::Off)
                .await
        })
    };
    // Its request is queued once the task has run; then the call is given up.
    while store.shared.begins.state.lock().unwrap().waiting.is_empty() {
        tokio::task::yield_now().await;
    }
    waiting.abort();
    assert!(waiting.await.unwrap_err().is_cancelled());
    gate.add_permits(1);
    held.await.unwrap().unwrap();
    // The flusher found the given-up request and sent nothing for it.
    while store.shared.begins.state.lock().unwrap().flushing {
        tokio::task::yield_now().await;
    }
    assert_eq!(store.inner().begin_batches(), [1]);
    assert!(!store.inspect(&dropped).await.unwrap().is_locked());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_never_overtakes_the_begin_it_releases() {
    let (recording, gate) = Recording::gated();
    let arrived = Arc::clone(&recording.arrived);
    let store = BatchingStore::new(recording);
    let (unit, token) = (unit("in-flight"), LockToken::generate());
    let begin = {
        let (store, unit, token) = (store.clone(), unit.clone(), token.clone());
        tokio::spawn(async move { store.begin(&unit, &token, TTL, Fencing::Off).await })
    };
    arrived.notified().await;
    // The call is given up with its begin in the store: the runner then releases.
    begin.abort();
    let release = {
        let (store, unit, token) = (store.clone(), unit.clone(), token.clone());
        tokio::spawn(async move { store.release(&unit, &token).await })
    };
    tokio::task::yield_now().await;
    assert_eq!(
        store.inner().releases.load(Ordering::SeqCst),
        0,
        "the release went out before the begin's batch came back"
    );
    gate.add_permits(1);
    assert!(
        release.await.unwrap().unwrap(),
        "the release found the lock"
    );
    assert!(!store.inspect(&unit).await.unwrap().is_locked());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_panics_loses_its_batch_but_not_the_next() {
    let store = BatchingStore::new(Recording::default());
    store.inner().panic_next.store(true, Ordering::SeqCst);
    let lost = store
        .begin(&unit("lost"), &LockToken::generate(), TTL, Fencing::Off)
        .await
        .unwrap_err();
    assert!(lost.is_ambiguous(), "{lost}");
    let (unit, token) = (unit("after"), LockToken::generate());
    assert!(matches!(
        store.begin(&unit, &token, TTL, Fencing::Off).await,
        Ok(Begin::Acquired { .. })
    ));
    // A release waits for no batch that will never come back.
    assert!(store.release(&unit, &token).await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_of_a_unit_in_no_batch_goes_at_once() {
    let (recording, gate) = Recording::gated();
    let arrived = Arc::clone(&recording.arrived);
    let store = BatchingStore::new(recording);
    let held = {
        let store = store.clone();
        tokio::spawn(async move {
            store
                .begin(&unit("slow"), &LockToken::generate(), TTL, Fencing::Off)
                .await
        })
    };
    arrived.notified().await;
    // Another unit's release does not wait behind the batch the store is holding.
    let released = tokio::time::timeout(
        Duration::from_secs(10),
        store.release(&unit("other"), &LockToken::generate()),
    )
    .await
    .expect("the release waited for a batch that does not carry its unit");
    assert!(!released.unwrap());
    gate.add_permits(1);
    held.await.unwrap().unwrap();
}

#[test]
fn a_runtime_that_shuts_down_mid_batch_leaves_the_store_usable() {
    let (recording, gate) = Recording::gated();
    let arrived = Arc::clone(&recording.arrived);
    let store = BatchingStore::new(recording);
    let (lost, token) = (unit("lost-with-its-runtime"), LockToken::generate());
    let first = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    first.block_on(async {
        let (store, lost, token) = (store.clone(), lost.clone(), token.clone());
        tokio::spawn(async move { store.begin(&lost, &token, TTL, Fencing::Off).await });
        arrived.notified().await;
    });
    // The batch is in the store when its runtime goes: its flusher is dropped mid-batch.
    drop(first);
    gate.add_permits(10);
    let second = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    second.block_on(async {
        let fresh = tokio::time::timeout(
            Duration::from_secs(10),
            store.begin(&unit("after"), &LockToken::generate(), TTL, Fencing::Off),
        )
        .await;
        assert!(matches!(
            fresh.expect("a begin after the shutdown waited forever"),
            Ok(Begin::Acquired { .. })
        ));
        let released =
            tokio::time::timeout(Duration::from_secs(10), store.release(&lost, &token)).await;
        released
            .expect("the release of the lost batch's unit waited forever")
            .unwrap();
    });
}
