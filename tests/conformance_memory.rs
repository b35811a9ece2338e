//! The conformance suite on `MemoryStore`.

idempotask_conformance::conformance_tests!(((), idempotask::MemoryStore::new()));
idempotask_conformance::doubt_conformance_tests!(((), idempotask::MemoryStore::new()));
