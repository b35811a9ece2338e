//! Redeliveries, paused holders, and calls that end in an error, a panic or a drop.

use super::*;

// 2. Redelivery after completion.
on_both_servers!(s02_redelivery_after_completion_replays_without_running);
async fn s02_redelivery_after_completion_replays_without_running(server_flavor: Flavor) {
    let server = RedisServer::start_flavor(server_flavor, &[]);
    let store = server.store().await;
    let task = Task::new("s02");
    let runs = AtomicU64::new(0);
    for key in 0..500_u64 {
        let value = task
            .call(format!("k{key}"))
            .store(store.clone())
            .run(async {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Error>(key * 3)
            })
            .await
            .unwrap();
        assert_eq!(value, key * 3);
    }
    let mut replayed = 0;
    for key in 0..500_u64 {
        let report = task
            .call(format!("k{key}"))
            .store(store.clone())
            .run_reported(async {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Error>(0)
            })
            .await
            .unwrap();
        assert_eq!((report.value, report.outcome), (key * 3, Outcome::Replayed));
        replayed += 1;
    }
    assert_eq!(runs.load(Ordering::SeqCst), 500);
    record_on(
        server_flavor,
        "2. redelivery after completion",
        &format!("500 keys redelivered: {replayed} replayed, 0 bodies run again"),
    );
}

// 5. A holder paused past its TTL while another takes over.
on_both_servers!(s05_a_paused_holder_never_harms_its_successor);
async fn s05_a_paused_holder_never_harms_its_successor(server_flavor: Flavor) {
    let server = RedisServer::start_flavor(server_flavor, &[]);
    let store = server.store().await;
    let ttl = Duration::from_millis(300);
    let task = Arc::new(Task::new("s05").lock_ttl(ttl).fencing(true));
    let unit = UnitOfWork::new("s05", "k").unwrap();

    // The stale holder starts, then "pauses" (waits) past its TTL.
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let (resume_tx, resume_rx) = tokio::sync::oneshot::channel::<()>();
    let stale = {
        let (task, store) = (task.clone(), store.clone());
        tokio::spawn(async move {
            task.call("k")
                .store(store)
                .run_reported(async move {
                    started_tx.send(()).unwrap();
                    resume_rx.await.unwrap();
                    Ok::<_, Error>("stale".to_owned())
                })
                .await
        })
    };
    started_rx.await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while store.inspect(&unit).await.unwrap().is_locked() {
        assert!(Instant::now() < deadline, "the stale lock never expired");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let fresh = task
        .call("k")
        .store(store.clone())
        .run_reported(async { Ok::<_, Error>("fresh".to_owned()) })
        .await
        .unwrap();
    assert_eq!(fresh.outcome, Outcome::Executed);

    resume_tx.send(()).unwrap();
    let stale = stale.await.unwrap().unwrap();
    assert!(
        matches!(
            stale.outcome,
            Outcome::LockLost {
                marker_written: false,
                ..
            }
        ),
        "the stale holder must be told: {:?}",
        stale.outcome
    );
    let stale_fence = stale.fencing_token.unwrap();
    assert!(stale_fence < fresh.fencing_token.unwrap());
    let replay = task
        .call("k")
        .store(store.clone())
        .run(async { Ok::<_, Error>("again".to_owned()) })
        .await
        .unwrap();
    assert_eq!(
        replay, "fresh",
        "the stale finish overwrote the successor's result"
    );

    // The error path: a stale holder's release must not delete the successor's lock.
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let (resume_tx, resume_rx) = tokio::sync::oneshot::channel::<()>();
    let stale = {
        let (task, store) = (task.clone(), store.clone());
        tokio::spawn(async move {
            task.call("k2")
                .store(store)
                .run(async move {
                    started_tx.send(()).unwrap();
                    resume_rx.await.unwrap();
                    Err::<u8, _>(Error::NotConfigured)
                })
                .await
        })
    };
    started_rx.await.unwrap();
    tokio::time::sleep(ttl + Duration::from_millis(100)).await;
    let (successor, unit2) = (LockToken::generate(), UnitOfWork::new("s05", "k2").unwrap());
    let taken = store
        .begin(&unit2, &successor, ttl * 100, Fencing::On)
        .await;
    assert!(matches!(taken, Ok(Begin::Acquired { .. })));
    resume_tx.send(()).unwrap();
    assert!(stale.await.unwrap().is_err());
    assert!(
        store.inspect(&unit2).await.unwrap().is_locked(),
        "the stale release deleted the successor's lock"
    );
    let (stale, fresh) = (stale_fence, fresh.fencing_token.unwrap());
    let figures = format!(
        "stale holder told `LockLost`, its finish kept the successor's result, its release kept the successor's lock; fencing token {stale} < {fresh}"
    );
    record_on(
        server_flavor,
        "5. holder paused past its TTL (300 ms)",
        &figures,
    );
}

// 3. Error, panic or a dropped call at every await point.
on_both_servers!(s03_a_dropped_failed_or_panicked_call_leaves_nothing_behind);
#[allow(clippy::too_many_lines)] // one scenario reads best as one story
async fn s03_a_dropped_failed_or_panicked_call_leaves_nothing_behind(server_flavor: Flavor) {
    use gate::{Gate, Stop};
    let server = RedisServer::start_flavor(server_flavor, &[]);
    let store = server.store().await;
    let lock_ttl = Duration::from_millis(500);
    let task = Arc::new(Task::new("s03").lock_ttl(lock_ttl));
    let mut figures = Vec::new();

    // A body that fails at its first step, or panics, or never ends (the call is dropped).
    let points = [
        ("dropped before begin", Some(Stop::Before("begin")), false),
        (
            "dropped after begin applied",
            Some(Stop::After("begin")),
            false,
        ),
        ("dropped in the body", None, false),
        // The body succeeded: the result is still recorded, in the background.
        ("dropped before finish", Some(Stop::Before("finish")), true),
        (
            "dropped after finish applied",
            Some(Stop::After("finish")),
            true,
        ),
        (
            "dropped during release after an error",
            Some(Stop::After("release")),
            false,
        ),
    ];
    for (n, (what, stop, done_expected)) in points.into_iter().enumerate() {
        let key = format!("drop-{n}");
        let unit = UnitOfWork::new("s03", key.as_str()).unwrap();
        let (in_body_tx, in_body_rx) = tokio::sync::oneshot::channel();
        let (gate, reached) = match stop {
            Some(stop) => {
                let (gate, reached) = Gate::new(store.clone(), stop);
                (SharedStore::new(gate), Some(reached))
            }
            None => (SharedStore::new(store.clone()), None),
        };
        let fails = what.contains("error");
        let never_ends = stop.is_none();
        let call = {
            let (task, key) = (task.clone(), key.clone());
            tokio::spawn(async move {
                task.call(key)
                    .store(gate)
                    .run(async move {
                        let _ = in_body_tx.send(());
                        if never_ends {
                            std::future::pending::<()>().await;
                        }
                        if fails {
                            return Err(Error::NotConfigured);
                        }
                        Ok::<_, Error>(1_u8)
                    })
                    .await
            })
        };
        match reached {
            Some(reached) => reached.await.unwrap(),
            None => in_body_rx.await.unwrap(),
        }
        call.abort();
        let _ = call.await;
        // Whatever is left must expire within the lock TTL: never a lock without one.
        let seen = store.inspect(&unit).await.unwrap();
        if let Some(left) = seen.lock_ttl {
            assert!(left <= lock_ttl, "{what}: {left:?}");
        }
        let deadline = Instant::now() + lock_ttl + Duration::from_secs(2);
        if done_expected {
            // A result recorded in the background after the drop lands within the lock TTL.
            while !store.inspect(&unit).await.unwrap().is_done() {
                assert!(
                    Instant::now() < deadline,
                    "{what}: the result was never stored"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        } else {
            assert!(!seen.is_done(), "{what}: {seen:?}");
        }
        while store.inspect(&unit).await.unwrap().is_locked() {
            assert!(
                Instant::now() < deadline,
                "{what}: the lock outlived its TTL"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let next = task
            .call(key.as_str())
            .store(store.clone())
            .run_reported(async { Ok::<_, Error>(2_u8) })
            .await
            .unwrap();
        let expected = if done_expected {
            Outcome::Replayed
        } else {
            Outcome::Executed
        };
        assert_eq!(next.outcome, expected, "{what}");
        figures.push(format!(
            "{what}: next delivery {}",
            if done_expected { "replays" } else { "runs" }
        ));
    }

    // Errors and panics release at once.
    let failed: Result<u8, Error> = task
        .call("error")
        .store(store.clone())
        .run(async { Err(Error::NotConfigured) })
        .await;
    assert!(failed.is_err());
    let panicked = {
        let (task, store) = (task.clone(), store.clone());
        tokio::spawn(async move {
            task.call("panic")
                .store(store)
                .run(async {
                    assert!(std::hint::black_box(false), "the body panicked");
                    Ok::<u8, Error>(1)
                })
                .await
        })
        .await
    };
    assert!(panicked.unwrap_err().is_panic());
    for key in ["error", "panic"] {
        let seen = store
            .inspect(&UnitOfWork::new("s03", key).unwrap())
            .await
            .unwrap();
        assert!(!seen.is_locked() && !seen.is_done(), "{key}: {seen:?}");
    }
    record_on(
        server_flavor,
        "3. error, panic, dropped call at every await point",
        &format!(
            "{}; error and panic: lock released at once, nothing cached",
            figures.join("; ")
        ),
    );
}
