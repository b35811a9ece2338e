//! The consumer and its settings: [`Idempotent`], its builder methods, and the check of the
//! JetStream consumer's configuration against them.

use std::sync::Arc;
use std::time::Duration;

use crate::ConsumerProblem;
use crate::consumer_config::{self, CheckState, Expected};
use crate::defaults::{
    DEFAULT_ACK_WAIT, DEFAULT_FAILURE_BACKOFF, DEFAULT_MAX_FAILURES, DEFAULT_STORE_BACKOFF,
};
use crate::failures::{DEFAULT_FAILURE_BUCKET, DEFAULT_FAILURE_MEMORY, FailureCounts};
use crate::progress;
use async_nats::jetstream::{self, Message, consumer};
use idempotask::store::Store;
use idempotask::{Backoff, Task};
use idempotask_consumer::{ConsumerSettings, MIN_DELAY};

/// Runs JetStream messages through a [`Task`]: the key comes from each message through `K` (a
/// `Fn(&Message) -> Option<String>`, or [`MsgId`](crate::MsgId)).
///
/// See the [crate docs](crate) for what each outcome becomes and how the redelivery clocks
/// must agree.
///
/// ```
/// use std::time::Duration;
/// use idempotask::Task;
/// use idempotask_nats::{Idempotent, MsgId};
///
/// let charge_once = Idempotent::new(Task::new("order_charge"), MsgId)
///     .ack_wait(Duration::from_secs(9));
/// // A third of the shorter of AckWait (9 s) and the lock TTL (30 s by default).
/// assert_eq!(charge_once.progress_interval(), Duration::from_secs(3));
/// ```
pub struct Idempotent<K> {
    /// The task, the store and the backoffs, which every queue consumer has.
    pub(crate) settings: ConsumerSettings,
    pub(crate) key: Arc<K>,
    pub(crate) ack_wait: Duration,
    pub(crate) failures: Arc<FailureCounts>,
    pub(crate) consumer_check: Arc<CheckState>,
    pub(crate) progress: Arc<progress::Ticker>,
}

impl<K> Idempotent<K> {
    /// Messages run through `task`, keyed by `key`, for a consumer with JetStream's default
    /// `AckWait` ([`DEFAULT_ACK_WAIT`]).
    pub fn new(task: Task, key: K) -> Self {
        Self {
            settings: ConsumerSettings::new(task)
                .failure_backoff(DEFAULT_FAILURE_BACKOFF)
                .store_backoff(DEFAULT_STORE_BACKOFF)
                .max_failures(DEFAULT_MAX_FAILURES),
            key: Arc::new(key),
            ack_wait: DEFAULT_ACK_WAIT,
            failures: Arc::new(FailureCounts::new(
                DEFAULT_FAILURE_BUCKET.to_owned(),
                DEFAULT_FAILURE_MEMORY,
            )),
            consumer_check: Arc::new(CheckState::default()),
            progress: Arc::default(),
        }
    }

    idempotask_consumer::settings_setters! {
        /// Checks that a key comes back with the same payload: a message whose key was used with
        /// another payload gets [`Error::KeyReuse`](idempotask::Error::KeyReuse) and is terminated, and the first payload's
        /// stored result stays (off by default; it hashes each payload).
        ///
        /// Turn it on when the key is the producer's `Nats-Msg-Id`: a producer that reuses an id
        /// for a different message, outside the stream's duplicate window, is then caught instead
        /// of answered with the other message's result.
        ///
        /// ```
        /// use idempotask_nats::{Idempotent, MsgId};
        /// let checked = Idempotent::new(idempotask::Task::new("order_charge"), MsgId)
        ///     .fingerprint_payload(true);
        /// # let _ = checked;
        /// ```
        fn fingerprint_payload(on: bool);

        /// Uses `store` instead of the installed one.
        ///
        /// A store that batches natively (`RedisStore`) is wrapped in a
        /// [`BatchingStore`](idempotask::store::BatchingStore): the calls of the messages of a
        /// fetch that run at the same time reach it as one batch (one pipeline on
        /// `RedisStore`) instead of one round trip each ([`batch_store_calls`](Self::batch_store_calls)).
        fn store(store: impl Store);

        /// Whether the calls to a store that batches natively (`RedisStore`) go through a
        /// [`BatchingStore`](idempotask::store::BatchingStore) (default on): off, each
        /// message's `begin` and `finish` reach the store on their own.
        fn batch_store_calls(batch: bool);

        /// The delays of the nak that follows a body's failure (an `Err` or a panic): the
        /// backoff's delay for the message's failure count, 1 for its first (default
        /// [`DEFAULT_FAILURE_BACKOFF`]; at least 10 ms, as every nak delay). A dependency that keeps
        /// failing is not hammered by every consumer at once.
        ///
        /// ```
        /// use std::time::Duration;
        /// use idempotask::Backoff;
        /// use idempotask_nats::{Idempotent, MsgId};
        /// let charge_once = Idempotent::new(idempotask::Task::new("order_charge"), MsgId)
        ///     .failure_backoff(Backoff::new(Duration::from_millis(500), Duration::from_secs(30)))
        ///     .store_backoff(Backoff::new(Duration::from_secs(2), Duration::from_secs(60)).full_jitter(true));
        /// # let _ = charge_once;
        /// ```
        fn failure_backoff(backoff: Backoff);

        /// The failure of a message's body (an `Err` or a panic) on which the message is terminated
        /// instead of nak'd (default [`DEFAULT_MAX_FAILURES`]; at least 1), so that a message no
        /// delivery can succeed with does not loop forever under an unlimited `max_deliver`.
        ///
        /// Only the body's failures count: a delivery deferred for a busy key or a store error
        /// does not, so a store outage never uses up a message's tries. JetStream's `delivered`
        /// counts those deferrals too, so the count is kept apart, in a JetStream key-value bucket
        /// ([`failure_counts`](Self::failure_counts)): only a failing body on a redelivery reads it,
        /// and only a failing body writes it.
        ///
        /// **When the bucket cannot be used**, JetStream's `delivered` stands in for the count: a
        /// count that cannot be read (the bucket cannot be opened or created, the user may not read
        /// it) is taken as the deliveries before this one, and so is the count of a message whose
        /// last count could not be written (the user may not write, the bucket is full), on its
        /// next deliveries to this process, until a write of it succeeds. `delivered` is never
        /// below the body's failures, so such a message is terminated after at most `max_failures`
        /// runs of its body, sooner when deferred deliveries came between them: a poison message
        /// never loops for ever, at the cost of a message that was deferred being ended early. (A
        /// redelivery to another process, which has not seen the write fail, may run the body once
        /// more before that process falls back too.) The first fallback is logged at `WARN`, later
        /// ones at `DEBUG`; the first-message check and [`check_consumer`](Self::check_consumer)
        /// report such a bucket ([`ConsumerProblem::FailureBucketUnusable`]).
        fn max_failures(failures: u32);

        /// The delays of the nak of a message whose store call failed (or that found no store, or
        /// a misused task): the backoff's delay for the message's JetStream delivery count, 1 for
        /// its first (default [`DEFAULT_STORE_BACKOFF`]; at least 10 ms, as every nak delay).
        fn store_backoff(backoff: Backoff);
    }

    /// The consumer's `AckWait`, which progress acks must beat (default [`DEFAULT_ACK_WAIT`]).
    /// Declaring a longer one than the consumer has lets JetStream redeliver a message while
    /// its body still runs.
    #[must_use]
    pub fn ack_wait(mut self, ack_wait: Duration) -> Self {
        self.ack_wait = ack_wait;
        self
    }

    /// Where the failure counts of [`max_failures`](Self::max_failures) are kept: the
    /// JetStream key-value bucket `bucket` (default [`DEFAULT_FAILURE_BUCKET`]), each message's
    /// count for `max_age` after its last failure (default [`DEFAULT_FAILURE_MEMORY`]). The
    /// bucket is created with one value per key when it does not exist, by the first-message
    /// check or the first failure; the consumer's user then needs the right to create it, or an
    /// operator creates it beforehand. The user needs the right to read and write it either
    /// way. A count that outlives its `max_age` starts again from zero.
    ///
    /// ```
    /// use std::time::Duration;
    /// use idempotask_nats::{Idempotent, MsgId};
    /// let charge_once = Idempotent::new(idempotask::Task::new("order_charge"), MsgId)
    ///     .failure_counts("orders_failures", Duration::from_secs(3600));
    /// assert_eq!(charge_once.failure_bucket_name(), "orders_failures");
    /// ```
    #[must_use]
    pub fn failure_counts(mut self, bucket: impl Into<String>, max_age: Duration) -> Self {
        self.failures = Arc::new(FailureCounts::new(bucket.into(), max_age));
        self
    }

    /// The name of the bucket that counts body failures.
    pub fn failure_bucket_name(&self) -> &str {
        self.failures.bucket()
    }

    /// The task every message runs through.
    pub fn task(&self) -> &Task {
        self.settings.task()
    }

    /// How often a message being handled gets a progress ack: a third of the shorter of the
    /// declared `AckWait` and the task's lock TTL, at least 10 ms.
    pub fn progress_interval(&self) -> Duration {
        (self.ack_wait.min(self.task().settings().lock_ttl) / 3).max(MIN_DELAY)
    }

    /// The settings of a consumer that work against this task's lock: an `AckWait` shorter
    /// than the declared [`ack_wait`](Self::ack_wait) (the progress acks would come too late),
    /// or, for a consumer with a `backoff` list, which JetStream uses instead of `AckWait`, an
    /// entry shorter than it among those JetStream uses under `max_deliver`; and a limited
    /// `max_deliver` (deferred deliveries count against it).
    ///
    /// [`handle`](Self::handle) and [`process`](Self::process) read the consumer of the first
    /// message they get and log each of these once, at `WARN`, with the failure bucket's
    /// problem if it has one; call this, or [`check_consumer`](Self::check_consumer) to check
    /// the bucket too, to refuse such a consumer at start-up instead.
    ///
    /// ```
    /// use std::time::Duration;
    /// use async_nats::jetstream::consumer;
    /// use idempotask::Task;
    /// use idempotask_nats::{ConsumerProblem, Idempotent, MsgId};
    ///
    /// let charge_once = Idempotent::new(Task::new("order_charge").lock_ttl(Duration::from_secs(30)), MsgId)
    ///     .ack_wait(Duration::from_secs(60));
    /// let consumer = consumer::Config { ack_wait: Duration::from_secs(10), max_deliver: 3, ..Default::default() };
    /// let problems = charge_once.consumer_problems(&consumer);
    /// assert!(matches!(problems[0], ConsumerProblem::AckWaitShorterThanDeclared { .. }));
    /// assert!(matches!(problems[1], ConsumerProblem::MaxDeliverLimited { max_deliver: 3, .. }));
    /// // JetStream's defaults (AckWait 30 s, no limit) fit the integration's.
    /// assert!(Idempotent::new(Task::new("refund"), MsgId).consumer_problems(&consumer::Config::default()).is_empty());
    /// ```
    pub fn consumer_problems(&self, consumer: &consumer::Config) -> Vec<ConsumerProblem> {
        self.expected().problems(consumer)
    }

    /// What [`consumer_problems`](Self::consumer_problems) finds in `consumer`, and whether the
    /// failure bucket ([`failure_counts`](Self::failure_counts)) can be used: it is opened, or
    /// created when it does not exist, and written to as the first failing body would (a new
    /// key `idempotask_check.<time>` per check, which no message's count uses, kept for the
    /// bucket's `max_age`). A bucket that cannot be used is
    /// [`ConsumerProblem::FailureBucketUnusable`]: [`max_failures`](Self::max_failures) then
    /// counts JetStream's deliveries for the messages whose count it cannot read or write.
    /// This is the check that [`handle`](Self::handle) runs on the first message; call it at
    /// start-up to refuse a consumer or a bucket that does not fit.
    ///
    /// ```no_run
    /// use async_nats::jetstream;
    /// use idempotask::Task;
    /// use idempotask_nats::{Idempotent, MsgId};
    ///
    /// # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    /// let js = jetstream::new(async_nats::connect("nats://127.0.0.1:4222").await?);
    /// let mut consumer = js.get_consumer_from_stream::<jetstream::consumer::pull::Config, _, _>("charger", "ORDERS").await?;
    /// let charge_once = Idempotent::new(Task::new("order_charge"), MsgId);
    /// let problems = charge_once.check_consumer(&js, &consumer.info().await?.config).await;
    /// if !problems.is_empty() {
    ///     return Err(format!("the consumer does not fit: {problems:?}").into());
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn check_consumer(
        &self,
        context: &jetstream::Context,
        consumer: &consumer::Config,
    ) -> Vec<ConsumerProblem> {
        let mut problems = self.consumer_problems(consumer);
        problems.extend(consumer_config::bucket_problem(context, &self.failures).await);
        problems
    }

    fn expected(&self) -> Expected {
        Expected {
            declared_ack_wait: self.ack_wait,
        }
    }

    /// Until a check has completed: reads the message's consumer and probes the failure bucket
    /// in the background, and warns about their problems. A check that cannot read the consumer
    /// is left to a later message.
    pub(crate) fn check_consumer_once(&self, message: &Message) {
        if self.consumer_check.is_done() {
            return;
        }
        let (Ok(info), Ok(runtime)) = (message.info(), tokio::runtime::Handle::try_current())
        else {
            return;
        };
        let Some(claim) = self.consumer_check.start() else {
            return;
        };
        let expected = self.expected();
        let failures = Arc::clone(&self.failures);
        let context = message.context.clone();
        let (stream, consumer) = (info.stream.to_owned(), info.consumer.to_owned());
        runtime.spawn(async move {
            match expected
                .check(&context, &stream, &consumer, &failures)
                .await
            {
                Ok(problems) => {
                    for problem in problems {
                        tracing::warn!(stream, consumer, "{problem}");
                    }
                    claim.completed();
                }
                // Dropped, the claim lets a later message check again.
                Err(err) => tracing::debug!(
                    stream,
                    consumer,
                    error = %err,
                    "could not read the consumer's configuration to check it; a later message checks again"
                ),
            }
        });
    }
}

impl<K> Clone for Idempotent<K> {
    fn clone(&self) -> Self {
        Self {
            settings: self.settings.clone(),
            key: Arc::clone(&self.key),
            ack_wait: self.ack_wait,
            failures: Arc::clone(&self.failures),
            consumer_check: Arc::clone(&self.consumer_check),
            progress: Arc::clone(&self.progress),
        }
    }
}

impl<K> std::fmt::Debug for Idempotent<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Idempotent")
            .field("settings", &self.settings)
            .field("key", &std::any::type_name::<K>())
            .field("ack_wait", &self.ack_wait)
            .field("failure_bucket", &self.failures.bucket())
            .finish_non_exhaustive()
    }
}
