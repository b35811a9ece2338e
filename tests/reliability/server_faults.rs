//! A server that loses its scripts or its clients, or runs out of memory.

use super::*;

// 9. SCRIPT FLUSH and CLIENT KILL under load.
on_both_servers!(s09_script_flush_and_client_kill_under_load_cost_only_typed_retries);
async fn s09_script_flush_and_client_kill_under_load_cost_only_typed_retries(
    server_flavor: Flavor,
) {
    let server = RedisServer::start_flavor(server_flavor, &[]);
    let store = store_with_timeout(&server.url(), Duration::from_millis(500)).await;
    let injected = Arc::new(AtomicU32::new(0));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let chaos = {
        let (url, stop, injected) = (server.url(), stop.clone(), injected.clone());
        tokio::spawn(async move {
            let client = redis::Client::open(url).unwrap();
            while !stop.load(Ordering::SeqCst) {
                // A fresh connection each time: CLIENT KILL may take ours too.
                if let Ok(mut conn) = client.get_multiplexed_async_connection().await {
                    let what = if injected.load(Ordering::SeqCst).is_multiple_of(2) {
                        redis::cmd("SCRIPT").arg("FLUSH").clone()
                    } else {
                        redis::cmd("CLIENT")
                            .arg(&["KILL", "TYPE", "normal", "SKIPME", "yes"][..])
                            .clone()
                    };
                    let _: Result<redis::Value, _> = what.query_async(&mut conn).await;
                    injected.fetch_add(1, Ordering::SeqCst);
                }
                // A kill every 300 ms: frequent enough to hit every kind of in-flight call, rare
                // enough that a reconnected client gets work done in between.
                tokio::time::sleep(Duration::from_millis(150)).await;
            }
        })
    };
    let task = Arc::new(Task::new("s09").lock_ttl(Duration::from_secs(5)));
    let keys = 400_u64;
    let executions: Arc<Vec<AtomicU32>> =
        Arc::new((0..keys * 64).map(|_| AtomicU32::new(0)).collect());
    let mut typed_errors = 0;
    let mut outcomes: std::collections::BTreeMap<String, u32> = std::collections::BTreeMap::new();
    // Waves of fresh keys, four deliveries each, until enough faults have hit them.
    let mut waves = 0;
    while waves < 2 || (injected.load(Ordering::SeqCst) < 10 && waves < 64) {
        let mut deliveries = Vec::new();
        for _ in 0..4 {
            for key in waves * keys..(waves + 1) * keys {
                let (task, store, executions) = (task.clone(), store.clone(), executions.clone());
                deliveries.push(tokio::spawn(async move {
                    let (report, errors) = support::deliver_until_done(RETRY_PAUSE, || {
                        let executions = executions.clone();
                        task.call(format!("k{key}"))
                            .store(store.clone())
                            .run_reported(async move {
                                executions[usize::try_from(key).unwrap()]
                                    .fetch_add(1, Ordering::SeqCst);
                                tokio::time::sleep(Duration::from_millis(5)).await;
                                Ok::<_, Error>(key)
                            })
                    })
                    .await;
                    (errors, report.outcome)
                }));
            }
        }
        for delivery in deliveries {
            let (errors, outcome) = delivery.await.unwrap();
            typed_errors += errors;
            *outcomes.entry(format!("{outcome:?}")).or_insert(0) += 1;
        }
        waves += 1;
    }
    stop.store(true, Ordering::SeqCst);
    chaos.await.unwrap();
    let injected = injected.load(Ordering::SeqCst);
    let used = usize::try_from(waves * keys).unwrap();
    let duplicates: u32 = executions[..used]
        .iter()
        .map(|n| n.load(Ordering::SeqCst).saturating_sub(1))
        .sum();
    let missing = executions[..used]
        .iter()
        .filter(|n| n.load(Ordering::SeqCst) == 0)
        .count();
    assert_eq!(missing, 0);
    // A body may only run twice when the runner said so: its result could not be recorded
    // within the lock TTL (`MarkerNotWritten`) or it outlived its lock (`LockLost`).
    let reported: u32 = outcomes
        .iter()
        .filter(|(outcome, _)| {
            outcome.starts_with("MarkerNotWritten") || outcome.starts_with("LockLost")
        })
        .map(|(_, n)| *n)
        .sum();
    assert!(
        duplicates <= reported,
        "{duplicates} silent duplicates: {outcomes:?}"
    );
    assert!(
        injected >= 10 || waves == 64,
        "the faults were not injected"
    );
    record_on(
        server_flavor,
        "9. SCRIPT FLUSH and CLIENT KILL under load",
        &format!(
            "{} deliveries of {} keys, {injected} faults injected (one every 150 ms): {typed_errors} typed retryable errors, 0 other failures, {duplicates} duplicates, each one reported by its runner; outcomes {outcomes:?}",
            used * 4,
            used
        ),
    );
}

// 10. Eviction: markers lost under volatile-lru; writes refused under noeviction.
on_both_servers!(s10_eviction_loses_markers_or_fails_closed);
async fn s10_eviction_loses_markers_or_fails_closed(server_flavor: Flavor) {
    let server = RedisServer::start_flavor(
        server_flavor,
        &["--maxmemory", "3mb", "--maxmemory-policy", "volatile-lru"],
    );
    let store = server.store().await;
    let task = Task::new("s10");
    let payload = "x".repeat(1024);
    let keys = 6_000;
    for key in 0..keys {
        let _: String = task
            .call(format!("k{key}"))
            .store(store.clone())
            .run(async { Ok::<_, Error>(payload.clone()) })
            .await
            .unwrap();
    }
    let mut conn = server.connection().await;
    let kept = scan_keys(&mut conn, "idempotask:*:done").await.len();
    let lost = keys - kept;
    let info: String = redis::cmd("INFO")
        .arg("stats")
        .query_async(&mut conn)
        .await
        .unwrap();
    let evicted: u64 = info
        .lines()
        .find_map(|l| l.strip_prefix("evicted_keys:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap();
    assert!(evicted > 0 && lost > 0, "the eviction was not triggered");

    let server = RedisServer::start_flavor(
        server_flavor,
        &["--maxmemory", "3mb", "--maxmemory-policy", "noeviction"],
    );
    let store = server.store().await;
    let done: u64 = task
        .call("done-before")
        .store(store.clone())
        .run(async { Ok::<_, Error>(7) })
        .await
        .unwrap();
    let mut conn = server.connection().await;
    let mut filler = 0;
    loop {
        let set: Result<(), redis::RedisError> = redis::cmd("SET")
            .arg(format!("filler:{filler}"))
            .arg(&payload)
            .query_async(&mut conn)
            .await;
        match set {
            Ok(()) => filler += 1,
            Err(err) if err.code() == Some("OOM") => break,
            // A slow reply on a loaded machine is no proof that memory is full.
            Err(_) => {}
        }
    }
    // Memory hovers around the limit as buffers come and go; pin it above, so that the lock
    // request below surely meets a full Redis.
    let _: () = redis::cmd("CONFIG")
        .arg(&["SET", "maxmemory", "1mb"][..])
        .query_async(&mut conn)
        .await
        .unwrap();
    let ran = AtomicU64::new(0);
    let refused = task
        .call("after-full")
        .store(store.clone())
        .run(async {
            ran.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Error>(1_u64)
        })
        .await;
    match &refused {
        Err(Error::Store(err)) => assert_eq!(err.kind(), StoreErrorKind::Rejected, "{err}"),
        other => panic!("expected a refused write, got {other:?}"),
    }
    assert_eq!(
        ran.load(Ordering::SeqCst),
        0,
        "the body ran although the lock was refused"
    );
    let replayed: u64 = task
        .call("done-before")
        .store(store)
        .run(async { Ok::<_, Error>(0) })
        .await
        .unwrap();
    assert_eq!(
        replayed, done,
        "reads must keep working when memory is full"
    );
    record_on(
        server_flavor,
        "10. eviction (maxmemory 3 MB)",
        &format!(
            "volatile-lru: {lost} of {keys} markers lost ({evicted} keys evicted); noeviction: lock refused with a typed `Rejected` error, body not run, stored results still replayed"
        ),
    );
}
