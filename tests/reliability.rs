//! The reliability suite: faults injected for real into a redis-server the test started, and
//! what must hold under each. Every scenario records its figures (see `support::report`);
//! `scripts/reliability.sh` collects them into `docs/reliability.md`.
//!
//! Short TTLs (0.3–2 s) keep the whole suite within a few minutes.

use idempotask_test_support as support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use idempotask::store::{
    Begin, Fencing, LockToken, SharedStore, Store, StoreErrorKind, UnitOfWork,
};
use idempotask::{Error, Outcome, RedisStore, RetryPolicy, Task};
use support::proxy::Proxy;
use support::report::record;
use support::{Flavor, RedisServer, scan_keys};

#[path = "reliability/gate.rs"]
mod gate;

/// A scenario that needs no Redis-only feature, as one test per server: Redis 7 (`finish` as a
/// script) and Valkey 8.1 (`finish` as `SET … IFEQ`). The heaviest ones (restarts, a stalled
/// server, TLS) run once, on Redis.
macro_rules! on_both_servers {
    ($scenario:ident) => {
        mod $scenario {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn redis() {
                super::$scenario(super::Flavor::Redis).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn valkey() {
                super::$scenario(super::Flavor::Valkey).await;
            }
        }
    };
}

/// Records a scenario's figures, naming the server unless it is Redis (the rows the report
/// has always had).
fn record_on(flavor: Flavor, scenario: &str, figures: &str) {
    match flavor {
        Flavor::Redis => record(scenario, figures),
        Flavor::Valkey => record(&format!("{scenario}, Valkey 8.1"), figures),
    }
}

async fn store_with_timeout(url: &str, timeout: Duration) -> RedisStore {
    RedisStore::builder(url)
        .response_timeout(timeout)
        .connection_timeout(timeout)
        .connect()
        .await
        .unwrap()
}

/// Delivers until the call returns something other than a retryable idempotask error, as a
/// queue would; answers the value and how many typed errors were seen on the way.
async fn deliver_until_done<T, F, Fut>(deliver: F) -> (T, u32)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<T, Error>>,
{
    let mut errors = 0;
    loop {
        match deliver().await {
            Ok(value) => return (value, errors),
            Err(Error::Store(err)) if err.is_retryable() => errors += 1,
            Err(Error::Contended { .. }) => errors += 1,
            Err(other) => panic!("an error a queue cannot retry: {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

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
                    let (report, errors) = deliver_until_done(|| {
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

// 12. Security: tenants, passwords, ACL users.
on_both_servers!(s12_tenants_are_isolated_and_credentials_are_checked);
async fn s12_tenants_are_isolated_and_credentials_are_checked(server_flavor: Flavor) {
    let server = RedisServer::start_flavor(server_flavor, &["--requirepass", "s3cret"]);
    let url = |password: &str| format!("redis://:{password}@127.0.0.1:{}", server.port());
    let tenant = |name: &'static str| {
        let url = url("s3cret");
        async move {
            RedisStore::builder(url)
                .namespace(name)
                .connect()
                .await
                .unwrap()
        }
    };
    let (acme, globex) = (tenant("acme").await, tenant("globex").await);
    let task = Task::new("s12");
    let runs = AtomicU64::new(0);
    for store in [acme.clone(), globex.clone(), acme, globex] {
        task.call("invoice-1")
            .store(store)
            .run(async {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Error>(())
            })
            .await
            .unwrap();
    }
    assert_eq!(runs.load(Ordering::SeqCst), 2, "one execution per tenant");

    let started = Instant::now();
    let err = RedisStore::builder(url("wrong"))
        .connection_timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap_err();
    let wrong_took = started.elapsed();
    assert_eq!(err.kind(), StoreErrorKind::Configuration, "{err}");
    let err = RedisStore::connect(&format!("redis://127.0.0.1:{}", server.port()))
        .await
        .unwrap_err();
    assert_eq!(
        err.kind(),
        StoreErrorKind::Configuration,
        "no password: {err}"
    );
    record_on(
        server_flavor,
        "12. tenants and credentials",
        &format!(
            "two namespaces, one key: 2 executions (one each); requirepass: right password works, wrong or missing password fails with a `Configuration` error in {} ms; ACL user limited to `~idempotask:*` works (tests/redis_store.rs); TLS: see 12b",
            wrong_took.as_millis()
        ),
    );
}

/// A private CA and a certificate for 127.0.0.1 signed by it, made with `openssl`.
fn make_certificates(dir: &std::path::Path) {
    let openssl = |args: &[&str]| {
        let output = std::process::Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("openssl is needed to make the test certificates");
        assert!(
            output.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    };
    let key = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    openssl(
        &[
            &["req", "-x509"],
            &key[..],
            &[
                "-keyout",
                "ca.key",
                "-out",
                "ca.crt",
                "-days",
                "2",
                "-subj",
                "/CN=idempotask test CA",
            ],
        ]
        .concat(),
    );
    openssl(
        &[
            &["req"],
            &key[..],
            &[
                "-keyout",
                "server.key",
                "-out",
                "server.csr",
                "-subj",
                "/CN=127.0.0.1",
            ],
        ]
        .concat(),
    );
    std::fs::write(dir.join("san.ext"), "subjectAltName=IP:127.0.0.1\n").unwrap();
    openssl(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.crt",
        "-days",
        "2",
        "-extfile",
        "san.ext",
    ]);
}

// 12b. TLS: `rediss://` against a redis-server with a TLS port and a private CA.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s12b_rediss_works_against_a_tls_redis_and_checks_its_certificate() {
    let dir = std::env::temp_dir().join(format!("idempotask-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    make_certificates(&dir);
    let tls_port = support::free_port();
    let path = |name: &str| dir.join(name).to_str().unwrap().to_owned();
    let server = RedisServer::start_with(&[
        "--tls-port",
        &tls_port.to_string(),
        "--tls-cert-file",
        &path("server.crt"),
        "--tls-key-file",
        &path("server.key"),
        "--tls-ca-cert-file",
        &path("ca.crt"),
        "--tls-auth-clients",
        "no",
    ]);
    let url = format!("rediss://127.0.0.1:{tls_port}");
    let ca = std::fs::read(dir.join("ca.crt")).unwrap();
    let store = RedisStore::builder(&url)
        .tls_root_certificate(ca)
        .connect()
        .await
        .unwrap();
    let runs = AtomicU64::new(0);
    for _ in 0..3 {
        let value: u8 = Task::new("s12b")
            .call("k")
            .store(store.clone())
            .run(async {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Error>(4)
            })
            .await
            .unwrap();
        assert_eq!(value, 4);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    // The same server is not trusted without its CA.
    let untrusted = RedisStore::builder(&url)
        .connection_timeout(Duration::from_secs(2))
        .connect()
        .await;
    assert!(
        untrusted.is_err(),
        "a certificate from an unknown CA was accepted"
    );
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
    record(
        "12b. TLS",
        "`rediss://` to a redis-server TLS port with a private CA (`tls_root_certificate`): 3 deliveries, 1 execution; without the CA the connection is refused",
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
        ("dropped before finish", Some(Stop::Before("finish")), false),
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
        assert_eq!(seen.is_done(), done_expected, "{what}: {seen:?}");
        let deadline = Instant::now() + lock_ttl + Duration::from_secs(2);
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

// 11. Bad input: random keys, corrupted and forged markers.
#[test]
fn s11_random_keys_never_collide_and_never_reach_the_key_name() {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};
    let mut runner = TestRunner::new(Config {
        cases: 2_000,
        failure_persistence: None,
        ..Config::default()
    });
    let keys = "(?s)[a-z:{}\\n\\r\\t \\x00-\\x7f\\u{80}-\\u{10ffff}]{1,300}";
    let layout = idempotask::ops::RedisKeys::new("ns").unwrap();
    let redis_key = |key: &str| layout.unit(&UnitOfWork::new("task", key).unwrap());
    runner
        .run(&(keys, keys), |(a, b)| {
            let key = redis_key(&a);
            // One key per unit: no hash tag, and nothing of the caller's text in the name.
            prop_assert!(!key.contains(['{', '}']), "a hash tag in {}", key);
            prop_assert!(!key.contains(a.as_str()) || a.len() < 3);
            if a != b {
                prop_assert_ne!(&key, &redis_key(&b));
            }
            Ok(())
        })
        .unwrap();
    let too_long = "k".repeat(1025);
    assert!(UnitOfWork::new("task", too_long).is_err());
    assert!(UnitOfWork::new("task", "").is_err());
}

on_both_servers!(s11_corrupted_or_forged_markers_are_typed_errors_never_reruns);
async fn s11_corrupted_or_forged_markers_are_typed_errors_never_reruns(server_flavor: Flavor) {
    let server = RedisServer::start_flavor(server_flavor, &[]);
    let store = server.store().await;
    let mut conn = server.connection().await;
    // Markers that start like one (`D`) but are damaged, for the key they are stored under.
    let forged_for = |what: &str, key: &str| -> Vec<u8> {
        let len = key.len();
        match what {
            "bad header" => format!("Dxx|{key}|1").into_bytes(),
            "short key" => format!("D{}|{key}|1", len + 40).into_bytes(),
            "not json" => format!("D{len}|{key}|OK").into_bytes(),
            "not utf-8" => [format!("D{len}|{key}|").as_bytes(), b"\xff\xfe"].concat(),
            "wrong type" => format!("D{len}|{key}|\"text\"").into_bytes(),
            "8 MiB" => format!("D{len}|{key}|\"{}\"", "x".repeat(8 << 20)).into_bytes(),
            other => unreachable!("{other}"),
        }
    };
    let forged: Vec<&str> = vec![
        "bad header",
        "short key",
        "not json",
        "not utf-8",
        "wrong type",
        "8 MiB",
    ];
    let runs = AtomicU64::new(0);
    for what in &forged {
        let task = Task::new("s11");
        let key = format!("forged-{}", what.replace(' ', "-"));
        let bytes = &forged_for(what, &key);
        let unit = UnitOfWork::new("s11", key.as_str()).unwrap();
        let done = &store.key(&unit);
        let _: () = redis::cmd("SET")
            .arg(done)
            .arg(bytes.as_slice())
            .query_async(&mut conn)
            .await
            .unwrap();
        let result = task
            .call(key.as_str())
            .store(store.clone())
            .run(async {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<u64, Error>(1)
            })
            .await;
        assert!(
            matches!(result, Err(Error::Codec { .. })),
            "{what}: {result:?}"
        );
        let kept: Vec<u8> = redis::cmd("GET")
            .arg(done)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(&kept, bytes, "{what}: the marker was touched");
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "a forged marker made the body run"
    );
    record_on(
        server_flavor,
        "11. bad input",
        &format!(
            "2,000 random keys (unicode, `:`, `{{}}`, control characters, up to 300 chars): 0 collisions, no caller text in a key name; {} damaged markers (bad header, short key, not JSON, not UTF-8, wrong type, 8 MiB): typed `Codec` errors, 0 re-runs, 0 panics; a foreign value and a hash under a unit's key: typed errors naming the key",
            forged.len()
        ),
    );
}

on_both_servers!(s11_foreign_values_under_a_unit_key_are_typed_errors);
async fn s11_foreign_values_under_a_unit_key_are_typed_errors(server_flavor: Flavor) {
    let server = RedisServer::start_flavor(server_flavor, &[]);
    let store = server.store().await;
    let mut conn = server.connection().await;
    // A value that is neither a lock nor a marker is a typed error naming the key.
    let unit = UnitOfWork::new("s11", "foreign-value").unwrap();
    let _: () = redis::cmd("SET")
        .arg(store.key(&unit))
        .arg("\u{0}not-ours")
        .arg("PX")
        .arg(60_000)
        .query_async(&mut conn)
        .await
        .unwrap();
    let foreign: Result<u64, Error> = Task::new("s11")
        .call("foreign-value")
        .store(store.clone())
        .run(async { Ok(1) })
        .await;
    assert!(
        matches!(&foreign, Err(Error::Store(err)) if err.to_string().contains(&store.key(&unit))),
        "{foreign:?}"
    );
    // A value of another type under the key: the same.
    let unit = UnitOfWork::new("s11", "wrong-type").unwrap();
    let _: () = redis::cmd("HSET")
        .arg(store.key(&unit))
        .arg("field")
        .arg("value")
        .query_async(&mut conn)
        .await
        .unwrap();
    let wrong_type: Result<u64, Error> = Task::new("s11")
        .call("wrong-type")
        .store(store.clone())
        .run(async { Ok(1) })
        .await;
    assert!(
        matches!(&wrong_type, Err(Error::Store(err))
            if err.kind() == idempotask::store::StoreErrorKind::Protocol
                && err.to_string().contains(&store.key(&unit))),
        "{wrong_type:?}"
    );
    // Someone else's lock, even with a token of another shape, is just busy.
    let unit = UnitOfWork::new("s11", "foreign-lock").unwrap();
    let _: () = redis::cmd("SET")
        .arg(store.key(&unit))
        .arg("Lnot-a-token")
        .arg("PX")
        .arg(60_000)
        .query_async(&mut conn)
        .await
        .unwrap();
    let busy: Result<u64, Error> = Task::new("s11")
        .retry(RetryPolicy::no_wait())
        .call("foreign-lock")
        .store(store.clone())
        .run(async { Ok(1) })
        .await;
    assert!(matches!(busy, Err(Error::Contended { .. })), "{busy:?}");
}

// ---- scenarios with several OS processes: this binary re-runs itself as a worker ----

const WORKER_ROLE: &str = "IDEMPOTASK_RELIABILITY_WORKER";
const WORKER_REDIS: &str = "IDEMPOTASK_RELIABILITY_REDIS";

fn spawn_worker(role: &str, redis_url: &str) -> tokio::process::Child {
    tokio::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "worker", "--nocapture", "--test-threads=1"])
        .env(WORKER_ROLE, role)
        .env(WORKER_REDIS, redis_url)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

/// A worker process; does nothing when run as an ordinary test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker() {
    let (Ok(role), Ok(url)) = (std::env::var(WORKER_ROLE), std::env::var(WORKER_REDIS)) else {
        return;
    };
    match role.as_str() {
        "dies-after-side-effect" => worker_dies_after_side_effect(&url).await,
        "floods" => worker_floods(&url).await,
        other => panic!("unknown worker role {other}"),
    }
}

async fn worker_dies_after_side_effect(url: &str) {
    let store = RedisStore::connect(url).await.unwrap();
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let _: Result<u8, Error> = Task::new("s04")
        .lock_ttl(Duration::from_secs(1))
        .call("order-1")
        .store(store)
        .run(async move {
            let _: i64 = redis::cmd("INCR")
                .arg("s04:side-effects")
                .query_async(&mut conn)
                .await
                .unwrap();
            let _: i64 = redis::cmd("RPUSH")
                .arg("s04:effect-done")
                .arg(1)
                .query_async(&mut conn)
                .await
                .unwrap();
            // The parent kills this process here, before the marker is written.
            std::future::pending::<()>().await;
            Ok(1)
        })
        .await;
}

// 4. A worker killed with SIGKILL after the side effect and before the marker.
on_both_servers!(s04_a_killed_worker_is_rerun_only_after_its_lock_expires);
async fn s04_a_killed_worker_is_rerun_only_after_its_lock_expires(server_flavor: Flavor) {
    let server = RedisServer::start_flavor(server_flavor, &[]);
    let mut child = spawn_worker("dies-after-side-effect", &server.url());
    let mut conn = server.connection().await;
    let done: Option<(String, String)> = redis::cmd("BLPOP")
        .arg("s04:effect-done")
        .arg(30)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(done.is_some(), "the worker never reached its side effect");
    let pid = child.id().unwrap().to_string();
    assert!(
        std::process::Command::new("kill")
            .args(["-KILL", &pid])
            .status()
            .unwrap()
            .success()
    );
    let _ = child.wait().await;
    let killed_at = Instant::now();

    let store = server.store().await;
    let task = Task::new("s04").lock_ttl(Duration::from_secs(1));
    // Still locked by the dead worker: an immediate redelivery must not run.
    let early: Result<u8, Error> = Task::new("s04")
        .retry(RetryPolicy::no_wait())
        .call("order-1")
        .store(store.clone())
        .run(async { Ok(2) })
        .await;
    assert!(matches!(early, Err(Error::Contended { .. })), "{early:?}");
    // A redelivery that waits runs once the dead worker's lock has expired.
    let mut rerun_conn = conn.clone();
    let late = task
        .retry(RetryPolicy::new().max_wait(Duration::from_secs(5)))
        .call("order-1")
        .store(store)
        .run_reported(async move {
            let _: i64 = redis::cmd("INCR")
                .arg("s04:side-effects")
                .query_async(&mut rerun_conn)
                .await
                .unwrap();
            Ok::<u8, Error>(2)
        })
        .await
        .unwrap();
    let waited = killed_at.elapsed();
    assert_eq!(late.outcome, Outcome::Executed);
    let effects: u32 = redis::cmd("GET")
        .arg("s04:side-effects")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(effects, 2, "the documented window: one duplicate");
    record_on(
        server_flavor,
        "4. worker `kill -9` after the side effect, before the marker (lock TTL 1 s)",
        &format!(
            "immediate redelivery: `Contended`, nothing ran; the waiting redelivery ran after {} ms; side effects: 2 (1 duplicate: the documented window, covered by the database constraint)",
            waited.as_millis()
        ),
    );
}

// 8. Redis restarted 5 times during a 20,000-task run, without and with AOF.
async fn restarts_during_a_run(aof: bool) -> (u32, u32, u64) {
    let args: &[&str] = if aof {
        &["--appendonly", "yes", "--appendfsync", "always"]
    } else {
        &[]
    };
    let mut server = RedisServer::start_with(args);
    let store = store_with_timeout(&server.url(), Duration::from_millis(500)).await;
    let keys: u32 = 10_000;
    let executions: Arc<Vec<AtomicU32>> = Arc::new((0..keys).map(|_| AtomicU32::new(0)).collect());
    let completed = Arc::new(AtomicU64::new(0));
    let task = Arc::new(Task::new("s08").lock_ttl(Duration::from_secs(10)));
    let limit = Arc::new(tokio::sync::Semaphore::new(128));
    let mut deliveries = Vec::new();
    for key in 0..keys {
        // Two deliveries of each key, at the same time.
        for _ in 0..2 {
            let (task, store, executions, completed, limit) = (
                task.clone(),
                store.clone(),
                executions.clone(),
                completed.clone(),
                limit.clone(),
            );
            deliveries.push(tokio::spawn(async move {
                let _permit = limit.acquire().await.unwrap();
                let (value, errors) = deliver_until_done(|| {
                    let executions = executions.clone();
                    task.call(format!("k{key}"))
                        .store(store.clone())
                        .run(async move {
                            executions[key as usize].fetch_add(1, Ordering::SeqCst);
                            Ok::<_, Error>(u64::from(key))
                        })
                })
                .await;
                assert_eq!(value, u64::from(key));
                completed.fetch_add(1, Ordering::SeqCst);
                errors
            }));
        }
    }
    // Restart at 15 %, 30 %, 45 %, 60 % and 75 % of the run.
    let total = u64::from(keys) * 2;
    for restart in 1..=5_u64 {
        while completed.load(Ordering::SeqCst) < total * restart * 15 / 100 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        tokio::task::block_in_place(|| server.restart());
    }
    let mut typed_errors = 0;
    for delivery in deliveries {
        typed_errors += delivery.await.expect("a delivery panicked");
    }
    assert_eq!(completed.load(Ordering::SeqCst), total, "a task was lost");
    let duplicates: u32 = executions
        .iter()
        .map(|n| n.load(Ordering::SeqCst).saturating_sub(1))
        .sum();
    let never = executions
        .iter()
        .filter(|n| n.load(Ordering::SeqCst) == 0)
        .count();
    assert_eq!(never, 0);
    (duplicates, typed_errors, total)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s08_redis_restarts_lose_no_task_and_with_aof_no_marker() {
    let (duplicates_plain, errors_plain, total) = restarts_during_a_run(false).await;
    let (duplicates_aof, errors_aof, _) = restarts_during_a_run(true).await;
    assert_eq!(
        duplicates_aof, 0,
        "appendfsync always must keep every marker across restarts"
    );
    record(
        "8. Redis restarted 5 times during a run",
        &format!(
            "{total} deliveries (10,000 keys × 2, 128 at a time): 0 lost, 0 panics; no persistence: {duplicates_plain} duplicates, {errors_plain} typed retries; AOF `appendfsync always`: {duplicates_aof} duplicates, {errors_aof} typed retries"
        ),
    );
}

const FLOOD_KEYS: u32 = 1_000;
const FLOOD_PROCESSES: usize = 2;
const FLOOD_DELIVERIES_PER_KEY: usize = 64;

async fn worker_floods(url: &str) {
    use std::hash::{Hash, Hasher};
    let store = RedisStore::connect(url).await.unwrap();
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let _: i64 = redis::cmd("RPUSH")
        .arg("s01:ready")
        .arg(1)
        .query_async(&mut conn)
        .await
        .unwrap();
    let _: Option<(String, String)> = redis::cmd("BLPOP")
        .arg("s01:go")
        .arg(60)
        .query_async(&mut conn)
        .await
        .unwrap();
    let task = Arc::new(Task::new("s01"));
    // All deliveries of a key at once, 40 keys at a time: one multiplexed connection per
    // process, like a worker's.
    let keys_in_flight = Arc::new(tokio::sync::Semaphore::new(40));
    let mut deliveries = Vec::new();
    for key in 0..FLOOD_KEYS {
        let permit = Arc::new(keys_in_flight.clone().acquire_owned().await.unwrap());
        for _ in 0..FLOOD_DELIVERIES_PER_KEY / FLOOD_PROCESSES {
            let (task, store, conn, permit) =
                (task.clone(), store.clone(), conn.clone(), permit.clone());
            deliveries.push(tokio::spawn(async move {
                let started = Instant::now();
                let (report, retries) = deliver_until_done(|| {
                    let mut conn = conn.clone();
                    task.call(format!("k{key}"))
                        .store(store.clone())
                        .run_reported(async move {
                            let _: i64 = redis::cmd("HINCRBY")
                                .arg("s01:effects")
                                .arg(key)
                                .arg(1)
                                .query_async(&mut conn)
                                .await
                                .unwrap();
                            tokio::time::sleep(Duration::from_millis(20)).await;
                            Ok::<_, Error>(format!(
                                "{}-{}",
                                std::process::id(),
                                rand::random::<u64>()
                            ))
                        })
                })
                .await;
                drop(permit);
                (key, report, started.elapsed(), retries)
            }));
        }
    }
    let mut values: std::collections::BTreeMap<u32, String> = std::collections::BTreeMap::new();
    let mut waits = Vec::new();
    let mut executed = 0;
    let mut retries = 0;
    for delivery in deliveries {
        let (key, report, took, typed_errors) = delivery.await.unwrap();
        retries += typed_errors;
        if report.outcome == Outcome::Executed {
            executed += 1;
        } else {
            waits.push(took);
        }
        let first = values.entry(key).or_insert_with(|| report.value.clone());
        assert_eq!(
            *first, report.value,
            "two results for key {key} in one process"
        );
    }
    waits.sort();
    let percentile = |p: usize| {
        let at = (waits.len() * p / 100).min(waits.len().saturating_sub(1));
        waits.get(at).map_or(0, Duration::as_micros)
    };
    let mut digest = std::collections::hash_map::DefaultHasher::new();
    values.hash(&mut digest);
    println!(
        "SUMMARY {} {executed} {} {} {:x} {retries}",
        FLOOD_KEYS as usize * FLOOD_DELIVERIES_PER_KEY / FLOOD_PROCESSES,
        percentile(50),
        percentile(99),
        digest.finish()
    );
}

// 1. 64 concurrent deliveries per key, 1,000 keys, across 2 processes.
on_both_servers!(s01_concurrent_deliveries_across_processes_run_each_key_once);
async fn s01_concurrent_deliveries_across_processes_run_each_key_once(server_flavor: Flavor) {
    let server = RedisServer::start_flavor(server_flavor, &[]);
    let workers: Vec<_> = (0..FLOOD_PROCESSES)
        .map(|_| spawn_worker("floods", &server.url()))
        .collect();
    let mut conn = server.connection().await;
    for _ in 0..FLOOD_PROCESSES {
        let ready: Option<(String, String)> = redis::cmd("BLPOP")
            .arg("s01:ready")
            .arg(60)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(ready.is_some(), "a worker did not start");
    }
    let _: i64 = redis::cmd("RPUSH")
        .arg("s01:go")
        .arg(vec![1; FLOOD_PROCESSES])
        .query_async(&mut conn)
        .await
        .unwrap();
    let started = Instant::now();
    let mut summaries = Vec::new();
    for worker in workers {
        let output = worker.wait_with_output().await.unwrap();
        assert!(output.status.success(), "a worker failed");
        let stdout = String::from_utf8(output.stdout).unwrap();
        let line = stdout
            .split("SUMMARY ")
            .nth(1)
            .expect("a summary")
            .lines()
            .next()
            .unwrap()
            .to_owned();
        summaries.push(line.split(' ').map(str::to_owned).collect::<Vec<_>>());
    }
    let took = started.elapsed();
    let effects: std::collections::HashMap<u32, u32> = redis::cmd("HGETALL")
        .arg("s01:effects")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(effects.len(), FLOOD_KEYS as usize);
    let duplicates: u32 = effects.values().map(|n| n - 1).sum();
    assert_eq!(duplicates, 0, "a side effect ran twice");
    let executed: u32 = summaries.iter().map(|s| s[1].parse::<u32>().unwrap()).sum();
    assert_eq!(executed, FLOOD_KEYS);
    assert!(
        summaries.iter().all(|s| s[4] == summaries[0][4]),
        "the processes saw different results"
    );
    let p50 = summaries
        .iter()
        .map(|s| s[2].parse::<u64>().unwrap())
        .max()
        .unwrap();
    let p99 = summaries
        .iter()
        .map(|s| s[3].parse::<u64>().unwrap())
        .max()
        .unwrap();
    let retries: u32 = summaries.iter().map(|s| s[5].parse::<u32>().unwrap()).sum();
    record_on(
        server_flavor,
        "1. 64 concurrent deliveries × 1,000 keys, 2 processes",
        &format!(
            "{} deliveries in {} ms: side effect exactly once per key (0 duplicates), identical results in both processes; waiters got the result in p50 {} ms, p99 {} ms (body 20 ms, default backoff, {} build); {retries} typed retries",
            FLOOD_KEYS as usize * FLOOD_DELIVERIES_PER_KEY,
            took.as_millis(),
            p50 / 1000,
            p99 / 1000,
            if cfg!(debug_assertions) {
                "debug"
            } else {
                "release"
            }
        ),
    );
}
