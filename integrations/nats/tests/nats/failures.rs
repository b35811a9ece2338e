//! A body that fails or panics: nak'd with a growing delay, terminated after `max_failures`,
//! counted in the failure bucket even when the bucket fails, deferrals not counted; a store that is
//! down fails closed.

#[allow(clippy::wildcard_imports)]
use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn a_body_error_is_nakd_delivered_again_and_not_cached() {
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
pub(super) async fn a_failing_body_backs_off_more_each_time_and_is_terminated_after_max_failures() {
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
pub(super) async fn a_misused_task_defers_the_message_instead_of_terminating_it() {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn a_store_that_is_down_fails_closed_with_a_growing_delay_until_it_is_back() {
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

/// A body that panics, as a poison message makes it do.
/// It panics on a later poll than its first, as a body does after its first await.
pub(super) async fn poisoned(runs: Arc<AtomicU32>) -> Result<(), String> {
    runs.fetch_add(1, Ordering::SeqCst);
    tokio::task::yield_now().await;
    panic!("poison order")
}

// A panicking body was delivered again for ever (9 deliveries in 9 s, never `+TERM`): the panic
// unwound past the code that counts failures and settles the message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn a_panicking_body_is_a_failure_nakd_then_terminated_after_max_failures() {
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
pub(super) async fn deferred_deliveries_do_not_use_up_max_failures() {
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

/// Declares the stream of key-value bucket `bucket` as the integration does, but holding at
/// most one byte, so that every write to it is refused while reads work.
pub(super) async fn full_bucket(queue: &Queue, bucket: &str) {
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
pub(super) async fn poison_until_terminated(
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
pub(super) async fn a_failure_bucket_that_refuses_writes_still_ends_a_poison_message() {
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
pub(super) async fn a_failure_bucket_that_cannot_be_opened_still_ends_a_poison_message() {
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
