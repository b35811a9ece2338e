//! What the task runner on top of a store must do: replays, errors, panics, contention.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idempotask::store::{LockToken, SharedStore, Store, UnitOfWork};
use idempotask::{Error, LockRenewal, Outcome, RetryPolicy, Task};

use super::{LONG, acquire, outlive};

fn task(name: &'static str) -> Task {
    Task::new(name)
}

/// Checks that a duplicate gets the stored result without running.
///
/// # Panics
/// When the store does not.
#[doc = example!(a_duplicate_gets_the_stored_result_without_running)]
pub async fn a_duplicate_gets_the_stored_result_without_running(store: SharedStore) {
    let task = task("charge");
    let runs = AtomicUsize::new(0);
    let charge = |amount: u64| {
        let runs = &runs;
        async move {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Error>(format!("ch_{amount}"))
        }
    };
    let first = task
        .call("order-9")
        .store(store.clone())
        .run_reported(charge(1200))
        .await
        .unwrap();
    assert_eq!(
        (first.value.as_str(), first.outcome),
        ("ch_1200", Outcome::Executed)
    );
    for _ in 0..3 {
        let again = task
            .call("order-9")
            .store(store.clone())
            .run_reported(charge(9999))
            .await
            .unwrap();
        assert_eq!(again.value, "ch_1200");
        assert_eq!(again.outcome, Outcome::Replayed);
        assert_eq!(again.fencing_token, first.fencing_token);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// Checks that errors are not cached and free the lock.
///
/// # Panics
/// When the store does not.
#[doc = example!(errors_are_not_cached_and_free_the_lock)]
pub async fn errors_are_not_cached_and_free_the_lock(store: SharedStore) {
    let task = task("flaky");
    let runs = AtomicUsize::new(0);
    let attempt = || {
        let runs = &runs;
        async move {
            if runs.fetch_add(1, Ordering::SeqCst) == 0 {
                Err(Error::NotConfigured)
            } else {
                Ok(7_u32)
            }
        }
    };
    let failed = task.call("k").store(store.clone()).run(attempt()).await;
    assert!(matches!(failed, Err(Error::NotConfigured)));
    let seen = store
        .inspect(&UnitOfWork::new("flaky", "k").unwrap())
        .await
        .unwrap();
    assert!(!seen.is_done() && !seen.is_locked(), "{seen:?}");
    let retried = task.call("k").store(store.clone()).run(attempt()).await;
    assert_eq!(retried.unwrap(), 7);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// Checks that a panic frees the lock and resumes.
///
/// # Panics
/// When the store does not.
#[doc = example!(a_panic_frees_the_lock_and_resumes)]
pub async fn a_panic_frees_the_lock_and_resumes(store: SharedStore) {
    let handle = {
        let store = store.clone();
        tokio::spawn(async move {
            Task::new("panicky")
                .call("k")
                .store(store)
                .run(async {
                    assert!(std::hint::black_box(false), "the body panicked");
                    Ok::<u32, Error>(1)
                })
                .await
        })
    };
    let err = handle.await.unwrap_err();
    assert!(err.is_panic());
    let seen = store
        .inspect(&UnitOfWork::new("panicky", "k").unwrap())
        .await
        .unwrap();
    assert!(!seen.is_done() && !seen.is_locked(), "{seen:?}");
}

/// Checks that a dropped call frees the lock.
///
/// # Panics
/// When the store does not.
#[doc = example!(a_dropped_call_frees_the_lock)]
pub async fn a_dropped_call_frees_the_lock(store: SharedStore) {
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let call = {
        let store = store.clone();
        tokio::spawn(async move {
            Task::new("dropped")
                .call("k")
                .store(store)
                .run(async move {
                    started_tx.send(()).unwrap();
                    std::future::pending::<()>().await;
                    Ok::<u32, Error>(1)
                })
                .await
        })
    };
    started_rx.await.unwrap();
    let unit = UnitOfWork::new("dropped", "k").unwrap();
    assert!(store.inspect(&unit).await.unwrap().is_locked());
    call.abort();
    assert!(call.await.unwrap_err().is_cancelled());
    // The release runs in the background: wait for it, far less than the 30 s lock TTL.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let seen = store.inspect(&unit).await.unwrap();
        if !seen.is_locked() {
            assert!(!seen.is_done());
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the lock outlived the dropped call"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Checks that concurrent deliveries run the body once.
///
/// # Panics
/// When the store does not.
#[doc = example!(concurrent_deliveries_run_the_body_once)]
pub async fn concurrent_deliveries_run_the_body_once(store: SharedStore) {
    let runs = Arc::new(AtomicUsize::new(0));
    let barrier = Arc::new(tokio::sync::Barrier::new(64));
    let calls = (0..64).map(|delivery| {
        let (store, runs, barrier) = (store.clone(), runs.clone(), barrier.clone());
        tokio::spawn(async move {
            static SEND: Task = Task::new("send_mail");
            barrier.wait().await;
            SEND.call("order-10")
                .store(store)
                .run(async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    // Long enough that every other delivery arrives while the lock is held.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    Ok::<_, Error>(format!("sent by delivery {delivery}"))
                })
                .await
        })
    });
    let mut results = Vec::new();
    for call in calls.collect::<Vec<_>>() {
        results.push(call.await.unwrap().unwrap());
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the side effect ran more than once"
    );
    assert!(results.iter().all(|r| *r == results[0]), "{results:?}");
}

/// Checks that a waiter gives up with contended.
///
/// # Panics
/// When the store does not.
#[doc = example!(a_waiter_gives_up_with_contended)]
pub async fn a_waiter_gives_up_with_contended(store: SharedStore) {
    let unit = UnitOfWork::new("busy", "k").unwrap();
    let holder = LockToken::generate();
    acquire(&store, &unit, &holder, LONG).await;
    let ran = AtomicUsize::new(0);
    let result = Task::new("busy")
        .retry(
            RetryPolicy::new()
                .max_attempts(3)
                .initial_backoff(Duration::from_millis(1)),
        )
        .call("k")
        .store(store.clone())
        .run(async {
            ran.fetch_add(1, Ordering::SeqCst);
            Ok::<u32, Error>(1)
        })
        .await;
    match result {
        Err(Error::Contended {
            attempts,
            lock_ttl_remaining: Some(left),
            ..
        }) => {
            assert_eq!(attempts, 3);
            assert!(left > Duration::from_secs(20));
        }
        other => panic!("expected Contended, got {other:?}"),
    }
    assert_eq!(ran.load(Ordering::SeqCst), 0);
}

/// Checks that the body sees its context.
///
/// # Panics
/// When the store does not.
#[doc = example!(the_body_sees_its_context)]
pub async fn the_body_sees_its_context(store: SharedStore) {
    assert!(idempotask::context().is_none());
    let report = Task::new("ctx")
        .fencing(true)
        .call("order:{11}")
        .store(store.clone())
        .run_reported(async {
            let ctx = idempotask::context().unwrap();
            Ok::<_, Error>((
                ctx.task().to_owned(),
                ctx.key().to_owned(),
                ctx.fencing_token(),
                ctx.attempt(),
                ctx.lock_held(),
            ))
        })
        .await
        .unwrap();
    let (task, key, fence, attempt, held) = report.value;
    assert_eq!((task.as_str(), key.as_str()), ("ctx", "order:{11}"));
    assert_eq!((fence, attempt, held), (report.fencing_token, 1, true));
    assert!(fence.is_some());

    let plain = Task::new("ctx")
        .call("order:{12}")
        .store(store)
        .run(async { Ok::<_, Error>(idempotask::context().unwrap().fencing_token()) })
        .await
        .unwrap();
    assert_eq!(plain, None, "a task without fencing gets no made-up token");
}

/// Checks that renewal keeps a short lock through a long body, both by a watchdog task and
/// in the body's own task ([`LockRenewal::InTask`]).
///
/// # Panics
/// When the store does not.
#[doc = example!(renewal_keeps_a_short_lock_through_a_long_body)]
pub async fn renewal_keeps_a_short_lock_through_a_long_body(store: SharedStore) {
    // Renewed every third of it: each renewal has two thirds of a second to land on a
    // loaded machine before the lock would run out.
    let ttl = Duration::from_secs(1);
    for (how, key) in [
        (LockRenewal::Watchdog, "watchdog"),
        (LockRenewal::InTask, "in-task"),
    ] {
        let (halfway_tx, halfway_rx) = tokio::sync::oneshot::channel();
        let (resume_tx, resume_rx) = tokio::sync::oneshot::channel::<()>();
        let holder = {
            let store = store.clone();
            tokio::spawn(async move {
                Task::new("renewed")
                    .lock_ttl(ttl)
                    .lock_renewal(how)
                    .call(key)
                    .store(store)
                    .run_reported(async move {
                        // Three TTLs pass before the body lets go.
                        tokio::time::sleep(ttl * 3).await;
                        halfway_tx.send(()).unwrap();
                        resume_rx.await.unwrap();
                        Ok::<_, Error>(idempotask::context().unwrap().lock_held())
                    })
                    .await
            })
        };
        halfway_rx.await.unwrap();
        let intruder = Task::new("renewed")
            .retry(RetryPolicy::no_wait())
            .call(key)
            .store(store.clone())
            .run(async { Ok::<bool, Error>(false) })
            .await;
        assert!(
            matches!(intruder, Err(Error::Contended { .. })),
            "renewed {key}: {intruder:?}"
        );
        resume_tx.send(()).unwrap();
        let report = holder.await.unwrap().unwrap();
        assert!(report.value, "renewed {key}: the body saw its lock as lost");
        assert_eq!(report.outcome, Outcome::Executed, "renewed {key}");
    }
}

/// Checks that an expired lock is reported as lost.
///
/// # Panics
/// When the store does not.
#[doc = example!(an_expired_lock_is_reported_as_lost)]
pub async fn an_expired_lock_is_reported_as_lost(store: SharedStore) {
    let ttl = Duration::from_millis(150);
    // Forgotten as soon as it runs out: a remembered lock that nobody took over would still
    // be this delivery's to finish.
    let report = Task::new("overran")
        .lock_ttl(ttl)
        .doubt_memory(Duration::ZERO)
        .call("k")
        .store(store.clone())
        .run_reported(async {
            outlive(ttl).await;
            Ok::<_, Error>(idempotask::context().unwrap().lock_held())
        })
        .await
        .unwrap();
    assert!(
        !report.value,
        "lock_held() must turn false once the TTL ran out"
    );
    assert!(
        matches!(
            report.outcome,
            Outcome::LockLost {
                marker_written: true,
                ..
            }
        ),
        "{:?}",
        report.outcome
    );
}
