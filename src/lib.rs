//! Examples and integration tests of idempotask, and its benchmark harness; the library lives in
//! `runtime/`.

pub mod bench;
