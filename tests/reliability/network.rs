//! Replies lost on the way, and a server too slow to answer.

use super::*;

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
