//! What the runner on top of a store must do when a lock runs out under a delivery: a grant
//! whose reply came too late, two executions whose results are equal, and a body's fence
//! before its next side effect.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idempotask::store::{SharedStore, StoreErrorKind};
use idempotask::{Error, Outcome, Task};

use super::slow::SlowConnection;
use super::{LONG, outlive};

/// Checks that two executions of one unit whose results are equal are told apart: the one whose
/// lock ran out hears `LockLost`, not `Executed`.
///
/// A holder overruns its lock, a second delivery takes the unit over and stores `()`, then the
/// first returns `()` too. Its marker must not pass for a repeat of its own finish.
///
/// # Panics
/// When the store or the runner does not.
#[doc = example!(a_double_run_with_equal_results_is_reported_as_lost)]
pub async fn a_double_run_with_equal_results_is_reported_as_lost(store: SharedStore) {
    // The first delivery's grant must reach it with time left on a loaded machine (a grant
    // that comes too late does not run); the lock then runs out while its body waits.
    let ttl = Duration::from_secs(1);
    let task = Arc::new(Task::new("overrun-equal").lock_ttl(ttl));
    // The successor's lock must not run out before it stores its result.
    let successor = Task::new("overrun-equal").lock_ttl(LONG);
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let (successor_done_tx, successor_done_rx) = tokio::sync::oneshot::channel::<()>();
    let first = {
        let (task, store) = (Arc::clone(&task), store.clone());
        tokio::spawn(async move {
            task.call("k")
                .store(store)
                .run_reported(async move {
                    started_tx.send(()).unwrap();
                    // Runs on until the successor has stored its own (equal) result.
                    successor_done_rx.await.unwrap();
                    Ok::<(), Error>(())
                })
                .await
        })
    };
    started_rx.await.unwrap();
    outlive(ttl).await;
    let second = successor
        .call("k")
        .store(store.clone())
        .run_reported(async { Ok::<(), Error>(()) })
        .await
        .unwrap();
    assert_eq!(second.outcome, Outcome::Executed);
    successor_done_tx.send(()).unwrap();
    let first = first.await.unwrap().unwrap();
    assert!(
        matches!(
            first.outcome,
            Outcome::LockLost {
                marker_written: false,
                ..
            }
        ),
        "the body ran twice, and the delivery whose lock ran out was told it executed: {:?}",
        first.outcome
    );
}

/// Checks that a grant whose reply arrives after its lock expired does not run the body: the
/// unit may already be another delivery's.
///
/// # Panics
/// When the store or the runner does not.
#[doc = example!(a_grant_that_arrives_after_its_lock_expired_does_not_run)]
pub async fn a_grant_that_arrives_after_its_lock_expired_does_not_run(store: SharedStore) {
    let ttl = Duration::from_millis(100);
    // Applied at once, answered after the lock expired.
    let late = SharedStore::new(SlowConnection {
        reply_delay: ttl * 2,
        ..SlowConnection::new(&store)
    });
    let runs = AtomicUsize::new(0);
    let result: Result<u32, Error> = Task::new("late-grant")
        .lock_ttl(ttl)
        .call("k")
        .store(late)
        .run(async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok(1)
        })
        .await;
    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "the body ran on an expired grant"
    );
    match result {
        Err(Error::Store(err)) => {
            assert_eq!(err.kind(), StoreErrorKind::Timeout, "{err}");
            assert!(err.is_ambiguous(), "{err}");
        }
        other => panic!("expected an ambiguous timeout, got {other:?}"),
    }
    // Nothing is left behind: the next delivery runs at once. Its own lock is long, so that
    // its grant is not one that came too late.
    let next: u32 = Task::new("late-grant")
        .lock_ttl(LONG)
        .retry(idempotask::RetryPolicy::no_wait())
        .call("k")
        .store(store)
        .run(async { Ok::<_, Error>(2) })
        .await
        .unwrap();
    assert_eq!(next, 2);
}

/// Checks that a body's fence stops a holder whose unit was taken over before its next side
/// effect, and renews the lock of a holder that still has it.
///
/// The first delivery fences (granted, and its lock renewed), does its first effect, then
/// pauses past its lock TTL while a second delivery takes the unit over and runs. Its next
/// fence must answer `LockNotHeld`, and its second effect never start.
///
/// # Panics
/// When the store or the runner does not.
#[doc = example!(a_fence_stops_a_holder_whose_unit_was_taken_over)]
pub async fn a_fence_stops_a_holder_whose_unit_was_taken_over(store: SharedStore) {
    // Long enough that the first grant and fence come well within it on a loaded machine.
    let ttl = Duration::from_secs(1);
    let task = Arc::new(Task::new("fenced").lock_ttl(ttl));
    // The successor's lock must not run out before it stores its result.
    let successor = Task::new("fenced").lock_ttl(LONG);
    let effects = Arc::new(AtomicUsize::new(0));
    let (first_effect_tx, first_effect_rx) = tokio::sync::oneshot::channel();
    let (successor_done_tx, successor_done_rx) = tokio::sync::oneshot::channel::<()>();
    let first = {
        let (task, store, effects) = (Arc::clone(&task), store.clone(), Arc::clone(&effects));
        tokio::spawn(async move {
            task.call("k")
                .store(store)
                .run(async move {
                    let ctx = idempotask::context().expect("inside the body");
                    ctx.fence().await?;
                    effects.fetch_add(1, Ordering::SeqCst);
                    first_effect_tx.send(()).unwrap();
                    successor_done_rx.await.unwrap();
                    let fenced = ctx.fence().await;
                    assert!(!ctx.lock_held(), "a refused fence left the lease held");
                    if fenced.is_err() {
                        // Whatever the body answers after a refused fence, the call answers
                        // that the lock is not held.
                        return Err(Error::NotConfigured);
                    }
                    effects.fetch_add(10, Ordering::SeqCst);
                    Ok::<u32, Error>(1)
                })
                .await
        })
    };
    first_effect_rx.await.unwrap();
    outlive(ttl).await;
    let second = successor
        .call("k")
        .store(store.clone())
        .run_reported(async {
            effects.fetch_add(100, Ordering::SeqCst);
            Ok::<u32, Error>(2)
        })
        .await
        .unwrap();
    assert_eq!((second.value, second.outcome), (2, Outcome::Executed));
    successor_done_tx.send(()).unwrap();
    let first = first.await.unwrap();
    assert!(
        matches!(&first, Err(Error::LockNotHeld { task, .. }) if task == "fenced"),
        "a holder whose unit was taken over passed its fence: {first:?}"
    );
    assert_eq!(
        effects.load(Ordering::SeqCst),
        101,
        "the stale holder started an effect after its fence"
    );
    // The unit keeps the successor's result.
    let replayed: u32 = task
        .call("k")
        .store(store.clone())
        .run(async { Ok::<u32, Error>(3) })
        .await
        .unwrap();
    assert_eq!(replayed, 2);

    // A holder that still has its lock passes its fence, which renews the lock in the store:
    // a body that fences at two thirds of its TTL runs past the TTL, a delivery meanwhile
    // finds the unit busy, and the body still finishes as its holder. The third of the TTL
    // left after the second pause covers the intruder's call and the finish on a loaded
    // machine.
    let long = Duration::from_secs(3);
    let renewed_task = Task::new("fenced-renewed").lock_ttl(long);
    let intruder_store = store.clone();
    let renewed = renewed_task
        .call("k")
        .store(store)
        .run_reported(async move {
            let ctx = idempotask::context().expect("inside the body");
            tokio::time::sleep(long * 2 / 3).await;
            ctx.fence().await?;
            tokio::time::sleep(long * 2 / 3).await;
            // Another tokio task: a call made from inside this body's unit would be refused
            // as re-entered.
            let intruder = tokio::spawn(async move {
                Task::new("fenced-renewed")
                    .retry(idempotask::RetryPolicy::no_wait())
                    .call("k")
                    .store(intruder_store)
                    .run(async { Ok::<u32, Error>(5) })
                    .await
            })
            .await
            .unwrap();
            assert!(
                matches!(intruder, Err(Error::Contended { .. })),
                "the fence did not renew the lock in the store: {intruder:?}"
            );
            assert!(ctx.lock_held(), "the fence did not renew the lease");
            Ok::<u32, Error>(4)
        })
        .await
        .unwrap();
    assert_eq!((renewed.value, renewed.outcome), (4, Outcome::Executed));
}
