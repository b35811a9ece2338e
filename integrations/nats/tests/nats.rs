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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_message_replays_and_the_body_runs_once() {
    let queue = Queue::start().await;
    let mut consumer = queue.consumer("charger", Duration::from_secs(30)).await;
    // The producer retried after the duplicate window, or two services sent the same order.
    queue.publish(r#"{"id":7}"#, Some("publish-1")).await;
    queue.publish(r#"{"id":7}"#, Some("publish-2")).await;
    let charge_once =
        Idempotent::new(Task::new("nats_duplicate"), by_order).store(queue.store().await);
    let charges = AtomicU32::new(0);
    let charge = || async {
        let n = charges.fetch_add(1, Ordering::SeqCst) + 1;
        Ok::<_, std::io::Error>(format!("ch_{n}"))
    };

    let mut messages = consumer.messages().await.unwrap();
    let mut answers = Vec::new();
    for _ in 0..2 {
        let message = messages.next().await.unwrap().unwrap();
        let Handled::Acked(report) = charge_once.handle(&message, charge()).await.unwrap() else {
            panic!("not acked")
        };
        answers.push((report.value, report.outcome));
    }
    assert_eq!(
        answers,
        [
            ("ch_1".to_owned(), Outcome::Executed),
            ("ch_1".to_owned(), Outcome::Replayed)
        ]
    );
    assert_eq!(charges.load(Ordering::SeqCst), 1);
    let info = eventually(&mut consumer, no_ack_pending).await;
    assert_eq!(deliveries(&info), 2, "no redelivery: {info:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_contended_message_comes_back_after_the_holders_lock_time_and_replays() {
    let queue = Queue::start().await;
    let mut consumer = queue.consumer("charger", Duration::from_secs(30)).await;
    queue.publish(r#"{"id":5}"#, None).await;
    let second = queue.publish(r#"{"id":5}"#, None).await;
    let lock_ttl = Duration::from_secs(2);
    // Renewed, so that a slow machine cannot let the lock expire while the test holds it.
    let task = Task::new("nats_contended")
        .lock_ttl(lock_ttl)
        .renew(true)
        .retry(RetryPolicy::no_wait());
    let charge_once = Idempotent::new(task, by_order).store(queue.store().await);
    let charges = Arc::new(AtomicU32::new(0));

    let mut messages = consumer.messages().await.unwrap();
    let first_message = messages.next().await.unwrap().unwrap();
    let second_message = messages.next().await.unwrap().unwrap();
    assert_eq!(stream_sequence(&second_message), second);

    // The first delivery holds the lock until the test lets it finish.
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let (release_tx, release_rx) = tokio::sync::oneshot::channel::<()>();
    let holder = tokio::spawn({
        let charge_once = charge_once.clone();
        let charges = Arc::clone(&charges);
        async move {
            let body = async move {
                started_tx.send(()).unwrap();
                release_rx.await.unwrap();
                charges.fetch_add(1, Ordering::SeqCst);
                Ok::<_, std::io::Error>("ch_5".to_owned())
            };
            charge_once.handle(&first_message, body).await.unwrap()
        }
    });
    started_rx.await.unwrap();

    let never = async {
        charges.fetch_add(1, Ordering::SeqCst);
        Ok::<_, std::io::Error>("ch_wrong".to_owned())
    };
    let deferred = charge_once.handle(&second_message, never).await.unwrap();
    let nakd_at = Instant::now();
    let Handled::Deferred { error, delay, .. } = &deferred else {
        panic!("not deferred: {deferred:?}")
    };
    assert!(matches!(error, Error::Contended { .. }), "{error}");
    assert!(
        !delay.is_zero() && *delay <= lock_ttl,
        "the delay is the holder's remaining lock time: {delay:?}"
    );
    assert!(matches!(deferred.ack_kind(), AckKind::Nak(Some(d)) if d == *delay));

    release_tx.send(()).unwrap();
    let held = holder.await.unwrap();
    assert!(
        matches!(&held, Handled::Acked(report) if report.outcome == Outcome::Executed),
        "{held:?}"
    );

    let again = messages.next().await.unwrap().unwrap();
    assert_eq!(
        (stream_sequence(&again), delivered(&again)),
        (second, 2),
        "the nak'd message is what comes back"
    );
    // JetStream starts the delay when the nak arrives, after it was sent.
    assert!(
        nakd_at.elapsed() >= *delay,
        "back after {:?}",
        nakd_at.elapsed()
    );
    let wrong = async { Ok::<_, std::io::Error>("ch_wrong".to_owned()) };
    let Handled::Acked(report) = charge_once.handle(&again, wrong).await.unwrap() else {
        panic!("the redelivery was not acked")
    };
    assert_eq!(
        (report.value.as_str(), report.outcome),
        ("ch_5", Outcome::Replayed)
    );
    assert_eq!(charges.load(Ordering::SeqCst), 1);
    let info = eventually(&mut consumer, no_ack_pending).await;
    assert_eq!(
        deliveries(&info),
        3,
        "two messages, one redelivery: {info:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_without_a_usable_key_is_terminated_to_the_dead_letter_advisory() {
    let queue = Queue::start().await;
    let mut consumer = queue.consumer("charger", Duration::from_secs(30)).await;
    let mut advisories = queue.terminations("charger").await;
    let unkeyed = queue.publish(r#"{"id":1}"#, None).await;
    let empty_key = queue.publish(r#"{"id":2}"#, None).await;
    let store = queue.store().await;
    let by_msg_id = Idempotent::new(Task::new("nats_no_key"), MsgId).store(store.clone());
    let empty = Idempotent::new(Task::new("nats_empty_key"), |_: &Message| {
        Some(String::new())
    })
    .store(store);
    let runs = AtomicU32::new(0);
    let body = || async {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok::<_, std::io::Error>(())
    };

    let mut messages = consumer.messages().await.unwrap();
    let message = messages.next().await.unwrap().unwrap();
    let handled = by_msg_id.handle(&message, body()).await.unwrap();
    let Handled::Terminated(Rejection::MissingKey(missing)) = &handled else {
        panic!("published without Nats-Msg-Id, yet {handled:?}")
    };
    assert_eq!(missing.stream_sequence(), Some(unkeyed));
    assert!(matches!(handled.ack_kind(), AckKind::Term));

    let message = messages.next().await.unwrap().unwrap();
    let handled = empty.handle(&message, body()).await.unwrap();
    assert!(
        matches!(
            &handled,
            Handled::Terminated(Rejection::Refused(Error::InvalidKey(
                InvalidKey::EmptyKey { .. }
            )))
        ),
        "{handled:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0, "nothing ran unprotected");

    // The dead-letter path: one advisory per terminated message, naming it.
    assert_eq!(terminated(&mut advisories, 2).await, [unkeyed, empty_key]);
    let info = eventually(&mut consumer, no_ack_pending).await;
    assert_eq!(
        deliveries(&info),
        2,
        "terminated, never delivered again: {info:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_result_that_no_longer_decodes_is_terminated_not_run_again() {
    let queue = Queue::start().await;
    let mut consumer = queue.consumer("charger", Duration::from_secs(30)).await;
    let mut advisories = queue.terminations("charger").await;
    queue.publish(r#"{"id":8}"#, None).await;
    let duplicate = queue.publish(r#"{"id":8}"#, None).await;
    let charge_once = Idempotent::new(Task::new("nats_codec"), by_order).store(queue.store().await);
    let mut messages = consumer.messages().await.unwrap();

    let message = messages.next().await.unwrap().unwrap();
    let first = async { Ok::<_, std::io::Error>("ch_8".to_owned()) };
    let handled = charge_once.handle(&message, first).await.unwrap();
    assert!(matches!(handled, Handled::Acked(_)), "{handled:?}");
    // A deploy changed the task's return type; the duplicate's body must not charge again.
    let runs = AtomicU32::new(0);
    let changed = async {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok::<_, std::io::Error>(8_u32)
    };
    let message = messages.next().await.unwrap().unwrap();
    let handled = charge_once.handle(&message, changed).await.unwrap();
    assert!(
        matches!(
            &handled,
            Handled::Terminated(Rejection::Refused(Error::Codec {
                kind: idempotask::CodecErrorKind::Undecodable,
                ..
            }))
        ),
        "{handled:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    assert_eq!(terminated(&mut advisories, 1).await, [duplicate]);
    let info = eventually(&mut consumer, no_ack_pending).await;
    assert_eq!(deliveries(&info), 2, "{info:#?}");
}

/// Whether the server puts the reason of a `+TERM` into its advisory (nats-server 2.10.4 on).
fn server_reports_term_reasons(client: &async_nats::Client) -> bool {
    let version = client.server_info().version;
    let numbers: Vec<u64> = version
        .split(['-', '.'])
        .take(3)
        .map(|part| part.parse().unwrap())
        .collect();
    numbers.as_slice() >= [2, 10, 4].as_slice()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unit_in_doubt_is_terminated_with_its_reason_and_nothing_runs() {
    let queue = Queue::start().await;
    let mut consumer = queue.consumer("charger", Duration::from_secs(30)).await;
    let mut advisories = queue.terminations("charger").await;
    let store = queue.store().await;
    // A delivery of order 9 took the lock and was killed before it stored a result.
    let unit = leave_in_doubt(&store, "nats_in_doubt", "order-charge-9").await;
    let sequence = queue.publish(r#"{"id":9}"#, None).await;
    let hold = Idempotent::new(
        Task::new("nats_in_doubt")
            .in_doubt(InDoubt::Hold)
            .retry(RetryPolicy::no_wait()),
        by_order,
    )
    .store(store.clone());
    let runs = AtomicU32::new(0);
    let body = async {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok::<_, std::io::Error>(())
    };

    let mut messages = consumer.messages().await.unwrap();
    let message = messages.next().await.unwrap().unwrap();
    let handled = hold.handle(&message, body).await.unwrap();
    assert!(
        matches!(
            &handled,
            Handled::Terminated(Rejection::InDoubt(Error::InDoubt { .. }))
        ),
        "{handled:?}"
    );
    assert!(matches!(handled.ack_kind(), AckKind::Term));
    let reason = handled.term_reason().unwrap();
    assert!(
        reason.contains("is in doubt") && reason.contains("an operator must resolve it"),
        "{reason}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the held body did not run");

    // What JetStream shows: the message terminated, its advisory naming it (and the reason,
    // on a server that reads one), and never delivered again.
    let advisory = advisory(&mut advisories).await;
    assert_eq!(advisory["stream_seq"], sequence, "{advisory}");
    if server_reports_term_reasons(&queue.client) {
        assert_eq!(advisory["reason"], reason.as_str(), "{advisory}");
    } else {
        assert!(advisory.get("reason").is_none(), "{advisory}");
    }
    let info = eventually(&mut consumer, no_ack_pending).await;
    assert_eq!(
        deliveries(&info),
        1,
        "terminated, not redelivered: {info:#?}"
    );
    // The held delivery wrote nothing: the unit stays in doubt for the operator.
    assert!(store.inspect(&unit).await.unwrap().in_doubt.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_error_is_nakd_delivered_again_and_not_cached() {
    let queue = Queue::start().await;
    let mut consumer = queue.consumer("charger", Duration::from_secs(30)).await;
    let sequence = queue.publish(r#"{"id":9}"#, Some("order-9")).await;
    let first = Duration::from_millis(100);
    let charge_once = Idempotent::new(Task::new("nats_failing"), MsgId)
        .store(queue.store().await)
        .failure_backoff(Backoff::new(first, Duration::from_secs(1)));
    let attempts = AtomicU32::new(0);
    // Declined on the first delivery, charged on the second.
    let charge = || async {
        match attempts.fetch_add(1, Ordering::SeqCst) {
            0 => Err("card declined"),
            n => Ok(format!("ch_{n}")),
        }
    };

    let mut messages = consumer.messages().await.unwrap();
    let message = messages.next().await.unwrap().unwrap();
    assert_eq!(MsgId.key(&message).unwrap(), "order-9");
    let handled = charge_once.handle(&message, charge()).await.unwrap();
    assert!(
        matches!(
            handled,
            Handled::Failed {
                error: BodyFailure::Error("card declined"),
                delay,
                ..
            } if delay == first
        ),
        "{handled:?}"
    );
    assert!(matches!(handled.ack_kind(), AckKind::Nak(Some(d)) if d == first));

    let again = messages.next().await.unwrap().unwrap();
    assert_eq!((stream_sequence(&again), delivered(&again)), (sequence, 2));
    let Handled::Acked(report) = charge_once.handle(&again, charge()).await.unwrap() else {
        panic!("the second delivery was not acked")
    };
    // Executed, not Replayed: the error was not stored as the result.
    assert_eq!(
        (report.value.as_str(), report.outcome),
        ("ch_1", Outcome::Executed)
    );
    assert_eq!(attempts.load(Ordering::SeqCst), 2);
    let info = eventually(&mut consumer, no_ack_pending).await;
    assert_eq!(deliveries(&info), 2, "{info:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_body_backs_off_more_each_time_and_is_terminated_after_max_failures() {
    let queue = Queue::start().await;
    let mut consumer = queue.consumer("charger", Duration::from_secs(30)).await;
    let mut advisories = queue.terminations("charger").await;
    let sequence = queue.publish(r#"{"id":11}"#, Some("order-11")).await;
    let first = Duration::from_millis(100);
    let charge_once = Idempotent::new(Task::new("nats_always_failing"), MsgId)
        .store(queue.store().await)
        .failure_backoff(Backoff::new(first, Duration::from_secs(1)))
        .max_failures(3);
    let attempts = AtomicU32::new(0);
    let charge = || async {
        attempts.fetch_add(1, Ordering::SeqCst);
        Err::<(), _>("card declined")
    };

    let mut messages = consumer.messages().await.unwrap();
    let mut delays = Vec::new();
    for delivery in 1..=2 {
        let message = messages.next().await.unwrap().unwrap();
        assert_eq!(
            (stream_sequence(&message), delivered(&message)),
            (sequence, delivery)
        );
        let handled = charge_once.handle(&message, charge()).await.unwrap();
        let Handled::Failed { delay, .. } = handled else {
            panic!("delivery {delivery}: {handled:?}")
        };
        delays.push(delay);
    }
    assert_eq!(
        delays,
        [first, first * 2],
        "a backoff that grows per delivery"
    );

    let last = messages.next().await.unwrap().unwrap();
    assert_eq!(delivered(&last), 3);
    let handled = charge_once.handle(&last, charge()).await.unwrap();
    assert!(
        matches!(handled, Handled::GaveUp { failures: 3, .. }),
        "{handled:?}"
    );
    assert!(matches!(handled.ack_kind(), AckKind::Term));
    assert_eq!(terminated(&mut advisories, 1).await, [sequence]);
    assert_eq!(attempts.load(Ordering::SeqCst), 3);
    let info = eventually(&mut consumer, no_ack_pending).await;
    assert_eq!(deliveries(&info), 3, "never delivered again: {info:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_misused_task_defers_the_message_instead_of_terminating_it() {
    let queue = Queue::start().await;
    let consumer = queue.consumer("charger", Duration::from_secs(30)).await;
    queue.publish(r#"{"id":12}"#, Some("order-12")).await;
    let first = Duration::from_millis(100);
    let charge_once = Idempotent::new(Task::new("nats_reentered"), MsgId)
        .store(queue.store().await)
        .store_backoff(Backoff::new(first, Duration::from_secs(1)));
    let mut messages = consumer.messages().await.unwrap();
    let message = messages.next().await.unwrap().unwrap();

    // A body that handles its own message again: a program's bug, not the message's.
    let inner_runs = AtomicU32::new(0);
    let inner_handled = std::sync::Mutex::new(None);
    let outer = async {
        let inner = async {
            inner_runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, std::io::Error>(())
        };
        let handled = charge_once.process(&message, inner).await;
        *inner_handled.lock().unwrap() = Some(handled);
        Ok::<_, std::io::Error>(())
    };
    let outer = charge_once.process(&message, outer).await;
    assert!(matches!(outer, Handled::Acked(_)), "{outer:?}");
    let inner = inner_handled.lock().unwrap().take().unwrap();
    assert!(
        matches!(
            &inner,
            Handled::Deferred { error: Error::Reentered { .. }, delay, .. } if *delay == first
        ),
        "{inner:?}"
    );
    assert!(matches!(inner.ack_kind(), AckKind::Nak(Some(d)) if d == first));
    assert_eq!(inner_runs.load(Ordering::SeqCst), 0);
}

/// Handles the first message of `consumer` with a body three times its `AckWait` long while
/// the consumer keeps pulling; answers the server's count of deliveries once it is acked.
async fn long_body(
    queue: &Queue,
    mut consumer: PullConsumer,
    charge_once: Idempotent<MsgId>,
) -> u64 {
    let mut messages = consumer.messages().await.unwrap();
    let message = messages.next().await.unwrap().unwrap();
    let ack_wait = consumer.cached_info().config.ack_wait;
    // Keep a pull request waiting, as a worker's loop does, so a redelivery has somewhere to go.
    let pulling =
        tokio::spawn(async move { messages.next().await.map(|m| m.map(|m| delivered(&m))) });
    // The body's length is what is under test, not a wait for something else.
    let body = async {
        tokio::time::sleep(ack_wait * 3).await;
        Ok::<_, std::io::Error>(())
    };
    let handled = charge_once.handle(&message, body).await.unwrap();
    assert!(matches!(handled, Handled::Acked(_)), "{handled:?}");
    queue.client.flush().await.unwrap();
    pulling.abort();
    let info = consumer.info().await.unwrap();
    deliveries(info)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_acks_keep_a_body_longer_than_ack_wait_from_being_redelivered() {
    let queue = Queue::start().await;
    // Wide enough that a loaded machine's stalls do not outlast the two acks of slack.
    let ack_wait = Duration::from_secs(2);
    queue.publish(r#"{"id":3}"#, Some("order-3")).await;
    let store = queue.store().await;
    // Declared as the consumer has it: a progress ack every third of it.
    let declared = Idempotent::new(Task::new("nats_long"), MsgId)
        .store(store.clone())
        .ack_wait(ack_wait);
    assert_eq!(declared.progress_interval(), ack_wait / 3);
    // The control: declared as JetStream's default, so progress acks come every 10 s, too late.
    let misdeclared = Idempotent::new(Task::new("nats_long_misdeclared"), MsgId).store(store);
    let (kept, control) = tokio::join!(
        async { long_body(&queue, queue.consumer("declared", ack_wait).await, declared).await },
        async {
            long_body(
                &queue,
                queue.consumer("misdeclared", ack_wait).await,
                misdeclared,
            )
            .await
        },
    );
    assert_eq!(kept, 1, "progress acks beat the 2 s AckWait: one delivery");
    assert!(
        control >= 2,
        "without them JetStream redelivers: {control} deliveries"
    );
}

/// The task that sends progress acks outlives each message: with none in hand it sleeps on a
/// timer, and a message that comes after it has slept so still gets its acks in time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_acks_go_out_for_a_message_that_comes_after_the_acks_went_idle() {
    let queue = Queue::start().await;
    let ack_wait = Duration::from_secs(2);
    queue.publish(r#"{"id":21}"#, Some("order-21")).await;
    queue.publish(r#"{"id":22}"#, Some("order-22")).await;
    let charge_once = Idempotent::new(Task::new("nats_idle_acks"), MsgId)
        .store(queue.store().await)
        .ack_wait(ack_wait);
    let mut consumer = queue.consumer("charger", ack_wait).await;
    // One message pulled: the second is not delivered (its `AckWait` not started) until asked.
    let mut batch = consumer.fetch().max_messages(1).messages().await.unwrap();
    let first = batch.next().await.unwrap().unwrap();
    let quick = async { Ok::<_, std::io::Error>(()) };
    let handled = charge_once.handle(&first, quick).await.unwrap();
    assert!(matches!(handled, Handled::Acked(_)), "{handled:?}");
    // Idle for two intervals: the acks' task wakes with no message in hand and sleeps again
    // (the scenario under test, not a wait for a signal).
    tokio::time::sleep(charge_once.progress_interval() * 2).await;
    let mut messages = consumer.messages().await.unwrap();
    let second = messages.next().await.unwrap().unwrap();
    assert_eq!(delivered(&second), 1);
    let pulling =
        tokio::spawn(async move { messages.next().await.map(|m| m.map(|m| delivered(&m))) });
    let long = async {
        tokio::time::sleep(ack_wait * 3).await;
        Ok::<_, std::io::Error>(())
    };
    let handled = charge_once.handle(&second, long).await.unwrap();
    assert!(matches!(handled, Handled::Acked(_)), "{handled:?}");
    queue.client.flush().await.unwrap();
    assert!(!pulling.is_finished(), "redelivered: {:?}", pulling.await);
    pulling.abort();
    let info = consumer.info().await.unwrap();
    assert_eq!(
        deliveries(info),
        2,
        "each message delivered once: {info:#?}"
    );
}

/// A message's progress acks end before its final acknowledgement goes out: a `+WPI` that came
/// after a `-NAK` with a delay would restart the message's `AckWait` and replace the delay.
/// Hundreds of messages whose bodies end around the moment their progress ack falls due, and
/// every ack the client sends watched on the wire, in the order the server routes them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_progress_ack_follows_the_final_acknowledgement() {
    const MESSAGES: u64 = 400;
    let queue = Queue::start().await;
    let mut wire = queue.client.subscribe("$JS.ACK.>").await.unwrap();
    queue.client.flush().await.unwrap();
    // The shortest `AckWait` there is, so that progress acks come as often as they can.
    let charge_once = Idempotent::new(Task::new("nats_last_word"), MsgId)
        .store(queue.store().await)
        .ack_wait(Duration::from_millis(30));
    let interval = charge_once.progress_interval();
    let mut handling = tokio::task::JoinSet::new();
    for n in 1..=MESSAGES {
        let mut message = without_reply(&queue, &format!("last-word-{n}"));
        message.message.reply =
            Some(format!("$JS.ACK.{STREAM}.last.1.{n}.{n}.1764547200000000000.0").into());
        let charge_once = charge_once.clone();
        // Bodies that end from just before their first progress ack to just after it.
        let lasts = interval * 4 / 5 + interval * u32::try_from(n % 40).unwrap() / 100;
        handling.spawn(async move {
            let body = async move {
                tokio::time::sleep(lasts).await;
                Ok::<_, std::io::Error>(())
            };
            charge_once.handle(&message, body).await.unwrap()
        });
    }
    while let Some(handled) = handling.join_next().await {
        assert!(matches!(handled.unwrap(), Handled::Acked(_)));
    }
    // Long past any progress ack still on its way (the scenario under test: what the client
    // sends after it has answered every message), then a marker that arrives after all of it.
    tokio::time::sleep(interval * 10).await;
    drop(charge_once);
    queue
        .client
        .publish("$JS.ACK.end", "end".into())
        .await
        .unwrap();
    let mut sent = std::collections::HashMap::<String, Vec<String>>::new();
    while let Some(ack) = tokio::time::timeout(Duration::from_secs(30), wire.next())
        .await
        .expect("the marker arrives")
    {
        if ack.subject.as_str() == "$JS.ACK.end" {
            break;
        }
        let payload = String::from_utf8_lossy(&ack.payload).into_owned();
        sent.entry(ack.subject.to_string())
            .or_default()
            .push(payload);
    }
    assert_eq!(sent.len() as u64, MESSAGES, "every message acked");
    let late: Vec<_> = sent
        .iter()
        .filter(|(_, acks)| acks.iter().position(|ack| ack != "+WPI") != Some(acks.len() - 1))
        .collect();
    assert!(late.is_empty(), "acks after the final one: {late:?}");
    let progress_acks = sent.values().flatten().filter(|ack| *ack == "+WPI").count();
    assert!(progress_acks > 0, "no progress ack went out at all");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_is_down_fails_closed_with_a_growing_delay_until_it_is_back() {
    let mut queue = Queue::start().await;
    let consumer = queue.consumer("charger", Duration::from_secs(30)).await;
    let sequence = queue.publish(r#"{"id":4}"#, Some("order-4")).await;
    let store = idempotask_redis::RedisStore::builder(queue.redis.url())
        .response_timeout(Duration::from_millis(500))
        .connect()
        .await
        .unwrap();
    let first = Duration::from_millis(100);
    let charge_once = Idempotent::new(Task::new("nats_store_down"), MsgId)
        .store(store)
        .store_backoff(Backoff::new(first, Duration::from_secs(1)));
    let charges = AtomicU32::new(0);
    let charge = || async {
        charges.fetch_add(1, Ordering::SeqCst);
        Ok::<_, std::io::Error>("ch_4".to_owned())
    };
    let _ = std::process::Command::new("kill")
        .args(["-KILL", &queue.redis.pid().to_string()])
        .status();

    let mut messages = consumer.messages().await.unwrap();
    let mut delays = Vec::new();
    for delivery in 1..=2 {
        let message = messages.next().await.unwrap().unwrap();
        assert_eq!(
            (stream_sequence(&message), delivered(&message)),
            (sequence, delivery)
        );
        let handled = charge_once.handle(&message, charge()).await.unwrap();
        let Handled::Deferred { error, delay, .. } = &handled else {
            panic!("the store is down, yet {handled:?}")
        };
        assert!(matches!(error, Error::Store(_)), "{error}");
        delays.push(*delay);
    }
    assert_eq!(
        delays,
        [first, first * 2],
        "a backoff that grows per delivery"
    );
    assert_eq!(
        charges.load(Ordering::SeqCst),
        0,
        "nothing ran without the store"
    );

    queue.redis.restart();
    // The store reconnects in its own time: until then each delivery is deferred again, never
    // run; the bound keeps a store that never comes back from hanging the test.
    let mut report = None;
    for _ in 0..20 {
        let again = messages.next().await.unwrap().unwrap();
        match charge_once.handle(&again, charge()).await.unwrap() {
            Handled::Acked(acked) => {
                report = Some(acked);
                break;
            }
            Handled::Deferred {
                error: Error::Store(_),
                ..
            } => {}
            other => panic!("the store is back, yet {other:?}"),
        }
    }
    let report = report.expect("acked within 20 deliveries of the store coming back");
    assert_eq!(report.outcome, Outcome::Executed);
    assert_eq!(charges.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn progress_acks_outlast_a_body_that_blocks_its_thread() {
    let queue = Queue::start().await;
    let ack_wait = Duration::from_secs(2);
    queue.publish(r#"{"id":13}"#, Some("order-13")).await;
    let charge_once = Idempotent::new(Task::new("nats_blocking"), MsgId)
        .store(queue.store().await)
        .ack_wait(ack_wait);
    let mut consumer = queue.consumer("charger", ack_wait).await;
    let mut messages = consumer.messages().await.unwrap();
    let message = messages.next().await.unwrap().unwrap();
    let pulling =
        tokio::spawn(async move { messages.next().await.map(|m| m.map(|m| delivered(&m))) });
    // A synchronous call that holds its worker thread for longer than AckWait, twice over.
    let body = async {
        std::thread::sleep(ack_wait * 2 + ack_wait / 2);
        Ok::<_, std::io::Error>(())
    };
    let handled = charge_once.handle(&message, body).await.unwrap();
    assert!(matches!(handled, Handled::Acked(_)), "{handled:?}");
    queue.client.flush().await.unwrap();
    assert!(!pulling.is_finished(), "redelivered: {:?}", pulling.await);
    pulling.abort();
    let info = consumer.info().await.unwrap();
    assert_eq!(deliveries(info), 1, "{info:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_acks_stop_once_the_lock_is_gone_and_the_message_comes_back() {
    let queue = Queue::start().await;
    let ack_wait = Duration::from_secs(2);
    let sequence = queue.publish(r#"{"id":14}"#, Some("order-14")).await;
    let lock_ttl = Duration::from_secs(1);
    // No renewal: the lock expires under a body that runs longer than its TTL.
    let task = Task::new("nats_outlived").lock_ttl(lock_ttl).renew(false);
    let charge_once = Idempotent::new(task, MsgId)
        .store(queue.store().await)
        .ack_wait(ack_wait);
    assert_eq!(
        charge_once.progress_interval(),
        lock_ttl / 3,
        "the lock's TTL is the shorter clock"
    );
    let consumer = queue.consumer("charger", ack_wait).await;
    let mut messages = consumer.messages().await.unwrap();
    let message = messages.next().await.unwrap().unwrap();
    let (back_tx, back_rx) = tokio::sync::oneshot::channel();
    let pulling = tokio::spawn(async move {
        let again = messages.next().await.unwrap().unwrap();
        back_tx.send(again).unwrap();
        messages
    });
    // The body lasts until JetStream hands the message out again: with progress acks going on
    // after the lock is gone, it never would, and the timeout fails the test.
    let body = async {
        let again = tokio::time::timeout(Duration::from_secs(30), back_rx)
            .await
            .expect("redelivered once the lock was gone")
            .unwrap();
        Ok::<_, std::io::Error>((stream_sequence(&again), delivered(&again)))
    };
    let handled = charge_once.handle(&message, body).await.unwrap();
    let Handled::Acked(report) = handled else {
        panic!("{handled:?}")
    };
    assert_eq!(report.value, (sequence, 2));
    drop(pulling.await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ack_that_cannot_be_sent_is_an_error_that_keeps_the_outcome() {
    let queue = Queue::start().await;
    let charge_once =
        Idempotent::new(Task::new("nats_unackable"), MsgId).store(queue.store().await);
    // A message with its reply subject gone, such as a core NATS message passed on as a
    // JetStream one: the ack has nowhere to go.
    let message = without_reply(&queue, "order-15");
    let charge = async { Ok::<_, std::io::Error>("ch_15".to_owned()) };
    let err = charge_once.handle(&message, charge).await.unwrap_err();
    assert!(matches!(err.ack_kind(), AckKind::Ack), "{err}");
    let Handled::Acked(report) = err.into_handled() else {
        panic!("the outcome was lost with the ack")
    };
    assert_eq!(
        (report.value.as_str(), report.outcome),
        ("ch_15", Outcome::Executed)
    );
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_msg_id_is_no_key_and_nothing_runs() {
    let queue = Queue::start().await;
    let charge_once =
        Idempotent::new(Task::new("nats_empty_msg_id"), MsgId).store(queue.store().await);
    let message = without_reply(&queue, "");
    assert!(
        MsgId.key(&message).is_err(),
        "an empty Nats-Msg-Id is a key"
    );
    let runs = AtomicU32::new(0);
    let body = async {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok::<_, std::io::Error>(())
    };
    let handled = charge_once.process(&message, body).await;
    assert!(
        matches!(handled, Handled::Terminated(Rejection::MissingKey(_))),
        "{handled:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0, "nothing ran unprotected");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_reused_with_another_payload_is_terminated_and_runs_nothing() {
    let queue = Queue::start().await;
    let consumer = queue.consumer("checker", Duration::from_secs(30)).await;
    let mut advisories = queue.terminations("checker").await;
    queue.publish(r#"{"id":5,"amount":100}"#, None).await;
    queue.publish(r#"{"id":5,"amount":100}"#, None).await;
    let other = queue.publish(r#"{"id":5,"amount":999}"#, None).await;
    let checked = Idempotent::new(Task::new("nats_fingerprint"), by_order)
        .store(queue.store().await)
        .fingerprint_payload(true);
    let runs = AtomicU32::new(0);
    let body = || async {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok::<_, std::io::Error>(runs.load(Ordering::SeqCst))
    };

    let mut messages = consumer.messages().await.unwrap();
    let mut outcomes = Vec::new();
    for _ in 0..3 {
        let message = messages.next().await.unwrap().unwrap();
        outcomes.push(checked.handle(&message, body()).await.unwrap());
    }
    let acked: Vec<Outcome> = outcomes[..2]
        .iter()
        .map(|handled| match handled {
            Handled::Acked(report) => report.outcome,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(acked, [Outcome::Executed, Outcome::Replayed]);
    assert!(
        matches!(
            &outcomes[2],
            Handled::Terminated(Rejection::Refused(Error::KeyReuse { .. }))
        ),
        "{:?}",
        outcomes[2]
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the other payload ran");
    assert_eq!(terminated(&mut advisories, 1).await, [other]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_store_installed_defers_the_message_and_runs_nothing() {
    // Nothing in this binary installs a store: a deploy that forgot to is the case here.
    let queue = Queue::start().await;
    let consumer = queue
        .consumer("unconfigured", Duration::from_secs(30))
        .await;
    queue.publish(r#"{"id":13}"#, Some("order-13")).await;
    let first = Duration::from_millis(100);
    let unconfigured = Idempotent::new(Task::new("nats_no_store"), MsgId)
        .store_backoff(Backoff::new(first, Duration::from_secs(1)));
    let mut messages = consumer.messages().await.unwrap();
    let message = messages.next().await.unwrap().unwrap();
    let runs = AtomicU32::new(0);
    let body = async {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok::<_, std::io::Error>(())
    };
    let handled = unconfigured.handle(&message, body).await.unwrap();
    assert!(
        matches!(
            &handled,
            Handled::Deferred { error: Error::NotConfigured, delay, .. } if *delay == first
        ),
        "{handled:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0, "ran without a store");
    // Delivered again after the delay, not dropped.
    let again = tokio::time::timeout(Duration::from_secs(30), messages.next())
        .await
        .expect("the message comes back")
        .unwrap()
        .unwrap();
    assert_eq!(delivered(&again), 2);
}

/// A body that panics, as a poison message makes it do.
/// It panics on a later poll than its first, as a body does after its first await.
async fn poisoned(runs: Arc<AtomicU32>) -> Result<(), String> {
    runs.fetch_add(1, Ordering::SeqCst);
    tokio::task::yield_now().await;
    panic!("poison order")
}

// A panicking body was delivered again for ever (9 deliveries in 9 s, never `+TERM`): the panic
// unwound past the code that counts failures and settles the message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_body_is_a_failure_nakd_then_terminated_after_max_failures() {
    let queue = Queue::start().await;
    let mut consumer = queue.consumer("charger", Duration::from_secs(30)).await;
    let mut advisories = queue.terminations("charger").await;
    let sequence = queue.publish(r#"{"id":21}"#, Some("order-21")).await;
    let first = Duration::from_millis(50);
    let charge_once = Idempotent::new(Task::new("nats_panicking"), MsgId)
        .store(queue.store().await)
        .failure_backoff(Backoff::new(first, Duration::from_secs(1)))
        .max_failures(3);
    let runs = Arc::new(AtomicU32::new(0));

    let mut messages = consumer.messages().await.unwrap();
    let mut outcomes = Vec::new();
    for delivery in 1..=3 {
        let message = messages.next().await.unwrap().unwrap();
        assert_eq!(delivered(&message), delivery);
        // A task per message, as a concurrent consumer runs them.
        let (charge_once, runs) = (charge_once.clone(), Arc::clone(&runs));
        let handled = tokio::spawn(async move {
            charge_once
                .handle(&message, poisoned(runs))
                .await
                .map(|handled| (handled.ack_kind(), handled))
        })
        .await
        .expect("the message's task outlives the panic")
        .unwrap();
        outcomes.push(handled);
    }
    match &outcomes[..] {
        [
            (
                AckKind::Nak(Some(d1)),
                Handled::Failed {
                    error: BodyFailure::Panicked(p1),
                    ..
                },
            ),
            (
                AckKind::Nak(Some(d2)),
                Handled::Failed {
                    error: BodyFailure::Panicked(_),
                    ..
                },
            ),
            (
                AckKind::Term,
                Handled::GaveUp {
                    error: BodyFailure::Panicked(_),
                    failures: 3,
                    ..
                },
            ),
        ] => {
            assert_eq!((*d1, *d2), (first, first * 2), "the failure backoff");
            assert_eq!(p1.message(), "poison order");
        }
        other => panic!("{other:#?}"),
    }
    assert_eq!(terminated(&mut advisories, 1).await, [sequence]);
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    let info = eventually(&mut consumer, no_ack_pending).await;
    assert_eq!(deliveries(&info), 3, "never delivered again: {info:#?}");
}

// Deferrals used up `max_failures`: six deliveries deferred while Redis was down, then one
// transient failure of the body, and the message was terminated (`GaveUp` on delivery 7, the
// body run once). JetStream's `delivered` counts the deferrals too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deferred_deliveries_do_not_use_up_max_failures() {
    let mut queue = Queue::start().await;
    let consumer = queue.consumer("charger", Duration::from_secs(30)).await;
    queue.publish(r#"{"id":22}"#, Some("order-22")).await;
    let store = idempotask_redis::RedisStore::builder(queue.redis.url())
        .response_timeout(Duration::from_millis(500))
        .connect()
        .await
        .unwrap();
    let short = Duration::from_millis(10);
    let charge_once = Idempotent::new(Task::new("nats_deferred_then_failing"), MsgId)
        .store(store)
        .store_backoff(Backoff::new(short, short * 2))
        .failure_backoff(Backoff::new(short, short * 2))
        .max_failures(3);
    let runs = AtomicU32::new(0);
    let charge = || async {
        if runs.fetch_add(1, Ordering::SeqCst) == 0 {
            Err("the gateway timed out")
        } else {
            Ok("ch_22".to_owned())
        }
    };
    let _ = std::process::Command::new("kill")
        .args(["-KILL", &queue.redis.pid().to_string()])
        .status();

    let mut messages = consumer.messages().await.unwrap();
    for _ in 0..6 {
        let message = messages.next().await.unwrap().unwrap();
        let handled = charge_once.handle(&message, charge()).await.unwrap();
        assert!(
            matches!(
                &handled,
                Handled::Deferred {
                    error: Error::Store(_),
                    ..
                }
            ),
            "the store is down, yet {handled:?}"
        );
    }
    queue.redis.restart();
    let mut failed_on = None;
    let mut acked = None;
    // Deferred until the store has reconnected, then one failure, then the run that stores.
    for _ in 0..60 {
        let message = messages.next().await.unwrap().unwrap();
        match charge_once.handle(&message, charge()).await.unwrap() {
            Handled::Deferred {
                error: Error::Store(_),
                ..
            } => {}
            Handled::Failed {
                error: BodyFailure::Error(_),
                ..
            } if failed_on.is_none() => {
                failed_on = Some(delivered(&message));
            }
            Handled::Acked(report) => {
                acked = Some((report.outcome, delivered(&message)));
                break;
            }
            other => panic!("delivery {}: {other:?}", delivered(&message)),
        }
    }
    let failed_on = failed_on.expect("the body failed once");
    assert!(
        failed_on > 6,
        "the failure came after the deferrals: {failed_on}"
    );
    let (outcome, acked_on) = acked.expect("acked within 60 deliveries of the store coming back");
    assert_eq!((outcome, acked_on), (Outcome::Executed, failed_on + 1));
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    // The one failure is what the bucket holds for the message (beside the consumer check's
    // probe).
    let counts = queue.js.get_key_value("idempotask_failures").await.unwrap();
    let keys: Vec<String> = counts
        .keys()
        .await
        .unwrap()
        .map(Result::unwrap)
        .collect()
        .await;
    let message_keys: Vec<&String> = keys.iter().filter(|key| !is_probe(key)).collect();
    assert_eq!(message_keys.len(), 1, "{keys:?}");
    assert_eq!(
        &counts.get(message_keys[0]).await.unwrap().unwrap()[..],
        b"1"
    );
}

/// Whether `key` is one the consumer check writes into the failure bucket to see that it takes
/// writes.
fn is_probe(key: &str) -> bool {
    key.starts_with("idempotask_check.")
}

// A consumer whose AckWait was shorter than the one the integration assumed, or with a small
// `max_deliver`, was neither refused nor warned about, though either can redeliver a message
// under a held lock or drop one nobody finished.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_whose_settings_work_against_the_lock_is_reported() {
    let queue = Queue::start().await;
    let mut risky = queue
        .stream
        .create_consumer(pull::Config {
            durable_name: Some("risky".to_owned()),
            ack_wait: Duration::from_secs(1),
            max_deliver: 2,
            ..Default::default()
        })
        .await
        .unwrap();
    let mut fitting = queue.consumer("fitting", Duration::from_secs(30)).await;
    let charge_once = Idempotent::new(Task::new("nats_checked"), MsgId);
    let risky = risky.info().await.unwrap().config.clone();
    let problems = charge_once.consumer_problems(&risky);
    assert!(
        matches!(
            &problems[..],
            [
                ConsumerProblem::AckWaitShorterThanDeclared { consumer, declared, .. },
                ConsumerProblem::MaxDeliverLimited { max_deliver: 2, .. },
            ] if *consumer == Duration::from_secs(1) && *declared == Duration::from_secs(30)
        ),
        "{problems:?}"
    );
    let fitting = fitting.info().await.unwrap().config.clone();
    assert_eq!(charge_once.consumer_problems(&fitting), []);
    // Declared as it is, the short AckWait fits: the progress acks follow it.
    let declared = charge_once.ack_wait(Duration::from_secs(1));
    let problems = declared.consumer_problems(&risky);
    assert!(
        matches!(
            &problems[..],
            [ConsumerProblem::MaxDeliverLimited { max_deliver: 2, .. }]
        ),
        "{problems:?}"
    );
}

// A consumer's `backoff` list was not checked, though JetStream waits for each delivery's ack
// as long as its entry says, not `AckWait`: an entry shorter than the declared AckWait
// redelivers a message whose body still runs under its lock, as a short AckWait does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_backoff_shorter_than_the_declared_ack_wait_is_reported() {
    let queue = Queue::start().await;
    let ack_wait = Duration::from_secs(2);
    let short = Duration::from_millis(200);
    let mut backing_off = queue
        .stream
        .create_consumer(pull::Config {
            durable_name: Some("backing_off".to_owned()),
            ack_wait,
            backoff: vec![ack_wait, short, 5 * ack_wait],
            max_deliver: 4,
            ..Default::default()
        })
        .await
        .unwrap();
    let config = backing_off.info().await.unwrap().config.clone();
    assert_eq!(
        config.ack_wait, ack_wait,
        "JetStream's AckWait is the first entry"
    );
    let charge_once = Idempotent::new(Task::new("nats_backoff"), MsgId).ack_wait(ack_wait);
    let problems = charge_once.consumer_problems(&config);
    assert!(
        matches!(
            &problems[..],
            [
                ConsumerProblem::BackoffShorterThanDeclared { delivery: 2, backoff, declared, .. },
                ConsumerProblem::MaxDeliverLimited { max_deliver: 4, .. },
            ] if *backoff == short && *declared == ack_wait
        ),
        "{problems:?}"
    );
    assert!(
        problems[0].to_string().contains("delivery 2"),
        "{}",
        problems[0]
    );
    // The short entry would be the wait of delivery 3, which `max_deliver` makes the last: it
    // is never followed by a redelivery, so it does not count. (nats-server 2.9 refuses such a
    // consumer, whose `max_deliver` is not above the list's length; later servers take it.)
    let unused = jetstream::consumer::Config {
        backoff: vec![ack_wait, 5 * ack_wait, short],
        max_deliver: 3,
        ..config
    };
    let problems = charge_once.consumer_problems(&unused);
    assert!(
        matches!(
            &problems[..],
            [ConsumerProblem::MaxDeliverLimited { max_deliver: 3, .. }]
        ),
        "{problems:?}"
    );
}

/// Declares the stream of key-value bucket `bucket` as the integration does, but holding at
/// most one byte, so that every write to it is refused while reads work.
async fn full_bucket(queue: &Queue, bucket: &str) {
    queue
        .js
        .create_stream(jetstream::stream::Config {
            name: format!("KV_{bucket}"),
            subjects: vec![format!("$KV.{bucket}.>")],
            max_messages_per_subject: 1,
            max_bytes: 1,
            discard: jetstream::stream::DiscardPolicy::New,
            allow_rollup: true,
            deny_delete: true,
            allow_direct: true,
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(
        queue.js.get_key_value(bucket).await.is_ok(),
        "a bucket to the client"
    );
}

/// Runs an always failing body over the deliveries of one message until it is terminated, at
/// most `bound` times; answers the outcome of each delivery: its `delivered` and what became
/// of it.
async fn poison_until_terminated(
    queue: &Queue,
    consumer: &str,
    charge_once: &Idempotent<MsgId>,
    bound: usize,
) -> Vec<(i64, AckKind, Option<u32>)> {
    let consumer = queue.consumer(consumer, Duration::from_secs(30)).await;
    let mut messages = consumer.messages().await.unwrap();
    let mut outcomes = Vec::new();
    for _ in 0..bound {
        let message = tokio::time::timeout(Duration::from_secs(30), messages.next())
            .await
            .expect("the message comes back")
            .unwrap()
            .unwrap();
        let handled = charge_once
            .handle(&message, async { Err::<(), _>("card declined") })
            .await
            .unwrap();
        let failures = match &handled {
            Handled::Failed { .. } => None,
            Handled::GaveUp { failures, .. } => Some(*failures),
            other => panic!("{other:?}"),
        };
        outcomes.push((delivered(&message), handled.ack_kind(), failures));
        if failures.is_some() {
            break;
        }
    }
    outcomes
}

// A failure bucket that refused writes left every count at zero: a poison message was nak'd
// for ever, its body run without end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_bucket_that_refuses_writes_still_ends_a_poison_message() {
    let queue = Queue::start().await;
    full_bucket(&queue, "full_failures").await;
    let mut advisories = queue.terminations("charger").await;
    let sequence = queue.publish(r#"{"id":31}"#, Some("order-31")).await;
    let short = Duration::from_millis(20);
    let charge_once = Idempotent::new(Task::new("nats_full_bucket"), MsgId)
        .store(queue.store().await)
        .failure_counts("full_failures", Duration::from_secs(3600))
        .failure_backoff(Backoff::constant(short))
        .max_failures(3);

    let outcomes = poison_until_terminated(&queue, "charger", &charge_once, 10).await;
    assert!(
        matches!(
            &outcomes[..],
            [
                (1, AckKind::Nak(Some(d1)), None),
                (2, AckKind::Nak(Some(d2)), None),
                (3, AckKind::Term, Some(3)),
            ] if *d1 == short && *d2 == short
        ),
        "terminated by its deliveries: {outcomes:?}"
    );
    assert_eq!(terminated(&mut advisories, 1).await, [sequence]);
    // The first-message check said so too.
    let problems = charge_once
        .check_consumer(&queue.js, &jetstream::consumer::Config::default())
        .await;
    assert!(
        matches!(
            &problems[..],
            [ConsumerProblem::FailureBucketUnusable { bucket, .. }] if bucket == "full_failures"
        ),
        "{problems:?}"
    );
}

// A failure bucket that could not be opened counted every message's failures from zero: a
// poison message was nak'd for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_bucket_that_cannot_be_opened_still_ends_a_poison_message() {
    let queue = Queue::start().await;
    // A stream of the bucket's name that is not a key-value bucket: the bucket can be neither
    // opened nor created.
    queue
        .js
        .create_stream(jetstream::stream::Config {
            name: "KV_taken".to_owned(),
            subjects: vec!["taken.>".to_owned()],
            ..Default::default()
        })
        .await
        .unwrap();
    queue.publish(r#"{"id":32}"#, Some("order-32")).await;
    let charge_once = Idempotent::new(Task::new("nats_no_bucket"), MsgId)
        .store(queue.store().await)
        .failure_counts("taken", Duration::from_secs(3600))
        .failure_backoff(Backoff::constant(Duration::from_millis(20)))
        .max_failures(2);
    let problems = charge_once
        .check_consumer(&queue.js, &jetstream::consumer::Config::default())
        .await;
    assert!(
        matches!(
            &problems[..],
            [ConsumerProblem::FailureBucketUnusable { bucket, reason, .. }]
                if bucket == "taken" && !reason.is_empty()
        ),
        "{problems:?}"
    );

    let outcomes = poison_until_terminated(&queue, "charger", &charge_once, 10).await;
    assert!(
        matches!(
            &outcomes[..],
            [(1, AckKind::Nak(_), None), (2, AckKind::Term, Some(2))]
        ),
        "{outcomes:?}"
    );
    // A bucket that works is no problem, and the check leaves it made.
    let fine = Idempotent::new(Task::new("nats_fine_bucket"), MsgId)
        .failure_counts("fine_failures", Duration::from_secs(3600));
    assert_eq!(
        fine.check_consumer(&queue.js, &jetstream::consumer::Config::default())
            .await,
        []
    );
    let bucket = queue.js.get_key_value("fine_failures").await.unwrap();
    let keys: Vec<String> = bucket
        .keys()
        .await
        .unwrap()
        .map(Result::unwrap)
        .collect()
        .await;
    assert!(
        keys.iter().all(|key| is_probe(key)) && !keys.is_empty(),
        "{keys:?}"
    );
}

/// A message as JetStream would deliver it from consumer `consumer` of the `ORDERS` stream,
/// with `Nats-Msg-Id: msg_id`; its acks go nowhere.
fn delivered_by(queue: &Queue, consumer: &str, msg_id: &str) -> Message {
    let mut message = without_reply(queue, msg_id);
    message.message.reply =
        Some(format!("$JS.ACK.{STREAM}.{consumer}.1.1.1.1764547200000000000.0").into());
    message
}

// The consumer was marked checked before the check ran: when the first message's consumer could
// not be read, no later message checked it, and its problems were never reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_check_that_could_not_read_the_consumer_runs_again_later() {
    let queue = Queue::start().await;
    let charge_once = Idempotent::new(Task::new("nats_check_again"), MsgId)
        .store(queue.store().await)
        .failure_counts("checked_failures", Duration::from_secs(3600));
    let checked = || async { queue.js.get_key_value("checked_failures").await.is_ok() };
    // Its consumer does not exist: the check cannot read it, and probes nothing.
    let ghost = delivered_by(&queue, "ghost", "order-33");
    let handled = charge_once
        .process(&ghost, async { Ok::<_, std::io::Error>(()) })
        .await;
    assert!(matches!(handled, Handled::Acked(_)), "{handled:?}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!checked().await, "checked a consumer that does not exist");

    // Once the retry delay has passed, a message of a real consumer is checked.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let consumer = queue.consumer("charger", Duration::from_secs(30)).await;
    queue.publish(r#"{"id":34}"#, Some("order-34")).await;
    let mut messages = consumer.messages().await.unwrap();
    let message = messages.next().await.unwrap().unwrap();
    let handled = charge_once
        .handle(&message, async { Ok::<_, std::io::Error>(()) })
        .await
        .unwrap();
    assert!(matches!(handled, Handled::Acked(_)), "{handled:?}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !checked().await {
        assert!(Instant::now() < deadline, "the consumer was never checked");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
