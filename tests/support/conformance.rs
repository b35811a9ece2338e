//! The conformance suite: what every `Store`, and the task runner on top of it, must do.
//!
//! Each check takes a fresh, empty store. `conformance_tests!` turns the list into one
//! `#[tokio::test]` per check for a given store constructor.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idempotask::store::Fencing;
use idempotask::{
    Begin, Error, Fingerprint, Finish, LockToken, Outcome, RetryPolicy, Store, Task, UnitOfWork,
};

const LONG: Duration = Duration::from_secs(30);
const DAY: Duration = Duration::from_secs(24 * 3600);

fn unit(key: &str) -> UnitOfWork {
    UnitOfWork::new("conformance", key).unwrap()
}

fn marker(key: &str, fence: Option<u64>, text: &str) -> Vec<u8> {
    // Stores see a marker as bytes that start with `D`; the real layout keeps the data
    // realistic.
    let fence = fence.map_or_else(String::new, |fence| format!(",f{fence}"));
    format!(r#"D{}{fence}|{key}|"{text}""#, key.len()).into_bytes()
}

/// Takes the lock without fencing, as most tasks do.
async fn acquire(store: &dyn Store, unit: &UnitOfWork, token: &LockToken, ttl: Duration) {
    match store.begin(unit, token, ttl, Fencing::Off).await.unwrap() {
        Begin::Acquired {
            fencing_token: None,
        } => {}
        other => panic!("expected the lock without a fencing token, got {other:?}"),
    }
}

/// Takes the lock with a fencing token; answers the holder's token as `finish`, `release` and
/// `renew` take it.
async fn acquire_fenced(
    store: &dyn Store,
    unit: &UnitOfWork,
    token: &LockToken,
    ttl: Duration,
) -> LockToken {
    match store.begin(unit, token, ttl, Fencing::On).await.unwrap() {
        Begin::Acquired {
            fencing_token: Some(fence),
        } => token.clone().with_fencing_token(fence),
        other => panic!("expected the lock with a fencing token, got {other:?}"),
    }
}

fn fence(granted: &LockToken) -> u64 {
    granted.fencing_token().unwrap()
}

/// Waits out a lock TTL: expiry is the behaviour under test, so there is no signal to wait for.
async fn outlive(ttl: Duration) {
    tokio::time::sleep(ttl + Duration::from_millis(60)).await;
}

pub async fn begin_grants_one_holder_and_reports_busy(store: Arc<dyn Store>) {
    let unit = unit("order-1");
    let (a, b) = (LockToken::generate(), LockToken::generate());
    acquire(&*store, &unit, &a, LONG).await;
    match store.begin(&unit, &b, LONG, Fencing::Off).await.unwrap() {
        Begin::Busy {
            lock_ttl_remaining: Some(left),
        } => assert!(
            left <= LONG && left > LONG.saturating_sub(Duration::from_secs(5)),
            "{left:?}"
        ),
        other => panic!("expected busy, got {other:?}"),
    }
}

pub async fn begin_repeated_by_the_holder_is_acquired_again(store: Arc<dyn Store>) {
    let unit = unit("order-2");
    let token = LockToken::generate();
    acquire(&*store, &unit, &token, LONG).await;
    acquire(&*store, &unit, &token, LONG).await;

    let fenced = UnitOfWork::new("conformance", "order-2-fenced").unwrap();
    let first = acquire_fenced(&*store, &fenced, &token, LONG).await;
    let again = acquire_fenced(&*store, &fenced, &token, LONG).await;
    assert_eq!(
        first, again,
        "a retried begin must not take a second fencing token"
    );
}

pub async fn finish_stores_the_marker_and_frees_the_lock(store: Arc<dyn Store>) {
    let unit = unit("order-3");
    let token = LockToken::generate();
    acquire(&*store, &unit, &token, LONG).await;
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

pub async fn a_stale_holder_never_touches_its_successor(store: Arc<dyn Store>) {
    let unit = unit("order-4");
    let short = Duration::from_millis(150);
    let (stale, fresh) = (LockToken::generate(), LockToken::generate());
    let stale = acquire_fenced(&*store, &unit, &stale, short).await;
    outlive(short).await;
    let fresh = acquire_fenced(&*store, &unit, &fresh, LONG).await;
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
        Finish::LockLost {
            marker_written: false
        }
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
        Finish::LockLost {
            marker_written: false
        }
    );
    assert_eq!(
        store.inspect(&unit).await.unwrap().marker,
        Some(fresh_marker)
    );
}

pub async fn a_late_finish_keeps_the_result_when_nobody_holds_the_unit(store: Arc<dyn Store>) {
    let short = Duration::from_millis(150);
    for fencing in [false, true] {
        let unit = unit(&format!("order-late-{fencing}"));
        let token = LockToken::generate();
        let holder = if fencing {
            acquire_fenced(&*store, &unit, &token, short).await
        } else {
            acquire(&*store, &unit, &token, short).await;
            token
        };
        outlive(short).await;
        let bytes = marker(unit.key(), holder.fencing_token(), "late");
        assert_eq!(
            store.finish(&unit, &holder, &bytes, DAY).await.unwrap(),
            Finish::LockLost {
                marker_written: true
            }
        );
        // Its reply lost, the same finish is repeated: it finds its own marker.
        assert_eq!(
            store.finish(&unit, &holder, &bytes, DAY).await.unwrap(),
            Finish::Completed
        );
        assert_eq!(store.inspect(&unit).await.unwrap().marker, Some(bytes));
    }
}

pub async fn only_the_holder_releases_or_renews(store: Arc<dyn Store>) {
    let unit = unit("order-5");
    let (holder, other) = (LockToken::generate(), LockToken::generate());
    acquire(&*store, &unit, &holder, Duration::from_secs(2)).await;
    // The right token with a fencing token the grant did not have is someone else's lock.
    let forged = holder.clone().with_fencing_token(u64::MAX);
    assert!(!store.release(&unit, &forged).await.unwrap());
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
    acquire(&*store, &unit, &other, LONG).await;
}

pub async fn fencing_tokens_increase_across_grants_and_expiry(store: Arc<dyn Store>) {
    let unit = unit("order-6");
    let short = Duration::from_millis(100);
    let mut last = 0;
    for round in 0..6 {
        let token = acquire_fenced(&*store, &unit, &LockToken::generate(), short).await;
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
    let token = acquire_fenced(&*store, &unit, &LockToken::generate(), LONG).await;
    assert!(store.release(&unit, &token).await.unwrap());
    match store
        .begin(&unit, &LockToken::generate(), LONG, Fencing::Off)
        .await
        .unwrap()
    {
        Begin::Acquired {
            fencing_token: Some(next),
        } => assert!(next > fence(&token), "{next} after {token:?}"),
        other => panic!("expected the lock with the counter going on, got {other:?}"),
    }
}

pub async fn forget_deletes_the_marker_on_purpose(store: Arc<dyn Store>) {
    let unit = unit("order-7");
    let token = acquire_fenced(&*store, &unit, &LockToken::generate(), LONG).await;
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
    let next = acquire_fenced(&*store, &unit, &LockToken::generate(), LONG).await;
    assert!(fence(&next) > fence(&token));
    // A lock is not a marker: forget leaves it alone.
    assert!(!store.forget(&unit).await.unwrap());
    assert!(store.inspect(&unit).await.unwrap().is_locked());
}

pub async fn markers_expire_after_the_result_ttl(store: Arc<dyn Store>) {
    let unit = unit("order-8");
    let token = LockToken::generate();
    acquire(&*store, &unit, &token, LONG).await;
    let ttl = Duration::from_millis(150);
    store
        .finish(&unit, &token, &marker(unit.key(), None, "x"), ttl)
        .await
        .unwrap();
    outlive(ttl).await;
    assert_eq!(
        store.inspect(&unit).await.unwrap(),
        idempotask::Inspection::default()
    );
    acquire(&*store, &unit, &LockToken::generate(), LONG).await;
}

pub async fn look_alike_keys_are_separate_units(store: Arc<dyn Store>) {
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
        acquire(&*store, unit, token, LONG).await;
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

// ---- the task runner on top of the store ----

fn task(name: &'static str) -> Task {
    Task::new(name)
}

pub async fn a_duplicate_gets_the_stored_result_without_running(store: Arc<dyn Store>) {
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
        .store_shared(store.clone())
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
            .store_shared(store.clone())
            .run_reported(charge(9999))
            .await
            .unwrap();
        assert_eq!(again.value, "ch_1200");
        assert_eq!(again.outcome, Outcome::Replayed);
        assert_eq!(again.fencing_token, first.fencing_token);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

pub async fn errors_are_not_cached_and_free_the_lock(store: Arc<dyn Store>) {
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
    let failed = task
        .call("k")
        .store_shared(store.clone())
        .run(attempt())
        .await;
    assert!(matches!(failed, Err(Error::NotConfigured)));
    let seen = store
        .inspect(&UnitOfWork::new("flaky", "k").unwrap())
        .await
        .unwrap();
    assert!(!seen.is_done() && !seen.is_locked(), "{seen:?}");
    let retried = task
        .call("k")
        .store_shared(store.clone())
        .run(attempt())
        .await;
    assert_eq!(retried.unwrap(), 7);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

pub async fn a_panic_frees_the_lock_and_resumes(store: Arc<dyn Store>) {
    let handle = {
        let store = store.clone();
        tokio::spawn(async move {
            Task::new("panicky")
                .call("k")
                .store_shared(store)
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

pub async fn a_dropped_call_frees_the_lock(store: Arc<dyn Store>) {
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let call = {
        let store = store.clone();
        tokio::spawn(async move {
            Task::new("dropped")
                .call("k")
                .store_shared(store)
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

pub async fn concurrent_deliveries_run_the_body_once(store: Arc<dyn Store>) {
    let runs = Arc::new(AtomicUsize::new(0));
    let barrier = Arc::new(tokio::sync::Barrier::new(64));
    let calls = (0..64).map(|delivery| {
        let (store, runs, barrier) = (store.clone(), runs.clone(), barrier.clone());
        tokio::spawn(async move {
            static SEND: Task = Task::new("send_mail");
            barrier.wait().await;
            SEND.call("order-10")
                .store_shared(store)
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

pub async fn a_waiter_gives_up_with_contended(store: Arc<dyn Store>) {
    let unit = UnitOfWork::new("busy", "k").unwrap();
    let holder = LockToken::generate();
    acquire(&*store, &unit, &holder, LONG).await;
    let ran = AtomicUsize::new(0);
    let result = Task::new("busy")
        .retry(
            RetryPolicy::new()
                .max_attempts(3)
                .initial_backoff(Duration::from_millis(1)),
        )
        .call("k")
        .store_shared(store.clone())
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

pub async fn a_reused_key_with_other_arguments_is_rejected(store: Arc<dyn Store>) {
    let task = task("refund");
    let refund = |amount: u64| {
        let store = store.clone();
        let task = &task;
        async move {
            task.call("refund-1")
                .store_shared(store)
                .fingerprint(Fingerprint::of(&(amount,)).unwrap())
                .run(async move { Ok::<_, Error>(amount) })
                .await
        }
    };
    assert_eq!(refund(500).await.unwrap(), 500);
    assert_eq!(refund(500).await.unwrap(), 500);
    assert!(matches!(refund(700).await, Err(Error::KeyReuse { .. })));
}

pub async fn undecodable_and_unstorable_results_are_typed_errors(store: Arc<dyn Store>) {
    let first: Result<u32, Error> = Task::new("typed")
        .call("k")
        .store_shared(store.clone())
        .run(async { Ok(5) })
        .await;
    assert_eq!(first.unwrap(), 5);
    let changed: Result<String, Error> = Task::new("typed")
        .call("k")
        .store_shared(store.clone())
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
    let first = task
        .call("k")
        .store_shared(store.clone())
        .run(unstorable())
        .await;
    assert_eq!(first.unwrap().len(), 1);
    let again = task
        .call("k")
        .store_shared(store.clone())
        .run(unstorable())
        .await;
    assert!(
        matches!(&again, Err(Error::Codec { reason, .. }) if reason.contains("could not be stored")),
        "{again:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

pub async fn the_body_sees_its_context(store: Arc<dyn Store>) {
    assert!(idempotask::context().is_none());
    let report = Task::new("ctx")
        .fencing(true)
        .call("order:{11}")
        .store_shared(store.clone())
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
        .store_shared(store)
        .run(async { Ok::<_, Error>(idempotask::context().unwrap().fencing_token()) })
        .await
        .unwrap();
    assert_eq!(plain, None, "a task without fencing gets no made-up token");
}

pub async fn a_marker_of_another_key_is_never_replayed(store: Arc<dyn Store>) {
    // What a digest collision, or a foreign write, leaves under a unit's key name.
    let unit = unit("order-12");
    let token = LockToken::generate();
    acquire(&*store, &unit, &token, LONG).await;
    let foreign = marker("order-999", None, "someone else's charge");
    assert_eq!(
        store.finish(&unit, &token, &foreign, DAY).await.unwrap(),
        Finish::Completed
    );
    let ran = AtomicUsize::new(0);
    let result: Result<String, Error> = Task::new("conformance")
        .call("order-12")
        .store_shared(store.clone())
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
    let status = Task::new("conformance").status("order-12", &*store).await;
    assert!(
        matches!(status, Err(Error::MarkerKeyMismatch { .. })),
        "{status:?}"
    );
}

pub async fn renewal_keeps_a_short_lock_through_a_long_body(store: Arc<dyn Store>) {
    let ttl = Duration::from_millis(300);
    let (halfway_tx, halfway_rx) = tokio::sync::oneshot::channel();
    let (resume_tx, resume_rx) = tokio::sync::oneshot::channel::<()>();
    let holder = {
        let store = store.clone();
        tokio::spawn(async move {
            Task::new("renewed")
                .lock_ttl(ttl)
                .renew(true)
                .call("k")
                .store_shared(store)
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
        .call("k")
        .store_shared(store.clone())
        .run(async { Ok::<bool, Error>(false) })
        .await;
    assert!(
        matches!(intruder, Err(Error::Contended { .. })),
        "{intruder:?}"
    );
    resume_tx.send(()).unwrap();
    let report = holder.await.unwrap().unwrap();
    assert!(report.value, "the body saw its lock as lost");
    assert_eq!(report.outcome, Outcome::Executed);
}

pub async fn an_expired_lock_is_reported_as_lost(store: Arc<dyn Store>) {
    let ttl = Duration::from_millis(150);
    let report = Task::new("overran")
        .lock_ttl(ttl)
        .call("k")
        .store_shared(store.clone())
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
    assert_eq!(
        report.outcome,
        Outcome::LockLost {
            marker_written: true
        }
    );
}

pub async fn invalid_keys_are_rejected_before_the_store(store: Arc<dyn Store>) {
    let empty: Result<u8, Error> = Task::new("t")
        .call("")
        .store_shared(store.clone())
        .run(async { Ok(1) })
        .await;
    assert!(matches!(
        empty,
        Err(Error::InvalidKey(idempotask::InvalidKey::EmptyKey { .. }))
    ));
    let long: Result<u8, Error> = Task::new("t")
        .call("x".repeat(1025))
        .store_shared(store.clone())
        .run(async { Ok(1) })
        .await;
    assert!(matches!(
        long,
        Err(Error::InvalidKey(idempotask::InvalidKey::KeyTooLong { .. }))
    ));
    let bad_name: Result<u8, Error> = Task::new("a:b")
        .call("k")
        .store_shared(store)
        .run(async { Ok(1) })
        .await;
    assert!(matches!(
        bad_name,
        Err(Error::InvalidKey(idempotask::InvalidKey::TaskName { .. }))
    ));
}

/// One `#[tokio::test]` per check, each with a fresh store from `$make`: an async expression
/// giving `(guard, Arc<dyn Store>)`, where the guard (a server, say) lives as long as the check.
#[macro_export]
macro_rules! conformance_tests {
    ($make:expr) => {
        $crate::conformance_tests!(@each $make;
            begin_grants_one_holder_and_reports_busy,
            begin_repeated_by_the_holder_is_acquired_again,
            finish_stores_the_marker_and_frees_the_lock,
            a_stale_holder_never_touches_its_successor,
            a_late_finish_keeps_the_result_when_nobody_holds_the_unit,
            only_the_holder_releases_or_renews,
            fencing_tokens_increase_across_grants_and_expiry,
            forget_deletes_the_marker_on_purpose,
            markers_expire_after_the_result_ttl,
            look_alike_keys_are_separate_units,
            a_duplicate_gets_the_stored_result_without_running,
            errors_are_not_cached_and_free_the_lock,
            a_panic_frees_the_lock_and_resumes,
            a_dropped_call_frees_the_lock,
            concurrent_deliveries_run_the_body_once,
            a_waiter_gives_up_with_contended,
            a_reused_key_with_other_arguments_is_rejected,
            undecodable_and_unstorable_results_are_typed_errors,
            the_body_sees_its_context,
            a_marker_of_another_key_is_never_replayed,
            renewal_keeps_a_short_lock_through_a_long_body,
            an_expired_lock_is_reported_as_lost,
            invalid_keys_are_rejected_before_the_store,
        );
    };
    (@each $make:expr; $($check:ident,)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $check() {
            let (_guard, store) = $make;
            $crate::support::conformance::$check(store).await;
        }
    )*};
}
