//! The conformance suite of [idempotask](https://docs.rs/idempotask): what every
//! [`Store`](idempotask::store::Store), and the task runner on top of it, must do.
//!
//! Each check takes a fresh, empty store and panics, like a test, when the store breaks the
//! contract. [`conformance_tests!`] turns the whole list into one `#[tokio::test]` per check for
//! a store of one's own: in a test file of the crate that implements `Store`, with
//! `idempotask-conformance` and `tokio` (features `macros`, `rt-multi-thread`) as
//! dev-dependencies:
//!
//! ```
//! # macro_rules! ignore { ($($t:tt)*) => {} } ignore! {
//! idempotask_conformance::conformance_tests!((
//!     (), // a guard that lives as long as the check: a server, a temporary directory
//!     idempotask::MemoryStore::new(),
//! ));
//! # }
//! ```
//!
//! The checks use short TTLs (100–300 ms) and wait them out, so a store must honour expiries to
//! the tens of milliseconds; the whole list takes a few seconds.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod cancellation;
mod faults;
mod fencing;
mod overruns;
mod refusals;
mod runner;
mod slow;
mod store;
mod transactions;

pub use cancellation::*;
pub use faults::{FaultCensus, every_fault_point};
pub use fencing::*;
pub use overruns::*;
pub use refusals::*;
pub use runner::*;
pub use store::*;
pub use transactions::*;

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

/// One `#[tokio::test]` per check of [`conformance`](crate::conformance), each with a fresh
/// store from `$make`: an async expression giving `(guard, store)`, where the guard (a server,
/// say) lives as long as the check and the store is any [`Store`](idempotask::store::Store).
#[macro_export]
macro_rules! conformance_tests {
    ($make:expr) => {
        $crate::conformance_tests!(@each $make;
            begin_grants_one_holder_and_reports_busy,
            begin_repeated_by_the_holder_is_acquired_again,
            finish_stores_the_marker_and_frees_the_lock,
            a_stale_holder_never_touches_its_successor,
            a_late_finish_keeps_the_result_when_nobody_holds_the_unit,
            only_the_holder_releases_or_renews,
            fencing_tokens_increase_across_grants_and_expiry,
            forget_deletes_the_marker_on_purpose,
            markers_expire_after_the_result_ttl,
            look_alike_keys_are_separate_units,
            a_duplicate_gets_the_stored_result_without_running,
            errors_are_not_cached_and_free_the_lock,
            a_panic_frees_the_lock_and_resumes,
            a_dropped_call_frees_the_lock,
            concurrent_deliveries_run_the_body_once,
            a_waiter_gives_up_with_contended,
            a_reused_key_with_other_arguments_is_rejected,
            undecodable_and_unstorable_results_are_typed_errors,
            the_body_sees_its_context,
            a_marker_of_another_key_is_never_replayed,
            renewal_keeps_a_short_lock_through_a_long_body,
            an_expired_lock_is_reported_as_lost,
            invalid_keys_are_rejected_before_the_store,
            the_longest_ttls_are_kept,
            fencing_tokens_never_go_back_after_a_burst_and_an_expiry,
            a_release_without_the_fencing_token_frees_the_lock,
            a_double_run_with_equal_results_is_reported_as_lost,
            a_grant_that_arrives_after_its_lock_expired_does_not_run,
            a_call_dropped_while_begin_is_in_flight_leaves_no_lock,
            a_call_dropped_while_recording_still_stores_the_result,
            a_panic_while_encoding_the_result_frees_the_lock,
            every_fault_point,
        );
    };
    (@each $make:expr; $($check:ident,)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $check() {
            let (_guard, store) = $make;
            $crate::$check($crate::__private::SharedStore::new(store)).await;
        }
    )*};
}

/// What the macros' expansions name. Not a public API: it changes without notice.
#[doc(hidden)]
pub mod __private {
    pub use idempotask::store::SharedStore;
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    /// The names of the `pub async fn`s in a check module's source.
    fn checks_in(source: &str) -> BTreeSet<&str> {
        source
            .lines()
            .filter_map(|line| line.strip_prefix("pub async fn "))
            .filter_map(|rest| rest.split(['(', '<']).next())
            .collect()
    }

    /// The checks a macro's `@each` list in `source` runs.
    fn listed_in(source: &str) -> BTreeSet<&str> {
        let start = source.find("@each $make;").expect("the macro's list");
        let end = start + source[start..].find(");").expect("the end of the list");
        source[start..end]
            .lines()
            .skip(1)
            .map(|line| line.trim().trim_end_matches(','))
            .filter(|name| !name.is_empty())
            .collect()
    }

    #[test]
    fn every_check_is_run_by_the_macro() {
        let defined: BTreeSet<&str> = [
            include_str!("store.rs"),
            include_str!("runner.rs"),
            include_str!("refusals.rs"),
            include_str!("fencing.rs"),
            include_str!("overruns.rs"),
            include_str!("cancellation.rs"),
            include_str!("faults/mod.rs"),
        ]
        .into_iter()
        .flat_map(checks_in)
        .collect();
        assert_eq!(listed_in(include_str!("lib.rs")), defined);
    }

    #[test]
    fn every_transaction_check_is_run_by_its_macro() {
        let source = include_str!("transactions.rs");
        assert_eq!(listed_in(source), checks_in(source));
    }
}
