//! What a store itself must answer, operation by operation.

use std::time::Duration;

use idempotask::store::{Begin, Fencing, Finish, SharedStore, Store};
use idempotask::store::{LockToken, UnitOfWork};

use super::{DAY, LONG, acquire, acquire_fenced, fence, marker, outlive, unit};

/// Checks that begin grants one holder and reports busy.
///
/// # Panics
/// When the store does not.
#[doc = example!(begin_grants_one_holder_and_reports_busy)]
pub async fn begin_grants_one_holder_and_reports_busy(store: SharedStore) {
    let unit = unit("order-1");
    let (a, b) = (LockToken::generate(), LockToken::generate());
    acquire(&store, &unit, &a, LONG).await;
    match store.begin(&unit, &b, LONG, Fencing::Off).await.unwrap() {
        Begin::Busy {
            lock_ttl_remaining: Some(left),
            ..
        } => assert!(
            left <= LONG && left > LONG.saturating_sub(Duration::from_secs(5)),
            "{left:?}"
        ),
        other => panic!("expected busy, got {other:?}"),
    }
}

/// Checks that begin repeated by the holder is acquired again.
///
/// # Panics
/// When the store does not.
#[doc = example!(begin_repeated_by_the_holder_is_acquired_again)]
pub async fn begin_repeated_by_the_holder_is_acquired_again(store: SharedStore) {
    let unit = unit("order-2");
    let token = LockToken::generate();
    acquire(&store, &unit, &token, LONG).await;
    acquire(&store, &unit, &token, LONG).await;

    let fenced = UnitOfWork::new("conformance", "order-2-fenced").unwrap();
    let first = acquire_fenced(&store, &fenced, &token, LONG).await;
    let again = acquire_fenced(&store, &fenced, &token, LONG).await;
    assert_eq!(
        first, again,
        "a retried begin must not take a second fencing token"
    );
}

/// Checks that finish stores the marker and frees the lock.
///
/// # Panics
/// When the store does not.
#[doc = example!(finish_stores_the_marker_and_frees_the_lock)]
pub async fn finish_stores_the_marker_and_frees_the_lock(store: SharedStore) {
    let unit = unit("order-3");
    let token = LockToken::generate();
    acquire(&store, &unit, &token, LONG).await;
    let bytes = marker(unit.key(), None, "done");
    assert_eq!(
        store.finish(&unit, &token, &bytes, DAY).await.unwrap(),
        Finish::Completed
    );
    let seen = store.inspect(&unit).await.unwrap();
    assert_eq!(seen.marker.as_deref(), Some(&bytes[..]));
    assert!(!seen.is_locked());
    let ttl = seen.marker_ttl.expect("markers expire");
    assert!(ttl <= DAY && ttl > DAY.saturating_sub(Duration::from_secs(60)));
    let other = LockToken::generate();
    for fencing in [Fencing::Off, Fencing::On] {
        assert_eq!(
            store.begin(&unit, &other, LONG, fencing).await.unwrap(),
            Begin::Done(bytes.clone())
        );
    }
    // A finish whose reply was lost is repeated: it must still read as completed.
    assert_eq!(
        store.finish(&unit, &token, &bytes, DAY).await.unwrap(),
        Finish::Completed
    );
}

/// Checks that a stale holder never touches its successor.
///
/// # Panics
/// When the store does not.
#[doc = example!(a_stale_holder_never_touches_its_successor)]
pub async fn a_stale_holder_never_touches_its_successor(store: SharedStore) {
    let unit = unit("order-4");
    let short = Duration::from_millis(150);
    let (stale, fresh) = (LockToken::generate(), LockToken::generate());
    let stale = acquire_fenced(&store, &unit, &stale, short).await;
    outlive(short).await;
    let fresh = acquire_fenced(&store, &unit, &fresh, LONG).await;
    assert!(fence(&fresh) > fence(&stale), "{fresh:?} after {stale:?}");

    assert!(!store.release(&unit, &stale).await.unwrap());
    assert!(!store.renew(&unit, &stale, LONG).await.unwrap());
    assert!(
        store.inspect(&unit).await.unwrap().is_locked(),
        "the stale release deleted the new lock"
    );

    // The successor holds the unit: the stale result is not stored over its lock.
    let stale_marker = marker(unit.key(), Some(fence(&stale)), "stale");
    assert_eq!(
        store
            .finish(&unit, &stale, &stale_marker, DAY)
            .await
            .unwrap(),
        Finish::lost_nothing_written()
    );
    assert!(
        store.inspect(&unit).await.unwrap().is_locked(),
        "the stale finish deleted the new lock"
    );

    // The legitimate holder's result wins.
    let fresh_marker = marker(unit.key(), Some(fence(&fresh)), "fresh");
    assert_eq!(
        store
            .finish(&unit, &fresh, &fresh_marker, DAY)
            .await
            .unwrap(),
        Finish::Completed
    );
    assert_eq!(
        store.inspect(&unit).await.unwrap().marker,
        Some(fresh_marker.clone())
    );
    // A stale holder finishing after the successor never overwrites its marker.
    assert_eq!(
        store
            .finish(&unit, &stale, &stale_marker, DAY)
            .await
            .unwrap(),
        Finish::lost_nothing_written()
    );
    assert_eq!(
        store.inspect(&unit).await.unwrap().marker,
        Some(fresh_marker)
    );
}

/// Checks that a late finish keeps the result when nobody holds the unit.
///
/// # Panics
/// When the store does not.
#[doc = example!(a_late_finish_keeps_the_result_when_nobody_holds_the_unit)]
pub async fn a_late_finish_keeps_the_result_when_nobody_holds_the_unit(store: SharedStore) {
    let short = Duration::from_millis(150);
    for fencing in [false, true] {
        let unit = unit(&format!("order-late-{fencing}"));
        let token = LockToken::generate();
        let holder = if fencing {
            acquire_fenced(&store, &unit, &token, short).await
        } else {
            acquire(&store, &unit, &token, short).await;
            token
        };
        outlive(short).await;
        let bytes = marker(unit.key(), holder.fencing_token(), "late");
        assert_eq!(
            store.finish(&unit, &holder, &bytes, DAY).await.unwrap(),
            Finish::lost_marker_written()
        );
        // Its reply lost, the same finish is repeated (by the runner, or by a client that
        // re-sends): it finds its own marker and answers as the first one did.
        assert_eq!(
            store.finish(&unit, &holder, &bytes, DAY).await.unwrap(),
            Finish::lost_marker_written(),
            "a repeated late finish must still say the lock was lost"
        );
        // Stored as it was given, or flagged as written after the lock expired.
        let stored = store.inspect(&unit).await.unwrap().marker.unwrap();
        assert!(
            stored == bytes
                || Some(&stored) == idempotask::store::lock_lost_marker(&bytes).as_ref(),
            "{:?}",
            String::from_utf8_lossy(&stored)
        );
    }
}

/// Checks that only the holder releases or renews.
///
/// # Panics
/// When the store does not.
#[doc = example!(only_the_holder_releases_or_renews)]
pub async fn only_the_holder_releases_or_renews(store: SharedStore) {
    let unit = unit("order-5");
    let (holder, other) = (LockToken::generate(), LockToken::generate());
    // Long enough to outlast the calls before the renewal on a loaded machine, short enough
    // that the renewal to `LONG` shows in what is left.
    acquire(&store, &unit, &holder, Duration::from_secs(10)).await;
    // The right token with a fencing token the grant did not have does not renew (a release
    // goes by the token alone: see `a_release_without_the_fencing_token_frees_the_lock`).
    let forged = holder.clone().with_fencing_token(u64::MAX);
    assert!(!store.renew(&unit, &forged, LONG).await.unwrap());
    assert!(!store.release(&unit, &other).await.unwrap());
    assert!(!store.renew(&unit, &other, LONG).await.unwrap());
    assert!(store.renew(&unit, &holder, LONG).await.unwrap());
    let left = store.inspect(&unit).await.unwrap().lock_ttl.unwrap();
    assert!(
        left > Duration::from_secs(20),
        "renew did not extend the lock: {left:?}"
    );
    assert!(store.release(&unit, &holder).await.unwrap());
    assert!(!store.inspect(&unit).await.unwrap().is_locked());
    assert!(!store.release(&unit, &holder).await.unwrap());
    acquire(&store, &unit, &other, LONG).await;
}

/// Checks that fencing tokens increase across grants and expiry.
///
/// # Panics
/// When the store does not.
#[doc = example!(fencing_tokens_increase_across_grants_and_expiry)]
pub async fn fencing_tokens_increase_across_grants_and_expiry(store: SharedStore) {
    let unit = unit("order-6");
    let short = Duration::from_millis(100);
    let mut last = 0;
    for round in 0..6 {
        // A lock that is released must still be held when its release arrives, however slow
        // the store is; only the ones left to expire get the short TTL.
        let ttl = if round % 2 == 0 { LONG } else { short };
        let token = acquire_fenced(&store, &unit, &LockToken::generate(), ttl).await;
        let fence = fence(&token);
        assert!(fence > last, "round {round}: {fence} <= {last}");
        last = fence;
        if round % 2 == 0 {
            assert!(store.release(&unit, &token).await.unwrap());
            // A released fenced lock leaves only its counter: the unit is free.
            let seen = store.inspect(&unit).await.unwrap();
            assert!(!seen.is_locked() && !seen.is_done(), "{seen:?}");
        } else {
            outlive(short).await;
        }
    }
    // A task without fencing that takes the unit right after a fenced release keeps counting.
    let token = acquire_fenced(&store, &unit, &LockToken::generate(), LONG).await;
    assert!(store.release(&unit, &token).await.unwrap());
    match store
        .begin(&unit, &LockToken::generate(), LONG, Fencing::Off)
        .await
        .unwrap()
    {
        Begin::Acquired {
            fencing_token: Some(next),
            ..
        } => assert!(next > fence(&token), "{next} after {token:?}"),
        other => panic!("expected the lock with the counter going on, got {other:?}"),
    }
}

/// Checks that forget deletes the marker on purpose.
///
/// # Panics
/// When the store does not.
#[doc = example!(forget_deletes_the_marker_on_purpose)]
pub async fn forget_deletes_the_marker_on_purpose(store: SharedStore) {
    let unit = unit("order-7");
    let token = acquire_fenced(&store, &unit, &LockToken::generate(), LONG).await;
    store
        .finish(
            &unit,
            &token,
            &marker(unit.key(), Some(fence(&token)), "x"),
            DAY,
        )
        .await
        .unwrap();
    assert!(store.forget(&unit).await.unwrap());
    assert!(!store.inspect(&unit).await.unwrap().is_done());
    assert!(!store.forget(&unit).await.unwrap());
    let next = acquire_fenced(&store, &unit, &LockToken::generate(), LONG).await;
    assert!(fence(&next) > fence(&token));
    // A lock is not a marker: forget leaves it alone.
    assert!(!store.forget(&unit).await.unwrap());
    assert!(store.inspect(&unit).await.unwrap().is_locked());
}

/// Checks that markers expire after the result ttl.
///
/// # Panics
/// When the store does not.
#[doc = example!(markers_expire_after_the_result_ttl)]
pub async fn markers_expire_after_the_result_ttl(store: SharedStore) {
    let unit = unit("order-8");
    let token = LockToken::generate();
    acquire(&store, &unit, &token, LONG).await;
    let ttl = Duration::from_millis(150);
    store
        .finish(&unit, &token, &marker(unit.key(), None, "x"), ttl)
        .await
        .unwrap();
    outlive(ttl).await;
    assert_eq!(
        store.inspect(&unit).await.unwrap(),
        idempotask::store::Inspection::default()
    );
    acquire(&store, &unit, &LockToken::generate(), LONG).await;
}

/// Checks that look alike keys are separate units.
///
/// # Panics
/// When the store does not.
#[doc = example!(look_alike_keys_are_separate_units)]
pub async fn look_alike_keys_are_separate_units(store: SharedStore) {
    let long = "k".repeat(1024);
    let keys = [
        "a:b", "a", "b", "{a}", "{a}:b", "a}{b", "a\nb", "a\r\nb", "ключ", "", &long,
    ];
    let units: Vec<UnitOfWork> = keys
        .iter()
        .filter(|k| !k.is_empty())
        .map(|k| unit(k))
        .chain([UnitOfWork::new("other_task", "a:b").unwrap()])
        .collect();
    let tokens: Vec<LockToken> = units.iter().map(|_| LockToken::generate()).collect();
    for (unit, token) in units.iter().zip(&tokens) {
        acquire(&store, unit, token, LONG).await;
    }
    let first = &units[0];
    store
        .finish(first, &tokens[0], &marker("a:b", None, "first"), DAY)
        .await
        .unwrap();
    for unit in &units[1..] {
        let seen = store.inspect(unit).await.unwrap();
        assert!(
            !seen.is_done() && seen.is_locked(),
            "{unit:?} is not separate"
        );
    }
    assert!(matches!(
        UnitOfWork::new("conformance", ""),
        Err(idempotask::InvalidKey::EmptyKey { .. })
    ));
    assert!(matches!(
        UnitOfWork::new("conformance", format!("{long}k")),
        Err(idempotask::InvalidKey::KeyTooLong { .. })
    ));
}

/// Checks that the longest TTL a task can have, [`MAX_TTL`](idempotask::MAX_TTL) (what
/// `result_ttl(Duration::MAX)`, "keep it", becomes), is kept rather than refused.
///
/// # Panics
/// When the store does not.
#[doc = example!(the_longest_ttls_are_kept)]
pub async fn the_longest_ttls_are_kept(store: SharedStore) {
    let year = Duration::from_secs(365 * 24 * 3600);
    let unit = unit("for-ever");
    let token = LockToken::generate();
    acquire(&store, &unit, &token, idempotask::MAX_TTL).await;
    let seen = store.inspect(&unit).await.unwrap();
    assert!(seen.lock_ttl.is_some_and(|left| left > year), "{seen:?}");
    let done = marker(unit.key(), None, "kept");
    assert_eq!(
        store
            .finish(&unit, &token, &done, idempotask::MAX_TTL)
            .await
            .unwrap(),
        Finish::Completed
    );
    let seen = store.inspect(&unit).await.unwrap();
    assert!(seen.marker_ttl.is_none_or(|left| left > year), "{seen:?}");
    assert_eq!(
        store
            .begin(&unit, &LockToken::generate(), LONG, Fencing::Off)
            .await
            .unwrap(),
        Begin::Done(done)
    );
    // Through the runner, with "keep it" as users say it.
    let task = idempotask::Task::new("for-ever").result_ttl(Duration::MAX);
    let runs = std::sync::atomic::AtomicUsize::new(0);
    for _ in 0..3 {
        let value: u32 = task
            .call("k")
            .store(store.clone())
            .run(async {
                runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                Ok::<_, idempotask::Error>(7)
            })
            .await
            .unwrap();
        assert_eq!(value, 7);
    }
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 1);
}
