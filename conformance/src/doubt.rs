//! Units left in doubt: a lock that ran out without a release or a marker is remembered for its
//! token's doubt memory, and the delivery that takes the unit over is told.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use idempotask::store::{Begin, Doubt, Fencing, SharedStore, Store};
use idempotask::store::{LockToken, UnitOfWork};
use idempotask::{Error, InDoubt, Outcome, Reconciled, Task};

use super::{DAY, LONG, marker, outlive, unit};

/// The lock TTL of a delivery that is left to run out.
const SHORT: Duration = Duration::from_millis(150);
/// The TTL of a lock that must still be held when the check's next call reaches the store,
/// however loaded the machine is.
const HELD: Duration = Duration::from_secs(2);

/// A token that asks the store to remember its lock for a day after it ran out.
fn remembered() -> LockToken {
    LockToken::generate().with_doubt_memory(DAY)
}

/// Takes the lock with `token` and lets it run out, as a worker killed after it began would.
async fn abandoned(store: &SharedStore, unit: &UnitOfWork, fencing: Fencing) -> Option<u64> {
    let token = remembered();
    match store.begin(unit, &token, SHORT, fencing).await.unwrap() {
        Begin::Acquired {
            fencing_token,
            in_doubt: None,
            ..
        } => {
            outlive(SHORT).await;
            fencing_token
        }
        other => panic!("expected a free unit, got {other:?}"),
    }
}

/// The doubt of a takeover, or a panic naming what `begin` answered instead.
fn taken_over(answer: Begin) -> (Option<u64>, Doubt) {
    match answer {
        Begin::Acquired {
            fencing_token,
            in_doubt: Some(doubt),
            ..
        } => (fencing_token, *doubt),
        other => panic!("expected the unit taken over in doubt, got {other:?}"),
    }
}

/// Checks that a lock that ran out without a release or a marker is taken over in doubt, with
/// the earlier holder's fencing token, and that `inspect` shows the doubt until then.
///
/// # Panics
/// When the store does not.
#[doc = example!(a_lock_that_ran_out_is_taken_over_in_doubt)]
pub async fn a_lock_that_ran_out_is_taken_over_in_doubt(store: SharedStore) {
    let plain = unit("doubt-1");
    abandoned(&store, &plain, Fencing::Off).await;
    let seen = store.inspect(&plain).await.unwrap();
    assert!(
        !seen.is_locked() && !seen.is_done() && seen.in_doubt.is_some(),
        "a lock that ran out must read as in doubt, not held: {seen:?}"
    );
    let (fencing_token, doubt) = taken_over(
        store
            .begin(&plain, &remembered(), LONG, Fencing::Off)
            .await
            .unwrap(),
    );
    assert_eq!((fencing_token, doubt.fencing_token), (None, None));
    assert!(
        doubt.expired_for < Duration::from_secs(20),
        "expired for {:?}, measured on another clock?",
        doubt.expired_for
    );
    // The successor holds the unit now: nobody else is in doubt about it.
    let seen = store.inspect(&plain).await.unwrap();
    assert!(seen.is_locked() && seen.in_doubt.is_none(), "{seen:?}");

    let fenced = unit("doubt-1-fenced");
    let earlier = abandoned(&store, &fenced, Fencing::On).await.unwrap();
    let (fencing_token, doubt) = taken_over(
        store
            .begin(&fenced, &remembered(), LONG, Fencing::On)
            .await
            .unwrap(),
    );
    assert_eq!(doubt.fencing_token, Some(earlier));
    assert!(fencing_token.unwrap() > earlier);
}

/// Checks that a released lock, a finished unit and a lock taken over are never in doubt, and
/// that a lock that ran out with nobody taking it over is still its holder's to finish.
///
/// # Panics
/// When the store does not.
#[doc = example!(released_and_finished_units_are_never_in_doubt)]
pub async fn released_and_finished_units_are_never_in_doubt(store: SharedStore) {
    let unit = unit("doubt-2");
    let token = remembered();
    assert!(matches!(
        store
            .begin(&unit, &token, HELD, Fencing::Off)
            .await
            .unwrap(),
        Begin::Acquired { in_doubt: None, .. }
    ));
    assert!(store.release(&unit, &token).await.unwrap());
    // Past the TTL the released lock had: a store that kept it would take it for one that ran
    // out by now.
    outlive(HELD).await;
    let next = remembered();
    match store
        .begin(&unit, &next, SHORT, Fencing::Off)
        .await
        .unwrap()
    {
        Begin::Acquired { in_doubt: None, .. } => {}
        other => panic!("a released lock left the unit in doubt: {other:?}"),
    }
    // Ran out, and nobody took it over: nobody else ran, so the holder still finishes.
    outlive(SHORT).await;
    let finished = store
        .finish(&unit, &next, &marker(unit.key(), None, "late"), DAY)
        .await
        .unwrap();
    assert_eq!(finished, idempotask::store::Finish::Completed);
    match store
        .begin(&unit, &remembered(), LONG, Fencing::Off)
        .await
        .unwrap()
    {
        Begin::Done(_) => {}
        other => panic!("a finished unit must replay, got {other:?}"),
    }
}

/// Checks that when deliveries race for a unit in doubt, exactly one takes it over and learns
/// of the doubt; the others find it busy. A racer that finds it busy before anyone holds it
/// (a quorum's split vote) asks again, as the runner would.
///
/// # Panics
/// When the store does not.
#[doc = example!(concurrent_takeovers_see_the_doubt_once)]
pub async fn concurrent_takeovers_see_the_doubt_once(store: SharedStore) {
    let unit = unit("doubt-3");
    abandoned(&store, &unit, Fencing::Off).await;
    let taken = Arc::new(AtomicBool::new(false));
    let racers = (0..8).map(|_| {
        let (store, unit, taken) = (store.clone(), unit.clone(), Arc::clone(&taken));
        tokio::spawn(async move {
            for _ in 0..200 {
                match store
                    .begin(&unit, &remembered(), LONG, Fencing::Off)
                    .await
                    .unwrap()
                {
                    Begin::Acquired { in_doubt, .. } => {
                        taken.store(true, Ordering::SeqCst);
                        return Some(in_doubt.is_some());
                    }
                    Begin::Busy { .. } if !taken.load(Ordering::SeqCst) => {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    Begin::Busy { .. } => return None,
                    other => panic!("expected one takeover and busy, got {other:?}"),
                }
            }
            panic!("nobody took the unit over in 200 tries")
        })
    });
    let mut takeovers = Vec::new();
    for racer in racers.collect::<Vec<_>>() {
        takeovers.extend(racer.await.unwrap());
    }
    assert_eq!(
        takeovers,
        [true],
        "exactly one delivery must take the unit over, and learn that it was in doubt"
    );
}

/// Checks that a token that leaves doubt alone is answered `InDoubt` and writes nothing, so
/// that the unit stays in doubt for every later delivery, and that the memory of a lock that
/// ran out ends when its token said.
///
/// # Panics
/// When the store does not.
#[doc = example!(a_unit_left_in_doubt_stays_in_doubt_until_its_memory_ends)]
pub async fn a_unit_left_in_doubt_stays_in_doubt_until_its_memory_ends(store: SharedStore) {
    let unit = unit("doubt-4");
    // The three refusals and the inspection below fall within it on a loaded machine too.
    let memory = Duration::from_secs(3);
    let token = LockToken::generate().with_doubt_memory(memory);
    store
        .begin(&unit, &token, SHORT, Fencing::Off)
        .await
        .unwrap();
    outlive(SHORT).await;
    for _ in 0..3 {
        match store
            .begin(&unit, &remembered().leaving_doubt(), LONG, Fencing::Off)
            .await
            .unwrap()
        {
            Begin::InDoubt(_) => {}
            other => panic!("expected the unit left in doubt, got {other:?}"),
        }
    }
    assert!(store.inspect(&unit).await.unwrap().in_doubt.is_some());
    outlive(memory).await;
    match store
        .begin(&unit, &remembered().leaving_doubt(), LONG, Fencing::Off)
        .await
        .unwrap()
    {
        Begin::Acquired { in_doubt: None, .. } => {}
        other => panic!("the memory of the lock must have ended, got {other:?}"),
    }
}

/// Checks the two policies of the runner: a `Hold` task never runs a unit in doubt and fails
/// with [`Error::InDoubt`] every time; a `Rerun` task runs it once, and its body and report
/// say it was in doubt.
///
/// # Panics
/// When the store or the runner does not.
#[doc = example!(hold_keeps_every_delivery_of_a_unit_in_doubt_from_running)]
pub async fn hold_keeps_every_delivery_of_a_unit_in_doubt_from_running(store: SharedStore) {
    let held = Task::new("conformance").in_doubt(InDoubt::Hold);
    let unit = unit("doubt-5");
    abandoned(&store, &unit, Fencing::Off).await;
    let ran = Arc::new(AtomicU32::new(0));
    for _ in 0..3 {
        let ran = Arc::clone(&ran);
        let answer = held
            .call(unit.key())
            .store(store.clone())
            .run(async move { Ok::<_, Error>(ran.fetch_add(1, Ordering::SeqCst)) })
            .await;
        assert!(matches!(answer, Err(Error::InDoubt { .. })), "{answer:?}");
    }
    assert_eq!(ran.load(Ordering::SeqCst), 0, "a held unit ran");

    let rerun = Task::new("conformance");
    let report = rerun
        .call(unit.key())
        .store(store.clone())
        .run_reported(async {
            let context = idempotask::context().unwrap();
            Ok::<_, Error>(context.in_doubt().is_some())
        })
        .await
        .unwrap();
    assert!(report.value, "the body must see that its unit was in doubt");
    assert!(report.in_doubt.is_some());
    // Done now: never in doubt again.
    let again = held
        .call(unit.key())
        .store(store.clone())
        .run_reported(async { Ok::<_, Error>(false) })
        .await
        .unwrap();
    assert!(again.value && again.in_doubt.is_none());
}

/// Checks that a unit in doubt stays in doubt until a delivery records a result: a delivery
/// that took it over and fails, panics, or whose reconcile function fails, leaves it in doubt
/// for the next one.
///
/// # Panics
/// When the store or the runner does not.
#[doc = example!(a_unit_stays_in_doubt_until_a_result_is_recorded)]
pub async fn a_unit_stays_in_doubt_until_a_result_is_recorded(store: SharedStore) {
    // Each delivery's grant must reach it with time left, however slow the store is.
    let task = Task::new("conformance").lock_ttl(LONG);
    let unit = unit("doubt-6");
    abandoned(&store, &unit, Fencing::On).await;
    let failed: Result<u8, Error> = task
        .call(unit.key())
        .store(store.clone())
        .run(async { Err(Error::NotConfigured) })
        .await;
    assert!(matches!(failed, Err(Error::NotConfigured)), "{failed:?}");
    let lookup_failed: Result<u8, Error> = task
        .call(unit.key())
        .store(store.clone())
        .reconcile(|_| async { Err(Error::NotConfigured) })
        .run(async { Ok(1) })
        .await;
    assert!(
        matches!(lookup_failed, Err(Error::NotConfigured)),
        "{lookup_failed:?}"
    );
    // A body that panics, on a task of its own so that the panic is caught where it lands.
    let panicking = {
        let (task, store, key) = (task.clone(), store.clone(), unit.key().to_owned());
        tokio::spawn(async move {
            let _: Result<u8, Error> = task
                .call(key)
                .store(store)
                .run(async { panic!("the body panics on a unit in doubt") })
                .await;
        })
    };
    assert!(panicking.await.is_err_and(|err| err.is_panic()));
    let report = task
        .call(unit.key())
        .store(store.clone())
        .run_reported(async { Ok::<_, Error>(2_u8) })
        .await
        .unwrap();
    let doubt = report
        .in_doubt
        .expect("a failed delivery must leave the unit in doubt");
    assert!(doubt.fencing_token.is_some(), "{doubt:?}");
    assert_eq!(report.value, 2);
}

/// Checks that the lock of a delivery that took a unit over in doubt carries the doubt: asked
/// again with its token (a retry whose first reply was lost), `begin` answers the same doubt,
/// and a release leaves the unit in doubt instead of freeing it, fenced or not. Only a result
/// recorded ends a doubt: a delivery that cannot tell whether it took the unit over (its
/// `begin` timed out) releases, and must not erase what the earlier one may have done.
///
/// # Panics
/// When the store does not.
#[doc = example!(a_takeover_keeps_the_doubt_it_found)]
pub async fn a_takeover_keeps_the_doubt_it_found(store: SharedStore) {
    for fencing in [Fencing::Off, Fencing::On] {
        let unit = unit(&format!("doubt-8-{fencing:?}"));
        let earlier = abandoned(&store, &unit, fencing).await;
        let token = remembered();
        let (granted, doubt) = taken_over(store.begin(&unit, &token, LONG, fencing).await.unwrap());
        assert_eq!(doubt.fencing_token, earlier);
        let (again, repeated) =
            taken_over(store.begin(&unit, &token, LONG, fencing).await.unwrap());
        assert_eq!(
            (again, repeated.fencing_token),
            (granted, earlier),
            "a repeated begin must answer the grant and the doubt it took over"
        );
        // Whole milliseconds on the store's clock: at most one apart.
        assert!(
            repeated.expired_for.abs_diff(doubt.expired_for) <= Duration::from_millis(1),
            "the doubt taken over was {doubt:?}, the repeated begin said {repeated:?}"
        );
        let token = match granted {
            Some(fence) => token.with_fencing_token(fence),
            None => token,
        };
        assert!(store.release(&unit, &token).await.unwrap());
        let seen = store.inspect(&unit).await.unwrap();
        assert!(
            !seen.is_locked() && seen.in_doubt.is_some(),
            "a released takeover must leave the unit in doubt: {seen:?}"
        );
        let (next, doubt) = taken_over(
            store
                .begin(&unit, &remembered(), LONG, fencing)
                .await
                .unwrap(),
        );
        assert_eq!(doubt.fencing_token, granted);
        if let (Some(next), Some(granted)) = (next, granted) {
            assert!(next > granted, "fencing tokens must go on increasing");
        }
    }
}

/// Checks a reconcile function on a unit in doubt: the result it found is stored and
/// replayed, and the body does not run; "not done" runs the body; a unit that was free never
/// calls it.
///
/// # Panics
/// When the store or the runner does not.
#[doc = example!(reconcile_records_what_the_downstream_system_knows)]
pub async fn reconcile_records_what_the_downstream_system_knows(store: SharedStore) {
    let task = Task::new("conformance");
    let known = unit("doubt-7");
    abandoned(&store, &known, Fencing::Off).await;
    let report = task
        .call(known.key())
        .store(store.clone())
        .reconcile(|ctx| async move {
            assert!(ctx.in_doubt().is_some() && ctx.lock_held());
            Ok::<_, Error>(Reconciled::Done(7_u8))
        })
        .run_reported(async { Ok(8) })
        .await
        .unwrap();
    assert_eq!((report.value, report.outcome), (7, Outcome::Reconciled));
    let replayed: u8 = task
        .call(known.key())
        .store(store.clone())
        .run(async { Ok::<_, Error>(9) })
        .await
        .unwrap();
    assert_eq!(replayed, 7, "the reconciled result must be stored");

    let unknown = unit("doubt-8");
    abandoned(&store, &unknown, Fencing::Off).await;
    let report = task
        .call(unknown.key())
        .store(store.clone())
        .reconcile(|_| async { Ok::<_, Error>(Reconciled::NotDone) })
        .run_reported(async { Ok(8_u8) })
        .await
        .unwrap();
    assert_eq!((report.value, report.outcome), (8, Outcome::Executed));

    let free = task
        .call("doubt-9")
        .store(store.clone())
        .reconcile(|_| async { panic!("reconciled a unit that was free") })
        .run(async { Ok::<_, Error>(1_u8) })
        .await
        .unwrap();
    assert_eq!(free, 1);
}
