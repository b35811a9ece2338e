//! A real at-least-once queue: a Redis Streams consumer group whose workers crash.
//!
//! A producer enqueues orders; several workers read them with `XREADGROUP`. Some workers "crash"
//! after the side effect (shipping the order) and before `XACK`, dropping the rest of their batch
//! too; `XAUTOCLAIM` hands those messages to another worker once they have been idle longer than
//! the visibility timeout. Every redelivery reaches `ship_order` again, which replays the stored
//! result: side effects equal messages.
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --example stream_worker --features redis
//! ```
//!
//! It needs, next to `idempotask`:
//!
//! ```toml
//! [dependencies]
//! idempotask = "0.1"
//! idempotask-redis = "0.1"
//! redis = { version = "1", default-features = false, features = ["tokio-comp"] }
//! tokio = { version = "1", features = ["macros", "rt-multi-thread", "time"] }
//! ```

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use idempotask::store::{SharedStore, StoreError};
use idempotask::{Error, idempotent_task};
use idempotask_redis::{RedisClusterStore, RedisStore};
use redis::Value;
use redis::aio::MultiplexedConnection;

const ORDERS: u64 = 300;
const WORKERS: usize = 4;
/// How long a delivered message may stay unacknowledged before another worker claims it.
const VISIBILITY_TIMEOUT_MS: u64 = 300;
const GROUP: &str = "shippers";

/// Side effects per order: what the warehouse would see.
static SHIPMENTS: Mutex<Option<HashMap<u64, u32>>> = Mutex::new(None);

#[idempotent_task(key = "ship-{run}-{order_id}", lock_ttl = "5s")]
async fn ship_order(run: u64, order_id: u64) -> Result<String, Error> {
    let mut shipments = SHIPMENTS.lock().unwrap_or_else(PoisonError::into_inner);
    *shipments
        .get_or_insert_with(HashMap::new)
        .entry(order_id)
        .or_default() += 1;
    Ok(format!("parcel-{run}-{order_id}"))
}

#[derive(Default)]
struct Counters {
    deliveries: AtomicU64,
    redeliveries: AtomicU64,
    crashes: AtomicU64,
    acked: AtomicU64,
}

/// `(message id, order id)` pairs from an `XREADGROUP` or `XAUTOCLAIM` entry list.
fn entries(list: &Value) -> Vec<(String, u64)> {
    let Value::Array(items) = list else {
        return Vec::new();
    };
    items
        .iter()
        .filter_map(|entry| {
            let Value::Array(parts) = entry else {
                return None;
            };
            let [Value::BulkString(id), Value::Array(fields)] = parts.as_slice() else {
                return None;
            };
            let order = fields.chunks(2).find_map(|pair| match pair {
                [Value::BulkString(k), Value::BulkString(v)] if k == b"order_id" => {
                    std::str::from_utf8(v).ok()?.parse().ok()
                }
                _ => None,
            })?;
            Some((String::from_utf8_lossy(id).into_owned(), order))
        })
        .collect()
}

/// Messages idle longer than the visibility timeout, claimed for `consumer`.
async fn claim_stale(
    conn: &mut MultiplexedConnection,
    stream: &str,
    consumer: &str,
) -> redis::RedisResult<Vec<(String, u64)>> {
    let reply: Value = redis::cmd("XAUTOCLAIM")
        .arg(stream)
        .arg(GROUP)
        .arg(consumer)
        .arg(VISIBILITY_TIMEOUT_MS)
        .arg("0-0")
        .arg("COUNT")
        .arg(10)
        .query_async(conn)
        .await?;
    Ok(match &reply {
        Value::Array(parts) if parts.len() >= 2 => entries(&parts[1]),
        _ => Vec::new(),
    })
}

/// New messages for `consumer`, waiting up to 100 ms for some.
async fn read_new(
    conn: &mut MultiplexedConnection,
    stream: &str,
    consumer: &str,
) -> redis::RedisResult<Vec<(String, u64)>> {
    let reply: Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg(GROUP)
        .arg(consumer)
        .arg("COUNT")
        .arg(10)
        .arg("BLOCK")
        .arg(100)
        .arg("STREAMS")
        .arg(stream)
        .arg(">")
        .query_async(conn)
        .await?;
    // [[stream, entries]] or nil when nothing arrived.
    Ok(match &reply {
        Value::Array(streams) => streams
            .iter()
            .flat_map(|s| match s {
                Value::Array(pair) if pair.len() == 2 => entries(&pair[1]),
                _ => Vec::new(),
            })
            .collect(),
        _ => Vec::new(),
    })
}

async fn worker(
    mut conn: MultiplexedConnection,
    stream: String,
    run: u64,
    index: usize,
    counters: Arc<Counters>,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let consumer = format!("worker-{index}");
    let mut delivered_before: HashSet<String> = HashSet::new();
    while counters.acked.load(Ordering::SeqCst) < ORDERS {
        let mut batch = claim_stale(&mut conn, &stream, &consumer).await?;
        let claimed = !batch.is_empty();
        if !claimed {
            batch = read_new(&mut conn, &stream, &consumer).await?;
        }
        for (message_id, order_id) in batch {
            counters.deliveries.fetch_add(1, Ordering::SeqCst);
            if claimed {
                counters.redeliveries.fetch_add(1, Ordering::SeqCst);
            }
            ship_order(run, order_id).await?;
            // Every seventh order's first delivery dies after shipping and before the ack,
            // losing the rest of its batch with it.
            let first_time = delivered_before.insert(message_id.clone());
            if order_id % 7 == 0 && first_time && !claimed {
                counters.crashes.fetch_add(1, Ordering::SeqCst);
                break;
            }
            let acked: u64 = redis::cmd("XACK")
                .arg(&stream)
                .arg(GROUP)
                .arg(&message_id)
                .query_async(&mut conn)
                .await?;
            counters.acked.fetch_add(acked, Ordering::SeqCst);
        }
    }
    Ok(())
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

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let url = std::env::var("REDIS_URL")
        .map_err(|_| "set REDIS_URL (redis://…): this example needs a real queue")?;
    // The store is the queue's Redis, or a Redis Cluster when REDIS_CLUSTER_URLS is set.
    let (store, _) = redis_from_env().await?.ok_or("set REDIS_URL")?;
    idempotask::install(store);
    let client = redis::Client::open(url.as_str())?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let run = u64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_micros(),
    )?;
    let stream = format!("orders:{run}");

    let _: () = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(&stream)
        .arg(GROUP)
        .arg("$")
        .arg("MKSTREAM")
        .query_async(&mut conn)
        .await?;
    let started = Instant::now();
    let counters = Arc::new(Counters::default());
    let mut workers = Vec::new();
    for index in 0..WORKERS {
        // A connection each: a blocking XREADGROUP holds up every command behind it.
        let own = client.get_multiplexed_async_connection().await?;
        workers.push(tokio::spawn(worker(
            own,
            stream.clone(),
            run,
            index,
            counters.clone(),
        )));
    }
    for order_id in 1..=ORDERS {
        let _: String = redis::cmd("XADD")
            .arg(&stream)
            .arg("*")
            .arg("order_id")
            .arg(order_id)
            .query_async(&mut conn)
            .await?;
    }
    let all_done = async {
        for worker in workers {
            worker.await??;
        }
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
    };
    tokio::time::timeout(Duration::from_secs(60), all_done)
        .await
        .map_err(|_| "the workers did not drain the stream in 60 s")??;

    let shipments = SHIPMENTS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take()
        .unwrap_or_default();
    let side_effects: u32 = shipments.values().sum();
    let shipped_twice = shipments.values().filter(|n| **n > 1).count();
    println!("messages:      {ORDERS}");
    println!(
        "deliveries:    {}",
        counters.deliveries.load(Ordering::SeqCst)
    );
    println!(
        "redeliveries:  {}",
        counters.redeliveries.load(Ordering::SeqCst)
    );
    println!("crashes:       {}", counters.crashes.load(Ordering::SeqCst));
    println!("side effects:  {side_effects}");
    println!("shipped twice: {shipped_twice}");
    println!("elapsed:       {} ms", started.elapsed().as_millis());
    let _: i64 = redis::cmd("DEL")
        .arg(&stream)
        .query_async(&mut conn)
        .await?;
    if u64::from(side_effects) == ORDERS && shipments.len() == usize::try_from(ORDERS)? {
        Ok(())
    } else {
        Err(format!("{side_effects} side effects for {ORDERS} messages").into())
    }
}
