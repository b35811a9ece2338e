//! The store against its server: a missing table, a fast shutdown, the purge, huge TTLs, replicas
//! migrating at once, and the store's own connection pool (checkout timeouts, bodies holding the
//! application's pool, a server without room for the store's connections).

#[allow(clippy::wildcard_imports)]
use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn a_missing_table_is_a_configuration_error_naming_the_migration() {
    let server = PostgresServer::start();
    let pool = server.pool(2).await;
    let err = PostgresStore::builder(pool.clone())
        .connect()
        .await
        .unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Configuration);
    assert!(err.to_string().contains("PostgresStore::migrate"), "{err}");
    let err = PostgresStore::builder(pool.clone())
        .table("Robert'); DROP TABLE students;--")
        .migrate()
        .await
        .unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Configuration);
    // A table of one's own name, in a schema of its own, migrated twice.
    let builder = PostgresStore::builder(pool.clone()).table("jobs.units");
    builder.migrate().await.unwrap();
    builder.migrate().await.unwrap();
    assert_eq!(
        builder.clone().connect().await.unwrap().table(),
        "jobs.units"
    );
    // Half a migration (the sequence gone) is found at connect, not at the first fenced task.
    sqlx::raw_sql("DROP SEQUENCE jobs.units_fence")
        .execute(&pool)
        .await
        .unwrap();
    let err = builder.clone().connect().await.unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Configuration);
    assert!(err.to_string().contains("PostgresStore::migrate"), "{err}");
    builder.migrate().await.unwrap();
    builder.connect().await.unwrap();
}

/// A transactional delivery in flight goes through a fast shutdown: its transaction is rolled
/// back. Deliveries while the server is down fail closed and run nothing. After the restart,
/// every unit that committed before replays and the others run, once each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn committed_units_survive_a_fast_shutdown_restart() {
    const COMMITTED: usize = 100;
    const WHILE_DOWN: usize = 16;
    let mut server = PostgresServer::start();
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(32)
        .acquire_timeout(Duration::from_secs(2))
        .connect(&server.url())
        .await
        .unwrap();
    let builder = PostgresStore::builder(pool.clone());
    builder.migrate().await.unwrap();
    effects_table(&pool).await;
    let store = builder.connect().await.unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let deliver = |key: String| deliver_write(store.clone(), key, Arc::clone(&runs));
    for index in 0..COMMITTED {
        let done: Result<i64, BoxError> = deliver(format!("restart-{index}")).await;
        done.unwrap();
    }

    // One delivery inside its transaction when the server shuts down.
    let in_flight = HeldDelivery::start(&store, "restart-in-flight").await;
    server = tokio::task::spawn_blocking(move || {
        server.stop();
        server
    })
    .await
    .unwrap();
    // Its marker cannot be written any more: the transaction went with the server.
    let in_flight = in_flight.resume(Ok(1)).await;
    assert!(in_flight.is_err(), "{in_flight:?}");

    // While the server is down: every delivery fails, none runs its body.
    let ran_before = runs.load(Ordering::SeqCst);
    let down =
        deliver_concurrently(WHILE_DOWN, |index| deliver(format!("restart-down-{index}"))).await;
    assert!(down.iter().all(Result::is_err));
    let plain: Result<u32, Error> = CHARGE
        .call("restart-plain")
        .store(store.clone())
        .run(async { Ok(1) })
        .await;
    assert!(matches!(plain, Err(Error::Store(_))), "{plain:?}");
    assert_eq!(runs.load(Ordering::SeqCst), ran_before);

    server = tokio::task::spawn_blocking(move || {
        server.restart();
        server
    })
    .await
    .unwrap();
    // Every key again, as the queue would redeliver: committed ones replay, the rest run.
    let keys: Vec<String> = (0..COMMITTED)
        .map(|index| format!("restart-{index}"))
        .chain((0..WHILE_DOWN).map(|index| format!("restart-down-{index}")))
        .chain(["restart-in-flight".to_owned()])
        .collect();
    for key in &keys {
        let again: Result<i64, BoxError> = deliver(key.clone()).await;
        again.unwrap();
    }
    assert_eq!(
        runs.load(Ordering::SeqCst) - ran_before,
        WHILE_DOWN + 1,
        "only the units that never committed ran again"
    );
    assert_each_key_written_once(&pool, keys.len()).await;
    drop(server);
}

/// Expired markers and locks count as absent at once; `purge_expired` deletes exactly those
/// rows and leaves the live ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn purge_expired_deletes_expired_rows_only() {
    let server = PostgresServer::start();
    let (store, pool) = setup(&server).await;
    // Results are kept at least as long as the lock TTL: both short here, yet long enough that
    // a loaded machine still gets each lock with time to spare.
    let short = Task::new("pg_short")
        .lock_ttl(Duration::from_secs(1))
        .result_ttl(Duration::from_secs(1));
    let long = Task::new("pg_long");
    for index in 0..50 {
        let _: u32 = short
            .call(format!("k{index}"))
            .store(store.clone())
            .run(async { Ok::<_, Error>(1) })
            .await
            .unwrap();
    }
    for index in 0..20 {
        let _: u32 = long
            .call(format!("k{index}"))
            .store(store.clone())
            .run(async { Ok::<_, Error>(2) })
            .await
            .unwrap();
    }
    // Expiry is the behaviour under test, on the server's clock: the last marker written is
    // the last to expire, and once it reads as absent, every short one does.
    let last = UnitOfWork::new("pg_short", "k49").unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while store.inspect(&last).await.unwrap().is_done() {
        assert!(std::time::Instant::now() < deadline, "k49 never expired");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let expired = UnitOfWork::new("pg_short", "k3").unwrap();
    assert!(!store.inspect(&expired).await.unwrap().is_done());
    assert_eq!(store.purge_expired().await.unwrap(), 50);
    assert_eq!(store.purge_expired().await.unwrap(), 0);
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM idempotask_units")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(rows, 20);
    let live = UnitOfWork::new("pg_long", "k3").unwrap();
    assert!(store.inspect(&live).await.unwrap().is_done());
}

/// "Keep it for ever" (`Duration::MAX`) is stored as about a century, on both paths, and
/// fencing tokens start at the clock in microseconds, like the Redis stores'.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn huge_ttls_are_kept_long_and_fencing_tokens_follow_the_clock() {
    let server = PostgresServer::start();
    let (store, pool) = setup(&server).await;
    let forever = Task::new("pg_forever")
        .lock_ttl(Duration::MAX)
        .result_ttl(Duration::MAX)
        .fencing(true);
    let report = forever
        .call("k")
        .store(store.clone())
        .run_reported(async { Ok::<_, Error>(1_u32) })
        .await
        .unwrap();
    assert_eq!(report.outcome, idempotask::Outcome::Executed);
    let since_epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    let now_us = u64::try_from(since_epoch.as_micros()).unwrap();
    let fence = report.fencing_token.unwrap();
    assert!(
        fence >= now_us - 600_000_000,
        "fencing token {fence} is behind the clock in µs ({now_us})"
    );
    let seen = store
        .inspect(&UnitOfWork::new("pg_forever", "k").unwrap())
        .await
        .unwrap();
    assert!(
        seen.marker_ttl.unwrap() > Duration::from_secs(90 * 365 * 24 * 3600),
        "{seen:?}"
    );
    let kept: Result<i64, BoxError> = forever
        .call("t")
        .run_in_transaction(store.transaction(pool.begin().await.unwrap()), async |db| {
            write_effect(db, "t", 1).await
        })
        .await;
    assert_eq!(kept.unwrap(), 1);
}

/// Replicas that deploy together each run the migration at once on a fresh database: every
/// one succeeds (`CREATE … IF NOT EXISTS` alone fails with `23505` under concurrency).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn six_replicas_migrating_at_once_all_succeed() {
    let server = PostgresServer::start();
    let pool = server.pool(12).await;
    for table in ["idempotask_units", "jobs.units"] {
        let migrations: Vec<_> = (0..6)
            .map(|_| {
                let builder = PostgresStore::builder(pool.clone()).table(table);
                tokio::spawn(async move { builder.migrate().await })
            })
            .collect();
        for migration in migrations {
            migration.await.unwrap().unwrap();
        }
        let store = PostgresStore::builder(pool.clone())
            .table(table)
            .connect()
            .await
            .unwrap();
        let ran: u8 = Task::new("migrated")
            .call(table)
            .store(store)
            .run(async { Ok::<_, Error>(1) })
            .await
            .unwrap();
        assert_eq!(ran, 1);
    }
}

/// A store whose own pool hands out no connection in time fails a call with a timeout that
/// says nothing was sent: not ambiguous, so no clean-up is started on a pool that has no
/// connection to spare, and the body does not run. (The store's pool takes the application's
/// pool's hooks: this one's stall while `stalled` is set.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn a_wait_for_a_pooled_connection_is_a_timeout_that_sent_nothing() {
    let server = PostgresServer::start();
    let stalled = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Every connection stalls before it is handed out, the idle ones and the new ones alike.
    let stall = {
        let stalled = Arc::clone(&stalled);
        move || {
            let stalled = Arc::clone(&stalled);
            async move {
                if stalled.load(Ordering::SeqCst) {
                    tokio::time::sleep(Duration::from_secs(60)).await;
                }
            }
        }
    };
    let pool = {
        let (on_idle, on_new) = (stall.clone(), stall);
        sqlx::postgres::PgPoolOptions::new()
            .max_connections(2)
            .before_acquire(move |_, _| {
                let stalling = on_idle();
                Box::pin(async move {
                    stalling.await;
                    Ok(true)
                })
            })
            .after_connect(move |_, _| {
                let stalling = on_new();
                Box::pin(async move {
                    stalling.await;
                    Ok(())
                })
            })
            .connect(&server.url())
            .await
            .unwrap()
    };
    let builder = PostgresStore::builder(pool.clone())
        .response_timeout(Duration::from_millis(200))
        .max_connections(1);
    builder.migrate().await.unwrap();
    let store = builder.connect().await.unwrap();
    stalled.store(true, Ordering::SeqCst);
    let ran = AtomicUsize::new(0);
    let result: Result<u8, Error> = Task::new("pg_starved")
        .call("k")
        .store(store.clone())
        .run(async {
            ran.fetch_add(1, Ordering::SeqCst);
            Ok(1)
        })
        .await;
    match result {
        Err(Error::Store(err)) => {
            assert_eq!(err.kind(), StoreErrorKind::Timeout, "{err}");
            assert!(!err.is_ambiguous(), "{err}");
            assert!(err.to_string().contains("nothing was sent"), "{err}");
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert_eq!(ran.load(Ordering::SeqCst), 0);
    stalled.store(false, Ordering::SeqCst);
    let value: u8 = Task::new("pg_starved")
        .call("k")
        .store(store)
        .run(async { Ok::<_, Error>(2) })
        .await
        .unwrap();
    assert_eq!(value, 2);
}

pub(super) static POOL_BODIES: Task = Task::new("pg_pool_bodies");

/// Bodies that hold connections of the application's pool do not keep the store from
/// beginning and recording: the store's statements run on connections of their own. The
/// scenario, scaled down: a pool of 2, 40 keys delivered twice at once, each body holding a
/// pooled connection for 100 ms, so that the bodies keep the pool busy four times as long as
/// the store's response timeout. (Sharing the pool, the store's statements queued behind the
/// bodies: every duplicate failed, its `begin` finding no free connection in time, and a
/// `finish` that could not get one before the lock expired left the work to run again.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn bodies_holding_the_pool_do_not_keep_the_store_from_recording() {
    const KEYS: usize = 40;
    let server = PostgresServer::start();
    let pool = server.pool(2).await;
    let builder = PostgresStore::builder(pool.clone()).response_timeout(Duration::from_millis(500));
    builder.migrate().await.unwrap();
    let store = builder.connect().await.unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let deliver = |index: usize| {
        let (store, pool, runs) = (store.clone(), pool.clone(), Arc::clone(&runs));
        async move {
            POOL_BODIES
                .call(format!("k{index}"))
                .store(store)
                .run_reported(Box::pin(async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    let connection = pool.acquire().await?;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    drop(connection);
                    Ok::<_, BoxError>(index)
                }))
                .await
        }
    };
    let first = deliver_concurrently(KEYS * 2, |delivery| deliver(delivery % KEYS)).await;
    let outcome = |wanted: idempotask::Outcome| {
        first
            .iter()
            .filter(|result| matches!(result, Ok(report) if report.outcome == wanted))
            .count()
    };
    let not_recorded = outcome(idempotask::Outcome::MarkerNotWritten);
    let failed: Vec<String> = first
        .iter()
        .filter_map(|result| result.as_ref().err().map(ToString::to_string))
        .collect();
    assert_eq!(
        (not_recorded, failed.len()),
        (0, 0),
        "{} executed, {} replayed, {not_recorded} not recorded, {} failed: {:?}",
        outcome(idempotask::Outcome::Executed),
        outcome(idempotask::Outcome::Replayed),
        failed.len(),
        failed.first(),
    );
    assert_eq!(runs.load(Ordering::SeqCst), KEYS);
    // The queue redelivers every key: each one replays.
    let again = deliver_concurrently(KEYS, deliver).await;
    for (index, result) in again.into_iter().enumerate() {
        let report = result.unwrap();
        assert_eq!(report.outcome, idempotask::Outcome::Replayed, "k{index}");
        assert_eq!(report.value, index);
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        KEYS,
        "bodies ran again on redelivery"
    );
}

/// The client backends the server has open now, the asking one included.
pub(super) async fn client_backends(observer: &PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'",
    )
    .fetch_one(observer)
    .await
    .unwrap()
}

// The store's own pool was as large as the application's: an application pool of 64 and the
// store's made 128 connections against the server's default limit of 100, and calls waited out
// sqlx's retries of "too many clients" (2.7 times slower, 1,053 refusals in the server's log).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn the_stores_pool_holds_a_few_connections_whatever_the_applications_size() {
    static TASK: Task = Task::new("pg_pool_size");
    let server = PostgresServer::start();
    let application = server.pool(64).await;
    let builder = PostgresStore::builder(application.clone());
    builder.migrate().await.unwrap();
    let store = builder.connect().await.unwrap();
    let observer = server.pool(1).await;
    let (stop, mut stopped) = tokio::sync::watch::channel(false);
    let sampler = {
        let observer = observer.clone();
        tokio::spawn(async move {
            let mut most = 0;
            while !*stopped.borrow() {
                most = most.max(client_backends(&observer).await);
                let _ = tokio::time::timeout(Duration::from_millis(5), stopped.changed()).await;
            }
            most
        })
    };
    let outcomes = deliver_concurrently(64, |i| {
        let call = TASK.call(format!("order-{i}")).store(store.clone());
        async move {
            call.run(async {
                tokio::time::sleep(Duration::from_millis(20)).await;
                Ok::<_, Error>(i)
            })
            .await
        }
    })
    .await;
    stop.send(true).unwrap();
    let most = sampler.await.unwrap();
    assert!(outcomes.iter().all(Result::is_ok), "{outcomes:?}");
    // The store's ten, the application pool's one, the observer's one.
    assert!(
        most <= i64::from(PostgresStore::DEFAULT_MAX_CONNECTIONS) + 2,
        "{most} client backends for 64 calls in flight"
    );
}

// A server that refused the store's pool a connection ("too many clients already") made each
// statement wait out sqlx's retries and fail as a timeout of the pool, retried in its turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn a_server_with_no_room_for_the_stores_connections_is_a_retryable_refusal_that_says_so()
 {
    let server = PostgresServer::start_with(&["max_connections=8"]);
    let application = server.pool(2).await;
    let builder =
        PostgresStore::builder(application.clone()).response_timeout(Duration::from_millis(1500));
    builder.migrate().await.unwrap();
    let store = builder.connect().await.unwrap();
    // Every connection the server takes, held; then the store's own one ended under it.
    let hog = sqlx::postgres::PgPoolOptions::new()
        .max_connections(16)
        .acquire_timeout(Duration::from_secs(2))
        .connect_lazy(&server.url())
        .unwrap();
    let mut held = Vec::new();
    while let Ok(connection) = hog.acquire().await {
        held.push(connection);
    }
    assert!(!held.is_empty());
    let mine: Vec<i32> = {
        let mut pids = Vec::new();
        for connection in &mut held {
            pids.push(
                sqlx::query_scalar("SELECT pg_backend_pid()")
                    .fetch_one(&mut **connection)
                    .await
                    .unwrap(),
            );
        }
        pids
    };
    let _: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> ALL($1)",
    )
    .bind(&mine)
    .fetch_all(&mut *held[0])
    .await
    .unwrap();
    // The slots they freed, taken too.
    while let Ok(connection) = hog.acquire().await {
        held.push(connection);
    }

    // Waiters at once: each gets the server's reason (one question answers them all), not a
    // bare timeout.
    let unit = UnitOfWork::new("pg_no_room", "order-1").unwrap();
    let waiters: Vec<_> = (0..8)
        .map(|_| {
            let (store, unit) = (store.clone(), unit.clone());
            tokio::spawn(async move { store.inspect(&unit).await })
        })
        .collect();
    for waiter in waiters {
        let refused = waiter.await.unwrap().unwrap_err();
        // A spike passes: the runner retries, and a body's result is retried while its lock
        // lasts, rather than reported unwritten at the first refusal.
        assert_eq!(refused.kind(), StoreErrorKind::Rejected, "{refused}");
        assert!(
            refused.is_retryable() && !refused.is_ambiguous(),
            "{refused}"
        );
        let message = refused.to_string();
        assert!(
            message.contains("too many clients") && message.contains("max_connections"),
            "{message}"
        );
    }
    // Room again: the same store works, nothing to reconfigure.
    drop(held);
    hog.close().await;
    store.inspect(&unit).await.unwrap();
}
