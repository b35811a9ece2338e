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
//! `REDIS_CLUSTER_URLS` (comma-separated seed nodes) puts the store on a Redis Cluster instead.
//!
//! ```toml
//! [dependencies]
//! idempotask = "0.1"
//! idempotask-redis = "0.1"
//! tokio = { version = "1", features = ["macros", "rt-multi-thread", "sync", "time"] }
//! ```

use std::collections::BTreeSet;
use std::env::var;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use idempotask::operator::{Status, StoredResult};
use idempotask::store::SharedStore;
use idempotask::{MemoryStore, Task, idempotent_task};
use idempotask_redis::{RedisClusterStore, RedisStore};
use tokio::sync::oneshot;

/// The orders the payment gateway charged, once per charge: what the customers' statements show.
static CHARGES: Mutex<Vec<u64>> = Mutex::new(Vec::new());
/// Whether the payment gateway answers.
static GATEWAY_UP: AtomicBool = AtomicBool::new(true);

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The task the queue delivers; its key is the order.
#[idempotent_task(key = "order-charge-{order_id}", lock_ttl = 30)]
async fn charge_customer(order_id: u64) -> Result<String, BoxError> {
    if !GATEWAY_UP.load(Ordering::SeqCst) {
        return Err("the payment gateway is down".into());
    }
    CHARGES.lock().unwrap().push(order_id);
    Ok(format!("ch_{order_id}"))
}

/// The same task, seen from the operator's side: its name, to ask for a key's status.
static CHARGE_CUSTOMER: Task = Task::new("charge_customer");

/// The key the task computes for an order (the attribute's `key` template).
fn key(order_id: u64) -> String {
    format!("order-charge-{order_id}")
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    // A Redis Cluster or a Redis when the environment names one, else the in-memory store.
    let store = match (var("REDIS_CLUSTER_URLS"), var("REDIS_URL")) {
        (Ok(urls), _) => SharedStore::new(RedisClusterStore::connect(urls.split(',')).await?),
        (_, Ok(url)) => SharedStore::new(RedisStore::connect(&url).await?),
        _ => SharedStore::new(MemoryStore::new()),
    };
    idempotask::install(store.clone());
    // Fresh orders per run, so that a shared Redis does not remember an earlier run.
    let first = u64::try_from(SystemTime::now().duration_since(UNIX_EPOCH)?.as_micros())?;

    // The first deliveries: acked; charged, then the worker died before the ack; failed while
    // the gateway was down, nothing stored. The last two kinds are dead-lettered.
    let mut dead_letters = Vec::new();
    for (i, order) in (first..first + 9).enumerate() {
        GATEWAY_UP.store(i % 3 != 2, Ordering::SeqCst);
        let charged = charge_customer(order).await;
        assert_eq!(charged.is_ok(), i % 3 != 2);
        if i % 3 != 0 {
            dead_letters.push(order);
        }
    }
    GATEWAY_UP.store(true, Ordering::SeqCst);

    // A late redelivery of the last failed order is running while the operator replays.
    let running = *dead_letters.last().ok_or("no dead letters")?;
    let (started_tx, started) = oneshot::channel();
    let (finish, finish_rx) = oneshot::channel::<()>();
    let late_delivery = tokio::spawn(CHARGE_CUSTOMER.call(key(running)).run(async move {
        let _ = started_tx.send(());
        let _ = finish_rx.await;
        CHARGES.lock().unwrap().push(running);
        Ok::<_, BoxError>(format!("ch_{running}"))
    }));
    started.await?;

    // The replay: status first, then only the unknown ones.
    let (mut skipped, mut kept, mut replayed) = (0, 0, 0);
    for &order in &dead_letters {
        match CHARGE_CUSTOMER.status(key(order), &store).await? {
            Status::Done(done) => {
                skipped += 1;
                if let StoredResult::Json(result) = done.marker.result() {
                    println!(
                        "  order {order}: done already (result {}), skipped",
                        result.get()
                    );
                }
            }
            Status::Locked { lock_ttl, .. } => {
                kept += 1;
                let expires = lock_ttl.as_millis();
                println!("  order {order}: running now (lock expires in {expires} ms), kept");
            }
            _ => {
                replayed += 1;
                let charge = charge_customer(order).await?;
                println!("  order {order}: unknown, replayed: {charge}");
            }
        }
    }
    let _ = finish.send(());
    late_delivery.await??;

    let charges = CHARGES.lock().unwrap().clone();
    let orders: BTreeSet<u64> = charges.iter().copied().collect();
    println!("dead letters:      {}", dead_letters.len());
    println!("done, skipped:     {skipped}");
    println!("locked, kept:      {kept}");
    println!("unknown, replayed: {replayed}");
    println!("orders charged:    {} of 9", orders.len());
    println!("charged twice:     {}", charges.len() - orders.len());
    Ok(())
}
