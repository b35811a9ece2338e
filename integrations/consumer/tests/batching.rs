//! The store a consumer's calls reach: one that batches natively goes behind a
//! `BatchingStore` unless told not to, so that the messages run at once reach it together; one
//! that does not, and one told not to, get each message's calls one by one.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use idempotask::store::{
    Begin, Claim, Completion, Fencing, Finish, Inspection, LockToken, Store, StoreError,
    UnitOfWork, begin_each, finish_each,
};
use idempotask::{MemoryStore, Outcome, Task};
use idempotask_consumer::{ConsumerSettings, History, Verdict};

/// What reached the store: the size of each `begin_batch`, and how many single `begin`s.
#[derive(Debug, Default)]
struct Seen {
    batches: Vec<usize>,
    single_begins: usize,
}

/// A `MemoryStore` that says whether it batches natively, and records what reached it.
#[derive(Debug, Clone)]
struct Recording {
    inner: MemoryStore,
    natively: bool,
    seen: Arc<Mutex<Seen>>,
}

impl Recording {
    fn new(natively: bool) -> Self {
        Self {
            inner: MemoryStore::new(),
            natively,
            seen: Arc::default(),
        }
    }

    fn seen(&self) -> (Vec<usize>, usize) {
        let seen = self.seen.lock().unwrap();
        (seen.batches.clone(), seen.single_begins)
    }
}

impl Store for Recording {
    fn batches_natively(&self) -> bool {
        self.natively
    }
    async fn begin(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        lock_ttl: Duration,
        fencing: Fencing,
    ) -> Result<Begin, StoreError> {
        self.seen.lock().unwrap().single_begins += 1;
        self.inner.begin(unit, token, lock_ttl, fencing).await
    }
    async fn finish(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        marker: &[u8],
        result_ttl: Duration,
    ) -> Result<Finish, StoreError> {
        self.inner.finish(unit, token, marker, result_ttl).await
    }
    async fn release(&self, unit: &UnitOfWork, token: &LockToken) -> Result<bool, StoreError> {
        self.inner.release(unit, token).await
    }
    async fn renew(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        lock_ttl: Duration,
    ) -> Result<bool, StoreError> {
        self.inner.renew(unit, token, lock_ttl).await
    }
    async fn inspect(&self, unit: &UnitOfWork) -> Result<Inspection, StoreError> {
        self.inner.inspect(unit).await
    }
    async fn forget(&self, unit: &UnitOfWork) -> Result<bool, StoreError> {
        self.inner.forget(unit).await
    }
    async fn begin_batch(
        &self,
        claims: &[Claim<'_>],
        lock_ttl: Duration,
        fencing: Fencing,
    ) -> Vec<Result<Begin, StoreError>> {
        self.seen.lock().unwrap().batches.push(claims.len());
        begin_each(&self.inner, claims, lock_ttl, fencing).await
    }
    async fn finish_batch(
        &self,
        completions: &[Completion<'_>],
        result_ttl: Duration,
    ) -> Vec<Result<Finish, StoreError>> {
        finish_each(&self.inner, completions, result_ttl).await
    }
}

struct FirstDelivery;

impl History for FirstDelivery {
    async fn failures(&self) -> u32 {
        0
    }
    async fn deferrals(&self) -> u32 {
        0
    }
}

/// Runs 16 messages at once through `settings`, each a fresh key, and checks each was acked
/// as executed.
async fn sixteen_at_once(settings: &ConsumerSettings) {
    let mut running = tokio::task::JoinSet::new();
    for n in 0..16_u32 {
        let settings = settings.clone();
        running.spawn(async move {
            let body = async move { Ok::<_, std::io::Error>(n) };
            match settings
                .run(format!("order-{n}"), b"{}", &FirstDelivery, body)
                .await
            {
                Verdict::Ack(report) => assert_eq!(report.outcome, Outcome::Executed),
                other => panic!("message {n} not acked: {other:?}"),
            }
        });
    }
    while let Some(done) = running.join_next().await {
        done.unwrap();
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_store_that_batches_natively_gets_the_messages_run_at_once_together() {
    let store = Recording::new(true);
    let settings = ConsumerSettings::new(Task::new("batched")).store(store.clone());
    sixteen_at_once(&settings).await;
    let (batches, single_begins) = store.seen();
    assert_eq!(
        single_begins, 0,
        "a begin bypassed the batching: {batches:?}"
    );
    assert_eq!(batches.iter().sum::<usize>(), 16, "{batches:?}");
    assert!(
        batches.iter().any(|&size| size > 1),
        "the messages run at once never shared a batch: {batches:?}"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn a_shared_store_that_batches_natively_is_batched_too() {
    let store = Recording::new(true);
    let settings = ConsumerSettings::new(Task::new("shared")).store(Arc::new(store.clone()));
    sixteen_at_once(&settings).await;
    let (batches, single_begins) = store.seen();
    assert_eq!(single_begins, 0, "{batches:?}");
    assert!(batches.iter().any(|&size| size > 1), "{batches:?}");
}

#[tokio::test(flavor = "current_thread")]
async fn a_store_that_does_not_batch_or_is_told_not_to_gets_each_call_alone() {
    let plain = Recording::new(false);
    sixteen_at_once(&ConsumerSettings::new(Task::new("plain")).store(plain.clone())).await;
    assert_eq!(plain.seen(), (vec![], 16));

    let told = Recording::new(true);
    let settings = ConsumerSettings::new(Task::new("told"))
        .store(told.clone())
        .batch_store_calls(false);
    sixteen_at_once(&settings).await;
    assert_eq!(told.seen(), (vec![], 16));

    // Turned off, then on again: batched.
    let again = Recording::new(true);
    let settings = ConsumerSettings::new(Task::new("again"))
        .batch_store_calls(false)
        .store(again.clone())
        .batch_store_calls(true);
    sixteen_at_once(&settings).await;
    assert_eq!(again.seen().1, 0);
}
