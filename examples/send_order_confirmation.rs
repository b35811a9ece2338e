//! A side effect that cannot be undone: the order confirmation e-mail.
//!
//! A short lock (the mail goes out in well under 15 s) and a long memory (7 days, longer than any
//! queue keeps redelivering). The first delivery sends the mail; every redelivery gets the stored
//! confirmation back and the outbox still holds one mail.
//!
//! ```text
//! cargo run --example send_order_confirmation --features redis   # in-memory store
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --example send_order_confirmation --features redis
//! ```
//!
//! `REDIS_CLUSTER_URLS` (comma-separated seed nodes) puts the store on a Redis Cluster instead.
//!
//! ```toml
//! [dependencies]
//! idempotask = "0.1"
//! idempotask-redis = "0.1"
//! serde = { version = "1", features = ["derive"] }
//! tokio = { version = "1", features = ["macros", "rt-multi-thread", "time"] }
//! ```

use std::env::var;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use idempotask::MemoryStore;
use idempotask::store::SharedStore;
use idempotask::{Error, idempotent_task};
use idempotask_redis::{RedisClusterStore, RedisStore};
use serde::{Deserialize, Serialize};

/// An e-mail as handed to the mail server.
struct Mail {
    to: String,
    subject: String,
}

/// Everything sent, in order: what a customer would find in their inbox.
static OUTBOX: Mutex<Vec<Mail>> = Mutex::new(Vec::new());

/// What the caller (and every redelivery) gets back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Confirmation {
    message_id: String,
    sent_at_ms: u128,
}

#[idempotent_task(
    key = "order-confirmation-{order_id}",
    lock_ttl = "15s",
    result_ttl = "7d"
)]
async fn send_order_confirmation(order_id: u64, email: &str) -> Result<Confirmation, Error> {
    let mut outbox = OUTBOX.lock().unwrap();
    outbox.push(Mail {
        to: email.to_owned(),
        subject: format!("Your order {order_id} is confirmed"),
    });
    Ok(Confirmation {
        message_id: format!("<{order_id}.{}@shop.example>", outbox.len()),
        sent_at_ms: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis(),
    })
}

fn outbox_len() -> usize {
    OUTBOX.lock().unwrap().len()
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // A Redis Cluster or a Redis when the environment names one, else the in-memory store.
    idempotask::install(match (var("REDIS_CLUSTER_URLS"), var("REDIS_URL")) {
        (Ok(urls), _) => SharedStore::new(RedisClusterStore::connect(urls.split(',')).await?),
        (_, Ok(url)) => SharedStore::new(RedisStore::connect(&url).await?),
        _ => SharedStore::new(MemoryStore::new()),
    });
    // A fresh order per run, so that a shared Redis does not remember an earlier run.
    let order_id = u64::try_from(SystemTime::now().duration_since(UNIX_EPOCH)?.as_micros())?;

    let first = send_order_confirmation(order_id, "ada@example.com").await?;
    println!(
        "delivery 1: sent {} ({} mail in the outbox)",
        first.message_id,
        outbox_len()
    );
    for delivery in 2..=4 {
        let again = send_order_confirmation(order_id, "ada@example.com").await?;
        let verdict = if again == first {
            "already sent"
        } else {
            "SENT AGAIN"
        };
        println!(
            "delivery {delivery}: {verdict} {} ({} mail in the outbox)",
            again.message_id,
            outbox_len()
        );
    }
    let outbox = OUTBOX.lock().unwrap();
    println!(
        "outbox: {} mail to {}: {:?}",
        outbox.len(),
        outbox[0].to,
        outbox[0].subject
    );
    if outbox.len() == 1 {
        Ok(())
    } else {
        Err("the confirmation went out more than once".into())
    }
}
