//! Kafka: a topic and its dead-letter topic per case on a tansu broker (a Kafka-protocol
//! broker), the store on the harness's Redis; commits read back from the group's committed
//! offsets, dead letters from the dead-letter topic's high watermark.
//!
//! The consumer retries in-process (Kafka has no nak), and answers each try: a failed or
//! deferred try is the case's "retry" once its record's offset is not committed past it. Its
//! bodies run as tasks of their own, so the misuse of calling the task from inside its own
//! call is made by the body here (it calls the task for its own key), which the consumer sees
//! as a failed try. The consumer assigns the partition by hand, with offsets committed to the
//! group, as the crate's own crash tests do on tansu.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idempotask::{RetryPolicy, Task};
use idempotask_kafka::{BadRecord, Handled, Idempotent, KafkaConsumer, KeyFrom, Processed, Record};
use idempotask_redis::RedisStore;
use idempotask_test_support::RedisServer;
use idempotask_test_support::faulty_store::FaultyStore;
use idempotask_test_support::tansu::TansuServer;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use super::{
    Body, Case, DROP_AFTER, DROPPED_LOCK_TTL, Declined, Driver, Effects, Fault, Integration,
    LOCK_TTL, MAX_FAILURES, Message, QUEUE_BACKOFF, Seen, Step, WAIT, ack, eventually, fault_off,
    fault_on, faulty_store, hold, key_in, key_of, payload, run_body,
};

static KAFKA_TASK: Task = Task::new("conformance_kafka")
    .lock_ttl(LOCK_TTL)
    .retry(RetryPolicy::no_wait());

type BodyFuture = std::pin::Pin<Box<dyn Future<Output = Result<f64, Declined>> + Send>>;

pub(super) struct Kafka {
    _redis: RedisServer,
    broker: TansuServer,
    store: FaultyStore<RedisStore>,
    effects: Effects,
    producer: FutureProducer,
    /// The planted bug: the body commits its record's offset before it does its work, as a
    /// consumer that commits on receipt does.
    commit_early: bool,
    case: Option<KafkaCase>,
}

struct KafkaCase {
    topic: String,
    consumer: KafkaConsumer<f64, Declined>,
    /// The body of each try to come, in order: a step adds its own, a try takes the first
    /// (waiting for it), so that a retry runs the body of the step that delivers it.
    bodies: Bodies,
    started: Arc<tokio::sync::Notify>,
    last: Option<i64>,
    dead: i64,
    /// After a deferral, the step that delivers the record again skips its further deferrals
    /// (the store still down, or the holder's lock still held when a try came).
    deferred: bool,
}

/// The body of a try, and whether it calls the task from inside its own call.
type Try = (Body, bool);

#[derive(Clone, Default)]
struct Bodies {
    queue: Arc<Mutex<VecDeque<Try>>>,
    added: Arc<tokio::sync::Notify>,
}

impl Bodies {
    fn add(&self, body: Try) {
        self.queue.lock().unwrap().push_back(body);
        self.added.notify_waiters();
    }

    fn clear(&self) {
        self.queue.lock().unwrap().clear();
    }

    async fn take(&self) -> Try {
        loop {
            let added = self.added.notified();
            if let Some(body) = self.queue.lock().unwrap().pop_front() {
                return body;
            }
            added.await;
        }
    }
}

impl Kafka {
    pub(super) async fn start(commit_early: bool) -> Self {
        let (redis, store) = faulty_store().await;
        let broker = TansuServer::start();
        let producer = client_config(&broker, "producer").create().unwrap();
        Self {
            _redis: redis,
            broker,
            store,
            effects: Effects::default(),
            producer,
            commit_early,
            case: None,
        }
    }

    /// A consumer of `topic`'s only partition, from the group's committed offset, running each
    /// try's body from `bodies`.
    async fn consumer(
        &self,
        case: Case,
        topic: &str,
        bodies: &Bodies,
        started: &Arc<tokio::sync::Notify>,
    ) -> KafkaConsumer<f64, Declined> {
        let lock_ttl = if case == Case::Dropped {
            DROPPED_LOCK_TTL
        } else {
            LOCK_TTL
        };
        let (effects, bodies, started) =
            (self.effects.clone(), bodies.clone(), Arc::clone(started));
        let store = self.store.clone();
        let early = self
            .commit_early
            .then(|| client_config(&self.broker, topic));
        let body = move |record: &Record| -> Result<BodyFuture, BadRecord> {
            let key = key_in(record.payload()).unwrap_or_default();
            let (effects, bodies, started) =
                (effects.clone(), bodies.clone(), Arc::clone(&started));
            let store = store.clone();
            let early = early.clone();
            let (topic, offset) = (record.topic().to_owned(), record.offset());
            Ok(Box::pin(async move {
                let (kind, reenter) = bodies.take().await;
                started.notify_one();
                if let Some(config) = early {
                    commit(&config, &topic, offset + 1);
                }
                if reenter {
                    // The task called from inside its own call: refused as a misuse.
                    let inner: Result<(), idempotask::Error> = KAFKA_TASK
                        .call(key.clone())
                        .store(store)
                        .run(async { Ok(()) })
                        .await;
                    assert!(inner.is_err(), "the inner call of the same task ran");
                    return Err(Declined);
                }
                run_body(effects, key, kind).await
            }))
        };
        Idempotent::new(KAFKA_TASK.clone().lock_ttl(lock_ttl), KeyFrom::RecordKey)
            .store(self.store.clone())
            .failure_backoff(QUEUE_BACKOFF)
            .store_backoff(QUEUE_BACKOFF)
            .max_failures(MAX_FAILURES)
            .fingerprint_payload(true)
            .assign(&client_config(&self.broker, topic), topic, &[0], body)
            .await
            .unwrap()
    }

    /// The group's committed offset of the case's partition.
    fn committed(&self, topic: &str) -> Option<i64> {
        let consumer: BaseConsumer = client_config(&self.broker, topic).create().unwrap();
        let mut list = TopicPartitionList::new();
        list.add_partition(topic, 0);
        let committed = consumer
            .committed_offsets(list, Duration::from_secs(10))
            .unwrap();
        let offset = match committed.elements()[0].offset() {
            Offset::Offset(offset) => Some(offset),
            _ => None,
        };
        drop(committed);
        offset
    }

    /// How many records the case's dead-letter topic holds.
    fn dead_letters(&self, topic: &str) -> i64 {
        let consumer: BaseConsumer = client_config(&self.broker, topic).create().unwrap();
        let (_, high) = consumer
            .fetch_watermarks(&format!("{topic}.dead"), 0, Duration::from_secs(10))
            .unwrap();
        high
    }

    /// What the broker saw of a try: an offset committed past an ended record (and a copy on
    /// the dead-letter topic for a dead letter), none past a record that runs again.
    async fn seen(
        &mut self,
        topic: &str,
        key: &str,
        before: u32,
        processed: Processed<f64, Declined>,
    ) -> Seen {
        let offset = processed.offset;
        match processed.handled {
            Handled::Failed { .. } | Handled::Deferred { .. } => {
                let committed = self.committed(topic);
                assert!(
                    committed.is_none_or(|committed| committed <= offset),
                    "the group committed {committed:?}, past a record that runs again: it can be lost"
                );
                Seen::Retry
            }
            Handled::Done(_) => {
                eventually(
                    "the offset of an ended record was never committed",
                    || async { self.committed(topic) == Some(offset + 1) },
                )
                .await;
                ack(self.effects.of(key) > before)
            }
            Handled::DeadLettered(_) => {
                let want = self.case.as_ref().unwrap().dead + 1;
                assert_eq!(self.dead_letters(topic), want, "no dead-letter record");
                eventually(
                    "the offset of a dead letter was never committed",
                    || async { self.committed(topic) == Some(offset + 1) },
                )
                .await;
                self.case.as_mut().unwrap().dead = want;
                Seen::DeadLetter
            }
        }
    }
}

fn client_config(broker: &TansuServer, group: &str) -> ClientConfig {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", broker.bootstrap_servers())
        .set("group.id", group);
    config
}

/// Commits `offset` for the group of `config`, as the planted bug does.
fn commit(config: &ClientConfig, topic: &str, offset: i64) {
    let consumer: BaseConsumer = config.create().unwrap();
    let mut list = TopicPartitionList::new();
    list.add_partition_offset(topic, 0, Offset::Offset(offset))
        .unwrap();
    consumer.commit(&list, CommitMode::Sync).unwrap();
    drop(list);
}

impl Driver for Kafka {
    const INTEGRATION: Integration = Integration::Kafka;

    fn effects(&self) -> &Effects {
        &self.effects
    }

    async fn start(&mut self, case: Case) {
        self.store.down(false);
        let topic = format!("conformance-{case:?}");
        let admin: AdminClient<DefaultClientContext> =
            client_config(&self.broker, "admin").create().unwrap();
        let dead = format!("{topic}.dead");
        let topics = [
            NewTopic::new(&topic, 1, TopicReplication::Fixed(1)),
            NewTopic::new(&dead, 1, TopicReplication::Fixed(1)),
        ];
        for created in admin
            .create_topics(&topics, &AdminOptions::new())
            .await
            .unwrap()
        {
            created.unwrap();
        }
        let bodies = Bodies::default();
        let started = Arc::new(tokio::sync::Notify::new());
        let consumer = self.consumer(case, &topic, &bodies, &started).await;
        self.case = Some(KafkaCase {
            topic,
            consumer,
            bodies,
            started,
            last: None,
            dead: 0,
            deferred: false,
        });
    }

    async fn step(&mut self, case: Case, step: Step) -> Seen {
        let key = key_of(Self::INTEGRATION, case);
        let topic = self.case.as_ref().unwrap().topic.clone();
        if !step.again {
            let text = payload(&key, step.message);
            let record_key = match step.message {
                Message::Unkeyed => None,
                _ => key_in(text.as_bytes()),
            };
            let mut record = FutureRecord::to(&topic).partition(0).payload(&text);
            if let Some(record_key) = &record_key {
                record = record.key(record_key);
            }
            self.producer.send(record, WAIT).await.unwrap();
        }
        let before = self.effects.of(&key);
        fault_on(&self.store, step.fault);
        let holder = if step.fault == Fault::Holder {
            Some(hold(&KAFKA_TASK, &self.store, &self.effects, &key).await)
        } else {
            None
        };
        let state = self.case.as_mut().unwrap();
        state.bodies.add((step.body, step.fault == Fault::Reenter));
        let skip_deferrals = step.again && std::mem::take(&mut state.deferred);
        let started = Arc::clone(&state.started);
        let tried = async {
            loop {
                let processed = tokio::time::timeout(WAIT, state.consumer.next())
                    .await
                    .expect("the record never came back (it is lost, or committed)")
                    .unwrap();
                if !(skip_deferrals && matches!(processed.handled, Handled::Deferred { .. })) {
                    return processed;
                }
            }
        };
        let processed = if step.body == Body::Hang {
            tokio::select! {
                ended = tried => panic!("the hanging body ended: {ended:?}"),
                () = async { started.notified().await; tokio::time::sleep(DROP_AFTER).await } => None,
            }
        } else {
            Some(tried.await)
        };
        // A body this step's try did not run (the store was down, the key busy) is not the
        // next step's: its retry waits for the body that step adds.
        self.case.as_ref().unwrap().bodies.clear();
        fault_off(&self.store, step.fault);
        if let Some((finish, holder)) = holder {
            finish.send(()).unwrap();
            holder.await.unwrap();
        }
        let Some(processed) = processed else {
            // The consumer is gone mid-body, as if killed: its heir reads from the group's
            // committed offset, which must not be past the record, and meets the dropped
            // consumer's lock until it is released or runs out.
            let KafkaCase {
                topic,
                consumer,
                dead,
                ..
            } = self.case.take().unwrap();
            drop(consumer);
            let (bodies, started) = (Bodies::default(), Arc::new(tokio::sync::Notify::new()));
            let heir = self.consumer(case, &topic, &bodies, &started).await;
            self.case = Some(KafkaCase {
                topic,
                consumer: heir,
                bodies,
                started,
                last: None,
                dead,
                deferred: true,
            });
            return Seen::NoAnswer;
        };
        let state = self.case.as_mut().unwrap();
        if step.again && state.last.is_some() {
            assert_eq!(
                state.last,
                Some(processed.offset),
                "another record came instead of the one to run again"
            );
        }
        state.last = Some(processed.offset);
        state.deferred = matches!(processed.handled, Handled::Deferred { .. });
        self.seen(&topic, &key, before, processed).await
    }

    async fn end(&mut self, _case: Case, _seen: &[Seen]) {
        let state = self.case.take().unwrap();
        let topic = state.topic.clone();
        let last = state.last;
        let dead = state.dead;
        state.consumer.close().await.unwrap();
        assert_eq!(
            self.committed(&topic),
            last.map(|offset| offset + 1),
            "the case's last record is not committed past"
        );
        assert_eq!(self.dead_letters(&topic), dead);
    }
}
