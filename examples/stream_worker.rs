//! A Redis Streams worker that ships each order once, however often the stream delivers it.
//!
//! It reads the orders (entries with an `order_id` field) of the stream `orders` (or `$QUEUE`)
//! as a member of the consumer group `shippers`, ships each at a stand-in warehouse that counts
//! shipments per order in the Redis hash `ledger:<stream>`, and acks it with `XACK`. A worker
//! that dies between the shipment and the ack leaves its entry pending; `XAUTOCLAIM` hands it
//! to another worker once it has been idle longer than the visibility timeout, and idempotask
//! answers that redelivery with the stored parcel instead of shipping again. It prints
//! `order 5: shipped parcel_5_1` or `order 5: replayed parcel_5_1`; Ctrl-C stops it.
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --example stream_worker --features redis
//! redis-cli XADD orders '*' order_id 5
//! ```
//! Run several at once and kill one: no order ships twice. `REDIS_CLUSTER_URLS` (seed nodes)
//! puts the idempotask store on a Redis Cluster; the stream stays on `REDIS_URL`.
//! `tests/examples.rs` kills one of three with SIGKILL between a shipment and its ack
//! (`CRASH_BEFORE_ACK=5` waits there) and checks the ledger.
//!
//! ```toml
//! [dependencies]
//! idempotask = "0.1"
//! idempotask-redis = "0.1"
//! redis = { version = "1", default-features = false, features = ["tokio-comp", "streams"] }
//! tokio = { version = "1", features = ["macros", "rt-multi-thread", "signal", "time"] }
//! ```

use std::time::Duration;

use idempotask::store::SharedStore;
use idempotask::{Outcome, Task};
use idempotask_redis::{RedisClusterStore, RedisStore};
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use redis::streams::{StreamAutoClaimOptions, StreamAutoClaimReply, StreamId};
use redis::streams::{StreamReadOptions, StreamReadReply};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const GROUP: &str = "shippers";
/// How long an entry may stay unacknowledged before another worker claims it.
const VISIBILITY_TIMEOUT_MS: usize = 2_000;
/// The lock TTL is shorter than the visibility timeout, so an entry claimed from a worker that
/// died mid-shipment finds the lock expired.
static SHIP: Task = Task::new("ship_order").lock_ttl(Duration::from_secs(1));

/// The warehouse: shipments per order in the hash `ledger`; the parcel id counts them.
async fn ship(
    mut redis: MultiplexedConnection,
    ledger: String,
    order: u64,
) -> Result<String, BoxError> {
    let shipments: u64 = redis.hincr(&ledger, order, 1).await?;
    Ok(format!("parcel_{order}_{shipments}"))
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let url = std::env::var("REDIS_URL").map_err(|_| "set REDIS_URL: the stream lives there")?;
    idempotask::install(match std::env::var("REDIS_CLUSTER_URLS") {
        Ok(urls) => SharedStore::new(RedisClusterStore::connect(urls.split(',')).await?),
        Err(_) => SharedStore::new(RedisStore::connect(&url).await?),
    });
    let stream = std::env::var("QUEUE").unwrap_or_else(|_| "orders".to_owned());
    let ledger = format!("ledger:{stream}");
    let mut redis = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    // Every worker creates the group: all but the first are told that it exists (BUSYGROUP),
    // and any other failure shows at the first read.
    let _: redis::RedisResult<()> = redis.xgroup_create_mkstream(&stream, GROUP, "0").await;
    let consumer = format!("worker-{}", std::process::id());
    // One entry at a time: a worker that dies is in the middle of no other shipment.
    let read = StreamReadOptions::default()
        .group(GROUP, &consumer)
        .count(1)
        .block(100);
    let streams = [stream.as_str()];
    let crash = std::env::var("CRASH_BEFORE_ACK").map(|order| format!("parcel_{order}_1"));
    let mut stop = std::pin::pin!(tokio::signal::ctrl_c());
    println!("waiting for orders on {stream}");
    loop {
        // First the entries a dead worker left pending, then new ones.
        let claim = StreamAutoClaimOptions::default().count(1);
        let idle = VISIBILITY_TIMEOUT_MS;
        let stale: StreamAutoClaimReply = redis
            .xautoclaim_options(&stream, GROUP, &consumer, idle, "0-0", claim)
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
            let order: u64 = entry
                .get("order_id")
                .ok_or("an entry without an order_id")?;
            let body = ship(redis.clone(), ledger.clone(), order);
            let key = format!("{stream}-order-{order}");
            match SHIP.call(key).run_reported(body).await {
                Ok(done) if done.outcome == Outcome::Replayed => {
                    println!("order {order}: replayed {}", done.value);
                }
                // With `CRASH_BEFORE_ACK=<order>`, the first shipment of that order waits,
                // unacked, for the SIGKILL of the test that asked for it.
                Ok(done) if crash.as_ref() == Ok(&done.value) => {
                    println!(
                        "order {order}: shipped {}, crashing before the ack",
                        done.value
                    );
                    std::future::pending::<()>().await;
                }
                Ok(done) => println!("order {order}: shipped {}", done.value),
                // Unacked, the entry is claimed again after the visibility timeout.
                Err(err) => {
                    println!("order {order}: failed: {err}");
                    continue;
                }
            }
            let _: usize = redis.xack(&stream, GROUP, &[&entry.id]).await?;
        }
    }
}
