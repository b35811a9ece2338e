//! NATS workers that crash: each order is charged once all the same.
//!
//! A producer publishes orders to a NATS stream, each with a `Nats-Msg-Id`; three worker
//! processes pull them from one durable consumer and charge them at a payment gateway (a ledger
//! in Redis). The gateway rejects the first request for some orders, so those messages fail once,
//! are nak'd and come back. The worker that finishes one particular order first dies right after
//! the charge and before its ack (its process gets SIGKILL, `kill -9`); once the consumer's
//! `AckWait` has passed without an ack or a progress ack, NATS delivers the message to
//! another worker.
//!
//! With the work run through `idempotask_nats::Idempotent`, keyed by the `Nats-Msg-Id`, that
//! redelivery gets the stored receipt and the order is charged once; with `--without-idempotask`
//! it is charged twice. The last line of output is one JSON summary; each delivery is shown on
//! stderr as it happens.
//!
//! ```text
//! NATS_URL=nats://127.0.0.1:4222 REDIS_URL=redis://127.0.0.1:6379 \
//!     cargo run --example nats_worker --features nats [-- --without-idempotask]
//! ```
//! The server needs its streams on (`nats-server -js`). The idempotask store is the Redis at
//! `REDIS_URL`, which also holds the gateway's ledger.
//!
//! It needs:
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
//! tokio = { version = "1", features = ["macros", "rt-multi-thread", "process", "io-util", "io-std", "time"] }
//! ```

use std::collections::{BTreeMap, HashSet};
use std::process::Stdio;
use std::time::{Duration, Instant};

use async_nats::jetstream::consumer::{PullConsumer, pull};
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::{self, AckKind, Message};
use futures_util::StreamExt;
use idempotask::{Outcome, RetryPolicy, Task};
use idempotask_nats::{Handled, Idempotent, MsgId};
use idempotask_redis::RedisStore;
use redis::aio::ConnectionManager;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::{Child, Command};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const ORDERS: u64 = 12;
const WORKERS: usize = 3;
/// The worker that charges this order first dies before it acks.
const CRASH_ORDER: u64 = 5;
/// The gateway rejects the first request for these orders.
fn flaky(order: u64) -> bool {
    order % 4 == 2
}

/// The consumer's `AckWait`: short, so the dead worker's message comes back within seconds.
const ACK_WAIT: Duration = Duration::from_secs(2);

/// The lock TTL is no longer than `AckWait`: a message redelivered because its worker died
/// mid-charge then finds the lock expired instead of being nak'd until it does. A busy key is
/// nak'd at once with the holder's remaining lock time, rather than holding a worker.
static CHARGE: Task = Task::new("nats_order_charge")
    .lock_ttl(Duration::from_secs(1))
    .retry(RetryPolicy::no_wait());

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Order {
    /// Each run uses its own stream and orders, so runs against the same servers share nothing.
    run: u64,
    id: u64,
}

/// What the gateway answers a charge with; the charge id names one charge of one order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Receipt {
    order: u64,
    charge_id: String,
}

/// The payment gateway: a ledger of charges per order, in Redis, where a killed worker cannot
/// take its charges back.
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
            .arg(format!("gateway:nats:{}:charges", order.run))
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
            .arg(format!("gateway:nats:{}:{what}:{}", order.run, order.id))
            .arg(1)
            .arg("NX")
            .query_async(&mut self.0.clone())
            .await?;
        Ok(set.is_some())
    }

    /// Charges per order in `run`.
    async fn ledger(&self, run: u64) -> Result<BTreeMap<u64, u64>, BoxError> {
        Ok(redis::cmd("HGETALL")
            .arg(format!("gateway:nats:{run}:charges"))
            .query_async(&mut self.0.clone())
            .await?)
    }
}

fn env(name: &str) -> Result<String, BoxError> {
    std::env::var(name).map_err(|_| format!("set {name}: this example needs a real server").into())
}

fn stream_name(run: u64) -> String {
    format!("ORDERS_{run}")
}

fn subject(run: u64) -> String {
    format!("orders.{run}")
}

/// The run's stream and its one durable consumer, shared by every worker.
async fn consumer(js: &jetstream::Context, run: u64) -> Result<PullConsumer, BoxError> {
    let stream = js.get_stream(stream_name(run)).await?;
    Ok(stream
        .get_or_create_consumer(
            "chargers",
            pull::Config {
                durable_name: Some("chargers".to_owned()),
                ack_wait: ACK_WAIT,
                ..Default::default()
            },
        )
        .await?)
}

/// Until the parent closes our stdin.
async fn parent_gone() {
    let mut sink = Vec::new();
    let _ = tokio::io::stdin().read_to_end(&mut sink).await;
}

/// One worker process: charges orders until the parent closes its stdin.
async fn worker(run: u64, idempotask: bool) -> Result<(), BoxError> {
    idempotask::install(RedisStore::connect(&env("REDIS_URL")?).await?);
    let gateway = Gateway::connect().await?;
    let client = async_nats::connect(env("NATS_URL")?).await?;
    let consumer = consumer(&jetstream::new(client.clone()), run).await?;
    // One message at a time, so the dying worker is in the middle of no other charge.
    let mut messages = consumer
        .stream()
        .max_messages_per_batch(1)
        .messages()
        .await?;
    let charge_once = Idempotent::new(CHARGE.clone(), MsgId).ack_wait(ACK_WAIT);
    let stop = parent_gone();
    tokio::pin!(stop);
    loop {
        let message = tokio::select! {
            () = &mut stop => break,
            message = messages.next() => match message {
                Some(message) => message?,
                None => break,
            },
        };
        deliver(&message, &gateway, &charge_once, idempotask).await?;
    }
    client.flush().await?;
    Ok(())
}

/// Charges the order in `message`, plays the crash, acks, and reports the delivery to the
/// parent as one JSON line.
async fn deliver(
    message: &Message,
    gateway: &Gateway,
    charge_once: &Idempotent<MsgId>,
    idempotask: bool,
) -> Result<(), BoxError> {
    let order: Order = serde_json::from_slice(&message.payload)?;
    let charge = gateway.charge(&order);
    // `process`, not `handle`: the ack waits until the crash below has had its chance, and is
    // then sent confirmed.
    let (kind, receipt, outcome) = if idempotask {
        let handled = charge_once.process(message, charge).await;
        let kind = handled.ack_kind();
        match handled {
            Handled::Acked(report) => (kind, Ok(report.value), Some(report.outcome)),
            Handled::Failed { error, .. } => (kind, Err(error.to_string()), None),
            Handled::Deferred { error, .. } => (kind, Err(error.to_string()), None),
            Handled::Terminated(why) => (kind, Err(why.to_string()), None),
            _ => (
                kind,
                Err("an outcome this example does not know".to_owned()),
                None,
            ),
        }
    } else {
        match charge.await {
            Ok(receipt) => (AckKind::Ack, Ok(receipt), None),
            Err(err) => (AckKind::Nak(None), Err(err.to_string()), None),
        }
    };
    let line = match &receipt {
        Ok(receipt) => json!({
            "order": order.id,
            "charge_id": receipt.charge_id,
            "replayed": outcome == Some(Outcome::Replayed),
        }),
        Err(err) => json!({"order": order.id, "error": err}),
    };
    // Charged, not yet acked: the worker that gets here first with the crash order dies.
    if receipt.is_ok() && order.id == CRASH_ORDER && gateway.first_time("crash", &order).await? {
        let mut dying = line.clone();
        dying["dying"] = json!(true);
        println!("{dying}");
        std::future::pending::<()>().await;
    }
    // Sent and confirmed before the line says so, so the parent may stop us right after it.
    message.double_ack_with(kind).await?;
    println!("{line}");
    Ok(())
}

/// Creates the run's stream and publishes its orders, each with its own `Nats-Msg-Id`.
async fn publish_orders(js: &jetstream::Context, run: u64) -> Result<(), BoxError> {
    js.create_stream(jetstream::stream::Config {
        name: stream_name(run),
        subjects: vec![subject(run)],
        ..Default::default()
    })
    .await?;
    consumer(js, run).await?;
    for id in 1..=ORDERS {
        let payload = serde_json::to_vec(&Order { run, id })?;
        let publish = PublishMessage::build()
            .payload(payload.into())
            .message_id(format!("order-charge-{run}-{id}"));
        js.send_publish(subject(run), publish).await?.await?;
    }
    Ok(())
}

/// One line a worker printed about one delivery.
#[derive(Debug, Deserialize)]
struct Delivery {
    order: u64,
    charge_id: Option<String>,
    #[serde(default)]
    replayed: bool,
    #[serde(default)]
    dying: bool,
}

/// Starts the workers, kills the one that dies, and waits until every order was answered by a
/// worker that lives to ack it.
async fn run_workers(run: u64, idempotask: bool) -> Result<(Vec<Delivery>, usize), BoxError> {
    let (lines_tx, mut lines) = tokio::sync::mpsc::unbounded_channel();
    let mut children: Vec<Child> = Vec::new();
    for index in 0..WORKERS {
        let mut command = Command::new(std::env::current_exe()?);
        command
            .args(["--worker", &index.to_string(), "--run", &run.to_string()])
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
        let delivery: Delivery = serde_json::from_str(&line)?;
        if delivery.dying {
            // SIGKILL, as `kill -9`: no destructor, no ack, no goodbye to the server.
            children[index].start_kill()?;
            children[index].wait().await?;
            killed.insert(index);
        } else if delivery.charge_id.is_some() {
            answered.insert(delivery.order);
        }
        deliveries.push(delivery);
    }
    // Closing their stdin stops the others: they finish the message at hand and leave.
    for child in &mut children {
        drop(child.stdin.take());
    }
    for (index, child) in children.iter_mut().enumerate() {
        let status = child.wait().await?;
        if !status.success() && !killed.contains(&index) {
            return Err(format!("worker {index} failed: {status}").into());
        }
    }
    // A worker may print its last delivery while it shuts down; those count too.
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
    let value = |flag: &str| -> Option<u64> {
        let at = args.iter().position(|arg| arg == flag)?;
        args.get(at + 1)?.parse().ok()
    };
    if let (Some(_), Some(run)) = (value("--worker"), value("--run")) {
        return worker(run, idempotask).await;
    }

    let started = Instant::now();
    let run = u64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_micros(),
    )?;
    let gateway = Gateway::connect().await?;
    let js = jetstream::new(async_nats::connect(env("NATS_URL")?).await?);
    publish_orders(&js, run).await?;
    let (deliveries, killed) =
        tokio::time::timeout(Duration::from_secs(60), run_workers(run, idempotask))
            .await
            .map_err(|_| "the workers did not charge every order within 60 s")??;

    let mut consumer = consumer(&js, run).await?;
    let info = consumer.info().await?.clone();
    js.delete_stream(stream_name(run)).await?;
    let ledger = gateway.ledger(run).await?;
    let side_effects: u64 = ledger.values().sum();
    let charged_twice = ledger.values().filter(|charges| **charges > 1).count();
    let answers = deliveries.iter().filter(|d| d.charge_id.is_some()).count();
    let replayed = deliveries.iter().filter(|d| d.replayed).count();
    let summary = json!({
        "backend": "nats-jetstream",
        "idempotask": idempotask,
        "jobs": ORDERS,
        "deliveries": deliveries.len(),
        "failed_deliveries": deliveries.len() - answers,
        "killed_workers": killed,
        "side_effects": side_effects,
        "duplicates_prevented": replayed,
        "charged_twice": charged_twice,
        "server_deliveries": info.delivered.consumer_sequence,
        // The server's own word that nothing is left unacked, not the workers' lines: a killed
        // worker's line may be missing, the server's count cannot be.
        "acked": if info.num_ack_pending == 0 { info.ack_floor.stream_sequence } else { 0 },
        "elapsed_ms": started.elapsed().as_millis(),
    });
    println!("{summary}");
    if idempotask && (side_effects != ORDERS || charged_twice != 0) {
        return Err(format!("{side_effects} charges for {ORDERS} orders").into());
    }
    Ok(())
}
