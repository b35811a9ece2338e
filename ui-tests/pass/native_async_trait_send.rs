//! Native `async fn` in a trait whose futures must be `Send`: the trait declares
//! `fn run(..) -> impl Future<Output = ..> + Send`, the impl writes `async fn` with the
//! attribute, and the future it returns is `Send`, so a generic caller can spawn it.
#![deny(warnings, clippy::pedantic)]

use std::future::Future;
use std::sync::Arc;

use idempotask::{Error, MemoryStore, idempotent_task};

trait Job: Send + Sync + 'static {
    fn run(&self, order_id: u64) -> impl Future<Output = Result<String, Error>> + Send;
}

struct Charge {
    store: MemoryStore,
}

impl Job for Charge {
    #[idempotent_task(key = "order-charge-{order_id}", store = self.store)]
    async fn run(&self, order_id: u64) -> Result<String, Error> {
        tokio::task::yield_now().await;
        Ok(format!("ch_{order_id}"))
    }
}

async fn deliver<J: Job>(job: Arc<J>, order_id: u64) -> String {
    tokio::spawn(async move { job.run(order_id).await })
        .await
        .unwrap()
        .unwrap()
}

#[tokio::main]
async fn main() {
    let job = Arc::new(Charge {
        store: MemoryStore::new(),
    });
    assert_eq!(deliver(job.clone(), 3).await, "ch_3");
    assert_eq!(deliver(job, 3).await, "ch_3");
}
