//! An HTTP payments service whose `POST /payments` takes an `Idempotency-Key`: a client that
//! retries after a timeout, or sends the same payment twice at once, is charged once, and gets
//! the first response again (`Idempotent-Replayed: true`).
//!
//! `GET /executions` answers how many times the payment handler really ran. On start the
//! service prints `listening on http://ADDR`, and `charging KEY` each time the handler starts.
//! With `REDIS_URL` set it keeps its idempotency keys and its count of executions in that
//! Redis, so both outlive the process; else both are in memory.
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:6379 PORT=8080 cargo run --example http_payments --features http
//! curl -i -X POST localhost:8080/payments -H 'Idempotency-Key: "order-42"' \
//!     -H 'content-type: application/json' -d '{"amount": 4200, "currency": "EUR"}'
//! curl localhost:8080/executions
//! ```
//! `PORT` (default: a free port), `PAYMENT_PAUSE_MS` (how long a charge takes, default 0) and
//! `LOCK_TTL_MS` (how long a crashed server's lock holds a key, default 30000) are read from
//! the environment.
//!
//! It needs:
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
use axum::routing::{get, post};
use axum::{Json, Router};
use idempotask::{MemoryStore, Task};
use idempotask_http::Idempotency;
use idempotask_redis::RedisStore;
use redis::AsyncCommands;
use redis::aio::ConnectionManager;
use serde::{Deserialize, Serialize};

/// Where the count of executions lives: next to the keys, so a test that kills the process
/// reads what the kill cannot take away.
const EXECUTIONS_KEY: &str = "http_payments:executions";

/// The ledger the handler writes to: the side effect whose count `GET /executions` answers.
#[derive(Clone)]
enum Ledger {
    Memory(Arc<AtomicU64>),
    Redis(ConnectionManager),
}

impl Ledger {
    /// Records one charge; answers its number.
    async fn charge(&self) -> redis::RedisResult<u64> {
        match self {
            Self::Memory(count) => Ok(count.fetch_add(1, Ordering::SeqCst) + 1),
            Self::Redis(connection) => connection.clone().incr(EXECUTIONS_KEY, 1).await,
        }
    }

    async fn executions(&self) -> redis::RedisResult<u64> {
        match self {
            Self::Memory(count) => Ok(count.load(Ordering::SeqCst)),
            Self::Redis(connection) => {
                let count: Option<u64> = connection.clone().get(EXECUTIONS_KEY).await?;
                Ok(count.unwrap_or(0))
            }
        }
    }
}

#[derive(Clone)]
struct App {
    ledger: Ledger,
    pause: Duration,
}

#[derive(Deserialize)]
struct NewPayment {
    amount: u64,
    currency: String,
}

#[derive(Serialize)]
struct Payment {
    id: String,
    amount: u64,
    currency: String,
}

/// `POST /payments`: charges the payment. Behind the layer it runs once per key.
async fn create_payment(
    State(app): State<App>,
    headers: HeaderMap,
    Json(payment): Json<NewPayment>,
) -> Result<(StatusCode, Json<Payment>), (StatusCode, String)> {
    let key = headers
        .get("idempotency-key")
        .and_then(|value| value.to_str().ok())
        .unwrap_or("(none)");
    println!("charging {key}");
    // The payment gateway's call would take this long.
    tokio::time::sleep(app.pause).await;
    let number = app.ledger.charge().await.map_err(|err| {
        // A 5xx: the layer releases the key, so the client's retry charges.
        (StatusCode::SERVICE_UNAVAILABLE, err.to_string())
    })?;
    let payment = Payment {
        id: format!("pay_{number}"),
        amount: payment.amount,
        currency: payment.currency,
    };
    Ok((StatusCode::CREATED, Json(payment)))
}

/// `GET /executions`: how many times the payment handler really charged.
async fn executions(State(app): State<App>) -> Result<String, (StatusCode, String)> {
    app.ledger
        .executions()
        .await
        .map(|count| count.to_string())
        .map_err(|err| (StatusCode::SERVICE_UNAVAILABLE, err.to_string()))
}

fn millis_from_env(name: &str, default: u64) -> Duration {
    let millis = std::env::var(name).ok().map_or(default, |value| {
        value
            .parse()
            .unwrap_or_else(|_| panic!("{name} is not a number of milliseconds: {value}"))
    });
    Duration::from_millis(millis)
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
    let app = App {
        ledger,
        pause: millis_from_env("PAYMENT_PAUSE_MS", 0),
    };
    let payments = Task::new("http_payments").lock_ttl(millis_from_env("LOCK_TTL_MS", 30_000));
    let router = Router::new()
        .route(
            "/payments",
            // Only this route takes keys; a payment without one is refused.
            post(create_payment).layer(Idempotency::new(payments).require_key(true)),
        )
        .route("/executions", get(executions))
        .with_state(app);

    let port = std::env::var("PORT").unwrap_or_else(|_| "0".to_owned());
    let listener = tokio::net::TcpListener::bind(format!("127.0.0.1:{port}")).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, router).await?;
    Ok(())
}
