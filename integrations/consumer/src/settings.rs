//! The settings every queue consumer has, and their defaults.

use std::sync::Arc;
use std::time::Duration;

use idempotask::store::{BatchingStore, SharedStore, Store};
use idempotask::{Backoff, Task};

/// The redelivery delays of a message whose body failed
/// ([`ConsumerSettings::failure_backoff`]), by default: 100 ms after the first failure, doubling
/// with each further one up to 30 s, without jitter.
pub const DEFAULT_FAILURE_BACKOFF: Backoff =
    Backoff::new(Duration::from_millis(100), Duration::from_secs(30));
/// The redelivery delays of a message whose store call failed
/// ([`ConsumerSettings::store_backoff`]), by default: 100 ms after the first store error,
/// doubling with each further one up to 30 s, without jitter.
pub const DEFAULT_STORE_BACKOFF: Backoff =
    Backoff::new(Duration::from_millis(100), Duration::from_secs(30));
/// How many times a message's body may fail before the message is given up, by default.
pub const DEFAULT_MAX_FAILURES: u32 = 5;

/// The settings every queue consumer has: the task its messages run through, the store, the
/// payload check, the two backoffs and the failure limit. A queue integration holds one and
/// delegates its own builder's setters to it (with its own docs, and its own defaults where
/// its queue calls for others); [`run`](Self::run) maps a message's call onto a
/// [`Verdict`](crate::Verdict).
///
/// Cloning is cheap: the task is shared, the store is one pointer.
///
/// ```
/// use std::time::Duration;
/// use idempotask::{Backoff, MemoryStore, Task};
/// use idempotask_consumer::ConsumerSettings;
///
/// let settings = ConsumerSettings::new(Task::new("refund"))
///     .store(MemoryStore::new())
///     .fingerprint_payload(true)
///     .failure_backoff(Backoff::new(Duration::from_millis(50), Duration::from_secs(5)))
///     .store_backoff(Backoff::new(Duration::from_millis(200), Duration::from_secs(10)).full_jitter(true))
///     .max_failures(3);
/// assert_eq!(settings.task().name(), "refund");
/// ```
#[derive(Clone)]
pub struct ConsumerSettings {
    pub(crate) task: Arc<Task>,
    /// The store the calls use: [`given_store`](Self::given_store), in a [`BatchingStore`] when
    /// it batches natively and `batch_store_calls` is on.
    pub(crate) store: Option<SharedStore>,
    given_store: Option<SharedStore>,
    batch_store_calls: bool,
    pub(crate) fingerprint_payload: bool,
    pub(crate) failure_backoff: Backoff,
    pub(crate) store_backoff: Backoff,
    pub(crate) max_failures: u32,
}

impl ConsumerSettings {
    /// Messages run through `task`, on the installed store, with [`DEFAULT_FAILURE_BACKOFF`],
    /// [`DEFAULT_STORE_BACKOFF`], [`DEFAULT_MAX_FAILURES`] and no payload check.
    pub fn new(task: Task) -> Self {
        Self {
            task: Arc::new(task),
            store: None,
            given_store: None,
            batch_store_calls: true,
            fingerprint_payload: false,
            failure_backoff: DEFAULT_FAILURE_BACKOFF,
            store_backoff: DEFAULT_STORE_BACKOFF,
            max_failures: DEFAULT_MAX_FAILURES,
        }
    }

    /// Checks that a key comes back with the same payload: a message whose key was used with
    /// another payload gets [`Error::KeyReuse`](idempotask::Error::KeyReuse) and is refused
    /// ([`Verdict::Refuse`](crate::Verdict::Refuse)), and the first payload's stored result
    /// stays (off by default; it hashes each payload with SHA-256).
    ///
    /// ```
    /// # use idempotask::Task;
    /// # use idempotask_consumer::ConsumerSettings;
    /// let checked = ConsumerSettings::new(Task::new("order_charge")).fingerprint_payload(true);
    /// # let _ = checked;
    /// ```
    #[must_use]
    pub fn fingerprint_payload(mut self, on: bool) -> Self {
        self.fingerprint_payload = on;
        self
    }

    /// Uses `store` instead of the installed one.
    ///
    /// A store that batches natively ([`Store::batches_natively`]: `RedisStore`, `PostgresStore`) is wrapped
    /// in a [`BatchingStore`], so that the messages a consumer runs at once reach it as one
    /// pipeline of `begin`s and one of `finish`es, unless
    /// [`batch_store_calls`](Self::batch_store_calls) is off. A store that does not, or one
    /// that batches already (a `BatchingStore`), is used as it is; so is the installed store
    /// when no store is given (install a `BatchingStore` to batch its calls).
    ///
    /// ```
    /// # use idempotask::{MemoryStore, Task};
    /// # use idempotask_consumer::ConsumerSettings;
    /// let own = ConsumerSettings::new(Task::new("order_charge")).store(MemoryStore::new());
    /// # let _ = own;
    /// ```
    #[must_use]
    pub fn store(mut self, store: impl Store) -> Self {
        self.given_store = Some(SharedStore::new(store));
        self.choose_store();
        self
    }

    /// Whether the calls to a store that batches natively go through a [`BatchingStore`]
    /// (default on; see [`store`](Self::store)). Off, each message's `begin` and `finish`
    /// reach the store on their own, as many round trips as messages.
    ///
    /// ```
    /// # use idempotask::{MemoryStore, Task};
    /// # use idempotask_consumer::ConsumerSettings;
    /// let one_by_one = ConsumerSettings::new(Task::new("order_charge"))
    ///     .store(MemoryStore::new())
    ///     .batch_store_calls(false);
    /// # let _ = one_by_one;
    /// ```
    #[must_use]
    pub fn batch_store_calls(mut self, batch: bool) -> Self {
        self.batch_store_calls = batch;
        self.choose_store();
        self
    }

    /// The store the calls use, from the store given and whether to batch its calls.
    fn choose_store(&mut self) {
        self.store = self.given_store.clone().map(|given| {
            if self.batch_store_calls && given.batches_natively() {
                SharedStore::new(BatchingStore::new(given))
            } else {
                given
            }
        });
    }

    /// The delays of the redelivery that follows a body's failure (an `Err` or a panic): the
    /// backoff's delay for the message's failure count, 1 for its first (default
    /// [`DEFAULT_FAILURE_BACKOFF`]; at least [`MIN_DELAY`](crate::MIN_DELAY)).
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use idempotask::{Backoff, Task};
    /// # use idempotask_consumer::ConsumerSettings;
    /// let gentle = ConsumerSettings::new(Task::new("order_charge"))
    ///     .failure_backoff(Backoff::new(Duration::from_secs(1), Duration::from_secs(60)));
    /// # let _ = gentle;
    /// ```
    #[must_use]
    pub fn failure_backoff(mut self, backoff: Backoff) -> Self {
        self.failure_backoff = backoff;
        self
    }

    /// The delays of the redelivery of a message whose store call failed (or that found no
    /// store, or a misused task): the backoff's delay for the message's deferral count
    /// ([`History::deferrals`](crate::History::deferrals) plus this one), 1 for its first
    /// (default [`DEFAULT_STORE_BACKOFF`]; at least [`MIN_DELAY`](crate::MIN_DELAY)).
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use idempotask::{Backoff, Task};
    /// # use idempotask_consumer::ConsumerSettings;
    /// let patient = ConsumerSettings::new(Task::new("order_charge"))
    ///     .store_backoff(Backoff::new(Duration::from_secs(2), Duration::from_secs(60)).full_jitter(true));
    /// # let _ = patient;
    /// ```
    #[must_use]
    pub fn store_backoff(mut self, backoff: Backoff) -> Self {
        self.store_backoff = backoff;
        self
    }

    /// The failure of a message's body on which the message is given up instead of retried
    /// (default [`DEFAULT_MAX_FAILURES`]; at least 1), so that a message no delivery can
    /// succeed with does not loop for ever. Only the body's failures count: a deferral for a
    /// busy key or a store error does not, so a store outage never uses up a message's tries.
    ///
    /// ```
    /// # use idempotask::Task;
    /// # use idempotask_consumer::ConsumerSettings;
    /// // 0 would give up before the first try: it is taken as 1.
    /// let once = ConsumerSettings::new(Task::new("order_charge")).max_failures(0);
    /// # let _ = once;
    /// ```
    #[must_use]
    pub fn max_failures(mut self, failures: u32) -> Self {
        self.max_failures = failures.max(1);
        self
    }

    /// The task every message runs through.
    ///
    /// ```
    /// # use idempotask::Task;
    /// # use idempotask_consumer::ConsumerSettings;
    /// assert_eq!(ConsumerSettings::new(Task::new("refund")).task().name(), "refund");
    /// ```
    pub fn task(&self) -> &Task {
        &self.task
    }
}

impl std::fmt::Debug for ConsumerSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsumerSettings")
            .field("task", &self.task)
            .field("store", &self.store.as_ref().map(|_| "own store"))
            .field(
                "given_store",
                &self.given_store.as_ref().map(|_| "as given"),
            )
            .field("batch_store_calls", &self.batch_store_calls)
            .field("fingerprint_payload", &self.fingerprint_payload)
            .field("failure_backoff", &self.failure_backoff)
            .field("store_backoff", &self.store_backoff)
            .field("max_failures", &self.max_failures)
            .finish()
    }
}
