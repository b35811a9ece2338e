//! An AMQP worker that charges each order once, however often RabbitMQ delivers it.
//!
//! It charges the orders (`{"id": 5}` with a `message_id`) of the queue `orders` (or `$QUEUE`)
//! at a stand-in gateway that counts charges in Redis and fails the first request for every
//! fourth order. `idempotask_lapin::Idempotent` runs each charge once per `message_id`: a failure
//! goes through the retry queue, a redelivery (its worker died before the ack) gets the stored
//! receipt. It prints `order 5: charged ch_5_1`, `… replayed ch_5_1` or `… failed: …`; Ctrl-C
//! stops it.
//!
//! ```text
//! AMQP_URL=amqp://127.0.0.1:5672/%2f REDIS_URL=redis://127.0.0.1:6379 \
//!     cargo run --example rabbitmq_worker --features rabbitmq
//! ```
//! `tests/example_queues.rs` kills one of three with SIGKILL between a charge and its ack
//! (`CRASH_BEFORE_ACK=5` waits there) and checks the ledger; `WITHOUT_IDEMPOTASK=1`, the bare
//! consumer, charges that order twice.
//!
//! ```toml
//! [dependencies]
//! idempotask = "0.1"
//! idempotask-lapin = "0.1"
//! idempotask-redis = "0.1"
//! futures-util = { version = "0.3", default-features = false }
//! lapin = { version = "4.12", default-features = false, features = ["tokio"] }
//! redis = { version = "1", default-features = false, features = ["tokio-comp", "connection-manager"] }
//! serde = { version = "1", features = ["derive"] }
//! serde_json = "1"
//! tokio = { version = "1", features = ["macros", "rt-multi-thread", "signal", "time"] }
//! ```

use std::time::Duration;

use futures_util::StreamExt;
use idempotask::{Backoff, Outcome, Task};
use idempotask_lapin::{Idempotent, MessageId, Settled, Topology};
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions, BasicRejectOptions};
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties};
use redis::{AsyncCommands, aio::ConnectionManager};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The lock covers a charge with room to spare; it is released once the receipt is stored.
static CHARGE: Task = Task::new("rabbitmq_order_charge").lock_ttl(Duration::from_secs(5));

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

/// Prints what became of a delivery. With `CRASH_BEFORE_ACK=<order>`, the first charge of that
/// order waits, unacked, for the SIGKILL of the test that asked for it.
async fn report(order: u64, what: &str, answer: &Result<String, String>) {
    let crash = std::env::var("CRASH_BEFORE_ACK").map(|order| format!("ch_{order}_1"));
    match answer {
        Ok(id) if what == "charged" && crash.as_ref() == Ok(id) => {
            println!("order {order}: charged {id}, crashing before the ack");
            std::future::pending::<()>().await;
        }
        Ok(id) => println!("order {order}: {what} {id}"),
        Err(err) => println!("order {order}: failed: {err}"),
    }
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let redis_url = std::env::var("REDIS_URL").map_err(|_| "set REDIS_URL")?;
    let queue = std::env::var("QUEUE").unwrap_or_else(|_| "orders".to_owned());
    let ledger = format!("ledger:{queue}");
    idempotask::install(idempotask_redis::RedisStore::connect(&redis_url).await?);
    let redis = ConnectionManager::new(redis::Client::open(redis_url)?).await?;
    let amqp_url = std::env::var("AMQP_URL").map_err(|_| "set AMQP_URL")?;
    let connection = Connection::connect(&amqp_url, ConnectionProperties::default()).await?;
    let channel = connection.create_channel().await?;
    let topology = Topology::new(queue);
    let retries = topology.declare(&channel).await?;
    // One delivery at a time: a worker that dies is in the middle of no other charge.
    channel.basic_qos(1, BasicQosOptions::default()).await?;
    let backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
    let charge_once = Idempotent::new(CHARGE.clone(), MessageId, retries)
        .failure_backoff(backoff)
        .store_backoff(backoff);
    let mut deliveries = channel
        .basic_consume(
            topology.queue().into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let mut stop = std::pin::pin!(tokio::signal::ctrl_c());
    println!("waiting for orders on {}", topology.queue());
    loop {
        let delivery = tokio::select! {
            _ = &mut stop => return Ok(()),
            next = deliveries.next() => match next { Some(delivery) => delivery?, None => return Ok(()) },
        };
        let order = serde_json::from_slice::<Order>(&delivery.data)?.id;
        let body = charge(redis.clone(), ledger.clone(), order);
        if std::env::var_os("WITHOUT_IDEMPOTASK").is_some() {
            // Charge, then ack; a failure goes back to the queue.
            let answer = body.await.map_err(|err| err.to_string());
            report(order, "charged", &answer).await;
            if answer.is_ok() {
                delivery.ack(BasicAckOptions::default()).await?;
            } else {
                delivery
                    .reject(BasicRejectOptions { requeue: true })
                    .await?;
            }
            continue;
        }
        // `run` decides; `settle` acks, or sends to the retry queue, once the line is out.
        let decision = charge_once.run(delivery, |_| body).await;
        let (what, answer) = match decision.settled() {
            Settled::Acked(done) if done.outcome == Outcome::Replayed => {
                ("replayed", Ok(done.value.clone()))
            }
            Settled::Acked(done) => ("charged", Ok(done.value.clone())),
            otherwise => ("failed", Err(format!("{otherwise:?}"))),
        };
        report(order, what, &answer).await;
        decision.settle().await?;
    }
}
