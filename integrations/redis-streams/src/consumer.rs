//! The consumer's settings: [`Idempotent`], its builder methods, and the defaults of a stream
//! consumer.

use std::sync::Arc;
use std::time::Duration;

use idempotask::store::Store;
use idempotask::{Backoff, Task};
use idempotask_consumer::ConsumerSettings;

use crate::EntryKey;

/// How long an entry may stay pending without a sign of life from its consumer before another
/// consumer of the group claims it (`XAUTOCLAIM`), by default.
pub const DEFAULT_CLAIM_IDLE: Duration = Duration::from_secs(60);
/// How many deliveries of an entry may run before the next one is dead-lettered, by default.
pub const DEFAULT_MAX_DELIVERIES: u32 = 5;
/// How many entries one read (`XREADGROUP … COUNT`) asks for, by default.
pub const DEFAULT_BATCH_SIZE: usize = 16;
/// How long a read waits for new entries (`XREADGROUP … BLOCK`), by default.
pub const DEFAULT_BLOCK: Duration = Duration::from_secs(1);

// The defaults of every queue consumer, which a stream takes as they are.
pub use idempotask_consumer::{
    DEFAULT_FAILURE_BACKOFF, DEFAULT_MAX_FAILURES, DEFAULT_STORE_BACKOFF,
};

/// Runs each stream entry through a [`Task`], keyed by `K` ([`Field`](crate::Field),
/// [`EntryId`](crate::EntryId) or a `Fn(&Entry) -> Option<String>`): the settings of a
/// consumer, which [`consume`](Self::consume) joins to a consumer group.
///
/// ```
/// use std::time::Duration;
/// use idempotask::{MemoryStore, RetryPolicy, Task};
/// use idempotask_redis_streams::{Field, Idempotent};
///
/// let charge_once = Idempotent::new(Task::new("order_charge").retry(RetryPolicy::no_wait()), Field::new("order_id"))
///     .store(MemoryStore::new())
///     .claim_idle(Duration::from_secs(120))
///     .max_deliveries(3)
///     .dead_letter_stream("orders:failed")
///     .batch_size(32);
/// assert_eq!(charge_once.claim_idle_time(), Duration::from_secs(120));
/// ```
pub struct Idempotent<K> {
    pub(crate) settings: ConsumerSettings,
    pub(crate) key: Arc<K>,
    pub(crate) claim_idle: Duration,
    pub(crate) max_deliveries: u32,
    pub(crate) dead_letter_stream: Option<String>,
    pub(crate) batch_size: usize,
    pub(crate) block: Duration,
}

impl<K: EntryKey> Idempotent<K> {
    /// Entries run through `task`, keyed by `key`, with the defaults: the installed store,
    /// [`DEFAULT_FAILURE_BACKOFF`], [`DEFAULT_STORE_BACKOFF`], [`DEFAULT_MAX_FAILURES`],
    /// [`DEFAULT_CLAIM_IDLE`], [`DEFAULT_MAX_DELIVERIES`], [`DEFAULT_BATCH_SIZE`],
    /// [`DEFAULT_BLOCK`] and the dead-letter stream `<stream>:dead`.
    pub fn new(task: Task, key: K) -> Self {
        Self {
            settings: ConsumerSettings::new(task),
            key: Arc::new(key),
            claim_idle: DEFAULT_CLAIM_IDLE,
            max_deliveries: DEFAULT_MAX_DELIVERIES,
            dead_letter_stream: None,
            batch_size: DEFAULT_BATCH_SIZE,
            block: DEFAULT_BLOCK,
        }
    }
}

impl<K> Idempotent<K> {
    idempotask_consumer::settings_setters! {
        /// Uses `store` instead of the installed one.
        ///
        /// A batch's entries run at the same time; a store that batches natively
        /// (`RedisStore`) is wrapped in a [`BatchingStore`](idempotask::store::BatchingStore),
        /// so the `begin`s and `finish`es of one read batch reach Redis as one pipeline each
        /// instead of one round trip per entry ([`batch_store_calls`](Self::batch_store_calls)).
        ///
        /// ```no_run
        /// use idempotask::Task;
        /// use idempotask_redis::RedisStore;
        /// use idempotask_redis_streams::{Field, Idempotent};
        ///
        /// # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
        /// let store = RedisStore::connect("redis://127.0.0.1:6379").await?;
        /// let charge_once =
        ///     Idempotent::new(Task::new("order_charge"), Field::new("order_id")).store(store);
        /// # let _ = charge_once; Ok(()) }
        /// ```
        fn store(store: impl Store);

        /// Whether the calls to a store that batches natively (`RedisStore`) go through a
        /// [`BatchingStore`](idempotask::store::BatchingStore) (default on): off, each
        /// message's `begin` and `finish` reach the store on their own.
        fn batch_store_calls(batch: bool);

        /// Checks that a key comes back with the same entry: an entry whose key was used with
        /// other fields (all of them, names and values, in their order) gets
        /// [`Error::KeyReuse`](idempotask::Error::KeyReuse) and is dead-lettered, and the first
        /// entry's stored result stays (off by default; it hashes each entry).
        ///
        /// ```
        /// # use idempotask::Task;
        /// # use idempotask_redis_streams::{Field, Idempotent};
        /// let checked = Idempotent::new(Task::new("order_charge"), Field::new("order_id")).fingerprint_payload(true);
        /// # let _ = checked;
        /// ```
        fn fingerprint_payload(on: bool);

        /// How long a failed entry waits before it runs again: the backoff's delay for its
        /// failure count, 1 for its first (default [`DEFAULT_FAILURE_BACKOFF`]; at least 10 ms).
        /// Keep its bound below [`claim_idle`](Self::claim_idle): the entry waits pending, and
        /// another consumer claims it once it has been idle that long.
        ///
        /// ```
        /// # use std::time::Duration;
        /// # use idempotask::{Backoff, Task};
        /// # use idempotask_redis_streams::{Field, Idempotent};
        /// let gentle = Idempotent::new(Task::new("order_charge"), Field::new("order_id"))
        ///     .failure_backoff(Backoff::new(Duration::from_secs(1), Duration::from_secs(20)));
        /// # let _ = gentle;
        /// ```
        fn failure_backoff(backoff: Backoff);

        /// How long an entry waits whose store call failed (or that found no store, or a misused
        /// task): the backoff's delay for its deferral count in this process (default
        /// [`DEFAULT_STORE_BACKOFF`]; at least 10 ms). Keep its bound below
        /// [`claim_idle`](Self::claim_idle), as the failure backoff's.
        ///
        /// ```
        /// # use std::time::Duration;
        /// # use idempotask::{Backoff, Task};
        /// # use idempotask_redis_streams::{Field, Idempotent};
        /// let patient = Idempotent::new(Task::new("order_charge"), Field::new("order_id"))
        ///     .store_backoff(Backoff::new(Duration::from_millis(500), Duration::from_secs(20)).full_jitter(true));
        /// # let _ = patient;
        /// ```
        fn store_backoff(backoff: Backoff);

        /// How many body failures (an `Err` or a panic) an entry may have before it is
        /// dead-lettered instead of retried (default [`DEFAULT_MAX_FAILURES`]; at least 1). The
        /// count is kept in Redis (see the crate docs), so it survives a consumer's crash; a busy
        /// key or a store error does not count.
        ///
        /// ```
        /// # use idempotask::Task;
        /// # use idempotask_redis_streams::{Field, Idempotent};
        /// let strict = Idempotent::new(Task::new("order_charge"), Field::new("order_id")).max_failures(2);
        /// # let _ = strict;
        /// ```
        fn max_failures(failures: u32);
    }

    /// How long an entry may stay pending with no sign of life from its consumer before
    /// another consumer of the group claims it with `XAUTOCLAIM` (default
    /// [`DEFAULT_CLAIM_IDLE`]). A consumer refreshes its entries (running or waiting for a
    /// retry) every third of it, so only the entries of a consumer that stopped are claimed.
    /// [`consume`](Self::consume) refuses a time shorter than the task's lock TTL: a claim
    /// would then come while a crashed consumer's lock still holds the key.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use idempotask::Task;
    /// # use idempotask_redis_streams::{Field, Idempotent};
    /// let quick = Idempotent::new(Task::new("order_charge").lock_ttl(Duration::from_secs(10)), Field::new("order_id"))
    ///     .claim_idle(Duration::from_secs(15));
    /// # let _ = quick;
    /// ```
    #[must_use]
    pub fn claim_idle(mut self, idle: Duration) -> Self {
        self.claim_idle = idle;
        self
    }

    /// How many deliveries of an entry may run (default [`DEFAULT_MAX_DELIVERIES`]; at least
    /// 1): a delivery beyond it is dead-lettered with
    /// [`Rejection::TooManyDeliveries`](crate::Rejection::TooManyDeliveries) without running.
    /// The count is the group's delivery counter (`XPENDING`): 1 for the first read, one more
    /// per claim from a consumer that stopped answering; retries in the consumer that holds the
    /// entry do not count. It ends an entry that kills its consumer every time (which no
    /// `max_failures` can count, the process being gone before it records anything).
    ///
    /// ```
    /// # use idempotask::Task;
    /// # use idempotask_redis_streams::{Field, Idempotent};
    /// let bounded = Idempotent::new(Task::new("order_charge"), Field::new("order_id")).max_deliveries(3);
    /// # let _ = bounded;
    /// ```
    #[must_use]
    pub fn max_deliveries(mut self, deliveries: u32) -> Self {
        self.max_deliveries = deliveries.max(1);
        self
    }

    /// The stream dead-lettered entries are added to (default `<stream>:dead`).
    ///
    /// ```
    /// # use idempotask::Task;
    /// # use idempotask_redis_streams::{Field, Idempotent};
    /// let named = Idempotent::new(Task::new("order_charge"), Field::new("order_id")).dead_letter_stream("orders:failed");
    /// # let _ = named;
    /// ```
    #[must_use]
    pub fn dead_letter_stream(mut self, stream: impl Into<String>) -> Self {
        self.dead_letter_stream = Some(stream.into());
        self
    }

    /// How many entries one read asks for (default [`DEFAULT_BATCH_SIZE`]; at least 1): the
    /// entries of one batch run at the same time, and are settled with one transaction.
    ///
    /// ```
    /// # use idempotask::Task;
    /// # use idempotask_redis_streams::{Field, Idempotent};
    /// let one_by_one = Idempotent::new(Task::new("order_charge"), Field::new("order_id")).batch_size(1);
    /// # let _ = one_by_one;
    /// ```
    #[must_use]
    pub fn batch_size(mut self, entries: usize) -> Self {
        self.batch_size = entries.max(1);
        self
    }

    /// How long a read waits for new entries when none is there (default [`DEFAULT_BLOCK`];
    /// at least 1 ms): [`next_batch`](crate::StreamConsumer::next_batch) answers an empty
    /// batch after it.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use idempotask::Task;
    /// # use idempotask_redis_streams::{Field, Idempotent};
    /// let patient = Idempotent::new(Task::new("order_charge"), Field::new("order_id")).block(Duration::from_secs(5));
    /// # let _ = patient;
    /// ```
    #[must_use]
    pub fn block(mut self, wait: Duration) -> Self {
        self.block = wait.max(Duration::from_millis(1));
        self
    }

    /// The task every entry runs through.
    ///
    /// ```
    /// # use idempotask::Task;
    /// # use idempotask_redis_streams::{EntryId, Idempotent};
    /// assert_eq!(Idempotent::new(Task::new("refund"), EntryId).task().name(), "refund");
    /// ```
    pub fn task(&self) -> &Task {
        self.settings.task()
    }

    /// The configured [`claim_idle`](Self::claim_idle) time.
    ///
    /// ```
    /// # use idempotask::Task;
    /// # use idempotask_redis_streams::{DEFAULT_CLAIM_IDLE, EntryId, Idempotent};
    /// assert_eq!(Idempotent::new(Task::new("refund"), EntryId).claim_idle_time(), DEFAULT_CLAIM_IDLE);
    /// ```
    pub fn claim_idle_time(&self) -> Duration {
        self.claim_idle
    }
}

impl<K> Clone for Idempotent<K> {
    fn clone(&self) -> Self {
        Self {
            settings: self.settings.clone(),
            key: Arc::clone(&self.key),
            claim_idle: self.claim_idle,
            max_deliveries: self.max_deliveries,
            dead_letter_stream: self.dead_letter_stream.clone(),
            batch_size: self.batch_size,
            block: self.block,
        }
    }
}

impl<K> std::fmt::Debug for Idempotent<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Idempotent")
            .field("settings", &self.settings)
            .field("key", &std::any::type_name::<K>())
            .field("claim_idle", &self.claim_idle)
            .field("max_deliveries", &self.max_deliveries)
            .field("dead_letter_stream", &self.dead_letter_stream)
            .field("batch_size", &self.batch_size)
            .field("block", &self.block)
            .finish()
    }
}
