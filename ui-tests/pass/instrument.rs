//! `#[tracing::instrument]` stacked with the attribute, in both orders, on an `async fn` and
//! inside an `#[async_trait]` impl. Above, `#[instrument]` expands first and the attribute gets
//! its rewritten body (for async-trait: its `Box::pin(async move { .. })` with async-trait's
//! block nested inside); below, the attribute expands first and the span covers the whole call.
#![deny(warnings, clippy::pedantic)]

use std::sync::atomic::{AtomicU32, Ordering};

use async_trait::async_trait;
use idempotask::{Error, MemoryStore, idempotent_task};
use tracing::instrument;

static RUNS: AtomicU32 = AtomicU32::new(0);

#[instrument]
#[idempotent_task(key = "outer-{order_id}")]
async fn instrument_first(order_id: u64) -> Result<u64, Error> {
    RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(order_id)
}

#[idempotent_task(key = "inner-{order_id}")]
#[instrument]
async fn idempotent_first(order_id: u64) -> Result<u64, Error> {
    RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(order_id)
}

#[async_trait]
trait Job {
    async fn instrument_first(&self, order_id: u64, note: String) -> Result<u64, Error>;
    async fn idempotent_first(&self, order_id: u64, note: String) -> Result<u64, Error>;
}

struct Charge {
    store: MemoryStore,
}

#[async_trait]
impl Job for Charge {
    // The free functions above own these names: each task of a program has its own.
    #[instrument(skip(self))]
    #[idempotent_task(key = "trait-outer-{order_id}", store = self.store, name = "trait_instrument_first")]
    async fn instrument_first(&self, order_id: u64, note: String) -> Result<u64, Error> {
        RUNS.fetch_add(1, Ordering::SeqCst);
        Ok(order_id + u64::try_from(note.len()).unwrap_or_default())
    }

    #[idempotent_task(key = "trait-inner-{order_id}", store = self.store, name = "trait_idempotent_first")]
    #[instrument(skip(self))]
    async fn idempotent_first(&self, order_id: u64, note: String) -> Result<u64, Error> {
        RUNS.fetch_add(1, Ordering::SeqCst);
        Ok(order_id + u64::try_from(note.len()).unwrap_or_default())
    }
}

#[tokio::main]
async fn main() {
    idempotask::install(MemoryStore::new());
    for _ in 0..2 {
        assert_eq!(instrument_first(1).await.unwrap(), 1);
        assert_eq!(idempotent_first(2).await.unwrap(), 2);
    }
    let job: Box<dyn Job + Send + Sync> = Box::new(Charge {
        store: MemoryStore::new(),
    });
    for _ in 0..2 {
        assert_eq!(job.instrument_first(3, "ab".to_owned()).await.unwrap(), 5);
        assert_eq!(job.idempotent_first(4, "ab".to_owned()).await.unwrap(), 6);
    }
    assert_eq!(RUNS.load(Ordering::SeqCst), 4);
}
