//! The process-wide store that tasks use when they name none.

use std::sync::{Arc, PoisonError, RwLock};

use crate::store::Store;

static INSTALLED: RwLock<Option<Arc<dyn Store>>> = RwLock::new(None);

/// Makes `store` the one that every task without its own `store` uses from now on, and returns
/// the store it replaces.
///
/// Call it once at start-up, before the first task runs. Tasks that run with no store installed
/// fail with [`Error::NotConfigured`](crate::Error::NotConfigured); there is deliberately no
/// fallback.
///
/// ```
/// idempotask::install(idempotask::MemoryStore::new());
/// assert!(idempotask::installed().is_some());
/// ```
pub fn install(store: impl Store + 'static) -> Option<Arc<dyn Store>> {
    install_shared(Arc::new(store))
}

/// Like [`install`] for a store that is already shared.
pub fn install_shared(store: Arc<dyn Store>) -> Option<Arc<dyn Store>> {
    INSTALLED
        .write()
        .unwrap_or_else(PoisonError::into_inner)
        .replace(store)
}

/// The installed store, if any.
pub fn installed() -> Option<Arc<dyn Store>> {
    INSTALLED
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()
}
