//! The store that tasks use when they name none: one scoped to the running future, or else the
//! process-wide one.

use std::sync::{PoisonError, RwLock};

use crate::store::{SharedStore, Store};

static INSTALLED: RwLock<Option<SharedStore>> = RwLock::new(None);

tokio::task_local! {
    /// The store of [`with_store`], for the future it runs.
    static SCOPED: SharedStore;
}

/// Makes `store` the one that every task without its own `store` uses from now on, and returns
/// the store it replaces.
///
/// Call it once at start-up, before the first task runs. Tasks that run with no store installed
/// fail with [`Error::NotConfigured`](crate::Error::NotConfigured); there is deliberately no
/// fallback.
///
/// ```
/// assert!(idempotask::install(idempotask::MemoryStore::new()).is_none());
/// assert!(idempotask::install(idempotask::MemoryStore::new()).is_some());
/// ```
pub fn install(store: impl Store) -> Option<SharedStore> {
    INSTALLED
        .write()
        .unwrap_or_else(PoisonError::into_inner)
        .replace(SharedStore::new(store))
}

/// Runs `future` with `store` as the store of every task call in it that names none, ahead of
/// the [installed](install) one; calls outside it are unchanged.
///
/// This is the form for tests: cargo runs a binary's tests in parallel, and two tests that each
/// [`install`] a store replace each other's, so one test's duplicates meet the other's fresh
/// store and run again. A scoped store belongs to its test alone. The deliveries that
/// [`deliver_concurrently`](crate::testing::deliver_concurrently) spawns carry it along; a task
/// that code inside spawns with `tokio::spawn` does not (task-local values stay with their
/// task), so wrap that future in `with_store` too.
///
/// ```
/// use std::sync::atomic::{AtomicU32, Ordering};
/// use idempotask::{Error, MemoryStore, idempotent_task};
///
/// static SENT: AtomicU32 = AtomicU32::new(0);
///
/// #[idempotent_task(key = "receipt-{order_id}")]
/// async fn send_receipt(order_id: u64) -> Result<u64, Error> {
///     SENT.fetch_add(1, Ordering::SeqCst);
///     Ok(order_id)
/// }
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Error> {
/// idempotask::with_store(MemoryStore::new(), async {
///     send_receipt(7).await?;
///     send_receipt(7).await?;
///     Ok::<_, Error>(())
/// })
/// .await?;
/// assert_eq!(SENT.load(Ordering::SeqCst), 1);
/// # Ok(()) }
/// ```
pub async fn with_store<F: Future>(store: impl Store, future: F) -> F::Output {
    SCOPED.scope(SharedStore::new(store), future).await
}

/// The store scoped to the running future by [`with_store`], if any.
pub(crate) fn scoped() -> Option<SharedStore> {
    SCOPED.try_with(Clone::clone).ok()
}

/// The store a call that names none uses: the scoped one, else the installed one.
pub(crate) fn current() -> Option<SharedStore> {
    scoped().or_else(installed)
}

/// The installed store, if any (a store scoped with [`with_store`] is not: see
/// [`with_store`]).
pub fn installed() -> Option<SharedStore> {
    INSTALLED
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()
}
