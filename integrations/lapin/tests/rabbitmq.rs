//! `idempotask-lapin` on a real broker that this test binary starts (one node shared by the
//! tests, each on its own queues): duplicates replay, a busy key comes back through the retry
//! queue after the holder's lock time and replays, a delivery that can never succeed reaches the
//! dead-letter queue (one whose unit is held in doubt with its reason in the headers), and a
//! body error is retried without being cached. The kill -9 scenario is
//! the `rabbitmq_worker` example, run by `tests/example_queues.rs`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use futures_util::StreamExt;
use idempotask::store::Store as _;
use idempotask::{Backoff, Error, InDoubt, MemoryStore, Outcome, RetryPolicy, Task};
use idempotask_lapin::{
    Cause, ERROR_HEADER, FAILURES_HEADER, IN_DOUBT, Idempotent, MessageId, REASON_HEADER,
    RetryQueue, STORE_ERRORS_HEADER, SettleFailure, Settled, Topology,
};
use idempotask_test_support as support;
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicGetOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, Consumer};
use support::RedisServer;
use support::doubt::leave_in_doubt;
use support::rabbitmq::RabbitServer;

/// How long a test waits for a message the broker should deliver; a failure, not a pause.
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(30);

/// A connection to the shared broker and the topology of a work queue of the test's own.
struct Fixture {
    connection: Connection,
    channel: Channel,
    topology: Topology,
    retries: RetryQueue,
}

impl Fixture {
    async fn new(queue: &str) -> Self {
        let url = tokio::task::spawn_blocking(|| RabbitServer::shared().url())
            .await
            .unwrap();
        let connection = Connection::connect(&url, ConnectionProperties::default())
            .await
            .unwrap();
        let channel = connection.create_channel().await.unwrap();
        let topology = Topology::new(queue);
        let retries = topology.declare(&channel).await.unwrap();
        Self {
            connection,
            channel,
            topology,
            retries,
        }
    }

    /// Publishes `body` to the work queue with `message_id`, confirmed by the broker.
    async fn publish(&self, message_id: Option<&str>, body: &[u8]) {
        self.channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .unwrap();
        let mut properties = BasicProperties::default();
        if let Some(id) = message_id {
            properties = properties.with_message_id(id.into());
        }
        let confirm = self
            .channel
            .basic_publish(
                "".into(),
                self.topology.queue().into(),
                BasicPublishOptions::default(),
                body,
                properties,
            )
            .await
            .unwrap()
            .await
            .unwrap();
        assert!(confirm.is_ack(), "{confirm:?}");
    }

    /// The next delivery of the work queue (the published one, or one back from the retry
    /// queue).
    async fn next(&self, consumer: &mut Consumer) -> Delivery {
        tokio::time::timeout(DELIVERY_TIMEOUT, consumer.next())
            .await
            .expect("a delivery within 30 s")
            .expect("the consumer is open")
            .unwrap()
    }

    async fn consume(&self, queue: &str) -> Consumer {
        self.channel
            .basic_consume(
                queue.into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap()
    }

    /// How many messages wait in `queue`.
    async fn depth(&self, queue: &str) -> u32 {
        self.channel
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

fn header(delivery: &Delivery, name: &str) -> Option<AMQPValue> {
    delivery
        .properties
        .headers()
        .as_ref()
        .and_then(|headers| headers.inner().get(name).cloned())
}

/// A body that counts its runs and answers the charge id of its run.
fn charging(
    runs: &Arc<AtomicU32>,
) -> impl FnOnce(&Delivery) -> std::future::Ready<Result<String, String>> {
    let runs = Arc::clone(runs);
    move |_| {
        let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
        std::future::ready(Ok(format!("ch_{run}")))
    }
}

fn acked<T: std::fmt::Debug, E: std::fmt::Debug>(settled: Settled<T, E>) -> (T, Outcome) {
    match settled {
        Settled::Acked(report) => (report.value, report.outcome),
        other => panic!("expected an ack, got {other:?}"),
    }
}

fn dead_lettered<T: std::fmt::Debug, E: std::fmt::Debug>(settled: Settled<T, E>) -> Cause<E> {
    match settled {
        Settled::DeadLettered(cause) => cause,
        other => panic!("expected a dead letter, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_duplicate_delivery_replays_and_the_body_runs_once() {
    let fixture = Fixture::new("duplicates").await;
    let consumer = Idempotent::new(
        Task::new("lapin_duplicates"),
        MessageId,
        fixture.retries.clone(),
    )
    .store(MemoryStore::new());
    fixture.publish(Some("order-1"), b"1").await;
    fixture.publish(Some("order-1"), b"1").await;
    let mut deliveries = fixture.consume(fixture.topology.queue()).await;
    let runs = Arc::new(AtomicU32::new(0));

    let first = consumer
        .process(fixture.next(&mut deliveries).await, charging(&runs))
        .await
        .unwrap();
    assert_eq!(acked(first), ("ch_1".to_owned(), Outcome::Executed));
    let second = consumer
        .process(fixture.next(&mut deliveries).await, charging(&runs))
        .await
        .unwrap();
    assert_eq!(acked(second), ("ch_1".to_owned(), Outcome::Replayed));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    // Both were acked: nothing waits to come back.
    drop(deliveries);
    assert_eq!(fixture.depth(fixture.topology.queue()).await, 0);
    assert_eq!(fixture.depth(fixture.topology.retry_queue()).await, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_busy_key_comes_back_after_the_holders_lock_time_and_replays() {
    let fixture = Fixture::new("contended").await;
    let lock_ttl = Duration::from_secs(3);
    // Renewal keeps the holder's lock while the test waits on a slow machine.
    let task = Task::new("lapin_contended")
        .lock_ttl(lock_ttl)
        .renew(true)
        .retry(RetryPolicy::no_wait());
    let consumer =
        Idempotent::new(task, MessageId, fixture.retries.clone()).store(MemoryStore::new());
    fixture.publish(Some("order-2"), b"2").await;
    fixture.publish(Some("order-2"), b"2").await;
    let get = || async {
        fixture
            .channel
            .basic_get(fixture.topology.queue().into(), BasicGetOptions::default())
            .await
            .unwrap()
            .expect("a message in the work queue")
            .delivery
    };
    let holder = get().await;
    let duplicate = get().await;

    // The holder takes the lock and stays in its body until released.
    let runs = Arc::new(AtomicU32::new(0));
    let (started_tx, started) = tokio::sync::oneshot::channel();
    let (release, released) = tokio::sync::oneshot::channel::<()>();
    let holding = tokio::spawn({
        let consumer = consumer.clone();
        let runs = Arc::clone(&runs);
        async move {
            consumer
                .process(holder, move |_: &Delivery| async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    started_tx.send(()).unwrap();
                    released.await.unwrap();
                    Ok::<_, String>("ch_held".to_owned())
                })
                .await
        }
    });
    started.await.unwrap();

    // Before the call: the copy is published, and its TTL starts, inside it.
    let sent_back = std::time::Instant::now();
    let busy = consumer.process(duplicate, charging(&runs)).await.unwrap();
    let Settled::Retrying {
        cause: Cause::Idempotask(Error::Contended { .. }),
        delay,
        ..
    } = busy
    else {
        panic!("expected a delayed redelivery for a busy key, got {busy:?}");
    };
    assert!(delay > Duration::ZERO && delay <= lock_ttl, "{delay:?}");
    assert_eq!(fixture.depth(fixture.topology.retry_queue()).await, 1);

    release.send(()).unwrap();
    let (value, outcome) = acked(holding.await.unwrap().unwrap());
    assert_eq!((value.as_str(), outcome), ("ch_held", Outcome::Executed));

    // The copy expires out of the retry queue into the work queue and gets the stored result.
    let mut deliveries = fixture.consume(fixture.topology.queue()).await;
    let back = fixture.next(&mut deliveries).await;
    // The copy waited out its delay in the retry queue: it is not back sooner (but for the
    // broker's millisecond expiration, which truncates the delay).
    assert!(
        sent_back.elapsed() + Duration::from_millis(2) >= delay,
        "back after {:?}, delay {delay:?}",
        sent_back.elapsed()
    );
    assert!(header(&back, "x-death").is_some(), "{:?}", back.properties);
    assert_eq!(
        back.properties.message_id().as_ref().unwrap().as_str(),
        "order-2"
    );
    let replayed = consumer.process(back, charging(&runs)).await.unwrap();
    assert_eq!(acked(replayed), ("ch_held".to_owned(), Outcome::Replayed));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn deliveries_that_can_never_succeed_reach_the_dead_letter_queue() {
    let fixture = Fixture::new("dead-letters").await;
    let consumer = Idempotent::new(
        Task::new("lapin_dead_letters"),
        MessageId,
        fixture.retries.clone(),
    )
    .store(MemoryStore::new())
    .fingerprint_payload(true);
    let runs = Arc::new(AtomicU32::new(0));
    fixture.publish(None, b"no key").await;
    fixture.publish(Some("order-3"), b"first payload").await;
    fixture.publish(Some("order-3"), b"another payload").await;
    let mut deliveries = fixture.consume(fixture.topology.queue()).await;

    let unkeyed = consumer
        .process(fixture.next(&mut deliveries).await, charging(&runs))
        .await
        .unwrap();
    assert!(
        matches!(unkeyed, Settled::DeadLettered(Cause::MissingKey(_))),
        "{unkeyed:?}"
    );
    let first = consumer
        .process(fixture.next(&mut deliveries).await, charging(&runs))
        .await
        .unwrap();
    assert_eq!(acked(first).1, Outcome::Executed);
    let reused = consumer
        .process(fixture.next(&mut deliveries).await, charging(&runs))
        .await
        .unwrap();
    let reused = dead_lettered(reused);
    assert!(
        matches!(reused, Cause::Idempotask(Error::KeyReuse { .. })),
        "{reused:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // Both are in the dead-letter queue, rejected, with their payloads.
    let mut dead = fixture.consume(fixture.topology.dead_letter_queue()).await;
    let mut payloads = Vec::new();
    for _ in 0..2 {
        let message = fixture.next(&mut dead).await;
        let Some(AMQPValue::FieldArray(deaths)) = header(&message, "x-death") else {
            panic!("no x-death header: {:?}", message.properties);
        };
        let Some(AMQPValue::FieldTable(death)) = deaths.as_slice().first() else {
            panic!("{deaths:?}");
        };
        assert_eq!(
            death.inner().get("reason"),
            Some(&AMQPValue::LongString("rejected".into())),
            "{death:?}"
        );
        payloads.push(message.data.clone());
    }
    assert_eq!(payloads, [b"no key".to_vec(), b"another payload".to_vec()]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_unit_in_doubt_is_dead_lettered_with_its_reason_and_nothing_runs() {
    let fixture = Fixture::new("in-doubt").await;
    let store = Arc::new(MemoryStore::new());
    // A delivery of order-9 took the lock and was killed before it stored a result.
    let unit = leave_in_doubt(&store, "lapin_in_doubt", "order-9").await;
    let task = Task::new("lapin_in_doubt")
        .in_doubt(InDoubt::Hold)
        .retry(RetryPolicy::no_wait());
    let consumer =
        Idempotent::new(task, MessageId, fixture.retries.clone()).store(Arc::clone(&store));
    let runs = Arc::new(AtomicU32::new(0));
    fixture.publish(Some("order-9"), b"charge 9").await;
    let mut deliveries = fixture.consume(fixture.topology.queue()).await;

    let settled = consumer
        .process(fixture.next(&mut deliveries).await, charging(&runs))
        .await
        .unwrap();
    let held = dead_lettered(settled);
    assert!(
        matches!(held, Cause::Idempotask(Error::InDoubt { .. })),
        "{held:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the held body did not run");

    // What the broker shows: one copy in the dead-letter queue, saying why, and the delivery
    // gone from the work queue, not retried.
    let dead_letters = fixture.topology.dead_letter_queue();
    assert_eq!(fixture.depth(dead_letters).await, 1);
    assert_eq!(fixture.depth(fixture.topology.queue()).await, 0);
    assert_eq!(fixture.depth(fixture.topology.retry_queue()).await, 0);
    let mut dead = fixture.consume(dead_letters).await;
    let message = fixture.next(&mut dead).await;
    assert_eq!(message.data, b"charge 9");
    assert_eq!(
        message
            .properties
            .message_id()
            .as_ref()
            .map(ShortString::as_str),
        Some("order-9")
    );
    assert_eq!(
        header(&message, REASON_HEADER),
        Some(AMQPValue::LongString(IN_DOUBT.into())),
        "{:?}",
        message.properties
    );
    let Some(AMQPValue::LongString(error)) = header(&message, ERROR_HEADER) else {
        panic!("no {ERROR_HEADER}: {:?}", message.properties);
    };
    let error = error.to_string();
    assert!(
        error.contains("is in doubt") && error.contains("an operator must resolve it"),
        "{error}"
    );
    // The held delivery wrote nothing: the unit stays in doubt for the operator.
    assert!(store.inspect(&unit).await.unwrap().in_doubt.is_some());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_body_error_is_retried_later_and_not_cached() {
    let fixture = Fixture::new("failures").await;
    let consumer = Idempotent::new(
        Task::new("lapin_failures"),
        MessageId,
        fixture.retries.clone(),
    )
    .store(MemoryStore::new())
    .failure_backoff(Backoff::new(
        Duration::from_millis(50),
        Duration::from_millis(200),
    ))
    // Apart from the store errors' backoff: a body error's delay below is the failure backoff's.
    .store_backoff(Backoff::constant(Duration::from_secs(5)))
    .max_failures(3);
    fixture.publish(Some("order-4"), b"4").await;
    fixture.publish(Some("order-5"), b"5").await;
    let mut deliveries = fixture.consume(fixture.topology.queue()).await;
    let runs = Arc::new(AtomicU32::new(0));
    let failing = |runs: &Arc<AtomicU32>| {
        let runs = Arc::clone(runs);
        move |_: &Delivery| {
            runs.fetch_add(1, Ordering::SeqCst);
            std::future::ready(Err::<String, _>("the gateway is unavailable".to_owned()))
        }
    };

    // order-4 fails once, comes back with its failure counted, and runs again.
    let failed = consumer
        .process(fixture.next(&mut deliveries).await, failing(&runs))
        .await
        .unwrap();
    assert!(
        matches!(&failed, Settled::Retrying { cause: Cause::Body(_), delay, .. } if *delay == Duration::from_millis(50)),
        "{failed:?}"
    );
    // order-5 fails every time: after three failures it is dead-lettered.
    let order5_runs = Arc::new(AtomicU32::new(0));
    let mut order5_failures = 0;
    let mut order4_done = false;
    while !order4_done || order5_failures < 3 {
        let delivery = fixture.next(&mut deliveries).await;
        let id = delivery
            .properties
            .message_id()
            .as_ref()
            .unwrap()
            .to_string();
        if id == "order-4" {
            assert!(!order4_done, "order-4 came back after it was done");
            assert_eq!(
                header(&delivery, FAILURES_HEADER),
                Some(AMQPValue::LongLongInt(1))
            );
            let settled = consumer.process(delivery, charging(&runs)).await.unwrap();
            // The body ran again (nothing was cached by the failure), and this time it stored.
            assert_eq!(acked(settled).1, Outcome::Executed);
            order4_done = true;
        } else {
            let settled = consumer
                .process(delivery, failing(&order5_runs))
                .await
                .unwrap();
            order5_failures += 1;
            match (order5_failures, &settled) {
                (
                    1 | 2,
                    Settled::Retrying {
                        cause: Cause::Body(_),
                        ..
                    },
                )
                | (3, Settled::DeadLettered(Cause::Body(_))) => {}
                _ => panic!("failure {order5_failures} of order-5: {settled:?}"),
            }
        }
    }
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    assert_eq!(order5_runs.load(Ordering::SeqCst), 3);
    let mut dead = fixture.consume(fixture.topology.dead_letter_queue()).await;
    let message = fixture.next(&mut dead).await;
    assert_eq!(
        message.properties.message_id().as_ref().unwrap().as_str(),
        "order-5"
    );
    assert_eq!(
        header(&message, FAILURES_HEADER),
        Some(AMQPValue::LongLongInt(2))
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_store_that_is_down_fails_closed_and_the_delivery_comes_back() {
    let fixture = Fixture::new("store-down").await;
    let redis = RedisServer::start();
    let store = redis.store().await;
    let consumer = Idempotent::new(
        Task::new("lapin_store_down"),
        MessageId,
        fixture.retries.clone(),
    )
    .store(store)
    .store_backoff(Backoff::new(
        Duration::from_millis(50),
        Duration::from_millis(200),
    ));
    fixture.publish(Some("order-6"), b"6").await;
    let mut deliveries = fixture.consume(fixture.topology.queue()).await;
    let runs = Arc::new(AtomicU32::new(0));

    // SIGSTOP: the store neither answers nor refuses, as a stalled server does.
    let pid = redis.pid().to_string();
    assert!(
        std::process::Command::new("kill")
            .args(["-STOP", &pid])
            .status()
            .unwrap()
            .success()
    );
    let down = consumer
        .process(fixture.next(&mut deliveries).await, charging(&runs))
        .await
        .unwrap();
    assert!(
        matches!(
            &down,
            Settled::Retrying {
                cause: Cause::Idempotask(Error::Store(_)),
                ..
            }
        ),
        "{down:?}"
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "the body ran without the store"
    );
    assert!(
        std::process::Command::new("kill")
            .args(["-CONT", &pid])
            .status()
            .unwrap()
            .success()
    );

    let back = fixture.next(&mut deliveries).await;
    assert_eq!(
        header(&back, STORE_ERRORS_HEADER),
        Some(AMQPValue::LongLongInt(1))
    );
    let settled = consumer.process(back, charging(&runs)).await.unwrap();
    assert_eq!(acked(settled), ("ch_1".to_owned(), Outcome::Executed));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_redelivery_that_cannot_be_published_waits_and_still_reaches_the_dead_letter_queue() {
    let fixture = Fixture::new("unroutable").await;
    // A retry queue that does not exist: the broker returns every copy as unroutable.
    let nowhere = RetryQueue::new(fixture.channel.clone(), "unroutable.no-such-queue")
        .await
        .unwrap();
    let delay = Duration::from_millis(300);
    let consumer = Idempotent::new(Task::new("lapin_unroutable"), MessageId, nowhere)
        .store(MemoryStore::new())
        .failure_backoff(Backoff::constant(delay))
        .max_failures(3);
    fixture.publish(Some("order-7"), b"7").await;
    let mut deliveries = fixture.consume(fixture.topology.queue()).await;
    let runs = Arc::new(std::sync::Mutex::new(Vec::new()));
    let failing = |runs: &Arc<std::sync::Mutex<Vec<std::time::Instant>>>| {
        let runs = Arc::clone(runs);
        move |_: &Delivery| {
            runs.lock().unwrap().push(std::time::Instant::now());
            std::future::ready(Err::<String, _>("declined".to_owned()))
        }
    };

    for failure in 1..=2 {
        let delivery = fixture.next(&mut deliveries).await;
        // Not acked away: the original comes back as it was, without the copy's count.
        assert_eq!(header(&delivery, FAILURES_HEADER), None);
        let err = consumer
            .process(delivery, failing(&runs))
            .await
            .unwrap_err();
        assert!(
            matches!(
                err.failure(),
                SettleFailure::Retry(idempotask_lapin::PublishError::Unroutable)
            ),
            "failure {failure}: {err:?}"
        );
        assert!(
            matches!(
                err.into_settled(),
                Settled::Retrying {
                    cause: Cause::Body(_),
                    ..
                }
            ),
            "failure {failure}"
        );
    }
    let last = fixture.next(&mut deliveries).await;
    assert!(last.redelivered);
    let settled = consumer.process(last, failing(&runs)).await.unwrap();
    assert!(
        matches!(settled, Settled::DeadLettered(Cause::Body(_))),
        "{settled:?}"
    );
    // Each redelivery waited out the delay instead of coming straight back.
    let runs = runs.lock().unwrap().clone();
    assert_eq!(runs.len(), 3);
    for pair in runs.windows(2) {
        let gap = pair[1] - pair[0];
        assert!(gap >= delay, "runs {gap:?} apart, delay {delay:?}");
    }
    let mut dead = fixture.consume(fixture.topology.dead_letter_queue()).await;
    let message = fixture.next(&mut dead).await;
    assert_eq!(
        message.properties.message_id().as_ref().unwrap().as_str(),
        "order-7"
    );
    assert_eq!(fixture.depth(fixture.topology.queue()).await, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_retry_queue_whose_channel_closed_says_so() {
    let fixture = Fixture::new("closed-retry").await;
    let retry_channel = fixture.connection.create_channel().await.unwrap();
    let retries = fixture.topology.declare(&retry_channel).await.unwrap();
    retry_channel
        .close(200, "closed by the test".into())
        .await
        .unwrap();
    let consumer = Idempotent::new(Task::new("lapin_closed_retry"), MessageId, retries)
        .store(MemoryStore::new())
        .failure_backoff(Backoff::constant(Duration::from_millis(20)));
    fixture.publish(Some("order-8"), b"8").await;
    let mut deliveries = fixture.consume(fixture.topology.queue()).await;
    let err = consumer
        .process(fixture.next(&mut deliveries).await, |_: &Delivery| {
            std::future::ready(Err::<String, _>("declined".to_owned()))
        })
        .await
        .unwrap_err();
    assert!(
        matches!(
            err.failure(),
            SettleFailure::Retry(idempotask_lapin::PublishError::ChannelClosed)
        ),
        "{err:?}"
    );
    // Requeued, not lost.
    let again = fixture.next(&mut deliveries).await;
    assert_eq!(
        again.properties.message_id().as_ref().unwrap().as_str(),
        "order-8"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn misuse_is_retried_later_not_dead_lettered() {
    let fixture = Fixture::new("misuse").await;
    let store = MemoryStore::new();
    let task = Task::new("lapin_misuse");
    let consumer = Idempotent::new(task.clone(), MessageId, fixture.retries.clone())
        .store(store.clone())
        .store_backoff(Backoff::constant(Duration::from_millis(50)))
        // Misuse waits as store errors do, not as body failures.
        .failure_backoff(Backoff::constant(Duration::from_secs(5)));
    fixture.publish(Some("order-9"), b"9").await;
    let mut deliveries = fixture.consume(fixture.topology.queue()).await;
    let delivery = fixture.next(&mut deliveries).await;
    let runs = Arc::new(AtomicU32::new(0));

    // The consumer called from the body of the very unit it names: `Reentered`, a bug of the
    // consumer's code, not of the message.
    let mut inner = None;
    task.call("order-9")
        .store(store.clone())
        .run(async {
            inner = Some(consumer.process(delivery, charging(&runs)).await.unwrap());
            Ok::<_, Error>(())
        })
        .await
        .unwrap();
    let inner = inner.unwrap();
    assert!(
        matches!(
            inner,
            Settled::Retrying {
                cause: Cause::Idempotask(Error::Reentered { .. }),
                delay,
                ..
            } if delay == Duration::from_millis(50)
        ),
        "{inner:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    // It comes back through the retry queue, counted as the store errors are; it was not
    // dead-lettered.
    let back = fixture.next(&mut deliveries).await;
    assert_eq!(
        header(&back, STORE_ERRORS_HEADER),
        Some(AMQPValue::LongLongInt(1))
    );
    assert_eq!(fixture.depth(fixture.topology.dead_letter_queue()).await, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_delivery_that_cannot_be_acked_is_an_error_that_keeps_the_outcome() {
    let fixture = Fixture::new("unackable").await;
    let consumer = Idempotent::new(
        Task::new("lapin_unackable"),
        MessageId,
        fixture.retries.clone(),
    )
    .store(MemoryStore::new());
    fixture.publish(Some("order-10"), b"10").await;
    let mut deliveries = fixture.consume(fixture.topology.queue()).await;
    let delivery = fixture.next(&mut deliveries).await;
    // The body acks the delivery itself, so the settle's own ack is not sent.
    let err = consumer
        .process(delivery, |delivery: &Delivery| {
            let acker = delivery.acker.clone();
            async move {
                acker.ack(BasicAckOptions::default()).await.unwrap();
                Ok::<_, String>("ch_10".to_owned())
            }
        })
        .await
        .unwrap_err();
    assert!(matches!(err.failure(), SettleFailure::NotSent), "{err:?}");
    assert_eq!(
        acked(err.into_settled()),
        ("ch_10".to_owned(), Outcome::Executed)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_body_that_outlasts_its_lock_is_acked_not_run_again() {
    let fixture = Fixture::new("lock-lost").await;
    let lock_ttl = Duration::from_millis(200);
    // No doubt memory: the lock is gone once it runs out, so `finish` finds it lost (with one,
    // a lock nobody took over is still the body's, and its result is stored as `Executed`).
    let consumer = Idempotent::new(
        // Forgotten when it runs out: a remembered lock nobody took over would still be this
        // delivery's, and its result recorded as `Executed`.
        Task::new("lapin_lock_lost")
            .lock_ttl(lock_ttl)
            .doubt_memory(Duration::ZERO),
        MessageId,
        fixture.retries.clone(),
    )
    .store(MemoryStore::new());
    fixture.publish(Some("order-11"), b"11").await;
    let mut deliveries = fixture.consume(fixture.topology.queue()).await;
    let runs = Arc::new(AtomicU32::new(0));
    let slow = {
        let runs = Arc::clone(&runs);
        move |_: &Delivery| async move {
            runs.fetch_add(1, Ordering::SeqCst);
            // The side effect takes longer than the lock, which is not renewed.
            tokio::time::sleep(lock_ttl * 3).await;
            Ok::<_, String>("ch_11".to_owned())
        }
    };
    let settled = consumer
        .process(fixture.next(&mut deliveries).await, slow)
        .await
        .unwrap();
    let (value, outcome) = acked(settled);
    assert_eq!(value, "ch_11");
    assert!(matches!(outcome, Outcome::LockLost { .. }), "{outcome:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    drop(deliveries);
    assert_eq!(fixture.depth(fixture.topology.queue()).await, 0);
    assert_eq!(fixture.depth(fixture.topology.retry_queue()).await, 0);
    assert_eq!(fixture.depth(fixture.topology.dead_letter_queue()).await, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_result_the_store_cannot_record_is_acked_not_run_again() {
    let fixture = Fixture::new("marker-lost").await;
    let redis = RedisServer::start();
    let consumer = Idempotent::new(
        // A short lock: the recording is retried until the lock would expire.
        Task::new("lapin_marker_lost").lock_ttl(Duration::from_secs(1)),
        MessageId,
        fixture.retries.clone(),
    )
    .store(redis.store().await);
    fixture.publish(Some("order-12"), b"12").await;
    let mut deliveries = fixture.consume(fixture.topology.queue()).await;
    let runs = Arc::new(AtomicU32::new(0));
    let pid = redis.pid().to_string();
    let signal = |signal: &str| {
        assert!(
            std::process::Command::new("kill")
                .args([signal, &pid])
                .status()
                .unwrap()
                .success()
        );
    };
    let charge_then_store_stalls = {
        let runs = Arc::clone(&runs);
        move |_: &Delivery| {
            runs.fetch_add(1, Ordering::SeqCst);
            // The side effect is done; then the store stops answering, as a stalled server
            // does, before the result is recorded.
            signal("-STOP");
            std::future::ready(Ok::<_, String>("ch_12".to_owned()))
        }
    };
    let settled = consumer
        .process(
            fixture.next(&mut deliveries).await,
            charge_then_store_stalls,
        )
        .await;
    signal("-CONT");
    let (value, outcome) = acked(settled.unwrap());
    assert_eq!(
        (value.as_str(), outcome),
        ("ch_12", Outcome::MarkerNotWritten)
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    drop(deliveries);
    assert_eq!(fixture.depth(fixture.topology.queue()).await, 0);
    assert_eq!(fixture.depth(fixture.topology.retry_queue()).await, 0);
}

// A panicking body left its delivery unsettled: under `basic_qos(1)`, with a task per delivery
// as the crate docs recommend, nothing reached the retry or dead-letter queue and the delivery
// behind it never ran; in a sequential consumer the panic ended the consumer, its channel
// closed and the broker requeued the delivery at once, in a crash loop.
#[tokio::test(flavor = "multi_thread")]
async fn a_panicking_body_is_retried_then_dead_lettered_and_the_deliveries_behind_it_run() {
    let fixture = Fixture::new("panics").await;
    fixture
        .channel
        .basic_qos(1, BasicQosOptions::default())
        .await
        .unwrap();
    let consumer = Idempotent::new(
        Task::new("lapin_panics"),
        MessageId,
        fixture.retries.clone(),
    )
    .store(MemoryStore::new())
    .failure_backoff(Backoff::new(
        Duration::from_millis(50),
        Duration::from_millis(200),
    ))
    .max_failures(2);
    fixture.publish(Some("bad-1"), b"bad").await;
    fixture.publish(Some("good-1"), b"good").await;
    let mut deliveries = fixture.consume(fixture.topology.queue()).await;
    let runs = Arc::new(AtomicU32::new(0));

    let mut settled = Vec::new();
    while settled.len() < 3 {
        let delivery = fixture.next(&mut deliveries).await;
        let id = delivery
            .properties
            .message_id()
            .as_ref()
            .unwrap()
            .to_string();
        let (consumer, runs) = (consumer.clone(), Arc::clone(&runs));
        let outcome = tokio::spawn(async move {
            consumer
                .process(delivery, move |delivery: &Delivery| {
                    let poisoned = delivery.data == b"bad";
                    async move {
                        runs.fetch_add(1, Ordering::SeqCst);
                        assert!(!poisoned, "poison order");
                        Ok::<_, String>("done".to_owned())
                    }
                })
                .await
        })
        .await
        .expect("the delivery's task outlives the panic")
        .unwrap();
        settled.push((id, outcome));
    }
    match &settled[..] {
        [
            (
                bad,
                Settled::Retrying {
                    cause: Cause::Panicked(panic),
                    ..
                },
            ),
            (good, Settled::Acked(report)),
            (bad_again, Settled::DeadLettered(Cause::Panicked(_))),
        ] => {
            assert_eq!(
                (bad.as_str(), good.as_str(), bad_again.as_str()),
                ("bad-1", "good-1", "bad-1")
            );
            assert_eq!(panic.message(), "poison order");
            assert_eq!(report.outcome, Outcome::Executed);
        }
        other => panic!("{other:#?}"),
    }
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    let mut dead = fixture.consume(fixture.topology.dead_letter_queue()).await;
    let message = fixture.next(&mut dead).await;
    assert_eq!(
        message.properties.message_id().as_ref().unwrap().as_str(),
        "bad-1"
    );
    assert_eq!(
        header(&message, FAILURES_HEADER),
        Some(AMQPValue::LongLongInt(1))
    );
}
