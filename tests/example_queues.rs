//! The crash demonstration of the queue examples: three copies of `rabbitmq_worker` or
//! `nats_worker` on one queue, the one that charges order 5 first killed with SIGKILL between
//! the charge and its ack, and the ledger in Redis read afterwards. With idempotask the
//! redelivery gets the stored receipt and every order is charged once; the bare consumer
//! (`WITHOUT_IDEMPOTASK=1`) charges it twice. The harness is `support::example_runs`.

use std::time::Duration;

use idempotask_test_support as support;
use lapin::options::{BasicPublishOptions, QueueDeclareOptions};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, types::FieldTable};
use support::RedisServer;
use support::example_runs::{ORDERS, example, ledger, run_workers};

/// Time enough for a loaded machine: a run takes a few seconds.
const TIMEOUT: Duration = Duration::from_secs(90);

/// `{"id": N}` for each order, as the queue examples read them.
fn order(id: u64) -> Vec<u8> {
    format!(r#"{{"id": {id}}}"#).into_bytes()
}

/// Publishes the orders to `queue` (which the workers declared), each with its `message_id`.
async fn publish_amqp(channel: &Channel, queue: &str) {
    for id in 1..=ORDERS {
        let properties = BasicProperties::default()
            .with_message_id(format!("{queue}-order-{id}").into())
            .with_delivery_mode(2);
        let options = BasicPublishOptions::default();
        let confirm = channel
            .basic_publish("".into(), queue.into(), options, &order(id), properties)
            .await
            .unwrap()
            .await
            .unwrap();
        assert!(
            confirm.is_ack(),
            "the broker refused order {id}: {confirm:?}"
        );
    }
}

/// How many messages wait in `queue`.
async fn depth(channel: &Channel, queue: &str) -> u32 {
    let passive = QueueDeclareOptions {
        passive: true,
        ..QueueDeclareOptions::default()
    };
    channel
        .queue_declare(queue.into(), passive, FieldTable::default())
        .await
        .unwrap()
        .message_count()
}

/// AMQP consumers, one killed with SIGKILL after a charge and before its ack (the broker
/// redelivers at once when its connection closes), and deliveries that fail once: with
/// idempotask every order is charged once and nothing is left in the queues; without it the
/// redelivery charges again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_worker_charges_each_order_once_despite_a_kill_9() {
    let redis = RedisServer::start();
    let rabbit = support::rabbitmq::RabbitServer::start();
    let mut conn = redis.connection().await;
    let connection = Connection::connect(&rabbit.url(), ConnectionProperties::default())
        .await
        .unwrap();
    let channel = connection.create_channel().await.unwrap();
    channel
        .confirm_select(lapin::options::ConfirmSelectOptions::default())
        .await
        .unwrap();
    let worker = |without: bool| {
        let (redis, amqp) = (redis.url(), rabbit.url());
        move || {
            let mut command = example("rabbitmq_worker");
            command.env("REDIS_URL", &redis).env("AMQP_URL", &amqp);
            if without {
                command.env("WITHOUT_IDEMPOTASK", "1");
            }
            command
        }
    };

    let with = run_workers(
        worker(false),
        "orders",
        publish_amqp(&channel, "orders"),
        TIMEOUT,
    )
    .await;
    with.assert_charged_once(&ledger(&mut conn, "orders").await);
    let topology = idempotask_lapin::Topology::new("orders");
    let waiting =
        depth(&channel, topology.queue()).await + depth(&channel, topology.retry_queue()).await;
    assert_eq!(waiting, 0, "left in the queues");
    assert_eq!(
        depth(&channel, topology.dead_letter_queue()).await,
        0,
        "dead-lettered"
    );

    let queue = "orders-without";
    let without = run_workers(worker(true), queue, publish_amqp(&channel, queue), TIMEOUT).await;
    without.assert_charged_twice(&ledger(&mut conn, queue).await);
}

/// The same on a NATS stream: the killed worker's message comes back once the consumer's
/// `AckWait` has passed, and messages are nak'd once. With idempotask the server's own count
/// says every message was acked, none left pending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_worker_charges_each_order_once_despite_a_kill_9() {
    use async_nats::jetstream::{self, consumer::pull, message::PublishMessage};
    let nats = support::nats::NatsServer::start();
    let redis = RedisServer::start();
    let mut conn = redis.connection().await;
    let js = jetstream::new(async_nats::connect(nats.url()).await.unwrap());
    let publish = |queue: &'static str| {
        let js = js.clone();
        async move {
            for id in 1..=ORDERS {
                let message = PublishMessage::build()
                    .payload(order(id).into())
                    .message_id(format!("{queue}-order-{id}"));
                js.send_publish(queue, message)
                    .await
                    .unwrap()
                    .await
                    .unwrap();
            }
        }
    };
    let worker = |without: bool| {
        let (redis, nats) = (redis.url(), nats.url());
        move || {
            let mut command = example("nats_worker");
            command.env("REDIS_URL", &redis).env("NATS_URL", &nats);
            if without {
                command.env("WITHOUT_IDEMPOTASK", "1");
            }
            command
        }
    };

    let with = run_workers(worker(false), "orders", publish("orders"), TIMEOUT).await;
    with.assert_charged_once(&ledger(&mut conn, "orders").await);
    // The server's word that every message was acked, not the workers' lines.
    let stream = js.get_stream("orders").await.unwrap();
    let mut consumer = stream
        .get_consumer::<pull::Config>("chargers")
        .await
        .unwrap();
    let info = consumer.info().await.unwrap();
    assert_eq!(info.num_ack_pending, 0, "{info:?}");
    assert_eq!(info.ack_floor.stream_sequence, ORDERS, "{info:?}");

    let queue = "orders-without";
    let without = run_workers(worker(true), queue, publish(queue), TIMEOUT).await;
    without.assert_charged_twice(&ledger(&mut conn, queue).await);
}
