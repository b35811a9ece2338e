//! Consume AMQP deliveries from a RabbitMQ broker ([lapin](https://docs.rs/lapin)) through an idempotask [`Task`]:
//! each message at most once per key, its `Ok` value stored and handed to every redelivery, and
//! each outcome settled on the broker the way that outcome calls for.
//!
//! RabbitMQ delivers at least once: a delivery that is not acked comes back when its consumer's
//! channel or connection closes (a crash, a deploy, a network blip), and a requeued delivery comes
//! back at once. [`Idempotent::process`] runs the body under the key's lock, so a redelivery whose
//! work is done gets the stored value and is acked instead of doing the work again.
//!
//! ```no_run
//! use futures_util::StreamExt; // lapin's `Consumer` is a `Stream`
//! use idempotask::{RetryPolicy, Task};
//! use idempotask_lapin::{Idempotent, MessageId, Settled, Topology};
//! use lapin::options::{BasicConsumeOptions, BasicQosOptions};
//! use lapin::types::FieldTable;
//! use lapin::{Connection, ConnectionProperties};
//! use std::time::Duration;
//!
//! static CHARGE: Task = Task::new("order_charge")
//!     .lock_ttl(Duration::from_secs(60))
//!     .renew(true)
//!     .retry(RetryPolicy::no_wait());
//!
//! async fn charge(order: &[u8]) -> Result<String, std::io::Error> {
//!     Ok(format!("ch_{}", String::from_utf8_lossy(order)))
//! }
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! // Where locks and results live: the same store for every consumer process
//! // (idempotask_redis::RedisStore or idempotask_postgres; a MemoryStore is one process only).
//! idempotask::install(idempotask::MemoryStore::new());
//! let connection = Connection::connect("amqp://127.0.0.1:5672/%2f", ConnectionProperties::default()).await?;
//! let channel = connection.create_channel().await?;
//! let topology = Topology::new("orders");
//! let retries = topology.declare(&channel).await?;
//! channel.basic_qos(8, BasicQosOptions::default()).await?;
//! let charge_once = Idempotent::new(CHARGE.clone(), MessageId, retries);
//!
//! let mut deliveries = channel
//!     .basic_consume("orders".into(), "charger".into(), BasicConsumeOptions::default(), FieldTable::default())
//!     .await?;
//! while let Some(delivery) = deliveries.next().await {
//!     let settled = charge_once
//!         .process(delivery?, |delivery| {
//!             let order = delivery.data.clone();
//!             async move { charge(&order).await }
//!         })
//!         .await?;
//!     if let Settled::DeadLettered(cause) = settled {
//!         eprintln!("dead-lettered: {cause:?}");
//!     }
//! }
//! # Ok(()) }
//! ```
//!
//! # Behaviour: what each outcome becomes
//!
//! | the call ends with | the delivery | [`Settled`] |
//! | --- | --- | --- |
//! | the body's `Ok`, stored ([`Outcome::Executed`](idempotask::Outcome)) | acked | `Acked` |
//! | a stored value: a duplicate ([`Outcome::Replayed`](idempotask::Outcome)); the body does not run | acked | `Acked` |
//! | the body ran but its lock expired or its result could not be recorded (`LockLost`, `MarkerNotWritten`) | acked: the side effect happened, and a redelivery would only run it again | `Acked` |
//! | the key is busy after the task's [`RetryPolicy`](idempotask::RetryPolicy) ([`Error::Contended`]) | published to the retry queue with `expiration` = the holder's remaining lock time, then acked | `Retrying` |
//! | the store failed ([`Error::Store`]) or none is installed; or idempotask is misused (`Reentered`, `NoRuntime`, `TaskNameTaken`: a bug of the consumer, logged as an error, that must not cost the message) | published to the retry queue with a bounded backoff ([`store_backoff`](Idempotent::store_backoff), per store error of this message; [`DEFAULT_STORE_BACKOFF`]: 100 ms doubling up to 30 s), then acked | `Retrying` |
//! | the body's `Err`, or a panic in it ([`Cause::Panicked`]); the lock is released and nothing is stored | published to the retry queue with a bounded backoff ([`failure_backoff`](Idempotent::failure_backoff), per failure of this message; [`DEFAULT_FAILURE_BACKOFF`]: 100 ms doubling up to 30 s), then acked; after [`max_failures`](Idempotent::max_failures) failures (5 by default), rejected without requeue | `Retrying`, then `DeadLettered` |
//! | the key cannot be used: [`MissingKey`], [`Error::InvalidKey`], [`Error::KeyReuse`], [`Error::Codec`], [`Error::MarkerKeyMismatch`] | `basic.reject` without requeue: to the work queue's dead-letter exchange; nothing ran | `DeadLettered` |
//! | the unit is in doubt and the task holds such units ([`Error::InDoubt`], [`InDoubt::Hold`](idempotask::InDoubt::Hold)): an earlier delivery's lock ran out without a release or a result | to the dead-letter exchange with [`REASON_HEADER`] `in-doubt` and the error's text in [`ERROR_HEADER`] (a copy, confirmed, then the delivery acked), never retried: every delivery would be held until an operator resolves the unit (`idempotask resolve`); then move it back to the work queue, and it replays or runs. Nothing ran | `DeadLettered` |
//!
//! A body error is retried through the retry queue rather than `basic.nack` with requeue: a
//! requeued message comes back at once, so a failing dependency would be hammered in a tight loop
//! by every consumer; the delay gives it time, and the failure count travels with the message in
//! the [`FAILURES_HEADER`] header. The retry queue keeps the message's properties (its
//! `message_id`, so the key is the same) and its headers.
//!
//! A rejection cannot carry headers, so a unit in doubt, the one dead-letter whose message is
//! sound and waits for an operator, goes to the dead-letter exchange as a copy that says why,
//! published with the original's properties and routing key (confirmed by the broker before the
//! original is acked; a copy that is not confirmed leaves the original rejected there the plain
//! way, without the headers). The copy goes to the exchange that [`Topology::declare`] declared,
//! or the one named by [`RetryQueue::dead_letter_exchange`]; without one it is rejected the plain
//! way too. Unlike a rejected message it has no `x-death` header.
//!
//! [`Idempotent::process`] runs and settles in one call; [`Idempotent::run`] answers a
//! [`Decision`] that [`Decision::settle`] carries out later, for a consumer that records something
//! between the two (the delivery stays unacked until then: a crash there redelivers it, and the
//! redelivery replays the stored result).
//!
//! # The retry queue, and the at-least-once window
//!
//! RabbitMQ has no "deliver again in N seconds" for a delivery. A delayed redelivery is a copy
//! published to a retry queue that has no consumer, with a per-message `expiration`; once it
//! expires, the retry queue dead-letters it through the default exchange back to the work queue
//! ([`Topology`] declares exactly that). Every delay in this table is a lower bound: see the
//! head-of-queue caveat below. The copy is published with publisher confirms, and the
//! original is acked only after the broker confirmed the copy: a crash between the confirm and
//! the ack leaves both (the broker requeues the unacked original), which the key's lock and
//! stored result absorb; a copy that cannot be published is never acked away. If the publish
//! fails, the original is held unacked for the delay, then nacked with requeue, and
//! [`SettleFailure::Retry`] is returned; the failure count the copy would have carried is kept in
//! the consumer's process for the key, so a failing body still reaches the dead-letter exchange
//! after [`max_failures`](Idempotent::max_failures) runs instead of looping.
//!
//! A [`RetryQueue`] publishes on the channel it was made with, for life: once that channel
//! closes (a channel error, a lost connection) every publish fails with
//! [`PublishError::ChannelClosed`]. Make a new one ([`Topology::declare`] on a new channel) and a
//! new [`Idempotent`] when a consumer reconnects.
//!
//! RabbitMQ expires messages only at the head of a queue: a message behind one with a longer
//! delay waits for it. The delay is therefore a lower bound, and the longest delay in use (the
//! backoff's bound, or the task's lock TTL) is how much later a message may come back.
//!
//! # The redelivery clocks
//!
//! - **A closed channel redelivers at once.** RabbitMQ has no visibility timeout: an unacked
//!   delivery goes back to the queue the moment its consumer's channel closes, and another
//!   consumer gets it immediately, typically while the dead consumer's lock is still held. That
//!   redelivery finds the key busy, waits as the task's `RetryPolicy` says (up to the lock TTL
//!   by default), and then either replays the stored result or is sent to the retry queue for the
//!   holder's remaining lock time: it never runs the body twice, and it does not spin.
//! - **`consumer_timeout`** (30 minutes by default, RabbitMQ 3.8.15 and later): a delivery not
//!   acked within it closes the consumer's channel with `PRECONDITION_FAILED`, and every unacked
//!   delivery of that channel is redelivered at once. Keep the time a body runs, and the task's
//!   lock TTL, well under it; for long bodies use [`Task::renew`](idempotask::Task::renew) (the
//!   lock then lives as long as the body runs) rather than a lock TTL longer than the timeout.
//!   A lock TTL longer than `consumer_timeout` only makes the redelivery wait longer for a
//!   holder that is gone. Unlike a NATS consumer's `AckWait`, the timeout cannot be checked
//!   from here: AMQP 0-9-1 has no way to read it (it is in `rabbitmq.conf` or a policy, seen
//!   only through the management API), so it is yours to compare with the lock TTL.
//! - **The lock TTL bounds a crashed holder.** When a consumer dies mid-body, its lock stays until
//!   it expires; redeliveries wait out the remaining time in the retry queue and then run. A short
//!   lock TTL with renewal lets work resume sooner after a crash.
//! - **Prefetch.** With `basic_qos(n)`, up to `n` deliveries wait unacked on a consumer; all of
//!   them come back at once if it dies. The consumer above settles one delivery at a time; spawn
//!   `process` per delivery for concurrency, with `n` as the bound.
//!
//! Give queue tasks [`RetryPolicy::no_wait`](idempotask::RetryPolicy::no_wait): a busy key then
//! goes to the retry queue at once for the holder's remaining lock time, which is the wait,
//! instead of also keeping the consumer waiting in the call (the default policy waits up to the
//! lock TTL, holding the delivery and, with a small prefetch, the deliveries behind it).
//!
//! Every setting of the [`Task`] applies (lock TTL, result TTL, lock renewal, retry policy, key
//! logging); the store is the installed one unless [`Idempotent::store`] names another.
//!
//! # The key
//!
//! - [`MessageId`]: the AMQP `message_id` property the producer set. A delivery without one (or
//!   with an empty one) is rejected to the dead-letter exchange, never run unprotected.
//! - Any `Fn(&Delivery) -> Option<String>`: a key from the headers, the routing key or the
//!   decoded payload; `None` dead-letters the delivery the same way.
//! - [`fingerprint_payload(true)`](Idempotent::fingerprint_payload) also checks that a key comes
//!   back with the same payload: a producer that reuses a `message_id` for another message gets
//!   `KeyReuse` (dead-lettered) instead of the other message's result.
//!
//! [`Topology::declare`] declares the work queue, its retry queue and its dead-letter exchange
//! and queue (the table is on [`Topology`]), and turns on publisher confirms on the channel. A
//! queue that already exists with other arguments makes the declaration fail with
//! `PRECONDITION_FAILED`; [`RetryQueue::new`] takes a retry queue declared elsewhere.
//!
//! # The `rabbitmq_worker` example
//!
//! `cargo run --example rabbitmq_worker --features rabbitmq` (with `AMQP_URL` and `REDIS_URL`):
//! one worker on the queue `orders` (or `$QUEUE`), charging each order at a stand-in gateway
//! that counts charges in Redis and rejects the first request for orders 2, 6 and 10, a line
//! printed per delivery. `CRASH_BEFORE_ACK=5` makes it wait, unacked, after its first charge of
//! order 5; `WITHOUT_IDEMPOTASK=1` runs the bare consumer.
//!
//! `tests/example_queues.rs` runs three copies on one queue, publishes 12 orders, kills with
//! SIGKILL the copy that charged order 5 (the broker redelivers at once), and reads the charges
//! from Redis. One run, on the broker and Redis the test starts:
//!
//! | | deliveries | side effects | orders charged twice | duplicates answered from the store |
//! | --- | --- | --- | --- | --- |
//! | with idempotask | 16 | 12 | 0 | 1 |
//! | `WITHOUT_IDEMPOTASK=1` | 16 | 13 | 1 | 0 |

#![cfg_attr(docsrs, feature(doc_cfg))]

mod key;
mod settle;
mod topology;

use std::future::Future;
use std::sync::Arc;

#[cfg(doc)]
use idempotask::Error;
use idempotask::store::Store;
use idempotask::{Backoff, Task};
use idempotask_consumer::{ConsumerSettings, Verdict};
use lapin::message::Delivery;
use serde::Serialize;
use serde::de::DeserializeOwned;

pub use key::{DeliveryKey, MessageId, MissingKey};
pub use settle::{
    Cause, Decision, ERROR_HEADER, FAILURES_HEADER, IN_DOUBT, REASON_HEADER, STORE_ERRORS_HEADER,
    SettleError, SettleFailure, Settled,
};
pub use topology::{PublishError, RetryQueue, Topology};

// The defaults of every queue consumer, which RabbitMQ's retry queue takes as they are.
pub use idempotask_consumer::{
    DEFAULT_FAILURE_BACKOFF, DEFAULT_MAX_FAILURES, DEFAULT_STORE_BACKOFF,
};
use settle::{Action, Seen, Unpublished};

/// Runs each delivery through a [`Task`], keyed by `K` ([`MessageId`], or a
/// `Fn(&Delivery) -> Option<String>`), and settles it on the broker; see the [crate docs](crate)
/// for what each outcome becomes.
///
/// ```
/// # async fn demo(retries: idempotask_lapin::RetryQueue) {
/// use std::time::Duration;
/// use idempotask::{Backoff, MemoryStore, Task};
/// use idempotask_lapin::{Idempotent, MessageId};
///
/// let consumer = Idempotent::new(Task::new("refund"), MessageId, retries)
///     .store(MemoryStore::new())
///     .failure_backoff(Backoff::new(Duration::from_millis(50), Duration::from_secs(5)))
///     .store_backoff(Backoff::new(Duration::from_millis(200), Duration::from_secs(10)).full_jitter(true))
///     .max_failures(3);
/// assert_eq!(consumer.task().name(), "refund");
/// # }
/// ```
pub struct Idempotent<K> {
    /// The task, the store and the backoffs, which every queue consumer has.
    settings: ConsumerSettings,
    key: Arc<K>,
    /// Shared with every [`Decision`]: a clone of the queue (its channel, its names) per
    /// delivery would cost allocations on every message.
    retries: Arc<RetryQueue>,
    unpublished: Arc<Unpublished>,
}

impl<K: DeliveryKey> Idempotent<K> {
    /// Deliveries run through `task`, keyed by `key`; delayed redeliveries go to `retries`.
    pub fn new(task: Task, key: K, retries: RetryQueue) -> Self {
        Self {
            settings: ConsumerSettings::new(task),
            key: Arc::new(key),
            retries: Arc::new(retries),
            unpublished: Arc::default(),
        }
    }

    idempotask_consumer::settings_setters! {
        /// Checks that a key comes back with the same payload: a delivery whose key was used with
        /// another payload gets [`Error::KeyReuse`] and is dead-lettered, and the first payload's
        /// stored result stays (off by default; it hashes each payload).
        ///
        /// Turn it on when the key is a producer's `message_id`: a producer that reuses an id for a
        /// different message is then caught instead of answered with the other message's result.
        fn fingerprint_payload(on: bool);

        /// Uses `store` instead of the installed one.
        ///
        /// A store that batches natively (`RedisStore`) is wrapped in a
        /// [`BatchingStore`](idempotask::store::BatchingStore): the calls of the messages of a
        /// prefetch window that run at the same time reach it as one batch (one pipeline on
        /// `RedisStore`) instead of one round trip each ([`batch_store_calls`](Self::batch_store_calls)).
        fn store(store: impl Store);

        /// Whether the calls to a store that batches natively (`RedisStore`) go through a
        /// [`BatchingStore`](idempotask::store::BatchingStore) (default on): off, each
        /// message's `begin` and `finish` reach the store on their own.
        fn batch_store_calls(batch: bool);

        /// The delays of redeliveries after the body's failures (an `Err` or a panic): the
        /// backoff's delay for the message's failure count, 1 for its first (default
        /// [`DEFAULT_FAILURE_BACKOFF`]; at least 10 ms).
        fn failure_backoff(backoff: Backoff);

        /// The delays of redeliveries after store errors (or no store installed, or a misused
        /// task): the backoff's delay for the message's store-error count, 1 for its first (default
        /// [`DEFAULT_STORE_BACKOFF`]; at least 10 ms).
        fn store_backoff(backoff: Backoff);

        /// How many body errors a message may have before it is dead-lettered instead of retried
        /// (default [`DEFAULT_MAX_FAILURES`]; at least 1). Contention and store errors do not count:
        /// they say nothing about the message.
        fn max_failures(failures: u32);
    }

    /// The task every delivery runs through.
    pub fn task(&self) -> &Task {
        self.settings.task()
    }

    /// Runs `body` for `delivery` at most once per key and settles the delivery on the broker:
    /// acked, sent to the retry queue, or rejected to the dead-letter exchange. The same as
    /// [`run`](Self::run) followed by [`Decision::settle`].
    ///
    /// `body` is called with the delivery only once the lock is held (a duplicate never calls
    /// it); the future it returns owns what it needs (clone the payload, or decode it, in the
    /// closure). Its `Ok` type is stored as JSON, so it must implement `Serialize` and
    /// `DeserializeOwned` (`()` does).
    ///
    /// # Errors
    /// [`SettleError`] when the broker could not be told: the delivery then comes back (see
    /// there). What the body and idempotask said is in the [`Settled`] value, which the error
    /// also holds.
    pub async fn process<T, E, F, Fut>(
        &self,
        delivery: Delivery,
        body: F,
    ) -> Result<Settled<T, E>, SettleError<T, E>>
    where
        T: Serialize + DeserializeOwned,
        F: FnOnce(&Delivery) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        self.run(delivery, body).await.settle().await
    }

    /// Runs `body` for `delivery` as [`process`](Self::process) does, and answers what to do
    /// with the delivery without doing it yet: for a consumer that records or reports something
    /// between the run and the ack. Until [`Decision::settle`], the delivery is unacked (a
    /// crash here redelivers it, and the redelivery replays the stored result).
    pub async fn run<T, E, F, Fut>(&self, delivery: Delivery, body: F) -> Decision<T, E>
    where
        T: Serialize + DeserializeOwned,
        F: FnOnce(&Delivery) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let (key, action, settled) = match self.key.key(&delivery) {
            Ok(key) => {
                let (action, settled) = self.decide(&delivery, &key, body).await;
                (Some(key), action, settled)
            }
            Err(missing) => (
                None,
                Action::DeadLetter,
                Settled::DeadLettered(Cause::MissingKey(missing)),
            ),
        };
        Decision {
            delivery,
            key,
            action,
            settled,
            retries: Arc::clone(&self.retries),
            unpublished: Arc::clone(&self.unpublished),
        }
    }

    async fn decide<T, E, F, Fut>(
        &self,
        delivery: &Delivery,
        key: &str,
        body: F,
    ) -> (Action, Settled<T, E>)
    where
        T: Serialize + DeserializeOwned,
        F: FnOnce(&Delivery) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let seen = Seen {
            delivery,
            key,
            unpublished: &self.unpublished,
        };
        let run = async move { body(delivery).await };
        let verdict = self.settings.run(key, &delivery.data, &seen, run).await;
        match verdict {
            Verdict::Ack(report) => (Action::Ack, Settled::Acked(report)),
            Verdict::Retry {
                failure,
                failures,
                delay,
                ..
            } => {
                let action = Action::Retry {
                    delay,
                    header: FAILURES_HEADER,
                    count: failures,
                };
                let cause = Cause::of(failure);
                (action, Settled::Retrying { cause, delay })
            }
            Verdict::GiveUp { failure, .. } => (
                Action::DeadLetter,
                Settled::DeadLettered(Cause::of(failure)),
            ),
            Verdict::Defer {
                error,
                delay,
                deferral,
                ..
            } => {
                let action = match deferral {
                    Some(count) => Action::Retry {
                        delay,
                        header: STORE_ERRORS_HEADER,
                        count,
                    },
                    // A busy key says nothing about the message: its counts travel unchanged.
                    None => Action::Retry {
                        delay,
                        header: FAILURES_HEADER,
                        count: seen.count(FAILURES_HEADER),
                    },
                };
                let cause = Cause::Idempotask(error);
                (action, Settled::Retrying { cause, delay })
            }
            Verdict::Refuse(err) => (
                Action::DeadLetter,
                Settled::DeadLettered(Cause::Idempotask(err)),
            ),
            // Not the message's fault, and every delivery would be held the same until an
            // operator resolves the unit: dead-lettered with a reason that says so.
            Verdict::Hold(err) => (
                Action::DeadLetterWithReason {
                    reason: IN_DOUBT,
                    error: err.to_string(),
                },
                Settled::DeadLettered(Cause::Idempotask(err)),
            ),
        }
    }
}

impl<K> Clone for Idempotent<K> {
    fn clone(&self) -> Self {
        Self {
            settings: self.settings.clone(),
            key: Arc::clone(&self.key),
            retries: Arc::clone(&self.retries),
            unpublished: Arc::clone(&self.unpublished),
        }
    }
}

impl<K> std::fmt::Debug for Idempotent<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Idempotent")
            .field("settings", &self.settings)
            .field("key", &std::any::type_name::<K>())
            .field("retries", &self.retries)
            .field("unpublished", &self.unpublished)
            .finish()
    }
}
