//! NATS JetStream: a pull consumer per case on one stream, acks read back from the consumer's
//! info and `+TERM`s from their advisories.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, AckKind, consumer::PullConsumer, consumer::pull};
use futures_util::StreamExt;
use idempotask::{RetryPolicy, Task};
use idempotask_redis::RedisStore;
use idempotask_test_support::RedisServer;
use idempotask_test_support::faulty_store::FaultyStore;
use idempotask_test_support::nats::NatsServer;
use tokio::time::Instant;

use super::{
    Body, Case, DROPPED_LOCK_TTL, Driver, Effects, Fault, HOLDER_LOCK_TTL, Integration, LOCK_TTL,
    MAX_FAILURES, QUEUE_BACKOFF, Seen, Step, WAIT, ack, drop_once_hung, fault_off, fault_on,
    faulty_store, hold, key_in, key_of, payload, reentered, run_body, signalling,
};

/// The NATS consumers' `AckWait`, after which JetStream redelivers an unacked message: past
/// [`DROPPED_LOCK_TTL`], so that the dropped delivery's lock has run out by then.
const ACK_WAIT: Duration = Duration::from_secs(5);
/// A nak'd NATS message comes back before this, well before `AckWait`: every delay the
/// consumer is given is at most [`HOLDER_LOCK_TTL`] (a busy key's) or the backoff's bound.
const NAK_BOUND: Duration = HOLDER_LOCK_TTL.saturating_add(Duration::from_millis(1500));
const _: () = assert!(DROPPED_LOCK_TTL.as_millis() < ACK_WAIT.as_millis());
const _: () = assert!(NAK_BOUND.as_millis() < ACK_WAIT.as_millis());

static NATS_TASK: Task = Task::new("conformance_nats")
    .lock_ttl(LOCK_TTL)
    .retry(RetryPolicy::no_wait());

const STREAM: &str = "CONFORMANCE";

pub(super) struct Nats {
    _server: NatsServer,
    _redis: RedisServer,
    client: async_nats::Client,
    js: jetstream::Context,
    stream: jetstream::stream::Stream,
    store: FaultyStore<RedisStore>,
    effects: Effects,
    case: Option<NatsCase>,
}

struct NatsCase {
    consumer: PullConsumer,
    messages: pull::Stream,
    advisories: async_nats::Subscriber,
    last: Option<(u64, Instant, AckKind)>,
}

impl Nats {
    pub(super) async fn start() -> Self {
        let nats = NatsServer::start();
        let (redis, store) = faulty_store().await;
        let client = async_nats::connect(nats.url()).await.unwrap();
        let js = jetstream::new(client.clone());
        let stream = js
            .create_stream(jetstream::stream::Config {
                name: STREAM.to_owned(),
                subjects: vec!["conformance.>".to_owned()],
                ..Default::default()
            })
            .await
            .unwrap();
        Self {
            _server: nats,
            _redis: redis,
            client,
            js,
            stream,
            store,
            effects: Effects::default(),
            case: None,
        }
    }

    /// The consumer of `step`: on a task whose lock runs out soon for a delivery dropped mid-body.
    fn consumer(
        &self,
        step: Step,
    ) -> idempotask_nats::Idempotent<fn(&jetstream::Message) -> Option<String>> {
        let by_key: fn(&jetstream::Message) -> Option<String> = |message| key_in(&message.payload);
        let task = if step.body == Body::Hang {
            NATS_TASK.clone().lock_ttl(DROPPED_LOCK_TTL)
        } else {
            NATS_TASK.clone()
        };
        idempotask_nats::Idempotent::new(task, by_key)
            .store(self.store.clone())
            .ack_wait(ACK_WAIT)
            .failure_backoff(QUEUE_BACKOFF)
            .store_backoff(QUEUE_BACKOFF)
            .max_failures(MAX_FAILURES)
            .fingerprint_payload(true)
    }
}

impl Driver for Nats {
    const INTEGRATION: Integration = Integration::Nats;

    fn effects(&self) -> &Effects {
        &self.effects
    }

    async fn start(&mut self, case: Case) {
        self.store.down(false);
        let name = format!("{case:?}");
        let consumer = self
            .stream
            .create_consumer(pull::Config {
                durable_name: Some(name.clone()),
                filter_subject: format!("conformance.{name}"),
                ack_wait: ACK_WAIT,
                ..Default::default()
            })
            .await
            .unwrap();
        let messages = consumer.messages().await.unwrap();
        let advisories = self
            .client
            .subscribe(format!(
                "$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED.{STREAM}.{name}"
            ))
            .await
            .unwrap();
        self.client.flush().await.unwrap();
        self.case = Some(NatsCase {
            consumer,
            messages,
            advisories,
            last: None,
        });
    }

    async fn step(&mut self, case: Case, step: Step) -> Seen {
        let key = key_of(Self::INTEGRATION, case);
        let idempotent = self.consumer(step);
        let state = self.case.as_mut().unwrap();
        if !step.again {
            self.js
                .publish(
                    format!("conformance.{case:?}"),
                    payload(&key, step.message).into(),
                )
                .await
                .unwrap()
                .await
                .unwrap();
        }
        let message = tokio::time::timeout(ACK_WAIT + WAIT, state.messages.next())
            .await
            .expect("JetStream delivers the message (none came: it is lost)")
            .unwrap()
            .unwrap();
        let sequence = message.info().unwrap().stream_sequence;
        if step.again {
            let (last, at, kind) = state.last.expect("a delivery to come back");
            assert_eq!(
                sequence, last,
                "another message came instead of the one nak'd"
            );
            if matches!(kind, AckKind::Nak(_)) {
                let after = at.elapsed();
                assert!(
                    after < NAK_BOUND,
                    "the nak'd message came back after {after:?}, as if never nak'd (AckWait {ACK_WAIT:?})"
                );
            }
        }
        let before = self.effects.of(&key);
        let started = Arc::new(tokio::sync::Notify::new());
        let body = signalling(
            &started,
            run_body(self.effects.clone(), key.clone(), step.body),
        );
        fault_on(&self.store, step.fault);
        let holder = if step.fault == Fault::Holder {
            Some(hold(&NATS_TASK, &self.store, &self.effects, &key).await)
        } else {
            None
        };
        let handled = if step.body == Body::Hang {
            drop_once_hung(idempotent.handle(&message, body), &started).await;
            None
        } else if step.fault == Fault::Reenter {
            Some(
                reentered(
                    &NATS_TASK,
                    &self.store,
                    &key,
                    idempotent.handle(&message, body),
                )
                .await,
            )
        } else {
            Some(idempotent.handle(&message, body).await)
        };
        fault_off(&self.store, step.fault);
        if let Some((finish, holder)) = holder {
            finish.send(()).unwrap();
            holder.await.unwrap();
        }
        let Some(handled) = handled else {
            state.last = Some((sequence, Instant::now(), AckKind::Progress));
            return Seen::NoAnswer;
        };
        let handled = handled.unwrap_or_else(|err| panic!("the ack was not sent: {err}"));
        let kind = handled.ack_kind();
        state.last = Some((sequence, Instant::now(), kind));
        match kind {
            AckKind::Ack => {
                consumer_until(&mut state.consumer, "JetStream never saw the ack", |info| {
                    info.ack_floor.stream_sequence >= sequence
                })
                .await;
                ack(self.effects.of(&key) > before)
            }
            AckKind::Nak(_) => Seen::Retry,
            AckKind::Term => {
                let advisory = tokio::time::timeout(WAIT, state.advisories.next())
                    .await
                    .expect("a MSG_TERMINATED advisory for the terminated message")
                    .unwrap();
                let advisory: serde_json::Value =
                    serde_json::from_slice(&advisory.payload).unwrap();
                assert_eq!(advisory["stream_seq"].as_u64(), Some(sequence));
                Seen::DeadLetter
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    async fn end(&mut self, _case: Case, _seen: &[Seen]) {
        let state = self.case.as_mut().unwrap();
        consumer_until(
            &mut state.consumer,
            "a message is left pending or unacked after the case",
            |info| info.num_pending == 0 && info.num_ack_pending == 0,
        )
        .await;
        self.case = None;
    }
}

/// Polls the consumer's info until `done` holds; panics with `what` and the info after
/// [`WAIT`]. Acks are sent without waiting for a reply, so the server applies them a moment
/// after `handle` returns.
async fn consumer_until(
    consumer: &mut PullConsumer,
    what: &str,
    done: impl Fn(&jetstream::consumer::Info) -> bool,
) {
    let deadline = Instant::now() + WAIT;
    loop {
        let info = consumer.info().await.unwrap();
        if done(info) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: {} pending, {} unacked, ack floor {}, {} delivered",
            info.num_pending,
            info.num_ack_pending,
            info.ack_floor.stream_sequence,
            info.delivered.consumer_sequence,
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
