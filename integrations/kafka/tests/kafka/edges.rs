//! The edges of the consumer on the broker: a header rdkafka cannot read, a close while the
//! store is down, and a body that outlives `max.poll.interval.ms`.

use std::sync::atomic::AtomicBool;

use super::*;

/// A header whose name is not UTF-8 (which rdkafka panics on when it reads it) makes its
/// record a bad record: dead-lettered with its readable headers, nothing run, and the
/// partition moves on. rdkafka cannot write such a name, so the record is produced by hand.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_name_that_is_not_utf8_dead_letters_its_record() {
    let s = setup(1).await;
    let mut consumer = s.subscribe().await;
    let bootstrap = s.broker.bootstrap_servers();
    let offset = tokio::task::spawn_blocking(move || {
        let headers: [(&[u8], &[u8]); 2] = [(b"order_id", b"raw"), (b"\xff\xfename", b"x")];
        raw::produce(&bootstrap, "orders", 0, &headers, b"{}")
    })
    .await
    .unwrap();
    assert_eq!(offset, 0);
    s.produce(0, Some("after"), "{}").await;
    let ended = ended(&mut consumer, 2).await;
    let Handled::DeadLettered(Rejection::BadRecord(bad)) = &ended[0].handled else {
        panic!("{:?}", ended[0])
    };
    assert_eq!(
        bad.to_string(),
        "record orders/0@0 cannot be used: the name of its header at position 1 is not UTF-8"
    );
    assert_eq!(done(&ended[1]).1, Outcome::Executed);
    assert_eq!(
        s.effects.load(Ordering::SeqCst),
        1,
        "the bad record never ran"
    );
    consumer.close().await.unwrap();
    assert_eq!(s.committed(&[0]), [Some(2)]);
    let dead = s.dead(1).await;
    assert_eq!(header(&dead[0], REASON_HEADER), "bad-record");
    assert_eq!(header(&dead[0], "order_id"), "raw", "the readable headers");
}

/// A close while the store is down and a record waits for it returns after `revoke_wait`
/// instead of waiting for the store: the waiting record is stopped, and the commit goes past
/// the records that ended, not past it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_close_while_the_store_is_down_stops_the_waiting_record_and_commits_before_it() {
    let s = setup(1).await;
    let mut consumer = s
        .idempotent()
        .revoke_wait(Duration::from_millis(300))
        .subscribe(&client_config(&s.broker), &["orders"], s.charge())
        .await
        .unwrap();
    s.produce(0, Some("1"), "{}").await;
    assert_eq!(done(&ended(&mut consumer, 1).await[0]).1, Outcome::Executed);
    s.store.down(true);
    s.produce(0, Some("2"), "{}").await;
    let deferred = tokio::time::timeout(WAIT, consumer.next())
        .await
        .expect("the record was tried")
        .unwrap();
    assert!(
        matches!(deferred.handled, Handled::Deferred { .. }),
        "{deferred:?}"
    );
    tokio::time::timeout(WAIT, consumer.close())
        .await
        .expect("the close waited for the store")
        .unwrap();
    assert_eq!(
        s.committed(&[0]),
        [Some(1)],
        "committed past the waiting record"
    );
    assert_eq!(s.effects.load(Ordering::SeqCst), 1);
}

/// A body that runs longer than `max.poll.interval.ms` ends and its offset is committed: the
/// consumer kept polling (the record behind it filled the queue, and its partition was paused
/// after half the interval), so librdkafka did not leave the group, no revoke stopped the
/// body and the record was not delivered again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_longer_than_max_poll_interval_ends_without_leaving_the_group() {
    const MAX_POLL: Duration = Duration::from_secs(6);
    let s = setup(1).await;
    let starts = Arc::new(AtomicU32::new(0));
    let stopped = Arc::new(AtomicBool::new(false));
    let (started_tx, mut started) = tokio::sync::mpsc::unbounded_channel();
    let effects = Arc::clone(&s.effects);
    let (body_starts, body_stopped) = (Arc::clone(&starts), Arc::clone(&stopped));
    let body = move |record: &Record| {
        let long = record.offset() == 0;
        if long {
            body_starts.fetch_add(1, Ordering::SeqCst);
        }
        let guard = long.then(|| Dropped(Arc::clone(&body_stopped)));
        let started_tx = started_tx.clone();
        let effects = Arc::clone(&effects);
        Ok(Box::pin(async move {
            if let Some(guard) = guard {
                started_tx.send(()).unwrap();
                tokio::time::sleep(MAX_POLL + Duration::from_secs(2)).await;
                std::mem::forget(guard);
            }
            let n = effects.fetch_add(1, Ordering::SeqCst) + 1;
            Ok(format!("ch_{n}"))
        }) as Charge)
    };
    let mut config = client_config(&s.broker);
    // The least librdkafka takes: its session timeout here.
    config.set("max.poll.interval.ms", MAX_POLL.as_millis().to_string());
    // The lock outlasts the body, as the docs ask.
    let task = TASK.clone().lock_ttl(MAX_POLL * 4);
    let mut consumer = Idempotent::new(task, KeyFrom::header("order_id"))
        .store(s.store.clone())
        .max_in_flight(1)
        .max_waiting(1)
        // A revoke would stop the body at once.
        .revoke_wait(Duration::ZERO)
        .subscribe(&config, &["orders"], body)
        .await
        .unwrap();
    s.produce(0, Some("long"), "{}").await;
    tokio::select! {
        _ = started.recv() => {}
        early = consumer.next() => panic!("a record ended before the long one started: {early:?}"),
        () = tokio::time::sleep(WAIT) => panic!("the long record never started"),
    }
    let began = std::time::Instant::now();
    s.produce(0, Some("behind"), "{}").await;
    let all = ended(&mut consumer, 2).await;
    assert!(
        began.elapsed() > MAX_POLL,
        "the body outlived max.poll.interval.ms"
    );
    let places: Vec<(i64, Outcome)> = all.iter().map(|p| (p.offset, done(p).1)).collect();
    assert_eq!(places, [(0, Outcome::Executed), (1, Outcome::Executed)]);
    assert!(!stopped.load(Ordering::SeqCst), "a revoke stopped the body");
    assert_eq!(
        starts.load(Ordering::SeqCst),
        1,
        "the record was delivered again"
    );
    assert_eq!(s.effects.load(Ordering::SeqCst), 2);
    consumer.close().await.unwrap();
    assert_eq!(s.committed(&[0]), [Some(2)]);
}
