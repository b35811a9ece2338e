//! The consumer's settings: [`Idempotent`], its builder methods, and the defaults of an SQS
//! consumer.

use std::sync::Arc;
use std::time::Duration;

use idempotask::store::Store;
use idempotask::{Backoff, Task};
use idempotask_consumer::ConsumerSettings;

/// How many messages one `ReceiveMessage` asks for, by default: SQS's most.
///
/// ```
/// assert_eq!(idempotask_sqs::DEFAULT_BATCH_SIZE, 10);
/// ```
pub const DEFAULT_BATCH_SIZE: u8 = 10;
/// How long a `ReceiveMessage` waits for a message when none is there (long polling), by
/// default.
///
/// ```
/// assert_eq!(idempotask_sqs::DEFAULT_WAIT_TIME, std::time::Duration::from_secs(10));
/// ```
pub const DEFAULT_WAIT_TIME: Duration = Duration::from_secs(10);
/// The share of the queue's visibility timeout after which the messages of a batch whose
/// bodies still run get a fresh visibility timeout, by default: a half.
///
/// ```
/// assert!((idempotask_sqs::DEFAULT_EXTEND_AT - 0.5).abs() < f64::EPSILON);
/// ```
pub const DEFAULT_EXTEND_AT: f64 = 0.5;

// The defaults of every queue consumer, which SQS takes as they are (its delays are rounded
// up to whole seconds).
pub use idempotask_consumer::{
    DEFAULT_FAILURE_BACKOFF, DEFAULT_MAX_FAILURES, DEFAULT_STORE_BACKOFF,
};

/// Runs each SQS message through a [`Task`], keyed by `K` ([`Attribute`](crate::Attribute),
/// [`MessageId`](crate::MessageId) or a `Fn(&Message) -> Option<String>`): the settings of a
/// consumer, which [`consume`](Self::consume) binds to a queue.
///
/// ```
/// use std::time::Duration;
/// use idempotask::{MemoryStore, RetryPolicy, Task};
/// use idempotask_sqs::{Attribute, Idempotent};
///
/// let charge_once = Idempotent::new(Task::new("order_charge").retry(RetryPolicy::no_wait()), Attribute::new("order_id"))
///     .store(MemoryStore::new())
///     .batch_size(5)
///     .wait_time(Duration::from_secs(20))
///     .extend_at(0.3)
///     .max_failures(3);
/// assert_eq!(charge_once.task().name(), "order_charge");
/// ```
pub struct Idempotent<K> {
    pub(crate) settings: ConsumerSettings,
    pub(crate) key: Arc<K>,
    pub(crate) batch_size: u8,
    pub(crate) wait_time: Duration,
    pub(crate) extend_at: f64,
}

impl<K> Idempotent<K> {
    /// Messages run through `task`, keyed by `key`, with the defaults: the installed store,
    /// [`DEFAULT_FAILURE_BACKOFF`], [`DEFAULT_STORE_BACKOFF`], [`DEFAULT_MAX_FAILURES`],
    /// [`DEFAULT_BATCH_SIZE`], [`DEFAULT_WAIT_TIME`] and [`DEFAULT_EXTEND_AT`].
    ///
    /// ```
    /// use idempotask::Task;
    /// use idempotask_sqs::{Idempotent, MessageId};
    /// let refund_once = Idempotent::new(Task::new("refund"), MessageId);
    /// assert_eq!(refund_once.task().name(), "refund");
    /// ```
    pub fn new(task: Task, key: K) -> Self {
        Self {
            settings: ConsumerSettings::new(task),
            key: Arc::new(key),
            batch_size: DEFAULT_BATCH_SIZE,
            wait_time: DEFAULT_WAIT_TIME,
            extend_at: DEFAULT_EXTEND_AT,
        }
    }

    idempotask_consumer::settings_setters! {
        /// Uses `store` instead of the installed one.
        ///
        /// The messages of one receive run at the same time (a FIFO group's one after the
        /// other); a store that batches natively (`RedisStore`) is wrapped in a
        /// [`BatchingStore`](idempotask::store::BatchingStore), so their `begin`s and
        /// `finish`es reach Redis as one pipeline each instead of one round trip per message
        /// ([`batch_store_calls`](Self::batch_store_calls)).
        ///
        /// ```
        /// use idempotask::{MemoryStore, Task};
        /// use idempotask_sqs::{Attribute, Idempotent};
        ///
        /// let charge_once = Idempotent::new(Task::new("order_charge"), Attribute::new("order_id"))
        ///     .store(MemoryStore::new());
        /// # let _ = charge_once;
        /// ```
        fn store(store: impl Store);

        /// Whether the calls to a store that batches natively (`RedisStore`) go through a
        /// [`BatchingStore`](idempotask::store::BatchingStore) (default on): off, each
        /// message's `begin` and `finish` reach the store on their own.
        fn batch_store_calls(batch: bool);

        /// Checks that a key comes back with the same message: a message whose key was used
        /// with another body or other attributes gets
        /// [`Error::KeyReuse`](idempotask::Error::KeyReuse) and is rejected, and the first
        /// message's stored result stays (off by default; it hashes each message).
        ///
        /// ```
        /// # use idempotask::Task;
        /// # use idempotask_sqs::{Attribute, Idempotent};
        /// let checked = Idempotent::new(Task::new("order_charge"), Attribute::new("order_id")).fingerprint_payload(true);
        /// # let _ = checked;
        /// ```
        fn fingerprint_payload(on: bool);

        /// How long a failed message stays invisible before SQS hands it out again: the
        /// backoff's delay for its failure count, rounded up to whole seconds (default
        /// [`DEFAULT_FAILURE_BACKOFF`], so 1 s for the first failures; at most 12 hours, SQS's
        /// limit).
        ///
        /// ```
        /// # use std::time::Duration;
        /// # use idempotask::{Backoff, Task};
        /// # use idempotask_sqs::{Attribute, Idempotent};
        /// let gentle = Idempotent::new(Task::new("order_charge"), Attribute::new("order_id"))
        ///     .failure_backoff(Backoff::new(Duration::from_secs(5), Duration::from_secs(300)));
        /// # let _ = gentle;
        /// ```
        fn failure_backoff(backoff: Backoff);

        /// How long a message whose store call failed (or that found no store, or a misused
        /// task) stays invisible: the backoff's delay for its deferral count, rounded up to
        /// whole seconds (default [`DEFAULT_STORE_BACKOFF`]). Each such receive counts
        /// towards the redrive policy's `maxReceiveCount`: keep the backoff's bound times
        /// that count above the store outage the queue must ride out.
        ///
        /// ```
        /// # use std::time::Duration;
        /// # use idempotask::{Backoff, Task};
        /// # use idempotask_sqs::{Attribute, Idempotent};
        /// let patient = Idempotent::new(Task::new("order_charge"), Attribute::new("order_id"))
        ///     .store_backoff(Backoff::new(Duration::from_secs(2), Duration::from_secs(600)).full_jitter(true));
        /// # let _ = patient;
        /// ```
        fn store_backoff(backoff: Backoff);

        /// The body failure on which a message is rejected (left to the redrive policy)
        /// instead of retried (default [`DEFAULT_MAX_FAILURES`]; at least 1). SQS counts
        /// receives, not failures: a message's failures before this receive are its receives
        /// before it, deferrals included, so a message ends early rather than late. Set the
        /// queue's `maxReceiveCount` to the same number: the receive after the last failure
        /// then moves the message to the dead-letter queue.
        ///
        /// ```
        /// # use idempotask::Task;
        /// # use idempotask_sqs::{Attribute, Idempotent};
        /// let strict = Idempotent::new(Task::new("order_charge"), Attribute::new("order_id")).max_failures(3);
        /// # let _ = strict;
        /// ```
        fn max_failures(failures: u32);
    }

    /// How many messages one `ReceiveMessage` asks for (default [`DEFAULT_BATCH_SIZE`]; 1 to
    /// 10, SQS's range). The messages of one receive run at the same time and are settled
    /// together: one `DeleteMessageBatch`, one `ChangeMessageVisibilityBatch`.
    ///
    /// ```
    /// # use idempotask::Task;
    /// # use idempotask_sqs::{Attribute, Idempotent};
    /// let one_by_one = Idempotent::new(Task::new("order_charge"), Attribute::new("order_id")).batch_size(1);
    /// # let _ = one_by_one;
    /// ```
    #[must_use]
    pub fn batch_size(mut self, messages: u8) -> Self {
        self.batch_size = messages.clamp(1, 10);
        self
    }

    /// How long a `ReceiveMessage` waits for messages when none is there (long polling;
    /// default [`DEFAULT_WAIT_TIME`]; whole seconds, at most 20, SQS's limit):
    /// [`next_batch`](crate::SqsConsumer::next_batch) answers an empty batch after it.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use idempotask::Task;
    /// # use idempotask_sqs::{Attribute, Idempotent};
    /// let patient = Idempotent::new(Task::new("order_charge"), Attribute::new("order_id")).wait_time(Duration::from_secs(20));
    /// # let _ = patient;
    /// ```
    #[must_use]
    pub fn wait_time(mut self, wait: Duration) -> Self {
        self.wait_time = wait.min(Duration::from_secs(20));
        self
    }

    /// The share of the queue's visibility timeout after which, and then every such share,
    /// the messages of a batch still running get a fresh visibility timeout
    /// (`ChangeMessageVisibilityBatch`), so that SQS does not hand them to another consumer
    /// while their bodies run (default [`DEFAULT_EXTEND_AT`]; taken between 0.1 and 0.9).
    ///
    /// ```
    /// # use idempotask::Task;
    /// # use idempotask_sqs::{Attribute, Idempotent};
    /// let early = Idempotent::new(Task::new("order_charge"), Attribute::new("order_id")).extend_at(0.25);
    /// # let _ = early;
    /// ```
    #[must_use]
    pub fn extend_at(mut self, share: f64) -> Self {
        self.extend_at = if share.is_nan() {
            DEFAULT_EXTEND_AT
        } else {
            share.clamp(0.1, 0.9)
        };
        self
    }

    /// The task every message runs through.
    ///
    /// ```
    /// # use idempotask::Task;
    /// # use idempotask_sqs::{Idempotent, MessageId};
    /// assert_eq!(Idempotent::new(Task::new("refund"), MessageId).task().name(), "refund");
    /// ```
    pub fn task(&self) -> &Task {
        self.settings.task()
    }
}

impl<K> Clone for Idempotent<K> {
    fn clone(&self) -> Self {
        Self {
            settings: self.settings.clone(),
            key: Arc::clone(&self.key),
            batch_size: self.batch_size,
            wait_time: self.wait_time,
            extend_at: self.extend_at,
        }
    }
}

impl<K> std::fmt::Debug for Idempotent<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Idempotent")
            .field("settings", &self.settings)
            .field("key", &std::any::type_name::<K>())
            .field("batch_size", &self.batch_size)
            .field("wait_time", &self.wait_time)
            .field("extend_at", &self.extend_at)
            .finish()
    }
}
