//! An Amazon SQS worker that charges each order once, however often the queue delivers it, on
//! `idempotask-sqs`.
//!
//! It charges the orders (messages `{"id": 5}` with the string attribute `order_id`) of the
//! queue `orders` (or `$QUEUE`) at a stand-in gateway that counts charges in Redis and fails
//! the first request for every fourth order. The consumer runs each charge once per
//! `order_id`: a failure is handed back to SQS for its backoff, and a message whose worker died
//! before its delete comes back after its visibility timeout and gets the stored receipt. It
//! prints `order 5: charged ch_5_1`, `… replayed ch_5_1` or `… failed: …`; Ctrl-C stops it.
//!
//! The queue needs a redrive policy (a dead-letter queue) and a visibility timeout of at least
//! the task's lock TTL (1 s here); the consumer checks both at the start. `SQS_ENDPOINT` points
//! it at an SQS API over plain HTTP (`moto_server`, `LocalStack`); for AWS itself, build the
//! client with `aws-config` instead (`aws_sdk_sqs::Client::new(&aws_config::load_from_env().await)`).
//!
//! ```text
//! moto_server -p 5000 &
//! export SQS_ENDPOINT=http://127.0.0.1:5000 AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test AWS_REGION=us-east-1
//! aws --endpoint-url $SQS_ENDPOINT sqs create-queue --queue-name orders-dead
//! aws --endpoint-url $SQS_ENDPOINT sqs create-queue --queue-name orders --attributes \
//!   '{"VisibilityTimeout":"2","RedrivePolicy":"{\"deadLetterTargetArn\":\"arn:aws:sqs:us-east-1:123456789012:orders-dead\",\"maxReceiveCount\":\"5\"}"}'
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --example sqs_worker --features sqs
//! aws --endpoint-url $SQS_ENDPOINT sqs send-message --queue-url $SQS_ENDPOINT/123456789012/orders \
//!   --message-body '{"id": 5}' --message-attributes 'order_id={DataType=String,StringValue=orders-order-5}'
//! ```
//! `tests/example_queues.rs` kills one of three with SIGKILL between a charge and its delete
//! (`CRASH_BEFORE_ACK=5` waits there) and checks the ledger; `WITHOUT_IDEMPOTASK=1`, the bare
//! receive-charge-delete loop, charges that order twice.
//!
//! ```toml
//! [dependencies]
//! idempotask = "0.1"
//! idempotask-redis = "0.1"
//! idempotask-sqs = "0.1"
//! aws-sdk-sqs = { version = "1", default-features = false, features = ["rt-tokio", "behavior-version-latest"] }
//! aws-smithy-http-client = { version = "1", default-features = false, features = ["default-client"] }
//! redis = { version = "1", default-features = false, features = ["tokio-comp", "connection-manager"] }
//! serde = { version = "1", features = ["derive"] }
//! serde_json = "1"
//! tokio = { version = "1", features = ["macros", "rt-multi-thread", "signal", "time"] }
//! ```

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_sqs::Client;
use aws_sdk_sqs::config::{Credentials, Region};
use idempotask::store::BatchingStore;
use idempotask::{Backoff, Outcome, RetryPolicy, Task};
use idempotask_sqs::{Attribute, Handled, Idempotent, Message};
use redis::{AsyncCommands, aio::ConnectionManager};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The lock TTL is no longer than the queue's visibility timeout (the consumer refuses it
/// otherwise), so a message that comes back from a worker that died mid-charge finds the lock
/// expired.
static CHARGE: Task = Task::new("sqs_order_charge")
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

/// An SQS client of the API at `SQS_ENDPOINT`, over plain HTTP, with the credentials and region
/// of the environment.
fn client() -> Result<Client, BoxError> {
    let endpoint = std::env::var("SQS_ENDPOINT").map_err(|_| "set SQS_ENDPOINT")?;
    let var =
        |name: &str, default: &str| std::env::var(name).unwrap_or_else(|_| default.to_owned());
    let credentials = Credentials::new(
        var("AWS_ACCESS_KEY_ID", "test"),
        var("AWS_SECRET_ACCESS_KEY", "test"),
        None,
        None,
        "environment",
    );
    let config = aws_sdk_sqs::Config::builder()
        .behavior_version_latest()
        .region(Region::new(var("AWS_REGION", "us-east-1")))
        .credentials_provider(credentials)
        .endpoint_url(endpoint)
        .http_client(aws_smithy_http_client::Builder::new().build_http())
        .build();
    Ok(Client::from_conf(config))
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let url = std::env::var("REDIS_URL").map_err(|_| "set REDIS_URL")?;
    let queue = std::env::var("QUEUE").unwrap_or_else(|_| "orders".to_owned());
    let ledger = format!("ledger:{queue}");
    let redis = ConnectionManager::new(redis::Client::open(url.as_str())?).await?;
    let client = client()?;
    let queue_url = client
        .get_queue_url()
        .queue_name(&queue)
        .send()
        .await?
        .queue_url()
        .ok_or("GetQueueUrl answered no URL")?
        .to_owned();
    let crash = std::env::var("CRASH_BEFORE_ACK").map(|order| format!("ch_{order}_1"));
    if std::env::var_os("WITHOUT_IDEMPOTASK").is_some() {
        return bare(client, redis, &queue, &queue_url, &ledger, crash.ok()).await;
    }
    let store = idempotask_redis::RedisStore::connect(&url).await?;
    let mut consumer = Idempotent::new(CHARGE.clone(), Attribute::new("order_id"))
        // A batch's calls go to Redis as one pipeline (here, batches of one).
        .store(BatchingStore::new(store))
        .failure_backoff(Backoff::new(
            Duration::from_millis(100),
            Duration::from_secs(1),
        ))
        // One message at a time: a worker that dies is in the middle of no other charge.
        .batch_size(1)
        .wait_time(Duration::from_secs(1))
        .consume(client, queue_url)
        .await?;
    let mut stop = std::pin::pin!(tokio::signal::ctrl_c());
    println!("waiting for orders on {queue}");
    loop {
        let mut orders = HashMap::new();
        let body = |message: &Message| {
            let order: Order = message.json()?;
            orders.insert(message.id().to_owned(), order.id);
            Ok(charge(redis.clone(), ledger.clone(), order.id))
        };
        // `run_batch`, not `next_batch`: the delete waits for the lines below.
        let batch = tokio::select! {
            _ = &mut stop => return Ok(()),
            batch = consumer.run_batch(body) => batch?,
        };
        for (message, handled) in batch.messages() {
            let order = orders.get(message.id()).copied().unwrap_or_default();
            match handled {
                Handled::Deleted(done) if done.outcome == Outcome::Replayed => {
                    println!("order {order}: replayed {}", done.value);
                }
                // With `CRASH_BEFORE_ACK=<order>`, the first charge of that order waits,
                // undeleted, for the SIGKILL of the test that asked for it.
                Handled::Deleted(done) if crash.as_ref() == Ok(&done.value) => {
                    println!(
                        "order {order}: charged {}, crashing before the ack",
                        done.value
                    );
                    std::future::pending::<()>().await;
                }
                Handled::Deleted(done) => println!("order {order}: charged {}", done.value),
                Handled::Failed { error, .. } => println!("order {order}: failed: {error}"),
                Handled::Deferred { error, .. } => println!("order {order}: failed: {error}"),
                Handled::Behind { message_id, .. } => {
                    println!("order {order}: failed: waits for {message_id}");
                }
                Handled::Rejected(why) => println!("order {order}: failed: {why}"),
            }
        }
        for processed in consumer.settle(batch).await {
            if let Err(failure) = processed.settled {
                eprintln!("{}: {failure}", processed.id);
            }
        }
    }
}

/// The same worker without idempotask: receive, charge, delete, by hand; a failed charge is
/// left to come back after the visibility timeout.
async fn bare(
    client: Client,
    redis: ConnectionManager,
    queue: &str,
    queue_url: &str,
    ledger: &str,
    crash: Option<String>,
) -> Result<(), BoxError> {
    let mut stop = std::pin::pin!(tokio::signal::ctrl_c());
    println!("waiting for orders on {queue}");
    loop {
        let receive = client
            .receive_message()
            .queue_url(queue_url)
            .max_number_of_messages(1)
            .wait_time_seconds(1)
            .send();
        let received = tokio::select! {
            _ = &mut stop => return Ok(()),
            received = receive => received?,
        };
        for message in received.messages() {
            let order = serde_json::from_str::<Order>(message.body().unwrap_or_default())?.id;
            match charge(redis.clone(), ledger.to_owned(), order).await {
                Ok(id) if crash.as_ref() == Some(&id) => {
                    println!("order {order}: charged {id}, crashing before the ack");
                    std::future::pending::<()>().await;
                }
                Ok(id) => println!("order {order}: charged {id}"),
                Err(err) => {
                    println!("order {order}: failed: {err}");
                    continue;
                }
            }
            let receipt = message
                .receipt_handle()
                .ok_or("a message without a receipt")?;
            client
                .delete_message()
                .queue_url(queue_url)
                .receipt_handle(receipt)
                .send()
                .await?;
        }
    }
}
