//! The queue bench, run once with a tiny N against a `nats-server -js`, a RabbitMQ broker, a
//! `moto_server` (SQS), a tansu broker (Kafka) and a Redis of the test's own (the Redis Streams' broker too): every
//! consumer acks every message, and runs each body exactly once.
//! No timing is asserted; `scripts/bench-queues.sh` measures.

use idempotask_bench::queues::{self, Broker, Consumer, QueueConfig};
use idempotask_test_support as support;
use support::RedisServer;
use support::moto::MotoServer;
use support::nats::NatsServer;
use support::rabbitmq::RabbitServer;
use support::tansu::TansuServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_consumer_runs_every_message_exactly_once_on_every_broker() {
    let redis = RedisServer::start();
    let nats = NatsServer::start();
    let rabbit = RabbitServer::shared();
    let moto = MotoServer::start();
    let tansu = TansuServer::start();
    let config = QueueConfig {
        nats_url: Some(nats.url()),
        amqp_url: Some(rabbit.url()),
        redis_streams: true,
        sqs_url: Some(moto.endpoint()),
        kafka_url: Some(tansu.bootstrap_servers()),
        sqs_messages: 24,
        redis_url: redis.url(),
        messages: 24,
        // SQS measures 16 as 10, its most per receive.
        in_flight: vec![1, 16],
        rounds: 2,
        consumers: Consumer::ALL.to_vec(),
    };
    let mut lines = 0;
    let measurements = queues::run(&config, |_| lines += 1).await.unwrap();
    assert_eq!(lines, measurements.len());
    // 2 rounds × 2 in-flight limits × 3 consumers × 5 brokers.
    assert_eq!(measurements.len(), 60, "{measurements:?}");
    for broker in Broker::ALL {
        for consumer in Consumer::ALL {
            let limits = if broker == Broker::Sqs {
                [1, 10]
            } else {
                [1, 16]
            };
            for in_flight in limits {
                let runs = measurements
                    .iter()
                    .filter(|m| m.broker == broker && m.consumer == consumer)
                    .filter(|m| m.in_flight == in_flight)
                    .count();
                assert_eq!(runs, 2, "{broker:?} {consumer:?} {in_flight}");
            }
        }
    }
    for m in &measurements {
        assert_eq!(m.bodies, 24, "{m:?}");
        assert_eq!(m.exactly_once, 24, "{m:?}");
        assert!(m.msgs_per_sec > 0.0 && m.redis_rtt_us > 0.0, "{m:?}");
        // The servers run on this machine: each one's CPU time is found and read.
        assert!(m.redis_cpu_us_per_msg >= 0.0, "{m:?}");
        assert!(m.client_cpu_us_per_msg.is_some_and(|us| us >= 0.0), "{m:?}");
        // Redis Streams' broker is the Redis: its time is Redis's, not counted twice.
        if m.broker == Broker::RedisStreams {
            assert_eq!(m.broker_cpu_us_per_msg, None, "{m:?}");
        } else {
            assert!(m.broker_cpu_us_per_msg.is_some_and(|us| us >= 0.0), "{m:?}");
        }
    }
    // Some work is seen: a clock that never moved would read zero everywhere.
    let client: f64 = measurements
        .iter()
        .filter_map(|m| m.client_cpu_us_per_msg)
        .sum();
    let redis: f64 = measurements.iter().map(|m| m.redis_cpu_us_per_msg).sum();
    assert!(client > 0.0 && redis > 0.0, "{measurements:?}");
    // The rounds rotate the consumers' order.
    let first = |round| {
        measurements
            .iter()
            .find(|m| m.round == round)
            .unwrap()
            .consumer
    };
    assert_ne!(first(0), first(1));
    let table = queues::markdown(&measurements);
    // Six rows each in the rates' table and in the CPU table.
    assert_eq!(table.matches("| NATS JetStream |").count(), 12, "{table}");
    assert_eq!(table.matches("| RabbitMQ |").count(), 12, "{table}");
    assert_eq!(table.matches("| Redis Streams |").count(), 12, "{table}");
    assert_eq!(table.matches("| SQS (moto) |").count(), 12, "{table}");
    assert_eq!(table.matches("| Kafka (tansu) |").count(), 12, "{table}");
    // Its CPU rows: no broker process of its own ("–"), and a sum all the same.
    let streams_cpu: Vec<Vec<&str>> = table
        .lines()
        .filter(|line| line.starts_with("| Redis Streams |"))
        .map(|line| line.split('|').map(str::trim).collect::<Vec<_>>())
        .filter(|cells| cells.len() == 9)
        .collect();
    assert_eq!(streams_cpu.len(), 6, "{table}");
    for cells in streams_cpu {
        assert_eq!(cells[6], "–", "{cells:?}");
        assert!(cells[7].parse::<f64>().is_ok(), "{cells:?}");
    }
    assert!(
        table.contains("| client | Redis | broker | sum |"),
        "{table}"
    );
}
