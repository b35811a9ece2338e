//! The conformance suite on `MemoryStore`.

idempotask_conformance::conformance_tests!(((), idempotask::MemoryStore::new()));
