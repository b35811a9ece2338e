//! A webhook receiver that handles each event once, whatever its sender does.
//!
//! Webhook senders (GitHub, Stripe, Shopify) deliver each event at least once: they retry when
//! an answer does not come in time, and now and then deliver an event twice at once. Each
//! delivery carries the event's delivery id (`X-GitHub-Delivery`, here `X-Delivery-Id`), the
//! same on every retry. The receiver keys its handler by it, with the `Idempotency` layer
//! waiting for the first delivery's answer when a second arrives meanwhile, which is what a
//! sender wants: the answer, not a `409`.
//!
//! The sender here sends twelve events; two of them take the receiver longer than the sender
//! waits (so it times out and retries, again and again, until an answer comes), two are
//! delivered twice at once. The last line of output is one JSON summary: every event handled
//! once.
//!
//! ```text
//! cargo run --example webhook_receiver --features http
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --example webhook_receiver --features http
//! ```
//!
//! It needs:
//!
//! ```toml
//! [dependencies]
//! idempotask = "0.1"
//! idempotask-http = "0.1"
//! idempotask-redis = "0.1"
//! axum = { version = "0.8", default-features = false, features = ["tokio", "http1", "json"] }
//! reqwest = { version = "0.12", default-features = false }
//! serde = { version = "1", features = ["derive"] }
//! serde_json = "1"
//! tokio = { version = "1", features = ["macros", "rt-multi-thread", "net", "time"] }
//! ```

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::HeaderName;
use axum::routing::post;
use axum::{Json, Router};
use idempotask::store::SharedStore;
use idempotask::{MemoryStore, Task};
use idempotask_http::Idempotency;
use idempotask_redis::RedisStore;
use serde::{Deserialize, Serialize};
use serde_json::json;

const EVENTS: u32 = 12;
/// The receiver takes this long over these events, longer than the sender waits.
const SLOW: [u32; 2] = [3, 8];
const SLOW_HANDLING: Duration = Duration::from_millis(1500);
/// The sender delivers these events twice at once.
const TWICE: [u32; 2] = [5, 10];
/// How long the sender waits for an answer before it retries.
const SENDER_TIMEOUT: Duration = Duration::from_millis(300);

#[derive(Serialize, Deserialize)]
struct Event {
    kind: String,
    order: u32,
}

/// What the receiver did: how many times it handled each event.
type Handled = Arc<Mutex<BTreeMap<String, u32>>>;

async fn receive(
    State(handled): State<Handled>,
    headers: axum::http::HeaderMap,
    Json(event): Json<Event>,
) -> Json<serde_json::Value> {
    let delivery = headers
        .get("x-delivery-id")
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    if SLOW.contains(&event.order) {
        tokio::time::sleep(SLOW_HANDLING).await;
    }
    *handled.lock().unwrap().entry(delivery.clone()).or_default() += 1;
    Json(json!({ "handled": delivery, "kind": event.kind }))
}

/// How one delivery attempt went, as the sender sees it.
#[derive(Default)]
struct Tally {
    attempts: u32,
    timeouts: u32,
    replayed: u32,
}

/// Delivers one event until it is answered with a 2xx, retrying on timeouts and errors as
/// webhook senders do; answers the body of that answer.
async fn deliver(
    client: &reqwest::Client,
    url: &str,
    delivery: &str,
    event: &Event,
    tally: &Mutex<Tally>,
) -> String {
    let body = serde_json::to_vec(event).expect("an event serialises");
    for attempt in 1..=40 {
        tally.lock().unwrap().attempts += 1;
        let sent = client
            .post(url)
            .header("x-delivery-id", delivery)
            .header("content-type", "application/json")
            .timeout(SENDER_TIMEOUT)
            .body(body.clone())
            .send()
            .await;
        match sent {
            Ok(response) if response.status().is_success() => {
                if response.headers().contains_key("idempotent-replayed") {
                    tally.lock().unwrap().replayed += 1;
                }
                return response.text().await.unwrap_or_default();
            }
            Ok(response) => eprintln!("{delivery}: attempt {attempt}: {}", response.status()),
            Err(err) if err.is_timeout() => {
                tally.lock().unwrap().timeouts += 1;
                eprintln!("{delivery}: attempt {attempt}: no answer in time, retrying");
            }
            Err(err) => eprintln!("{delivery}: attempt {attempt}: {err}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{delivery} was never answered")
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (store, backend) = match std::env::var("REDIS_URL") {
        Ok(url) => (SharedStore::new(RedisStore::connect(&url).await?), "redis"),
        Err(_) => (SharedStore::new(MemoryStore::new()), "memory"),
    };
    // Each run its own delivery ids, so runs against one Redis do not share results.
    let run = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_nanos();

    let handled = Handled::default();
    let webhooks = Idempotency::new(Task::new("webhook_events"))
        .store(store)
        .key_header(HeaderName::from_static("x-delivery-id"))
        .require_key(true)
        // A delivery that arrives while the same event is being handled waits for its answer.
        .wait_for_result(Duration::from_secs(10));
    let receiver = Router::new()
        .route("/webhooks", post(receive))
        .layer(webhooks)
        .with_state(Arc::clone(&handled));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/webhooks", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, receiver).await });

    let client = reqwest::Client::new();
    let tally = Arc::new(Mutex::new(Tally::default()));
    let mut sending = Vec::new();
    for order in 1..=EVENTS {
        let copies = if TWICE.contains(&order) { 2 } else { 1 };
        for _ in 0..copies {
            let (client, url, tally) = (client.clone(), url.clone(), Arc::clone(&tally));
            sending.push(tokio::spawn(async move {
                let delivery = format!("{run}-{order}");
                let event = Event {
                    kind: "order.paid".to_owned(),
                    order,
                };
                let answer = deliver(&client, &url, &delivery, &event, &tally).await;
                println!("{delivery}: {answer}");
                (delivery, answer)
            }));
        }
    }
    let mut answers: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for sent in sending {
        let (delivery, answer) = sent.await?;
        answers.entry(delivery).or_default().push(answer);
    }

    let handled = handled.lock().unwrap().clone();
    let tally = tally.lock().unwrap();
    let summary = json!({
        "store": backend,
        "events": EVENTS,
        "deliveries": tally.attempts,
        "timeouts": tally.timeouts,
        "replayed": tally.replayed,
        "handled": handled.len(),
        "handled_twice": handled.values().filter(|&&count| count > 1).count(),
        "same_answers": answers.values().all(|copies| copies.iter().all(|a| *a == copies[0])),
    });
    println!("{summary}");
    Ok(())
}
