//! `#[idempotent_task]` inside an `#[async_trait]` impl, run through `Box<dyn Job>` on a real
//! Redis: async-trait expands first, and the attribute rewrites the boxed future it makes.

use idempotask_test_support as support;

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use idempotask::{Error, idempotent_task};
use idempotask_redis::RedisStore;
use support::RedisServer;
use tokio::sync::Barrier;

#[derive(Debug, thiserror::Error)]
enum PaymentError {
    #[error(transparent)]
    Idempotency(#[from] Error),
}

/// An object-safe job trait, as queue consumers write them.
#[async_trait]
trait Job: Send + Sync {
    async fn run(&self, order_id: u64) -> Result<String, PaymentError>;
}

/// One worker's handler: its own store handle, and a count of executions shared by all workers.
struct Charge {
    store: RedisStore,
    executions: Arc<AtomicUsize>,
}

#[async_trait]
impl Job for Charge {
    #[idempotent_task(key = "order-charge-{order_id}", lock_ttl = 30, store = self.store)]
    async fn run(&self, order_id: u64) -> Result<String, PaymentError> {
        self.executions.fetch_add(1, Ordering::SeqCst);
        // Holds the lock while the other deliveries arrive; the random part makes a second
        // execution visible as a second distinct result.
        tokio::time::sleep(Duration::from_millis(100)).await;
        Ok(format!("ch_{order_id}_{}", rand::random::<u64>()))
    }
}

fn handler(store: &RedisStore, executions: &Arc<AtomicUsize>) -> Box<dyn Job> {
    Box::new(Charge {
        store: store.clone(),
        executions: executions.clone(),
    })
}

/// Pins that a method rewritten inside async-trait's boxed future keeps the guarantee of an
/// `async fn`: 64 concurrent deliveries of one order, each through its own `Box<dyn Job>`,
/// execute the body once and all get that execution's result; a later delivery replays it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_deliveries_through_box_dyn_job_run_once() {
    const DELIVERIES: usize = 64;
    let server = RedisServer::start();
    let store = server.store().await;
    let executions = Arc::new(AtomicUsize::new(0));
    let start = Arc::new(Barrier::new(DELIVERIES));
    let deliveries: Vec<_> = (0..DELIVERIES)
        .map(|_| {
            let job = handler(&store, &executions);
            let start = start.clone();
            tokio::spawn(async move {
                start.wait().await;
                job.run(42).await.unwrap()
            })
        })
        .collect();
    let mut results = Vec::with_capacity(DELIVERIES);
    for delivery in deliveries {
        results.push(delivery.await.unwrap());
    }
    let distinct: HashSet<&String> = results.iter().collect();
    eprintln!(
        "executions: {}, callers: {}, distinct results: {}",
        executions.load(Ordering::SeqCst),
        results.len(),
        distinct.len()
    );
    assert_eq!(executions.load(Ordering::SeqCst), 1);
    assert_eq!(results.len(), DELIVERIES);
    assert_eq!(distinct.len(), 1, "{distinct:?}");

    let later = handler(&store, &executions).run(42).await.unwrap();
    assert_eq!(later, results[0]);
    assert_eq!(executions.load(Ordering::SeqCst), 1);
}
