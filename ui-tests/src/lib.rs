//! Compile-fail and compile-pass cases of `#[idempotent_task]`, run by `tests/ui.rs`.
