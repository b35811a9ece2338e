//! Replaying a dead-letter queue safely: ask for each message's status first, replay only what
//! is unknown.
//!
//! Nine orders go through a worker. Three are acked. Three are charged, but the worker dies
//! before the ack, so they land in the dead-letter queue although the work is done. Three fail
//! because the payment gateway is down. While an operator replays the queue, a late redelivery of
//! one failed order is still running. The replay asks `Task::status` for every dead letter (the
//! library call behind `idempotask status`): done → skip (the result is stored), locked → keep it
//! for later, unknown → replay. No customer is charged twice.
//!
//! ```text
//! cargo run --example dlq_replay --features redis           # in-memory store
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --example dlq_replay --features redis
//! ```
//!
//! It needs, next to `idempotask`:
//!
//! ```toml
//! [dependencies]
//! idempotask = "0.1"
//! idempotask-redis = "0.1"
//! thiserror = "2"
//! tokio = { version = "1", features = ["macros", "rt-multi-thread", "sync", "time"] }
//! ```

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use idempotask::MemoryStore;
use idempotask::operator::{Status, StoredResult};
use idempotask::store::{SharedStore, StoreError};
use idempotask::{Error, Task, idempotent_task};
use idempotask_redis::{RedisClusterStore, RedisStore};
use tokio::sync::oneshot;

/// Charges per order at the payment gateway: what the customers' statements show.
static CHARGES: Mutex<Vec<u64>> = Mutex::new(Vec::new());
/// Whether the payment gateway answers.
static GATEWAY_UP: AtomicBool = AtomicBool::new(true);

#[derive(Debug, thiserror::Error)]
enum ChargeError {
    #[error("the payment gateway is down")]
    GatewayDown,
    #[error(transparent)]
    Idempotency(#[from] Error),
}

/// The task the queue delivers; its key is the order.
#[idempotent_task(key = "order-charge-{order_id}", lock_ttl = 30)]
async fn charge_customer(order_id: u64, amount_cents: u64) -> Result<String, ChargeError> {
    if !GATEWAY_UP.load(Ordering::SeqCst) {
        return Err(ChargeError::GatewayDown);
    }
    CHARGES
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push(order_id);
    Ok(format!("ch_{order_id}_{amount_cents}"))
}

/// The same task, seen from the operator's side: its name, to ask for a key's status.
static CHARGE_CUSTOMER: Task = Task::new("charge_customer");

/// A message as the queue keeps it.
#[derive(Debug, Clone, Copy)]
struct Message {
    order_id: u64,
    amount_cents: u64,
}

impl Message {
    /// The key the task computes from the message (the attribute's `key` template).
    fn key(self) -> String {
        format!("order-charge-{}", self.order_id)
    }
}

/// The original deliveries; answers the messages that the queue dead-lettered.
async fn first_deliveries(messages: &[Message]) -> Result<Vec<Message>, ChargeError> {
    let mut dead_letters = Vec::new();
    for (i, message) in messages.iter().enumerate() {
        match i % 3 {
            // Charged and acked.
            0 => {
                charge_customer(message.order_id, message.amount_cents).await?;
            }
            // Charged, then the worker died before the ack: the queue dead-letters it anyway.
            1 => {
                charge_customer(message.order_id, message.amount_cents).await?;
                dead_letters.push(*message);
            }
            // The gateway is down: the task fails, nothing is stored, the message is dead.
            _ => {
                GATEWAY_UP.store(false, Ordering::SeqCst);
                let failed = charge_customer(message.order_id, message.amount_cents).await;
                assert!(matches!(failed, Err(ChargeError::GatewayDown)));
                GATEWAY_UP.store(true, Ordering::SeqCst);
                dead_letters.push(*message);
            }
        }
    }
    Ok(dead_letters)
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
    let store = idempotask::installed().ok_or(Error::NotConfigured)?;
    // Fresh orders per run, so that a shared Redis does not remember an earlier run.
    let first_order = u64::try_from(SystemTime::now().duration_since(UNIX_EPOCH)?.as_micros())?;
    let messages: Vec<Message> = (0..9)
        .map(|i| Message {
            order_id: first_order + i,
            amount_cents: 1_000 + i * 100,
        })
        .collect();

    let dead_letters = first_deliveries(&messages).await?;

    // A late redelivery of the last failed order is running while the operator replays.
    let running = *dead_letters.last().ok_or("no dead letters")?;
    let (started_tx, started_rx) = oneshot::channel();
    let (finish_tx, finish_rx) = oneshot::channel::<()>();
    let late_delivery = tokio::spawn(
        CHARGE_CUSTOMER
            .call(running.key())
            .store(store.clone())
            .run(async move {
                let _ = started_tx.send(());
                let _ = finish_rx.await;
                CHARGES
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .push(running.order_id);
                Ok::<_, Error>(format!("ch_{}_{}", running.order_id, running.amount_cents))
            }),
    );
    started_rx.await?;

    // The replay: status first, then only the unknown ones.
    println!("store:             {backend}");
    println!("dead letters:      {}", dead_letters.len());
    let (mut skipped, mut kept, mut replayed) = (0, 0, 0);
    let mut still_dead = Vec::new();
    for message in &dead_letters {
        let order = message.order_id;
        match CHARGE_CUSTOMER.status(message.key(), &store).await? {
            Status::Done(done) => {
                skipped += 1;
                let result = match done.marker.result() {
                    StoredResult::Json(json) => json.get().to_owned(),
                    _ => "(not storable)".to_owned(),
                };
                println!("  order {order}: done already (result {result}), skipped");
            }
            Status::Locked { lock_ttl, .. } => {
                kept += 1;
                still_dead.push(*message);
                println!(
                    "  order {order}: running now (lock expires in {} ms), kept for later",
                    lock_ttl.as_millis()
                );
            }
            _ => {
                replayed += 1;
                let charge = charge_customer(order, message.amount_cents).await?;
                println!("  order {order}: unknown, replayed: {charge}");
            }
        }
    }
    let _ = finish_tx.send(());
    late_delivery.await??;

    let charges = CHARGES
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    let mut per_order: HashMap<u64, usize> = HashMap::new();
    for order in &charges {
        *per_order.entry(*order).or_default() += 1;
    }
    println!("done, skipped:     {skipped}");
    println!("locked, kept:      {kept}");
    println!("unknown, replayed: {replayed}");
    println!("left in the queue: {}", still_dead.len());
    println!(
        "orders charged:    {} of {}",
        per_order.len(),
        messages.len()
    );
    println!(
        "charged twice:     {}",
        per_order.values().filter(|n| **n > 1).count()
    );
    Ok(())
}
