//! The conformance suite on `MemoryStore`.

mod support;

use std::sync::Arc;

crate::conformance_tests!((
    (),
    Arc::new(idempotask::MemoryStore::new()) as Arc<dyn idempotask::Store>
));
