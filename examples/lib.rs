//! The examples of idempotask live next to this file, one program each; this library is empty.
//! It lets the integration tests ask for the examples with every feature on, so that one
//! `cargo test --workspace` builds them all before running them.
