//! Make async tasks safe under at-least-once delivery.
//!
//! Every durable queue (Celery with `acks_late`, Redis visibility timeouts, SQS, Kafka, apalis,
//! Sidekiq) may deliver a message twice: a worker killed after the side effect and before the
//! ack, a visibility timeout shorter than the task, a partition, a retry after partial success,
//! a replayed dead-letter queue. idempotask runs each *unit of work* (a task name and a
//! caller-supplied idempotency key) at most once while its result is kept, and hands the stored
//! result to every duplicate:
//!
//! 1. the caller decides the key where the business decision is made;
//! 2. a lock with a random token (Redis `SET NX PX`, released only by its holder) keeps two
//!    deliveries from running at once, and waiters retry with backoff;
//! 3. a completion marker, written only after the body succeeded, holds the result;
//! 4. a fencing token, strictly increasing per key, lets a database reject a stale holder.
//!
//! A fresh execution costs two Redis commands and a duplicate one.
//!
//! ```
//! use idempotask::{MemoryStore, Task};
//!
//! static SEND_RECEIPT: Task = Task::new("send_receipt");
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idempotask::Error> {
//! idempotask::install(MemoryStore::new()); // RedisStore::connect(url).await? in production
//! let mut sent = 0;
//! for _delivery in 0..3 {
//!     let receipt: u32 = SEND_RECEIPT
//!         .call("order-42")
//!         .run(async {
//!             sent += 1;
//!             Ok::<_, idempotask::Error>(1001)
//!         })
//!         .await?;
//!     assert_eq!(receipt, 1001);
//! }
//! assert_eq!(sent, 1);
//! # Ok(()) }
//! ```
//!
//! Most code uses the [`idempotent_task`] attribute, which turns an `async fn` into such a task;
//! [`Task`] is the same without the attribute. The stores: `RedisStore` for production,
//! `RedisClusterStore` for a Redis Cluster, `RedlockStore` for a majority of
//! independent Redis servers, `PostgresStore` (feature `postgres`) for services without Redis
//! and for database work that must commit with its marker, [`MemoryStore`] for one process;
//! all implement
//! [`Store`](store::Store), which other backends can implement too. [`testing::deliver_concurrently`] fires
//! duplicate deliveries at your own tasks in tests.
//!
//! # The life of one delivery
//!
//! ```text
//!                       begin (1 round trip)
//!   delivery ──────────────────────────────────────┐
//!      ▲                                           │
//!      │ wait (full-jitter backoff)     ┌──────────┼───────────────┐
//!      └───────────────── Busy ◄────────┤          │               │
//!                (after max_attempts:   │        Done           Acquired(fencing token)
//!                 Error::Contended)     │          │               │
//!                                       │          ▼               ▼
//!                                       │   stored value      body runs (context() set,
//!                                       │   returned; body     lock renewed if `renew`)
//!                                       │   never runs           │
//!                                       │               ┌────────┼─────────────┐
//!                                       │              Ok       Err / panic   dropped
//!                                       │               │        │             │
//!                                       │   finish (1 round trip) release      release in
//!                                       │   marker stored,  (compare-and-      the background
//!                                       │   lock deleted    delete), nothing   (or TTL expiry)
//!                                       │   if still ours   cached
//!                                       └───────────────────────────────────────────────────
//! ```
//!
//! A fresh execution is `begin` + `finish`: two Redis commands. A duplicate is one `begin`.
//! See the README's "Guarantees and limits" for exactly what holds when workers crash, pause or
//! lose Redis.

mod call;
#[cfg(feature = "conformance")]
pub mod conformance;
mod context;
mod error;
mod fingerprint;
mod guard;
mod install;
mod marker;
mod names;
pub mod observe;
pub mod ops;
mod retry;
mod status;
pub mod store;
mod task;
pub mod testing;
mod unit;

pub use call::{Call, Outcome, Report};
pub use context::{TaskContext, context};
pub use error::{CodecErrorKind, Error};
pub use fingerprint::Fingerprint;
pub use install::{install, installed};
pub use observe::KeyLogging;
pub use retry::{DEFAULT_INITIAL_BACKOFF, DEFAULT_MAX_ATTEMPTS, DEFAULT_MAX_BACKOFF, RetryPolicy};
pub use store::memory::MemoryStore;
#[cfg(feature = "postgres")]
pub use store::postgres::{PostgresStore, PostgresStoreBuilder, PostgresTransaction};
pub use task::{DEFAULT_LOCK_TTL, DEFAULT_RESULT_TTL, MAX_TTL, Settings, Task};
pub use unit::InvalidKey;

#[doc = include_str!("attribute.md")]
#[doc(inline)]
pub use idempotask_macros::idempotent_task;

#[doc(hidden)]
pub mod __private;
