//! The Kafka consumer on a real Kafka-protocol broker (tansu, started by test-support) and a
//! real redis-server as the store: every outcome as the broker saw it (the group's committed
//! offsets, the dead-letter topic's records and headers), duplicates, bad input, a store that
//! is down, offsets kept across a restart, and a consumer that stopped between its markers and
//! its commits.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use idempotask::{Backoff, Outcome, RetryPolicy, Task};
use idempotask_kafka::{
    BadRecord, ConsumeError, ERROR_HEADER, Handled, Idempotent, KafkaConsumer, KeyFrom, Processed,
    REASON_HEADER, Record, Rejection, SOURCE_HEADER,
};
use idempotask_redis::RedisStore;
use idempotask_test_support::RedisServer;
use idempotask_test_support::faulty_store::FaultyStore;
use idempotask_test_support::tansu::TansuServer;
use idempotask_test_support::workers::{self, Worker};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer, StreamConsumer};
use rdkafka::message::{Header, Headers, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
use redis::AsyncCommands;

#[path = "kafka/edges.rs"]
mod edges;
#[path = "kafka/raw.rs"]
mod raw;

const LOCK_TTL: Duration = Duration::from_secs(2);
const BACKOFF: Backoff = Backoff::new(Duration::from_millis(20), Duration::from_millis(100));
/// How long a test waits for what must happen; a failure, not a pause.
const WAIT: Duration = Duration::from_secs(20);
const GROUP: &str = "chargers";

static TASK: Task = Task::new("kafka_charge")
    .lock_ttl(LOCK_TTL)
    .retry(RetryPolicy::no_wait());

struct Setup {
    redis: RedisServer,
    broker: TansuServer,
    store: FaultyStore<RedisStore>,
    effects: Arc<AtomicU32>,
    producer: FutureProducer,
}

async fn setup(partitions: i32) -> Setup {
    let broker = TansuServer::start();
    let redis = RedisServer::start();
    let store = FaultyStore::new(redis.store().await);
    let admin: AdminClient<DefaultClientContext> = client_config(&broker).create().unwrap();
    let topics = [
        NewTopic::new("orders", partitions, TopicReplication::Fixed(1)),
        NewTopic::new("orders.dead", 1, TopicReplication::Fixed(1)),
    ];
    for result in admin
        .create_topics(&topics, &AdminOptions::new())
        .await
        .unwrap()
    {
        result.unwrap();
    }
    let producer = client_config(&broker).create().unwrap();
    Setup {
        redis,
        broker,
        store,
        effects: Arc::default(),
        producer,
    }
}

fn client_config(broker: &TansuServer) -> ClientConfig {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", broker.bootstrap_servers())
        .set("group.id", GROUP)
        .set("session.timeout.ms", "6000")
        // A member that joins gets its partitions within a second instead of three.
        .set("heartbeat.interval.ms", "500");
    config
}

type Charge = std::pin::Pin<Box<dyn Future<Output = Result<String, Declined>> + Send>>;
type Body = dyn Fn(&Record) -> Result<Charge, BadRecord> + Send + Sync;

#[derive(Debug, thiserror::Error)]
#[error("the card was declined")]
struct Declined;

#[derive(serde::Deserialize)]
struct Order {
    /// How many times the body fails before it succeeds; `u32::MAX` for always.
    #[serde(default)]
    fail: u32,
    #[serde(default)]
    panic: bool,
}

impl Setup {
    fn idempotent(&self) -> Idempotent {
        Idempotent::new(TASK.clone(), KeyFrom::header("order_id"))
            .store(self.store.clone())
            .failure_backoff(BACKOFF)
            .store_backoff(BACKOFF)
            .max_failures(3)
    }

    /// A body that counts its side effect, and holds the records `hold` picks until
    /// `release` says so, each telling `started` when it begins to hold.
    fn holding(
        &self,
        hold: impl Fn(&Record) -> bool + Send + Sync + 'static,
    ) -> (
        impl Fn(&Record) -> Result<Charge, BadRecord> + Send + Sync + 'static,
        tokio::sync::watch::Sender<bool>,
        tokio::sync::mpsc::UnboundedReceiver<()>,
    ) {
        let (release, released) = tokio::sync::watch::channel(false);
        let (started_tx, started) = tokio::sync::mpsc::unbounded_channel();
        let effects = Arc::clone(&self.effects);
        let body = move |record: &Record| {
            let holds_this = hold(record);
            let mut released = released.clone();
            let effects = Arc::clone(&effects);
            let started_tx = started_tx.clone();
            Ok(Box::pin(async move {
                if holds_this {
                    started_tx.send(()).unwrap();
                    released.wait_for(|go| *go).await.unwrap();
                }
                let n = effects.fetch_add(1, Ordering::SeqCst) + 1;
                Ok(format!("ch_{n}"))
            }) as Charge)
        };
        (body, release, started)
    }

    /// A body that reads the order, fails or panics as it says, and counts its side effect.
    fn charge(&self) -> impl Fn(&Record) -> Result<Charge, BadRecord> + Send + Sync + 'static {
        let effects = Arc::clone(&self.effects);
        let tries = Arc::new(std::sync::Mutex::new(std::collections::HashMap::new()));
        move |record: &Record| {
            let order: Order = record.json()?;
            let key = (record.partition(), record.offset());
            let effects = Arc::clone(&effects);
            let tries = Arc::clone(&tries);
            Ok(Box::pin(async move {
                let attempt = {
                    let mut tries = tries.lock().unwrap();
                    let attempt: &mut u32 = tries.entry(key).or_default();
                    *attempt += 1;
                    *attempt
                };
                assert!(
                    !(order.panic && attempt == 1),
                    "the gateway client panicked"
                );
                if attempt <= order.fail {
                    return Err(Declined);
                }
                let n = effects.fetch_add(1, Ordering::SeqCst) + 1;
                Ok(format!("ch_{n}"))
            }) as Charge)
        }
    }

    async fn subscribe(&self) -> KafkaConsumer<String, Declined> {
        self.idempotent()
            .subscribe(&client_config(&self.broker), &["orders"], self.charge())
            .await
            .unwrap()
    }

    /// Produces a record to `partition` of `orders`, with an `order_id` header unless `id` is
    /// `None`; answers its offset.
    async fn produce(&self, partition: i32, id: Option<&str>, payload: &str) -> i64 {
        let mut headers = OwnedHeaders::new().insert(Header {
            key: "trace",
            value: Some("t-1"),
        });
        if let Some(id) = id {
            headers = headers.insert(Header {
                key: "order_id",
                value: Some(id),
            });
        }
        let record = FutureRecord::<(), _>::to("orders")
            .partition(partition)
            .payload(payload)
            .headers(headers);
        self.producer
            .send(record, Duration::from_secs(10))
            .await
            .unwrap()
            .offset
    }

    /// The offsets the group committed for `partitions` of `orders` (`None`: none yet).
    fn committed(&self, partitions: &[i32]) -> Vec<Option<i64>> {
        let consumer: BaseConsumer = client_config(&self.broker).create().unwrap();
        let mut list = TopicPartitionList::new();
        for partition in partitions {
            list.add_partition("orders", *partition);
        }
        let committed = consumer
            .committed_offsets(list, Duration::from_secs(10))
            .unwrap();
        committed
            .elements()
            .iter()
            .map(|element| match element.offset() {
                Offset::Offset(offset) => Some(offset),
                _ => None,
            })
            .collect()
    }

    /// Sets the group's committed offset of `partition` back to `offset`: what a consumer that
    /// stopped before its commits leaves behind.
    fn rewind(&self, partition: i32, offset: i64) {
        let consumer: BaseConsumer = client_config(&self.broker).create().unwrap();
        let mut list = TopicPartitionList::new();
        list.add_partition_offset("orders", partition, Offset::Offset(offset))
            .unwrap();
        consumer
            .commit(&list, rdkafka::consumer::CommitMode::Sync)
            .unwrap();
    }

    /// The first `count` records of the dead-letter topic: their headers, as text.
    async fn dead(&self, count: usize) -> Vec<Vec<(String, String)>> {
        let mut config = client_config(&self.broker);
        config.set("group.id", "dead-reader");
        let consumer: StreamConsumer = config.create().unwrap();
        let mut list = TopicPartitionList::new();
        list.add_partition_offset("orders.dead", 0, Offset::Beginning)
            .unwrap();
        consumer.assign(&list).unwrap();
        let mut dead = Vec::new();
        while dead.len() < count {
            let message = tokio::time::timeout(WAIT, consumer.recv())
                .await
                .expect("the dead-letter records came")
                .unwrap();
            let headers = message
                .headers()
                .map(|headers| {
                    headers
                        .iter()
                        .map(|header| {
                            let value = header.value.map(String::from_utf8_lossy);
                            (
                                header.key.to_owned(),
                                value.unwrap_or_default().into_owned(),
                            )
                        })
                        .collect()
                })
                .unwrap_or_default();
            dead.push(headers);
        }
        dead
    }
}

/// The next `count` records that end (skipping their tries that run again), sorted by
/// partition and offset.
async fn ended(
    consumer: &mut KafkaConsumer<String, Declined>,
    count: usize,
) -> Vec<Processed<String, Declined>> {
    let mut ended = Vec::new();
    while ended.len() < count {
        let processed = tokio::time::timeout(WAIT, consumer.next())
            .await
            .expect("the records ended")
            .unwrap();
        if processed.handled.is_final() {
            ended.push(processed);
        }
    }
    ended.sort_by_key(|processed| (processed.partition, processed.offset));
    ended
}

fn done(processed: &Processed<String, Declined>) -> (&str, Outcome, u32) {
    let Handled::Done(report) = &processed.handled else {
        panic!("{processed:?}")
    };
    (report.value.as_str(), report.outcome, processed.failures)
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> &'a str {
    headers
        .iter()
        .rev()
        .find(|(key, _)| key == name)
        .map_or("", |(_, value)| value.as_str())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_run_once_per_key_and_the_offsets_are_committed_past_them() {
    let s = setup(2).await;
    let mut consumer = s.subscribe().await;
    s.produce(0, Some("1"), "{}").await;
    s.produce(0, Some("2"), "{}").await;
    // The same order sent again, on the other partition: one unit.
    s.produce(1, Some("2"), "{}").await;
    let ended = ended(&mut consumer, 3).await;
    let outcomes: Vec<Outcome> = ended.iter().map(|p| done(p).1).collect();
    let executed = outcomes.iter().filter(|o| **o == Outcome::Executed).count();
    assert_eq!(executed, 2, "{outcomes:?}");
    assert_eq!(s.effects.load(Ordering::SeqCst), 2);
    // The duplicate replays the value order 2 stored.
    assert_eq!(done(&ended[1]).0, done(&ended[2]).0);
    consumer.close().await.unwrap();
    assert_eq!(s.committed(&[0, 1]), [Some(2), Some(1)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_retry_then_go_to_the_dead_letter_topic_and_the_partition_moves_on() {
    let s = setup(1).await;
    let mut consumer = s.subscribe().await;
    s.produce(0, Some("flaky"), r#"{"fail":2}"#).await;
    s.produce(0, Some("poison"), r#"{"fail":4294967295}"#).await;
    s.produce(0, Some("panics"), r#"{"panic":true}"#).await;
    s.produce(0, Some("fine"), "{}").await;
    let ended = ended(&mut consumer, 4).await;
    let (_, outcome, failures) = done(&ended[0]);
    assert_eq!(
        (outcome, failures),
        (Outcome::Executed, 2),
        "two failures, then done"
    );
    let Handled::DeadLettered(Rejection::GaveUp { failures, .. }) = &ended[1].handled else {
        panic!("{:?}", ended[1])
    };
    assert_eq!(*failures, 3);
    assert_eq!(done(&ended[2]).1, Outcome::Executed);
    assert_eq!(ended[2].failures, 1, "the panic counted as a failure");
    assert_eq!(done(&ended[3]).1, Outcome::Executed);
    assert_eq!(
        s.effects.load(Ordering::SeqCst),
        3,
        "the poison order never took effect"
    );
    consumer.close().await.unwrap();
    assert_eq!(s.committed(&[0]), [Some(4)]);
    let dead = s.dead(1).await;
    assert_eq!(header(&dead[0], "order_id"), "poison");
    assert_eq!(header(&dead[0], "trace"), "t-1", "the record's own headers");
    assert_eq!(header(&dead[0], SOURCE_HEADER), "orders/0@1");
    assert_eq!(header(&dead[0], REASON_HEADER), "gave-up");
    assert!(
        header(&dead[0], ERROR_HEADER).starts_with("the body failed 3 times"),
        "{dead:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_without_its_key_or_with_a_bad_payload_is_dead_lettered_without_running() {
    let s = setup(1).await;
    let mut consumer = s.subscribe().await;
    s.produce(0, None, "{}").await;
    s.produce(0, Some("5"), "not json").await;
    s.produce(0, Some("6"), "{}").await;
    let ended = ended(&mut consumer, 3).await;
    let Handled::DeadLettered(missing @ Rejection::MissingKey(_)) = &ended[0].handled else {
        panic!("{:?}", ended[0])
    };
    assert_eq!(
        missing.to_string(),
        "record orders/0@0 has no idempotency key (it has no `order_id` header); add it to the record, or key the task by what the record carries"
    );
    let Handled::DeadLettered(Rejection::BadRecord(bad)) = &ended[1].handled else {
        panic!("{:?}", ended[1])
    };
    assert!(
        bad.to_string()
            .starts_with("record orders/0@1 cannot be used: its payload is not the JSON expected"),
        "{bad}"
    );
    assert_eq!(done(&ended[2]).1, Outcome::Executed);
    assert_eq!(s.effects.load(Ordering::SeqCst), 1);
    consumer.close().await.unwrap();
    assert_eq!(s.committed(&[0]), [Some(3)]);
    let dead = s.dead(2).await;
    // The two records run at once: their copies may reach the dead-letter topic in either order.
    let mut reasons: Vec<&str> = dead.iter().map(|h| header(h, REASON_HEADER)).collect();
    reasons.sort_unstable();
    assert_eq!(reasons, ["bad-record", "missing-key"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_or_dead_letter_topic_that_does_not_exist_is_refused_at_the_start() {
    let s = setup(1).await;
    let config = client_config(&s.broker);
    let err = s
        .idempotent()
        .subscribe(&config, &["ordres"], s.charge())
        .await
        .err()
        .expect("a typo is refused");
    assert!(
        matches!(&err, ConsumeError::UnknownTopic { topic } if topic == "ordres"),
        "{err}"
    );
    let err = s
        .idempotent()
        .dead_letter_topic("orders.failed")
        .assign(&config, "orders", &[0], s.charge())
        .await
        .err()
        .expect("a missing dead-letter topic is refused");
    assert_eq!(
        err.to_string(),
        "the topic `orders.failed` does not exist on the broker; create it (this consumer creates no topic)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_is_down_holds_the_record_and_its_offset_until_it_is_back() {
    let s = setup(1).await;
    let mut consumer = s.subscribe().await;
    s.store.down(true);
    s.produce(0, Some("9"), "{}").await;
    // The store refuses the unit: the record is deferred, not ended, and nothing committed.
    let deferred = tokio::time::timeout(WAIT, consumer.next())
        .await
        .expect("the record was tried")
        .unwrap();
    let Handled::Deferred { error, .. } = &deferred.handled else {
        panic!("{deferred:?}")
    };
    assert!(error.to_string().contains("store"), "{error}");
    assert_eq!(s.committed(&[0]), [None]);
    assert_eq!(s.effects.load(Ordering::SeqCst), 0);
    s.store.down(false);
    let ended = ended(&mut consumer, 1).await;
    assert_eq!(done(&ended[0]).1, Outcome::Executed);
    assert!(ended[0].deferrals >= 1, "{:?}", ended[0]);
    assert_eq!(
        ended[0].failures, 0,
        "a store outage is no failure of the body"
    );
    consumer.close().await.unwrap();
    assert_eq!(s.committed(&[0]), [Some(1)]);
}

/// A consumer that stopped after its records' markers were stored and before their offsets
/// were committed leaves the group's offsets behind them (here set back by hand, which is
/// what the broker holds after such a stop); the next consumer gets the records again and
/// replays each stored value. The consumers assign the partition by hand, with offsets
/// committed to the group, so the next one starts at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offsets_survive_a_restart_and_records_after_a_lost_commit_replay() {
    let s = setup(1).await;
    let config = client_config(&s.broker);
    for id in 0..4 {
        s.produce(0, Some(&id.to_string()), "{}").await;
    }
    let mut first = s
        .idempotent()
        .assign(&config, "orders", &[0], s.charge())
        .await
        .unwrap();
    let ran = ended(&mut first, 4).await;
    assert!(ran.iter().all(|p| done(p).1 == Outcome::Executed));
    first.close().await.unwrap();
    assert_eq!(s.committed(&[0]), [Some(4)]);

    // A restart starts after the committed offset.
    s.produce(0, Some("4"), "{}").await;
    let mut second = s
        .idempotent()
        .assign(&config, "orders", &[0], s.charge())
        .await
        .unwrap();
    let ran = ended(&mut second, 1).await;
    assert_eq!((ran[0].offset, done(&ran[0]).1), (4, Outcome::Executed));
    second.close().await.unwrap();
    assert_eq!(s.effects.load(Ordering::SeqCst), 5);

    // The commits of offsets 1.. were lost: those records come again, and replay.
    s.rewind(0, 1);
    let mut third = s
        .idempotent()
        .assign(&config, "orders", &[0], s.charge())
        .await
        .unwrap();
    let ran = ended(&mut third, 4).await;
    let offsets: Vec<i64> = ran.iter().map(|p| p.offset).collect();
    assert_eq!(offsets, [1, 2, 3, 4]);
    assert!(
        ran.iter().all(|p| done(p).1 == Outcome::Replayed),
        "{ran:?}"
    );
    assert_eq!(s.effects.load(Ordering::SeqCst), 5, "no side effect twice");
    third.close().await.unwrap();
    assert_eq!(s.committed(&[0]), [Some(5)]);
}

/// A partition with `max_in_flight` records running is paused while the consumer keeps
/// polling: a record of another partition runs and ends while the first partition's body
/// holds, and the held partition's later record waits behind it and its commit with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_body_holds_back_only_its_own_partition() {
    let s = setup(2).await;
    let (body, release, mut started) = s.holding(|record| record.header("hold").is_some());
    let mut consumer = s
        .idempotent()
        .max_in_flight(1)
        .subscribe(&client_config(&s.broker), &["orders"], body)
        .await
        .unwrap();
    let held = FutureRecord::<(), _>::to("orders")
        .partition(0)
        .payload("{}")
        .headers(
            OwnedHeaders::new()
                .insert(Header {
                    key: "order_id",
                    value: Some("held"),
                })
                .insert(Header {
                    key: "hold",
                    value: Some("1"),
                }),
        );
    s.producer
        .send(held, Duration::from_secs(10))
        .await
        .unwrap();
    s.produce(0, Some("behind"), "{}").await;
    // The held record runs before the other partition has anything.
    tokio::select! {
        _ = started.recv() => {}
        early = consumer.next() => panic!("a record ended before the held one started: {early:?}"),
        () = tokio::time::sleep(WAIT) => panic!("the held record never started"),
    }
    s.produce(1, Some("other"), "{}").await;
    let first = ended(&mut consumer, 1).await;
    assert_eq!(
        (first[0].partition, first[0].offset),
        (1, 0),
        "the other partition went on"
    );
    assert_eq!(
        s.effects.load(Ordering::SeqCst),
        1,
        "the record behind the held one waits"
    );
    // Once the other partition's commit landed, the held one has none.
    let deadline = tokio::time::Instant::now() + WAIT;
    while s.committed(&[1]) != [Some(1)] {
        assert!(
            tokio::time::Instant::now() < deadline,
            "partition 1 was never committed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        s.committed(&[0]),
        [None],
        "the held partition committed while its record runs"
    );
    release.send(true).unwrap();
    let rest = ended(&mut consumer, 2).await;
    let places: Vec<(i32, i64)> = rest.iter().map(|p| (p.partition, p.offset)).collect();
    assert_eq!(places, [(0, 0), (0, 1)]);
    consumer.close().await.unwrap();
    assert_eq!(s.committed(&[0, 1]), [Some(2), Some(1)]);
}

/// A partition whose waiting records reach `max_waiting` stops the polling until they have
/// room: each record still runs once, in its partition's order, and the commit reaches the last.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_stops_polling_and_every_record_runs_once_in_order() {
    let s = setup(1).await;
    let (body, release, mut started) = s.holding(|record| record.offset() == 0);
    let mut consumer = s
        .idempotent()
        .max_in_flight(1)
        .max_waiting(2)
        .subscribe(&client_config(&s.broker), &["orders"], body)
        .await
        .unwrap();
    s.produce(0, Some("o-0"), "{}").await;
    tokio::select! {
        _ = started.recv() => {}
        early = consumer.next() => panic!("a record ended before the first started: {early:?}"),
        () = tokio::time::sleep(WAIT) => panic!("the first record never started"),
    }
    for n in 1..8 {
        s.produce(0, Some(&format!("o-{n}")), "{}").await;
    }
    release.send(true).unwrap();
    let all = ended(&mut consumer, 8).await;
    let offsets: Vec<i64> = all.iter().map(|p| p.offset).collect();
    assert_eq!(
        offsets,
        (0..8).collect::<Vec<_>>(),
        "a record was lost, run twice or out of order"
    );
    assert!(all.iter().all(|p| done(p).1 == Outcome::Executed));
    assert_eq!(s.effects.load(Ordering::SeqCst), 8);
    consumer.close().await.unwrap();
    assert_eq!(s.committed(&[0]), [Some(8)]);
}

/// A queue that stays full for half of `max.poll.interval.ms` pauses its partition and the
/// polling goes on: the other partition's record runs while the first partition's body holds.
/// librdkafka drops a paused partition's fetched records and fetches them again on resume, so
/// each record must still run once, in order, and both commits must reach the last.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_full_for_too_long_pauses_its_partition_and_polling_goes_on() {
    let s = setup(2).await;
    let (body, release, mut started) =
        s.holding(|record| record.partition() == 0 && record.offset() == 0);
    let mut config = client_config(&s.broker);
    // The least librdkafka takes (its session timeout here): the stall before the pause is
    // half of it.
    config.set("max.poll.interval.ms", "6000");
    let mut consumer = s
        .idempotent()
        .max_in_flight(1)
        .max_waiting(2)
        .subscribe(&config, &["orders"], body)
        .await
        .unwrap();
    s.produce(0, Some("p0-0"), "{}").await;
    tokio::select! {
        _ = started.recv() => {}
        early = consumer.next() => panic!("a record ended before the held one started: {early:?}"),
        () = tokio::time::sleep(WAIT) => panic!("the held record never started"),
    }
    for n in 1..4 {
        s.produce(0, Some(&format!("p0-{n}")), "{}").await;
    }
    s.produce(1, Some("p1-0"), "{}").await;
    let other = ended(&mut consumer, 1).await;
    assert_eq!(
        (other[0].partition, other[0].offset),
        (1, 0),
        "the other partition waited for the held one"
    );
    release.send(true).unwrap();
    let rest = ended(&mut consumer, 4).await;
    let places: Vec<(i32, i64)> = rest.iter().map(|p| (p.partition, p.offset)).collect();
    assert_eq!(
        places,
        [(0, 0), (0, 1), (0, 2), (0, 3)],
        "a record was lost, run twice or out of order"
    );
    assert_eq!(s.effects.load(Ordering::SeqCst), 5);
    consumer.close().await.unwrap();
    assert_eq!(s.committed(&[0, 1]), [Some(4), Some(1)]);
}

/// Sets its flag when dropped: a body's future that was stopped.
struct Dropped(Arc<std::sync::atomic::AtomicBool>);

impl Drop for Dropped {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// A member joins while a record of the first member's partition runs: the revoke waits up to
/// `revoke_wait`, stops the body (no body keeps running for a partition its consumer lost),
/// commits nothing past it, and the record runs again on whichever member gets its partition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoke_stops_the_revoked_partitions_bodies_before_it_completes() {
    let s = setup(2).await;
    let held_once = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stopped = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (started_tx, mut started) = tokio::sync::mpsc::unbounded_channel();
    let effects = Arc::clone(&s.effects);
    let stopped_flag = Arc::clone(&stopped);
    let body = move |_record: &Record| {
        let hold = !held_once.swap(true, Ordering::SeqCst);
        let guard = hold.then(|| Dropped(Arc::clone(&stopped)));
        let started_tx = started_tx.clone();
        let effects = Arc::clone(&effects);
        Ok(Box::pin(async move {
            if let Some(_guard) = guard {
                started_tx.send(()).unwrap();
                std::future::pending::<()>().await;
            }
            let n = effects.fetch_add(1, Ordering::SeqCst) + 1;
            Ok(format!("ch_{n}"))
        }) as Charge)
    };
    let body = Arc::new(body);
    let config = client_config(&s.broker);
    let member = |body: Arc<Body>| {
        s.idempotent()
            .revoke_wait(Duration::from_millis(300))
            .subscribe(&config, &["orders"], move |record: &Record| body(record))
    };
    let mut first = member(body.clone()).await.unwrap();
    s.produce(0, Some("held"), "{}").await;
    tokio::select! {
        _ = started.recv() => {}
        early = first.next() => panic!("a record ended before the held one started: {early:?}"),
        () = tokio::time::sleep(WAIT) => panic!("the held record never started"),
    }
    let mut second = member(body).await.unwrap();
    let ended = loop {
        let ended = tokio::select! {
            ended = first.next() => ended.unwrap(),
            ended = second.next() => ended.unwrap(),
            () = tokio::time::sleep(WAIT * 2) => panic!("the held record never ran again"),
        };
        // A try that meets the stopped body's lock is deferred; the record ends after it.
        if ended.handled.is_final() {
            break ended;
        }
    };
    assert!(
        stopped_flag.load(Ordering::SeqCst),
        "the revoked body was stopped"
    );
    assert_eq!((ended.partition, ended.offset), (0, 0));
    assert_eq!(s.effects.load(Ordering::SeqCst), 1);
    first.close().await.unwrap();
    second.close().await.unwrap();
    assert_eq!(s.committed(&[0]), [Some(1)]);
}

/// A consumer dropped while a record runs stops the body and returns at once: the stopped
/// unit does not hold the close's revoke for the whole `revoke_wait` (which blocks the
/// runtime's thread), and nothing is committed past the record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_dropped_while_a_record_runs_returns_without_waiting_for_it() {
    let s = setup(1).await;
    let (started_tx, mut started) = tokio::sync::mpsc::unbounded_channel();
    let mut consumer: KafkaConsumer<String, Declined> = s
        .idempotent()
        .revoke_wait(WAIT)
        .subscribe(&client_config(&s.broker), &["orders"], move |_record| {
            started_tx.send(()).unwrap();
            Ok(std::future::pending::<Result<String, Declined>>())
        })
        .await
        .unwrap();
    s.produce(0, Some("held"), "{}").await;
    tokio::select! {
        _ = started.recv() => {}
        early = consumer.next() => panic!("a record ended while held: {early:?}"),
        () = tokio::time::sleep(WAIT) => panic!("the held record never started"),
    }
    let dropping = std::time::Instant::now();
    drop(consumer);
    assert!(
        dropping.elapsed() < WAIT / 2,
        "the drop took {:?}",
        dropping.elapsed()
    );
    assert_eq!(s.committed(&[0]), [None]);
}

/// What the killed worker needs: where the broker and Redis are.
#[derive(serde::Serialize, serde::Deserialize)]
struct KillConfig {
    bootstrap_servers: String,
    redis_url: String,
}

/// The worker process of the kill test: charges each order once per run of its body (an
/// `INCR` of `charges:<order>` in Redis, which a kill cannot take back), holds the record with
/// a `hold` header for ever, and counts the records that ended (`INCR ended`) after each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_worker() {
    let Some(config) = workers::config::<KillConfig>() else {
        return;
    };
    let conn = redis::Client::open(config.redis_url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let store = RedisStore::connect(&config.redis_url).await.unwrap();
    let mut client = ClientConfig::new();
    client
        .set("bootstrap.servers", &config.bootstrap_servers)
        .set("group.id", GROUP);
    let mut consumer = Idempotent::new(TASK.clone(), KeyFrom::header("order_id"))
        .store(store)
        .assign(&client, "orders", &[0], charge_in_redis(&conn, true))
        .await
        .unwrap();
    let mut conn = conn;
    loop {
        consumer.next().await.unwrap();
        let _: u32 = conn.incr("ended", 1).await.unwrap();
    }
}

/// A body that charges the order in Redis, and holds a record with a `hold` header for ever
/// when `hold` is on.
fn charge_in_redis(
    conn: &redis::aio::MultiplexedConnection,
    hold: bool,
) -> impl Fn(&Record) -> Result<Charge, BadRecord> + Send + Sync + 'static {
    let conn = conn.clone();
    move |record: &Record| {
        let order =
            String::from_utf8_lossy(record.header("order_id").unwrap_or_default()).into_owned();
        let holds = hold && record.header("hold").is_some();
        let mut conn = conn.clone();
        Ok(Box::pin(async move {
            if holds {
                std::future::pending::<()>().await;
            }
            let n: u32 = conn.incr(format!("charges:{order}"), 1).await.unwrap();
            Ok(format!("ch_{order}_{n}"))
        }) as Charge)
    }
}

/// A worker process killed with SIGKILL after the side effects and markers of records 3 to 5
/// and before their offsets could be committed (record 2 runs for ever and holds the commit
/// at 2): the next consumer gets records 2 to 5 again, runs 2 once its lock has expired, and
/// replays 3 to 5. Every order is charged once, as Redis counted. The consumers assign the
/// partition by hand with offsets committed to the group, so the next one starts at once
/// instead of after the killed member's session timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_killed_between_its_effects_and_its_commits_charges_nothing_twice() {
    let s = setup(1).await;
    for order in 0..6 {
        let mut headers = OwnedHeaders::new().insert(Header {
            key: "order_id",
            value: Some(&order.to_string()),
        });
        if order == 2 {
            headers = headers.insert(Header {
                key: "hold",
                value: Some("1"),
            });
        }
        let record = FutureRecord::<(), _>::to("orders")
            .partition(0)
            .payload("{}")
            .headers(headers);
        s.producer
            .send(record, Duration::from_secs(10))
            .await
            .unwrap();
    }
    let worker = Worker::spawn(
        "kill_worker",
        &KillConfig {
            bootstrap_servers: s.broker.bootstrap_servers(),
            redis_url: s.redis.url(),
        },
    );
    let mut conn = s.redis.connection().await;
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let ended: Option<u32> = conn.get("ended").await.unwrap();
        if ended == Some(5) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the worker ended {ended:?} records"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    worker.kill().await;
    assert_eq!(
        s.committed(&[0]),
        [Some(2)],
        "the held record kept the commit at 2"
    );

    let mut consumer = Idempotent::new(TASK.clone(), KeyFrom::header("order_id"))
        .store(s.store.clone())
        .store_backoff(BACKOFF)
        .assign(
            &client_config(&s.broker),
            "orders",
            &[0],
            charge_in_redis(&conn, false),
        )
        .await
        .unwrap();
    let ran = ended(&mut consumer, 4).await;
    let outcomes: Vec<(i64, Outcome)> = ran.iter().map(|p| (p.offset, done(p).1)).collect();
    assert_eq!(
        outcomes,
        [
            (2, Outcome::Executed),
            (3, Outcome::Replayed),
            (4, Outcome::Replayed),
            (5, Outcome::Replayed)
        ]
    );
    consumer.close().await.unwrap();
    assert_eq!(s.committed(&[0]), [Some(6)]);
    for order in 0..6 {
        let charges: u32 = conn.get(format!("charges:{order}")).await.unwrap();
        assert_eq!(charges, 1, "order {order}");
    }
}
