//! The quickstart on Redis: one task delivered eleven times (three in a row, eight at once)
//! runs once. `REDIS_URL` names a Redis (or Valkey) server, `REDIS_CLUSTER_URLS` the seed
//! nodes of a Redis Cluster; without either it uses the in-memory store, as `quickstart` does.
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --example quickstart_redis --features redis
//! REDIS_CLUSTER_URLS=redis://10.0.0.1:6379,redis://10.0.0.2:6379 \
//!     cargo run --example quickstart_redis --features redis
//! ```
//!
//! It needs:
//!
//! ```toml
//! [dependencies]
//! idempotask = "0.1"
//! idempotask-redis = "0.1"
//! tokio = { version = "1", features = ["macros", "rt-multi-thread", "time"] }
//! ```

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use idempotask::MemoryStore;
use idempotask::store::{SharedStore, StoreError};
use idempotask::{Error, idempotent_task};
use idempotask_redis::{RedisClusterStore, RedisStore};

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

/// The Redis store the environment names, and which one it is: a Redis Cluster when
/// `REDIS_CLUSTER_URLS` lists its seed nodes, Redis when `REDIS_URL` is set, `None` otherwise.
async fn redis_from_env() -> Result<Option<(SharedStore, String)>, StoreError> {
    if let Ok(urls) = std::env::var("REDIS_CLUSTER_URLS") {
        let store = RedisClusterStore::connect(urls.split(',').map(str::trim)).await?;
        return Ok(Some((
            SharedStore::new(store),
            format!("Redis Cluster at {urls}"),
        )));
    }
    if let Ok(url) = std::env::var("REDIS_URL") {
        let store = RedisStore::connect(&url).await?;
        return Ok(Some((SharedStore::new(store), format!("Redis at {url}"))));
    }
    Ok(None)
}

/// Installs the Redis store the environment names, or the in-memory store when it names none
/// (a Redis that cannot be reached is an error, never a quiet fallback); answers which.
async fn install_store() -> Result<String, StoreError> {
    let (store, backend) = match redis_from_env().await? {
        Some(found) => found,
        None => (
            SharedStore::new(MemoryStore::new()),
            "the in-memory store".to_owned(),
        ),
    };
    idempotask::install(store);
    Ok(backend)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // REDIS_CLUSTER_URLS or REDIS_URL when set, else in memory.
    let backend = install_store().await?;
    // A unique order per run, so that a shared Redis does not replay an earlier run's result.
    let order_id = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis()
        .try_into()?;

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
    println!("store:      {backend}");
    println!("deliveries: {deliveries} (3 in a row, 8 at once)");
    println!("executions: {executions}");
    println!("result:     {} (every delivery got the same)", results[0]);
    assert!(results.iter().all(|r| *r == results[0]));
    if executions != 1 {
        return Err(format!("the charge ran {executions} times").into());
    }
    Ok(())
}
