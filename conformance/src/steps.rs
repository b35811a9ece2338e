//! Steps: a store's journal of finished steps, and the runner that replays it. For stores that
//! record steps ([`Store::records_steps`](idempotask::store::Store::records_steps)).

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use idempotask::store::{
    Begin, Fencing, Journal, LockToken, SharedStore, StepEntry, Store, UnitOfWork,
};
use idempotask::{CodecErrorKind, Error, Outcome, StepErrorKind, Task};

use super::{DAY, LONG, acquire, marker, outlive, unit};

/// Takes the lock for `token` and reads the journal, as a new execution does.
async fn acquire_journal(
    store: &SharedStore,
    unit: &UnitOfWork,
    token: &LockToken,
    ttl: Duration,
) -> Journal {
    acquire(store, unit, token, ttl).await;
    store.read_journal(unit).await.unwrap()
}

pub(crate) fn entry(position: u32, bytes: &[u8]) -> StepEntry<'_> {
    StepEntry::new(position, bytes, DAY)
}

/// Checks that only the lock's holder appends to a unit's journal, only at its next position,
/// that a repeated append of the same entry is answered as recorded, and that a grant and an
/// inspection answer the journal.
///
/// # Panics
/// When the store does not.
#[doc = example!(only_the_holder_appends_at_the_next_position)]
pub async fn only_the_holder_appends_at_the_next_position(store: SharedStore) {
    assert!(store.records_steps(), "the store says it records no steps");
    let (unit, holder, other) = (
        unit("journal"),
        LockToken::generate(),
        LockToken::generate(),
    );
    acquire(&store, &unit, &holder, LONG).await;
    let append = |token: &LockToken, position, bytes: &'static [u8]| {
        let (store, unit, token) = (store.clone(), unit.clone(), token.clone());
        async move {
            store
                .record_step(&unit, &token, entry(position, bytes), LONG)
                .await
                .unwrap()
        }
    };
    assert!(!append(&holder, 1, b"one").await, "appended past the end");
    assert!(append(&holder, 0, b"zero").await);
    assert!(
        append(&holder, 0, b"zero").await,
        "a repeated append was refused"
    );
    assert!(
        !append(&holder, 0, b"other").await,
        "an entry was overwritten"
    );
    assert!(!append(&other, 1, b"one").await, "a stranger appended");
    assert!(append(&holder, 1, b"one").await);
    let expected = Journal::from_entries(vec![b"zero".to_vec(), b"one".to_vec()]);
    assert_eq!(store.read_journal(&unit).await.unwrap(), expected);
    assert_eq!(store.inspect(&unit).await.unwrap().journal, expected);
    let busy = store
        .begin(&unit, &other, LONG, Fencing::Off)
        .await
        .unwrap();
    assert!(matches!(busy, Begin::Busy { .. }), "{busy:?}");
}

/// Checks that a journal outlives its lock (a release, a lock that ran out) for the next holder,
/// and ends with the unit's result or a `forget`.
///
/// # Panics
/// When the store does not.
#[doc = example!(a_journal_outlives_its_lock_until_the_result)]
pub async fn a_journal_outlives_its_lock_until_the_result(store: SharedStore) {
    let unit = unit("outlives");
    let first = LockToken::generate();
    acquire(&store, &unit, &first, LONG).await;
    assert!(
        store
            .record_step(&unit, &first, entry(0, b"a"), LONG)
            .await
            .unwrap()
    );
    assert!(store.release(&unit, &first).await.unwrap());
    let second = LockToken::generate();
    let ttl = Duration::from_millis(300);
    let found = acquire_journal(&store, &unit, &second, ttl).await;
    assert_eq!(found.entries(), [b"a".to_vec()], "after a release");
    assert!(
        store
            .record_step(&unit, &second, entry(1, b"b"), ttl)
            .await
            .unwrap()
    );
    outlive(ttl).await;
    let third = LockToken::generate();
    let found = acquire_journal(&store, &unit, &third, LONG).await;
    assert_eq!(found.len(), 2, "after a lock that ran out: {found:?}");
    let done = marker(unit.key(), None, "done");
    store.finish(&unit, &third, &done, DAY).await.unwrap();
    assert!(
        store.inspect(&unit).await.unwrap().journal.is_empty(),
        "kept past the result"
    );
    assert!(store.forget(&unit).await.unwrap());
    let fresh = acquire_journal(&store, &unit, &first, LONG).await;
    assert!(
        fresh.is_empty(),
        "a forgotten unit replays old steps: {fresh:?}"
    );
    assert!(
        store
            .record_step(&unit, &first, entry(0, b"x"), LONG)
            .await
            .unwrap()
    );
    assert!(store.release(&unit, &first).await.unwrap());
    store.finish(&unit, &second, &done, DAY).await.unwrap();
    assert!(store.forget(&unit).await.unwrap());
    let fresh = acquire_journal(&store, &unit, &third, LONG).await;
    assert!(
        fresh.is_empty(),
        "a result recorded without the lock left the journal: {fresh:?}"
    );
}

/// Checks that a holder whose lock ran out and was taken over cannot append to the journal,
/// with or without fencing, nor the holder's own token under another fencing token.
///
/// # Panics
/// When the store does not.
#[doc = example!(a_stale_holder_cannot_append)]
pub async fn a_stale_holder_cannot_append(store: SharedStore) {
    for fencing in [Fencing::Off, Fencing::On] {
        let unit = unit(&format!("stale-{fencing:?}"));
        let ttl = Duration::from_millis(300);
        let stale = LockToken::generate();
        let stale = match store.begin(&unit, &stale, ttl, fencing).await.unwrap() {
            Begin::Acquired { fencing_token, .. } => stale.granted(fencing_token),
            other => panic!("{other:?}"),
        };
        outlive(ttl).await;
        let successor = LockToken::generate();
        let successor = match store.begin(&unit, &successor, LONG, fencing).await.unwrap() {
            Begin::Acquired { fencing_token, .. } => successor.granted(fencing_token),
            other => panic!("{other:?}"),
        };
        let late = store
            .record_step(&unit, &stale, entry(0, b"late"), LONG)
            .await
            .unwrap();
        assert!(!late, "a stale holder appended ({fencing:?})");
        if let Some(fence) = successor.fencing_token() {
            let forged = successor.clone().with_fencing_token(fence + 1);
            let forged = store.record_step(&unit, &forged, entry(0, b"x"), LONG);
            assert!(
                !forged.await.unwrap(),
                "appended under another fencing token"
            );
        }
        assert!(
            store
                .record_step(&unit, &successor, entry(0, b"own"), LONG)
                .await
                .unwrap()
        );
        assert_eq!(
            store.inspect(&unit).await.unwrap().journal.entries(),
            [b"own".to_vec()]
        );
    }
}

/// Checks that a rerun replays the steps that finished, without running their effects, and
/// runs each of the others once; and that the finished unit replays its result.
///
/// # Panics
/// When the store or the runner does not.
#[doc = example!(a_rerun_replays_finished_steps_and_resumes)]
pub async fn a_rerun_replays_finished_steps_and_resumes(store: SharedStore) {
    let task = Task::new("three-steps").lock_ttl(LONG);
    let effects: Arc<[AtomicU32; 3]> = Arc::new(Default::default());
    let run = |fail_second: bool| {
        let (store, effects) = (store.clone(), Arc::clone(&effects));
        let task = &task;
        async move {
            task.call("order-1")
                .store(store)
                .run_reported(async move {
                    let ctx = idempotask::context().expect("inside the body");
                    let charge: u32 = ctx
                        .step("charge", async {
                            Ok::<_, Error>(effects[0].fetch_add(1, Ordering::SeqCst) + 100)
                        })
                        .await?;
                    let ledger: String = ctx
                        .step("ledger", async {
                            effects[1].fetch_add(1, Ordering::SeqCst);
                            if fail_second {
                                return Err(Error::NotConfigured);
                            }
                            Ok(format!("row for {charge}"))
                        })
                        .await?;
                    let mail: u32 = ctx
                        .step(("mail", "ada@example.com"), async {
                            Ok::<_, Error>(effects[2].fetch_add(1, Ordering::SeqCst))
                        })
                        .await?;
                    Ok::<_, Error>(format!("{ledger}, mail {mail}"))
                })
                .await
        }
    };
    assert!(matches!(run(true).await, Err(Error::NotConfigured)));
    let report = run(false).await.unwrap();
    assert_eq!(report.value, "row for 100, mail 0");
    assert_eq!(report.outcome, Outcome::Executed);
    let counts = effects.each_ref().map(|count| count.load(Ordering::SeqCst));
    assert_eq!(
        counts,
        [1, 2, 1],
        "charge once, ledger twice (it failed once), mail once"
    );
    let replayed = run(false).await.unwrap();
    assert_eq!(
        (replayed.value.as_str(), replayed.outcome),
        ("row for 100, mail 0", Outcome::Replayed)
    );
    let counts = effects.each_ref().map(|count| count.load(Ordering::SeqCst));
    assert_eq!(counts, [1, 2, 1], "a replayed unit ran a step");
}

/// Checks that a holder whose lock ran out and was taken over does not start its next step:
/// the step answers `LockNotHeld` without running, and so does the call.
///
/// # Panics
/// When the store or the runner does not.
#[doc = example!(a_step_after_the_lock_was_taken_over_does_not_run)]
pub async fn a_step_after_the_lock_was_taken_over_does_not_run(store: SharedStore) {
    let ttl = Duration::from_secs(1);
    let task = Arc::new(Task::new("zombie-steps").lock_ttl(ttl));
    let successor = Task::new("zombie-steps").lock_ttl(LONG);
    let effects = Arc::new(AtomicU32::new(0));
    let (first_tx, first_rx) = tokio::sync::oneshot::channel();
    let (successor_tx, successor_rx) = tokio::sync::oneshot::channel::<()>();
    let stale = {
        let (task, store, effects) = (Arc::clone(&task), store.clone(), Arc::clone(&effects));
        tokio::spawn(async move {
            task.call("k")
                .store(store)
                .run(async move {
                    let ctx = idempotask::context().expect("inside the body");
                    ctx.step("first", async {
                        Ok::<_, Error>(effects.fetch_add(1, Ordering::SeqCst))
                    })
                    .await?;
                    first_tx.send(()).unwrap();
                    successor_rx.await.unwrap();
                    let second = ctx
                        .step("second", async {
                            Ok::<_, Error>(effects.fetch_add(10, Ordering::SeqCst))
                        })
                        .await;
                    assert!(
                        matches!(second, Err(Error::LockNotHeld { .. })),
                        "{second:?}"
                    );
                    // Whatever the body answers after that, the call answers `LockNotHeld`.
                    Ok::<u32, Error>(0)
                })
                .await
        })
    };
    first_rx.await.unwrap();
    outlive(ttl).await;
    let second = successor
        .call("k")
        .store(store.clone())
        .run(async {
            let ctx = idempotask::context().expect("inside the body");
            ctx.step("first", async {
                Ok::<_, Error>(effects.fetch_add(100, Ordering::SeqCst))
            })
            .await?;
            ctx.step("second", async {
                Ok::<_, Error>(effects.fetch_add(1000, Ordering::SeqCst))
            })
            .await
        })
        .await
        .unwrap();
    successor_tx.send(()).unwrap();
    let stale = stale.await.unwrap();
    assert!(matches!(stale, Err(Error::LockNotHeld { .. })), "{stale:?}");
    assert_eq!(
        second, 1,
        "the successor got the first step's recorded value"
    );
    assert_eq!(
        effects.load(Ordering::SeqCst),
        1001,
        "an effect ran twice or a stale step ran"
    );
}

/// Checks the refusals, each before the step's effect runs: a body whose steps come in another
/// order than the journal's (its unit then held, its lock not released), a step over the task's limit, two steps at once.
///
/// # Panics
/// When the store or the runner does not.
#[doc = example!(steps_that_cannot_be_recorded_are_refused_before_their_effect)]
pub async fn steps_that_cannot_be_recorded_are_refused_before_their_effect(store: SharedStore) {
    let effects = Arc::new(AtomicU32::new(0));
    let effect = |value: u32| {
        let effects = Arc::clone(&effects);
        async move {
            effects.fetch_add(1, Ordering::SeqCst);
            Ok::<u32, Error>(value)
        }
    };
    let step_kind = |result: &Result<u32, Error>| match result {
        Err(Error::Step { kind, .. }) => Some(*kind),
        _ => None,
    };
    let task = Task::new("refused-steps").lock_ttl(LONG).max_steps(2);
    let reordered = |first: &'static str, then_fail: bool| {
        task.call("order").store(store.clone()).run(async move {
            let ctx = idempotask::context().unwrap();
            ctx.step(first, effect(1)).await?;
            if then_fail {
                return Err(Error::NotConfigured);
            }
            Ok(0)
        })
    };
    assert!(matches!(
        reordered("a", true).await,
        Err(Error::NotConfigured)
    ));
    let changed = reordered("b", false).await;
    assert_eq!(
        step_kind(&changed),
        Some(StepErrorKind::OrderChanged),
        "{changed:?}"
    );
    assert_eq!(effects.load(Ordering::SeqCst), 1, "a reordered step ran");
    let held = store
        .inspect(&UnitOfWork::new("refused-steps", "order").unwrap())
        .await
        .unwrap();
    assert!(
        held.lock_ttl.is_some() && held.marker.is_none(),
        "a body whose steps changed order released its unit: {held:?}"
    );

    let too_many = task
        .call("many")
        .store(store.clone())
        .run(async {
            let ctx = idempotask::context().unwrap();
            for item in 0..3 {
                ctx.step(("item", item), effect(item)).await?;
            }
            Ok(0)
        })
        .await;
    assert_eq!(
        step_kind(&too_many),
        Some(StepErrorKind::TooMany),
        "{too_many:?}"
    );
    assert_eq!(
        effects.load(Ordering::SeqCst),
        3,
        "the step over the limit ran"
    );

    let overlapping = task
        .call("joined")
        .store(store.clone())
        .run(async {
            let ctx = idempotask::context().unwrap();
            let (started_tx, started_rx) = tokio::sync::oneshot::channel::<()>();
            let slow = ctx.step("slow", async {
                started_tx.send(()).unwrap();
                std::future::pending::<Result<u32, Error>>().await
            });
            let other = async {
                started_rx.await.unwrap();
                ctx.step("other", effect(2)).await
            };
            tokio::select! {
                answer = slow => answer,
                answer = other => answer,
            }
        })
        .await;
    assert_eq!(
        step_kind(&overlapping),
        Some(StepErrorKind::Overlapping),
        "{overlapping:?}"
    );
    assert_eq!(effects.load(Ordering::SeqCst), 3, "an overlapping step ran");
}

/// Checks that a step whose value is over the task's size limit runs once: its value is not
/// recorded, and a rerun gets a typed error for it instead of running its effect again.
///
/// # Panics
/// When the store or the runner does not.
#[doc = example!(a_step_over_the_size_limit_is_never_run_again)]
pub async fn a_step_over_the_size_limit_is_never_run_again(store: SharedStore) {
    let effects = Arc::new(AtomicU32::new(0));
    let small = Task::new("large-step").lock_ttl(LONG).max_step_bytes(64);
    let large = |fail: bool| {
        let effects = Arc::clone(&effects);
        small.call("k").store(store.clone()).run(async move {
            let ctx = idempotask::context().unwrap();
            let text: String = ctx
                .step("large", async {
                    effects.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, Error>("x".repeat(100))
                })
                .await?;
            if fail {
                return Err(Error::NotConfigured);
            }
            Ok(text.len())
        })
    };
    assert!(matches!(large(true).await, Err(Error::NotConfigured)));
    let rerun = large(false).await;
    assert!(
        matches!(
            &rerun,
            Err(Error::Codec {
                kind: CodecErrorKind::Unstorable,
                ..
            })
        ),
        "{rerun:?}"
    );
    assert_eq!(
        effects.load(Ordering::SeqCst),
        1,
        "a step whose value was too large ran again"
    );
}

/// Checks that deliveries of one unit at once, each retried until it succeeds, run every step's
/// effect exactly once, whichever delivery runs it, while a step fails now and then.
///
/// # Panics
/// When the store or the runner does not.
#[doc = example!(concurrent_deliveries_run_each_step_once)]
pub async fn concurrent_deliveries_run_each_step_once(store: SharedStore) {
    let task = Arc::new(Task::new("concurrent-steps").lock_ttl(LONG));
    let effects: Arc<[AtomicU32; 3]> = Arc::new(Default::default());
    let failures = Arc::new(AtomicU32::new(0));
    let deliveries: Vec<_> = (0..8)
        .map(|_| {
            let (task, store) = (Arc::clone(&task), store.clone());
            let (effects, failures) = (Arc::clone(&effects), Arc::clone(&failures));
            tokio::spawn(async move {
                loop {
                    let (effects, failures) = (Arc::clone(&effects), Arc::clone(&failures));
                    let answer = task
                        .call("k")
                        .store(store.clone())
                        .run(async move {
                            let ctx = idempotask::context().unwrap();
                            let mut total = 0;
                            for (position, name) in ["a", "b", "c"].into_iter().enumerate() {
                                total += ctx
                                    .step(name, async {
                                        // Every step fails on its first two tries.
                                        if failures.fetch_add(1, Ordering::SeqCst) % 3 != 2 {
                                            return Err(Error::NotConfigured);
                                        }
                                        Ok::<u32, Error>(
                                            effects[position].fetch_add(1, Ordering::SeqCst) + 1,
                                        )
                                    })
                                    .await?;
                            }
                            Ok::<u32, Error>(total)
                        })
                        .await;
                    match answer {
                        Ok(total) => return total,
                        Err(Error::NotConfigured | Error::Contended { .. }) => {
                            tokio::task::yield_now().await;
                        }
                        Err(other) => panic!("{other:?}"),
                    }
                }
            })
        })
        .collect();
    for delivery in deliveries {
        assert_eq!(delivery.await.unwrap(), 3, "a delivery got another total");
    }
    let counts = effects.each_ref().map(|count| count.load(Ordering::SeqCst));
    assert_eq!(counts, [1, 1, 1], "a step's effect ran more than once");
}
