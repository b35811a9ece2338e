//! A Redis Streams worker that charges each order once, however often the group delivers it,
//! on `idempotask-redis-streams`.
//!
//! It charges the orders (entries `order_id <key> order {"id": 5}`) of the stream `orders` (or
//! `$QUEUE`), as a member of the consumer group `chargers`, at a stand-in gateway that counts
//! charges in Redis and fails the first request for every fourth order. The consumer runs each
//! charge once per `order_id`: a failure waits pending and runs again after its backoff, and an
//! entry whose worker died before its `XACK` is claimed by another worker and gets the stored
//! receipt. It prints `order 5: charged ch_5_1`, `… replayed ch_5_1` or `… failed: …`; Ctrl-C
//! stops it.
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --example redis_streams_worker --features redis-streams
//! redis-cli XADD orders '*' order_id orders-order-5 order '{"id": 5}'
//! ```
//! `tests/example_queues.rs` kills one of three with SIGKILL between a charge and its ack
//! (`CRASH_BEFORE_ACK=5` waits there) and checks the ledger; `WITHOUT_IDEMPOTASK=1`, the bare
//! consumer group loop, charges that order twice.
//!
//! ```toml
//! [dependencies]
//! idempotask = "0.1"
//! idempotask-redis = "0.1"
//! idempotask-redis-streams = "0.1"
//! redis = { version = "1", default-features = false, features = ["tokio-comp", "connection-manager", "streams"] }
//! serde = { version = "1", features = ["derive"] }
//! serde_json = "1"
//! tokio = { version = "1", features = ["macros", "rt-multi-thread", "signal", "time"] }
//! ```

use std::collections::HashMap;
use std::time::Duration;

use idempotask::store::BatchingStore;
use idempotask::{Backoff, Outcome, RetryPolicy, Task};
use idempotask_redis_streams::{Field, Handled, Idempotent};
use redis::streams::{StreamAutoClaimOptions, StreamAutoClaimReply, StreamId};
use redis::streams::{StreamReadOptions, StreamReadReply};
use redis::{AsyncCommands, aio::ConnectionManager};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const GROUP: &str = "chargers";
/// How long an entry stays pending, with no sign of its worker, before another claims it:
/// short, so that a dead worker's entry comes back within seconds.
const CLAIM_IDLE: Duration = Duration::from_secs(2);
/// The lock TTL is no longer than `CLAIM_IDLE` (the consumer refuses it otherwise), so an entry
/// claimed from a worker that died mid-charge finds the lock expired.
static CHARGE: Task = Task::new("streams_order_charge")
    .lock_ttl(Duration::from_secs(1))
    .retry(RetryPolicy::no_wait());

#[derive(serde::Deserialize)]
struct Order {
    id: u64,
}

/// The gateway: charges per order in the hash `ledger`; the charge id (the receipt) counts them.
async fn charge(
    mut redis: ConnectionManager,
    ledger: String,
    order: u64,
) -> Result<String, BoxError> {
    let requests: u64 = redis.hincr(format!("{ledger}:requests"), order, 1).await?;
    if order % 4 == 2 && requests == 1 {
        return Err("the gateway is unavailable; try again".into());
    }
    let charges: u64 = redis.hincr(&ledger, order, 1).await?;
    Ok(format!("ch_{order}_{charges}"))
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let url = std::env::var("REDIS_URL").map_err(|_| "set REDIS_URL")?;
    let queue = std::env::var("QUEUE").unwrap_or_else(|_| "orders".to_owned());
    let ledger = format!("ledger:{queue}");
    let redis = ConnectionManager::new(redis::Client::open(url.as_str())?).await?;
    let name = format!("worker-{}", std::process::id());
    let crash = std::env::var("CRASH_BEFORE_ACK").map(|order| format!("ch_{order}_1"));
    if std::env::var_os("WITHOUT_IDEMPOTASK").is_some() {
        return bare(redis, &queue, &name, &ledger, crash.ok()).await;
    }
    let store = idempotask_redis::RedisStore::connect(&url).await?;
    let mut consumer = Idempotent::new(CHARGE.clone(), Field::new("order_id"))
        // A batch's calls go to Redis as one pipeline (here, batches of one).
        .store(BatchingStore::new(store))
        .claim_idle(CLAIM_IDLE)
        .failure_backoff(Backoff::new(
            Duration::from_millis(100),
            Duration::from_secs(1),
        ))
        // One entry at a time: a worker that dies is in the middle of no other charge.
        .batch_size(1)
        .block(Duration::from_millis(200))
        .consume(&url, queue.as_str(), GROUP, name)
        .await?;
    let mut stop = std::pin::pin!(tokio::signal::ctrl_c());
    println!("waiting for orders on {queue}");
    loop {
        let mut orders = HashMap::new();
        let body = |entry: &idempotask_redis_streams::Entry| {
            let order: Order = entry.json("order")?;
            orders.insert(entry.id().to_owned(), order.id);
            Ok(charge(redis.clone(), ledger.clone(), order.id))
        };
        // `run_batch`, not `next_batch`: the ack waits for the lines below.
        let batch = tokio::select! {
            _ = &mut stop => return Ok(()),
            batch = consumer.run_batch(body) => batch?,
        };
        for processed in batch.processed() {
            let order = orders.get(&processed.id).copied().unwrap_or_default();
            match &processed.handled {
                Handled::Acked(done) if done.outcome == Outcome::Replayed => {
                    println!("order {order}: replayed {}", done.value);
                }
                // With `CRASH_BEFORE_ACK=<order>`, the first charge of that order waits,
                // unacked, for the SIGKILL of the test that asked for it.
                Handled::Acked(done) if crash.as_ref() == Ok(&done.value) => {
                    println!(
                        "order {order}: charged {}, crashing before the ack",
                        done.value
                    );
                    std::future::pending::<()>().await;
                }
                Handled::Acked(done) => println!("order {order}: charged {}", done.value),
                Handled::Failed { error, .. } => println!("order {order}: failed: {error}"),
                Handled::Deferred { error, .. } => println!("order {order}: failed: {error}"),
                Handled::DeadLettered(why) => println!("order {order}: failed: {why}"),
            }
        }
        consumer.settle(batch).await?;
    }
}

/// The same worker without idempotask: the consumer group loop by hand, which acks after the
/// charge and claims what a dead worker left pending.
async fn bare(
    mut redis: ConnectionManager,
    queue: &str,
    name: &str,
    ledger: &str,
    crash: Option<String>,
) -> Result<(), BoxError> {
    // Every worker creates the group: all but the first are told that it exists (BUSYGROUP).
    let _: redis::RedisResult<()> = redis.xgroup_create_mkstream(queue, GROUP, "0").await;
    let read = StreamReadOptions::default()
        .group(GROUP, name)
        .count(1)
        .block(200);
    let idle = usize::try_from(CLAIM_IDLE.as_millis())?;
    let streams = [queue];
    let mut stop = std::pin::pin!(tokio::signal::ctrl_c());
    println!("waiting for orders on {queue}");
    loop {
        let claim = StreamAutoClaimOptions::default().count(1);
        let stale: StreamAutoClaimReply = redis
            .xautoclaim_options(queue, GROUP, name, idle, "0-0", claim)
            .await?;
        let mut entries: Vec<StreamId> = stale.claimed;
        if entries.is_empty() {
            let new: Option<StreamReadReply> = tokio::select! {
                _ = &mut stop => return Ok(()),
                new = redis.xread_options(&streams, &[">"], &read) => new?,
            };
            entries = new
                .into_iter()
                .flat_map(|r| r.keys)
                .flat_map(|k| k.ids)
                .collect();
        }
        for entry in entries {
            let json: String = entry.get("order").ok_or("an entry without an order")?;
            let order = serde_json::from_str::<Order>(&json)?.id;
            match charge(redis.clone(), ledger.to_owned(), order).await {
                Ok(id) if crash.as_ref() == Some(&id) => {
                    println!("order {order}: charged {id}, crashing before the ack");
                    std::future::pending::<()>().await;
                }
                Ok(id) => println!("order {order}: charged {id}"),
                // Unacked, the entry is claimed again once it has been idle for CLAIM_IDLE.
                Err(err) => {
                    println!("order {order}: failed: {err}");
                    continue;
                }
            }
            let _: usize = redis.xack(queue, GROUP, &[&entry.id]).await?;
        }
    }
}
