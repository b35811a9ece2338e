//! Consume Kafka topics through an idempotask [`Task`](idempotask::Task), with
//! [rdkafka](https://docs.rs/rdkafka): each record's work at most once per key, its `Ok` value
//! stored and handed to every redelivery, each partition's offset committed only past records
//! that ended, failing records retried then sent to a dead-letter topic.
//!
//! A consumer group delivers at least once: a consumer that dies after a record's side effect
//! and before its offset commit hands the record to the next one, and a producer that retries
//! a send writes the record twice. [`KafkaConsumer::next`] runs each record under the task's
//! lock and completion marker, so a redelivery whose work is done ends with the stored value
//! instead of doing the work again.
//!
//! ```no_run
//! use idempotask::{RetryPolicy, Task};
//! use idempotask_kafka::{Handled, Idempotent, KeyFrom};
//! use idempotask_redis::RedisStore;
//! use rdkafka::ClientConfig;
//!
//! static CHARGE: Task = Task::new("order_charge").retry(RetryPolicy::no_wait());
//!
//! #[derive(serde::Deserialize)]
//! struct Order { amount: u64 }
//!
//! async fn charge(amount: u64) -> Result<String, std::io::Error> {
//!     Ok(format!("ch_{amount}"))
//! }
//!
//! # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = RedisStore::connect("redis://127.0.0.1:6379").await?;
//! let mut config = ClientConfig::new();
//! config.set("bootstrap.servers", "127.0.0.1:9092").set("group.id", "chargers");
//! // The topics `orders` and `orders.dead` exist.
//! let mut consumer = Idempotent::new(CHARGE.clone(), KeyFrom::header("order_id"))
//!     .store(store)
//!     .subscribe(&config, &["orders"], |record| {
//!         let order: Order = record.json()?;
//!         Ok(charge(order.amount))
//!     })
//!     .await?;
//! loop {
//!     let processed = consumer.next().await?;
//!     if let Handled::Done(report) = &processed.handled {
//!         println!("offset {}: {} ({:?})", processed.offset, report.value, report.outcome);
//!     }
//! }
//! # }
//! ```
//!
//! # Behaviour
//! Every setting of the [`Task`](idempotask::Task) applies (lock TTL, result TTL, lock
//! renewal, retry policy, key logging); the store is the installed one unless
//! [`Idempotent::store`] names another. Kafka has no negative acknowledgement and no delayed
//! redelivery: a record that must wait waits in this consumer, and its partition's commit
//! waits with it.
//!
//! | the call ends with | [`Handled`] | the partition gets |
//! | --- | --- | --- |
//! | the body's `Ok`, stored, or a stored value replayed (the body did not run) | `Done` | its offset committed past the record, once every earlier record of the partition ended |
//! | the body's `Ok`, but its lock expired first or its marker could not be written (`LockLost`, `MarkerNotWritten`) | `Done` | the same: the side effect happened; running it again would not undo it |
//! | the body's `Err`, or a panic in it ([`BodyFailure`]): the lock is released, nothing is stored | `Failed` | nothing: the record runs again here after the [`failure_backoff`](Idempotent::failure_backoff) |
//! | the body's [`max_failures`](Idempotent::max_failures)-th failure | `DeadLettered(GaveUp)` | a copy on the dead-letter topic; once the broker acknowledged it, the offset moves past the record |
//! | the key is busy ([`Error::Contended`](idempotask::Error::Contended)) | `Deferred` | nothing: it runs again here after the holder's remaining lock time |
//! | the store failed or none is installed; the task is misused (logged as an error) | `Deferred` | nothing, ever, while the store is down: it runs again here after the [`store_backoff`](Idempotent::store_backoff) |
//! | the record has no key ([`MissingKey`]), a header whose name is not UTF-8, or the body's closure refused it ([`BadRecord`]: a payload that does not decode) | `DeadLettered` | the copy, then the commit; nothing ran |
//! | the key cannot be used (`InvalidKey`, `KeyReuse`, `Codec`, `MarkerKeyMismatch`) | `DeadLettered(Refused)` | the same; no delivery can succeed |
//! | the unit is in doubt and the task holds such units ([`Error::InDoubt`](idempotask::Error::InDoubt)) | `DeadLettered(InDoubt)` | the same, reason `in-doubt`: resolve the unit (`idempotask resolve`), then produce the copy back |
//!
//! A dead-letter copy has the record's key, payload and headers, followed by
//! [`SOURCE_HEADER`] (`topic/partition@offset`), [`REASON_HEADER`] ([`Rejection::reason`]) and
//! [`ERROR_HEADER`] (the error's text). The copy is sent before the offset moves: a consumer
//! that dies in between sends it again on the next delivery. rdkafka cannot read a header
//! whose name is not UTF-8 (it panics; the consumer catches that, and the panic hook still
//! prints it): such a record is a [`BadRecord`], and its copy carries its other headers only.
//!
//! # Offsets
//! Each partition commits the offset of its first record that has not ended (or one past its
//! last when all have), so no offset is ever committed past a record that did not end or
//! whose dead-letter copy was not acknowledged; a record still running holds back its own
//! partition only. Commits are asynchronous after each record, synchronous at
//! [`KafkaConsumer::close`] and when a rebalance takes partitions away. A commit the broker
//! refuses, or a paused partition that cannot be resumed, is an error that the next call of
//! [`KafkaConsumer::next`] returns (after the record whose end caused it); the commit is sent
//! again with the next one, the resume tried again when the next record ends.
//! [`KafkaConsumer::close`] waits at most [`revoke_wait`](Idempotent::revoke_wait) for the
//! running records: a record that waits for a store that is down is stopped, and no offset is
//! committed past it.
//!
//! # Long bodies and rebalances
//! Records run on the runtime as tasks of their own while [`KafkaConsumer::next`] keeps
//! polling, so a body longer than `max.poll.interval.ms` does not get the consumer evicted from
//! its group, as long as `next` is called. A partition with
//! [`max_in_flight`](Idempotent::max_in_flight) records running keeps its further records
//! waiting in order; polling stops while [`max_waiting`](Idempotent::max_waiting) wait, and
//! the partition is paused if that lasts half of `max.poll.interval.ms`. When a rebalance takes partitions away,
//! the revoke waits up to [`revoke_wait`](Idempotent::revoke_wait) for their running records
//! to end, stops those that did not (their locks released), commits their offsets and then
//! completes: no body keeps running for a partition this consumer no longer owns, as long as
//! the bodies yield. A body is stopped at an `.await`; one that blocks its thread runs until
//! it yields or ends, and its end then counts for nothing here (the record runs again on the
//! member that owns the partition).
//!
//! # The key
//! [`KeyFrom::Header`] (a header the producer wrote: the key to use when a producer may
//! retry a send), [`KeyFrom::RecordKey`], or [`KeyFrom::Position`] (`topic/partition@offset`:
//! every delivery of one record is one unit, but two sends of one job are two). A record
//! without its key goes to the dead-letter topic with [`MissingKey`], never run unprotected.

//!
//! # Tested on
//! `tests/kafka.rs` runs on [tansu](https://github.com/tansu-io/tansu) 0.6, a Kafka-protocol
//! broker, through librdkafka 2.12 (rdkafka's `cmake-build`): every row of the table above as
//! the broker saw it (the group's committed offsets, the dead-letter topic's headers), a long
//! body holding back only its partition, a revoke stopping a revoked partition's body, and a
//! worker process killed with SIGKILL after its side effects and markers and before its
//! commits. The crash tests assign the partition by hand ([`Idempotent::assign`]) with
//! offsets committed to the group, so that the next consumer starts at once instead of after
//! the killed member's `session.timeout.ms` (tansu, like Kafka, takes the partitions of a
//! member that stopped heartbeating back only then).

#![cfg_attr(docsrs, feature(doc_cfg))]

mod consumer;
mod error;
mod handled;
mod idempotent;
mod key;
mod offsets;
mod rebalance;
mod record;
mod unit;

pub use consumer::KafkaConsumer;
pub use error::ConsumeError;
pub use handled::{Handled, Processed, Rejection};
pub use idempotask_consumer::BodyFailure;
pub use idempotent::{
    DEFAULT_DEAD_LETTER_TIMEOUT, DEFAULT_FAILURE_BACKOFF, DEFAULT_MAX_FAILURES,
    DEFAULT_MAX_IN_FLIGHT, DEFAULT_MAX_WAITING, DEFAULT_REVOKE_WAIT, DEFAULT_STORE_BACKOFF,
    Idempotent,
};
pub use key::{KeyFrom, MissingKey};
pub use record::{BadRecord, Record};
pub use unit::{ERROR_HEADER, REASON_HEADER, SOURCE_HEADER};
