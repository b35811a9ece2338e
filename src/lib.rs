//! Examples and integration tests of idempotask; the library lives in `runtime/`.
