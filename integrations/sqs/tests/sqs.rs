//! The SQS consumer against a real SQS API (`moto_server`, started by the test): every row of
//! the crate docs' outcome table as the queue saw it, the batch's deletes and visibility
//! changes, FIFO group order, the checks at the start, and a settling SQS refused.

mod moto_queues;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use idempotask::{MemoryStore, Outcome, RetryPolicy, Task};
use idempotask_sqs::{
    Attribute, BadMessage, Handled, Idempotent, Message, MessageId, Processed, Rejection,
    SqsConsumer, SqsError,
};
use idempotask_test_support::faulty_store::FaultyStore;
use moto_queues::{Queue, Shape};

type Batch = Vec<Processed<u32, String>>;
type Body = std::pin::Pin<Box<dyn Future<Output = Result<u32, String>> + Send>>;

fn task(name: &'static str) -> Task {
    Task::new(name)
        .retry(RetryPolicy::no_wait())
        .lock_ttl(Duration::from_secs(2))
}

async fn consumer(queue: &Queue, idempotent: Idempotent<Attribute>) -> SqsConsumer<Attribute> {
    idempotent
        .wait_time(Duration::from_secs(1))
        .consume(queue.client.clone(), &queue.url)
        .await
        .unwrap()
}

/// A body that counts its runs and answers the message's body as a number.
/// It counts only when polled: a duplicate's body is made but never polled.
fn counting(runs: &Arc<AtomicU32>) -> impl FnMut(&Message) -> Result<Body, BadMessage> {
    let runs = Arc::clone(runs);
    move |message| {
        let value: u32 = message.json()?;
        let runs = Arc::clone(&runs);
        Ok(Box::pin(async move {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok(value)
        }))
    }
}

/// The next batch that is not empty (messages handed back come after their delay).
async fn next<K: idempotask_sqs::MessageKey, F, Fut>(
    consumer: &mut SqsConsumer<K>,
    mut body: F,
) -> Batch
where
    F: FnMut(&Message) -> Result<Fut, idempotask_sqs::BadMessage>,
    Fut: Future<Output = Result<u32, String>>,
{
    for _ in 0..20 {
        let batch = consumer.next_batch(&mut body).await.unwrap();
        if !batch.is_empty() {
            return batch;
        }
    }
    panic!("no message came back within 20 receives");
}

#[tokio::test]
async fn a_finished_message_is_deleted_and_its_duplicate_replays_without_running() {
    let queue = Queue::create("success", Shape::default()).await;
    queue.send("7", Some("order-1"), None).await;
    queue.send("7", Some("order-1"), None).await;
    let runs = Arc::new(AtomicU32::new(0));
    let mut consumer = consumer(
        &queue,
        Idempotent::new(task("success"), Attribute::new("order_id")).store(MemoryStore::new()),
    )
    .await;
    let mut outcomes = Vec::new();
    while outcomes.len() < 2 {
        for processed in next(&mut consumer, counting(&runs)).await {
            processed.settled.unwrap();
            let Handled::Deleted(report) = processed.handled else {
                panic!("not deleted: {:?}", processed.handled);
            };
            outcomes.push((report.value, report.outcome));
        }
    }
    outcomes.sort_by_key(|(_, outcome)| *outcome != Outcome::Executed);
    assert_eq!(outcomes, [(7, Outcome::Executed), (7, Outcome::Replayed)]);
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the duplicate ran its body");
    assert_eq!(
        queue.holds(&queue.url).await,
        0,
        "a finished message was left in the queue"
    );
}

#[tokio::test]
async fn a_failed_body_comes_back_after_its_backoff_and_a_panic_counts_as_a_failure() {
    let queue = Queue::create("retry", Shape::default()).await;
    queue.send("3", Some("order-2"), None).await;
    let tries = Arc::new(AtomicU32::new(0));
    let mut consumer = consumer(
        &queue,
        Idempotent::new(task("retry"), Attribute::new("order_id"))
            .store(MemoryStore::new())
            .max_failures(5),
    )
    .await;
    let body = |tries: Arc<AtomicU32>| {
        move |message: &Message| {
            let value: u32 = message.json()?;
            let tries = Arc::clone(&tries);
            Ok(async move {
                match tries.fetch_add(1, Ordering::SeqCst) {
                    0 => Err("the gateway is down".to_owned()),
                    1 => panic!("the body panicked"),
                    _ => Ok(value),
                }
            })
        }
    };
    let first = next(&mut consumer, body(Arc::clone(&tries))).await;
    let Handled::Failed {
        failures: 1, delay, ..
    } = &first[0].handled
    else {
        panic!("not a failure: {:?}", first[0].handled);
    };
    assert_eq!(
        *delay,
        Duration::from_secs(1),
        "the 100 ms backoff rounds up to SQS's second"
    );
    first[0].settled.as_ref().unwrap();
    let second = next(&mut consumer, body(Arc::clone(&tries))).await;
    assert!(
        matches!(
            &second[0].handled,
            Handled::Failed {
                failures: 2,
                error: idempotask_sqs::BodyFailure::Panicked(_),
                ..
            }
        ),
        "a panic is a failure of the body: {:?}",
        second[0].handled
    );
    assert_eq!(second[0].receive_count, 2);
    let third = next(&mut consumer, body(Arc::clone(&tries))).await;
    assert!(
        matches!(third[0].handled, Handled::Deleted(_)),
        "{:?}",
        third[0].handled
    );
    assert_eq!(queue.holds(&queue.url).await, 0);
}

#[tokio::test]
async fn a_message_given_up_is_left_to_the_redrive_policy_not_deleted() {
    let queue = Queue::create(
        "give-up",
        Shape {
            max_receive_count: Some(2),
            ..Shape::default()
        },
    )
    .await;
    queue.send("1", Some("order-3"), None).await;
    let runs = Arc::new(AtomicU32::new(0));
    let mut consumer = consumer(
        &queue,
        Idempotent::new(task("give-up"), Attribute::new("order_id"))
            .store(MemoryStore::new())
            .max_failures(2),
    )
    .await;
    let failing = |runs: Arc<AtomicU32>| {
        move |_: &Message| {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok(async { Err::<u32, _>("declined".to_owned()) })
        }
    };
    let first = next(&mut consumer, failing(Arc::clone(&runs))).await;
    assert!(matches!(
        first[0].handled,
        Handled::Failed { failures: 1, .. }
    ));
    let second = next(&mut consumer, failing(Arc::clone(&runs))).await;
    let Handled::Rejected(why) = &second[0].handled else {
        panic!("not given up: {:?}", second[0].handled);
    };
    assert!(
        matches!(why, Rejection::GaveUp { failures: 2, .. }),
        "{why}"
    );
    assert_eq!(why.reason(), "gave-up");
    // The receive after the give-up is past maxReceiveCount: SQS moves it, nothing runs.
    let after = consumer
        .next_batch(failing(Arc::clone(&runs)))
        .await
        .unwrap();
    assert!(
        after.is_empty(),
        "the given-up message came back: {after:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    assert_eq!(queue.holds(&queue.url).await, 0);
    assert_eq!(
        queue.holds(&queue.dead_url).await,
        1,
        "the message is not in the dead-letter queue"
    );
}

#[tokio::test]
async fn a_store_that_is_down_never_deletes_and_the_message_runs_once_it_is_back() {
    let queue = Queue::create(
        "store-down",
        Shape {
            max_receive_count: Some(10),
            ..Shape::default()
        },
    )
    .await;
    queue.send("4", Some("order-4"), None).await;
    let store = FaultyStore::new(MemoryStore::new());
    store.down(true);
    let runs = Arc::new(AtomicU32::new(0));
    let mut consumer = consumer(
        &queue,
        Idempotent::new(task("store-down"), Attribute::new("order_id")).store(store.clone()),
    )
    .await;
    for _ in 0..2 {
        let batch = next(&mut consumer, counting(&runs)).await;
        assert!(
            matches!(&batch[0].handled, Handled::Deferred { error: idempotask::Error::Store(_), delay, .. } if *delay == Duration::from_secs(1)),
            "{:?}",
            batch[0].handled
        );
        assert_eq!(
            queue.holds(&queue.url).await,
            1,
            "a message was deleted while the store was down"
        );
    }
    store.down(false);
    let batch = next(&mut consumer, counting(&runs)).await;
    assert!(
        matches!(batch[0].handled, Handled::Deleted(_)),
        "{:?}",
        batch[0].handled
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_busy_key_is_handed_back_for_the_holders_remaining_lock_time() {
    let queue = Queue::create(
        "busy",
        Shape {
            visibility: 4,
            ..Shape::default()
        },
    )
    .await;
    queue.send("5", Some("order-5"), None).await;
    queue.send("5", Some("order-5"), None).await;
    let runs = Arc::new(AtomicU32::new(0));
    let task = task("busy").lock_ttl(Duration::from_secs(4));
    let mut consumer = consumer(
        &queue,
        Idempotent::new(task, Attribute::new("order_id")).store(MemoryStore::new()),
    )
    .await;
    let slow = |runs: Arc<AtomicU32>| {
        move |message: &Message| {
            let value: u32 = message.json()?;
            let runs = Arc::clone(&runs);
            Ok(async move {
                runs.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(300)).await;
                Ok(value)
            })
        }
    };
    let mut handled = Vec::new();
    while handled.len() < 2 {
        handled.extend(
            next(&mut consumer, slow(Arc::clone(&runs)))
                .await
                .into_iter()
                .map(|p| p.handled),
        );
    }
    let deferred = handled.iter().find_map(|handled| match handled {
        Handled::Deferred {
            error: idempotask::Error::Contended { .. },
            delay,
            ..
        } => Some(*delay),
        _ => None,
    });
    // One receive brings both copies (moto hands out up to 10): one runs, the other waits.
    let delay = deferred.expect("neither copy was deferred for the other's lock");
    assert!(
        delay <= Duration::from_secs(4) && delay >= Duration::from_secs(1),
        "{delay:?}"
    );
    let last = next(&mut consumer, slow(Arc::clone(&runs))).await;
    assert!(
        matches!(&last[0].handled, Handled::Deleted(report) if report.outcome == Outcome::Replayed)
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "both copies ran");
    assert_eq!(queue.holds(&queue.url).await, 0);
}

#[tokio::test]
async fn a_message_without_its_key_or_with_a_bad_body_is_rejected_never_deleted() {
    let queue = Queue::create(
        "bad-input",
        Shape {
            max_receive_count: Some(2),
            ..Shape::default()
        },
    )
    .await;
    let no_key = queue.send("6", None, None).await;
    let bad_body = queue.send("not a number", Some("order-6"), None).await;
    let runs = Arc::new(AtomicU32::new(0));
    let mut consumer = consumer(
        &queue,
        Idempotent::new(task("bad-input"), Attribute::new("order_id")).store(MemoryStore::new()),
    )
    .await;
    let mut reasons = Vec::new();
    while reasons.len() < 2 {
        for processed in next(&mut consumer, counting(&runs)).await {
            let Handled::Rejected(why) = &processed.handled else {
                panic!("not rejected: {:?}", processed.handled);
            };
            if processed.id == no_key {
                assert_eq!(
                    why.to_string(),
                    format!(
                        "message {no_key} has no idempotency key (it has no `order_id` string or number attribute); add it to the message, or key the task by what the message carries"
                    )
                );
            } else {
                assert_eq!(processed.id, bad_body);
                assert!(
                    why.to_string().starts_with(&format!(
                        "message {bad_body} cannot be handled: its body is not the expected JSON"
                    )),
                    "{why}"
                );
            }
            reasons.push(why.reason());
        }
    }
    reasons.sort_unstable();
    assert_eq!(reasons, ["bad-message", "missing-key"]);
    assert_eq!(runs.load(Ordering::SeqCst), 0, "a rejected message ran");
    assert_eq!(
        queue.holds(&queue.url).await,
        2,
        "a rejected message was deleted"
    );
    // Their receives go on until the redrive policy moves them.
    while queue.holds(&queue.dead_url).await < 2 {
        let _ = consumer.next_batch(counting(&runs)).await.unwrap();
    }
    assert_eq!(queue.holds(&queue.url).await, 0);
}

#[tokio::test]
async fn a_fifo_failure_stops_its_group_not_the_batch() {
    let queue = Queue::create(
        "fifo",
        Shape {
            fifo: true,
            max_receive_count: Some(5),
            ..Shape::default()
        },
    )
    .await;
    for (body, order, group) in [
        ("1", "a1", "a"),
        ("2", "b1", "b"),
        ("3", "a2", "a"),
        ("4", "b2", "b"),
    ] {
        queue.send(body, Some(order), Some(group)).await;
    }
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let failed_once = Arc::new(AtomicU32::new(0));
    let mut consumer = consumer(
        &queue,
        Idempotent::new(task("fifo"), Attribute::new("order_id")).store(MemoryStore::new()),
    )
    .await;
    assert!(consumer.is_fifo());
    let body = |order: Arc<std::sync::Mutex<Vec<String>>>, failed_once: Arc<AtomicU32>| {
        move |message: &Message| {
            let id = message.attribute("order_id").unwrap().to_owned();
            let order = Arc::clone(&order);
            let failed_once = Arc::clone(&failed_once);
            Ok(async move {
                order.lock().unwrap().push(id.clone());
                if id == "a1" && failed_once.fetch_add(1, Ordering::SeqCst) == 0 {
                    return Err("a1 fails once".to_owned());
                }
                Ok(1)
            })
        }
    };
    let mut deleted = Vec::new();
    let mut behind = 0;
    while deleted.len() < 4 {
        for processed in next(
            &mut consumer,
            body(Arc::clone(&order), Arc::clone(&failed_once)),
        )
        .await
        {
            match processed.handled {
                Handled::Deleted(_) => deleted.push(processed.id),
                Handled::Behind { .. } => behind += 1,
                Handled::Failed { .. } => {}
                other => panic!("{other:?}"),
            }
        }
    }
    let ran = order.lock().unwrap().clone();
    let position = |id: &str| ran.iter().rposition(|ran| ran == id).unwrap();
    assert!(
        position("a1") < position("a2"),
        "group a out of order: {ran:?}"
    );
    assert!(
        position("b1") < position("b2"),
        "group b out of order: {ran:?}"
    );
    assert_eq!(
        ran.iter().filter(|id| *id == "a2").count(),
        1,
        "a2 ran before a1 finished: {ran:?}"
    );
    assert!(
        ran.iter().filter(|id| id.starts_with('b')).count() == 2,
        "group b was stopped: {ran:?}"
    );
    assert!(behind >= 1, "a2 never waited behind a1: {ran:?}");
    assert_eq!(queue.holds(&queue.url).await, 0);
}

#[tokio::test]
async fn a_queue_whose_clocks_or_redrive_do_not_fit_is_refused_at_the_start() {
    let short = Queue::create(
        "short",
        Shape {
            visibility: 1,
            ..Shape::default()
        },
    )
    .await;
    let err = Idempotent::new(task("short"), MessageId)
        .consume(short.client.clone(), &short.url)
        .await
        .err()
        .unwrap();
    assert!(
        matches!(err, SqsError::VisibilityBelowLockTtl { .. }),
        "{err}"
    );
    assert!(
        err.to_string().starts_with(
            "the queue's visibility timeout (1s) is shorter than the task's lock TTL (2s)"
        ),
        "{err}"
    );
    let no_dead = Queue::create(
        "no-redrive",
        Shape {
            max_receive_count: None,
            ..Shape::default()
        },
    )
    .await;
    let err = Idempotent::new(task("no-redrive"), MessageId)
        .consume(no_dead.client.clone(), &no_dead.url)
        .await
        .err()
        .unwrap();
    assert!(matches!(err, SqsError::NoRedrivePolicy), "{err}");
    let missing = format!("{}-missing", short.url);
    let err = Idempotent::new(task("missing"), MessageId)
        .consume(short.client.clone(), missing)
        .await
        .err()
        .unwrap();
    assert!(
        matches!(
            err,
            SqsError::Sqs {
                action: "GetQueueAttributes",
                ..
            }
        ),
        "{err}"
    );
}

#[tokio::test]
async fn a_body_longer_than_the_visibility_timeout_keeps_its_message() {
    let queue = Queue::create("extend", Shape::default()).await;
    queue.send("8", Some("order-8"), None).await;
    let runs = Arc::new(AtomicU32::new(0));
    let mut first = consumer(
        &queue,
        Idempotent::new(task("extend"), Attribute::new("order_id")).store(MemoryStore::new()),
    )
    .await;
    let mut second = consumer(
        &queue,
        Idempotent::new(task("extend-other"), Attribute::new("order_id")).store(MemoryStore::new()),
    )
    .await;
    let (started_tx, started_rx) = tokio::sync::oneshot::channel::<()>();
    let mut started_tx = Some(started_tx);
    let slow = {
        let runs = Arc::clone(&runs);
        move |message: &Message| {
            let value: u32 = message.json()?;
            let runs = Arc::clone(&runs);
            let started = started_tx.take();
            Ok(async move {
                runs.fetch_add(1, Ordering::SeqCst);
                if let Some(started) = started {
                    let _ = started.send(());
                }
                // Twice the 2 s visibility timeout.
                tokio::time::sleep(Duration::from_secs(4)).await;
                Ok::<_, String>(value)
            })
        }
    };
    let (batch, seen) = tokio::join!(first.next_batch(slow), async {
        started_rx.await.unwrap();
        // Another consumer (of another task, which would run it again) asks for 4 s.
        let mut seen = Vec::new();
        for _ in 0..4 {
            seen.extend(second.next_batch(counting(&runs)).await.unwrap());
        }
        seen
    });
    assert!(
        seen.is_empty(),
        "the running message was handed to another consumer: {seen:?}"
    );
    let batch = batch.unwrap();
    assert!(
        matches!(batch[0].handled, Handled::Deleted(_)),
        "{:?}",
        batch[0].handled
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_delete_sqs_refuses_is_reported_on_its_message_and_the_result_replays() {
    let queue = Queue::create("refused-delete", Shape::default()).await;
    queue.send("9", Some("order-9"), None).await;
    let runs = Arc::new(AtomicU32::new(0));
    let mut consumer = consumer(
        &queue,
        Idempotent::new(task("refused-delete"), Attribute::new("order_id"))
            .store(MemoryStore::new()),
    )
    .await;
    let purging = {
        let client = queue.client.clone();
        let url = queue.url.clone();
        let runs = Arc::clone(&runs);
        move |message: &Message| {
            let value: u32 = message.json()?;
            let (client, url, runs) = (client.clone(), url.clone(), Arc::clone(&runs));
            Ok(async move {
                runs.fetch_add(1, Ordering::SeqCst);
                // The message goes from under the consumer: its receipt handle is no longer valid.
                client.purge_queue().queue_url(url).send().await.unwrap();
                Ok(value)
            })
        }
    };
    let batch = next(&mut consumer, purging).await;
    assert!(matches!(batch[0].handled, Handled::Deleted(_)));
    let failure = batch[0].settled.as_ref().unwrap_err();
    assert_eq!(
        (failure.action(), failure.code()),
        ("DeleteMessageBatch", "ReceiptHandleIsInvalid"),
        "{failure}"
    );
    // The same job sent again replays its stored result.
    queue.send("9", Some("order-9"), None).await;
    let again = next(&mut consumer, counting(&runs)).await;
    assert!(
        matches!(&again[0].handled, Handled::Deleted(report) if report.outcome == Outcome::Replayed)
    );
    again[0].settled.as_ref().unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_receive_that_stored_its_result_and_died_before_its_delete_is_replayed() {
    let queue = Queue::create("kill", Shape::default()).await;
    queue.send("10", Some("order-10"), None).await;
    let store = MemoryStore::new();
    let task = task("kill");
    // A consumer that received the message, ran it and was killed before its delete.
    let received = queue
        .client
        .receive_message()
        .queue_url(&queue.url)
        .send()
        .await
        .unwrap();
    assert_eq!(received.messages().len(), 1);
    let effects = Arc::new(AtomicU32::new(0));
    let effect = Arc::clone(&effects);
    let _: u32 = task
        .call("order-10")
        .store(store.clone())
        .run(async move {
            effect.fetch_add(1, Ordering::SeqCst);
            Ok::<_, idempotask::Error>(10)
        })
        .await
        .unwrap();
    let mut consumer = consumer(
        &queue,
        Idempotent::new(task, Attribute::new("order_id")).store(store),
    )
    .await;
    let batch = next(&mut consumer, counting(&effects)).await;
    assert!(
        matches!(&batch[0].handled, Handled::Deleted(report) if report.outcome == Outcome::Replayed && report.value == 10)
    );
    assert_eq!(batch[0].receive_count, 2);
    assert_eq!(effects.load(Ordering::SeqCst), 1, "the effect ran twice");
    assert_eq!(queue.holds(&queue.url).await, 0);
}
