//! The payment case: a Redis lock and marker in front of a payment gateway, and a PostgreSQL
//! `UNIQUE` constraint as the second line of defence.
//!
//! One order is delivered eleven times (eight at once, then three in a row); the run prints how
//! many times the gateway charged and how many rows the table holds. The argument picks the run:
//! - none: with idempotask, the gateway charges once and the table holds one row;
//! - `constraint-only` (no lock): every delivery charges the gateway; the table still holds one
//!   row, so the books look right while the customer paid several times;
//! - `lock-expired` (a 200 ms `lock_ttl` under a 600 ms gateway call): a second delivery takes
//!   the expired lock and charges again; idempotask logs the lost lock, the constraint keeps the
//!   table to one row.
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:6379 DATABASE_URL=postgres://postgres@127.0.0.1/postgres \
//!     cargo run --example charge_customer --features redis [-- constraint-only | lock-expired]
//! ```
//! `REDIS_CLUSTER_URLS` (comma-separated seed nodes) puts the store on a Redis Cluster instead.
//!
//! ```toml
//! [dependencies]
//! idempotask = "0.1"
//! idempotask-redis = "0.1"
//! tokio = { version = "1", features = ["macros", "rt-multi-thread", "time"] }
//! tokio-postgres = "0.7"
//! tracing-subscriber = { version = "0.3", default-features = false, features = ["fmt", "ansi"] }
//! ```

use std::env::{args, var};
use std::io::IsTerminal;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use idempotask::idempotent_task;
use idempotask::store::SharedStore;
use idempotask_redis::{RedisClusterStore, RedisStore};
use tokio_postgres::Client;
use tracing_subscriber::fmt;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The charges the payment gateway made: what the customer's statement shows.
static GATEWAY_CHARGES: AtomicU32 = AtomicU32::new(0);

/// Charges the gateway (which takes `takes`), then records the charge and answers its row.
/// A conflict on the key means an earlier delivery recorded it already: the no-op update
/// makes `RETURNING` answer that row.
async fn charge_and_record(db: &Client, order_id: i64, takes: Duration) -> Result<i64, BoxError> {
    tokio::time::sleep(takes).await;
    let n = GATEWAY_CHARGES.fetch_add(1, Ordering::SeqCst) + 1;
    let (key, gateway_id) = (format!("order-charge-{order_id}"), format!("gw_{n}"));
    let sql =
        "INSERT INTO charges (idempotency_key, order_id, gateway_charge_id) VALUES ($1, $2, $3)
         ON CONFLICT (idempotency_key) DO UPDATE SET order_id = EXCLUDED.order_id RETURNING id";
    let row = db.query_one(sql, &[&key, &order_id, &gateway_id]).await?;
    Ok(row.get(0))
}

// Boxed: tokio-postgres futures are large, and this one lives inside the task's future.
#[idempotent_task(key = "order-charge-{order_id}", lock_ttl = 30)]
async fn charge_customer(db: &Client, order_id: i64) -> Result<i64, BoxError> {
    Box::pin(charge_and_record(db, order_id, Duration::from_millis(100))).await
}

/// A gateway call (600 ms) that outlives its lock (200 ms).
#[idempotent_task(
    key = "order-charge-{order_id}",
    lock_ttl = "200ms",
    name = "charge_customer_short_lock"
)]
async fn charge_with_short_lock(db: &Client, order_id: i64) -> Result<i64, BoxError> {
    Box::pin(charge_and_record(db, order_id, Duration::from_millis(600))).await
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    // The lost lock is logged as a warning.
    let ansi = std::io::stderr().is_terminal();
    fmt().without_time().with_ansi(ansi).init();
    let run = args().nth(1).unwrap_or("with-idempotask".into());
    let (unlocked, short_lock) = (run == "constraint-only", run == "lock-expired");
    idempotask::install(match var("REDIS_CLUSTER_URLS") {
        Ok(urls) => SharedStore::new(RedisClusterStore::connect(urls.split(',')).await?),
        Err(_) => SharedStore::new(RedisStore::connect(&var("REDIS_URL")?).await?),
    });
    let database_url = var("DATABASE_URL")?;
    let (db, connection) = tokio_postgres::connect(&database_url, tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    db.batch_execute(
        "CREATE TABLE IF NOT EXISTS charges (id bigserial PRIMARY KEY,
             idempotency_key text UNIQUE NOT NULL, order_id bigint NOT NULL,
             gateway_charge_id text NOT NULL, created_at timestamptz NOT NULL DEFAULT now())",
    )
    .await?;
    // A fresh order per run, so that reruns against the same servers start clean.
    let next = "SELECT coalesce(max(order_id), 0) + 1 FROM charges";
    let order_id: i64 = db.query_one(next, &[]).await?.get(0);
    let db = Arc::new(db);

    let deliver = |db: Arc<Client>| async move {
        if unlocked {
            Box::pin(charge_and_record(&db, order_id, Duration::from_millis(100))).await
        } else if short_lock {
            Box::pin(charge_with_short_lock(&db, order_id)).await
        } else {
            Box::pin(charge_customer(&db, order_id)).await
        }
    };
    let mut results = Vec::new();
    if short_lock {
        // The second delivery arrives after the first one's lock expired, while it still runs.
        let first = tokio::spawn(deliver(db.clone()));
        tokio::time::sleep(Duration::from_millis(300)).await;
        results.push(deliver(db.clone()).await?);
        results.push(first.await??);
    } else {
        let at_once: Vec<_> = (0..8).map(|_| tokio::spawn(deliver(db.clone()))).collect();
        for delivery in at_once {
            results.push(delivery.await??);
        }
        for _ in 0..3 {
            results.push(deliver(db.clone()).await?);
        }
    }
    let count = "SELECT count(*) FROM charges WHERE order_id = $1";
    let rows: i64 = db.query_one(count, &[&order_id]).await?.get(0);
    let same = results.iter().filter(|r| **r == results[0]).count();
    let charges = GATEWAY_CHARGES.load(Ordering::SeqCst);
    println!("run:             {run}");
    println!("deliveries:      {}", results.len());
    println!("gateway charges: {charges}");
    println!("table rows:      {rows}");
    println!("same result:     {same}");
    Ok(())
}
