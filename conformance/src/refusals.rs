//! What the task runner must refuse rather than run or replay: a key reused with other
//! arguments, a stored result it cannot decode or that could not be stored, a marker written
//! for another key, and a key no store can hold.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use idempotask::store::{Finish, LockToken, SharedStore, Store};
use idempotask::{Error, Fingerprint, InvalidKey, Task};

use super::{DAY, LONG, acquire, marker, unit};

/// Checks that a reused key with other arguments is rejected.
///
/// # Panics
/// When the store does not.
#[doc = example!(a_reused_key_with_other_arguments_is_rejected)]
pub async fn a_reused_key_with_other_arguments_is_rejected(store: SharedStore) {
    let task = Task::new("refund");
    let refund = |amount: u64| {
        let store = store.clone();
        let task = &task;
        async move {
            task.call("refund-1")
                .store(store)
                .fingerprint(Fingerprint::of(&(amount,)).unwrap())
                .run(async move { Ok::<_, Error>(amount) })
                .await
        }
    };
    assert_eq!(refund(500).await.unwrap(), 500);
    assert_eq!(refund(500).await.unwrap(), 500);
    assert!(matches!(refund(700).await, Err(Error::KeyReuse { .. })));
}

/// Checks that undecodable and unstorable results are typed errors.
///
/// # Panics
/// When the store does not.
#[doc = example!(undecodable_and_unstorable_results_are_typed_errors)]
pub async fn undecodable_and_unstorable_results_are_typed_errors(store: SharedStore) {
    let first: Result<u32, Error> = Task::new("typed")
        .call("k")
        .store(store.clone())
        .run(async { Ok(5) })
        .await;
    assert_eq!(first.unwrap(), 5);
    let changed: Result<String, Error> = Task::new("typed")
        .call("k")
        .store(store.clone())
        .run(async { Ok("ran again".to_owned()) })
        .await;
    assert!(matches!(changed, Err(Error::Codec { .. })), "{changed:?}");

    // A map with non-string keys has no JSON form: the work is still marked done.
    let runs = AtomicUsize::new(0);
    let unstorable = || async {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok::<_, Error>(HashMap::from([((1_u8, 2_u8), 3_u8)]))
    };
    let task = Task::new("unstorable");
    let first = task.call("k").store(store.clone()).run(unstorable()).await;
    assert_eq!(first.unwrap().len(), 1);
    let again = task.call("k").store(store.clone()).run(unstorable()).await;
    assert!(
        matches!(&again, Err(Error::Codec { reason, .. }) if reason.contains("could not be stored")),
        "{again:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// Checks that a marker of another key is never replayed.
///
/// # Panics
/// When the store does not.
#[doc = example!(a_marker_of_another_key_is_never_replayed)]
pub async fn a_marker_of_another_key_is_never_replayed(store: SharedStore) {
    // What a digest collision, or a foreign write, leaves under a unit's key name.
    let unit = unit("order-12");
    let token = LockToken::generate();
    acquire(&store, &unit, &token, LONG).await;
    let foreign = marker("order-999", None, "someone else's charge");
    assert_eq!(
        store.finish(&unit, &token, &foreign, DAY).await.unwrap(),
        Finish::Completed
    );
    let ran = AtomicUsize::new(0);
    let result: Result<String, Error> = Task::new("conformance")
        .call("order-12")
        .store(store.clone())
        .run(async {
            ran.fetch_add(1, Ordering::SeqCst);
            Ok("charged".to_owned())
        })
        .await;
    assert!(
        matches!(&result, Err(Error::MarkerKeyMismatch { key, stored_key, .. })
            if key == "order-12" && stored_key == "order-999"),
        "{result:?}"
    );
    assert_eq!(ran.load(Ordering::SeqCst), 0);
    let status = Task::new("conformance").status("order-12", &store).await;
    assert!(
        matches!(status, Err(Error::MarkerKeyMismatch { .. })),
        "{status:?}"
    );
}

/// Checks that invalid keys are rejected before the store.
///
/// # Panics
/// When the store does not.
#[doc = example!(invalid_keys_are_rejected_before_the_store)]
pub async fn invalid_keys_are_rejected_before_the_store(store: SharedStore) {
    let rejection = |task: &'static str, key: String| {
        let store = store.clone();
        async move {
            let result: Result<u8, Error> = Task::new(task)
                .call(key)
                .store(store)
                .run(async { Ok(1) })
                .await;
            match result {
                Err(Error::InvalidKey(invalid)) => invalid,
                other => panic!("expected an invalid key, got {other:?}"),
            }
        }
    };
    assert!(matches!(
        rejection("t", String::new()).await,
        InvalidKey::EmptyKey { .. }
    ));
    assert!(matches!(
        rejection("t", "x".repeat(1025)).await,
        InvalidKey::KeyTooLong { .. }
    ));
    assert!(matches!(
        rejection("a:b", "k".to_owned()).await,
        InvalidKey::TaskName { .. }
    ));
}
