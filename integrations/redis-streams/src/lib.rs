//! Consume [Redis Streams](https://redis.io/docs/latest/develop/data-types/streams/) through an
//! idempotask [`Task`](idempotask::Task), as a member of a consumer group: each entry's work at
//! most once per key, its `Ok` value stored and handed to every redelivery, `XACK` only once
//! the result is stored, the entries of consumers that died claimed by the others
//! (`XAUTOCLAIM`), a dead-letter stream, and trimming that never drops an unacknowledged entry.
//!
//! A consumer group delivers at least once: an entry stays pending until it is acked, and an
//! entry whose consumer died (a crash, a kill, a lost connection between its work and its
//! `XACK`) is claimed by another consumer and runs again; a producer that retries an `XADD`
//! adds the entry twice. [`StreamConsumer::next_batch`] runs each entry under the task's lock
//! and completion marker, so a redelivery whose work is done is acked with the stored value
//! instead of doing the work again.
//!
//! ```no_run
//! use idempotask::store::BatchingStore;
//! use idempotask::{RetryPolicy, Task};
//! use idempotask_redis::RedisStore;
//! use idempotask_redis_streams::{Field, Handled, Idempotent};
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
//! let url = "redis://127.0.0.1:6379";
//! let store = BatchingStore::new(RedisStore::connect(url).await?);
//! let mut consumer = Idempotent::new(CHARGE.clone(), Field::new("order_id"))
//!     .store(store)
//!     .consume(url, "orders", "chargers", "worker-1")
//!     .await?;
//! // redis-cli XADD orders '*' order_id 7 order '{"amount":500}'
//! loop {
//!     for processed in consumer
//!         .next_batch(|entry| {
//!             let order: Order = entry.json("order")?;
//!             Ok(charge(order.amount))
//!         })
//!         .await?
//!     {
//!         if let Handled::Acked(report) = &processed.handled {
//!             println!("{}: {} ({:?})", processed.id, report.value, report.outcome);
//!         }
//!     }
//! }
//! # }
//! ```
//!
//! # Behaviour
//! Every setting of the [`Task`](idempotask::Task) applies (lock TTL, result TTL, lock
//! renewal, retry policy, key logging); the store is the installed one unless
//! [`Idempotent::store`] names another. A batch is settled in one `MULTI` transaction: the
//! acks, the dead letters and the failure counts of all its entries.
//!
//! | the call ends with | [`Handled`] | the group gets |
//! | --- | --- | --- |
//! | the body's `Ok`, stored, or a stored value replayed (the body did not run) | `Acked` | `XACK` |
//! | the body's `Ok`, but its lock expired first or its marker could not be written (`LockLost`, `MarkerNotWritten`) | `Acked` | `XACK`: the side effect happened; running it again would not undo it |
//! | the body's `Err`, or a panic in it ([`BodyFailure`]): the lock is released, nothing is stored | `Failed` | no ack: the failure count goes to a hash (`<stream>:<group>:failures`), the entry stays pending and this consumer runs it again after the [`failure_backoff`](Idempotent::failure_backoff) |
//! | the body's [`max_failures`](Idempotent::max_failures)-th failure | `DeadLettered(GaveUp)` | `XADD` to the dead-letter stream, `XACK` |
//! | the key is busy ([`Error::Contended`](idempotask::Error::Contended)) | `Deferred` | no ack: pending, run again here after the holder's remaining lock time |
//! | the store failed or none is installed; the task is misused (logged as an error) | `Deferred` | no ack, ever, while the store is down: pending, run again here after the [`store_backoff`](Idempotent::store_backoff) |
//! | the entry has no key ([`MissingKey`]), or the body's closure refused it ([`BadEntry`]: a field missing, a payload that does not decode) | `DeadLettered` | `XADD` to the dead-letter stream with the error, `XACK`; nothing ran |
//! | the key cannot be used (`InvalidKey`, `KeyReuse`, `Codec`, `MarkerKeyMismatch`) | `DeadLettered(Refused)` | the same; no delivery can succeed |
//! | the unit is in doubt and the task holds such units ([`Error::InDoubt`](idempotask::Error::InDoubt)) | `DeadLettered(InDoubt)` | the same, with reason `in-doubt`: resolve the unit (`idempotask resolve`), then `XADD` the entry back |
//! | a delivery beyond [`max_deliveries`](Idempotent::max_deliveries) (its consumers kept dying before settling it) | `DeadLettered(TooManyDeliveries)` | the same; nothing ran |
//!
//! [`StreamConsumer::next_batch`] runs and settles in one call; [`StreamConsumer::run_batch`]
//! answers a [`Batch`] that [`StreamConsumer::settle`] writes later, for a consumer that
//! records something between the two (until then the entries stay pending: a crash there
//! leaves them to be claimed, and their stored results are replayed).
//!
//! A dead-letter entry is the original's fields followed by [`SOURCE_ID_FIELD`] (the
//! original's id), [`REASON_FIELD`] ([`Rejection::reason`]) and [`ERROR_FIELD`] (the error's
//! text), added to the dead-letter stream in the transaction that acks the original: the entry
//! is never acked without its copy, nor copied without its ack.
//!
//! # Deferral: pending, not re-added
//! Redis Streams has no delayed redelivery. An entry that must wait (a failed body, a busy
//! key, a store that is down) is left pending, under this consumer, and kept in the
//! [`StreamConsumer`], which runs it again when its delay is over; it is not re-added to the
//! stream, which would give it a new id, lose its delivery count and let it run at once on
//! another consumer. While it waits (and while a body runs), the consumer takes its entries
//! back every third of [`claim_idle`](Idempotent::claim_idle) (`XCLAIM … JUSTID`), which
//! resets their idle time without counting a delivery, so other consumers do not claim them.
//! A consumer that stops (crash, kill, a hung process) stops doing that, and its entries are
//! claimed by the others once they have been idle for `claim_idle`.
//!
//! # The clocks: `claim_idle` against `lock_ttl`
//! - [`Idempotent::consume`] refuses a `claim_idle` shorter than the task's lock TTL: the
//!   entries of a crashed consumer would be claimed while its locks still hold their keys.
//!   With `claim_idle ≥ lock_ttl`, the claim finds the lock gone and runs (or replays) at once.
//! - Keep both backoffs' bounds below `claim_idle`, and a body's run within it unless the
//!   consumer's task keeps running (the refresh runs beside the bodies, on the same task).
//! - **Deliveries count claims**: 1 for the first read, one more for each `XAUTOCLAIM`. An
//!   entry claimed more than [`max_deliveries`](Idempotent::max_deliveries) times is
//!   dead-lettered without running: it is the entry that kills its consumer every time, which
//!   no failure count can see. Local retries do not count.
//! - **The failure count lives in Redis** (the hash `<stream>:<group>:failures`, its field
//!   removed when the entry is acked or dead-lettered), so a body that keeps failing reaches
//!   [`max_failures`](Idempotent::max_failures) across crashes. When it cannot be read, the
//!   entry's deliveries before this one count instead.
//! - Give queue tasks [`RetryPolicy::no_wait`](idempotask::RetryPolicy::no_wait): a busy key
//!   then waits pending for the holder's remaining lock time instead of holding its batch.
//!
//! # Batches
//! One read asks for up to [`batch_size`](Idempotent::batch_size) entries; they run at the
//! same time and are settled together. Over a `RedisStore`, which the consumer wraps in a
//! [`BatchingStore`](idempotask::store::BatchingStore) itself (or one wrapped already, as
//! above), the batch's `begin`s reach the store as one pipeline, and so do its `finish`es. A slow body holds its batch's acks.
//!
//! A group that is gone (its stream deleted, or a Redis without persistence restarted) is
//! created again at the stream's start on the next read, with a warning; the entries it held
//! pending went with it, and so do those this consumer kept for a later try.
//!
//! # Trimming
//! [`StreamConsumer::trim`] removes the entries every group has acknowledged: one script
//! finds, for each group, its oldest pending entry (or, with none, the entry after the last
//! one it read) and trims with `XTRIM MINID` up to the lowest of them. No pending entry, and
//! no entry some group has yet to read, is ever removed. Do not trim with `MAXLEN` on `XADD`
//! as well: that drops entries whatever their state.
//!
//! # The key
//! [`Field`] (a field the producer wrote, the key to use when a producer may retry its
//! `XADD`), [`EntryId`] (the entry's id: every delivery of one entry is one unit, but two
//! `XADD`s of one job are two), or any `Fn(&Entry) -> Option<String>`. An entry without a key is
//! dead-lettered with [`MissingKey`], never run unprotected.
//!
//! # The `redis_streams_worker` example
//! `cargo run --example redis_streams_worker --features redis-streams` (with `REDIS_URL`):
//! one worker on the stream `orders` (or `$QUEUE`), charging each order at a stand-in gateway
//! that counts charges in Redis. `tests/example_queues.rs` runs three copies, adds 12 orders,
//! kills with SIGKILL the copy that charged order 5 before its `XACK`, and reads the charges
//! from Redis: every order is charged once; the bare consumer (`WITHOUT_IDEMPOTASK=1`)
//! charges order 5 twice. One run (Redis 7.0):
//!
//! | | deliveries | side effects (charges) | orders charged twice | killed workers |
//! | --- | --- | --- | --- | --- |
//! | with idempotask | 16 (12 + 3 failed once + 1 claimed after the kill, replayed) | 12 | 0 | 1 |
//! | `WITHOUT_IDEMPOTASK=1` | 16 | 13 | 1 (order 5) | 1 |

#![cfg_attr(docsrs, feature(doc_cfg))]

mod batch;
mod consumer;
mod entry;
mod error;
mod handled;
mod key;
mod ops;
mod stream;

pub use batch::Batch;
pub use consumer::{
    DEFAULT_BATCH_SIZE, DEFAULT_BLOCK, DEFAULT_CLAIM_IDLE, DEFAULT_FAILURE_BACKOFF,
    DEFAULT_MAX_DELIVERIES, DEFAULT_MAX_FAILURES, DEFAULT_STORE_BACKOFF, Idempotent,
};
pub use entry::{BadEntry, Entry};
pub use error::StreamError;
pub use handled::{Handled, Processed, Rejection};
pub use idempotask_consumer::BodyFailure;
pub use key::{EntryId, EntryKey, Field, MissingKey};
pub use ops::{ERROR_FIELD, REASON_FIELD, SOURCE_ID_FIELD};
pub use stream::StreamConsumer;
