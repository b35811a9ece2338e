//! The queue consumers' bench: NATS JetStream and RabbitMQ, each message a fresh unit, consumed
//! by three consumers side by side on the same broker and the same Redis:
//!
//! - **bare**: the body, then the ack (no idempotency at all);
//! - **hand-written**: the seed's pattern inside the consumer, with redis-rs: `GET` the marker,
//!   `SET lock token NX PX`, the body, `SET` the marker, a compare-and-delete of the lock, then
//!   the ack (four round trips for a fresh message);
//! - **idempotask**: the integration (`idempotask_nats::Idempotent::handle`,
//!   `idempotask_lapin::Idempotent::process`) on a `RedisStore` (two round trips).
//!
//! Each round publishes [`QueueConfig::messages`] messages (untimed) to a queue of their own for
//! every (broker, in flight, consumer), then times their consumption; the consumers' order is
//! rotated round by round so that none always runs first. "In flight" is the consumer's limit
//! of unacked messages (JetStream's `max_ack_pending`, RabbitMQ's `basic_qos` prefetch) and the
//! number of messages handled at once. Every round also measures the Redis `PING` round trip,
//! which the 1-in-flight comparison is made against, and the CPU time each consumption cost
//! this process (the client), Redis (`INFO cpu`) and the broker's processes on this machine
//! (`nats-server`, RabbitMQ's `beam.smp`, from `/proc`): on a machine whose cores the client
//! and both servers share, messages per second follow their sum.
//!
//! `src/bin/queues.rs` is its command line; `tests/queues_smoke.rs` runs it with a tiny N.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer::pull, message::PublishMessage};
use futures_util::StreamExt;
use idempotask::store::LockToken;
use idempotask::{RetryPolicy, Task};
use idempotask_redis::RedisStore;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions};
use lapin::options::{BasicNackOptions, ConfirmSelectOptions};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Connection as AmqpConnection, ConnectionProperties};
use redis::aio::ConnectionManager;
use serde::{Deserialize, Serialize};

use crate::cpu::CpuClocks;
use crate::server::server_cpu;

/// Any error of the queue bench: a broker, Redis, or a count that does not add up.
pub type QueueError = Box<dyn std::error::Error + Send + Sync>;

/// The task every idempotask consumer runs; the keys carry the run's id, so each run's units
/// are fresh.
static QUEUE_TASK: Task = Task::new("queue_bench").retry(RetryPolicy::no_wait());

/// The compare-and-delete that releases the hand-written consumer's lock.
const RELEASE: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

/// What to run.
#[derive(Debug, Clone)]
pub struct QueueConfig {
    /// `nats://…` of a `nats-server` with JetStream on; `None` leaves NATS out.
    pub nats_url: Option<String>,
    /// `amqp://…` of a RabbitMQ broker; `None` leaves RabbitMQ out.
    pub amqp_url: Option<String>,
    /// The Redis both the hand-written consumer and the integration's store use.
    pub redis_url: String,
    /// Messages per (broker, in flight, consumer) per round.
    pub messages: usize,
    /// The in-flight limits measured, e.g. `[1, 64]`.
    pub in_flight: Vec<usize>,
    /// Rounds; every configuration runs once per round.
    pub rounds: usize,
    /// The consumers measured, in the first round's order (all three, for the comparisons; one
    /// alone, to profile it).
    pub consumers: Vec<Consumer>,
}

/// One of the three consumers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Consumer {
    /// The body, then the ack.
    Bare,
    /// The seed's pattern with redis-rs, then the ack.
    Handwritten,
    /// The integration crate.
    Idempotask,
}

impl Consumer {
    /// The three, in the order of the first round.
    pub const ALL: [Self; 3] = [Self::Bare, Self::Handwritten, Self::Idempotask];

    /// The consumer of that name ([`name`](Self::name)), if any.
    pub fn named(name: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|consumer| consumer.name() == name)
    }

    /// The name in the tables and the JSON lines.
    pub fn name(self) -> &'static str {
        match self {
            Self::Bare => "bare",
            Self::Handwritten => "hand-written",
            Self::Idempotask => "idempotask",
        }
    }
}

/// The broker a measurement ran on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Broker {
    /// NATS JetStream, through async-nats and `idempotask-nats`.
    Nats,
    /// RabbitMQ, through lapin and `idempotask-lapin`.
    Rabbitmq,
}

impl Broker {
    /// Its part of a queue's name (and so of its messages' keys).
    fn tag(self) -> &'static str {
        match self {
            Self::Nats => "nats",
            Self::Rabbitmq => "amqp",
        }
    }

    /// Its server's process name on this machine, as `/proc/<pid>/stat` gives it.
    fn process(self) -> &'static str {
        match self {
            Self::Nats => "nats-server",
            Self::Rabbitmq => "beam.smp",
        }
    }

    /// The name in the tables.
    pub fn name(self) -> &'static str {
        match self {
            Self::Nats => "NATS JetStream",
            Self::Rabbitmq => "RabbitMQ",
        }
    }
}

/// One consumer's run over one queue of fresh messages.
#[derive(Debug, Clone, Serialize)]
pub struct QueueMeasurement {
    /// Where.
    pub broker: Broker,
    /// Who consumed.
    pub consumer: Consumer,
    /// The limit of unacked messages, and of messages handled at once.
    pub in_flight: usize,
    /// The round, from 0.
    pub round: usize,
    /// Messages published and acked.
    pub messages: usize,
    /// Bodies run, over all messages.
    pub bodies: u64,
    /// Messages whose body ran exactly once.
    pub exactly_once: usize,
    /// Messages acked per second, from the first delivery asked for to the last ack.
    pub msgs_per_sec: f64,
    /// The median Redis `PING` round trip measured in the same round, in microseconds.
    pub redis_rtt_us: f64,
    /// CPU time of this process (the consumer, and the publisher idle meanwhile) per message
    /// while the messages were consumed, in microseconds; `None` off Linux.
    pub client_cpu_us_per_msg: Option<f64>,
    /// Redis's CPU time per message meanwhile (`INFO cpu`), in microseconds.
    pub redis_cpu_us_per_msg: f64,
    /// The broker's CPU time per message meanwhile, in microseconds: every local process of its
    /// name; `None` when none is found, as for a remote broker.
    pub broker_cpu_us_per_msg: Option<f64>,
}

/// What consuming one batch cost: wall time, and CPU time of the client, Redis and the broker.
struct Consumed {
    elapsed: Duration,
    client_cpu_us: Option<f64>,
    redis_cpu_us: f64,
    broker_cpu_us: Option<f64>,
}

/// The clocks a batch's consumption is measured with, started just before its first delivery
/// is asked for (the publishing before it is not counted).
struct Clocks {
    wall: Instant,
    cpu: CpuClocks,
    redis: Duration,
    server: ConnectionManager,
}

impl Clocks {
    async fn start(shared: &Shared, broker: Broker) -> Result<Self, QueueError> {
        let mut server = shared.redis.clone();
        let redis = server_cpu(std::slice::from_mut(&mut server)).await?;
        Ok(Self {
            cpu: CpuClocks::now(broker.process()),
            redis,
            server,
            wall: Instant::now(),
        })
    }

    async fn stop(mut self) -> Result<Consumed, QueueError> {
        let elapsed = self.wall.elapsed();
        let (client_cpu_us, broker_cpu_us) = self.cpu.since();
        let redis = server_cpu(std::slice::from_mut(&mut self.server)).await?;
        Ok(Consumed {
            elapsed,
            client_cpu_us,
            redis_cpu_us: redis.saturating_sub(self.redis).as_secs_f64() * 1e6,
            broker_cpu_us,
        })
    }
}

/// How many times each message's body ran, by the message's number.
struct Bodies(Vec<AtomicU32>);

impl Bodies {
    fn new(messages: usize) -> Arc<Self> {
        Arc::new(Self((0..messages).map(|_| AtomicU32::new(0)).collect()))
    }

    /// The body every consumer runs: reads the message's number from its payload, counts the
    /// run, and computes a small value from it.
    fn run(&self, payload: &[u8]) -> u64 {
        let number: usize = std::str::from_utf8(payload)
            .ok()
            .and_then(|text| text.parse().ok())
            .unwrap_or(usize::MAX);
        if let Some(count) = self.0.get(number) {
            count.fetch_add(1, Ordering::Relaxed);
        }
        payload
            .iter()
            .fold(17_u64, |sum, byte| sum.wrapping_mul(31) ^ u64::from(*byte))
    }

    /// Bodies run in total, and messages run exactly once.
    fn counts(&self) -> (u64, usize) {
        let runs = self.0.iter().map(|count| count.load(Ordering::Relaxed));
        let total = runs.clone().map(u64::from).sum();
        (total, runs.filter(|&count| count == 1).count())
    }
}

/// What every consumer of a run shares: the store and the hand-written consumer's connection.
#[derive(Clone)]
struct Shared {
    store: RedisStore,
    redis: ConnectionManager,
    /// Sets this run's keys apart from any earlier run's on the same Redis.
    run: u64,
}

/// One queue's worth of work: its name (a subject or a queue), its messages' keys' prefix, and
/// their count.
struct Batch {
    name: String,
    messages: usize,
    in_flight: usize,
    consumer: Consumer,
    bodies: Arc<Bodies>,
}

impl Batch {
    fn key(&self, number: usize) -> String {
        format!("{}-{number}", self.name)
    }
}

/// Runs every configuration of `config` for its rounds, handing each measurement to `each` as
/// it is made.
///
/// # Errors
/// A broker or Redis failed, or a consumer stopped before every message was acked.
pub async fn run(
    config: &QueueConfig,
    mut each: impl FnMut(&QueueMeasurement),
) -> Result<Vec<QueueMeasurement>, QueueError> {
    let client = redis::Client::open(config.redis_url.as_str())?;
    let shared = Shared {
        store: RedisStore::connect(&config.redis_url).await?,
        redis: ConnectionManager::new(client).await?,
        run: rand::random::<u64>() >> 16,
    };
    let nats = match &config.nats_url {
        Some(url) => Some(NatsBench::new(url, shared.run, &shared.store).await?),
        None => None,
    };
    let rabbit = match &config.amqp_url {
        Some(url) => Some(RabbitBench::new(url).await?),
        None => None,
    };
    let mut measurements = Vec::new();
    for round in 0..config.rounds {
        let redis_rtt_us = ping_median_us(&mut shared.redis.clone()).await?;
        for &in_flight in &config.in_flight {
            for consumer in rotated(&config.consumers, round) {
                for broker in [Broker::Nats, Broker::Rabbitmq] {
                    let batch = Batch {
                        name: format!(
                            "qb{}-{}-{in_flight}-{}-{round}",
                            shared.run,
                            broker.tag(),
                            consumer.name()
                        ),
                        messages: config.messages,
                        in_flight: in_flight.max(1),
                        consumer,
                        bodies: Bodies::new(config.messages),
                    };
                    let consumed = match (broker, &nats, &rabbit) {
                        (Broker::Nats, Some(nats), _) => nats.measure(&batch, &shared).await?,
                        (Broker::Rabbitmq, _, Some(rabbit)) => {
                            rabbit.measure(&batch, &shared).await?
                        }
                        _ => continue,
                    };
                    let (bodies, exactly_once) = batch.bodies.counts();
                    #[allow(
                        clippy::cast_precision_loss,
                        reason = "message counts are far below 2^52"
                    )]
                    let per_msg = |us: f64| us / config.messages.max(1) as f64;
                    let measurement = QueueMeasurement {
                        broker,
                        consumer,
                        in_flight,
                        round,
                        messages: config.messages,
                        bodies,
                        exactly_once,
                        msgs_per_sec: per_sec(config.messages, consumed.elapsed),
                        redis_rtt_us,
                        client_cpu_us_per_msg: consumed.client_cpu_us.map(per_msg),
                        redis_cpu_us_per_msg: per_msg(consumed.redis_cpu_us),
                        broker_cpu_us_per_msg: consumed.broker_cpu_us.map(per_msg),
                    };
                    each(&measurement);
                    measurements.push(measurement);
                }
            }
        }
    }
    Ok(measurements)
}

/// `consumers` in round `round`'s order: rotated by one each round.
fn rotated(consumers: &[Consumer], round: usize) -> Vec<Consumer> {
    let mut order = consumers.to_vec();
    order.rotate_left(round % consumers.len().max(1));
    order
}

#[allow(
    clippy::cast_precision_loss,
    reason = "message counts are far below 2^52"
)]
fn per_sec(messages: usize, elapsed: Duration) -> f64 {
    messages as f64 / elapsed.as_secs_f64().max(1e-9)
}

/// The median of 1,000 sequential `PING`s, in microseconds.
async fn ping_median_us(redis: &mut ConnectionManager) -> Result<f64, QueueError> {
    let mut samples = Vec::with_capacity(1000);
    for _ in 0..1000 {
        let sent = Instant::now();
        let _: String = redis::cmd("PING").query_async(redis).await?;
        samples.push(sent.elapsed());
    }
    samples.sort_unstable();
    Ok(samples[samples.len() / 2].as_secs_f64() * 1e6)
}

/// Why the hand-written consumer did not run a message's body.
#[derive(Debug, PartialEq, Eq)]
enum Handwritten {
    /// The body ran and the marker was written.
    Done,
    /// The marker was there: a duplicate.
    Replayed,
    /// Another holder has the lock.
    Busy,
}

/// The seed's pattern, four round trips for a fresh key: `GET` the marker, `SET lock token NX
/// PX`, the body, `SET` the marker, the compare-and-delete of the lock.
async fn handwritten(
    redis: &mut ConnectionManager,
    key: &str,
    body: impl FnOnce() -> u64,
) -> Result<Handwritten, QueueError> {
    let done = format!("hw:{key}:done");
    let lock = format!("hw:{key}:lock");
    let stored: Option<Vec<u8>> = redis::cmd("GET").arg(&done).query_async(redis).await?;
    if stored.is_some() {
        return Ok(Handwritten::Replayed);
    }
    let token = LockToken::generate();
    let acquired: Option<String> = redis::cmd("SET")
        .arg(&lock)
        .arg(token.as_str())
        .arg("NX")
        .arg("PX")
        .arg(30_000)
        .query_async(redis)
        .await?;
    if acquired.is_none() {
        return Ok(Handwritten::Busy);
    }
    let value = serde_json::to_vec(&body())?;
    let () = redis::cmd("SET")
        .arg(&done)
        .arg(value)
        .arg("EX")
        .arg(86_400)
        .query_async(redis)
        .await?;
    let _: i64 = redis::cmd("EVAL")
        .arg(RELEASE)
        .arg(1)
        .arg(&lock)
        .arg(token.as_str())
        .query_async(redis)
        .await?;
    Ok(Handwritten::Done)
}

/// The NATS side: one connection, one stream for the run's subjects.
struct NatsBench {
    context: jetstream::Context,
    stream: jetstream::stream::Stream,
    /// One for the whole run, as a long-running consumer has: its consumer check (and the
    /// failure bucket's creation) happens once, not in every timed batch.
    integration: idempotask_nats::Idempotent<idempotask_nats::MsgId>,
}

impl NatsBench {
    async fn new(url: &str, run: u64, store: &RedisStore) -> Result<Self, QueueError> {
        let context = jetstream::new(async_nats::connect(url).await?);
        let stream = context
            .create_stream(jetstream::stream::Config {
                name: format!("QB{run}"),
                subjects: vec![format!("qb{run}.>")],
                ..Default::default()
            })
            .await?;
        let integration =
            idempotask_nats::Idempotent::new(QUEUE_TASK.clone(), idempotask_nats::MsgId)
                .store(store.clone());
        Ok(Self {
            context,
            stream,
            integration,
        })
    }

    /// Publishes the batch's messages (untimed), then times a consumer of their own over them.
    async fn measure(&self, batch: &Batch, shared: &Shared) -> Result<Consumed, QueueError> {
        let subject = batch.name.replace('-', ".");
        let mut acks = Vec::with_capacity(256);
        for number in 0..batch.messages {
            let message = PublishMessage::build()
                .payload(number.to_string().into())
                .message_id(batch.key(number));
            acks.push(self.context.send_publish(subject.clone(), message).await?);
            if acks.len() == 256 || number + 1 == batch.messages {
                for ack in acks.drain(..) {
                    ack.await?;
                }
            }
        }
        let consumer = self
            .stream
            .create_consumer(pull::Config {
                durable_name: Some(batch.name.clone()),
                filter_subject: subject,
                max_ack_pending: i64::try_from(batch.in_flight)?,
                ..Default::default()
            })
            .await?;
        let clocks = Clocks::start(shared, Broker::Nats).await?;
        // The consumer's `max_ack_pending` keeps no more than `in_flight` messages out; the pull
        // requests ask for async-nats's default batch, as a worker's loop does. Batches of one
        // message stalled now and then for a pull request's whole expiry (30 s).
        let messages = consumer.messages().await?;
        let integration = &self.integration;
        messages
            .take(batch.messages)
            .map(|message| {
                let mut redis = shared.redis.clone();
                async move {
                    let message = message?;
                    self.consume(batch, integration, &mut redis, &message).await
                }
            })
            .buffer_unordered(batch.in_flight)
            .fold(Ok(()), |done: Result<(), QueueError>, one| async move {
                done.and(one)
            })
            .await?;
        let cost = clocks.stop().await?;
        self.stream.delete_consumer(&batch.name).await?;
        Ok(cost)
    }

    /// One message through the batch's consumer, acked once handled.
    async fn consume(
        &self,
        batch: &Batch,
        integration: &idempotask_nats::Idempotent<idempotask_nats::MsgId>,
        redis: &mut ConnectionManager,
        message: &jetstream::Message,
    ) -> Result<(), QueueError> {
        let bodies = &batch.bodies;
        match batch.consumer {
            Consumer::Bare => {
                bodies.run(&message.payload);
                message.ack().await?;
            }
            Consumer::Handwritten => {
                let key = nats_key(message)?;
                let done = handwritten(redis, key, || bodies.run(&message.payload)).await?;
                if done == Handwritten::Busy {
                    return Err(format!("{key} was busy").into());
                }
                message.ack().await?;
            }
            Consumer::Idempotask => {
                let body =
                    async { Ok::<_, std::convert::Infallible>(bodies.run(&message.payload)) };
                let handled = integration
                    .handle(message, body)
                    .await
                    .map_err(|err| err.to_string())?;
                if !matches!(handled, idempotask_nats::Handled::Acked(_)) {
                    return Err(format!("not acked: {handled:?}").into());
                }
            }
        }
        Ok(())
    }
}

/// The `Nats-Msg-Id` the bench published `message` with.
fn nats_key(message: &jetstream::Message) -> Result<&str, QueueError> {
    message
        .headers
        .as_ref()
        .and_then(|headers| headers.get(async_nats::header::NATS_MESSAGE_ID))
        .map(async_nats::HeaderValue::as_str)
        .ok_or_else(|| "a message without its Nats-Msg-Id".into())
}

/// The RabbitMQ side: one connection, a confirmed channel to publish on.
struct RabbitBench {
    connection: AmqpConnection,
    publisher: lapin::Channel,
}

impl RabbitBench {
    async fn new(url: &str) -> Result<Self, QueueError> {
        let connection = AmqpConnection::connect(url, ConnectionProperties::default()).await?;
        let publisher = connection.create_channel().await?;
        publisher
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        Ok(Self {
            connection,
            publisher,
        })
    }

    /// Declares the batch's queue and publishes its messages (untimed), then times a consumer
    /// on a channel of its own over them.
    async fn measure(&self, batch: &Batch, shared: &Shared) -> Result<Consumed, QueueError> {
        let channel = self.connection.create_channel().await?;
        let topology = idempotask_lapin::Topology::new(batch.name.as_str());
        let retries = topology.declare(&channel).await?;
        let mut confirms = Vec::with_capacity(256);
        for number in 0..batch.messages {
            let properties = BasicProperties::default().with_message_id(batch.key(number).into());
            let confirm = self
                .publisher
                .basic_publish(
                    "".into(),
                    batch.name.as_str().into(),
                    BasicPublishOptions::default(),
                    number.to_string().as_bytes(),
                    properties,
                )
                .await?;
            confirms.push(confirm);
            if confirms.len() == 256 || number + 1 == batch.messages {
                for confirm in confirms.drain(..) {
                    if !confirm.await?.is_ack() {
                        return Err("a publish was not confirmed".into());
                    }
                }
            }
        }
        let prefetch = u16::try_from(batch.in_flight)?;
        channel
            .basic_qos(prefetch, BasicQosOptions::default())
            .await?;
        let integration = idempotask_lapin::Idempotent::new(
            QUEUE_TASK.clone(),
            idempotask_lapin::MessageId,
            retries,
        )
        .store(shared.store.clone());
        let clocks = Clocks::start(shared, Broker::Rabbitmq).await?;
        let deliveries = channel
            .basic_consume(
                batch.name.as_str().into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        deliveries
            .take(batch.messages)
            .map(|delivery| {
                let (integration, mut redis) = (&integration, shared.redis.clone());
                async move { consume_delivery(batch, integration, &mut redis, delivery?).await }
            })
            .buffer_unordered(batch.in_flight)
            .fold(Ok(()), |done: Result<(), QueueError>, one| async move {
                done.and(one)
            })
            .await?;
        let cost = clocks.stop().await?;
        channel.close(200, "done".into()).await?;
        Ok(cost)
    }
}

/// One delivery through the batch's consumer, acked once handled.
async fn consume_delivery(
    batch: &Batch,
    integration: &idempotask_lapin::Idempotent<idempotask_lapin::MessageId>,
    redis: &mut ConnectionManager,
    delivery: lapin::message::Delivery,
) -> Result<(), QueueError> {
    let bodies = &batch.bodies;
    match batch.consumer {
        Consumer::Bare => {
            bodies.run(&delivery.data);
            delivery.ack(BasicAckOptions::default()).await?;
        }
        Consumer::Handwritten => {
            let key = delivery
                .properties
                .message_id()
                .as_ref()
                .ok_or("a delivery without its message_id")?
                .to_string();
            match handwritten(redis, &key, || bodies.run(&delivery.data)).await? {
                Handwritten::Busy => {
                    let requeue = BasicNackOptions {
                        requeue: true,
                        multiple: false,
                    };
                    delivery.nack(requeue).await?;
                    return Err(format!("{key} was busy").into());
                }
                Handwritten::Done | Handwritten::Replayed => {
                    delivery.ack(BasicAckOptions::default()).await?;
                }
            }
        }
        Consumer::Idempotask => {
            let settled = integration
                .process(delivery, |delivery| {
                    let value = bodies.run(&delivery.data);
                    async move { Ok::<_, std::convert::Infallible>(value) }
                })
                .await
                .map_err(|err| err.to_string())?;
            if !matches!(settled, idempotask_lapin::Settled::Acked(_)) {
                return Err(format!("not acked: {settled:?}").into());
            }
        }
    }
    Ok(())
}

/// The markdown table of a run: min, median and max msg/s of each (broker, in flight,
/// consumer), the ratios of the medians, and at 1 in flight what each message costs over the
/// bare consumer, next to two Redis round trips.
pub fn markdown(measurements: &[QueueMeasurement]) -> String {
    let mut rates: BTreeMap<(Broker, usize, Consumer), Vec<f64>> = BTreeMap::new();
    for m in measurements {
        rates
            .entry((m.broker, m.in_flight, m.consumer))
            .or_default()
            .push(m.msgs_per_sec);
    }
    let median_of = |key| {
        rates
            .get(&key)
            .map_or(f64::NAN, |rates| median(&mut rates.clone()))
    };
    let mut rtts: Vec<f64> = measurements.iter().map(|m| m.redis_rtt_us).collect();
    let rtt = median(&mut rtts);
    let mut out = String::from(
        "| broker | in flight | consumer | min msg/s | median msg/s | max msg/s | × hand-written | × bare | µs/msg over bare |\n| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for (&(broker, in_flight, consumer), samples) in &rates {
        let mut samples = samples.clone();
        let med = median(&mut samples);
        let min = samples.first().copied().unwrap_or(f64::NAN);
        let max = samples.last().copied().unwrap_or(f64::NAN);
        let hand = median_of((broker, in_flight, Consumer::Handwritten));
        let bare = median_of((broker, in_flight, Consumer::Bare));
        let over_bare = 1e6 / med - 1e6 / bare;
        let _ = writeln!(
            out,
            "| {} | {in_flight} | {} | {min:.0} | {med:.0} | {max:.0} | {:.2} | {:.2} | {over_bare:.1} |",
            broker.name(),
            consumer.name(),
            med / hand,
            med / bare,
        );
    }
    let _ = writeln!(
        out,
        "\nRedis round trip (`PING`, median of each round's 1,000, median over the rounds): {rtt:.1} µs; two round trips: {:.1} µs.",
        2.0 * rtt
    );
    out.push_str(&cpu_table(measurements));
    out
}

/// The markdown table of where the CPU went: the client's, Redis's and the broker's CPU time
/// per message of each (broker, in flight, consumer), medians over the rounds ("–" where it
/// could not be read).
fn cpu_table(measurements: &[QueueMeasurement]) -> String {
    type Samples = [Vec<f64>; 3];
    let mut cpu: BTreeMap<(Broker, usize, Consumer), Samples> = BTreeMap::new();
    for m in measurements {
        let samples = cpu.entry((m.broker, m.in_flight, m.consumer)).or_default();
        let readings = [
            m.client_cpu_us_per_msg,
            Some(m.redis_cpu_us_per_msg),
            m.broker_cpu_us_per_msg,
        ];
        for (sample, reading) in samples.iter_mut().zip(readings) {
            sample.extend(reading);
        }
    }
    let mut out = String::from(
        "\nCPU time per message while consuming, in µs (medians over the rounds): the client is this process, Redis its `INFO cpu`, the broker its processes on this machine.\n\n| broker | in flight | consumer | client | Redis | broker | sum |\n| --- | ---: | --- | ---: | ---: | ---: | ---: |\n",
    );
    for (&(broker, in_flight, consumer), samples) in &cpu {
        let [client, redis, server] = samples.clone().map(|mut s| median(&mut s));
        let cell = |us: f64| {
            if us.is_nan() {
                "–".to_owned()
            } else {
                format!("{us:.1}")
            }
        };
        let _ = writeln!(
            out,
            "| {} | {in_flight} | {} | {} | {} | {} | {} |",
            broker.name(),
            consumer.name(),
            cell(client),
            cell(redis),
            cell(server),
            cell(client + redis + server),
        );
    }
    out
}

/// The median of `samples`, which it sorts; NaN when empty.
fn median(samples: &mut [f64]) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples.get(samples.len() / 2).copied().unwrap_or(f64::NAN)
}
