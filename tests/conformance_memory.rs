//! The conformance suite on `MemoryStore`.

idempotask::conformance_tests!(((), idempotask::MemoryStore::new()));
