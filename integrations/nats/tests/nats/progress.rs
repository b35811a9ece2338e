//! Progress acks keep a long body's message from being redelivered, and stop when they must; an
//! ack that cannot be sent is an error that keeps the outcome.

#[allow(clippy::wildcard_imports)]
use super::*;

/// Handles the first message of `consumer` with a body three times its `AckWait` long while
/// the consumer keeps pulling; answers the server's count of deliveries once it is acked.
pub(super) async fn long_body(
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
pub(super) async fn progress_acks_keep_a_body_longer_than_ack_wait_from_being_redelivered() {
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
pub(super) async fn progress_acks_go_out_for_a_message_that_comes_after_the_acks_went_idle() {
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
pub(super) async fn no_progress_ack_follows_the_final_acknowledgement() {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
pub(super) async fn progress_acks_outlast_a_body_that_blocks_its_thread() {
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
pub(super) async fn progress_acks_stop_once_the_lock_is_gone_and_the_message_comes_back() {
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
pub(super) async fn an_ack_that_cannot_be_sent_is_an_error_that_keeps_the_outcome() {
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
