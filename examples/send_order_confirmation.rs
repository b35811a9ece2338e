//! A side effect that cannot be undone, sent at most once: the order confirmation e-mail.
//!
//! A worker killed between taking an order and recording its mail leaves the order *in doubt*:
//! nobody can tell whether the mail left. With `in_doubt = "hold"` its redeliveries send
//! nothing; they fail with `Error::InDoubt` until an operator has looked at the mail server and
//! resolved the unit with the CLI: `--result` with the confirmation found there, or `--free` when
//! the mail never left, so that the next delivery sends it.
//!
//! ```text
//! cargo run --example send_order_confirmation --features redis   # in memory: one order, 4 deliveries
//! REDIS_URL=redis://127.0.0.1:6379 ORDERS=1-6 cargo run --example send_order_confirmation --features redis
//! idempotask resolve --task send_order_confirmation --key order-confirmation-2 --result '{"message_id":"…"}'
//! ```
//!
//! With `REDIS_URL`, the store and the mail server's outbox (the Redis list `outbox`, one JSON
//! mail per entry) are on Redis, and `ORDERS=a-b` delivers those orders once each, printing
//! `order 5: sent <id>`, `order 5: already sent <id>` or `order 5: held in doubt`.
//! `CRASH_AT=5:before-send` (or `5:after-send`) stops there and waits for a SIGKILL, which is
//! how `tests/examples.rs` leaves orders in doubt.
//!
//! ```toml
//! [dependencies]
//! idempotask = "0.1"
//! idempotask-redis = "0.1"
//! redis = { version = "1", default-features = false, features = ["tokio-comp"] }
//! serde = { version = "1", features = ["derive"] }
//! serde_json = "1"
//! tokio = { version = "1", features = ["macros", "rt-multi-thread", "time"] }
//! ```

use std::env::var;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Mutex, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use idempotask::{Error, MemoryStore, idempotent_task};
use idempotask_redis::RedisStore;
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use serde::{Deserialize, Serialize};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The mail server: the Redis list `outbox` with `REDIS_URL`, else this process's memory.
static OUTBOX: Mutex<Vec<String>> = Mutex::new(Vec::new());
static MAIL_SERVER: OnceLock<MultiplexedConnection> = OnceLock::new();
/// Whether the last delivery sent a mail itself (rather than getting the stored confirmation).
static SENT_NOW: AtomicBool = AtomicBool::new(false);

/// What the caller (and every redelivery) gets back; the mail carries it too.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Confirmation {
    order_id: u64,
    message_id: String,
}

/// `CRASH_AT=<order>:<point>`: stop at `point` of that order and wait for a SIGKILL.
async fn crash_point(order_id: u64, point: &str) {
    if var("CRASH_AT").is_ok_and(|at| at == format!("{order_id}:{point}")) {
        println!("order {order_id}: crashing {point}");
        std::future::pending::<()>().await;
    }
}

/// A mail goes out in well under a second: a 2 s lock, and a week to be resolved in.
#[idempotent_task(
    key = "order-confirmation-{order_id}",
    lock_ttl = "2s",
    result_ttl = "7d",
    in_doubt = "hold",
    doubt_memory = "7d"
)]
async fn send_order_confirmation(order_id: u64) -> Result<Confirmation, BoxError> {
    crash_point(order_id, "before-send").await;
    let stamp = SystemTime::now().duration_since(UNIX_EPOCH)?.as_micros();
    let mail = Confirmation {
        order_id,
        message_id: format!("<{order_id}.{stamp}@shop.example>"),
    };
    let text = serde_json::to_string(&mail)?;
    match MAIL_SERVER.get() {
        Some(server) => server.clone().rpush::<_, _, ()>("outbox", text).await?,
        None => OUTBOX.lock().unwrap().push(text),
    }
    SENT_NOW.store(true, SeqCst);
    crash_point(order_id, "after-send").await;
    Ok(mail)
}

/// Delivers `order_id` once and says what became of it.
async fn deliver(order_id: u64) -> Result<(), BoxError> {
    match send_order_confirmation(order_id).await {
        Ok(sent) if SENT_NOW.swap(false, SeqCst) => {
            println!("order {order_id}: sent {}", sent.message_id);
        }
        Ok(sent) => println!("order {order_id}: already sent {}", sent.message_id),
        Err(err) => match err.downcast_ref::<Error>() {
            Some(Error::InDoubt { .. }) => println!("order {order_id}: held in doubt ({err})"),
            _ => return Err(err),
        },
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let Ok(url) = var("REDIS_URL") else {
        idempotask::install(MemoryStore::new());
        for _ in 1..=4 {
            deliver(42).await?; // a queue delivering one order four times
        }
        let sent = OUTBOX.lock().unwrap().len();
        println!("outbox: {sent} mail");
        return if sent == 1 {
            Ok(())
        } else {
            Err("sent more than once".into())
        };
    };
    idempotask::install(RedisStore::connect(&url).await?);
    let server = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    MAIL_SERVER.set(server).map_err(|_| "set twice")?;
    let orders = var("ORDERS").unwrap_or_else(|_| "1-1".to_owned());
    let (first, last) = orders.split_once('-').ok_or("ORDERS is `first-last`")?;
    for order_id in first.parse()?..=last.parse()? {
        deliver(order_id).await?;
    }
    Ok(())
}
