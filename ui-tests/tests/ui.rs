//! The compile-fail and compile-pass suite of `#[idempotent_task]`.
//!
//! Snapshots are for this machine's stable toolchain; regenerate them with
//! `TRYBUILD=overwrite cargo test -p idempotask-ui-tests` and read the diff before committing.

#[test]
fn ui() {
    let cases = trybuild::TestCases::new();
    cases.pass("pass/*.rs");
    cases.compile_fail("fail/*.rs");
}
