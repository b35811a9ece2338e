//! An HTTP payments service whose `POST /payments` takes an `Idempotency-Key`: a client that
//! retries after a timeout, or sends the same payment twice at once, is charged once, and gets
//! the first response again (`Idempotent-Replayed: true`).
//!
//! On start the service prints `listening on http://ADDR`, and `charging KEY` each time the
//! handler really runs. With `REDIS_URL` set it keeps its idempotency keys and its count of
//! charges (the number in each payment id) in that Redis, so both outlive the process; else
//! both are in memory.
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:6379 PORT=8080 cargo run --example http_payments --features http
//! curl -i -X POST localhost:8080/payments -H 'Idempotency-Key: "order-42"' \
//!     -H 'content-type: application/json' -d '{"amount": 4200, "currency": "EUR"}'
//! ```
//! `PORT` (default: a free port), `PAYMENT_PAUSE_MS` (how long a charge takes, default 0) and
//! `LOCK_TTL_MS` (how long a crashed server's lock holds a key, default 30000) are read from
//! the environment.
//!
//! ```toml
//! [dependencies]
//! idempotask = "0.1"
//! idempotask-http = "0.1"
//! idempotask-redis = "0.1"
//! axum = { version = "0.8", default-features = false, features = ["tokio", "http1", "json"] }
//! redis = { version = "1", default-features = false, features = ["tokio-comp", "connection-manager"] }
//! serde = { version = "1", features = ["derive"] }
//! tokio = { version = "1", features = ["macros", "rt-multi-thread", "net", "time"] }
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::{Json, Router};
use idempotask::{MemoryStore, Task};
use idempotask_http::Idempotency;
use idempotask_redis::RedisStore;
use redis::AsyncCommands;
use redis::aio::ConnectionManager;
use serde::{Deserialize, Serialize};

/// Where the count of charges lives on Redis: next to the keys, so a test that kills the
/// process reads what the kill cannot take away.
const CHARGES_KEY: &str = "http_payments:charges";

/// The ledger the handler writes to: the side effect, one count per charge.
#[derive(Clone)]
enum Ledger {
    Memory(Arc<AtomicU64>),
    Redis(ConnectionManager),
}

/// A payment as the client asks for it, and as answered with the id it was charged under.
#[derive(Deserialize, Serialize)]
struct Payment {
    #[serde(default)]
    id: String,
    amount: u64,
    currency: String,
}

/// `POST /payments`: charges the payment. Behind the layer it runs once per key.
async fn create_payment(
    State((ledger, pause)): State<(Ledger, Duration)>,
    headers: HeaderMap,
    Json(mut payment): Json<Payment>,
) -> Result<(StatusCode, Json<Payment>), (StatusCode, String)> {
    let key = headers
        .get("idempotency-key")
        .and_then(|value| value.to_str().ok())
        .unwrap_or("(none)");
    println!("charging {key}");
    // The payment gateway's call would take this long.
    tokio::time::sleep(pause).await;
    let number = match ledger {
        Ledger::Memory(count) => count.fetch_add(1, Ordering::SeqCst) + 1,
        Ledger::Redis(mut redis) => redis.incr(CHARGES_KEY, 1).await.map_err(|err| {
            // A 5xx: the layer releases the key, so the client's retry charges.
            (StatusCode::SERVICE_UNAVAILABLE, err.to_string())
        })?,
    };
    payment.id = format!("pay_{number}");
    Ok((StatusCode::CREATED, Json(payment)))
}

/// The environment variable `name`, a number of milliseconds, else `default`.
fn millis_from_env(name: &str, default: u64) -> Result<Duration, std::num::ParseIntError> {
    std::env::var(name)
        .map_or(Ok(default), |ms| ms.parse())
        .map(Duration::from_millis)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let ledger = if let Ok(url) = std::env::var("REDIS_URL") {
        // The idempotency keys and the ledger in the same Redis.
        idempotask::install(RedisStore::connect(&url).await?);
        let client = redis::Client::open(url.as_str())?;
        Ledger::Redis(ConnectionManager::new(client).await?)
    } else {
        idempotask::install(MemoryStore::new());
        Ledger::Memory(Arc::new(AtomicU64::new(0)))
    };
    let pause = millis_from_env("PAYMENT_PAUSE_MS", 0)?;
    let payments = Task::new("http_payments").lock_ttl(millis_from_env("LOCK_TTL_MS", 30_000)?);
    let router = Router::new()
        .route(
            "/payments",
            // Only this route takes keys; a payment without one is refused.
            post(create_payment).layer(Idempotency::new(payments).require_key(true)),
        )
        .with_state((ledger, pause));

    let port = std::env::var("PORT").unwrap_or_else(|_| "0".to_owned());
    let listener = tokio::net::TcpListener::bind(format!("127.0.0.1:{port}")).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, router).await?;
    Ok(())
}
