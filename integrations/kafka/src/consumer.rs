//! [`KafkaConsumer`]: a consumer that polls records, runs each as a unit, and commits each
//! partition's offsets past the records that ended.

use std::collections::{BTreeSet, VecDeque};
use std::future::Future;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::producer::FutureProducer;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;

use crate::offsets::Partition;
use crate::rebalance::{Context, Shared, State, partitions};
use crate::unit::{Body, BodyFuture, run_unit};
use crate::{BadRecord, ConsumeError, Idempotent, Processed, Record};

/// How long the start may take to read a topic's metadata.
const METADATA_TIMEOUT: Duration = Duration::from_secs(10);
/// librdkafka's `max.poll.interval.ms` when the configuration does not set it.
const DEFAULT_MAX_POLL_INTERVAL: Duration = Duration::from_secs(300);

/// A Kafka consumer made by [`Idempotent::subscribe`] or [`Idempotent::assign`]: it polls
/// records, runs each through the task as a unit of its own (see the [crate docs](crate)),
/// and commits each partition's offset past the records that ended.
///
/// Call [`next`](Self::next) in a loop: it polls (which also keeps the consumer in its group
/// while bodies run), starts each record's unit, and answers each record that ended, after
/// its offset commit was sent. Dropped, it stops its running units (their locks released);
/// a subscribed one then leaves its group, committing as a revoke does, only past the
/// records that ended. The stopped records are delivered again. [`close`](Self::close) ends
/// it gracefully.
///
/// ```no_run
/// use idempotask::Task;
/// use idempotask_kafka::{Idempotent, KeyFrom};
/// use rdkafka::ClientConfig;
///
/// # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let mut config = ClientConfig::new();
/// config.set("bootstrap.servers", "127.0.0.1:9092").set("group.id", "mailers");
/// let mut consumer = Idempotent::new(Task::new("mail_receipt"), KeyFrom::RecordKey)
///     .subscribe(&config, &["receipts"], |_record| Ok(async { Ok::<_, std::io::Error>(()) }))
///     .await?;
/// loop {
///     let processed = consumer.next().await?;
///     println!("{}/{}@{} ended", processed.topic, processed.partition, processed.offset);
/// }
/// # }
/// ```
pub struct KafkaConsumer<T, E> {
    consumer: Arc<StreamConsumer<Context>>,
    producer: FutureProducer,
    idempotent: Arc<Idempotent>,
    body: Arc<Body<T, E>>,
    shared: Arc<Shared>,
    ended_tx: mpsc::UnboundedSender<Processed<T, E>>,
    ended_rx: mpsc::UnboundedReceiver<Processed<T, E>>,
    /// Errors that no call was waiting for (a refused commit, a failed resume): `next`
    /// returns them.
    errors_tx: mpsc::UnboundedSender<ConsumeError>,
    errors_rx: mpsc::UnboundedReceiver<ConsumeError>,
    /// How long polling may stop while a partition's queue is full before that partition is
    /// paused instead: half of `max.poll.interval.ms`, so that the member is not evicted.
    stall_limit: Duration,
    /// Since when polling has stopped for a full queue.
    stalled_since: Option<tokio::time::Instant>,
}

impl Idempotent {
    /// Joins the consumer group of `config` (`group.id`) on `topics`, and runs each record
    /// through `body`: it is called with the record before its unit begins, decodes what it
    /// needs (a [`BadRecord`] sends the record to the dead-letter topic, nothing ran) and
    /// returns the body's future, which is only polled once the lock is held (a duplicate never
    /// polls it). A failed body is called again for its next try. The body's `Ok` type is
    /// stored as JSON, so it must implement `Serialize` and `DeserializeOwned` (`()` does).
    ///
    /// The consumer sets `enable.auto.commit` and `enable.auto.offset.store` to `false` (it
    /// commits itself), and `auto.offset.reset` to `earliest` unless `config` sets it. The
    /// dead-letter copies are sent by a producer made from the same `config`.
    ///
    /// ```no_run
    /// use idempotask::Task;
    /// use idempotask_kafka::{Idempotent, KeyFrom};
    /// use rdkafka::ClientConfig;
    ///
    /// #[derive(serde::Deserialize)]
    /// struct Order { amount: u64 }
    ///
    /// async fn charge(amount: u64) -> Result<String, std::io::Error> {
    ///     Ok(format!("ch_{amount}"))
    /// }
    ///
    /// # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let mut config = ClientConfig::new();
    /// config.set("bootstrap.servers", "127.0.0.1:9092").set("group.id", "chargers");
    /// let consumer = Idempotent::new(Task::new("order_charge"), KeyFrom::header("order_id"))
    ///     .subscribe(&config, &["orders"], |record| {
    ///         let order: Order = record.json()?;
    ///         Ok(charge(order.amount))
    ///     })
    ///     .await?;
    /// # let _ = consumer; Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`ConsumeError::UnknownTopic`] when a topic or its dead-letter topic does not exist;
    /// [`ConsumeError::Kafka`] when the client cannot be made (a bad setting) or the broker
    /// cannot be reached within 10 s.
    pub async fn subscribe<T, E, B, Fut>(
        self,
        config: &ClientConfig,
        topics: &[&str],
        body: B,
    ) -> Result<KafkaConsumer<T, E>, ConsumeError>
    where
        T: Serialize + DeserializeOwned + Send + 'static,
        E: std::fmt::Display + Send + 'static,
        B: Fn(&Record) -> Result<Fut, BadRecord> + Send + Sync + 'static,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
    {
        let consumer = self.start(config, topics, body).await?;
        consumer
            .consumer
            .subscribe(topics)
            .map_err(|err| ConsumeError::kafka("subscribe", err))?;
        Ok(consumer)
    }

    /// Consumes the given partitions of `topic` without joining the group's rebalances
    /// (`assign`), from the offsets the group `group.id` committed (`auto.offset.reset`
    /// where it has none), committing to that group as [`subscribe`](Self::subscribe) does.
    /// For a fixed set of consumers that each own their partitions, and for brokers whose
    /// group membership does not survive a member that dies without leaving.
    ///
    /// ```no_run
    /// use idempotask::Task;
    /// use idempotask_kafka::{Idempotent, KeyFrom};
    /// use rdkafka::ClientConfig;
    ///
    /// # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let mut config = ClientConfig::new();
    /// config.set("bootstrap.servers", "127.0.0.1:9092").set("group.id", "chargers");
    /// let consumer = Idempotent::new(Task::new("order_charge"), KeyFrom::RecordKey)
    ///     .assign(&config, "orders", &[0, 1], |_record| Ok(async { Ok::<_, std::io::Error>(()) }))
    ///     .await?;
    /// # let _ = consumer; Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`subscribe`](Self::subscribe).
    pub async fn assign<T, E, B, Fut>(
        self,
        config: &ClientConfig,
        topic: &str,
        partitions: &[i32],
        body: B,
    ) -> Result<KafkaConsumer<T, E>, ConsumeError>
    where
        T: Serialize + DeserializeOwned + Send + 'static,
        E: std::fmt::Display + Send + 'static,
        B: Fn(&Record) -> Result<Fut, BadRecord> + Send + Sync + 'static,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
    {
        let consumer = self.start(config, &[topic], body).await?;
        let mut assignment = TopicPartitionList::new();
        for partition in partitions {
            assignment
                .add_partition_offset(topic, *partition, Offset::Stored)
                .map_err(|err| ConsumeError::kafka("assign", err))?;
        }
        consumer
            .consumer
            .assign(&assignment)
            .map_err(|err| ConsumeError::kafka("assign", err))?;
        Ok(consumer)
    }

    /// Input: the client's settings, the topics and the body. Output: a consumer and a
    /// producer, once every topic and dead-letter topic is known to exist.
    async fn start<T, E, B, Fut>(
        self,
        config: &ClientConfig,
        topics: &[&str],
        body: B,
    ) -> Result<KafkaConsumer<T, E>, ConsumeError>
    where
        T: Serialize + DeserializeOwned + Send + 'static,
        E: std::fmt::Display + Send + 'static,
        B: Fn(&Record) -> Result<Fut, BadRecord> + Send + Sync + 'static,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
    {
        let mut consumer_config = config.clone();
        consumer_config
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false");
        if consumer_config.get("auto.offset.reset").is_none() {
            consumer_config.set("auto.offset.reset", "earliest");
        }
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            ended: Condvar::new(),
        });
        let (errors_tx, errors_rx) = mpsc::unbounded_channel();
        let context = Context {
            shared: Arc::clone(&shared),
            revoke_wait: self.revoke_wait,
            errors: errors_tx.clone(),
        };
        let consumer: StreamConsumer<Context> = consumer_config
            .create_with_context(context)
            .map_err(|err| ConsumeError::kafka("create consumer", err))?;
        let consumer = Arc::new(consumer);
        let mut producer_config = ClientConfig::new();
        for (key, value) in config.config_map() {
            // The consumer's own settings only draw warnings from a producer.
            if !is_consumer_only(key) {
                producer_config.set(key, value);
            }
        }
        let producer: FutureProducer = producer_config
            .create()
            .map_err(|err| ConsumeError::kafka("create producer", err))?;
        let mut needed: Vec<String> = topics.iter().map(|topic| (*topic).to_owned()).collect();
        needed.extend(topics.iter().map(|topic| self.dead_letter_topic_for(topic)));
        needed.dedup();
        let checker = Arc::clone(&consumer);
        tokio::task::spawn_blocking(move || check_topics(&checker, &needed))
            .await
            .map_err(|err| ConsumeError::Kafka {
                action: "fetch metadata",
                source: Box::new(err),
            })??;
        let body: Arc<Body<T, E>> = Arc::new(move |record: &Record| {
            body(record).map(|future| Box::pin(future) as BodyFuture<T, E>)
        });
        let (ended_tx, ended_rx) = mpsc::unbounded_channel();
        let max_poll_interval = config
            .get("max.poll.interval.ms")
            .and_then(|ms| ms.parse().ok())
            .map_or(DEFAULT_MAX_POLL_INTERVAL, Duration::from_millis);
        Ok(KafkaConsumer {
            consumer,
            producer,
            idempotent: Arc::new(self),
            body,
            shared,
            ended_tx,
            ended_rx,
            errors_tx,
            errors_rx,
            stall_limit: max_poll_interval / 2,
            stalled_since: None,
        })
    }
}

/// Whether `key` is a setting of consumers only.
fn is_consumer_only(key: &str) -> bool {
    key.starts_with("group.")
        || key.starts_with("enable.auto.")
        || key.starts_with("auto.")
        || key.starts_with("partition.assignment")
        || key.starts_with("session.")
        || key.starts_with("heartbeat.")
        || key.starts_with("max.poll.")
        || key.starts_with("fetch.")
        || key == "isolation.level"
}

/// Input: topic names. Output: an error naming the first that the broker does not know.
fn check_topics(consumer: &StreamConsumer<Context>, topics: &[String]) -> Result<(), ConsumeError> {
    for topic in topics {
        let metadata = consumer
            .fetch_metadata(Some(topic), METADATA_TIMEOUT)
            .map_err(|err| ConsumeError::kafka("fetch metadata", err))?;
        let known = metadata.topics().iter().any(|found| {
            found.name() == topic && found.error().is_none() && !found.partitions().is_empty()
        });
        if !known {
            return Err(ConsumeError::UnknownTopic {
                topic: topic.clone(),
            });
        }
    }
    Ok(())
}

impl<T, E> KafkaConsumer<T, E>
where
    T: Serialize + DeserializeOwned + Send + 'static,
    E: std::fmt::Display + Send + 'static,
{
    /// Polls and runs records until a try of one ends, and answers it: done or sent to the
    /// dead-letter topic ([`Handled::is_final`](crate::Handled::is_final)), once its
    /// partition's offset commit (if it moved) was sent; or failed or deferred, to run again
    /// in this consumer after its delay (see [`Processed`]). Records of one poll run at the same time, up to
    /// [`max_in_flight`](Idempotent::max_in_flight) per partition; a partition's further
    /// records wait in order. While a partition has [`max_waiting`](Idempotent::max_waiting)
    /// waiting, polling stops; after half of `max.poll.interval.ms` that partition is paused
    /// and polling goes on for the others.
    ///
    /// ```no_run
    /// # use idempotask::Task;
    /// # use idempotask_kafka::{Handled, Idempotent, KeyFrom};
    /// # use rdkafka::ClientConfig;
    /// # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let mut config = ClientConfig::new();
    /// # config.set("bootstrap.servers", "127.0.0.1:9092").set("group.id", "g");
    /// let mut consumer = Idempotent::new(Task::new("order_charge"), KeyFrom::RecordKey)
    ///     .subscribe(&config, &["orders"], |_record| Ok(async { Ok::<_, std::io::Error>(7_u32) }))
    ///     .await?;
    /// loop {
    ///     if let Handled::DeadLettered(why) = consumer.next().await?.handled {
    ///         eprintln!("dead-lettered: {why}");
    ///     }
    /// }
    /// # }
    /// ```
    ///
    /// Cancellation safe: a `next` dropped in a `select!` loses no record (the records it
    /// started keep running, and the next call answers them).
    ///
    /// # Errors
    /// [`ConsumeError::Kafka`] when polling reports an error (a broker that cannot be
    /// reached, say), or when the broker refused an offset commit (`commit`: that offset is
    /// sent again with the next commit) or a paused partition could not be resumed (`resume`:
    /// tried again when the next record ends). The record whose end led to the commit is
    /// answered first. The consumer stays usable: call `next` again.
    pub async fn next(&mut self) -> Result<Processed<T, E>, ConsumeError> {
        loop {
            // A full queue stops polling, as a consumer that takes what it can run does:
            // librdkafka keeps what it fetched. Pausing at once would drop that and fetch it
            // again on resume; the pause comes only when the stall nears eviction.
            let full = self.has_full_queue();
            let stalled_until = if full {
                *self
                    .stalled_since
                    .get_or_insert_with(tokio::time::Instant::now)
                    + self.stall_limit
            } else {
                self.stalled_since = None;
                tokio::time::Instant::now()
            };
            tokio::select! {
                biased;
                Some(err) = self.errors_rx.recv() => return Err(err),
                Some(processed) = self.ended_rx.recv() => {
                    self.after_end();
                    return Ok(processed);
                }
                received = self.consumer.recv(), if !full => {
                    let message = received.map_err(|err| ConsumeError::kafka("poll", err))?;
                    let record = Record::from_message(&message);
                    drop(message);
                    self.accept(record);
                }
                () = tokio::time::sleep_until(stalled_until), if full => {
                    self.stalled_since = None;
                    self.pause_full()?;
                }
            }
        }
    }

    /// Stops polling, waits up to [`revoke_wait`](Idempotent::revoke_wait) for the running
    /// records to end (those waiting behind a paused partition do not start), stops those
    /// still running then (their locks released, as a revoke does: a record that waits for a
    /// store that is down never ends), commits the offsets of the records that ended and waits
    /// for the commit; then the consumer leaves its group when dropped. No offset is committed
    /// past a stopped record: it is delivered again.
    ///
    /// ```no_run
    /// # use idempotask::Task;
    /// # use idempotask_kafka::{Idempotent, KeyFrom};
    /// # use rdkafka::ClientConfig;
    /// # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let mut config = ClientConfig::new();
    /// # config.set("bootstrap.servers", "127.0.0.1:9092").set("group.id", "g");
    /// let mut consumer = Idempotent::new(Task::new("order_charge"), KeyFrom::RecordKey)
    ///     .subscribe(&config, &["orders"], |_record| Ok(async { Ok::<_, std::io::Error>(()) }))
    ///     .await?;
    /// let ended = consumer.close().await?;
    /// println!("{} more records ended while closing", ended.len());
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`ConsumeError::Kafka`] when the last commit failed: the records after the group's
    /// last commit are then delivered again (and replay their stored results).
    pub async fn close(mut self) -> Result<Vec<Processed<T, E>>, ConsumeError> {
        let mut ended = Vec::new();
        {
            let mut state = self.shared.lock();
            state.waiting.clear();
        }
        let deadline = tokio::time::Instant::now() + self.idempotent.revoke_wait;
        while !self.shared.lock().units.is_empty() {
            match tokio::time::timeout_at(deadline, self.ended_rx.recv()).await {
                Ok(Some(processed)) => ended.push(processed),
                Ok(None) => break,
                Err(_) => {
                    let mut state = self.shared.lock();
                    tracing::warn!(
                        running = state.units.len(),
                        "records still running when the close's wait ended are stopped (their locks released) and delivered again"
                    );
                    state.stop_all();
                    break;
                }
            }
        }
        while let Ok(processed) = self.ended_rx.try_recv() {
            ended.push(processed);
        }
        let commits = self.take_commits();
        if commits.count() > 0 {
            let consumer = Arc::clone(&self.consumer);
            tokio::task::spawn_blocking(move || consumer.commit(&commits, CommitMode::Sync))
                .await
                .map_err(|err| ConsumeError::Kafka {
                    action: "commit",
                    source: Box::new(err),
                })?
                .map_err(|err| ConsumeError::kafka("commit", err))?;
        }
        Ok(ended)
    }

    /// Input: a polled record. Output: it runs, or waits behind its partition's running
    /// records (polling stops while `max_waiting` wait).
    fn accept(&self, record: Record) {
        let partition = (record.topic().to_owned(), record.partition());
        let mut state = self.shared.lock();
        state.offsets.received(&partition, record.offset());
        let waiting = state.waiting.get(&partition).map_or(0, VecDeque::len);
        let running = state.offsets.running(&partition) - 1 - waiting;
        if waiting == 0 && running < self.idempotent.max_in_flight {
            self.spawn(&mut state, partition, record);
            return;
        }
        state
            .waiting
            .entry(partition)
            .or_default()
            .push_back(record);
    }

    /// Whether a partition that is not paused has `max_waiting` records waiting.
    fn has_full_queue(&self) -> bool {
        let state = self.shared.lock();
        state.waiting.iter().any(|(partition, queue)| {
            queue.len() >= self.idempotent.max_waiting && !state.paused.contains(partition)
        })
    }

    /// Pauses the partitions whose queues are full, so that polling goes on for the others.
    fn pause_full(&self) -> Result<(), ConsumeError> {
        let mut pause = TopicPartitionList::new();
        {
            let mut state = self.shared.lock();
            let full: Vec<Partition> = state
                .waiting
                .iter()
                .filter(|(_, queue)| queue.len() >= self.idempotent.max_waiting)
                .map(|(partition, _)| partition.clone())
                .collect();
            for partition in full {
                if state.paused.insert(partition.clone()) {
                    let _ = pause.add_partition(&partition.0, partition.1);
                }
            }
        }
        if pause.count() > 0
            && let Err(err) = self.consumer.pause(&pause)
        {
            // Not paused: counted so, the next stall tries again.
            let mut state = self.shared.lock();
            for (partition, _) in partitions(&pause) {
                state.paused.remove(&partition);
            }
            return Err(ConsumeError::kafka("pause", err));
        }
        Ok(())
    }

    /// Input: a record to run now. Output: its unit running on the runtime, which counts the
    /// record ended and sends what became of it when it ends.
    fn spawn(&self, state: &mut State, partition: Partition, record: Record) {
        let offset = record.offset();
        let idempotent = Arc::clone(&self.idempotent);
        let producer = self.producer.clone();
        let body = Arc::clone(&self.body);
        let shared = Arc::clone(&self.shared);
        let ended = self.ended_tx.clone();
        let unit_partition = partition.clone();
        let id = state.next_unit_id();
        let task = tokio::spawn(async move {
            let processed = run_unit(&idempotent, &producer, &*body, record, &ended).await;
            shared.lock().unit_ended(&unit_partition, offset, id);
            shared.ended.notify_all();
            let _ = ended.send(processed);
        });
        state.unit_started(partition, offset, id, task.abort_handle());
    }

    /// After a record ended: the records waiting for room start, paused partitions with at
    /// most half of `max_waiting` left resume, and the offsets that moved are committed. A
    /// resume or commit that fails goes to the errors `next` returns, and is tried again.
    fn after_end(&self) {
        let mut resume = TopicPartitionList::new();
        {
            let mut state = self.shared.lock();
            // The paused ones too: a resume that failed is tried again even when no record
            // of the partition waits any more.
            let partitions: BTreeSet<Partition> =
                state.waiting.keys().chain(&state.paused).cloned().collect();
            for partition in partitions {
                loop {
                    let waiting = state.waiting.get(&partition).map_or(0, VecDeque::len);
                    let running = state.offsets.running(&partition) - waiting;
                    if waiting == 0 || running >= self.idempotent.max_in_flight {
                        break;
                    }
                    let Some(record) = state
                        .waiting
                        .get_mut(&partition)
                        .and_then(VecDeque::pop_front)
                    else {
                        break;
                    };
                    self.spawn(&mut state, partition.clone(), record);
                }
                let waiting = state.waiting.get(&partition).map_or(0, VecDeque::len);
                if waiting == 0 {
                    state.waiting.remove(&partition);
                }
                if waiting <= self.idempotent.max_waiting / 2 && state.paused.remove(&partition) {
                    let _ = resume.add_partition(&partition.0, partition.1);
                }
            }
        }
        if resume.count() > 0
            && let Err(err) = self.consumer.resume(&resume)
        {
            // Still paused: counted so, the next record that ends tries again.
            let mut state = self.shared.lock();
            state
                .paused
                .extend(partitions(&resume).map(|(partition, _)| partition));
            drop(state);
            let _ = self.errors_tx.send(ConsumeError::kafka("resume", err));
        }
        let commits = self.take_commits();
        if commits.count() > 0
            && let Err(err) = self.consumer.commit(&commits, CommitMode::Async)
        {
            self.shared.lock().commit_failed(&commits);
            let _ = self.errors_tx.send(ConsumeError::kafka("commit", err));
        }
    }

    /// The offsets that moved since their last commit.
    fn take_commits(&self) -> TopicPartitionList {
        let mut commits = TopicPartitionList::new();
        for ((topic, partition), position) in self.shared.lock().offsets.take_commits() {
            let _ = commits.add_partition_offset(&topic, partition, Offset::Offset(position));
        }
        commits
    }
}

impl<T, E> Drop for KafkaConsumer<T, E> {
    fn drop(&mut self) {
        // Forgotten as well as stopped: the client's close, which follows, revokes the
        // assignment, and its revoke waits for the units it knows.
        self.shared.lock().stop_all();
    }
}
