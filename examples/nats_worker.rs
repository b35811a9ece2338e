//! A NATS JetStream worker that charges each order once, however often the stream delivers it.
//!
//! It charges the orders (`{"id": 5}` with a `Nats-Msg-Id`) of the stream `orders` (or
//! `$QUEUE`) at a stand-in gateway that counts charges in Redis and fails the first request for
//! every fourth order. `idempotask_nats::Idempotent` runs each charge once per `Nats-Msg-Id`: a
//! failure is nak'd, a redelivery (its worker died before the ack) gets the stored receipt. It
//! prints `order 5: charged ch_5_1`, `… replayed ch_5_1` or `… failed: …`; Ctrl-C stops it.
//!
//! ```text
//! NATS_URL=nats://127.0.0.1:4222 REDIS_URL=redis://127.0.0.1:6379 \
//!     cargo run --example nats_worker --features nats
//! ```
//! The server needs its streams on (`nats-server -js`). `tests/example_queues.rs` kills one of
//! three with SIGKILL between a charge and its ack (`CRASH_BEFORE_ACK=5` waits there) and checks
//! the ledger; `WITHOUT_IDEMPOTASK=1`, the bare consumer, charges that order twice.
//!
//! ```toml
//! [dependencies]
//! idempotask = "0.1"
//! idempotask-nats = "0.1"
//! idempotask-redis = "0.1"
//! async-nats = { version = "0.50", default-features = false, features = ["jetstream", "ring"] }
//! futures-util = { version = "0.3", default-features = false }
//! redis = { version = "1", default-features = false, features = ["tokio-comp", "connection-manager"] }
//! serde = { version = "1", features = ["derive"] }
//! serde_json = "1"
//! tokio = { version = "1", features = ["macros", "rt-multi-thread", "signal", "time"] }
//! ```

use std::time::Duration;

use async_nats::jetstream::{self, AckKind, consumer::pull};
use futures_util::StreamExt;
use idempotask::{Outcome, RetryPolicy, Task};
use idempotask_nats::{Handled, Idempotent, MsgId};
use redis::{AsyncCommands, aio::ConnectionManager};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The consumer's `AckWait`: short, so a dead worker's message comes back within seconds.
const ACK_WAIT: Duration = Duration::from_secs(2);
/// The lock TTL is no longer than `AckWait`, so a message redelivered because its worker died
/// mid-charge finds the lock expired; a busy key is nak'd at once with the holder's lock time.
static CHARGE: Task = Task::new("nats_order_charge")
    .lock_ttl(Duration::from_secs(1))
    .retry(RetryPolicy::no_wait());

#[derive(serde::Deserialize)]
struct Order {
    id: u64,
}

/// The gateway: charges per order in the hash `ledger`; the charge id (the receipt) counts them.
async fn charge(
    mut redis: ConnectionManager,
    ledger: String,
    order: u64,
) -> Result<String, BoxError> {
    let requests: u64 = redis.hincr(format!("{ledger}:requests"), order, 1).await?;
    if order % 4 == 2 && requests == 1 {
        return Err("the gateway is unavailable; try again".into());
    }
    let charges: u64 = redis.hincr(&ledger, order, 1).await?;
    Ok(format!("ch_{order}_{charges}"))
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let redis_url = std::env::var("REDIS_URL").map_err(|_| "set REDIS_URL")?;
    let queue = std::env::var("QUEUE").unwrap_or_else(|_| "orders".to_owned());
    let ledger = format!("ledger:{queue}");
    idempotask::install(idempotask_redis::RedisStore::connect(&redis_url).await?);
    let redis = ConnectionManager::new(redis::Client::open(redis_url)?).await?;
    let client =
        async_nats::connect(std::env::var("NATS_URL").map_err(|_| "set NATS_URL")?).await?;
    // A stream named `orders` takes the subject `orders`.
    let stream = jetstream::new(client)
        .get_or_create_stream(queue.as_str())
        .await?;
    let durable_name = Some("chargers".to_owned());
    let config = pull::Config {
        durable_name,
        ack_wait: ACK_WAIT,
        ..Default::default()
    };
    let consumer = stream.get_or_create_consumer("chargers", config).await?;
    // One message at a time: a worker that dies is in the middle of no other charge.
    let mut messages = consumer
        .stream()
        .max_messages_per_batch(1)
        .messages()
        .await?;
    let charge_once = Idempotent::new(CHARGE.clone(), MsgId).ack_wait(ACK_WAIT);
    let crash = std::env::var("CRASH_BEFORE_ACK").map(|order| format!("ch_{order}_1"));
    let mut stop = std::pin::pin!(tokio::signal::ctrl_c());
    println!("waiting for orders on {queue}");
    loop {
        let message = tokio::select! {
            _ = &mut stop => break,
            next = messages.next() => match next { Some(message) => message?, None => break },
        };
        let order = serde_json::from_slice::<Order>(&message.payload)?.id;
        let body = charge(redis.clone(), ledger.clone(), order);
        // `process`, not `handle`: the ack waits for the line below, and is sent confirmed.
        let (kind, what, answer) = if std::env::var_os("WITHOUT_IDEMPOTASK").is_some() {
            match body.await {
                Ok(id) => (AckKind::Ack, "charged", Ok(id)),
                Err(err) => (AckKind::Nak(None), "failed", Err(err.to_string())),
            }
        } else {
            let handled = charge_once.process(&message, body).await;
            let kind = handled.ack_kind();
            match handled {
                Handled::Acked(done) if done.outcome == Outcome::Replayed => {
                    (kind, "replayed", Ok(done.value))
                }
                Handled::Acked(done) => (kind, "charged", Ok(done.value)),
                otherwise => (kind, "failed", Err(format!("{otherwise:?}"))),
            }
        };
        match answer {
            // With `CRASH_BEFORE_ACK=<order>`, the first charge of that order waits, unacked,
            // for the SIGKILL of the test that asked for it.
            Ok(id) if what == "charged" && crash.as_ref() == Ok(&id) => {
                println!("order {order}: charged {id}, crashing before the ack");
                std::future::pending::<()>().await;
            }
            Ok(id) => println!("order {order}: {what} {id}"),
            Err(err) => println!("order {order}: failed: {err}"),
        }
        message.double_ack_with(kind).await?;
    }
    Ok(())
}
