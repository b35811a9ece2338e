//! The operator's resolution of a held step ([`Resolution::RecordStep`]): a body held at its
//! step in doubt is told that the step's effect happened, and the next delivery goes on after
//! it; and of a unit held because its body changed its step order, freed with its journal
//! ([`Resolution::FreeDiscardingSteps`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use idempotask::operator::{
    Held, Listed, Marker, Operator, Resolution, Resolved, StepRecord, step_entry,
};
use idempotask::store::{LockToken, SharedStore, Store, StoreErrorKind, UnitOfWork};
use idempotask::{Error, StepErrorKind, Task};
use serde_json::value::RawValue;

use super::step_doubt::died_after_the_first_step;
use super::{DAY, LONG, acquire, outlive};

/// The lock TTL of the holder that dies after its first step.
const SHORT: std::time::Duration = std::time::Duration::from_millis(150);

/// Input: a store that records steps, as its own operator. Checks that a unit held at its step
/// in doubt, resolved with that step's value, has the step in its journal and is free; that a
/// resolution against another lock, a live lock, or with an entry that is none writes
/// nothing; and that the next delivery replays the steps, the resolved one included, and runs
/// the step after them once.
pub(super) async fn a_held_step_is_resolved_with_its_value(
    store: &(impl Store + Operator + Clone),
) {
    let task = Task::new("operator-held-step").lock_ttl(LONG);
    let unit = store.scope().unit("operator-held-step", "order-1").unwrap();
    let shared = SharedStore::new(store.clone());
    // `a` = 1 recorded, then its holder died while `b` may have run.
    died_after_the_first_step(&shared, "operator-held-step", "order-1").await;

    let effects = Arc::new(AtomicU32::new(0));
    let deliver = || {
        let effects = Arc::clone(&effects);
        task.call("order-1").store(store.clone()).run(async move {
            let ctx = idempotask::context().unwrap();
            let effect = |value: u32| {
                let effects = Arc::clone(&effects);
                async move {
                    effects.fetch_add(1, Ordering::SeqCst);
                    Ok::<u32, Error>(value)
                }
            };
            let a = ctx.step("a", effect(100)).await?;
            let b = ctx.step_or_hold("b", effect(200)).await?;
            let c = ctx.step("c", effect(300)).await?;
            Ok::<_, Error>((a, b, c))
        })
    };
    let held = deliver().await;
    assert!(matches!(held, Err(Error::InDoubt { .. })), "{held:?}");
    let Held::InDoubt { bytes: shown, .. } = store.read(&unit).await.unwrap() else {
        panic!("a held unit must stay in doubt");
    };

    let value = RawValue::from_string("7".to_owned()).unwrap();
    let resolution = Resolution::record_step(step_entry("b", None, &value), DAY);
    let wrong = [shown.as_slice(), b"x"].concat();
    let changed = store
        .resolve_exact(&unit, &wrong, &resolution)
        .await
        .unwrap();
    assert_eq!(
        changed,
        Resolved::Changed,
        "another lock than the one shown"
    );
    let not_an_entry = Resolution::record_step(b"not json".to_vec(), DAY);
    let refused = store.resolve_exact(&unit, &shown, &not_an_entry).await;
    assert!(
        matches!(&refused, Err(err) if err.kind() == StoreErrorKind::Configuration),
        "an entry that is none must be refused: {refused:?}"
    );
    assert_eq!(store.read_journal(&unit).await.unwrap().len(), 1);
    assert!(matches!(
        store.read(&unit).await.unwrap(),
        Held::InDoubt { .. }
    ));

    let resolved = store
        .resolve_exact(&unit, &shown, &resolution)
        .await
        .unwrap();
    assert_eq!(resolved, Resolved::StepRecorded);
    assert!(matches!(store.read(&unit).await.unwrap(), Held::Nothing));
    let journal = store.journal(&unit).await.unwrap();
    let labels: Vec<String> = journal
        .entries()
        .iter()
        .map(|entry| StepRecord::decode(entry).unwrap().label())
        .collect();
    assert_eq!(labels, ["a", "b"], "the resolved step ends the journal");
    let again = store
        .resolve_exact(&unit, &shown, &resolution)
        .await
        .unwrap();
    assert_eq!(again, Resolved::Gone, "a freed unit has nothing to resolve");

    assert_eq!(deliver().await.unwrap(), (1, 7, 300));
    assert_eq!(effects.load(Ordering::SeqCst), 1, "only `c` runs, once");
    assert_eq!(deliver().await.unwrap(), (1, 7, 300), "the unit's result");
    assert_eq!(effects.load(Ordering::SeqCst), 1);

    a_lock_taken_over_is_not_resolved(store, &shared, &resolution).await;
}

/// A lock taken over since it was shown is live, not in doubt: resolving it writes nothing.
async fn a_lock_taken_over_is_not_resolved(
    store: &(impl Store + Operator),
    shared: &SharedStore,
    resolution: &Resolution,
) {
    let other = store.scope().unit("operator-held-step", "order-2").unwrap();
    let token = LockToken::generate().with_doubt_memory(DAY);
    acquire(shared, &other, &token, SHORT).await;
    outlive(SHORT).await;
    let Held::InDoubt { bytes: shown, .. } = store.read(&other).await.unwrap() else {
        panic!("a lock that ran out must read as in doubt");
    };
    acquire(shared, &other, &LockToken::generate(), LONG).await;
    let changed = store
        .resolve_exact(&other, &shown, resolution)
        .await
        .unwrap();
    assert_eq!(
        changed,
        Resolved::Changed,
        "a live lock is nobody's to resolve"
    );
    assert!(store.read_journal(&other).await.unwrap().is_empty());
    assert!(matches!(
        store.read(&other).await.unwrap(),
        Held::Lock { .. }
    ));
}

/// Input: a store that records steps, as its own operator. Checks that a body whose steps come
/// in another order than its journal's is refused before its effect and holds its unit: the lock
/// is not released but lapses into doubt, where the next delivery is refused again without
/// running anything, until an operator records the unit's result.
pub(super) async fn a_body_whose_steps_changed_order_is_held(
    store: &(impl Store + Operator + Clone),
) {
    let task = Task::new("operator-reordered").lock_ttl(SHORT);
    let unit = store.scope().unit("operator-reordered", "order-1").unwrap();
    let effects = Arc::new(AtomicU32::new(0));
    let deliver = |first, then_fail| one_step(&task, store, &effects, first, then_fail);
    let order_changed = |answer: &Result<u32, Error>| {
        matches!(
            answer,
            Err(Error::Step {
                kind: StepErrorKind::OrderChanged,
                ..
            })
        )
    };
    let failed = deliver("a", true).await;
    assert!(matches!(failed, Err(Error::NotConfigured)), "{failed:?}");
    let changed = deliver("b", false).await;
    assert!(order_changed(&changed), "{changed:?}");
    assert!(
        matches!(store.read(&unit).await.unwrap(), Held::Lock { .. }),
        "a body whose steps changed order released its unit"
    );
    outlive(SHORT).await;
    assert!(matches!(
        store.read(&unit).await.unwrap(),
        Held::InDoubt { .. }
    ));
    let again = deliver("b", false).await;
    assert!(order_changed(&again), "the next delivery: {again:?}");
    assert_eq!(effects.load(Ordering::SeqCst), 1, "a reordered step ran");

    outlive(SHORT).await;
    let Held::InDoubt {
        bytes: shown,
        fencing_token,
        ..
    } = store.read(&unit).await.unwrap()
    else {
        panic!("a unit whose steps changed order must stay held in doubt");
    };
    let result = RawValue::from_string("9".to_owned()).unwrap();
    let marker = Marker::encode_resolution(&unit, fencing_token, &result);
    let resolved = store
        .resolve_exact(&unit, &shown, &Resolution::record(marker, DAY))
        .await
        .unwrap();
    assert_eq!(resolved, Resolved::Recorded);
    assert_eq!(deliver("b", false).await.unwrap(), 9, "the resolved result");
    assert_eq!(effects.load(Ordering::SeqCst), 1);
}

/// Input: a store that records steps, as its own operator. Checks that a unit held because its
/// body changed its step order stays held after a plain [`Resolution::Free`] (the journal
/// stays, and the next delivery is refused at the same step), and that
/// [`Resolution::FreeDiscardingSteps`] frees it with its journal gone, so that the next
/// delivery runs the whole body as new, the first order's effect again included.
pub(super) async fn a_changed_order_hold_is_freed_with_its_steps(
    store: &(impl Store + Operator + Clone),
) {
    let task = Task::new("operator-discarded").lock_ttl(SHORT);
    let unit = store.scope().unit("operator-discarded", "order-1").unwrap();
    let effects = Arc::new(AtomicU32::new(0));
    let deliver = |first, then_fail| one_step(&task, store, &effects, first, then_fail);
    let held = || async {
        outlive(SHORT).await;
        let Held::InDoubt { bytes, .. } = store.read(&unit).await.unwrap() else {
            panic!("a unit whose steps changed order must be held in doubt");
        };
        bytes
    };
    assert!(matches!(
        deliver("a", true).await,
        Err(Error::NotConfigured)
    ));
    let changed = deliver("b", false).await;
    assert!(
        matches!(
            &changed,
            Err(Error::Step {
                kind: StepErrorKind::OrderChanged,
                ..
            })
        ),
        "{changed:?}"
    );

    let shown = held().await;
    let listed = listed_unit(store, &unit).await;
    let journal = store.listed_journal(&listed).await.unwrap();
    assert_eq!(
        journal.len(),
        1,
        "the journal of the unit as a listing knows it"
    );
    let freed = store.resolve_exact(&unit, &shown, &Resolution::Free).await;
    assert_eq!(freed.unwrap(), Resolved::Freed);
    assert_eq!(
        store.journal(&unit).await.unwrap().len(),
        1,
        "a plain free keeps the journal"
    );
    let again = deliver("b", false).await;
    assert!(
        matches!(
            &again,
            Err(Error::Step {
                kind: StepErrorKind::OrderChanged,
                ..
            })
        ),
        "a plain free leaves the unit held at the next delivery: {again:?}"
    );

    let shown = held().await;
    let wrong = [shown.as_slice(), b"x"].concat();
    let discard = Resolution::FreeDiscardingSteps;
    let changed = store.resolve_exact(&unit, &wrong, &discard).await.unwrap();
    assert_eq!(
        changed,
        Resolved::Changed,
        "another lock than the one shown"
    );
    assert_eq!(
        store.journal(&unit).await.unwrap().len(),
        1,
        "nothing discarded"
    );
    let freed = store.resolve_exact(&unit, &shown, &discard).await.unwrap();
    assert_eq!(freed, Resolved::Freed);
    assert!(matches!(store.read(&unit).await.unwrap(), Held::Nothing));
    assert!(
        store.journal(&unit).await.unwrap().is_empty(),
        "the journal is gone"
    );
    assert_eq!(effects.load(Ordering::SeqCst), 1);
    assert_eq!(
        deliver("b", false).await.unwrap(),
        1,
        "the body runs as new"
    );
    assert_eq!(effects.load(Ordering::SeqCst), 2, "`b` runs, once");
}

/// The unit as a listing of its task finds it: by its digest alone, on a store that keeps no key
/// beside a lock.
async fn listed_unit(store: &impl Operator, unit: &UnitOfWork) -> Listed {
    let mut from = None;
    loop {
        let page = store.list(unit.task(), from.as_ref(), 100).await.unwrap();
        if let Some(listed) = page
            .units
            .into_iter()
            .find(|listed| listed.digest == unit.digest())
        {
            return listed;
        }
        from = Some(page.next.expect("a listing must find the unit in doubt"));
    }
}

/// Input: a task, a store, an effect counter, the name of the body's one step, and whether the
/// body fails after it. Output: what a delivery of `order-1` answers; the step counts its effect
/// and answers 1, as does the body.
async fn one_step(
    task: &Task,
    store: &(impl Store + Operator + Clone),
    effects: &Arc<AtomicU32>,
    first: &'static str,
    then_fail: bool,
) -> Result<u32, Error> {
    let effects = Arc::clone(effects);
    task.call("order-1")
        .store(store.clone())
        .run(async move {
            let ctx = idempotask::context().unwrap();
            let effect = async {
                effects.fetch_add(1, Ordering::SeqCst);
                Ok::<u32, Error>(1)
            };
            let value = ctx.step(first, effect).await?;
            if then_fail {
                return Err(Error::NotConfigured);
            }
            Ok(value)
        })
        .await
}
