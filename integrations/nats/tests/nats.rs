//! The NATS consumer on a real `nats-server` and a real Redis store, both started here: a
//! duplicate replays, a busy key comes back after the holder's remaining lock time and replays,
//! a message without a usable key is terminated to the dead-letter advisory, a body's `Err` is
//! delivered again with a growing delay, not cached, and terminated after `max_failures`, a
//! misused task defers instead of terminating, a store that is down fails closed with a growing
//! delay, an ack that cannot be sent keeps the outcome, and progress acks outlast an `AckWait`
//! shorter than the body (one that blocks its thread too) but stop once its lock is gone, and
//! none follows a message's final acknowledgement. A
//! failure bucket that cannot be opened or written still ends a poison message; the consumer
//! check reports a short `AckWait` or `backoff` entry, a limited `max_deliver` and an unusable
//! bucket, and runs again when it could not read the consumer. A unit in doubt under
//! `InDoubt::Hold` is terminated with its reason and runs nothing.
//! The kill -9 scenario is the `nats_worker` example, run by `tests/example_queues.rs`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use async_nats::jetstream::consumer::{PullConsumer, pull};
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::stream::Stream;
use async_nats::jetstream::{self, AckKind, Message};
use futures_util::StreamExt;
use idempotask::store::Store as _;
use idempotask::{Backoff, Error, InDoubt, InvalidKey, Outcome, RetryPolicy, Task};
use idempotask_nats::{
    BodyFailure, ConsumerProblem, Handled, Idempotent, MessageKey, MsgId, Rejection,
};
use idempotask_test_support::RedisServer;
use idempotask_test_support::doubt::leave_in_doubt;
use idempotask_test_support::nats::NatsServer;
use serde::Deserialize;
use tokio::time::Instant;

const STREAM: &str = "ORDERS";

#[derive(Deserialize)]
struct Order {
    id: u64,
}

/// The key of a message whose JSON payload is an order; none for any other payload.
fn by_order(message: &Message) -> Option<String> {
    let order: Order = serde_json::from_slice(&message.payload).ok()?;
    Some(format!("order-charge-{}", order.id))
}

/// A server, a Redis for the store, and the `ORDERS` stream on `orders.>`.
struct Queue {
    _nats: NatsServer,
    redis: RedisServer,
    client: async_nats::Client,
    js: jetstream::Context,
    stream: Stream,
}

impl Queue {
    async fn start() -> Self {
        let nats = NatsServer::start();
        let redis = RedisServer::start();
        let client = async_nats::connect(nats.url()).await.unwrap();
        let js = jetstream::new(client.clone());
        let stream = js
            .create_stream(jetstream::stream::Config {
                name: STREAM.to_owned(),
                subjects: vec!["orders.>".to_owned()],
                ..Default::default()
            })
            .await
            .unwrap();
        Self {
            _nats: nats,
            redis,
            client,
            js,
            stream,
        }
    }

    /// A durable pull consumer `name` with `ack_wait`.
    async fn consumer(&self, name: &str, ack_wait: Duration) -> PullConsumer {
        self.stream
            .create_consumer(pull::Config {
                durable_name: Some(name.to_owned()),
                ack_wait,
                ..Default::default()
            })
            .await
            .unwrap()
    }

    /// Publishes `payload` on `orders.new`, with `Nats-Msg-Id: msg_id` when given; answers its
    /// stream sequence.
    async fn publish(&self, payload: &str, msg_id: Option<&str>) -> u64 {
        let mut publish = PublishMessage::build().payload(payload.to_owned().into());
        if let Some(id) = msg_id {
            publish = publish.message_id(id);
        }
        let ack = self
            .js
            .send_publish("orders.new", publish)
            .await
            .unwrap()
            .await
            .unwrap();
        assert!(!ack.duplicate, "the stream took message {payload} as new");
        ack.sequence
    }

    /// The `MSG_TERMINATED` advisories of consumer `name`: the dead-letter path.
    async fn terminations(&self, name: &str) -> async_nats::Subscriber {
        let advisories = self
            .client
            .subscribe(format!(
                "$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED.{STREAM}.{name}"
            ))
            .await
            .unwrap();
        self.client.flush().await.unwrap();
        advisories
    }

    async fn store(&self) -> idempotask_redis::RedisStore {
        self.redis.store().await
    }
}

/// Consumer info as the server has it once `done` holds; panics after 10 s. Acks are sent
/// without waiting for a reply, so the server applies them a moment after `handle` returns.
async fn eventually(
    consumer: &mut PullConsumer,
    done: impl Fn(&jetstream::consumer::Info) -> bool,
) -> jetstream::consumer::Info {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let info = consumer.info().await.unwrap().clone();
        if done(&info) {
            return info;
        }
        assert!(Instant::now() < deadline, "never reached: {info:#?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The next `MSG_TERMINATED` advisory; panics after 10 s.
async fn advisory(advisories: &mut async_nats::Subscriber) -> serde_json::Value {
    let advisory = tokio::time::timeout(Duration::from_secs(10), advisories.next())
        .await
        .expect("a MSG_TERMINATED advisory")
        .unwrap();
    serde_json::from_slice(&advisory.payload).unwrap()
}

/// The stream sequences of the next `count` terminated messages, in order; panics after 10 s.
async fn terminated(advisories: &mut async_nats::Subscriber, count: usize) -> Vec<u64> {
    let mut sequences = Vec::new();
    for _ in 0..count {
        sequences.push(advisory(advisories).await["stream_seq"].as_u64().unwrap());
    }
    sequences.sort_unstable();
    sequences
}

fn no_ack_pending(info: &jetstream::consumer::Info) -> bool {
    info.num_ack_pending == 0
}

/// How many deliveries the consumer has made, redeliveries included (`num_redelivered` counts
/// only the redelivered messages still waiting for their ack).
fn deliveries(info: &jetstream::consumer::Info) -> u64 {
    info.delivered.consumer_sequence
}

fn delivered(message: &Message) -> i64 {
    message.info().unwrap().delivered
}

fn stream_sequence(message: &Message) -> u64 {
    message.info().unwrap().stream_sequence
}

/// A message on `orders.new` with `Nats-Msg-Id: msg_id` and no reply subject, so no ack of it
/// can be sent.
fn without_reply(queue: &Queue, msg_id: &str) -> Message {
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Nats-Msg-Id", msg_id);
    Message {
        message: async_nats::Message {
            subject: "orders.new".into(),
            reply: None,
            payload: "{}".into(),
            headers: Some(headers),
            status: None,
            description: None,
            length: 0,
        },
        context: queue.js.clone(),
    }
}

/// Whether `key` is one the consumer check writes into the failure bucket to see that it takes
/// writes.
fn is_probe(key: &str) -> bool {
    key.starts_with("idempotask_check.")
}

#[path = "nats/consumer_check.rs"]
mod consumer_check;
#[path = "nats/failures.rs"]
mod failures;
#[path = "nats/progress.rs"]
mod progress;
#[path = "nats/replays.rs"]
mod replays;
