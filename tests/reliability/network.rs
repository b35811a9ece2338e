//! Replies lost on the way, a server too slow to answer, and one that is gone.

use super::*;

use idempotask_redis::RedisClusterStore;

// 6. A reply lost after Redis applied the command.
on_both_servers!(s06_a_lost_reply_on_begin_or_finish_runs_nothing_twice);
async fn s06_a_lost_reply_on_begin_or_finish_runs_nothing_twice(server_flavor: Flavor) {
    let server = RedisServer::start_flavor(server_flavor, &[]);
    let proxy = Proxy::start(server.addr()).await;
    let store = store_with_timeout(&proxy.url(), Duration::from_millis(500)).await;
    let executions = AtomicU64::new(0);

    proxy.swallow_next_reply();
    let begin_lost = Task::new("s06_begin")
        .call("k")
        .store(store.clone())
        .run_reported(async {
            executions.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Error>(1)
        })
        .await
        .unwrap();
    assert_eq!(proxy.swallowed(), 1, "the begin reply was not lost");
    assert_eq!(begin_lost.outcome, Outcome::Executed);

    let finish_lost = Task::new("s06_finish")
        .call("k")
        .store(store.clone())
        .run_reported(async {
            executions.fetch_add(1, Ordering::SeqCst);
            // The next reply is the one to `finish`.
            proxy.swallow_next_reply();
            Ok::<_, Error>(2)
        })
        .await
        .unwrap();
    assert_eq!(proxy.swallowed(), 2, "the finish reply was not lost");
    assert_eq!(finish_lost.outcome, Outcome::Executed);
    assert_eq!(executions.load(Ordering::SeqCst), 2);

    for (task, expected) in [("s06_begin", 1), ("s06_finish", 2)] {
        let unit = UnitOfWork::new(task, "k").unwrap();
        let seen = store.inspect(&unit).await.unwrap();
        assert!(seen.is_done() && !seen.is_locked(), "{task}: {seen:?}");
        let replay = Task::new(task)
            .call("k")
            .store(store.clone())
            .run(async {
                executions.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Error>(0)
            })
            .await
            .unwrap();
        assert_eq!(replay, expected);
    }
    assert_eq!(executions.load(Ordering::SeqCst), 2);
    record_on(
        server_flavor,
        "6. reply lost on begin and on finish",
        "2 replies swallowed after Redis applied the command; 0 extra executions; both units done, no lock left",
    );
}

// 6b. A reply lost after Redis applied a `forget`, which the cluster client re-sends.
on_both_servers!(s06b_a_forget_whose_reply_was_lost_still_reports_the_delete);
async fn s06b_a_forget_whose_reply_was_lost_still_reports_the_delete(server_flavor: Flavor) {
    // A one-node cluster that gives the proxy's port as its address: the cluster client sends
    // every command through the proxy, and re-sends one whose connection dropped before its
    // reply came, as it does on a real cluster.
    let server = RedisServer::start_flavor(server_flavor, &["--cluster-enabled", "yes"]);
    let proxy = Proxy::start(server.addr()).await;
    tokio::task::block_in_place(|| {
        support::cluster::serve_every_slot(server.port(), proxy.port());
    });
    let cluster = RedisClusterStore::builder([proxy.url()])
        .response_timeout(Duration::from_millis(500))
        .connect()
        .await
        .unwrap();
    for (key, fencing) in [("plain", false), ("fenced", true)] {
        let task = Task::new("s06b").fencing(fencing);
        task.call(key)
            .store(cluster.clone())
            .run(async { Ok::<_, Error>(1) })
            .await
            .unwrap();
        let unit = UnitOfWork::new("s06b", key).unwrap();
        let swallowed = proxy.swallowed();
        proxy.swallow_next_reply();
        let forgot = cluster.forget(&unit).await;
        assert_eq!(proxy.swallowed(), swallowed + 1, "{key}: no reply was lost");
        // The first run deleted the marker; the re-send must not say that nothing was there.
        assert!(matches!(forgot, Ok(true)), "{key}: {forgot:?}");
        assert!(!cluster.inspect(&unit).await.unwrap().is_done(), "{key}");
        let rerun = task
            .call(key)
            .store(cluster.clone())
            .run_reported(async { Ok::<_, Error>(2) })
            .await
            .unwrap();
        assert_eq!(
            (rerun.value, rerun.outcome),
            (2, Outcome::Executed),
            "{key}"
        );
    }

    // `RedisStore`'s connection manager re-sends nothing: the lost reply is an ambiguous error.
    let store = store_with_timeout(&proxy.url(), Duration::from_millis(500)).await;
    let unit = UnitOfWork::new("s06b", "plain").unwrap();
    let swallowed = proxy.swallowed();
    proxy.swallow_next_reply();
    let err = store.forget(&unit).await.unwrap_err();
    assert_eq!(proxy.swallowed(), swallowed + 1, "no reply was lost");
    assert!(err.is_ambiguous(), "{err}");
    assert!(!store.inspect(&unit).await.unwrap().is_done());
    record_on(
        server_flavor,
        "6b. reply lost on forget",
        "Cluster client (re-sends): forget of a plain and of a fenced marker reported as deleted, and the next delivery ran; RedisStore (no re-send): an ambiguous error, the marker gone",
    );
}

// 6c. A finish sent after its lock lapsed (no renewal, nobody took the unit over), whose reply
// is lost after it applied: the cluster client re-sends it and finds its own marker,
// `RedisStore` hears an ambiguous error. Either way the lock was gone before the finish, and
// the outcome must say so: the result is stored, but a duplicate could have run beside the body.
on_both_servers!(s06c_a_finish_after_the_lock_lapsed_is_reported_lost_when_its_reply_is_lost);
async fn s06c_a_finish_after_the_lock_lapsed_is_reported_lost_when_its_reply_is_lost(
    server_flavor: Flavor,
) {
    let server = RedisServer::start_flavor(server_flavor, &["--cluster-enabled", "yes"]);
    let proxy = Proxy::start(server.addr()).await;
    tokio::task::block_in_place(|| {
        support::cluster::serve_every_slot(server.port(), proxy.port());
    });
    let timeout = Duration::from_millis(500);
    let cluster = RedisClusterStore::builder([proxy.url()])
        .response_timeout(timeout)
        .connect()
        .await
        .unwrap();
    // A plain client of the same node: the node serves every slot, so it answers it too.
    let single = store_with_timeout(&proxy.url(), timeout).await;
    let stores = [
        ("cluster", SharedStore::new(cluster)),
        ("single", SharedStore::new(single)),
    ];
    let lock_ttl = Duration::from_millis(300);
    let task = Task::new("s06c").lock_ttl(lock_ttl).renew(false);
    let executions = AtomicU64::new(0);
    for (key, store) in &stores {
        let swallowed = proxy.swallowed();
        let report = task
            .call(*key)
            .store(store.clone())
            .run_reported(async {
                executions.fetch_add(1, Ordering::SeqCst);
                // The body outlives its lock; nobody takes the unit meanwhile.
                tokio::time::sleep(lock_ttl + Duration::from_millis(400)).await;
                // The next reply is the one to `finish`.
                proxy.swallow_next_reply();
                Ok::<_, Error>(7)
            })
            .await
            .unwrap();
        assert_eq!(proxy.swallowed(), swallowed + 1, "{key}: no reply was lost");
        assert!(
            matches!(
                report.outcome,
                Outcome::LockLost {
                    marker_written: true,
                    ..
                }
            ),
            "{key}: the lock lapsed before the finish, yet the call reported {:?}",
            report.outcome
        );
        let unit = UnitOfWork::new("s06c", *key).unwrap();
        assert!(store.inspect(&unit).await.unwrap().is_done(), "{key}");
        let replay = task
            .call(*key)
            .store(store.clone())
            .run_reported(async {
                executions.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Error>(0)
            })
            .await
            .unwrap();
        assert_eq!(
            (replay.value, replay.outcome),
            (7, Outcome::Replayed),
            "{key}"
        );
    }
    assert_eq!(executions.load(Ordering::SeqCst), 2);
    record_on(
        server_flavor,
        "6c. reply lost on a finish sent after the lock lapsed",
        "Cluster client (re-sends) and RedisStore (does not): both report LockLost with the marker written; the next delivery replays",
    );
}

// 7. Redis slow or paused, shorter and longer than the response timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::too_many_lines)] // one scenario reads best as one story
async fn s07_a_slow_redis_never_hangs_a_call_or_runs_an_unlocked_body() {
    let server = RedisServer::start_with(&["--enable-debug-command", "local"]);
    let timeout = Duration::from_millis(400);
    let store = store_with_timeout(&server.url(), timeout).await;
    let executions = Arc::new(AtomicU64::new(0));
    let call = |key: &'static str| {
        let (store, executions) = (store.clone(), executions.clone());
        async move {
            let started = Instant::now();
            let result = tokio::time::timeout(
                Duration::from_secs(10),
                Task::new("s07").call(key).store(store).run(async move {
                    executions.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, Error>(1_u8)
                }),
            )
            .await
            .expect("a call hung past every deadline");
            (result, started.elapsed())
        }
    };
    let mut figures = Vec::new();

    for (fault, args, key) in [
        (
            "CLIENT PAUSE 150 ms",
            vec!["CLIENT", "PAUSE", "150", "ALL"],
            "short-pause",
        ),
        (
            "DEBUG SLEEP 0.15 s",
            vec!["DEBUG", "SLEEP", "0.15"],
            "short-sleep",
        ),
    ] {
        let injector = {
            let mut conn = server.connection().await;
            tokio::spawn(async move {
                let mut cmd = redis::cmd(args[0]);
                for arg in &args[1..] {
                    cmd.arg(*arg);
                }
                let _: redis::Value = cmd.query_async(&mut conn).await.unwrap();
            })
        };
        let (result, took) = call(key).await;
        injector.await.unwrap();
        assert_eq!(result.unwrap(), 1, "{fault}");
        figures.push(format!("{fault}: ok in {} ms", took.as_millis()));
    }
    let before = executions.load(Ordering::SeqCst);
    for (fault, args, key) in [
        (
            "CLIENT PAUSE 2 s",
            vec!["CLIENT", "PAUSE", "2000", "ALL"],
            "long-pause",
        ),
        ("DEBUG SLEEP 2 s", vec!["DEBUG", "SLEEP", "2"], "long-sleep"),
    ] {
        let injector = {
            let mut conn = server.connection().await;
            tokio::spawn(async move {
                let mut cmd = redis::cmd(args[0]);
                for arg in &args[1..] {
                    cmd.arg(*arg);
                }
                // This connection's own reply may time out: only the fault matters.
                let _: Result<redis::Value, _> = cmd.query_async(&mut conn).await;
            })
        };
        // Let the fault take hold before the call.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let (result, took) = call(key).await;
        match result {
            Err(Error::Store(err)) => {
                assert_eq!(err.kind(), StoreErrorKind::Timeout, "{fault}: {err}");
                assert!(err.is_ambiguous());
            }
            other => panic!("{fault}: expected a timeout, got {other:?}"),
        }
        figures.push(format!(
            "{fault}: typed timeout after {} ms",
            took.as_millis()
        ));
        injector.await.unwrap();
        // The begins queued behind the fault run once it ends; the runner's background release
        // runs after them, so no lock may survive. (`CLIENT PAUSE` answers at once and pauses
        // on: until it ends, inspecting times out too.)
        let unit = UnitOfWork::new("s07", key).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(seen) = store.inspect(&unit).await
                && !seen.is_locked()
            {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{fault}: an orphan lock survived"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    assert_eq!(
        executions.load(Ordering::SeqCst),
        before,
        "a body ran without a confirmed lock"
    );
    record(
        "7. slow or paused Redis (response timeout 400 ms)",
        &format!(
            "{}; 0 bodies ran unconfirmed; no orphan lock",
            figures.join("; ")
        ),
    );
}

/// Three store calls and a task call on a store whose server was just killed, each failing
/// within its bound; with `refused`, every store call after the first (which may meet the
/// dropped connection) fails as a refusal, which proves that nothing was sent. Answers the
/// figures.
async fn calls_after_a_kill(
    store: impl Store + Clone,
    call_bound: Duration,
    task_bound: Duration,
    refused: bool,
) -> String {
    let unit = UnitOfWork::new("s07b", "k").unwrap();
    let mut figures = Vec::new();
    for call in 0..3 {
        let started = Instant::now();
        let result = tokio::time::timeout(Duration::from_secs(10), store.inspect(&unit))
            .await
            .expect("a store call hung past every deadline");
        let took = started.elapsed();
        let err = result.expect_err("the server is gone");
        assert!(err.is_retryable(), "{err}");
        assert!(
            took < call_bound,
            "a store call failed after {took:?}: {err}"
        );
        if refused && call > 0 {
            assert_eq!(err.kind(), StoreErrorKind::Unreachable, "{err}");
            assert!(!err.is_ambiguous(), "{err}");
        }
        figures.push(format!("{:?} in {} ms", err.kind(), took.as_millis()));
    }
    let ran = AtomicU64::new(0);
    let started = Instant::now();
    let result = tokio::time::timeout(
        Duration::from_secs(10),
        Task::new("s07b").call("k").store(store).run(async {
            ran.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Error>(1_u8)
        }),
    )
    .await
    .expect("a task call hung past every deadline");
    let took = started.elapsed();
    assert!(matches!(result, Err(Error::Store(_))), "{result:?}");
    assert_eq!(ran.load(Ordering::SeqCst), 0, "a body ran without a lock");
    assert!(took < task_bound, "a task call failed after {took:?}");
    format!(
        "store calls: {}; a task call (3 tries of begin): failed in {} ms",
        figures.join(", "),
        took.as_millis()
    )
}

// 7b. Redis killed: each call fails within its response timeout, reconnecting included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s07b_a_killed_redis_fails_each_call_within_its_response_timeout() {
    let response_timeout = Duration::from_millis(500);
    let connection_timeout = Duration::from_millis(200);
    let server = RedisServer::start();
    let store = RedisStore::builder(server.url())
        .response_timeout(response_timeout)
        .connection_timeout(connection_timeout)
        .connect()
        .await
        .unwrap();
    drop(server);
    // A dead server refuses connections at once, so a call ends with the connection manager's
    // reconnection round, whose back-off takes at most half the response timeout: the three
    // tries of a task's `begin` and the runner's pauses between them fit well within two
    // response timeouts and a connection timeout.
    let figures = calls_after_a_kill(
        store,
        response_timeout + Duration::from_millis(150),
        response_timeout * 2 + connection_timeout,
        true,
    )
    .await;
    record(
        "7b. Redis killed (response timeout 500 ms, connection timeout 200 ms)",
        &figures,
    );
}

// 7b. The same on a Redis Cluster, whose client bounds each command itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s07b_a_killed_cluster_node_fails_each_call_within_its_response_timeout() {
    let response_timeout = Duration::from_millis(500);
    let connection_timeout = Duration::from_millis(200);
    let server = RedisServer::start_with(&["--cluster-enabled", "yes"]);
    tokio::task::block_in_place(|| {
        support::cluster::serve_every_slot(server.port(), server.port());
    });
    let store = RedisClusterStore::builder([server.url()])
        .response_timeout(response_timeout)
        .connection_timeout(connection_timeout)
        .connect()
        .await
        .unwrap();
    drop(server);
    // Each try of a task's `begin` waits at most the response timeout; the cluster client
    // re-sends on its own, so its failures are all ambiguous.
    let figures = calls_after_a_kill(
        store,
        response_timeout + Duration::from_millis(150),
        response_timeout * 4,
        false,
    )
    .await;
    record(
        "7b. Redis killed, one-node Cluster (response timeout 500 ms, connection timeout 200 ms)",
        &figures,
    );
}
