//! A Rust worker that shares its units with Python workers: the task `settle_order` here and the
//! Python function of the same name under `@idempotent_task` (the package in `python/`) name the
//! same units, so a unit settled by either is settled once and replays in the other.
//!
//! It settles orders `1..=$ORDERS` (200 by default), `$CONCURRENCY` at once (8), in ascending
//! order, or descending with `ORDER=descending`. Settling pushes `rust:<order>` onto the Redis
//! list `ledger:settlements` (the side effect, which nobody takes back) and answers a settlement
//! whose JSON stresses the shared encoding: an integer above 2^100, text beyond ASCII, nested
//! objects. It prints `ready` once connected and starts on a line of standard input (press
//! Enter, so that a Python worker can start at the same time), then one line per order:
//!
//! ```text
//! order 5: executed {"order_id":5,"settled_by":"rust","total":1267650600228229401496703205881,…}
//! order 150: replayed {"order_id":150,"settled_by":"python",…}
//! executed: 104
//! replayed: 96
//! ```
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --example shared_units --features redis
//! ```
//! `python/tests/test_interop.py` runs it next to a Python worker on the same orders.
//!
//! ```toml
//! [dependencies]
//! idempotask = "0.1"
//! idempotask-redis = "0.1"
//! redis = { version = "1", default-features = false, features = ["tokio-comp"] }
//! serde = { version = "1", features = ["derive"] }
//! serde_json = "1"
//! tokio = { version = "1", features = ["macros", "rt-multi-thread", "io-std", "io-util", "time", "sync"] }
//! ```

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use idempotask::idempotent_task;
use idempotask::store::SharedStore;
use idempotask_redis::RedisStore;
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::Semaphore;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A settlement as both languages write it: the Python worker returns a dict with these
/// fields, and each side reads the other's from the store.
#[derive(Debug, Serialize, Deserialize)]
struct Settlement {
    order_id: u64,
    settled_by: String,
    /// Above 2^64: JSON carries it exactly, and so do both sides.
    total: u128,
    note: String,
    lines: Vec<Line>,
    meta: Meta,
}

#[derive(Debug, Serialize, Deserialize)]
struct Line {
    sku: String,
    quantity: u32,
    price: f64,
}

#[derive(Debug, Serialize, Deserialize)]
struct Meta {
    flags: Vec<bool>,
    coupon: Option<String>,
}

/// The orders this process settled (ran the body for); the others it was answered.
static SETTLED_HERE: Mutex<Option<HashSet<u64>>> = Mutex::new(None);

/// Settles an order: one entry in the ledger list, the settlement as the answer. The key and
/// the fingerprint are the Python task's: `order-settle-{order_id}`, `[amount_cents]`.
#[idempotent_task(key = "order-settle-{order_id}", fingerprint = [amount_cents], lock_ttl = 10)]
async fn settle_order(
    ledger: &MultiplexedConnection,
    order_id: u64,
    amount_cents: u64,
) -> Result<Settlement, BoxError> {
    let mut ledger = ledger.clone();
    // The settlement's own time, so that the other side meets units in flight.
    tokio::time::sleep(Duration::from_millis(5)).await;
    let _: u64 = ledger
        .rpush("ledger:settlements", format!("rust:{order_id}"))
        .await?;
    SETTLED_HERE
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get_or_insert_with(HashSet::new)
        .insert(order_id);
    Ok(Settlement {
        order_id,
        settled_by: "rust".to_owned(),
        total: (1_u128 << 100) + u128::from(order_id) * u128::from(amount_cents),
        note: format!("reçu ✓ 注文 {order_id} 🚀"),
        lines: vec![
            Line {
                sku: "A-1".to_owned(),
                quantity: 2,
                price: 12.5,
            },
            Line {
                sku: "Ω".to_owned(),
                quantity: 1,
                price: 0.1,
            },
        ],
        meta: Meta {
            flags: vec![true, false],
            coupon: None,
        },
    })
}

/// An order's amount: both sides fingerprint the same one.
fn amount_cents(order_id: u64) -> u64 {
    order_id * 100 + 99
}

fn settled_here(order_id: u64) -> bool {
    SETTLED_HERE
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .as_ref()
        .is_some_and(|settled| settled.contains(&order_id))
}

fn number(variable: &str, default: u64) -> Result<u64, BoxError> {
    match std::env::var(variable) {
        Ok(value) => Ok(value.parse().map_err(|_| format!("{variable}={value}"))?),
        Err(_) => Ok(default),
    }
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let url = std::env::var("REDIS_URL").map_err(|_| "set REDIS_URL: the units live there")?;
    let orders = number("ORDERS", 200)?;
    let concurrency = usize::try_from(number("CONCURRENCY", 8)?)?;
    let descending = std::env::var("ORDER").is_ok_and(|order| order == "descending");
    idempotask::install(SharedStore::new(RedisStore::connect(&url).await?));
    let ledger = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    println!("ready");
    let mut go = String::new();
    BufReader::new(tokio::io::stdin())
        .read_line(&mut go)
        .await?;

    let slots = Arc::new(Semaphore::new(concurrency));
    let mut deliveries = Vec::new();
    let ids: Vec<u64> = if descending {
        (1..=orders).rev().collect()
    } else {
        (1..=orders).collect()
    };
    for order_id in ids {
        let slot = Arc::clone(&slots).acquire_owned().await?;
        let ledger = ledger.clone();
        deliveries.push(tokio::spawn(async move {
            let settlement = settle_order(&ledger, order_id, amount_cents(order_id)).await;
            drop(slot);
            settlement.map(|settlement| (order_id, settlement))
        }));
    }
    let (mut executed, mut replayed) = (0, 0);
    for delivery in deliveries {
        let (order_id, settlement) = delivery.await??;
        let how = if settled_here(order_id) {
            executed += 1;
            "executed"
        } else {
            replayed += 1;
            "replayed"
        };
        println!(
            "order {order_id}: {how} {}",
            serde_json::to_string(&settlement)?
        );
    }
    println!("executed: {executed}");
    println!("replayed: {replayed}");
    Ok(())
}
