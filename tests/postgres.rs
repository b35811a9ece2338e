//! What is particular to `PostgresStore` and transactional completion: concurrent deliveries,
//! bodies that fail or are dropped inside their transaction, a waiting delivery that replays
//! or runs depending on how the first one ended, and a server restart mid-run.
//! (The conformance suite runs in `conformance_postgres.rs`; a worker killed with `kill -9`
//! mid-transaction in the `ledger_transfer` example's test.)

use idempotask_test_support as support;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idempotask::store::{Store, StoreErrorKind, UnitOfWork};
use idempotask::testing::deliver_concurrently;
use idempotask::{Error, PostgresStore, Task};
use sqlx::PgPool;
use sqlx::postgres::PgConnection;
use support::postgres::PostgresServer;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

static CHARGE: Task = Task::new("pg_charge");
static WRITE: Task = Task::new("pg_write");

/// A table of side effects with no constraint: only idempotask keeps it to one row per key.
async fn effects_table(pool: &PgPool) {
    sqlx::raw_sql("CREATE TABLE IF NOT EXISTS effects (key text NOT NULL, value bigint NOT NULL)")
        .execute(pool)
        .await
        .unwrap();
}

async fn write_effect(db: &mut PgConnection, key: &str, value: i64) -> Result<i64, BoxError> {
    sqlx::query("INSERT INTO effects (key, value) VALUES ($1, $2)")
        .bind(key)
        .bind(value)
        .execute(&mut *db)
        .await?;
    Ok(value)
}

async fn effects(pool: &PgPool, key: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM effects WHERE key = $1")
        .bind(key)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// The store and a pool big enough for every delivery to hold a connection at once.
async fn setup(server: &PostgresServer) -> (PostgresStore, PgPool) {
    let pool = server.pool(80).await;
    let builder = PostgresStore::builder(pool.clone());
    builder.migrate().await.unwrap();
    effects_table(&pool).await;
    (builder.connect().await.unwrap(), pool)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_concurrent_deliveries_run_the_body_once() {
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
async fn sixty_four_concurrent_transactional_deliveries_commit_once() {
    let server = PostgresServer::start();
    let (store, pool) = setup(&server).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let results = deliver_concurrently(64, |delivery| {
        let (store, runs) = (store.clone(), Arc::clone(&runs));
        async move {
            let transaction = store.pool().begin().await?;
            WRITE
                .call("write-1")
                .run_in_transaction(&store, transaction, async |db| {
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
async fn an_err_body_writes_nothing_and_the_next_delivery_runs() {
    let server = PostgresServer::start();
    let (store, pool) = setup(&server).await;
    let failed: Result<i64, BoxError> = WRITE
        .call("write-err")
        .run_in_transaction(&store, pool.begin().await.unwrap(), async |db| {
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
        .run_in_transaction(&store, pool.begin().await.unwrap(), async |db| {
            write_effect(db, "write-err", 2).await
        })
        .await;
    assert_eq!(ran.unwrap(), 2);
    assert_eq!(effects(&pool, "write-err").await, 1);
    assert!(store.inspect(&unit).await.unwrap().is_done());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_delivery_rolls_back_and_the_next_one_runs() {
    let server = PostgresServer::start();
    let (store, pool) = setup(&server).await;
    let (inside_tx, inside) = tokio::sync::oneshot::channel();
    let dropped = {
        let store = store.clone();
        let transaction = pool.begin().await.unwrap();
        tokio::spawn(async move {
            WRITE
                .call("write-dropped")
                .run_in_transaction(&store, transaction, async |db| {
                    write_effect(db, "write-dropped", 1).await?;
                    let _ = inside_tx.send(());
                    std::future::pending::<Result<i64, BoxError>>().await
                })
                .await
        })
    };
    inside.await.unwrap();
    dropped.abort();
    assert!(dropped.await.unwrap_err().is_cancelled());
    let ran: Result<i64, BoxError> = WRITE
        .call("write-dropped")
        .run_in_transaction(&store, pool.begin().await.unwrap(), async |db| {
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
async fn lock_waiters(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// A first delivery holds its transaction open; a second one waits on its row. Answers the
/// second delivery's result and whether its body ran, once the first ended as `first_ends`.
async fn second_delivery_after(
    first_ends: Result<i64, &'static str>,
) -> (Result<i64, String>, bool, i64) {
    let server = PostgresServer::start();
    let (store, pool) = setup(&server).await;
    let (inside_tx, inside) = tokio::sync::oneshot::channel();
    let (end_tx, end) = tokio::sync::oneshot::channel::<()>();
    let first = {
        let store = store.clone();
        let transaction = pool.begin().await.unwrap();
        tokio::spawn(async move {
            WRITE
                .call("write-waited")
                .run_in_transaction(&store, transaction, async |db| {
                    write_effect(db, "write-waited", 1).await?;
                    let _ = inside_tx.send(());
                    end.await?;
                    first_ends.map_err(BoxError::from)
                })
                .await
        })
    };
    inside.await.unwrap();
    let second_ran = Arc::new(AtomicUsize::new(0));
    let second = {
        let (store, ran) = (store.clone(), Arc::clone(&second_ran));
        let transaction = pool.begin().await.unwrap();
        tokio::spawn(async move {
            WRITE
                .call("write-waited")
                .run_in_transaction(&store, transaction, async |db| {
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
    end_tx.send(()).unwrap();
    let _ = first.await.unwrap();
    let second = second
        .await
        .unwrap()
        .map_err(|err: BoxError| err.to_string());
    let rows = effects(&pool, "write-waited").await;
    (second, second_ran.load(Ordering::SeqCst) == 1, rows)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_delivery_replays_what_the_first_committed() {
    let (second, ran, rows) = second_delivery_after(Ok(1)).await;
    assert_eq!(second, Ok(1));
    assert!(!ran, "the second delivery ran although the first committed");
    assert_eq!(rows, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_delivery_runs_when_the_first_rolled_back() {
    let (second, ran, rows) = second_delivery_after(Err("declined")).await;
    assert_eq!(second, Ok(2));
    assert!(ran);
    assert_eq!(rows, 1, "only the second delivery's write committed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_table_is_a_configuration_error_naming_the_migration() {
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
    let builder = PostgresStore::builder(pool).table("jobs.units");
    builder.migrate().await.unwrap();
    builder.migrate().await.unwrap();
    assert_eq!(builder.connect().await.unwrap().table(), "jobs.units");
}

/// Deliveries keep coming while the server goes through a fast shutdown and comes back: calls
/// fail closed while it is down, and every unit that committed before is still done after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn committed_units_survive_a_fast_shutdown_restart() {
    const KEYS: usize = 300;
    let mut server = PostgresServer::start();
    let (store, pool) = setup(&server).await;
    let (progress_tx, mut progress) = tokio::sync::watch::channel(0_usize);
    let deliveries = {
        let store = store.clone();
        tokio::spawn(async move {
            let mut committed = BTreeSet::new();
            let mut failed = 0;
            for index in 0..KEYS {
                let key = format!("restart-{index}");
                let delivered: Result<i64, BoxError> = async {
                    let transaction = store.pool().begin().await?;
                    WRITE
                        .call(key.as_str())
                        .run_in_transaction(&store, transaction, async |db| {
                            write_effect(db, &key, 1).await
                        })
                        .await
                }
                .await;
                match delivered {
                    Ok(_) => {
                        committed.insert(key);
                    }
                    Err(_) => failed += 1,
                }
                let _ = progress_tx.send(index + 1);
            }
            (committed, failed)
        })
    };
    progress.wait_for(|done| *done >= KEYS / 3).await.unwrap();
    server = tokio::task::spawn_blocking(move || {
        server.stop();
        server.restart();
        server
    })
    .await
    .unwrap();
    let (committed, failed) = deliveries.await.unwrap();
    assert!(committed.len() >= KEYS / 3, "{} committed", committed.len());
    assert!(
        failed > 0,
        "no delivery met the server down: the restart proved nothing"
    );

    // Every key again, as the queue would redeliver: committed ones replay, the rest run.
    let reran = Arc::new(AtomicUsize::new(0));
    for index in 0..KEYS {
        let key = format!("restart-{index}");
        let ran = Arc::clone(&reran);
        let transaction = store.pool().begin().await.unwrap();
        let again: Result<i64, BoxError> = WRITE
            .call(key.as_str())
            .run_in_transaction(&store, transaction, async |db| {
                ran.fetch_add(1, Ordering::SeqCst);
                assert!(
                    !committed.contains(&key),
                    "{key} committed before and ran again"
                );
                write_effect(db, &key, 1).await
            })
            .await;
        again.unwrap();
    }
    assert_eq!(reran.load(Ordering::SeqCst), KEYS - committed.len());
    let rows: Vec<(String, i64)> =
        sqlx::query_as("SELECT key, count(*) FROM effects GROUP BY key HAVING count(*) <> 1")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert!(rows.is_empty(), "keys written other than once: {rows:?}");
    let written: i64 = sqlx::query_scalar("SELECT count(DISTINCT key) FROM effects")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(written, i64::try_from(KEYS).unwrap());
    drop(server);
}

/// Expired markers and locks count as absent at once; `purge_expired` deletes exactly those
/// rows and leaves the live ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_expired_deletes_expired_rows_only() {
    let server = PostgresServer::start();
    let (store, pool) = setup(&server).await;
    let short = Task::new("pg_short").result_ttl(Duration::from_millis(200));
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
    // Expiry is the behaviour under test: there is no signal to wait for.
    tokio::time::sleep(Duration::from_millis(300)).await;
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
