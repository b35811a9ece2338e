//! The consumer's settings: [`Idempotent`], its builder methods, and the defaults of a Kafka
//! consumer.

use std::time::Duration;

use idempotask::store::Store;
use idempotask::{Backoff, Task};
use idempotask_consumer::ConsumerSettings;

use crate::KeyFrom;

/// How many records of one partition run at the same time, by default; more wait in the
/// consumer, in order.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 16;
/// How many received records of one partition may wait for room in the consumer, by default,
/// before the partition is paused.
pub const DEFAULT_MAX_WAITING: usize = 1024;
/// How long a revoke waits for the running records of the partitions it takes away, and a
/// close for all running records, by default.
pub const DEFAULT_REVOKE_WAIT: Duration = Duration::from_secs(30);
/// How long a dead-letter copy may take to be acknowledged before it is sent again, by default.
pub const DEFAULT_DEAD_LETTER_TIMEOUT: Duration = Duration::from_secs(30);

// The defaults of every queue consumer, which Kafka takes as they are.
pub use idempotask_consumer::{
    DEFAULT_FAILURE_BACKOFF, DEFAULT_MAX_FAILURES, DEFAULT_STORE_BACKOFF,
};

/// Runs each Kafka record through a [`Task`], keyed as [`KeyFrom`] says: the settings of a
/// consumer, which [`subscribe`](Self::subscribe) joins to a consumer group (or
/// [`assign`](Self::assign) points at chosen partitions).
///
/// ```
/// use std::time::Duration;
/// use idempotask::{MemoryStore, RetryPolicy, Task};
/// use idempotask_kafka::{Idempotent, KeyFrom};
///
/// let charge_once = Idempotent::new(Task::new("order_charge").retry(RetryPolicy::no_wait()), KeyFrom::header("order_id"))
///     .store(MemoryStore::new())
///     .max_failures(3)
///     .dead_letter_topic("orders.failed")
///     .max_in_flight(4)
///     .revoke_wait(Duration::from_secs(10));
/// assert_eq!(charge_once.task().name(), "order_charge");
/// ```
#[derive(Debug, Clone)]
pub struct Idempotent {
    pub(crate) settings: ConsumerSettings,
    pub(crate) key: KeyFrom,
    pub(crate) dead_letter_topic: Option<String>,
    pub(crate) max_in_flight: usize,
    pub(crate) max_waiting: usize,
    pub(crate) revoke_wait: Duration,
    pub(crate) dead_letter_timeout: Duration,
    /// The settings' store backoff, which the dead-letter copies wait by too.
    pub(crate) store_backoff: Backoff,
}

impl Idempotent {
    /// Records run through `task`, keyed by `key`, with the defaults: the installed store,
    /// [`DEFAULT_FAILURE_BACKOFF`], [`DEFAULT_STORE_BACKOFF`], [`DEFAULT_MAX_FAILURES`],
    /// [`DEFAULT_MAX_IN_FLIGHT`], [`DEFAULT_MAX_WAITING`], [`DEFAULT_REVOKE_WAIT`], [`DEFAULT_DEAD_LETTER_TIMEOUT`] and
    /// the dead-letter topic `<topic>.dead` of each record's topic.
    pub fn new(task: Task, key: KeyFrom) -> Self {
        Self {
            settings: ConsumerSettings::new(task),
            key,
            dead_letter_topic: None,
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            max_waiting: DEFAULT_MAX_WAITING,
            revoke_wait: DEFAULT_REVOKE_WAIT,
            dead_letter_timeout: DEFAULT_DEAD_LETTER_TIMEOUT,
            store_backoff: DEFAULT_STORE_BACKOFF,
        }
    }

    idempotask_consumer::settings_setters! {
        /// Uses `store` instead of the installed one.
        ///
        /// The records a poll brings run at the same time; a store that batches natively
        /// (`RedisStore`, `PostgresStore`) is wrapped in a
        /// [`BatchingStore`](idempotask::store::BatchingStore), so their `begin`s and
        /// `finish`es reach it as one pipeline each instead of one round trip per record
        /// ([`batch_store_calls`](Self::batch_store_calls)).
        ///
        /// ```
        /// # use idempotask::{MemoryStore, Task};
        /// # use idempotask_kafka::{Idempotent, KeyFrom};
        /// let own = Idempotent::new(Task::new("order_charge"), KeyFrom::RecordKey).store(MemoryStore::new());
        /// # let _ = own;
        /// ```
        fn store(store: impl Store);

        /// Whether the calls to a store that batches natively go through a
        /// [`BatchingStore`](idempotask::store::BatchingStore) (default on): off, each
        /// record's `begin` and `finish` reach the store on their own.
        ///
        /// ```
        /// # use idempotask::Task;
        /// # use idempotask_kafka::{Idempotent, KeyFrom};
        /// let one_by_one = Idempotent::new(Task::new("order_charge"), KeyFrom::RecordKey).batch_store_calls(false);
        /// # let _ = one_by_one;
        /// ```
        fn batch_store_calls(batch: bool);

        /// Checks that a key comes back with the same payload: a record whose key was used
        /// with another payload gets [`Error::KeyReuse`](idempotask::Error::KeyReuse) and goes
        /// to the dead-letter topic, and the first payload's stored result stays (off by
        /// default; it hashes each payload).
        ///
        /// ```
        /// # use idempotask::Task;
        /// # use idempotask_kafka::{Idempotent, KeyFrom};
        /// let checked = Idempotent::new(Task::new("order_charge"), KeyFrom::RecordKey).fingerprint_payload(true);
        /// # let _ = checked;
        /// ```
        fn fingerprint_payload(on: bool);

        /// How long a failed record waits before it runs again, in this consumer: the
        /// backoff's delay for its failure count, 1 for its first (default
        /// [`DEFAULT_FAILURE_BACKOFF`]; at least 10 ms). Its partition's commit waits with it.
        ///
        /// ```
        /// # use std::time::Duration;
        /// # use idempotask::{Backoff, Task};
        /// # use idempotask_kafka::{Idempotent, KeyFrom};
        /// let gentle = Idempotent::new(Task::new("order_charge"), KeyFrom::RecordKey)
        ///     .failure_backoff(Backoff::new(Duration::from_secs(1), Duration::from_secs(20)));
        /// # let _ = gentle;
        /// ```
        fn failure_backoff(backoff: Backoff);

        /// How many body failures (an `Err` or a panic) a record may have before it goes to
        /// the dead-letter topic instead of running again (default [`DEFAULT_MAX_FAILURES`];
        /// at least 1). The count lives in the consumer: a record whose consumer dies starts
        /// again from 0 on the next one. A busy key or a store error does not count.
        ///
        /// ```
        /// # use idempotask::Task;
        /// # use idempotask_kafka::{Idempotent, KeyFrom};
        /// let strict = Idempotent::new(Task::new("order_charge"), KeyFrom::RecordKey).max_failures(2);
        /// # let _ = strict;
        /// ```
        fn max_failures(failures: u32);
    }

    /// How long a record waits whose store call failed (or that found no store, or a misused
    /// task), and a dead-letter copy the broker did not acknowledge: the backoff's delay for
    /// its count (default [`DEFAULT_STORE_BACKOFF`]; at least 10 ms). A store that is down
    /// never lets a record's offset be committed.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use idempotask::{Backoff, Task};
    /// # use idempotask_kafka::{Idempotent, KeyFrom};
    /// let patient = Idempotent::new(Task::new("order_charge"), KeyFrom::RecordKey)
    ///     .store_backoff(Backoff::new(Duration::from_millis(500), Duration::from_secs(20)));
    /// # let _ = patient;
    /// ```
    #[must_use]
    pub fn store_backoff(mut self, backoff: Backoff) -> Self {
        self.settings = self.settings.store_backoff(backoff);
        self.store_backoff = backoff;
        self
    }

    /// The topic records go to when no delivery can succeed (default `<topic>.dead`, for each
    /// record's own topic). It must exist: the consumer checks at the start.
    ///
    /// ```
    /// # use idempotask::Task;
    /// # use idempotask_kafka::{Idempotent, KeyFrom};
    /// let named = Idempotent::new(Task::new("order_charge"), KeyFrom::RecordKey).dead_letter_topic("orders.failed");
    /// # let _ = named;
    /// ```
    #[must_use]
    pub fn dead_letter_topic(mut self, topic: impl Into<String>) -> Self {
        self.dead_letter_topic = Some(topic.into());
        self
    }

    /// How many records of one partition run at the same time (default
    /// [`DEFAULT_MAX_IN_FLIGHT`]; at least 1). The partition's further records wait in the
    /// consumer, in order, and start as running ones end (see
    /// [`max_waiting`](Self::max_waiting)). 1 runs each partition's records one after the
    /// other, in order.
    ///
    /// ```
    /// # use idempotask::Task;
    /// # use idempotask_kafka::{Idempotent, KeyFrom};
    /// let in_order = Idempotent::new(Task::new("order_charge"), KeyFrom::RecordKey).max_in_flight(1);
    /// # let _ = in_order;
    /// ```
    #[must_use]
    pub fn max_in_flight(mut self, records: usize) -> Self {
        self.max_in_flight = records.max(1);
        self
    }

    /// How many received records of one partition may wait for room (default
    /// [`DEFAULT_MAX_WAITING`]; at least 1). While a partition has that many waiting, the
    /// consumer stops polling, as a consumer that takes only what it can run does (librdkafka
    /// keeps what it fetched meanwhile). If the stall lasts half of `max.poll.interval.ms`,
    /// that partition is paused and polling goes on for the others, so that the member is not
    /// evicted; it resumes once half of its records have started.
    ///
    /// Why not pause at once: librdkafka drops a paused partition's fetched records and
    /// fetches them again on resume, a broker round trip (and its fetch wait) for each pause;
    /// paused at every record beyond `max_in_flight`, a partition moved at a few records a
    /// second. The waiting records are held in memory, at most this many per partition.
    ///
    /// ```
    /// # use idempotask::Task;
    /// # use idempotask_kafka::{Idempotent, KeyFrom};
    /// let bounded = Idempotent::new(Task::new("order_charge"), KeyFrom::RecordKey).max_waiting(256);
    /// # let _ = bounded;
    /// ```
    #[must_use]
    pub fn max_waiting(mut self, records: usize) -> Self {
        self.max_waiting = records.max(1);
        self
    }

    /// How long a rebalance that takes partitions away waits for their running records to end
    /// (default [`DEFAULT_REVOKE_WAIT`]). Those still running then are stopped (their locks
    /// released), their offsets committed up to the first of them, and the revoke completes:
    /// no body keeps running for a partition this consumer no longer owns. On a
    /// current-thread runtime the wait is skipped (the bodies cannot run while the rebalance
    /// holds the thread). [`KafkaConsumer::close`](crate::KafkaConsumer::close) waits as
    /// long for all running records, then stops them the same way: a close does not wait for
    /// a store that is down.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use idempotask::Task;
    /// # use idempotask_kafka::{Idempotent, KeyFrom};
    /// let quick = Idempotent::new(Task::new("order_charge"), KeyFrom::RecordKey).revoke_wait(Duration::from_secs(5));
    /// # let _ = quick;
    /// ```
    #[must_use]
    pub fn revoke_wait(mut self, wait: Duration) -> Self {
        self.revoke_wait = wait;
        self
    }

    /// How long a dead-letter copy may wait for the broker's acknowledgement before it is sent
    /// again (default [`DEFAULT_DEAD_LETTER_TIMEOUT`]). The record's offset is committed only
    /// after its copy is acknowledged.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use idempotask::Task;
    /// # use idempotask_kafka::{Idempotent, KeyFrom};
    /// let quick = Idempotent::new(Task::new("order_charge"), KeyFrom::RecordKey).dead_letter_timeout(Duration::from_secs(5));
    /// # let _ = quick;
    /// ```
    #[must_use]
    pub fn dead_letter_timeout(mut self, timeout: Duration) -> Self {
        self.dead_letter_timeout = timeout;
        self
    }

    /// The task every record runs through.
    ///
    /// ```
    /// # use idempotask::Task;
    /// # use idempotask_kafka::{Idempotent, KeyFrom};
    /// assert_eq!(Idempotent::new(Task::new("refund"), KeyFrom::Position).task().name(), "refund");
    /// ```
    pub fn task(&self) -> &Task {
        self.settings.task()
    }

    /// The dead-letter topic of records read from `topic`.
    pub(crate) fn dead_letter_topic_for(&self, topic: &str) -> String {
        self.dead_letter_topic
            .clone()
            .unwrap_or_else(|| format!("{topic}.dead"))
    }
}
