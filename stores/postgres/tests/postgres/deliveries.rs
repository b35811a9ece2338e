//! Concurrent and repeated deliveries, plain and in transactions: the body runs once, an error
//! or a dropped delivery writes nothing, a waiting delivery replays what the first committed or
//! runs when it rolled back, and a plain call meeting a transaction's row.

#[allow(clippy::wildcard_imports)]
use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
pub(super) async fn sixty_four_concurrent_deliveries_run_the_body_once() {
    let server = PostgresServer::start();
    let (store, _pool) = setup(&server).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let results = deliver_concurrently(64, |delivery| {
        let (store, runs) = (store.clone(), Arc::clone(&runs));
        async move {
            CHARGE
                .call("order-1")
                .store(store)
                .run(async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    Ok::<_, Error>(format!("charge-by-{delivery}"))
                })
                .await
        }
    })
    .await;
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let distinct: BTreeSet<String> = results.into_iter().map(Result::unwrap).collect();
    assert_eq!(distinct.len(), 1, "{distinct:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
pub(super) async fn sixty_four_concurrent_transactional_deliveries_commit_once() {
    let server = PostgresServer::start();
    let (store, pool) = setup(&server).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let results = deliver_concurrently(64, |delivery| {
        let (store, runs) = (store.clone(), Arc::clone(&runs));
        async move {
            let transaction = store.pool().begin().await?;
            WRITE
                .call("write-1")
                .run_in_transaction(store.transaction(transaction), async |db| {
                    runs.fetch_add(1, Ordering::SeqCst);
                    write_effect(db, "write-1", i64::try_from(delivery)?).await
                })
                .await
        }
    })
    .await;
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let values: BTreeSet<i64> = results
        .into_iter()
        .map(|result: Result<i64, BoxError>| result.unwrap())
        .collect();
    assert_eq!(values.len(), 1, "every delivery gets the committed value");
    assert_eq!(effects(&pool, "write-1").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn an_err_body_writes_nothing_and_the_next_delivery_runs() {
    let server = PostgresServer::start();
    let (store, pool) = setup(&server).await;
    let failed: Result<i64, BoxError> = WRITE
        .call("write-err")
        .run_in_transaction(store.transaction(pool.begin().await.unwrap()), async |db| {
            write_effect(db, "write-err", 1).await?;
            Err("the gateway said no".into())
        })
        .await;
    assert_eq!(failed.unwrap_err().to_string(), "the gateway said no");
    assert_eq!(
        effects(&pool, "write-err").await,
        0,
        "the body's write was rolled back"
    );
    let unit = UnitOfWork::new("pg_write", "write-err").unwrap();
    let seen = store.inspect(&unit).await.unwrap();
    assert!(!seen.is_done() && !seen.is_locked(), "{seen:?}");

    let ran: Result<i64, BoxError> = WRITE
        .call("write-err")
        .run_in_transaction(store.transaction(pool.begin().await.unwrap()), async |db| {
            write_effect(db, "write-err", 2).await
        })
        .await;
    assert_eq!(ran.unwrap(), 2);
    assert_eq!(effects(&pool, "write-err").await, 1);
    assert!(store.inspect(&unit).await.unwrap().is_done());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn a_dropped_delivery_rolls_back_and_the_next_one_runs() {
    let server = PostgresServer::start();
    let (store, pool) = setup(&server).await;
    let held = HeldDelivery::start(&store, "write-dropped").await;
    held.delivery.abort();
    assert!(held.delivery.await.unwrap_err().is_cancelled());
    let ran: Result<i64, BoxError> = WRITE
        .call("write-dropped")
        .run_in_transaction(store.transaction(pool.begin().await.unwrap()), async |db| {
            write_effect(db, "write-dropped", 2).await
        })
        .await;
    assert_eq!(ran.unwrap(), 2);
    let values: Vec<i64> = sqlx::query_scalar("SELECT value FROM effects WHERE key = $1")
        .bind("write-dropped")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(values, [2], "the dropped delivery's write never committed");
}

/// How many backends wait on a lock: a second delivery blocked on the first one's row.
pub(super) async fn lock_waiters(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// A first delivery holds its transaction open; a second one waits on its row. Answers the
/// second delivery's result and whether its body ran, once the first ended as `first_ends`.
pub(super) async fn second_delivery_after(
    first_ends: Result<i64, &'static str>,
) -> (Result<i64, String>, bool, i64) {
    let server = PostgresServer::start();
    let (store, pool) = setup(&server).await;
    let first = HeldDelivery::start(&store, "write-waited").await;
    let second_ran = Arc::new(AtomicUsize::new(0));
    let second = {
        let (store, ran) = (store.clone(), Arc::clone(&second_ran));
        let transaction = pool.begin().await.unwrap();
        tokio::spawn(async move {
            WRITE
                .call("write-waited")
                .run_in_transaction(store.transaction(transaction), async |db| {
                    ran.fetch_add(1, Ordering::SeqCst);
                    write_effect(db, "write-waited", 2).await
                })
                .await
        })
    };
    while lock_waiters(&pool).await < 1 {
        tokio::task::yield_now().await;
    }
    assert_eq!(
        second_ran.load(Ordering::SeqCst),
        0,
        "the second ran while the first held the row"
    );
    let _ = first.resume(first_ends).await;
    let second = second
        .await
        .unwrap()
        .map_err(|err: BoxError| err.to_string());
    let rows = effects(&pool, "write-waited").await;
    (second, second_ran.load(Ordering::SeqCst) == 1, rows)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn a_waiting_delivery_replays_what_the_first_committed() {
    let (second, ran, rows) = second_delivery_after(Ok(1)).await;
    assert_eq!(second, Ok(1));
    assert!(!ran, "the second delivery ran although the first committed");
    assert_eq!(rows, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn a_waiting_delivery_runs_when_the_first_rolled_back() {
    let (second, ran, rows) = second_delivery_after(Err("declined")).await;
    assert_eq!(second, Ok(2));
    assert!(ran);
    assert_eq!(rows, 1, "only the second delivery's write committed");
}

/// A transactional delivery that meets a plain call's lock gives up at once and rolls back, so
/// whatever row lock its statement took cannot keep the plain holder from recording its result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn a_transactional_delivery_meeting_a_plain_holder_is_contended_and_lets_it_finish()
 {
    let server = PostgresServer::start();
    let (store, pool) = setup(&server).await;
    let (inside_tx, inside) = tokio::sync::oneshot::channel();
    let (end_tx, end) = tokio::sync::oneshot::channel::<()>();
    let plain = {
        let store = store.clone();
        tokio::spawn(async move {
            WRITE
                .call("mixed")
                .store(store)
                .run_reported(async {
                    let _ = inside_tx.send(());
                    end.await.map_err(|_| Error::NotConfigured)?;
                    Ok::<_, Error>(1_i64)
                })
                .await
        })
    };
    inside.await.unwrap();
    let transactional: Result<i64, BoxError> = WRITE
        .call("mixed")
        .run_in_transaction(store.transaction(pool.begin().await.unwrap()), async |db| {
            write_effect(db, "mixed", 2).await
        })
        .await;
    let err = transactional.unwrap_err();
    assert!(
        matches!(err.downcast_ref::<Error>(), Some(Error::Contended { .. })),
        "{err}"
    );
    end_tx.send(()).unwrap();
    let report = plain.await.unwrap().unwrap();
    assert_eq!(report.outcome, idempotask::Outcome::Executed);
    assert_eq!(effects(&pool, "mixed").await, 0);
}

/// Whatever `lock_timeout` the pool's connections have (here `0`: none), a plain call that
/// meets a transaction's uncommitted row gives up in the server at four fifths of the store's
/// response timeout, as a timeout that is not ambiguous, and nothing runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn a_plain_wait_on_a_transaction_ends_in_the_server_whatever_the_pool_says() {
    let server = PostgresServer::start();
    let (store, pool) = setup(&server).await;
    let options: sqlx::postgres::PgConnectOptions = server.url().parse().unwrap();
    let unbounded_pool = sqlx::postgres::PgPoolOptions::new()
        .test_before_acquire(false)
        .connect_with(options.options([("lock_timeout", "0")]))
        .await
        .unwrap();
    let bounded = PostgresStore::builder(unbounded_pool)
        .response_timeout(Duration::from_millis(250))
        .connect()
        .await
        .unwrap();
    let held = HeldDelivery::start(&store, "write-bounded").await;
    let plain: Result<i64, Error> = WRITE
        .call("write-bounded")
        .store(bounded)
        .run(async { Ok(2) })
        .await;
    match plain {
        Err(Error::Store(err)) => {
            assert_eq!(err.kind(), StoreErrorKind::Timeout, "{err}");
            assert!(!err.is_ambiguous(), "{err}");
        }
        other => panic!("expected a store timeout, got {other:?}"),
    }
    assert_eq!(held.resume(Ok(1)).await.unwrap(), 1);
    assert_eq!(effects(&pool, "write-bounded").await, 1);
}

/// A plain delivery of a key that a transactional delivery holds, on a pool without a
/// `lock_timeout`.
pub(super) static PLAIN_WRITE: Task = Task::new("pg_write")
    .lock_ttl(Duration::from_secs(20))
    .retry(idempotask::RetryPolicy::no_wait());

/// Backends other than the caller's still running a statement on the store's table.
pub(super) async fn statements_in_flight(pool: &PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity
         WHERE state = 'active' AND pid <> pg_backend_pid() AND query LIKE '%idempotask_units%'",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Whether a backend has finished a release (or a forget) of the store's.
pub(super) async fn release_ran(pool: &PgPool) -> bool {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_stat_activity
                        WHERE state = 'idle' AND query LIKE 'WITH dropped AS%')",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

/// A plain call that gives up on a transaction's row leaves nothing running in the server:
/// once the transaction rolls back, the next delivery runs at once. (A `begin` the client had
/// abandoned used to go on waiting in the server, after the release had found nothing to free,
/// and take the lock for a token nobody held: the next deliveries were `Contended` for the
/// whole lock TTL.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn a_plain_call_that_gave_up_on_a_transactions_row_leaves_no_lock_behind() {
    let server = PostgresServer::start();
    let (store, pool) = setup(&server).await;
    let impatient = PostgresStore::builder(pool.clone())
        .response_timeout(Duration::from_millis(300))
        .connect()
        .await
        .unwrap();
    let held = HeldDelivery::start(&store, "write-abandoned").await;
    let ran = AtomicUsize::new(0);
    let gave_up: Result<i64, Error> = PLAIN_WRITE
        .call("write-abandoned")
        .store(impatient)
        .run(async {
            ran.fetch_add(1, Ordering::SeqCst);
            Ok(2)
        })
        .await;
    let Err(Error::Store(gave_up)) = gave_up else {
        panic!("expected a store timeout, got {gave_up:?}");
    };
    assert_eq!(gave_up.kind(), StoreErrorKind::Timeout, "{gave_up}");
    assert_eq!(ran.load(Ordering::SeqCst), 0);
    if gave_up.is_ambiguous() {
        // The call frees what it may hold in the background; in service, the transaction goes
        // on for longer than that takes.
        while !release_ran(&pool).await {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    assert!(held.resume(Err("declined")).await.is_err());
    // Whatever statement was still waiting on the row has had its chance to take it.
    while lock_waiters(&pool).await > 0 || statements_in_flight(&pool).await > 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let next = PLAIN_WRITE
        .call("write-abandoned")
        .store(store.clone())
        .run_reported(async { Ok::<_, Error>(3_i64) })
        .await;
    match next {
        Ok(report) => {
            assert_eq!(report.outcome, idempotask::Outcome::Executed);
            assert_eq!(report.value, 3);
        }
        Err(err) => panic!("the next delivery could not run: {err}"),
    }
    // The server ended the wait before the client stopped listening, so the first call knew
    // that it had taken nothing.
    assert!(!gave_up.is_ambiguous(), "{gave_up}");
}
