//! The check of the JetStream consumer's settings against the lock: what it reports, and that it
//! runs again when it could not read the consumer.

#[allow(clippy::wildcard_imports)]
use super::*;

// A consumer whose AckWait was shorter than the one the integration assumed, or with a small
// `max_deliver`, was neither refused nor warned about, though either can redeliver a message
// under a held lock or drop one nobody finished.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn a_consumer_whose_settings_work_against_the_lock_is_reported() {
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
pub(super) async fn a_consumer_backoff_shorter_than_the_declared_ack_wait_is_reported() {
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

/// A message as JetStream would deliver it from consumer `consumer` of the `ORDERS` stream,
/// with `Nats-Msg-Id: msg_id`; its acks go nowhere.
pub(super) fn delivered_by(queue: &Queue, consumer: &str, msg_id: &str) -> Message {
    let mut message = without_reply(queue, msg_id);
    message.message.reply =
        Some(format!("$JS.ACK.{STREAM}.{consumer}.1.1.1.1764547200000000000.0").into());
    message
}

// The consumer was marked checked before the check ran: when the first message's consumer could
// not be read, no later message checked it, and its problems were never reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn a_consumer_check_that_could_not_read_the_consumer_runs_again_later() {
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
