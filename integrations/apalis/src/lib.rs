//! Run [apalis](https://docs.rs/apalis) 1.0 jobs through an idempotask [`Task`]: each job at most once per
//! key, its `Ok` value stored and handed to every redelivery.
//!
//! apalis delivers at least once: a worker whose heartbeat stops has its jobs put back
//! (`reenqueue_orphaned`), and failed jobs are retried. [`Idempotent`] wraps the job handler so a
//! redelivered job whose work is already done answers the stored value instead of doing the work
//! again, and the backend acks it as done with the same result.
//!
//! ```
//! use apalis_core::backend::TaskSink;
//! use apalis_core::backend::memory::MemoryStorage;
//! use apalis_core::error::BoxDynError;
//! use apalis_core::worker::builder::WorkerBuilder;
//! use apalis_core::worker::event::Event;
//! use apalis_core::worker::ext::event_listener::EventListenerExt;
//! use idempotask_apalis::Idempotent;
//! use idempotask::{MemoryStore, Task};
//! use std::sync::atomic::{AtomicU32, Ordering};
//!
//! #[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
//! struct Order { id: u64 }
//!
//! static CHARGE: Task = Task::new("order_charge");
//! static CHARGES: AtomicU32 = AtomicU32::new(0);
//!
//! async fn charge(order: Order) -> Result<String, BoxDynError> {
//!     CHARGES.fetch_add(1, Ordering::SeqCst);
//!     Ok(format!("ch_{}", order.id))
//! }
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), BoxDynError> {
//! idempotask::install(MemoryStore::new()); // RedisStore::connect(url).await? in production
//! let mut queue = MemoryStorage::new();
//! queue.push(Order { id: 7 }).await?;
//! queue.push(Order { id: 7 }).await?; // the same order, delivered again
//!
//! let charge_once = Idempotent::new(CHARGE.clone(), |order: &Order| {
//!     format!("order-charge-{}", order.id)
//! });
//! let answered = AtomicU32::new(0);
//! WorkerBuilder::new("charger")
//!     .backend(queue)
//!     .on_event(move |worker, event| {
//!         if matches!(event, Event::Success(_)) && answered.fetch_add(1, Ordering::SeqCst) == 1 {
//!             let _ = worker.stop();
//!         }
//!     })
//!     .build(charge_once.handler(charge))
//!     .run()
//!     .await?;
//! assert_eq!(CHARGES.load(Ordering::SeqCst), 1);
//! # Ok(()) }
//! ```
//!
//! # Composition: wrap the handler
//!
//! Pass the wrapped handler to `build`: `.build(Idempotent::new(task, key).handler(my_handler))`.
//! The wrapped handler is the innermost service of the worker, so every layer of the worker (the
//! backend's ack and result persistence, apalis's retry, timeouts, tracing, your own) sees the
//! job's outcome exactly as if the handler had produced it, whatever order apalis gives its
//! layers: a redelivered duplicate returns the stored value, so it is acked as done.
//!
//! [`Idempotent`] is also a tower [`Layer`](apalis_core::layers::Layer) for a handler that is
//! already a service (`.build(idempotent.layer(my_service))`). Adding it with
//! `WorkerBuilder::layer` works too, but then every layer added after it sits *inside* it and is
//! skipped for duplicates (an `ack_with` added later would never ack a replayed job); wrapping the
//! handler leaves no such order to get wrong.
//!
//! # Behaviour
//! Every setting of the [`Task`] applies (lock TTL, result TTL, lock renewal, retry policy, key
//! logging); the store is the installed one unless [`Idempotent::store`] names another.
//!
//! | the call ends with | the job gets | apalis then |
//! | --- | --- | --- |
//! | the handler's `Ok`, stored | the value | acks it as done |
//! | a stored value (a duplicate) | the stored value; the handler does not run | acks it as done |
//! | the handler's `Err` | that error, untouched (an `AbortError` stays one); the lock is released and nothing is stored | retries or kills it, as for any handler error |
//! | a panic in the handler | [`Panicked`](idempotask::Panicked), with the panic's message; the lock is released and nothing is stored | retries it as it retries any handler error |
//! | the key is busy after the task's [`RetryPolicy`](idempotask::RetryPolicy) ([`Error::Contended`](idempotask::Error::Contended)) | a `RetryAfterError` whose source is that error, with the holder's remaining lock time | retries it later (status `Pending`); nothing ran |
//! | the store failed ([`Error::Store`](idempotask::Error::Store)) or none is installed; or idempotask is misused ([`Error::is_misuse`](idempotask::Error::is_misuse): a bug of the worker, not of the job) | that [`Error`](idempotask::Error), not an `AbortError` | retries it as it retries any failure (status `Failed`), up to its retry policy |
//! | the key cannot be used ([`MissingKey`], [`Error::InvalidKey`](idempotask::Error::InvalidKey), [`Error::KeyReuse`](idempotask::Error::KeyReuse), [`Error::Codec`](idempotask::Error::Codec), [`Error::MarkerKeyMismatch`](idempotask::Error::MarkerKeyMismatch)) | an `AbortError` whose source is that error | kills it: no retry can succeed |
//! | the unit is in doubt and the task holds such units ([`Error::InDoubt`](idempotask::Error::InDoubt), [`InDoubt::Hold`](idempotask::InDoubt::Hold)): an earlier delivery's lock ran out without a release or a result | an `AbortError` whose source is that error, which says the unit is in doubt and an operator must resolve it; the handler does not run | kills it (status `Killed`), never retries it: every retry would be held the same until an operator resolves the unit (`idempotask resolve`: records a result or frees it); then push the job again, and it replays or runs |
//!
//! The rows follow [`Error::redelivery`](idempotask::Error::redelivery), the classification every
//! idempotask queue integration shares.
//!
//! Keep the lock TTL well under the backend's orphan timeout (apalis-redis and apalis-postgres:
//! `heartbeat_interval × missed_heartbeats`, 300 s by default), or turn on
//! [`Task::renew`]: a redelivery that arrives while the first worker still holds the lock waits
//! and is retried; one that arrives after the lock expired runs the job again.
//!
//! # The key
//! The key comes from the job's arguments (`|order: &Order| format!("order-charge-{}",
//! order.id)`), or, opted in, from the key the producer pushed the job with:
//! `Idempotent::new(CHARGE.clone(), IdempotencyKey)` ([`IdempotencyKey`]). A job pushed without
//! one is aborted ([`MissingKey`]), not run unprotected.
//!
//! # apalis's own idempotency key, and what this adds
//!
//! | | apalis `idempotency_key` (`TaskBuilder::idempotency_key`) | `idempotask-apalis` |
//! | --- | --- | --- |
//! | when | when the job is pushed (`SET NX` on Redis, a unique index on PostgreSQL) | when the job runs |
//! | stops | the same job pushed twice | the same job run twice: a redelivery after a worker died before its ack (orphan re-enqueue), a retry after a partial success, a job pushed again under another apalis key (when keyed by the arguments), a replayed dead job |
//! | result | not stored | the `Ok` value, stored for `result_ttl` and returned to every duplicate |
//! | while it runs | nothing stops a second worker | a lock: one worker at a time, the others wait or are retried later |
//!
//! Both together are the usual setup: the push key keeps the queue free of copies, idempotask
//! keeps the copies apalis makes itself from doing the work twice.
//!
//! # The `apalis_worker` example
//!
//! ```sh
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --example apalis_worker --features apalis
//! REDIS_URL=redis://127.0.0.1:6379 DATABASE_URL=postgres://postgres@127.0.0.1/postgres \
//!     cargo run --example apalis_worker --features apalis
//! ```
//!
//! One worker process; the queue is apalis-redis, or apalis-postgres when `DATABASE_URL` is set;
//! the idempotask store is the Redis at `REDIS_URL` in both cases. Its test
//! (`tests/example_queues.rs`) pushes 12 orders, runs three copies, kills with SIGKILL the one
//! that charges order 5 first, after the charge and before its ack (`CRASH_BEFORE_ACK=5`), and
//! lets 3 jobs fail once. A typical run: with idempotask 18 deliveries, 12 charges, 3 answered
//! from the store (order 5, and jobs the killed worker had finished that the queue had not yet
//! marked done), 0 orders charged twice, 12 jobs done; with `WITHOUT_IDEMPOTASK=1` 14 to 16
//! charges, the killed worker's orders charged twice.
//!
//! A crash *during* the handler, after the charge and before the result is stored, is not
//! covered: the redelivery runs the handler again once the lock expires. The charge itself must
//! then be idempotent where it lands (a database constraint, the payment provider's idempotency
//! key); see the core's
//! [guarantees guide](https://docs.rs/idempotask/latest/idempotask/guide/guarantees/index.html).

mod key;
mod service;

use std::sync::Arc;

pub use key::{IdempotencyKey, JobKey, MissingKey};
pub use service::IdempotentService;

use idempotask::Task;
use idempotask::store::{SharedStore, Store};

/// Runs each apalis job through a [`Task`]: the key comes from the job through `K` (a
/// `Fn(&Args) -> String`, or [`IdempotencyKey`]).
///
/// Wrap the job handler with [`handler`](Self::handler) and give the result to
/// `WorkerBuilder::build`; see the [module docs](self) for why there and for what each outcome
/// becomes.
///
/// ```
/// use std::time::Duration;
/// use apalis_core::backend::memory::MemoryStorage;
/// use apalis_core::error::BoxDynError;
/// use apalis_core::worker::builder::WorkerBuilder;
/// use idempotask_apalis::{IdempotencyKey, Idempotent};
/// use idempotask::Task;
///
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct Order { id: u64 }
///
/// async fn charge(order: Order) -> Result<String, BoxDynError> {
///     Ok(format!("ch_{}", order.id))
/// }
///
/// static CHARGE: Task = Task::new("order_charge")
///     .lock_ttl(Duration::from_secs(60))
///     .renew(true);
///
/// // Keyed by the job's arguments…
/// let by_order = Idempotent::new(CHARGE.clone(), |order: &Order| {
///     format!("order-charge-{}", order.id)
/// });
/// let worker = WorkerBuilder::new("charger")
///     .backend(MemoryStorage::new())
///     .build(by_order.handler(charge));
///
/// // …or by the key the producer pushed the job with.
/// let by_push_key = Idempotent::new(CHARGE.clone(), IdempotencyKey);
/// let other = WorkerBuilder::new("charger-2")
///     .backend(MemoryStorage::new())
///     .build(by_push_key.handler(charge));
/// # let _ = (worker, other);
/// ```
pub struct Idempotent<K> {
    task: Arc<Task>,
    key: Arc<K>,
    store: Option<SharedStore>,
}

impl<K> Idempotent<K> {
    /// Jobs run through `task`, keyed by `key`.
    pub fn new(task: Task, key: K) -> Self {
        Self {
            task: Arc::new(task),
            key: Arc::new(key),
            store: None,
        }
    }

    /// Uses `store` instead of the installed one.
    ///
    /// ```
    /// use idempotask_apalis::Idempotent;
    /// use idempotask::{MemoryStore, Task};
    ///
    /// let layer = Idempotent::new(Task::new("refund"), |order: &u64| format!("refund-{order}"))
    ///     .store(MemoryStore::new());
    /// assert_eq!(layer.task().name(), "refund");
    /// ```
    #[must_use]
    pub fn store(mut self, store: impl Store) -> Self {
        self.store = Some(SharedStore::new(store));
        self
    }

    /// The task every job runs through.
    pub fn task(&self) -> &Task {
        &self.task
    }
}

impl<K> Clone for Idempotent<K> {
    fn clone(&self) -> Self {
        Self {
            task: Arc::clone(&self.task),
            key: Arc::clone(&self.key),
            store: self.store.clone(),
        }
    }
}

impl<K> std::fmt::Debug for Idempotent<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Idempotent")
            .field("task", &self.task)
            .field("key", &std::any::type_name::<K>())
            .field("store", &self.store.as_ref().map(|_| "own store"))
            .finish()
    }
}
