//! The `#[idempotent_task]` attribute; use it through the `idempotask` crate.
