//! Consume [NATS JetStream](https://docs.nats.io/nats-concepts/jetstream) messages through an
//! idempotask [`Task`](idempotask::Task): each message's work at most once per key, its `Ok` value stored and
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
//! Every setting of the [`Task`](idempotask::Task) applies (lock TTL, result TTL, lock renewal, retry policy, key
//! logging); the store is the installed one unless [`Idempotent::store`] names another.
//!
//! | the call ends with | [`Handled`] | JetStream gets |
//! | --- | --- | --- |
//! | the body's `Ok`, stored ([`Outcome::Executed`](idempotask::Outcome)) | `Acked` | `+ACK` |
//! | a stored value: a duplicate, the body did not run (`Outcome::Replayed`) | `Acked` | `+ACK` |
//! | the body's `Ok`, but its lock expired first or its marker could not be written (`LockLost`, `MarkerNotWritten`) | `Acked` | `+ACK`: the side effect happened; running it again would not undo it |
//! | the body's `Err`, or a panic in it ([`BodyFailure`]): the lock is released, nothing is stored | `Failed` | `-NAK` with a backoff that doubles per failure ([`failure_backoff`](Idempotent::failure_backoff), [`DEFAULT_FAILURE_BACKOFF`]: 1 s up to 60 s): the queue's retry runs the body again |
//! | the body's [`max_failures`](Idempotent::max_failures)-th failure (5 by default; deferred deliveries do not count, unless the failure bucket cannot be used) | `GaveUp` | `+TERM`: no more deliveries |
//! | the key is busy after the task's [`RetryPolicy`](idempotask::RetryPolicy) ([`Error::Contended`](idempotask::Error::Contended)) | `Deferred` | `-NAK` with the holder's remaining lock time as the delay (the lock TTL when the store did not say); nothing ran |
//! | the store failed ([`Error::Store`](idempotask::Error::Store)) or none is installed | `Deferred` | `-NAK` with a bounded backoff ([`store_backoff`](Idempotent::store_backoff), [`DEFAULT_STORE_BACKOFF`]: 1 s up to 60 s); nothing ran, or the lock is released |
//! | the program misuses the task (`Reentered`, `TaskNameTaken`, `NoRuntime`) | `Deferred` | `-NAK` with the store's backoff, and an error log: the deploy is wrong, not the message, which waits for the fixed one |
//! | the key cannot be used ([`MissingKey`], [`Error::InvalidKey`](idempotask::Error::InvalidKey), [`Error::KeyReuse`](idempotask::Error::KeyReuse), [`Error::Codec`](idempotask::Error::Codec), [`Error::MarkerKeyMismatch`](idempotask::Error::MarkerKeyMismatch)) | `Terminated` | `+TERM`: no redelivery can succeed; JetStream stops delivering it and publishes a `$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED.<stream>.<consumer>` advisory |
//! | the unit is in doubt and the task holds such units ([`Error::InDoubt`](idempotask::Error::InDoubt), [`InDoubt::Hold`](idempotask::InDoubt::Hold)): an earlier delivery's lock ran out without a release or a result | `Terminated(Rejection::InDoubt)` | `+TERM` with the error's text as its reason, never an ack and never a nak: every delivery would be held until an operator resolves the unit (`idempotask resolve`: records a result or frees it); then re-drive the message from the stream, and it replays or runs. Nothing ran |
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
//! task's lock TTL: the cadence at which [`Task::renew`](idempotask::Task::renew) renews the lock
//! ([`Idempotent::progress_interval`]). The acks run as a task of their own, so a body that
//! blocks its thread does not stop them (on a multi-threaded runtime), and they follow the
//! lock: once the body's lock is lost or its TTL has passed without a renewal, they stop. So:
//!
//! - **While a worker runs a message under its lock, JetStream does not redeliver it**, however
//!   long the body takes, as long as the declared `ack_wait` is no longer than the consumer's
//!   real one. A body that outlives its lock (no [`Task::renew`](idempotask::Task::renew), or a renewal that found the
//!   lock taken) stops getting progress acks, and JetStream redelivers the message once
//!   `AckWait` has passed: the message is not held by a worker that can no longer finish it
//!   safely. A hung body under [`Task::renew`](idempotask::Task::renew) keeps its lock, and so its message, until the
//!   process ends.
//! - **A body may run longer than `lock_ttl` only with [`Task::renew`](idempotask::Task::renew) on.** Without it the lock
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

mod consumer;
mod consumer_config;
mod defaults;
mod failures;
mod handle;
mod handled;
mod key;
mod progress;

pub use consumer::Idempotent;
pub use consumer_config::ConsumerProblem;
pub use defaults::{
    DEFAULT_ACK_WAIT, DEFAULT_FAILURE_BACKOFF, DEFAULT_MAX_FAILURES, DEFAULT_STORE_BACKOFF,
};
pub use failures::{DEFAULT_FAILURE_BUCKET, DEFAULT_FAILURE_MEMORY};
pub use handle::AckError;
pub use handled::{Handled, Rejection};
pub use idempotask_consumer::BodyFailure;
pub use key::{MessageKey, MissingKey, MsgId};
