//! RabbitMQ: a queue and its retry and dead-letter queues per case, consumed on a channel of
//! the case's own.

use std::sync::Arc;

use futures_util::StreamExt;
use idempotask::{RetryPolicy, Task};
use idempotask_lapin::{Settled, Topology};
use idempotask_redis::RedisStore;
use idempotask_test_support::RedisServer;
use idempotask_test_support::faulty_store::FaultyStore;
use idempotask_test_support::rabbitmq::RabbitServer;
use lapin::options::{
    BasicConsumeOptions, BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, Consumer};

use super::{
    Body, Case, DROPPED_LOCK_TTL, Driver, Effects, Fault, Integration, LOCK_TTL, MAX_FAILURES,
    QUEUE_BACKOFF, Seen, Step, WAIT, ack, drop_once_hung, eventually, fault_off, fault_on,
    faulty_store, hold, key_in, key_of, payload, reentered, run_body, signalling,
};

static RABBIT_TASK: Task = Task::new("conformance_rabbitmq")
    .lock_ttl(LOCK_TTL)
    .retry(RetryPolicy::no_wait());

pub(super) struct Rabbit {
    _redis: RedisServer,
    connection: Connection,
    /// Publishes the test's messages and the retry queues' copies; stays open.
    publisher: Channel,
    store: FaultyStore<RedisStore>,
    effects: Effects,
    case: Option<RabbitCase>,
}

struct RabbitCase {
    topology: Topology,
    consumer: idempotask_lapin::Idempotent<fn(&lapin::message::Delivery) -> Option<String>>,
    /// The same on a task whose lock runs out soon: for the delivery dropped mid-body.
    dropped: idempotask_lapin::Idempotent<fn(&lapin::message::Delivery) -> Option<String>>,
    /// The consuming channel, closed when the consumer "crashes" and at the end of the case.
    channel: Channel,
    deliveries: Consumer,
    dead: u32,
}

impl Rabbit {
    pub(super) async fn start() -> Self {
        let (redis, store) = faulty_store().await;
        let url = tokio::task::spawn_blocking(|| RabbitServer::shared().url())
            .await
            .unwrap();
        let connection = Connection::connect(&url, ConnectionProperties::default())
            .await
            .unwrap();
        let publisher = connection.create_channel().await.unwrap();
        publisher
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .unwrap();
        Self {
            _redis: redis,
            connection,
            publisher,
            store,
            effects: Effects::default(),
            case: None,
        }
    }

    async fn consume(&self, queue: &str) -> (Channel, Consumer) {
        let channel = self.connection.create_channel().await.unwrap();
        let deliveries = channel
            .basic_consume(
                queue.into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        (channel, deliveries)
    }

    async fn depth(&self, queue: &str) -> u32 {
        self.publisher
            .queue_declare(
                queue.into(),
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .unwrap()
            .message_count()
    }
}

impl Driver for Rabbit {
    const INTEGRATION: Integration = Integration::RabbitMq;

    fn effects(&self) -> &Effects {
        &self.effects
    }

    async fn start(&mut self, case: Case) {
        self.store.down(false);
        let topology = Topology::new(format!("conformance-{case:?}"));
        let retries = topology.declare(&self.publisher).await.unwrap();
        let by_key: fn(&lapin::message::Delivery) -> Option<String> =
            |delivery| key_in(&delivery.data);
        let consumer = |task: Task| {
            idempotask_lapin::Idempotent::new(task, by_key, retries.clone())
                .store(self.store.clone())
                .failure_backoff(QUEUE_BACKOFF)
                .store_backoff(QUEUE_BACKOFF)
                .max_failures(MAX_FAILURES)
                .fingerprint_payload(true)
        };
        let (consumer, dropped) = (
            consumer(RABBIT_TASK.clone()),
            consumer(RABBIT_TASK.clone().lock_ttl(DROPPED_LOCK_TTL)),
        );
        let (channel, deliveries) = self.consume(topology.queue()).await;
        self.case = Some(RabbitCase {
            topology,
            consumer,
            dropped,
            channel,
            deliveries,
            dead: 0,
        });
    }

    async fn step(&mut self, case: Case, step: Step) -> Seen {
        let key = key_of(Self::INTEGRATION, case);
        let queue = self.case.as_ref().unwrap().topology.queue().to_owned();
        if !step.again {
            let confirm = self
                .publisher
                .basic_publish(
                    "".into(),
                    queue.as_str().into(),
                    BasicPublishOptions::default(),
                    payload(&key, step.message).as_bytes(),
                    BasicProperties::default(),
                )
                .await
                .unwrap()
                .await
                .unwrap();
            assert!(confirm.is_ack(), "{confirm:?}");
        }
        let state = self.case.as_mut().unwrap();
        let delivery = tokio::time::timeout(WAIT, state.deliveries.next())
            .await
            .expect("the broker delivers the message (none came: it is lost)")
            .expect("the consumer is open")
            .unwrap();
        if step.again {
            assert_eq!(key_in(&delivery.data).as_deref(), Some(key.as_str()));
        }
        let (before, started) = (self.effects.of(&key), Arc::new(tokio::sync::Notify::new()));
        let body = signalling(
            &started,
            run_body(self.effects.clone(), key.clone(), step.body),
        );
        let body = move |_: &lapin::message::Delivery| body;
        fault_on(&self.store, step.fault);
        let holder = if step.fault == Fault::Holder {
            Some(hold(&RABBIT_TASK, &self.store, &self.effects, &key).await)
        } else {
            None
        };
        let consumer = state.consumer.clone();
        let settled = if step.body == Body::Hang {
            drop_once_hung(state.dropped.process(delivery, body), &started).await;
            None
        } else if step.fault == Fault::Reenter {
            Some(
                reentered(
                    &RABBIT_TASK,
                    &self.store,
                    &key,
                    consumer.process(delivery, body),
                )
                .await,
            )
        } else {
            Some(consumer.process(delivery, body).await)
        };
        fault_off(&self.store, step.fault);
        if let Some((finish, holder)) = holder {
            finish.send(()).unwrap();
            holder.await.unwrap();
        }
        let Some(settled) = settled else {
            // The consumer is gone with its delivery unacked: its channel closes, and the
            // broker requeues the delivery for the next consumer, once the lock has lapsed.
            let state = self.case.as_mut().unwrap();
            state
                .channel
                .close(200, "the consumer crashed".into())
                .await
                .unwrap();
            // The grant came before the body started, so its lock has run out by then.
            tokio::time::sleep(DROPPED_LOCK_TTL).await;
            let (channel, deliveries) = self.consume(&queue).await;
            let state = self.case.as_mut().unwrap();
            (state.channel, state.deliveries) = (channel, deliveries);
            return Seen::NoAnswer;
        };
        let settled = settled.unwrap_or_else(|err| panic!("not settled: {err:?}"));
        match settled {
            Settled::Acked(_) => ack(self.effects.of(&key) > before),
            Settled::Retrying { .. } => Seen::Retry,
            Settled::DeadLettered(_) => {
                let dead_letters = self
                    .case
                    .as_ref()
                    .unwrap()
                    .topology
                    .dead_letter_queue()
                    .to_owned();
                let want = self.case.as_ref().unwrap().dead + 1;
                eventually("the dead-letter queue never got the message", || {
                    let dead_letters = dead_letters.clone();
                    let this = &*self;
                    async move { this.depth(&dead_letters).await == want }
                })
                .await;
                self.case.as_mut().unwrap().dead = want;
                Seen::DeadLetter
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    async fn end(&mut self, _case: Case, _seen: &[Seen]) {
        let state = self.case.take().unwrap();
        // An unacked delivery goes back to its queue when the channel closes.
        state
            .channel
            .close(200, "the case is over".into())
            .await
            .unwrap();
        let topology = &state.topology;
        for (queue, want) in [
            (topology.queue(), 0),
            (topology.retry_queue(), 0),
            (topology.dead_letter_queue(), state.dead),
        ] {
            let depth = self.depth(queue).await;
            assert_eq!(
                depth, want,
                "{depth} messages in {queue} after the case, expected {want}"
            );
        }
    }
}
