//! The queue consumers' bench: NATS JetStream, RabbitMQ, Redis Streams, SQS and Kafka, each
//! message a fresh unit, consumed by three consumers side by side on the same broker and the
//! same Redis:
//!
//! - **bare**: the body, then the ack (no idempotency at all; on Redis Streams, `XREADGROUP`
//!   of up to "in flight" entries, their bodies, one `XACK` of them; on SQS, a
//!   `ReceiveMessage` of up to that many, their bodies, one `DeleteMessageBatch`; on Kafka,
//!   up to that many records of the partition at once, each offset committed asynchronously
//!   in order once its body ran, as `idempotask-kafka` commits);
//! - **hand-written**: the seed's pattern inside the consumer, with redis-rs: `GET` the marker,
//!   `SET lock token NX PX`, the body, `SET` the marker, a compare-and-delete of the lock, then
//!   the ack (four round trips for a fresh message; on Redis Streams and SQS the read's
//!   messages at once, then one `XACK` or `DeleteMessageBatch`);
//! - **idempotask**: the integration (`idempotask_nats::Idempotent::handle`,
//!   `idempotask_lapin::Idempotent::process`, `idempotask_redis_streams::StreamConsumer::
//!   next_batch`, `idempotask_sqs::SqsConsumer::next_batch`, `idempotask_kafka::KafkaConsumer::
//!   next`) on a `RedisStore` (two round trips; on Redis Streams and SQS through a
//!   `BatchingStore`, as those crates advise: a read's `begin`s are one pipeline, its
//!   `finish`es another).
//!
//! Each round publishes [`QueueConfig::messages`] messages ([`QueueConfig::sqs_messages`] on
//! SQS) (untimed) to a queue of their own for every (broker, in flight, consumer), then times
//! their consumption; the consumers' order is rotated round by round so that none always runs
//! first. "In flight" is the consumer's limit of unacked messages (JetStream's
//! `max_ack_pending`, RabbitMQ's `basic_qos` prefetch, the `COUNT` of a Redis Streams read,
//! SQS's `MaxNumberOfMessages`, at most 10, `idempotask-kafka`'s `max_in_flight` per
//! partition) and the number of messages handled at once. Each Kafka batch is a topic of one
//! partition, taken by manual assignment with offsets committed to a group of its own. The
//! streams live on the store's Redis, as they do for a user of that Redis: their broker's CPU
//! time is in the Redis column. Every round also measures the Redis `PING` round trip,
//! which the 1-in-flight comparison is made against, and the CPU time each consumption cost
//! this process (the client), Redis (`INFO cpu`) and the broker's processes on this machine
//! (`nats-server`, RabbitMQ's `beam.smp`, `moto_server`, `tansu`, from `/proc`): on a machine
//! whose cores the client and the servers share, messages per second follow their sum.
//!
//! `src/bin/queues.rs` is its command line; `tests/queues_smoke.rs` runs it with a tiny N.

mod batch;
mod config;
mod handwritten;
mod kafka;
mod nats;
mod rabbitmq;
mod redis_streams;
mod report;
mod sqs;

use std::time::{Duration, Instant};

use idempotask_redis::RedisStore;
use redis::aio::ConnectionManager;

pub use config::{Broker, Consumer, QueueConfig, QueueError, QueueMeasurement};
pub use report::markdown;

use batch::{Batch, Bodies, Consumed, Shared};
use kafka::KafkaBench;
use nats::NatsBench;
use rabbitmq::RabbitBench;
use redis_streams::StreamsBench;
use sqs::SqsBench;

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
    let brokers = Brokers::new(config, &shared).await?;
    let mut measurements = Vec::new();
    for round in 0..config.rounds {
        let redis_rtt_us = ping_median_us(&mut shared.redis.clone()).await?;
        for (nth, &asked) in config.in_flight.iter().enumerate() {
            for consumer in rotated(&config.consumers, round) {
                for broker in Broker::ALL {
                    let Some(in_flight) = in_flight_on(broker, &config.in_flight[..nth], asked)
                    else {
                        continue;
                    };
                    let messages = if broker == Broker::Sqs {
                        config.sqs_messages
                    } else {
                        config.messages
                    };
                    let batch = Batch {
                        name: format!(
                            "qb{}-{}-{in_flight}-{}-{round}",
                            shared.run,
                            broker.tag(),
                            consumer.name()
                        ),
                        messages,
                        in_flight: in_flight.max(1),
                        consumer,
                        bodies: Bodies::new(messages),
                    };
                    let Some(consumed) = brokers.measure(broker, &batch, &shared).await? else {
                        continue;
                    };
                    let (bodies, exactly_once) = batch.bodies.counts();
                    #[allow(
                        clippy::cast_precision_loss,
                        reason = "message counts are far below 2^52"
                    )]
                    let per_msg = |us: f64| us / messages.max(1) as f64;
                    let measurement = QueueMeasurement {
                        broker,
                        consumer,
                        in_flight,
                        round,
                        messages,
                        bodies,
                        exactly_once,
                        msgs_per_sec: per_sec(messages, consumed.elapsed),
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

/// The brokers of a run; `None` for those it leaves out.
struct Brokers {
    nats: Option<NatsBench>,
    rabbit: Option<RabbitBench>,
    streams: Option<StreamsBench>,
    sqs: Option<SqsBench>,
    kafka: Option<KafkaBench>,
}

impl Brokers {
    async fn new(config: &QueueConfig, shared: &Shared) -> Result<Self, QueueError> {
        let nats = match &config.nats_url {
            Some(url) => Some(NatsBench::new(url, shared.run, &shared.store).await?),
            None => None,
        };
        let rabbit = match &config.amqp_url {
            Some(url) => Some(RabbitBench::new(url).await?),
            None => None,
        };
        let kafka = match &config.kafka_url {
            Some(url) => Some(KafkaBench::new(url, &shared.store)?),
            None => None,
        };
        Ok(Self {
            nats,
            rabbit,
            kafka,
            streams: config
                .redis_streams
                .then(|| StreamsBench::new(&config.redis_url, &shared.store)),
            sqs: config
                .sqs_url
                .as_deref()
                .map(|url| SqsBench::new(url, &shared.store)),
        })
    }

    /// Consumes `batch` on `broker`; `None` when the run leaves that broker out.
    async fn measure(
        &self,
        broker: Broker,
        batch: &Batch,
        shared: &Shared,
    ) -> Result<Option<Consumed>, QueueError> {
        Ok(match broker {
            Broker::Nats => match &self.nats {
                Some(nats) => Some(nats.measure(batch, shared).await?),
                None => None,
            },
            Broker::Rabbitmq => match &self.rabbit {
                Some(rabbit) => Some(rabbit.measure(batch, shared).await?),
                None => None,
            },
            Broker::RedisStreams => match &self.streams {
                Some(streams) => Some(streams.measure(batch, shared).await?),
                None => None,
            },
            Broker::Sqs => match &self.sqs {
                Some(sqs) => Some(sqs.measure(batch, shared).await?),
                None => None,
            },
            Broker::Kafka => match &self.kafka {
                Some(kafka) => Some(kafka.measure(batch, shared).await?),
                None => None,
            },
        })
    }
}

/// The in-flight limit `asked` is measured at on `broker`, `None` when an earlier limit of the
/// run (`before`) already measured it: SQS receives at most 10 messages at a time, so every
/// limit above 10 is 10 there, measured once.
fn in_flight_on(broker: Broker, before: &[usize], asked: usize) -> Option<usize> {
    if broker != Broker::Sqs {
        return Some(asked);
    }
    let on_sqs = |limit: usize| limit.min(sqs::MOST_PER_RECEIVE);
    let limit = on_sqs(asked);
    (!before.iter().any(|&earlier| on_sqs(earlier) == limit)).then_some(limit)
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

#[cfg(test)]
mod tests {
    use super::{Broker, in_flight_on};

    #[test]
    fn sqs_measures_every_limit_above_ten_once_as_ten_and_the_others_as_asked() {
        let asked = [1, 64, 10, 128];
        let on = |broker| {
            (0..asked.len())
                .filter_map(|nth| in_flight_on(broker, &asked[..nth], asked[nth]))
                .collect::<Vec<_>>()
        };
        assert_eq!(on(Broker::Sqs), [1, 10]);
        assert_eq!(on(Broker::Nats), asked);
    }
}
