//! A message runs its body once per key: duplicates and contended messages replay, a message
//! without a usable key, with a reused key, an undecodable stored result, a unit in doubt or no
//! store is terminated or deferred and nothing runs.

#[allow(clippy::wildcard_imports)]
use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn a_duplicate_message_replays_and_the_body_runs_once() {
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
pub(super) async fn a_contended_message_comes_back_after_the_holders_lock_time_and_replays() {
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
pub(super) async fn a_message_without_a_usable_key_is_terminated_to_the_dead_letter_advisory() {
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
pub(super) async fn a_stored_result_that_no_longer_decodes_is_terminated_not_run_again() {
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
pub(super) fn server_reports_term_reasons(client: &async_nats::Client) -> bool {
    let version = client.server_info().version;
    let numbers: Vec<u64> = version
        .split(['-', '.'])
        .take(3)
        .map(|part| part.parse().unwrap())
        .collect();
    numbers.as_slice() >= [2, 10, 4].as_slice()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn a_unit_in_doubt_is_terminated_with_its_reason_and_nothing_runs() {
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
pub(super) async fn an_empty_msg_id_is_no_key_and_nothing_runs() {
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
pub(super) async fn a_key_reused_with_another_payload_is_terminated_and_runs_nothing() {
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
pub(super) async fn no_store_installed_defers_the_message_and_runs_nothing() {
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
