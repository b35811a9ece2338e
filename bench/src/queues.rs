//! The queue consumers' bench: NATS JetStream, RabbitMQ and Redis Streams, each message a fresh
//! unit, consumed by three consumers side by side on the same broker and the same Redis:
//!
//! - **bare**: the body, then the ack (no idempotency at all; on Redis Streams, `XREADGROUP`
//!   of up to "in flight" entries, their bodies, one `XACK` of them);
//! - **hand-written**: the seed's pattern inside the consumer, with redis-rs: `GET` the marker,
//!   `SET lock token NX PX`, the body, `SET` the marker, a compare-and-delete of the lock, then
//!   the ack (four round trips for a fresh message; on Redis Streams the read's entries at
//!   once, then one `XACK`);
//! - **idempotask**: the integration (`idempotask_nats::Idempotent::handle`,
//!   `idempotask_lapin::Idempotent::process`, `idempotask_redis_streams::StreamConsumer::
//!   next_batch`) on a `RedisStore` (two round trips; on Redis Streams through a
//!   `BatchingStore`, as that crate advises: a read's `begin`s are one pipeline, its `finish`es
//!   another, and its acks one transaction).
//!
//! Each round publishes [`QueueConfig::messages`] messages (untimed) to a queue of their own for
//! every (broker, in flight, consumer), then times their consumption; the consumers' order is
//! rotated round by round so that none always runs first. "In flight" is the consumer's limit
//! of unacked messages (JetStream's `max_ack_pending`, RabbitMQ's `basic_qos` prefetch, the
//! `COUNT` of a Redis Streams read) and the number of messages handled at once. The streams
//! live on the store's Redis, as they do for a user of that Redis: their broker's CPU time is
//! in the Redis column. Every round also measures the Redis `PING` round trip,
//! which the 1-in-flight comparison is made against, and the CPU time each consumption cost
//! this process (the client), Redis (`INFO cpu`) and the broker's processes on this machine
//! (`nats-server`, RabbitMQ's `beam.smp`, from `/proc`): on a machine whose cores the client
//! and both servers share, messages per second follow their sum.
//!
//! `src/bin/queues.rs` is its command line; `tests/queues_smoke.rs` runs it with a tiny N.

mod batch;
mod config;
mod handwritten;
mod nats;
mod rabbitmq;
mod redis_streams;
mod report;

use std::time::{Duration, Instant};

use idempotask_redis::RedisStore;
use redis::aio::ConnectionManager;

pub use config::{Broker, Consumer, QueueConfig, QueueError, QueueMeasurement};
pub use report::markdown;

use batch::{Batch, Bodies, Shared};
use nats::NatsBench;
use rabbitmq::RabbitBench;
use redis_streams::StreamsBench;

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
    let streams = config
        .redis_streams
        .then(|| StreamsBench::new(&config.redis_url, &shared.store));
    let mut measurements = Vec::new();
    for round in 0..config.rounds {
        let redis_rtt_us = ping_median_us(&mut shared.redis.clone()).await?;
        for &in_flight in &config.in_flight {
            for consumer in rotated(&config.consumers, round) {
                for broker in [Broker::Nats, Broker::Rabbitmq, Broker::RedisStreams] {
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
                    let consumed = match (broker, &nats, &rabbit, &streams) {
                        (Broker::Nats, Some(nats), _, _) => nats.measure(&batch, &shared).await?,
                        (Broker::Rabbitmq, _, Some(rabbit), _) => {
                            rabbit.measure(&batch, &shared).await?
                        }
                        (Broker::RedisStreams, _, _, Some(streams)) => {
                            streams.measure(&batch, &shared).await?
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
