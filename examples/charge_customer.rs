//! The payment case: a Redis lock and marker in front of a payment gateway, and a PostgreSQL
//! `UNIQUE` constraint as the second line of defence.
//!
//! Three runs of the same deliveries (eight at once, then three in a row) show what each line
//! does:
//! - **with idempotask**: the gateway is charged once and the table holds one row;
//! - **constraint only** (no lock): every delivery charges the gateway; the table still holds
//!   one row, so the books look right while the customer paid eight times;
//! - **lock expired mid-task** (`lock_ttl` shorter than the gateway call): a second delivery
//!   takes the lock and charges again; idempotask reports the lost lock, the constraint keeps
//!   the table consistent.
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:6379 DATABASE_URL=postgres://postgres@127.0.0.1/postgres \
//!     cargo run --example charge_customer --features redis
//! ```
//!
//! It needs, next to `idempotask`:
//!
//! ```toml
//! [dependencies]
//! idempotask = "0.1"
//! idempotask-redis = "0.1"
//! serde = { version = "1", features = ["derive"] }
//! thiserror = "2"
//! tokio = { version = "1", features = ["macros", "rt-multi-thread", "time"] }
//! tokio-postgres = "0.7"
//! tracing-subscriber = { version = "0.3", default-features = false, features = ["fmt", "ansi"] }
//! ```

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use idempotask::idempotent_task;
use idempotask::store::{SharedStore, StoreError};
use idempotask_redis::{RedisClusterStore, RedisStore};
use serde::{Deserialize, Serialize};
use tokio_postgres::NoTls;

#[derive(Debug, thiserror::Error)]
enum PaymentError {
    #[error("database: {0}")]
    Database(#[from] tokio_postgres::Error),
    #[error(transparent)]
    Idempotency(#[from] idempotask::Error),
}

/// The charge as recorded in our database.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct ChargeId(i64);

/// A payment gateway that counts the charges it makes, per order.
#[derive(Default)]
struct Gateway {
    charges: AtomicU32,
}

impl Gateway {
    async fn charge(&self, amount_cents: i64, takes: Duration) -> String {
        tokio::time::sleep(takes).await;
        let n = self.charges.fetch_add(1, Ordering::SeqCst) + 1;
        format!("gw_{amount_cents}_{n}")
    }
}

struct Payments {
    db: tokio_postgres::Client,
    gateway: Gateway,
    store: SharedStore,
}

impl Payments {
    /// Charges the gateway (which takes `takes`), then records the charge; a conflict on the
    /// idempotency key means an earlier delivery recorded it already, which counts as success.
    ///
    /// Boxed: tokio-postgres futures are large, and this one lives inside the task's future.
    fn charge_and_record(
        &self,
        order_id: i64,
        amount_cents: i64,
        takes: Duration,
    ) -> Pin<Box<dyn Future<Output = Result<ChargeId, PaymentError>> + Send + '_>> {
        Box::pin(async move {
            let key = format!("order-charge-{order_id}");
            let gateway_id = self.gateway.charge(amount_cents, takes).await;
            let inserted = self
                .db
                .query_opt(
                    "INSERT INTO charges (idempotency_key, order_id, amount_cents, gateway_charge_id)
                     VALUES ($1, $2, $3, $4)
                     ON CONFLICT (idempotency_key) DO NOTHING
                     RETURNING id",
                    &[&key, &order_id, &amount_cents, &gateway_id],
                )
                .await?;
            let id = match inserted {
                Some(row) => row.get(0),
                None => self
                    .db
                    .query_one("SELECT id FROM charges WHERE idempotency_key = $1", &[&key])
                    .await?
                    .get(0),
            };
            Ok(ChargeId(id))
        })
    }

    #[idempotent_task(key = "order-charge-{order_id}", store = self.store, lock_ttl = 30)]
    async fn charge_customer(
        &self,
        order_id: i64,
        amount_cents: i64,
    ) -> Result<ChargeId, PaymentError> {
        self.charge_and_record(order_id, amount_cents, Duration::from_millis(100))
            .await
    }

    /// The same charge without idempotask: only the database constraint protects it.
    async fn charge_with_constraint_only(
        &self,
        order_id: i64,
        amount_cents: i64,
    ) -> Result<ChargeId, PaymentError> {
        self.charge_and_record(order_id, amount_cents, Duration::from_millis(100))
            .await
    }

    /// A gateway call (600 ms) that outlives its lock (200 ms).
    #[idempotent_task(key = "order-charge-{order_id}", store = self.store, lock_ttl = "200ms", name = "charge_customer_short_lock")]
    async fn charge_with_short_lock(
        &self,
        order_id: i64,
        amount_cents: i64,
    ) -> Result<ChargeId, PaymentError> {
        self.charge_and_record(order_id, amount_cents, Duration::from_millis(600))
            .await
    }

    async fn rows(&self, order_id: i64) -> Result<i64, PaymentError> {
        Ok(self
            .db
            .query_one(
                "SELECT count(*) FROM charges WHERE order_id = $1",
                &[&order_id],
            )
            .await?
            .get(0))
    }
}

/// Eight concurrent deliveries, then three in a row; answers how many got the same charge.
async fn deliver<F, Fut>(deliver_once: F) -> Result<usize, PaymentError>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<ChargeId, PaymentError>> + Send + 'static,
{
    let concurrent: Vec<_> = (0..8).map(|_| tokio::spawn(deliver_once())).collect();
    let mut results = Vec::new();
    for delivery in concurrent {
        results.push(delivery.await.expect("delivery task")?);
    }
    for _ in 0..3 {
        results.push(deliver_once().await?);
    }
    Ok(results.iter().filter(|r| **r == results[0]).count())
}

/// Delivers one order as the named run does; answers (deliveries, how many got the same charge).
async fn scenario(
    run: &str,
    order_id: i64,
    payments: &Arc<Payments>,
) -> Result<(usize, usize), PaymentError> {
    match run {
        "with idempotask" | "constraint only" => {
            let with_lock = run == "with idempotask";
            let p = payments.clone();
            let same = Box::pin(deliver(move || {
                let p = p.clone();
                async move {
                    if with_lock {
                        Box::pin(p.charge_customer(order_id, 1_200)).await
                    } else {
                        Box::pin(p.charge_with_constraint_only(order_id, 1_200)).await
                    }
                }
            }))
            .await?;
            Ok((11, same))
        }
        _ => {
            // The second delivery arrives after the first one's lock expired.
            let first = {
                let p = payments.clone();
                tokio::spawn(
                    async move { Box::pin(p.charge_with_short_lock(order_id, 1_200)).await },
                )
            };
            tokio::time::sleep(Duration::from_millis(300)).await;
            let second = Box::pin(payments.charge_with_short_lock(order_id, 1_200)).await?;
            let first = first.await.expect("delivery task")?;
            Ok((2, usize::from(first == second) + 1))
        }
    }
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
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_target(false)
        .without_time()
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let database_url =
        std::env::var("DATABASE_URL").map_err(|_| "set DATABASE_URL (postgres://…)")?;

    let (db, connection) = tokio_postgres::connect(&database_url, NoTls).await?;
    tokio::spawn(async move {
        if let Err(err) = connection.await {
            eprintln!("database connection: {err}");
        }
    });
    db.batch_execute(
        "CREATE TABLE IF NOT EXISTS charges (
             id bigserial PRIMARY KEY,
             idempotency_key text UNIQUE NOT NULL,
             order_id bigint NOT NULL,
             amount_cents bigint NOT NULL,
             gateway_charge_id text NOT NULL,
             created_at timestamptz NOT NULL DEFAULT now()
         )",
    )
    .await?;
    // Fresh orders per run, so that reruns against the same servers start clean.
    let base: i64 = db
        .query_one("SELECT coalesce(max(order_id), 0) + 1 FROM charges", &[])
        .await?
        .get(0);

    let mut failures = Vec::new();
    println!(
        "{:<26} {:>10} {:>16} {:>10} {:>14}",
        "run", "deliveries", "gateway charges", "table rows", "same result"
    );
    for (run, order_id) in [
        ("with idempotask", base),
        ("constraint only", base + 1),
        ("lock expired mid-task", base + 2),
    ] {
        let (client, connection) = tokio_postgres::connect(&database_url, NoTls).await?;
        tokio::spawn(connection);
        let payments = Arc::new(Payments {
            db: client,
            gateway: Gateway::default(),
            // REDIS_URL, or REDIS_CLUSTER_URLS for a cluster.
            store: redis_from_env()
                .await?
                .ok_or("set REDIS_URL (redis://…)")?
                .0,
        });
        let (deliveries, same) = scenario(run, order_id, &payments).await?;
        let charges = payments.gateway.charges.load(Ordering::SeqCst);
        let rows = payments.rows(order_id).await?;
        println!("{run:<26} {deliveries:>10} {charges:>16} {rows:>10} {same:>14}");
        if rows != 1 {
            failures.push(format!("{run}: {rows} rows"));
        }
        if run == "with idempotask" && charges != 1 {
            failures.push(format!("{run}: the gateway charged {charges} times"));
        }
        if run != "with idempotask" && charges < 2 {
            failures.push(format!(
                "{run}: expected the gap to show as a second gateway charge"
            ));
        }
    }
    println!(
        "the constraint keeps the table right; only the lock keeps the customer from paying twice"
    );
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("; ").into())
    }
}
