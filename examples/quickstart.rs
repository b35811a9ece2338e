//! The main job: one task delivered eleven times (three in a row, eight at once) runs once.
//!
//! Runs on the embedded `MemoryStore`, with no server; `quickstart_redis` is the same on Redis
//! or a Redis Cluster.
//!
//! ```text
//! cargo run --example quickstart
//! ```
//!
//! It needs, next to `idempotask`:
//!
//! ```toml
//! [dependencies]
//! idempotask = "0.1"
//! tokio = { version = "1", features = ["macros", "rt-multi-thread", "time"] }
//! ```

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use idempotask::{Error, MemoryStore, idempotent_task};

/// Counts how often the side effect really happened.
static EXECUTIONS: AtomicU32 = AtomicU32::new(0);

/// The side effect: charge a customer once per order, whatever the queue does.
#[idempotent_task(key = "order-charge-{order_id}", lock_ttl = 30)]
async fn charge_customer(order_id: u64, amount_cents: u64) -> Result<String, Error> {
    EXECUTIONS.fetch_add(1, Ordering::SeqCst);
    // The payment gateway call would go here.
    tokio::time::sleep(Duration::from_millis(50)).await;
    Ok(format!("ch_{order_id}_{amount_cents}"))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    idempotask::install(MemoryStore::new());
    let order_id = 42;

    let mut deliveries = 0;
    let mut results = Vec::new();
    for _ in 0..3 {
        results.push(charge_customer(order_id, 1_200).await?);
        deliveries += 1;
    }
    let concurrent: Vec<_> = (0..8)
        .map(|_| tokio::spawn(charge_customer(order_id, 1_200)))
        .collect();
    for delivery in concurrent {
        results.push(delivery.await??);
        deliveries += 1;
    }

    let executions = EXECUTIONS.load(Ordering::SeqCst);
    println!("store:      the in-memory store");
    println!("deliveries: {deliveries} (3 in a row, 8 at once)");
    println!("executions: {executions}");
    println!("result:     {} (every delivery got the same)", results[0]);
    assert!(results.iter().all(|r| *r == results[0]));
    if executions != 1 {
        return Err(format!("the charge ran {executions} times").into());
    }
    Ok(())
}
