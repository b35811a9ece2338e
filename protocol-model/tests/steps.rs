//! The steps protocol, checked exhaustively with 3 workers, and each planted bug found.

use idempotask_protocol_model::steps::{Action, Bug, Policy, StepsModel};
use stateright::{Checker, Model};

fn model(steps: u8, policy: Policy, bug: Bug) -> StepsModel {
    StepsModel {
        steps,
        workers: 3,
        deliveries: 2,
        policy,
        bug,
    }
}

/// Explores every reachable state; returns how many, after asserting that every `always`
/// property holds and every `sometimes` property has an example.
fn holds(model: StepsModel) -> usize {
    let checker = model.checker().spawn_bfs().join();
    checker.assert_properties();
    checker.unique_state_count()
}

/// The names of the properties a planted bug breaks, with a counterexample for each.
fn broken(model: StepsModel) -> Vec<&'static str> {
    let checker = model.checker().spawn_bfs().join();
    let mut names: Vec<&'static str> = checker
        .discoveries()
        .into_iter()
        .filter(|(name, _)| !name.starts_with("the unit") && !name.starts_with("a takeover"))
        .map(|(name, _)| name)
        .collect();
    names.sort_unstable();
    names
}

#[test]
fn every_policy_holds_with_three_workers_and_three_steps() {
    for policy in [Policy::Hold, Policy::Reconcile, Policy::Rerun] {
        let states = holds(model(3, policy, Bug::None));
        eprintln!("{policy:?}: {states} states");
        assert!(states > 1_000, "{policy:?}: only {states} states explored");
    }
}

#[test]
fn a_record_without_the_fencing_check_is_found() {
    let names = broken(model(2, Policy::Reconcile, Bug::RecordWithoutFencing));
    assert!(
        names.contains(&"no journal position is written twice"),
        "{names:?}"
    );
}

#[test]
fn a_takeover_that_ignores_the_step_in_doubt_is_found() {
    let names = broken(model(2, Policy::Hold, Bug::NoStepInDoubt));
    assert!(
        names.contains(&"an effect at most once under hold and reconcile"),
        "{names:?}"
    );
}

#[test]
fn a_marker_before_the_last_step_is_recorded_is_found() {
    let names = broken(model(2, Policy::Reconcile, Bug::FinishBeforeLastStep));
    assert!(
        names.contains(&"a marked unit had every effect exactly once"),
        "{names:?}"
    );
}

#[test]
fn the_takeover_example_resumes_after_a_recorded_step() {
    for policy in [Policy::Hold, Policy::Reconcile, Policy::Rerun] {
        let checker = model(2, policy, Bug::None).checker().spawn_bfs().join();
        let example = checker
            .discovery("a takeover resumes after a recorded step")
            .expect("an example");
        // The example is a run in which a later grant found a step already recorded, not only
        // a second grant after a first that recorded nothing.
        let path = example.into_vec();
        let resumed = path.iter().any(|(state, action)| {
            matches!(action, Some(Action::Begin(_)))
                && !state.store.journal.is_empty()
                && state.store.fencing > 0
                && !state.store.marker
                && !state.store.held
                && state.store.lock.is_none_or(|lock| lock.expired)
        });
        assert!(resumed, "{policy:?}: {path:#?}");
    }
}
