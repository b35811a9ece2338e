//! What the queue bench runs, and what it measures.

use serde::{Deserialize, Serialize};

/// Any error of the queue bench: a broker, Redis, or a count that does not add up.
pub type QueueError = Box<dyn std::error::Error + Send + Sync>;

/// What to run.
#[derive(Debug, Clone)]
pub struct QueueConfig {
    /// `nats://…` of a `nats-server` with JetStream on; `None` leaves NATS out.
    pub nats_url: Option<String>,
    /// `amqp://…` of a RabbitMQ broker; `None` leaves RabbitMQ out.
    pub amqp_url: Option<String>,
    /// Whether to measure Redis Streams, whose streams live on the Redis of `redis_url`, next
    /// to the store's keys, as a user who already runs that Redis would have them.
    pub redis_streams: bool,
    /// The endpoint of an SQS API (`http://…`, a `moto_server` in the bench script); `None`
    /// leaves SQS out.
    pub sqs_url: Option<String>,
    /// The `bootstrap.servers` of a Kafka-protocol broker (tansu in the bench script); `None`
    /// leaves Kafka out.
    pub kafka_url: Option<String>,
    /// Messages per (in flight, consumer) per round on SQS, whose local server is far slower
    /// than the other brokers: a run of its own size.
    pub sqs_messages: usize,
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
    /// Redis Streams consumer groups, through redis-rs and `idempotask-redis-streams`, on the
    /// store's own Redis.
    RedisStreams,
    /// Amazon SQS's API, through aws-sdk-sqs and `idempotask-sqs`, on a local `moto_server`.
    Sqs,
    /// Kafka's protocol, through rdkafka and `idempotask-kafka`, on a local tansu broker.
    Kafka,
}

impl Broker {
    /// Every broker, in the order a round measures them.
    pub const ALL: [Self; 5] = [
        Self::Nats,
        Self::Rabbitmq,
        Self::RedisStreams,
        Self::Sqs,
        Self::Kafka,
    ];

    /// Its part of a queue's name (and so of its messages' keys).
    pub(super) fn tag(self) -> &'static str {
        match self {
            Self::Nats => "nats",
            Self::Rabbitmq => "amqp",
            Self::RedisStreams => "rs",
            Self::Sqs => "sqs",
            Self::Kafka => "kafka",
        }
    }

    /// Its server's process name on this machine, as `/proc/<pid>/stat` gives it; `None` for
    /// Redis Streams, whose broker is the store's Redis: its CPU time is in the Redis column
    /// (and every `redis-server` of the machine, other users' included, would match the name).
    pub(super) fn process(self) -> Option<&'static str> {
        match self {
            Self::Nats => Some("nats-server"),
            Self::Rabbitmq => Some("beam.smp"),
            Self::RedisStreams => None,
            Self::Sqs => Some("moto_server"),
            Self::Kafka => Some("tansu"),
        }
    }

    /// The name in the tables.
    pub fn name(self) -> &'static str {
        match self {
            Self::Nats => "NATS JetStream",
            Self::Rabbitmq => "RabbitMQ",
            Self::RedisStreams => "Redis Streams",
            Self::Sqs => "SQS (moto)",
            Self::Kafka => "Kafka (tansu)",
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
    /// The limit of unacked messages, and of messages handled at once (on SQS at most 10, its
    /// most per receive).
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
    /// name; `None` when none is found, as for a remote broker, and for Redis Streams, whose
    /// broker's time is [`redis_cpu_us_per_msg`](Self::redis_cpu_us_per_msg).
    pub broker_cpu_us_per_msg: Option<f64>,
}
