//! Consume [NATS JetStream](https://docs.nats.io/nats-concepts/jetstream) messages through an
//! idempotask [`Task`]: each message's work at most once per key, its `Ok` value stored and
//! handed to every redelivery, and the message acked, nak'd with a delay or terminated by what
//! happened.
//!
//! JetStream delivers at least once: a message whose ack does not arrive within the consumer's
//! `AckWait` (a worker killed, a connection lost, an ack dropped) is delivered again, and a
//! producer that retries a publish after the stream's duplicate window publishes it twice.
//! [`Idempotent::handle`] runs the work under the task's lock and completion marker, so a
//! redelivery whose work is done is acked with the stored value instead of doing it again.
//!
//! ```no_run
//! use async_nats::jetstream::{self, consumer::pull};
//! use idempotask::{RetryPolicy, Task};
//! use idempotask_nats::{Idempotent, MsgId};
//! use futures_util::StreamExt;
//! use std::time::Duration;
//!
//! static CHARGE: Task = Task::new("order_charge").retry(RetryPolicy::no_wait()).renew(true);
//!
//! async fn charge(payload: &[u8]) -> Result<String, std::io::Error> {
//!     Ok(format!("ch_{}", payload.len()))
//! }
//!
//! # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! # let store = idempotask::MemoryStore::new();
//! idempotask::install(store); // idempotask_redis::RedisStore::connect(url).await? in production
//! let client = async_nats::connect("nats://127.0.0.1:4222").await?;
//! let stream = jetstream::new(client).get_stream("ORDERS").await?;
//! let ack_wait = Duration::from_secs(30);
//! let consumer = stream
//!     .get_or_create_consumer("charger", pull::Config {
//!         durable_name: Some("charger".into()),
//!         ack_wait,
//!         ..Default::default()
//!     })
//!     .await?;
//!
//! let charge_once = Idempotent::new(CHARGE.clone(), MsgId).ack_wait(ack_wait);
//! let mut messages = consumer.messages().await?;
//! while let Some(message) = messages.next().await {
//!     let message = message?;
//!     let handled = charge_once.handle(&message, charge(&message.payload)).await?;
//!     println!("{:?}", handled.ack_kind());
//! }
//! # Ok(()) }
//! ```
//!
//! # Behaviour
//! Every setting of the [`Task`] applies (lock TTL, result TTL, lock renewal, retry policy, key
//! logging); the store is the installed one unless [`Idempotent::store`] names another.
//!
//! | the call ends with | [`Handled`] | JetStream gets |
//! | --- | --- | --- |
//! | the body's `Ok`, stored ([`Outcome::Executed`](idempotask::Outcome)) | `Acked` | `+ACK` |
//! | a stored value: a duplicate, the body did not run (`Outcome::Replayed`) | `Acked` | `+ACK` |
//! | the body's `Ok`, but its lock expired first or its marker could not be written (`LockLost`, `MarkerNotWritten`) | `Acked` | `+ACK`: the side effect happened; running it again would not undo it |
//! | the body's `Err`, or a panic in it ([`BodyFailure`]): the lock is released, nothing is stored | `Failed` | `-NAK` with a backoff that doubles per failure ([`failure_backoff`](Idempotent::failure_backoff), [`DEFAULT_FAILURE_BACKOFF`]: 1 s up to 60 s): the queue's retry runs the body again |
//! | the body's [`max_failures`](Idempotent::max_failures)-th failure (5 by default; deferred deliveries do not count, unless the failure bucket cannot be used) | `GaveUp` | `+TERM`: no more deliveries |
//! | the key is busy after the task's [`RetryPolicy`](idempotask::RetryPolicy) ([`Error::Contended`]) | `Deferred` | `-NAK` with the holder's remaining lock time as the delay (the lock TTL when the store did not say); nothing ran |
//! | the store failed ([`Error::Store`]) or none is installed | `Deferred` | `-NAK` with a bounded backoff ([`store_backoff`](Idempotent::store_backoff), [`DEFAULT_STORE_BACKOFF`]: 1 s up to 60 s); nothing ran, or the lock is released |
//! | the program misuses the task (`Reentered`, `TaskNameTaken`, `NoRuntime`) | `Deferred` | `-NAK` with the store's backoff, and an error log: the deploy is wrong, not the message, which waits for the fixed one |
//! | the key cannot be used ([`MissingKey`], [`Error::InvalidKey`], [`Error::KeyReuse`], [`Error::Codec`], [`Error::MarkerKeyMismatch`]) | `Terminated` | `+TERM`: no redelivery can succeed; JetStream stops delivering it and publishes a `$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED.<stream>.<consumer>` advisory |
//! | the unit is in doubt and the task holds such units ([`Error::InDoubt`], [`InDoubt::Hold`](idempotask::InDoubt::Hold)): an earlier delivery's lock ran out without a release or a result | `Terminated(Rejection::InDoubt)` | `+TERM` with the error's text as its reason, never an ack and never a nak: every delivery would be held until an operator resolves the unit (`idempotask resolve`: records a result or frees it); then re-drive the message from the stream, and it replays or runs. Nothing ran |
//!
//! Every nak asks for a delay of at least 10 ms, so no outcome has JetStream hand the message
//! straight back to a spinning worker. A message is never run without its key: a key function
//! that finds none, and [`MsgId`] on a message published without a `Nats-Msg-Id`, end in
//! `+TERM`.
//!
//! **A `+TERM` says why** ([`Handled::term_reason`]): nats-server 2.10.4 and later put the
//! reason in the `MSG_TERMINATED` advisory (its `reason` member), so whoever reads the
//! dead-letter path sees, say, that a message's unit is in doubt and what to resolve. An older
//! server takes a `+TERM` followed by anything for no acknowledgement and would deliver the
//! message again after `AckWait`, so [`handle`](Idempotent::handle) sends the reason only to a
//! server that announces 2.10.4 or later, and a bare `+TERM` to the others (the reason is then
//! in the [`Handled`] value alone). With [`process`](Idempotent::process), send it the same way
//! yourself.
//!
//! **`+TERM` is a dead-letter path only if something keeps the message.** The `MSG_TERMINATED`
//! advisory names the stream sequence but carries no payload, and on a stream with `WorkQueue`
//! or `Interest` retention the terminated message is removed. Use `Limits` retention (the
//! message stays in the stream, readable by its sequence from the advisory), or subscribe to
//! the advisory and republish the message to a dead-letter subject before it goes.
//!
//! **Acknowledgements are queued, not confirmed.** [`handle`](Idempotent::handle) publishes the
//! ack on the connection and returns; an [`AckError`] means it could not even be queued. An ack
//! lost with a dropped connection goes unnoticed, and JetStream delivers the message again after
//! `AckWait` (the redelivery is replayed). To wait until JetStream has it, use
//! [`process`](Idempotent::process) and send [`Handled::ack_kind`] with `double_ack_with`.
//!
//! # Redelivery clocks: `AckWait` against `lock_ttl`
//! From the moment [`handle`](Idempotent::handle) is called until the message is acked, a
//! progress ack (`+WPI`) goes to JetStream every third of the shorter of the consumer's
//! `AckWait` (declare it with [`Idempotent::ack_wait`]; JetStream's default is 30 s) and the
//! task's lock TTL: the cadence at which [`Task::renew`] renews the lock
//! ([`Idempotent::progress_interval`]). The acks run as a task of their own, so a body that
//! blocks its thread does not stop them (on a multi-threaded runtime), and they follow the
//! lock: once the body's lock is lost or its TTL has passed without a renewal, they stop. So:
//!
//! - **While a worker runs a message under its lock, JetStream does not redeliver it**, however
//!   long the body takes, as long as the declared `ack_wait` is no longer than the consumer's
//!   real one. A body that outlives its lock (no [`Task::renew`], or a renewal that found the
//!   lock taken) stops getting progress acks, and JetStream redelivers the message once
//!   `AckWait` has passed: the message is not held by a worker that can no longer finish it
//!   safely. A hung body under [`Task::renew`] keeps its lock, and so its message, until the
//!   process ends.
//! - **A body may run longer than `lock_ttl` only with [`Task::renew`] on.** Without it the lock
//!   expires under the body, and a second copy of the message (the producer's retry) may run
//!   next to it.
//! - **After a worker dies**, JetStream redelivers once `AckWait` has passed since its last
//!   progress ack, which went out at most one [`progress_interval`](Idempotent::progress_interval)
//!   before it died; the dead worker's lock expires within `lock_ttl` of its last renewal. With
//!   `AckWait ≥ lock_ttl + progress_interval()` the redelivery finds the lock gone and runs (or
//!   replays) at once; with a shorter `AckWait` it may find the lock still held, is nak'd with
//!   the time the lock has left, and runs when it comes back. Both are correct; the first costs
//!   no extra delivery.
//! - **Redeliveries count against `max_deliver`**: every `Contended` and store-failure nak is a
//!   delivery. Leave `max_deliver` unlimited (JetStream's default), or a message may be dropped
//!   with a `MAX_DELIVERIES` advisory although no worker finished it; a body that keeps failing
//!   is ended by [`max_failures`](Idempotent::max_failures) instead, which counts the body's
//!   failures only, in a key-value bucket of its own ([`Idempotent::failure_counts`]). When
//!   that bucket cannot be used, it counts JetStream's deliveries instead: a message may then
//!   be terminated early, but a poison message never loops for ever.
//! - **A consumer's `backoff` list replaces its `AckWait`**: JetStream waits for the ack of a
//!   message's `n`-th delivery as long as the list's `n`-th entry says (the last entry for
//!   every later delivery), so each entry it uses must be at least the declared `ack_wait`,
//!   as `AckWait` must.
//! - **The consumer is checked on the first message.** The integration reads its consumer's
//!   configuration in the background and logs at `WARN` each setting that works against the
//!   lock: an `AckWait`, or an entry of its `backoff` list, shorter than the declared
//!   `ack_wait`, a limited `max_deliver`, and a failure bucket that cannot be opened, created
//!   or written ([`ConsumerProblem`]). A check that cannot read the consumer is logged at
//!   `DEBUG` and runs again on a later message (at most once every 5 s). To refuse such a
//!   consumer at start-up instead, call [`Idempotent::check_consumer`] (or
//!   [`Idempotent::consumer_problems`], for the consumer's configuration alone).
//! - Give queue tasks [`RetryPolicy::no_wait`](idempotask::RetryPolicy::no_wait): a contended
//!   delivery is then nak'd at once with the right delay, instead of holding a worker while it
//!   waits for the lock.
//!
//! # The key
//! The key is the producer's `Nats-Msg-Id` ([`MsgId`]) or a function of the message or its
//! decoded payload (`Fn(&Message) -> Option<String>`); a message without a usable key is
//! terminated, never run unprotected. JetStream's own dedup by `Nats-Msg-Id` keeps copies out of
//! the stream within its duplicate window; it does not stop a message JetStream delivers again
//! (a consumer died before its ack, an ack was lost) from running twice, nor hand the first
//! result back: that is what the lock and the completion marker add.
//!
//! # The `nats_worker` example
//!
//! ```sh
//! nats-server -js &
//! NATS_URL=nats://127.0.0.1:4222 REDIS_URL=redis://127.0.0.1:6379 \
//!     cargo run --example nats_worker --features nats
//! ```
//!
//! One worker on a durable consumer of the stream `orders` (or `$QUEUE`), charging each order
//! at a stand-in gateway that counts charges in Redis and rejects the first request for orders
//! 2, 6 and 10. It prints a line per delivery (`order 5: charged ch_5_1`, `… replayed …`,
//! `… failed: …`). `CRASH_BEFORE_ACK=5` makes it wait, unacked, after its first charge of
//! order 5; `WITHOUT_IDEMPOTASK=1` runs the bare consumer.
//!
//! `tests/example_queues.rs` runs three copies on one stream (`AckWait` 2 s, lock TTL 1 s),
//! publishes 12 orders, kills with SIGKILL the copy that charged order 5, and reads the charges
//! from Redis, where the kill cannot take them back. One run (`nats-server` 2.9.10, Redis 7.0):
//!
//! | | deliveries | side effects (charges) | orders charged twice | killed workers |
//! | --- | --- | --- | --- | --- |
//! | with idempotask | 16 (12 + 3 rejected + 1 redelivered after the kill, replayed) | 12 | 0 | 1 |
//! | `WITHOUT_IDEMPOTASK=1` | 16 | 13 | 1 (order 5) | 1 |
//!
//! The test asserts that with idempotask every order is charged once, and that without it
//! order 5 is charged twice.

#![cfg_attr(docsrs, feature(doc_cfg))]

mod backoff;
mod consumer_config;
mod failures;
mod handled;
mod key;
mod progress;

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, AckKind, Message, consumer};
use idempotask::store::{SharedStore, Store};
use idempotask::{Backoff, Error, Fingerprint, Task, catch_panic};
use serde::Serialize;
use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};

pub use consumer_config::ConsumerProblem;
pub use failures::{DEFAULT_FAILURE_BUCKET, DEFAULT_FAILURE_MEMORY};
pub use handled::{BodyFailure, Handled, Rejection};
pub use key::{MessageKey, MissingKey, MsgId};

use backoff::{MIN_DELAY, nak_delay};
use consumer_config::{CheckState, Expected};
use failures::FailureCounts;
use handled::{takes_term_reason, undecided};

/// JetStream's `AckWait` when a consumer sets none.
pub const DEFAULT_ACK_WAIT: Duration = Duration::from_secs(30);
/// The nak delays of a message whose body failed ([`Idempotent::failure_backoff`]), by default:
/// 1 s after the first failure, doubling with each further one up to 60 s, without jitter.
pub const DEFAULT_FAILURE_BACKOFF: Backoff =
    Backoff::new(Duration::from_secs(1), Duration::from_secs(60));
/// The nak delays of a message whose store call failed ([`Idempotent::store_backoff`]), by
/// default: 1 s after the first delivery, doubling with each further one up to 60 s, without
/// jitter.
pub const DEFAULT_STORE_BACKOFF: Backoff =
    Backoff::new(Duration::from_secs(1), Duration::from_secs(60));
/// The failure of a message's body after which it is terminated instead of tried again, by
/// default.
pub const DEFAULT_MAX_FAILURES: u32 = 5;

/// Runs JetStream messages through a [`Task`]: the key comes from each message through `K` (a
/// `Fn(&Message) -> Option<String>`, or [`MsgId`]).
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
    task: Arc<Task>,
    key: Arc<K>,
    store: Option<SharedStore>,
    ack_wait: Duration,
    failure_backoff: Backoff,
    max_failures: u32,
    store_backoff: Backoff,
    fingerprint_payload: bool,
    failures: Arc<FailureCounts>,
    consumer_check: Arc<CheckState>,
    progress: Arc<progress::Ticker>,
}

impl<K> Idempotent<K> {
    /// Messages run through `task`, keyed by `key`, for a consumer with JetStream's default
    /// `AckWait` ([`DEFAULT_ACK_WAIT`]).
    pub fn new(task: Task, key: K) -> Self {
        Self {
            task: Arc::new(task),
            key: Arc::new(key),
            store: None,
            ack_wait: DEFAULT_ACK_WAIT,
            failure_backoff: DEFAULT_FAILURE_BACKOFF,
            max_failures: DEFAULT_MAX_FAILURES,
            store_backoff: DEFAULT_STORE_BACKOFF,
            fingerprint_payload: false,
            failures: Arc::new(FailureCounts::new(
                DEFAULT_FAILURE_BUCKET.to_owned(),
                DEFAULT_FAILURE_MEMORY,
            )),
            consumer_check: Arc::new(CheckState::default()),
            progress: Arc::default(),
        }
    }

    /// Checks that a key comes back with the same payload: a message whose key was used with
    /// another payload gets [`Error::KeyReuse`] and is terminated, and the first payload's
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
    #[must_use]
    pub fn fingerprint_payload(mut self, on: bool) -> Self {
        self.fingerprint_payload = on;
        self
    }

    /// Uses `store` instead of the installed one.
    #[must_use]
    pub fn store(mut self, store: impl Store) -> Self {
        self.store = Some(SharedStore::new(store));
        self
    }

    /// The consumer's `AckWait`, which progress acks must beat (default [`DEFAULT_ACK_WAIT`]).
    /// Declaring a longer one than the consumer has lets JetStream redeliver a message while
    /// its body still runs.
    #[must_use]
    pub fn ack_wait(mut self, ack_wait: Duration) -> Self {
        self.ack_wait = ack_wait;
        self
    }

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
    #[must_use]
    pub fn failure_backoff(mut self, backoff: Backoff) -> Self {
        self.failure_backoff = backoff;
        self
    }

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
    #[must_use]
    pub fn max_failures(mut self, failures: u32) -> Self {
        self.max_failures = failures.max(1);
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

    /// The delays of the nak of a message whose store call failed (or that found no store, or
    /// a misused task): the backoff's delay for the message's JetStream delivery count, 1 for
    /// its first (default [`DEFAULT_STORE_BACKOFF`]; at least 10 ms, as every nak delay).
    #[must_use]
    pub fn store_backoff(mut self, backoff: Backoff) -> Self {
        self.store_backoff = backoff;
        self
    }

    /// The task every message runs through.
    pub fn task(&self) -> &Task {
        &self.task
    }

    /// How often a message being handled gets a progress ack: a third of the shorter of the
    /// declared `AckWait` and the task's lock TTL, at least 10 ms.
    pub fn progress_interval(&self) -> Duration {
        (self.ack_wait.min(self.task.settings().lock_ttl) / 3).max(MIN_DELAY)
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
    fn check_consumer_once(&self, message: &Message) {
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

impl<K: MessageKey> Idempotent<K> {
    /// Runs `body` for `message` at most once per key, then acks, naks or terminates the
    /// message as its outcome says, and returns the outcome.
    ///
    /// `body` is only polled once the lock is held, so creating it costs nothing and a
    /// duplicate never starts it. Until the acknowledgement is sent, progress acks keep
    /// JetStream from redelivering the message (see [`progress_interval`](Self::progress_interval)).
    /// The body's `Ok` type is stored as JSON, so it must implement `Serialize` and
    /// `DeserializeOwned` (`()` does).
    ///
    /// ```
    /// use idempotask::{MemoryStore, Outcome, Task};
    /// use idempotask_nats::{Handled, Idempotent, MsgId};
    /// # use async_nats::jetstream::Message;
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    /// # // A delivery as a pull consumer hands it over, without a server: its acks queue up.
    /// # let client = async_nats::ConnectOptions::new().retry_on_initial_connect().connect("127.0.0.1:9").await?;
    /// # let mut headers = async_nats::HeaderMap::new();
    /// # headers.insert("Nats-Msg-Id", "order-7");
    /// # let message = Message {
    /// #     message: async_nats::Message {
    /// #         subject: "orders.new".into(),
    /// #         reply: Some("$JS.ACK.ORDERS.charger.1.7.7.1764547200000000000.0".into()),
    /// #         payload: "{}".into(), headers: Some(headers), status: None, description: None, length: 0,
    /// #     },
    /// #     context: async_nats::jetstream::new(client),
    /// # };
    /// let charge_once = Idempotent::new(Task::new("order_charge"), MsgId).store(MemoryStore::new());
    /// let mut outcomes = Vec::new();
    /// for _delivery in 0..2 {
    ///     match charge_once.handle(&message, async { Ok::<_, std::io::Error>(42_u32) }).await? {
    ///         Handled::Acked(report) => outcomes.push((report.value, report.outcome)),
    ///         Handled::Failed { error, delay, .. } => eprintln!("back in {delay:?}: {error}"),
    ///         Handled::Deferred { error, delay, .. } => eprintln!("back in {delay:?}: {error}"),
    ///         Handled::Terminated(why) => eprintln!("dead-lettered: {why}"),
    ///         _ => {}
    ///     }
    /// }
    /// assert_eq!(outcomes, [(42, Outcome::Executed), (42, Outcome::Replayed)]);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`AckError`] when the acknowledgement could not be queued on the connection (the message
    /// has no reply subject, or the client is closed). A queued ack is not confirmed: one lost
    /// with the connection raises no error (see the crate docs). Either way the outcome is in
    /// the store; JetStream delivers the message again after `AckWait`, and that delivery is
    /// replayed or run as the store says. The error carries the outcome
    /// ([`AckError::into_handled`]): the body's value or error is not lost with the ack.
    pub async fn handle<T, E, F>(
        &self,
        message: &Message,
        body: F,
    ) -> Result<Handled<T, E>, AckError<T, E>>
    where
        T: Serialize + DeserializeOwned,
        F: Future<Output = Result<T, E>>,
    {
        let handled = self.process(message, body).await;
        let kind = handled.ack_kind();
        let sent = match (handled.term_reason(), &message.reply) {
            (Some(reason), Some(reply))
                if takes_term_reason(&message.context.client().server_info().version) =>
            {
                let term = format!("+TERM {reason}");
                message
                    .context
                    .client()
                    .publish(reply.clone(), term.into())
                    .await
                    .map_err(Into::into)
            }
            _ => message.ack_with(kind).await,
        };
        match sent {
            Ok(()) => Ok(handled),
            Err(source) => Err(AckError {
                kind,
                handled,
                source,
            }),
        }
    }

    /// Like [`handle`](Self::handle), without sending the final acknowledgement: send
    /// [`handled.ack_kind()`](Handled::ack_kind) yourself, for instance with `double_ack_with`
    /// to wait until JetStream has it, or after writing the result somewhere first.
    ///
    /// Progress acks go out while this runs and stop when it returns: none is still on its way
    /// out then, so the acknowledgement you send after it is the message's last. Acknowledge
    /// before the consumer's `AckWait` has passed, or JetStream delivers the message again
    /// (which is safe: a stored result is replayed).
    pub async fn process<T, E, F>(&self, message: &Message, body: F) -> Handled<T, E>
    where
        T: Serialize + DeserializeOwned,
        F: Future<Output = Result<T, E>>,
    {
        self.check_consumer_once(message);
        let lease = progress::Lease::default();
        let progress = self
            .progress
            .start(message, self.progress_interval(), lease.clone())
            .await;
        let handled = self.decide(message, body, lease).await;
        progress.stop().await;
        handled
    }

    /// What `message` gets once `body` has run, or has not.
    async fn decide<T, E, F>(
        &self,
        message: &Message,
        body: F,
        lease: progress::Lease,
    ) -> Handled<T, E>
    where
        T: Serialize + DeserializeOwned,
        F: Future<Output = Result<T, E>>,
    {
        let key = match self.key.key(message) {
            Ok(key) => key,
            Err(missing) => return Handled::Terminated(Rejection::MissingKey(missing)),
        };
        let mut call = self.task.call(key);
        if let Some(store) = &self.store {
            call = call.store(store.clone());
        }
        if self.fingerprint_payload {
            let digest = Sha256::digest(&message.payload);
            call = call.fingerprint(Fingerprint::from_sha256(digest.into()));
        }
        let body = async move {
            lease.record();
            body.await.map_err(Failure::Body)
        };
        // Around the whole call: the runner releases the lock of a body that panics and lets
        // the panic go on, and a panic left to unwind from here would leave the message to
        // `AckWait` with its failure uncounted, delivered again and again.
        let error = match catch_panic(call.run_reported(body)).await {
            Ok(Ok(report)) => return Handled::Acked(report),
            Ok(Err(Failure::Idempotask(err))) => {
                let delivered = message.info().map_or(1, |info| info.delivered);
                return undecided(
                    err,
                    self.task.settings().lock_ttl,
                    self.store_backoff,
                    delivered,
                );
            }
            Ok(Err(Failure::Body(error))) => BodyFailure::Error(error),
            Err(panic) => BodyFailure::Panicked(panic),
        };
        let failures = self.failures.recorded(message).await.saturating_add(1);
        if failures >= self.max_failures {
            self.failures.forget(message);
            return Handled::GaveUp { error, failures };
        }
        self.failures.record(message, failures).await;
        Handled::Failed {
            error,
            delay: nak_delay(&self.failure_backoff, i64::from(failures)),
        }
    }
}

impl<K> Clone for Idempotent<K> {
    fn clone(&self) -> Self {
        Self {
            task: Arc::clone(&self.task),
            key: Arc::clone(&self.key),
            store: self.store.clone(),
            ack_wait: self.ack_wait,
            failure_backoff: self.failure_backoff,
            max_failures: self.max_failures,
            store_backoff: self.store_backoff,
            fingerprint_payload: self.fingerprint_payload,
            failures: Arc::clone(&self.failures),
            consumer_check: Arc::clone(&self.consumer_check),
            progress: Arc::clone(&self.progress),
        }
    }
}

impl<K> std::fmt::Debug for Idempotent<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Idempotent")
            .field("task", &self.task)
            .field("key", &std::any::type_name::<K>())
            .field("store", &self.store.as_ref().map(|_| "own store"))
            .field("ack_wait", &self.ack_wait)
            .field("failure_backoff", &self.failure_backoff)
            .field("max_failures", &self.max_failures)
            .field("store_backoff", &self.store_backoff)
            .field("fingerprint_payload", &self.fingerprint_payload)
            .field("failure_bucket", &self.failures.bucket())
            .finish_non_exhaustive()
    }
}

/// Why a message's call ended without a value: the body said so, or idempotask did.
enum Failure<E> {
    Body(E),
    Idempotask(Error),
}

impl<E> From<Error> for Failure<E> {
    fn from(err: Error) -> Self {
        Self::Idempotask(err)
    }
}

/// The acknowledgement of a handled message could not be queued on the connection (the
/// message has no reply subject, or the client is closed). A dropped connection does not
/// always show here: publishing only queues the ack.
///
/// What the message's outcome stored stays stored: JetStream delivers it again after `AckWait`
/// and the redelivery is replayed (or run, if nothing was stored).
#[derive(thiserror::Error)]
#[error(
    "could not send {kind:?} to JetStream; it delivers the message again after AckWait: {source}"
)]
pub struct AckError<T, E> {
    kind: AckKind,
    handled: Handled<T, E>,
    #[source]
    source: Box<dyn std::error::Error + Send + Sync>,
}

impl<T, E> AckError<T, E> {
    /// The acknowledgement that was not sent.
    pub fn ack_kind(&self) -> AckKind {
        self.kind
    }

    /// What became of the message, whose acknowledgement this is.
    pub fn handled(&self) -> &Handled<T, E> {
        &self.handled
    }

    /// What became of the message: the body's value or error, which the failed ack does not
    /// undo.
    pub fn into_handled(self) -> Handled<T, E> {
        self.handled
    }
}

// By hand, so that a value or error without `Debug` still leaves the error printable.
impl<T, E> std::fmt::Debug for AckError<T, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AckError")
            .field("kind", &self.kind)
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}
