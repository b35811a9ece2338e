//! The list of checks, each once, and what is made from it: the checks' public paths, the
//! tests of [`conformance_tests!`](crate::conformance_tests!) and
//! [`transaction_conformance_tests!`](crate::transaction_conformance_tests!), and [`CHECKS`].

use std::fmt;
use std::future::Future;
use std::pin::Pin;

use idempotask::store::SharedStore;

/// Every check, once, by the module that defines it; everything else is made from this list.
///
/// `__checks!(what args)` hands the list to the arm `@what`: `reexports` (each check at the
/// crate root, its only public path), `table` (the entries of [`CHECKS`]), `tests $make` and
/// `transaction_tests $make` (one `#[tokio::test]` per check, in the caller's crate).
#[doc(hidden)]
#[macro_export]
macro_rules! __checks {
    (@reexports [] plain [$($module:ident::$check:ident,)*]
        transactions [$($t_module:ident::$t_check:ident,)*]
        doubt [$($d_module:ident::$d_check:ident,)*]
        steps [$($s_module:ident::$s_check:ident,)*]) => {
        $(pub use $crate::$module::$check;)*
        $(pub use $crate::$t_module::$t_check;)*
        $(pub use $crate::$d_module::$d_check;)*
        $(pub use $crate::$s_module::$s_check;)*
    };
    (@table [] plain [$($module:ident::$check:ident,)*] transactions [$($_t:tt)*]
        doubt [$($_d:tt)*] steps [$($_s:tt)*]) => {
        &[$($crate::Check {
            name: ::core::stringify!($check),
            run: |store| ::std::boxed::Box::pin(async move {
                $crate::$check(store).await;
            }),
        },)*]
    };
    (@tests [$make:expr] plain [$($module:ident::$check:ident,)*] transactions [$($_t:tt)*]
        doubt [$($_d:tt)*] steps [$($_s:tt)*]) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $check() {
            let (_guard, store) = $make;
            $crate::$check($crate::__private::SharedStore::new(store)).await;
        }
    )*};
    (@transaction_tests [$make:expr] plain [$($_p:tt)*]
        transactions [$($t_module:ident::$t_check:ident,)*] doubt [$($_d:tt)*]
        steps [$($_s:tt)*]) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $t_check() {
            let (_guard, store) = $make;
            $crate::$t_check(store).await;
        }
    )*};
    (@doubt_tests [$make:expr] plain [$($_p:tt)*] transactions [$($_t:tt)*]
        doubt [$($d_module:ident::$d_check:ident,)*] steps [$($_s:tt)*]) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $d_check() {
            let (_guard, store) = $make;
            $crate::$d_check($crate::__private::SharedStore::new(store)).await;
        }
    )*};
    (@step_tests [$make:expr] plain [$($_p:tt)*] transactions [$($_t:tt)*]
        doubt [$($_d:tt)*] steps [$($s_module:ident::$s_check:ident,)*]) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $s_check() {
            let (_guard, store) = $make;
            $crate::$s_check($crate::__private::SharedStore::new(store)).await;
        }
    )*};
    ($what:ident $($args:tt)*) => {
        $crate::__checks! { @$what [$($args)*]
            plain [
                store::begin_grants_one_holder_and_reports_busy,
                store::begin_repeated_by_the_holder_is_acquired_again,
                store::finish_stores_the_marker_and_frees_the_lock,
                store::a_stale_holder_never_touches_its_successor,
                store::a_late_finish_keeps_the_result_when_nobody_holds_the_unit,
                store::only_the_holder_releases_or_renews,
                store::fencing_tokens_increase_across_grants_and_expiry,
                store::forget_deletes_the_marker_on_purpose,
                store::markers_expire_after_the_result_ttl,
                store::look_alike_keys_are_separate_units,
                store::the_longest_ttls_are_kept,
                batch::a_batched_begin_answers_each_unit_as_alone,
                batch::a_batched_finish_answers_each_unit_as_alone,
                batch::a_large_batch_answers_every_unit,
                runner::a_duplicate_gets_the_stored_result_without_running,
                runner::errors_are_not_cached_and_free_the_lock,
                runner::a_panic_frees_the_lock_and_resumes,
                runner::a_dropped_call_frees_the_lock,
                runner::concurrent_deliveries_run_the_body_once,
                runner::a_waiter_gives_up_with_contended,
                runner::the_body_sees_its_context,
                runner::renewal_keeps_a_short_lock_through_a_long_body,
                runner::an_expired_lock_is_reported_as_lost,
                refusals::a_reused_key_with_other_arguments_is_rejected,
                refusals::undecodable_and_unstorable_results_are_typed_errors,
                refusals::a_marker_of_another_key_is_never_replayed,
                refusals::invalid_keys_are_rejected_before_the_store,
                fencing::fencing_tokens_never_go_back_after_a_burst_and_an_expiry,
                fencing::a_release_without_the_fencing_token_frees_the_lock,
                overruns::a_double_run_with_equal_results_is_reported_as_lost,
                overruns::a_grant_that_arrives_after_its_lock_expired_does_not_run,
                overruns::a_fence_stops_a_holder_whose_unit_was_taken_over,
                cancellation::a_call_dropped_while_begin_is_in_flight_leaves_no_lock,
                cancellation::a_call_dropped_while_recording_still_stores_the_result,
                cancellation::a_panic_while_encoding_the_result_frees_the_lock,
                faults::every_fault_point,
            ]
            transactions [
                transactions::a_committed_transaction_is_replayed,
                transactions::a_failed_transaction_stores_nothing,
                transactions::a_dropped_transaction_stores_nothing,
                transactions::concurrent_transactions_run_the_body_once,
                transactions::a_plain_holder_makes_a_transaction_contended,
                transactions::commit_faults_are_reported_as_they_happened,
                transactions::steps_outlive_a_rolled_back_transaction,
            ]
            doubt [
                doubt::a_lock_that_ran_out_is_taken_over_in_doubt,
                doubt::released_and_finished_units_are_never_in_doubt,
                doubt::concurrent_takeovers_see_the_doubt_once,
                doubt::a_unit_left_in_doubt_stays_in_doubt_until_its_memory_ends,
                doubt::hold_keeps_every_delivery_of_a_unit_in_doubt_from_running,
                doubt::a_unit_stays_in_doubt_until_a_result_is_recorded,
                doubt::a_takeover_keeps_the_doubt_it_found,
                doubt::reconcile_records_what_the_downstream_system_knows,
            ]
            steps [
                steps::only_the_holder_appends_at_the_next_position,
                steps::a_journal_outlives_its_lock_until_the_result,
                steps::a_stale_holder_cannot_append,
                steps::a_rerun_replays_finished_steps_and_resumes,
                steps::a_step_after_the_lock_was_taken_over_does_not_run,
                steps::steps_that_cannot_be_recorded_are_refused_before_their_effect,
                steps::a_step_over_the_size_limit_is_never_run_again,
                steps::concurrent_deliveries_run_each_step_once,
                step_doubt::the_step_in_doubt_gets_its_own_policy,
            ]
        }
    };
}

/// One `#[tokio::test]` per check of this crate but the transaction checks, named as the
/// check, each with a fresh store from `$make`: an expression (it may `.await`) giving
/// `(guard, store)`, where the guard (a server, say) lives as long as the check and the store
/// is any [`Store`](idempotask::store::Store).
///
/// The tests run on a multi-threaded runtime of two workers: the crate that invokes it needs
/// `tokio` with the features `macros` and `rt-multi-thread`.
///
/// ```no_run
/// // tests/conformance.rs of the crate that implements the store.
/// idempotask_conformance::conformance_tests!({
///     // An async block's body: a server to start, a connection to make.
///     let store = idempotask::MemoryStore::new();
///     ((), store)
/// });
/// # fn main() {}
/// ```
#[macro_export]
macro_rules! conformance_tests {
    ($make:expr) => {
        $crate::__checks!(tests $make);
    };
}

/// One `#[tokio::test]` per transaction check of this crate, named as the check, each with a
/// fresh store from `$make`: an expression (it may `.await`) giving `(guard, store)`, where the
/// store implements [`OpensTransactions`](crate::OpensTransactions).
///
/// The crate that invokes it needs `tokio` with the features `macros` and `rt-multi-thread`,
/// as for [`conformance_tests!`](crate::conformance_tests!).
///
#[doc = include_str!("opens_transactions.md")]
#[macro_export]
macro_rules! transaction_conformance_tests {
    ($make:expr) => {
        $crate::__checks!(transaction_tests $make);
    };
}

/// One `#[tokio::test]` per check of steps, named as the check, each with a fresh store from
/// `$make`, as [`conformance_tests!`](crate::conformance_tests!) makes them.
///
/// For a store that records the steps of a body
/// ([`Store::records_steps`](idempotask::store::Store::records_steps)): a journal per unit,
/// appended only by the lock's holder at its next position, kept across a release and a lapsed
/// lock, dropped with the unit's result. A store that does not record steps still passes
/// [`conformance_tests!`](crate::conformance_tests!), and its tasks' steps fail before their
/// effects.
///
/// ```no_run
/// idempotask_conformance::step_conformance_tests!(((), idempotask::MemoryStore::new()));
/// # fn main() {}
/// ```
#[macro_export]
macro_rules! step_conformance_tests {
    ($make:expr) => {
        $crate::__checks!(step_tests $make);
    };
}

/// One `#[tokio::test]` per check of units left in doubt, named as the check, each with a
/// fresh store from `$make`, as [`conformance_tests!`](crate::conformance_tests!) makes them.
///
/// Detecting units in doubt is what a store does when it honours
/// [`LockToken::doubt_memory`](idempotask::store::LockToken::doubt_memory): it keeps a lock
/// that ran out for that long and tells the delivery that takes it over
/// ([`Begin::taken_over`](idempotask::store::Begin::taken_over)). Every store shipped with
/// idempotask does; a store of one's own that does not still passes
/// [`conformance_tests!`](crate::conformance_tests!), and its tasks never learn of a doubt.
///
/// ```no_run
/// idempotask_conformance::doubt_conformance_tests!(((), idempotask::MemoryStore::new()));
/// # fn main() {}
/// ```
#[macro_export]
macro_rules! doubt_conformance_tests {
    ($make:expr) => {
        $crate::__checks!(doubt_tests $make);
    };
}

/// One check of the suite as a value: its name and a way to run it, for a harness of one's own
/// (a report of its own, one server for every check in turn, a runtime the harness builds).
///
/// ```no_run
/// use idempotask::MemoryStore;
/// use idempotask::store::SharedStore;
///
/// # #[tokio::main(flavor = "multi_thread", worker_threads = 2)] async fn main() {
/// for check in idempotask_conformance::CHECKS {
///     println!("{}", check.name());
///     check.run(SharedStore::new(MemoryStore::new())).await;
/// }
/// # }
/// ```
#[derive(Clone, Copy)]
pub struct Check {
    name: &'static str,
    run: fn(SharedStore) -> Pin<Box<dyn Future<Output = ()> + Send>>,
}

impl Check {
    /// The check's name: the name of its function in this crate, and of the test
    /// [`conformance_tests!`](crate::conformance_tests!) generates for it.
    ///
    /// ```
    /// let first = &idempotask_conformance::CHECKS[0];
    /// assert_eq!(first.name(), "begin_grants_one_holder_and_reports_busy");
    /// ```
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Runs the check on `store`, which must be fresh and empty, on a multi-threaded tokio
    /// runtime (some checks spawn tasks and count the runtime's).
    ///
    /// # Panics
    /// When the store breaks the contract, with what it did.
    ///
    /// ```no_run
    /// use idempotask::store::SharedStore;
    ///
    /// # #[tokio::main(flavor = "multi_thread", worker_threads = 2)] async fn main() {
    /// let check = &idempotask_conformance::CHECKS[0];
    /// check.run(SharedStore::new(idempotask::MemoryStore::new())).await;
    /// # }
    /// ```
    pub fn run(&self, store: SharedStore) -> impl Future<Output = ()> + Send + 'static {
        (self.run)(store)
    }
}

impl fmt::Debug for Check {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Check").field(&self.name).finish()
    }
}

/// Every check [`conformance_tests!`](crate::conformance_tests!) runs, in its order: the
/// transaction checks are generic over their store and not in it.
///
/// ```
/// use idempotask_conformance::CHECKS;
///
/// assert!(CHECKS.iter().any(|check| check.name() == "every_fault_point"));
/// ```
pub static CHECKS: &[Check] = crate::__checks!(table);
