//! A Kafka worker that charges each order once, however often the topic delivers it, on
//! `idempotask-kafka` (rdkafka).
//!
//! It charges the orders (records with the header `order_id: <key>` and the payload
//! `{"id": 5}`) of the topic `orders` (or `$QUEUE`), which it creates with one partition, and
//! its dead-letter topic `orders.dead`, at a stand-in gateway that counts charges in Redis and
//! fails the first request for every fourth order. The consumer runs each charge once per
//! `order_id`: a failure runs again after its backoff, and a record whose worker died before
//! its offset commit is delivered again to the next worker and gets the stored receipt. It
//! prints `order 5: charged ch_5_1`, `… replayed ch_5_1` or `… failed: …`; Ctrl-C stops it.
//!
//! ```text
//! KAFKA_BROKERS=127.0.0.1:9092 REDIS_URL=redis://127.0.0.1:6379 cargo run --example kafka_worker --features kafka
//! ```
//!
//! The worker takes the partition by MANUAL assignment (`assign`), with its offsets committed
//! to the group `chargers`, instead of joining the group (`subscribe`): one worker at a time
//! owns the partition, and the next one resumes at the group's committed offset at once,
//! where a group member killed without leaving would keep its partitions until its session
//! timed out (`session.timeout.ms`, 45 s by default).
//!
//! `tests/example_queues.rs` kills a worker with SIGKILL between a charge and its commit and
//! starts the next: with `CRASH_BEFORE_ACK=5` the charge of order 4 waits for ever, so the
//! partition's commit stays before it while order 5 (and what follows) is charged, and the
//! worker waits after order 5's charge. The test checks the ledger; `WITHOUT_IDEMPOTASK=1`,
//! the bare consumer that commits after each charge, charges that order twice.
//!
//! ```toml
//! [dependencies]
//! idempotask = "0.1"
//! idempotask-kafka = "0.1"
//! idempotask-redis = "0.1"
//! rdkafka = { version = "0.39", default-features = false, features = ["cmake-build", "tokio"] }
//! redis = { version = "1", default-features = false, features = ["tokio-comp", "connection-manager"] }
//! serde = { version = "1", features = ["derive"] }
//! serde_json = "1"
//! tokio = { version = "1", features = ["macros", "rt-multi-thread", "signal", "time"] }
//! ```

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idempotask::{Backoff, Outcome, RetryPolicy, Task};
use idempotask_kafka::{Handled, Idempotent, KeyFrom, Record};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
use redis::{AsyncCommands, aio::ConnectionManager};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const GROUP: &str = "chargers";
/// A short lock TTL: the order a killed worker held runs again in its successor within a
/// second.
static CHARGE: Task = Task::new("kafka_order_charge")
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

/// Creates `topics` with one partition each; a topic that exists already is left as it is.
async fn create_topics(config: &ClientConfig, topics: &[&str]) -> Result<(), BoxError> {
    let admin: AdminClient<DefaultClientContext> = config.create()?;
    let new: Vec<NewTopic> = topics
        .iter()
        .map(|topic| NewTopic::new(topic, 1, TopicReplication::Fixed(1)))
        .collect();
    for created in admin.create_topics(&new, &AdminOptions::new()).await? {
        match created {
            Ok(_) | Err((_, rdkafka::types::RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((topic, code)) => return Err(format!("create {topic}: {code}").into()),
        }
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let url = std::env::var("REDIS_URL").map_err(|_| "set REDIS_URL")?;
    let brokers = std::env::var("KAFKA_BROKERS").map_err(|_| "set KAFKA_BROKERS")?;
    let queue = std::env::var("QUEUE").unwrap_or_else(|_| "orders".to_owned());
    let ledger = format!("ledger:{queue}");
    let redis = ConnectionManager::new(redis::Client::open(url.as_str())?).await?;
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", &brokers)
        .set("group.id", GROUP);
    create_topics(&config, &[&queue, &format!("{queue}.dead")]).await?;
    let crash: Option<u64> = std::env::var("CRASH_BEFORE_ACK")
        .ok()
        .and_then(|order| order.parse().ok());
    if std::env::var_os("WITHOUT_IDEMPOTASK").is_some() {
        return bare(&config, redis, &queue, &ledger, crash).await;
    }
    let store = idempotask_redis::RedisStore::connect(&url).await?;
    // Which order each record holds, for the lines below (a `Processed` names its offset).
    let orders: Arc<Mutex<HashMap<i64, u64>>> = Arc::default();
    let body = {
        let (orders, ledger) = (Arc::clone(&orders), ledger.clone());
        move |record: &Record| {
            let order: Order = record.json()?;
            let id = order.id;
            orders.lock().unwrap().insert(record.offset(), id);
            let (redis, ledger) = (redis.clone(), ledger.clone());
            Ok(async move {
                // The crash run holds the order before the crash order: its partition's
                // commit cannot move past it, so the crash order's charge stays uncommitted.
                if crash.is_some_and(|crash| id + 1 == crash) {
                    std::future::pending::<()>().await;
                }
                charge(redis, ledger, id).await
            })
        }
    };
    let mut consumer = Idempotent::new(CHARGE.clone(), KeyFrom::header("order_id"))
        .store(store)
        .failure_backoff(Backoff::new(
            Duration::from_millis(100),
            Duration::from_secs(1),
        ))
        .assign(&config, &queue, &[0], body)
        .await?;
    let mut stop = std::pin::pin!(tokio::signal::ctrl_c());
    println!("waiting for orders on {queue}");
    loop {
        let processed = tokio::select! {
            _ = &mut stop => break,
            processed = consumer.next() => processed?,
        };
        let order = order_of(&orders, processed.offset);
        let crashing = matches!(&processed.handled, Handled::Done(done)
            if crash == Some(order) && done.outcome == Outcome::Executed);
        if !crashing {
            println!("{}", line(order, &processed.handled));
            continue;
        }
        // With `CRASH_BEFORE_ACK=<order>`, the first charge of that order waits,
        // uncommitted, for the SIGKILL of the test that asked for it; first it tells of the
        // records that ended beside it, whose offsets may already be committed.
        while let Ok(other) =
            tokio::time::timeout(Duration::from_millis(200), consumer.next()).await
        {
            let other = other?;
            println!("{}", line(order_of(&orders, other.offset), &other.handled));
        }
        if let Handled::Done(done) = &processed.handled {
            println!(
                "order {order}: charged {}, crashing before the ack",
                done.value
            );
        }
        std::future::pending::<()>().await;
    }
    // Waits for the charges at hand and commits their offsets.
    consumer.close().await?;
    Ok(())
}

/// The order the record at `offset` holds, as its body read it.
fn order_of(orders: &Mutex<HashMap<i64, u64>>, offset: i64) -> u64 {
    orders
        .lock()
        .unwrap()
        .get(&offset)
        .copied()
        .unwrap_or_default()
}

/// The line that tells what became of a try of `order`.
fn line(order: u64, handled: &Handled<String, BoxError>) -> String {
    match handled {
        Handled::Done(done) if done.outcome == Outcome::Replayed => {
            format!("order {order}: replayed {}", done.value)
        }
        Handled::Done(done) => format!("order {order}: charged {}", done.value),
        Handled::Failed { error, .. } => format!("order {order}: failed: {error}"),
        Handled::Deferred { error, .. } => format!("order {order}: failed: {error}"),
        Handled::DeadLettered(why) => format!("order {order}: failed: {why}"),
    }
}

/// The same worker without idempotask: a consumer of the partition by hand, which commits
/// each record's offset after its charge and tries a failed charge again in place.
async fn bare(
    config: &ClientConfig,
    redis: ConnectionManager,
    queue: &str,
    ledger: &str,
    crash: Option<u64>,
) -> Result<(), BoxError> {
    let consumer: StreamConsumer = config
        .clone()
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .create()?;
    let mut assignment = TopicPartitionList::new();
    assignment.add_partition_offset(queue, 0, Offset::Stored)?;
    consumer.assign(&assignment)?;
    let mut stop = std::pin::pin!(tokio::signal::ctrl_c());
    println!("waiting for orders on {queue}");
    loop {
        // Only what the charge needs is kept: a message must not outlive its consumer.
        let (offset, payload) = {
            let message = tokio::select! {
                _ = &mut stop => return Ok(()),
                message = consumer.recv() => message?,
            };
            (
                message.offset(),
                message.payload().unwrap_or_default().to_vec(),
            )
        };
        let order = serde_json::from_slice::<Order>(&payload)?.id;
        let id = loop {
            match charge(redis.clone(), ledger.to_owned(), order).await {
                Ok(id) => break id,
                Err(err) => {
                    println!("order {order}: failed: {err}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        };
        if crash == Some(order) && id == format!("ch_{order}_1") {
            println!("order {order}: charged {id}, crashing before the ack");
            std::future::pending::<()>().await;
        }
        println!("order {order}: charged {id}");
        let mut next = TopicPartitionList::new();
        next.add_partition_offset(queue, 0, Offset::Offset(offset + 1))?;
        consumer.commit(&next, CommitMode::Sync)?;
    }
}
