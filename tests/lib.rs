//! The integration tests of idempotask and the examples they run; every target of this package
//! is a test or an example (see `Cargo.toml`), and this library is empty.
