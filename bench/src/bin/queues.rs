//! The queue consumers' bench: bare, hand-written and idempotask consumers on NATS JetStream,
//! RabbitMQ, Redis Streams, SQS and Kafka, one JSON line per measurement (see `idempotask_bench::queues`).
//!
//! ```text
//! cargo run --release -p idempotask-bench --bin queue-bench -- --redis-url redis://127.0.0.1:6379 \
//!     [--nats-url nats://127.0.0.1:4222] [--amqp-url amqp://guest:guest@127.0.0.1:5672/%2f] \
//!     [--redis-streams] [--sqs-url http://127.0.0.1:5000] [--kafka-url 127.0.0.1:9092] [--messages 5000] [--sqs-messages 200] \
//!     [--in-flight 1,64] [--rounds 5] [--consumers bare,hand-written,idempotask] \
//!     [--markdown queues.md]
//! ```
//!
//! `scripts/bench-queues.sh` runs it against servers of its own.

use idempotask_bench::queues::{self, Consumer, QueueConfig};

const USAGE: &str = "usage: queue-bench --redis-url URL [--nats-url URL] [--amqp-url URL] [--redis-streams] [--sqs-url URL] [--kafka-url HOST:PORT] [--messages N] [--sqs-messages N] [--in-flight 1,64] [--rounds R] [--consumers bare,hand-written,idempotask] [--markdown PATH]";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let mut config = QueueConfig {
        nats_url: None,
        amqp_url: None,
        redis_streams: false,
        sqs_url: None,
        kafka_url: None,
        sqs_messages: 200,
        redis_url: "redis://127.0.0.1:6379".to_owned(),
        messages: 5000,
        in_flight: vec![1, 64],
        rounds: 5,
        consumers: Consumer::ALL.to_vec(),
    };
    let mut markdown = None;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || {
            args.next()
                .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))
        };
        match flag.as_str() {
            "--redis-url" => config.redis_url = value()?,
            "--nats-url" => config.nats_url = Some(value()?),
            "--amqp-url" => config.amqp_url = Some(value()?),
            "--redis-streams" => config.redis_streams = true,
            "--sqs-url" => config.sqs_url = Some(value()?),
            "--kafka-url" => config.kafka_url = Some(value()?),
            "--messages" => config.messages = value()?.parse()?,
            "--sqs-messages" => config.sqs_messages = value()?.parse()?,
            "--in-flight" => {
                config.in_flight = value()?
                    .split(',')
                    .map(str::parse)
                    .collect::<Result<_, _>>()?;
            }
            "--rounds" => config.rounds = value()?.parse()?,
            "--consumers" => {
                config.consumers = value()?
                    .split(',')
                    .map(|name| {
                        Consumer::named(name).ok_or_else(|| format!("no consumer `{name}`"))
                    })
                    .collect::<Result<_, _>>()?;
            }
            "--markdown" => markdown = Some(value()?),
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(());
            }
            other => return Err(format!("unknown argument `{other}`\n{USAGE}").into()),
        }
    }
    if config.nats_url.is_none()
        && config.amqp_url.is_none()
        && !config.redis_streams
        && config.sqs_url.is_none()
        && config.kafka_url.is_none()
    {
        return Err(format!(
            "name a broker: --nats-url, --amqp-url, --redis-streams, --sqs-url, --kafka-url or several\n{USAGE}"
        )
        .into());
    }
    let measurements = queues::run(&config, |m| {
        println!("{}", serde_json::to_string(m).unwrap_or_default());
    })
    .await?;
    for m in &measurements {
        if m.exactly_once != m.messages || m.bodies != m.messages as u64 {
            return Err(format!("a consumer did not run every message once: {m:?}").into());
        }
    }
    if let Some(path) = markdown {
        std::fs::write(path, queues::markdown(&measurements))?;
    }
    Ok(())
}
