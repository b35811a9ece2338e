//! The crash demonstrations of the examples. Three copies of `rabbitmq_worker`, `nats_worker`,
//! `redis_streams_worker`, `sqs_worker` or `apalis_worker` on one queue (copies of
//! `kafka_worker` one after another), the one that charges order 5 first
//! killed with SIGKILL between the charge and its ack, and the ledger in Redis read afterwards:
//! with idempotask the redelivery gets the stored receipt and every order is charged once; the
//! bare consumer
//! (`WITHOUT_IDEMPOTASK=1`) charges it twice. And copies of `ledger_transfer`, one killed inside
//! a transaction, the ledger in PostgreSQL read afterwards: every transfer written once. The
//! harness is `support::example_runs`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use idempotask_test_support as support;
use lapin::options::{BasicPublishOptions, QueueDeclareOptions};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, types::FieldTable};
use support::RedisServer;
use support::example_runs::{
    Answer, CRASH_ORDER, CRASH_TRANSFER, Copies, Delivery, ORDERS, QueueRun, example, ledger,
    run_workers,
};

// The SQS crate's test queues on moto_server: a client, a queue with its dead-letter queue.
#[path = "../integrations/sqs/tests/moto_queues/mod.rs"]
mod moto_queues;

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

/// The same on a Redis stream, through `idempotask-redis-streams`: the killed worker's entry is
/// claimed by another once it has been idle for the consumer's `claim_idle`, and failed
/// charges wait pending in their worker. The group's own count says every entry was acked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_streams_worker_charges_each_order_once_despite_a_kill_9() {
    let redis = RedisServer::start();
    let mut conn = redis.connection().await;
    let adder = conn.clone();
    let publish = |queue: &'static str| {
        let mut conn = adder.clone();
        async move {
            for id in 1..=ORDERS {
                let _: String = redis::cmd("XADD")
                    .arg(queue)
                    .arg("*")
                    .arg("order_id")
                    .arg(format!("{queue}-order-{id}"))
                    .arg("order")
                    .arg(order(id))
                    .query_async(&mut conn)
                    .await
                    .unwrap();
            }
        }
    };
    let worker = |without: bool| {
        let url = redis.url();
        move || {
            let mut command = example("redis_streams_worker");
            command.env("REDIS_URL", &url);
            if without {
                command.env("WITHOUT_IDEMPOTASK", "1");
            }
            command
        }
    };

    let with = run_workers(worker(false), "orders", publish("orders"), TIMEOUT).await;
    with.assert_charged_once(&ledger(&mut conn, "orders").await);
    // The group's word that every entry was acked, not the workers' lines.
    let (pending, ..): (u64, Option<String>, Option<String>, redis::Value) = redis::cmd("XPENDING")
        .arg("orders")
        .arg("chargers")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(pending, 0, "{with:#?}");
    let dead: u64 = redis::cmd("XLEN")
        .arg("orders:dead")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(dead, 0, "{with:#?}");

    let queue = "orders-without";
    let without = run_workers(worker(true), queue, publish(queue), TIMEOUT).await;
    without.assert_charged_twice(&ledger(&mut conn, queue).await);
}

/// The same on Amazon SQS (`moto_server`), through `idempotask-sqs`: the killed worker's
/// message comes back after the queue's visibility timeout, and failed charges are handed back
/// for their backoff. The queues' own counts say every message was deleted and none given up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqs_worker_charges_each_order_once_despite_a_kill_9() {
    let redis = RedisServer::start();
    let mut conn = redis.connection().await;
    let shape = || moto_queues::Shape {
        // At least the example's 1 s lock TTL; short, so the killed worker's order soon comes back.
        visibility: 2,
        max_receive_count: Some(10),
        fifo: false,
    };
    let worker = |without: bool| {
        let url = redis.url();
        move || {
            let mut command = example("sqs_worker");
            command.env("REDIS_URL", &url).env(
                "SQS_ENDPOINT",
                support::moto::MotoServer::shared().endpoint(),
            );
            if without {
                command.env("WITHOUT_IDEMPOTASK", "1");
            }
            command
        }
    };
    for without in [false, true] {
        let queue = moto_queues::Queue::create("orders", shape()).await;
        let name = queue.url.rsplit('/').next().unwrap().to_owned();
        let publish = async {
            for id in 1..=ORDERS {
                let body = String::from_utf8(order(id)).unwrap();
                queue
                    .send(&body, Some(&format!("{name}-order-{id}")), None)
                    .await;
            }
        };
        let run = Box::pin(run_workers(worker(without), &name, publish, TIMEOUT)).await;
        let charged = ledger(&mut conn, &name).await;
        if without {
            run.assert_charged_twice(&charged);
            continue;
        }
        run.assert_charged_once(&charged);
        // The queues' word that every message was deleted, not the workers' lines.
        assert_eq!(queue.holds(&queue.url).await, 0, "{run:#?}");
        assert_eq!(queue.holds(&queue.dead_url).await, 0, "{run:#?}");
    }
}

/// An order as `examples/apalis_worker.rs` reads its jobs.
#[derive(serde::Serialize, serde::Deserialize)]
struct Order {
    id: u64,
}

/// The command of one `apalis_worker` on the Redis at `redis` (its store and its gateway's
/// ledger), its queue on the PostgreSQL at `postgres` when given, else on that Redis.
fn apalis_worker(
    redis: String,
    postgres: Option<String>,
    without: bool,
) -> impl FnMut() -> std::process::Command {
    move || {
        let mut command = example("apalis_worker");
        command.env("REDIS_URL", &redis);
        if let Some(postgres) = &postgres {
            command.env("DATABASE_URL", postgres);
        }
        if without {
            command.env("WITHOUT_IDEMPOTASK", "1");
        }
        command
    }
}

/// apalis workers on an apalis-redis queue, one killed with SIGKILL after a charge and before
/// its ack (the queue puts its job back once its heartbeat is overdue), and jobs that fail once:
/// with idempotask every order is charged once and every job is done; without it the job put
/// back charges again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apalis_worker_on_redis_charges_each_order_once_despite_a_kill_9() {
    use apalis::prelude::TaskSink;
    let redis = RedisServer::start();
    let mut conn = redis.connection().await;
    let push = |queue: &'static str| {
        let url = redis.url();
        async move {
            let config = apalis_redis::Config::default().queue(queue);
            let connection = apalis_redis::connect(url).await.unwrap();
            let mut storage = apalis_redis::RedisStorage::new(connection).with_config(config);
            for id in 1..=ORDERS {
                storage.push(Order { id }).await.unwrap();
            }
        }
    };
    let worker = |without| apalis_worker(redis.url(), None, without);

    let with = run_workers(worker(false), "orders", push("orders"), TIMEOUT).await;
    with.assert_charged_once(&ledger(&mut conn, "orders").await);
    // The queue's word that every job is done, not the workers' lines.
    let done = apalis_redis::Config::default()
        .queue("orders")
        .done_jobs_set();
    let done: u64 = redis::cmd("SCARD")
        .arg(done)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(done, ORDERS);

    let queue = "orders-without";
    let without = run_workers(worker(true), queue, push(queue), TIMEOUT).await;
    without.assert_charged_twice(&ledger(&mut conn, queue).await);
}

/// The same on an apalis-postgres queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apalis_worker_on_postgres_charges_each_order_once_despite_a_kill_9() {
    use apalis::prelude::TaskSink;
    use apalis_postgres::PostgresStorage;
    let redis = RedisServer::start();
    let postgres = support::postgres::PostgresServer::start();
    let mut conn = redis.connection().await;
    let pool = postgres.pool(2).await;
    PostgresStorage::setup(&pool).await.unwrap();
    let push = |queue: &'static str| {
        let pool = pool.clone();
        async move {
            let config = apalis_postgres::Config::default().queue(queue);
            let mut storage = PostgresStorage::new(&pool).with_config(config);
            for id in 1..=ORDERS {
                storage.push(Order { id }).await.unwrap();
            }
        }
    };
    let worker = |without| apalis_worker(redis.url(), Some(postgres.url()), without);

    let with = run_workers(worker(false), "orders", push("orders"), TIMEOUT).await;
    with.assert_charged_once(&ledger(&mut conn, "orders").await);
    // The queue's word that every job is done, not the workers' lines.
    let done: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM apalis.jobs WHERE job_type = $1 AND status = 'Done'",
    )
    .bind("orders")
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(u64::try_from(done).unwrap(), ORDERS);

    let queue = "orders-without";
    let without = run_workers(worker(true), queue, push(queue), TIMEOUT).await;
    without.assert_charged_twice(&ledger(&mut conn, queue).await);
}

/// Transfers delivered twice at once by each of several copies of `ledger_transfer`, one killed
/// with SIGKILL inside a transaction that had moved the money, and every transfer delivered once
/// more afterwards: the ledger holds each transfer once and the balances add up, with no
/// `UNIQUE` constraint on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ledger_transfer_writes_each_transfer_once_despite_a_kill_9_mid_transaction() {
    use support::example_runs::{Transferred, run_transfers};
    let postgres = support::postgres::PostgresServer::start();
    let url = postgres.url();
    let run = run_transfers(
        || {
            let mut command = example("ledger_transfer");
            command.env("DATABASE_URL", &url);
            command
        },
        TIMEOUT,
    )
    .await;
    assert_eq!(run.killed.len(), 1, "{run:#?}");

    // What the database holds: the kill cannot take it away.
    let pool = postgres.pool(1).await;
    let written: Vec<(i64, i64)> = sqlx::query_as(
        "SELECT transfer, count(*) FROM ledger_transfers GROUP BY transfer ORDER BY transfer",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let transfers = run.transfers;
    assert!(transfers > CRASH_TRANSFER, "{run:#?}");
    let once: Vec<(i64, i64)> = (0..i64::try_from(transfers).unwrap())
        .map(|transfer| (transfer, 1))
        .collect();
    assert_eq!(written, once, "{run:#?}");
    // Each account holds its opening 10 000 and what the written transfers moved.
    let balances: BTreeMap<i64, i64> = sqlx::query_as("SELECT id, balance FROM ledger_accounts")
        .fetch_all(&pool)
        .await
        .unwrap()
        .into_iter()
        .collect();
    let mut expected: BTreeMap<i64, i64> = balances.keys().map(|&id| (id, 10_000)).collect();
    let moves: Vec<(i64, i64, i64)> =
        sqlx::query_as("SELECT from_account, to_account, amount FROM ledger_transfers")
            .fetch_all(&pool)
            .await
            .unwrap();
    for (from, to, amount) in moves {
        *expected.get_mut(&from).unwrap() -= amount;
        *expected.get_mut(&to).unwrap() += amount;
    }
    assert_eq!(balances, expected);

    // The killed copy may have committed transfers and died before printing `executed` for
    // them, so its rows are counted from the ledger. Every copy that lived printed each of its
    // executions: those and the killed copy's rows add up to every transfer.
    let killed_pids: Vec<i64> = run.killed.values().map(|&pid| i64::from(pid)).collect();
    let written_by_killed: i64 =
        sqlx::query_scalar("SELECT count(*) FROM ledger_transfers WHERE worker = ANY($1)")
            .bind(&killed_pids)
            .fetch_one(&pool)
            .await
            .unwrap();
    let lived = |worker: usize| !run.killed.contains_key(&worker);
    let executed_by_survivors = run.count(&Transferred::Executed, lived);
    let transfers = usize::try_from(transfers).unwrap();
    assert_eq!(
        executed_by_survivors + usize::try_from(written_by_killed).unwrap(),
        transfers,
        "{run:#?}"
    );
    assert!(
        run.count(&Transferred::Executed, |_| true) <= transfers,
        "{run:#?}"
    );
    assert_eq!(run.failed(), 0, "{run:#?}");
    // The two copies that ran beside the killed one deliver every transfer twice, and the last
    // copy twice more: 6 × transfers deliveries that each executed or replayed, at most
    // `transfers` of them executing, whatever the killed copy printed. Its crash line is always
    // read, since it is what the kill answers.
    assert!(
        run.count(&Transferred::Replayed, lived) >= transfers * 5,
        "{run:#?}"
    );
    assert!(run.deliveries.len() > transfers * 6, "{run:#?}");
}

/// The same on Kafka (tansu), through `idempotask-kafka`, one worker at a time: the workers
/// take the topic's one partition by manual assignment with offsets committed to the group, so
/// the first is killed after order 5's charge and before its commit (order 4 held), and the
/// next resumes at the group's committed offset. With idempotask it replays order 5 and charges
/// order 4 once the killed worker's lock has expired; the group's committed offset says every
/// record ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_worker_charges_each_order_once_despite_a_kill_9() {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::message::{Header, OwnedHeaders};
    use rdkafka::producer::{FutureProducer, FutureRecord};
    let tansu = support::tansu::TansuServer::start();
    let redis = RedisServer::start();
    let mut conn = redis.connection().await;
    let mut config = rdkafka::ClientConfig::new();
    config.set("bootstrap.servers", tansu.bootstrap_servers());
    let producer: FutureProducer = config.create().unwrap();
    let publish = |queue: &'static str| {
        let producer = producer.clone();
        async move {
            for id in 1..=ORDERS {
                let key = format!("{queue}-order-{id}");
                let headers = OwnedHeaders::new().insert(Header {
                    key: "order_id",
                    value: Some(&key),
                });
                let payload = order(id);
                let record = FutureRecord::<(), _>::to(queue)
                    .partition(0)
                    .payload(&payload)
                    .headers(headers);
                producer.send(record, TIMEOUT).await.unwrap();
            }
        }
    };
    let worker = |without: bool| {
        let (redis, brokers) = (redis.url(), tansu.bootstrap_servers());
        move || {
            let mut command = example("kafka_worker");
            command
                .env("REDIS_URL", &redis)
                .env("KAFKA_BROKERS", &brokers);
            if without {
                command.env("WITHOUT_IDEMPOTASK", "1");
            }
            command
        }
    };

    let with = run_in_turn(worker(false), "orders", publish("orders")).await;
    with.assert_charged_once(&ledger(&mut conn, "orders").await);
    // The group's word that every record ended, not the workers' lines.
    let group: BaseConsumer = config.clone().set("group.id", "chargers").create().unwrap();
    let committed = {
        let mut partitions = rdkafka::TopicPartitionList::new();
        partitions.add_partition("orders", 0);
        let list = group.committed_offsets(partitions, TIMEOUT).unwrap();
        // Dropped before the consumer, which would wait for it for ever.
        list.find_partition("orders", 0).unwrap().offset()
    };
    drop(group);
    assert_eq!(
        committed,
        rdkafka::Offset::Offset(i64::try_from(ORDERS).unwrap()),
        "{with:#?}"
    );

    let queue = "orders-without";
    let without = run_in_turn(worker(true), queue, publish(queue)).await;
    without.assert_charged_twice(&ledger(&mut conn, queue).await);
}

/// Runs a copy of a queue example with `CRASH_BEFORE_ACK` set to [`CRASH_ORDER`]; once it is
/// waiting, awaits `publish`; kills it with SIGKILL when it says it is crashing, and starts
/// the next copy, which must answer every order left; then stops it with SIGINT.
async fn run_in_turn(
    mut worker: impl FnMut() -> std::process::Command,
    queue: &str,
    publish: impl Future<Output = ()>,
) -> QueueRun {
    let run = tokio::time::timeout(TIMEOUT, async {
        let mut copies = Copies::new();
        let mut command = worker();
        command
            .env("QUEUE", queue)
            .env("CRASH_BEFORE_ACK", CRASH_ORDER.to_string());
        copies.start(command);
        let mut run = QueueRun {
            deliveries: Vec::new(),
            killed: 0,
        };
        let mut answered = BTreeSet::new();
        let mut published = Some(publish);
        while (answered.len() as u64) < ORDERS {
            let Some((index, line)) = copies.next().await else {
                panic!("every worker exited: {run:#?}");
            };
            let Some(line) = line else {
                assert!(
                    copies.killed().contains_key(&index),
                    "worker {index} exited"
                );
                continue;
            };
            if line.starts_with("waiting for orders on ") {
                if let Some(publish) = published.take() {
                    publish.await;
                }
                continue;
            }
            let delivery =
                Delivery::parse(index, &line).unwrap_or_else(|| panic!("worker {index}: {line}"));
            if let Answer::Crashing(_) = delivery.answer {
                copies.kill(index).await;
                run.killed = copies.killed().len();
                let mut next = worker();
                next.env("QUEUE", queue);
                copies.start(next);
            } else if delivery.receipt().is_some() {
                answered.insert(delivery.order);
            }
            run.deliveries.push(delivery);
        }
        copies.all_started();
        copies.interrupt();
        copies.wait().await;
        while let Some((index, line)) = copies.next().await {
            if let Some(delivery) = line.and_then(|line| Delivery::parse(index, &line)) {
                run.deliveries.push(delivery);
            }
        }
        run
    })
    .await;
    run.unwrap_or_else(|_| panic!("the workers did not answer every order within {TIMEOUT:?}"))
}
