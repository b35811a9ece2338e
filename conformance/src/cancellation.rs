//! What the runner must do when a call stops half-way: dropped while its `begin` is in flight,
//! dropped while its result is being recorded, a panic while encoding the result.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idempotask::store::{Inspection, SharedStore, Store, UnitOfWork};
use idempotask::{Error, Task};
use serde::{Deserialize, Serialize};
use tokio::time::{Instant, sleep};

use super::LONG;
use super::slow::SlowConnection;

/// Polls `unit` until `done` says yes, for at most `within` (far less than any lock TTL here).
async fn eventually(
    store: &SharedStore,
    unit: &UnitOfWork,
    within: Duration,
    what: &str,
    done: impl Fn(&Inspection) -> bool,
) {
    let deadline = Instant::now() + within;
    loop {
        let seen = store.inspect(unit).await.unwrap();
        if done(&seen) {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: {seen:?}");
        sleep(Duration::from_millis(10)).await;
    }
}

/// Checks that a call dropped while its `begin` is in flight does not leave the lock that
/// `begin` takes afterwards for the whole lock TTL.
///
/// # Panics
/// When the runner does not.
#[doc = example!(a_call_dropped_while_begin_is_in_flight_leaves_no_lock)]
pub async fn a_call_dropped_while_begin_is_in_flight_leaves_no_lock(store: SharedStore) {
    let slow = SlowConnection {
        begin_delay: Duration::from_millis(200),
        ..SlowConnection::new(&store)
    };
    let (beginning, begun) = (Arc::clone(&slow.beginning), Arc::clone(&slow.begun));
    let slow = SharedStore::new(slow);
    let runs = AtomicUsize::new(0);
    let task = Task::new("dropped-in-begin").lock_ttl(LONG);
    let call = task.call("k").store(slow).run(async {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok::<u8, Error>(1)
    });
    // The caller gives up while its `begin` is in flight, however slow the machine is.
    tokio::select! {
        () = beginning.notified() => {}
        answer = call => panic!("the call ended before its begin was applied: {answer:?}"),
    }
    // The stalled `begin` is applied after the caller gave up, and takes the lock.
    begun.notified().await;
    let unit = UnitOfWork::new("dropped-in-begin", "k").unwrap();
    eventually(
        &store,
        &unit,
        Duration::from_secs(5),
        "the lock a dropped call's begin took outlived it",
        |seen| !seen.is_locked() && !seen.is_done(),
    )
    .await;
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

/// Checks that a call dropped after its body succeeded, while the result is being recorded,
/// still leaves the result: the next delivery replays it instead of running again.
///
/// # Panics
/// When the runner does not.
#[doc = example!(a_call_dropped_while_recording_still_stores_the_result)]
pub async fn a_call_dropped_while_recording_still_stores_the_result(store: SharedStore) {
    // A fenced lock is compared with its fencing token: the background finish must carry it.
    for fencing in [false, true] {
        dropped_while_recording(&store, fencing).await;
    }
}

async fn dropped_while_recording(store: &SharedStore, fencing: bool) {
    let slow = SlowConnection {
        finish_delay: Duration::from_millis(300),
        ..SlowConnection::new(store)
    };
    let finishing = Arc::clone(&slow.finishing);
    let task = Task::new("dropped-in-finish")
        .lock_ttl(LONG)
        .fencing(fencing);
    let key = format!("fenced-{fencing}");
    let runs = AtomicUsize::new(0);
    let call = task
        .call(key.as_str())
        .store(SharedStore::new(slow))
        .run(async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<u8, Error>(1)
        });
    // Dropped as soon as its finish is sent, however slow the machine is.
    tokio::select! {
        () = finishing.notified() => {}
        answer = call => panic!("the call ended before its finish was applied: {answer:?}"),
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the body did not run");
    let unit = UnitOfWork::new("dropped-in-finish", key.as_str()).unwrap();
    eventually(
        store,
        &unit,
        Duration::from_secs(5),
        &format!(
            "the result of a call dropped while recording was never stored (fencing {fencing})"
        ),
        Inspection::is_done,
    )
    .await;
    let again: u8 = task
        .call(key.as_str())
        .store(store.clone())
        .run(async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<u8, Error>(2)
        })
        .await
        .unwrap();
    assert_eq!((again, runs.load(Ordering::SeqCst)), (1, 1));
}

/// A result whose `Serialize` panics.
#[derive(Debug, Deserialize)]
struct Explosive;

impl Serialize for Explosive {
    fn serialize<S: serde::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
        panic!("this result cannot be serialised");
    }
}

/// Checks that a panic while the result is encoded (after the body succeeded) frees the lock
/// at once, as a panic in the body does.
///
/// # Panics
/// When the runner does not.
#[doc = example!(a_panic_while_encoding_the_result_frees_the_lock)]
pub async fn a_panic_while_encoding_the_result_frees_the_lock(store: SharedStore) {
    let call = {
        let store = store.clone();
        tokio::spawn(async move {
            Task::new("explosive")
                .lock_ttl(LONG)
                .call("k")
                .store(store)
                .run(async { Ok::<_, Error>(Explosive) })
                .await
        })
    };
    assert!(call.await.unwrap_err().is_panic());
    let unit = UnitOfWork::new("explosive", "k").unwrap();
    eventually(
        &store,
        &unit,
        Duration::from_secs(5),
        "a panic while encoding the result kept the lock",
        |seen| !seen.is_locked() && !seen.is_done(),
    )
    .await;
}
