//! AMQP consumers that crash: each order is charged once all the same.
//!
//! A producer publishes orders to an AMQP work queue (lapin, on a `rabbitmq-server` broker), each
//! with its `message_id`; several worker processes consume them and charge them at a payment
//! gateway (a ledger in Redis). The gateway rejects the first request for some orders, so those
//! deliveries fail once and come back through the retry queue. The worker that finishes one
//! particular order first dies right after the charge and before its ack (its process gets
//! SIGKILL, `kill -9`); the broker has no visibility timeout, so the moment the dead worker's
//! connection closes, it hands the delivery to another worker.
//!
//! With the consumer wrapped in `idempotask_lapin::Idempotent`, that redelivery gets the stored
//! receipt and the order is charged once; with `--without-idempotask` it is charged twice. The
//! last line of output is one JSON summary; each delivery is shown on stderr as it happens.
//!
//! ```text
//! AMQP_URL=amqp://127.0.0.1:5672/%2f REDIS_URL=redis://127.0.0.1:6379 \
//!     cargo run --example rabbitmq_worker --features rabbitmq [-- --without-idempotask]
//! ```
//! The idempotask store is the Redis at `REDIS_URL`.
//!
//! It needs:
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
//! tokio = { version = "1", features = ["macros", "rt-multi-thread", "process", "io-util", "io-std", "time"] }
//! ```

use std::collections::{BTreeMap, HashSet};
use std::error::Error;
use std::process::Stdio;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use idempotask::Backoff;
use idempotask_lapin::{Idempotent, MessageId, Settled, Topology};
use idempotask_redis::RedisStore;
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicPublishOptions, BasicQosOptions,
    ExchangeDeleteOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use redis::aio::ConnectionManager;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::{Child, Command};

type BoxError = Box<dyn Error + Send + Sync>;

const ORDERS: u64 = 12;
const WORKERS: usize = 3;
/// The worker that completes this order first dies before it acks.
const CRASH_ORDER: u64 = 5;
/// The gateway rejects the first request for these orders.
fn flaky(order: u64) -> bool {
    order % 4 == 2
}

/// The lock covers a charge with room to spare; it is released as soon as the receipt is stored,
/// so a worker killed after that leaves nothing for the redelivery to wait for.
static CHARGE: idempotask::Task =
    idempotask::Task::new("rabbitmq_order_charge").lock_ttl(Duration::from_secs(5));

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Order {
    /// Each run uses its own queue and orders, so runs against the same servers share nothing.
    run: u64,
    id: u64,
}

/// What the gateway answers a charge with; the charge id names one charge of one order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Receipt {
    order: u64,
    charge_id: String,
}

/// The payment gateway: a ledger of charges per order in Redis, where a killed worker cannot
/// take back what it recorded.
#[derive(Clone)]
struct Gateway(ConnectionManager);

impl Gateway {
    async fn connect() -> Result<Self, BoxError> {
        let client = redis::Client::open(env("REDIS_URL")?)?;
        Ok(Self(ConnectionManager::new(client).await?))
    }

    /// Charges the order, or fails before charging when the gateway rejects this request.
    async fn charge(&self, order: &Order) -> Result<Receipt, BoxError> {
        if flaky(order.id) && self.first_time("rejection", order).await? {
            return Err("the gateway is unavailable; try again".into());
        }
        let charges: i64 = redis::cmd("HINCRBY")
            .arg(format!("gateway:{}:charges", order.run))
            .arg(order.id)
            .arg(1)
            .query_async(&mut self.0.clone())
            .await?;
        Ok(Receipt {
            order: order.id,
            charge_id: format!("ch_{}_{charges}", order.id),
        })
    }

    /// Whether this is the first time `what` happens to `order` in this run, across processes.
    async fn first_time(&self, what: &str, order: &Order) -> Result<bool, BoxError> {
        let set: Option<String> = redis::cmd("SET")
            .arg(format!("gateway:{}:{what}:{}", order.run, order.id))
            .arg(1)
            .arg("NX")
            .query_async(&mut self.0.clone())
            .await?;
        Ok(set.is_some())
    }

    /// Charges per order in `run`.
    async fn ledger(&self, run: u64) -> Result<BTreeMap<u64, u64>, BoxError> {
        Ok(redis::cmd("HGETALL")
            .arg(format!("gateway:{run}:charges"))
            .query_async(&mut self.0.clone())
            .await?)
    }
}

fn env(name: &str) -> Result<String, BoxError> {
    std::env::var(name).map_err(|_| format!("set {name}: this example needs a real server").into())
}

fn topology(run: u64) -> Topology {
    Topology::new(format!("rabbitmq-orders-{run}"))
}

async fn channel() -> Result<(Connection, Channel), BoxError> {
    let connection =
        Connection::connect(&env("AMQP_URL")?, ConnectionProperties::default()).await?;
    let channel = connection.create_channel().await?;
    Ok((connection, channel))
}

/// Until the parent closes our stdin.
async fn parent_gone() {
    let mut sink = Vec::new();
    let _ = tokio::io::stdin().read_to_end(&mut sink).await;
}

/// What a worker reports about one delivery, as one JSON line to the parent.
fn report(order: u64, result: Result<&Receipt, String>, dying: bool) {
    let line = match result {
        Ok(receipt) => json!({"order": order, "charge_id": receipt.charge_id, "dying": dying}),
        Err(error) => json!({"order": order, "error": error}),
    };
    println!("{line}");
}

/// The worker that completes [`CRASH_ORDER`] first reports that it is dying and never acks; the
/// parent kills the process. Workers take one delivery at a time (prefetch 1), so the dying
/// worker is in the middle of no other charge.
async fn die_if_chosen(gateway: &Gateway, order: &Order) -> Result<bool, BoxError> {
    Ok(order.id == CRASH_ORDER && gateway.first_time("crash", order).await?)
}

/// One worker process: charges orders from the queue until the parent closes its stdin.
async fn worker(run: u64, idempotask: bool) -> Result<(), BoxError> {
    idempotask::install(RedisStore::connect(&env("REDIS_URL")?).await?);
    let gateway = Gateway::connect().await?;
    let (_connection, channel) = channel().await?;
    let topology = topology(run);
    let retries = topology.declare(&channel).await?;
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
    let stop = parent_gone();
    tokio::pin!(stop);
    loop {
        let delivery = tokio::select! {
            () = &mut stop => return Ok(()),
            next = deliveries.next() => match next {
                Some(delivery) => delivery?,
                None => return Ok(()),
            },
        };
        let order: Order = serde_json::from_slice(&delivery.data)?;
        if idempotask {
            charge_with_idempotask(&charge_once, &gateway, &order, delivery).await?;
        } else {
            charge_without(&gateway, &order, delivery).await?;
        }
    }
}

async fn charge_with_idempotask(
    charge_once: &Idempotent<MessageId>,
    gateway: &Gateway,
    order: &Order,
    delivery: Delivery,
) -> Result<(), BoxError> {
    let decision = charge_once
        .run(delivery, |_| {
            let (gateway, order) = (gateway.clone(), order.clone());
            async move { gateway.charge(&order).await.map_err(|err| err.to_string()) }
        })
        .await;
    match decision.settled() {
        Settled::Acked(charged) => {
            let dying = die_if_chosen(gateway, order).await?;
            report(order.id, Ok(&charged.value), dying);
            if dying {
                std::future::pending::<()>().await;
            }
        }
        Settled::Retrying { cause, .. } | Settled::DeadLettered(cause) => {
            report(order.id, Err(cause.to_string()), false);
        }
        _ => report(order.id, Err("settled otherwise".to_owned()), false),
    }
    decision.settle().await?;
    Ok(())
}

/// The same consumer without idempotask: charge, then ack; a failure is nacked with requeue, the
/// queue's own retry.
async fn charge_without(
    gateway: &Gateway,
    order: &Order,
    delivery: Delivery,
) -> Result<(), BoxError> {
    match gateway.charge(order).await {
        Ok(receipt) => {
            let dying = die_if_chosen(gateway, order).await?;
            report(order.id, Ok(&receipt), dying);
            if dying {
                std::future::pending::<()>().await;
            }
            delivery.ack(BasicAckOptions::default()).await?;
        }
        Err(err) => {
            report(order.id, Err(err.to_string()), false);
            delivery
                .nack(BasicNackOptions {
                    requeue: true,
                    multiple: false,
                })
                .await?;
        }
    }
    Ok(())
}

/// Declares the queues and publishes the orders of `run`, each with its key as `message_id`.
async fn publish_orders(channel: &Channel, run: u64) -> Result<(), BoxError> {
    let topology = topology(run);
    topology.declare(channel).await?;
    for id in 1..=ORDERS {
        let order = Order { run, id };
        let properties = BasicProperties::default()
            .with_message_id(format!("order-charge-{run}-{id}").into())
            .with_delivery_mode(2);
        let confirm = channel
            .basic_publish(
                "".into(),
                topology.queue().into(),
                BasicPublishOptions::default(),
                &serde_json::to_vec(&order)?,
                properties,
            )
            .await?
            .await?;
        if !confirm.is_ack() {
            return Err(format!("the broker refused order {id}").into());
        }
    }
    Ok(())
}

/// How many messages wait in `queue`.
async fn depth(channel: &Channel, queue: &str) -> Result<u32, BoxError> {
    let passive = QueueDeclareOptions {
        passive: true,
        ..QueueDeclareOptions::default()
    };
    Ok(channel
        .queue_declare(queue.into(), passive, FieldTable::default())
        .await?
        .message_count())
}

/// Removes the run's queues and exchange from the broker.
async fn delete_topology(channel: &Channel, run: u64) -> Result<(), BoxError> {
    let topology = topology(run);
    for queue in [
        topology.queue(),
        topology.retry_queue(),
        topology.dead_letter_queue(),
    ] {
        channel
            .queue_delete(queue.into(), QueueDeleteOptions::default())
            .await?;
    }
    channel
        .exchange_delete(
            topology.dead_letter_exchange().into(),
            ExchangeDeleteOptions::default(),
        )
        .await?;
    Ok(())
}

/// One line a worker printed about one delivery.
#[derive(Debug, Deserialize)]
struct Line {
    order: u64,
    charge_id: Option<String>,
    #[serde(default)]
    dying: bool,
}

/// Starts the workers, kills the one that dies, and waits until every order was answered by a
/// worker that lives to ack it.
async fn run_workers(run: u64, idempotask: bool) -> Result<(Vec<Line>, usize), BoxError> {
    let (lines_tx, mut lines) = tokio::sync::mpsc::unbounded_channel();
    let mut children: Vec<Child> = Vec::new();
    for index in 0..WORKERS {
        let mut command = Command::new(std::env::current_exe()?);
        command
            .args(["--worker", "--run", &run.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true);
        if !idempotask {
            command.arg("--without-idempotask");
        }
        let mut child = command.spawn()?;
        let mut stdout = BufReader::new(child.stdout.take().ok_or("no stdout")?).lines();
        let lines_tx = lines_tx.clone();
        tokio::spawn(async move {
            while let Ok(Some(line)) = stdout.next_line().await {
                if lines_tx.send((index, line)).is_err() {
                    break;
                }
            }
        });
        children.push(child);
    }
    drop(lines_tx);

    let mut deliveries = Vec::new();
    let mut killed = HashSet::new();
    let mut answered = HashSet::new();
    while answered.len() < usize::try_from(ORDERS)? {
        let (index, line) = lines.recv().await.ok_or("every worker exited")?;
        eprintln!("worker {index}: {line}");
        let delivery: Line = serde_json::from_str(&line)?;
        if delivery.dying {
            // SIGKILL, as `kill -9`: no destructor, no ack, no goodbye to the broker, whose
            // connection to the worker then closes and whose unacked delivery goes to another.
            children[index].start_kill()?;
            children[index].wait().await?;
            killed.insert(index);
        } else if delivery.charge_id.is_some() {
            answered.insert(delivery.order);
        }
        deliveries.push(delivery);
    }
    // Closing stdin rather than a signal lets each worker finish the ack it is sending, so
    // nothing the survivors answered comes back to a next run.
    for child in &mut children {
        drop(child.stdin.take());
    }
    for (index, child) in children.iter_mut().enumerate() {
        let status = child.wait().await?;
        if !status.success() && !killed.contains(&index) {
            return Err(format!("worker {index} failed: {status}").into());
        }
    }
    while let Some((index, line)) = lines.recv().await {
        eprintln!("worker {index}: {line}");
        deliveries.push(serde_json::from_str(&line)?);
    }
    Ok((deliveries, killed.len()))
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let idempotask = !args.iter().any(|arg| arg == "--without-idempotask");
    let run_arg = args
        .iter()
        .position(|arg| arg == "--run")
        .and_then(|at| args.get(at + 1)?.parse().ok());
    if args.iter().any(|arg| arg == "--worker") {
        return worker(run_arg.ok_or("--worker needs --run <run>")?, idempotask).await;
    }

    let started = Instant::now();
    let run = u64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_micros(),
    )?;
    let gateway = Gateway::connect().await?;
    let (_connection, channel) = channel().await?;
    publish_orders(&channel, run).await?;
    let (deliveries, killed) =
        tokio::time::timeout(Duration::from_secs(60), run_workers(run, idempotask))
            .await
            .map_err(|_| "the workers did not charge every order within 60 s")??;

    let ledger = gateway.ledger(run).await?;
    let side_effects: u64 = ledger.values().sum();
    let charged_twice = ledger.values().filter(|charges| **charges > 1).count();
    let answers: Vec<&String> = deliveries
        .iter()
        .filter_map(|d| d.charge_id.as_ref())
        .collect();
    let distinct: HashSet<&String> = answers.iter().copied().collect();
    // A delivery that got a receipt another delivery already got was answered from the store.
    let duplicates_prevented = answers.len() - distinct.len();
    let topology = topology(run);
    let left_in_queues =
        depth(&channel, topology.queue()).await? + depth(&channel, topology.retry_queue()).await?;
    let dead_lettered = depth(&channel, topology.dead_letter_queue()).await?;
    delete_topology(&channel, run).await?;
    let summary = json!({
        "backend": "rabbitmq",
        "idempotask": idempotask,
        "jobs": ORDERS,
        "deliveries": deliveries.len(),
        "failed_deliveries": deliveries.len() - answers.len(),
        "killed_workers": killed,
        "side_effects": side_effects,
        "duplicates_prevented": duplicates_prevented,
        "charged_twice": charged_twice,
        "left_in_queues": left_in_queues,
        "dead_lettered": dead_lettered,
        "elapsed_ms": started.elapsed().as_millis(),
    });
    println!("{summary}");
    if idempotask && (side_effects != ORDERS || charged_twice != 0) {
        return Err(format!("{side_effects} charges for {ORDERS} orders").into());
    }
    Ok(())
}
