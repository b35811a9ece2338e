//! The process-wide store that tasks use when they name none.

use std::sync::{PoisonError, RwLock};

use crate::store::{SharedStore, Store};

static INSTALLED: RwLock<Option<SharedStore>> = RwLock::new(None);

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

/// The installed store, if any.
pub fn installed() -> Option<SharedStore> {
    INSTALLED
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()
}
