//! A webhook receiver that handles each event once, whatever its sender does.
//!
//! Webhook senders (GitHub, Stripe, Shopify) deliver each event at least once: they retry when
//! an answer does not come in time, and now and then deliver an event twice at once. Each
//! delivery carries the event's delivery id (`X-GitHub-Delivery`, here `X-Delivery-Id`), the
//! same on every retry. The receiver keys its handler by it, with the `Idempotency` layer
//! waiting for the first delivery's answer when a second arrives meanwhile, which is what a
//! sender wants: the answer, not a `409`.
//!
//! `POST /webhooks` takes `{"kind": "order.paid", "order": 3}`. On start the receiver prints
//! `listening on http://ADDR`, and `handled ID: order.paid 3` each time the handler runs: once
//! per delivery id, however often the event is sent. With `REDIS_URL` set the delivery ids are
//! kept in that Redis, else in memory. `HANDLING_MS` (default 0) is how long an event takes,
//! longer than a sender waits in `tests/examples.rs`, which retries on timeout and sends events
//! twice at once.
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:6379 PORT=8080 cargo run --example webhook_receiver --features http
//! curl -X POST localhost:8080/webhooks -H 'X-Delivery-Id: 72d3162e' \
//!     -H 'content-type: application/json' -d '{"kind": "order.paid", "order": 3}'
//! ```
//!
//! ```toml
//! [dependencies]
//! idempotask = "0.1"
//! idempotask-http = "0.1"
//! idempotask-redis = "0.1"
//! axum = { version = "0.8", default-features = false, features = ["tokio", "http1", "json"] }
//! serde = { version = "1", features = ["derive"] }
//! serde_json = "1"
//! tokio = { version = "1", features = ["macros", "rt-multi-thread", "net", "time"] }
//! ```

use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, HeaderName};
use axum::routing::post;
use axum::{Json, Router};
use idempotask::store::SharedStore;
use idempotask::{MemoryStore, Task};
use idempotask_http::Idempotency;
use idempotask_redis::RedisStore;
use serde::Deserialize;
use serde_json::{Value, json};

#[derive(Deserialize)]
struct Event {
    kind: String,
    order: u32,
}

/// `POST /webhooks`: handles the event. Behind the layer it runs once per delivery id.
async fn receive(
    State(handling): State<Duration>,
    headers: HeaderMap,
    Json(event): Json<Event>,
) -> Json<Value> {
    let delivery = headers.get("x-delivery-id").and_then(|id| id.to_str().ok());
    let delivery = delivery.unwrap_or_default().to_owned();
    // The work an event asks for would take this long.
    tokio::time::sleep(handling).await;
    println!("handled {delivery}: {} {}", event.kind, event.order);
    Json(json!({ "handled": delivery, "kind": event.kind }))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store = match std::env::var("REDIS_URL") {
        Ok(url) => SharedStore::new(RedisStore::connect(&url).await?),
        Err(_) => SharedStore::new(MemoryStore::new()),
    };
    let webhooks = Idempotency::new(Task::new("webhook_events"))
        .store(store)
        .key_header(HeaderName::from_static("x-delivery-id"))
        .require_key(true)
        // A delivery that arrives while the same event is being handled waits for its answer.
        .wait_for_result(Duration::from_secs(10));
    let handling = std::env::var("HANDLING_MS").map_or(Ok(0), |ms| ms.parse())?;
    let receiver = Router::new()
        .route("/webhooks", post(receive))
        .layer(webhooks)
        .with_state(Duration::from_millis(handling));
    let port = std::env::var("PORT").unwrap_or_else(|_| "0".to_owned());
    let listener = tokio::net::TcpListener::bind(format!("127.0.0.1:{port}")).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, receiver).await?;
    Ok(())
}
