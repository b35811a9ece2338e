//! The conformance suite of [idempotask](https://docs.rs/idempotask): what every
//! [`Store`], and the task runner on top of it, must do. Every store
//! shipped with idempotask passes it; a store of one's own runs it from its tests.
//!
//! Each of the 36 checks (and 6 more for transactions, 8 for units left in doubt, 9 for steps) is an `async fn` that takes a fresh,
//! empty store and panics, like a test, when the store breaks the contract.
//! [`conformance_tests!`] turns the whole list into one `#[tokio::test]` per check, in a test
//! file of the crate that implements `Store`, with `idempotask-conformance` and `tokio`
//! (features `macros`, `rt-multi-thread`) as dev-dependencies:
//!
//! ```no_run
//! // tests/conformance.rs
//! idempotask_conformance::conformance_tests!((
//!     (), // a guard that lives as long as the check: a server, a temporary directory
//!     idempotask::MemoryStore::new(), // your store, fresh and empty for each check
//! ));
//! # fn main() {}
//! ```
//!
//! A store whose units live inside a database transaction
//! ([`TransactionScope`](idempotask::store::TransactionScope)) runs
//! [`transaction_conformance_tests!`] too, through [`OpensTransactions`]. [`CHECKS`] is the
//! same list as values, for a harness of one's own.
//!
//! A store that also implements [`Operator`](idempotask::operator::Operator), for operators'
//! tools, runs [`check_operator`] from one test of its own.
//!
//! The checks use short TTLs (100–300 ms) and wait them out, so a store must honour expiries to
//! the tens of milliseconds; the whole list takes a few seconds, and [`every_fault_point`] a minute
//! or two more (on `MemoryStore`; a store on a server, a few minutes).
//!
//! # The checks
//!
//! | what | checks |
//! |---|---|
//! | the store, operation by operation | [`begin_grants_one_holder_and_reports_busy`] to [`the_longest_ttls_are_kept`] |
//! | batches: each unit answered as if alone | [`a_batched_begin_answers_each_unit_as_alone`] to [`a_large_batch_answers_every_unit`] |
//! | the runner on top: replays, errors, panics, contention, renewal | [`a_duplicate_gets_the_stored_result_without_running`] to [`an_expired_lock_is_reported_as_lost`] |
//! | what the runner refuses to run or replay | [`a_reused_key_with_other_arguments_is_rejected`] to [`invalid_keys_are_rejected_before_the_store`] |
//! | the fencing counter at its edges | [`fencing_tokens_never_go_back_after_a_burst_and_an_expiry`], [`a_release_without_the_fencing_token_frees_the_lock`] |
//! | a lock that runs out under a delivery, and a body's fence | [`a_double_run_with_equal_results_is_reported_as_lost`], [`a_grant_that_arrives_after_its_lock_expired_does_not_run`], [`a_fence_stops_a_holder_whose_unit_was_taken_over`] |
//! | a call that stops half-way | [`a_call_dropped_while_begin_is_in_flight_leaves_no_lock`] to [`a_panic_while_encoding_the_result_frees_the_lock`] |
//! | every fault at every point of a call | [`every_fault_point`] |
//! | transactions | [`a_committed_transaction_is_replayed`] to [`a_plain_holder_makes_a_transaction_contended`] |
//! | units left in doubt ([`doubt_conformance_tests!`]) | [`a_lock_that_ran_out_is_taken_over_in_doubt`] to [`reconcile_records_what_the_downstream_system_knows`] |
//! | steps, for stores that record them ([`step_conformance_tests!`]) | [`only_the_holder_appends_at_the_next_position`] to [`the_step_in_doubt_gets_its_own_policy`] |
#![cfg_attr(docsrs, feature(doc_cfg))]
// The checks are public only through the list in `checks.rs`: a check left out of it is never
// reachable, and so dead code, which must fail the build and not only warn.
#![deny(dead_code)]

/// The `# Examples` section of a check's docs: the check alone, outside the macros.
macro_rules! example {
    ($check:ident) => {
        concat!(
            "\n\n# Examples\n\nOn its own, on `MemoryStore`:\n\n```no_run\n",
            "# #[tokio::main(flavor = \"multi_thread\", worker_threads = 2)] async fn main() {\n",
            "use idempotask::store::SharedStore;\n\n",
            "let store = SharedStore::new(idempotask::MemoryStore::new());\n",
            "idempotask_conformance::",
            stringify!($check),
            "(store).await;\n",
            "# }\n```",
        )
    };
    (transactions $check:ident) => {
        concat!(
            "\n\n# Examples\n\nOn its own, for any store that opens transactions:\n\n```no_run\n",
            "use idempotask_conformance::OpensTransactions;\n\n",
            "async fn check(store: impl OpensTransactions) {\n",
            "    idempotask_conformance::",
            stringify!($check),
            "(store).await;\n}\n```",
        )
    };
}

mod batch;
mod cancellation;
mod checks;
mod doubt;
mod faults;
mod fencing;
mod operator;
mod operator_steps;
mod overruns;
mod refusals;
mod runner;
mod slow;
mod step_doubt;
mod steps;
mod store;
mod transactions;

pub use checks::{CHECKS, Check};
pub use faults::FaultCensus;
pub use operator::check_operator;
pub use transactions::OpensTransactions;

crate::__checks!(reexports);

use std::time::Duration;

use idempotask::store::{Begin, Fencing, SharedStore, Store};
use idempotask::store::{LockToken, UnitOfWork};

pub(crate) const LONG: Duration = Duration::from_secs(30);
pub(crate) const DAY: Duration = Duration::from_secs(24 * 3600);

pub(crate) fn unit(key: &str) -> UnitOfWork {
    UnitOfWork::new("conformance", key).unwrap()
}

pub(crate) fn marker(key: &str, fence: Option<u64>, text: &str) -> Vec<u8> {
    // Stores see a marker as bytes that start with `D`; the real layout keeps the data
    // realistic. `text` tells deliveries apart, as the delivery field of a real marker does.
    let fence = fence.map_or_else(String::new, |fence| format!(",f{fence}"));
    format!(r#"D{}{fence}|{key}|"{text}""#, key.len()).into_bytes()
}

/// Takes the lock without fencing, as most tasks do.
pub(crate) async fn acquire(
    store: &SharedStore,
    unit: &UnitOfWork,
    token: &LockToken,
    ttl: Duration,
) {
    match store.begin(unit, token, ttl, Fencing::Off).await.unwrap() {
        Begin::Acquired {
            fencing_token: None,
            ..
        } => {}
        other => panic!("expected the lock without a fencing token, got {other:?}"),
    }
}

/// Takes the lock with a fencing token; answers the holder's token as `finish`, `release` and
/// `renew` take it.
pub(crate) async fn acquire_fenced(
    store: &SharedStore,
    unit: &UnitOfWork,
    token: &LockToken,
    ttl: Duration,
) -> LockToken {
    match store.begin(unit, token, ttl, Fencing::On).await.unwrap() {
        Begin::Acquired {
            fencing_token: Some(fence),
            ..
        } => token.clone().with_fencing_token(fence),
        other => panic!("expected the lock with a fencing token, got {other:?}"),
    }
}

pub(crate) fn fence(granted: &LockToken) -> u64 {
    granted.fencing_token().unwrap()
}

/// Waits out a lock TTL: expiry is the behaviour under test, so there is no signal to wait for.
pub(crate) async fn outlive(ttl: Duration) {
    tokio::time::sleep(ttl + Duration::from_millis(60)).await;
}

/// What the macros' expansions name. Not a public API: it changes without notice.
#[doc(hidden)]
pub mod __private {
    pub use idempotask::store::SharedStore;
}
