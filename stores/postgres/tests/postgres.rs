//! What is particular to `PostgresStore` and transactional completion: concurrent deliveries
//! from one process and from two, bodies that fail or are dropped inside their transaction, a
//! waiting delivery that replays or runs depending on how the first one ended, a server
//! restart mid-run, and units in doubt: the migration of tables of earlier versions by
//! replicas at once, purge, the operator's reads and resolutions, a takeover inside a
//! transaction that rolls back, a takeover released, and the least-privileged user.
//! (The conformance suite runs in `conformance_postgres.rs`; a worker killed with `kill -9`
//! mid-transaction in the `ledger_transfer` example's run, in `tests/example_queues.rs`.)

use idempotask_test_support as support;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idempotask::operator::{Marker, Resolution, Resolved};
use idempotask::store::{Begin, Doubt, Fencing, Finish, LockToken};
use idempotask::store::{Store, StoreErrorKind, UnitOfWork};
use idempotask::testing::deliver_concurrently;
use idempotask::{Error, InDoubt, Task};
use idempotask_postgres::PostgresStore;
use idempotask_postgres::operator::UnitState;
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use sqlx::postgres::PgConnection;
use support::postgres::PostgresServer;
use support::workers::{self, Workers};

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

/// One transactional delivery of `key` that writes one effect row and counts its run.
async fn deliver_write(
    store: PostgresStore,
    key: String,
    runs: Arc<AtomicUsize>,
) -> Result<i64, BoxError> {
    let transaction = store.pool().begin().await?;
    WRITE
        .call(key.as_str())
        .run_in_transaction(store.transaction(transaction), async |db| {
            runs.fetch_add(1, Ordering::SeqCst);
            write_effect(db, &key, 1).await
        })
        .await
}

async fn effects(pool: &PgPool, key: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM effects WHERE key = $1")
        .bind(key)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Asserts that the effects table holds `keys` keys, each written once.
async fn assert_each_key_written_once(pool: &PgPool, keys: usize) {
    let rows: Vec<(String, i64)> =
        sqlx::query_as("SELECT key, count(*) FROM effects GROUP BY key HAVING count(*) <> 1")
            .fetch_all(pool)
            .await
            .unwrap();
    assert!(rows.is_empty(), "keys written other than once: {rows:?}");
    let written: i64 = sqlx::query_scalar("SELECT count(DISTINCT key) FROM effects")
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(written, i64::try_from(keys).unwrap());
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
async fn an_err_body_writes_nothing_and_the_next_delivery_runs() {
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
async fn a_dropped_delivery_rolls_back_and_the_next_one_runs() {
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

/// A transactional delivery of `key` held open: it wrote one effect inside its transaction and
/// waits until [`resume`](Self::resume) tells it how to end.
struct HeldDelivery {
    resume: tokio::sync::oneshot::Sender<Result<i64, &'static str>>,
    delivery: tokio::task::JoinHandle<Result<i64, BoxError>>,
}

impl HeldDelivery {
    /// Starts the delivery and returns once it is inside its transaction.
    async fn start(store: &PostgresStore, key: &'static str) -> Self {
        let (inside_tx, inside) = tokio::sync::oneshot::channel();
        let (resume, ends) = tokio::sync::oneshot::channel::<Result<i64, &'static str>>();
        let store = store.clone();
        let transaction = store.pool().begin().await.unwrap();
        let delivery = tokio::spawn(async move {
            WRITE
                .call(key)
                .run_in_transaction(store.transaction(transaction), async |db| {
                    write_effect(db, key, 1).await?;
                    let _ = inside_tx.send(());
                    ends.await?.map_err(BoxError::from)
                })
                .await
        });
        inside.await.unwrap();
        Self { resume, delivery }
    }

    /// Lets the body return `ends`; answers how the delivery ended.
    async fn resume(self, ends: Result<i64, &'static str>) -> Result<i64, BoxError> {
        self.resume.send(ends).unwrap();
        self.delivery.await.unwrap()
    }
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
async fn committed_units_survive_a_fast_shutdown_restart() {
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
async fn purge_expired_deletes_expired_rows_only() {
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

/// Waiters on a busy key keep asking for as long as the slowest holder may take.
static PLAIN_RACE: Task = Task::new("pg_plain_race").retry(
    idempotask::RetryPolicy::new()
        .max_attempts(1000)
        .max_wait(Duration::from_secs(60)),
);

const PROCESSES: usize = 2;
const KEYS: usize = 25;
const DELIVERIES_PER_KEY: usize = 64;

/// What a worker process is told: where PostgreSQL is.
#[derive(Serialize, Deserialize)]
struct WorkerConfig {
    url: String,
}

/// What a worker process ran: bodies executed through the plain store and in transactions.
#[derive(Debug, Serialize, Deserialize)]
struct WorkerReport {
    plain_executions: usize,
    transactional_executions: usize,
    deliveries: usize,
}

/// Two processes, started together, each deliver every one of 25 keys 64 times at once, through
/// the plain store and in transactions: 25 executions each way in all, one row per key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_deliver_25_keys_64_times_and_each_runs_once() {
    let server = PostgresServer::start();
    let (_store, pool) = setup(&server).await;
    let mut processes = Workers::spawn(
        PROCESSES,
        "postgres_worker",
        &WorkerConfig { url: server.url() },
    );
    processes.start_together(Duration::from_secs(60)).await;
    let reports: Vec<WorkerReport> = processes.reports(Duration::from_secs(300)).await;
    let sum = |count: fn(&WorkerReport) -> usize| reports.iter().map(count).sum::<usize>();
    assert_eq!(
        sum(|r| r.deliveries),
        PROCESSES * KEYS * DELIVERIES_PER_KEY * 2,
        "{reports:?}"
    );
    assert_eq!(sum(|r| r.plain_executions), KEYS, "{reports:?}");
    assert_eq!(sum(|r| r.transactional_executions), KEYS, "{reports:?}");
    assert_each_key_written_once(&pool, KEYS * 2).await;
}

/// The worker side of the test above; does nothing when run as an ordinary test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_worker() {
    let Some(config) = workers::config::<WorkerConfig>() else {
        return;
    };
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(24)
        .connect(&config.url)
        .await
        .unwrap();
    // Two workers and the test's own pool share the server's 100 connections.
    let store = PostgresStore::builder(pool.clone())
        .max_connections(8)
        .connect()
        .await
        .unwrap();
    workers::wait_for_start().await;
    let plain_runs = Arc::new(AtomicUsize::new(0));
    let transactional_runs = Arc::new(AtomicUsize::new(0));
    let mut deliveries = 0;
    for key in 0..KEYS {
        let plain_key = format!("plain-{key}");
        let done = deliver_concurrently(DELIVERIES_PER_KEY, |_| {
            let (store, pool, runs, key) = (
                store.clone(),
                pool.clone(),
                Arc::clone(&plain_runs),
                plain_key.clone(),
            );
            async move {
                PLAIN_RACE
                    .call(key.as_str())
                    .store(store)
                    // sqlx's acquire future is large; boxed, the call's future stays small.
                    .run(Box::pin(async {
                        runs.fetch_add(1, Ordering::SeqCst);
                        let mut db = pool.acquire().await?;
                        write_effect(&mut db, &key, 1).await
                    }))
                    .await
            }
        })
        .await;
        for result in done {
            let _: i64 = result.unwrap();
            deliveries += 1;
        }
        let tx_key = format!("transactional-{key}");
        let done = deliver_concurrently(DELIVERIES_PER_KEY, |_| {
            deliver_write(
                store.clone(),
                tx_key.clone(),
                Arc::clone(&transactional_runs),
            )
        })
        .await;
        for result in done {
            let _: i64 = result.unwrap();
            deliveries += 1;
        }
    }
    workers::report(&WorkerReport {
        plain_executions: plain_runs.load(Ordering::SeqCst),
        transactional_executions: transactional_runs.load(Ordering::SeqCst),
        deliveries,
    });
}

/// A transactional delivery that meets a plain call's lock gives up at once and rolls back, so
/// whatever row lock its statement took cannot keep the plain holder from recording its result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transactional_delivery_meeting_a_plain_holder_is_contended_and_lets_it_finish() {
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

/// "Keep it for ever" (`Duration::MAX`) is stored as about a century, on both paths, and
/// fencing tokens start at the clock in microseconds, like the Redis stores'.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_ttls_are_kept_long_and_fencing_tokens_follow_the_clock() {
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

/// Whatever `lock_timeout` the pool's connections have (here `0`: none), a plain call that
/// meets a transaction's uncommitted row gives up in the server at four fifths of the store's
/// response timeout, as a timeout that is not ambiguous, and nothing runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_wait_on_a_transaction_ends_in_the_server_whatever_the_pool_says() {
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

/// Replicas that deploy together each run the migration at once on a fresh database: every
/// one succeeds (`CREATE … IF NOT EXISTS` alone fails with `23505` under concurrency).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn six_replicas_migrating_at_once_all_succeed() {
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
async fn a_wait_for_a_pooled_connection_is_a_timeout_that_sent_nothing() {
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

/// A plain delivery of a key that a transactional delivery holds, on a pool without a
/// `lock_timeout`.
static PLAIN_WRITE: Task = Task::new("pg_write")
    .lock_ttl(Duration::from_secs(20))
    .retry(idempotask::RetryPolicy::no_wait());

/// Backends other than the caller's still running a statement on the store's table.
async fn statements_in_flight(pool: &PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity
         WHERE state = 'active' AND pid <> pg_backend_pid() AND query LIKE '%idempotask_units%'",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Whether a backend has finished a release (or a forget) of the store's.
async fn release_ran(pool: &PgPool) -> bool {
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
async fn a_plain_call_that_gave_up_on_a_transactions_row_leaves_no_lock_behind() {
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

static POOL_BODIES: Task = Task::new("pg_pool_bodies");

/// Bodies that hold connections of the application's pool do not keep the store from
/// beginning and recording: the store's statements run on connections of their own. The
/// scenario, scaled down: a pool of 2, 40 keys delivered twice at once, each body holding a
/// pooled connection for 100 ms, so that the bodies keep the pool busy four times as long as
/// the store's response timeout. (Sharing the pool, the store's statements queued behind the
/// bodies: every duplicate failed, its `begin` finding no free connection in time, and a
/// `finish` that could not get one before the lock expired left the work to run again.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_holding_the_pool_do_not_keep_the_store_from_recording() {
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
async fn client_backends(observer: &PgPool) -> i64 {
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
async fn the_stores_pool_holds_a_few_connections_whatever_the_applications_size() {
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
async fn a_server_with_no_room_for_the_stores_connections_is_a_retryable_refusal_that_says_so() {
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

/// The table and sequence as versions before units in doubt created them.
const EARLIER_SCHEMA: &str = "
CREATE TABLE idempotask_units (
    task       text        NOT NULL,
    key        bytea       NOT NULL,
    state      text        NOT NULL CHECK (state IN ('locked', 'done')),
    token      text,
    fence      bigint,
    marker     bytea,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (task, key)
);
CREATE SEQUENCE idempotask_units_fence;
";

/// A lock row as an earlier version writes it (no `doubt_memory`), expiring `expires_in` from
/// now on the server's clock (negative: already lapsed).
async fn earlier_lock(pool: &PgPool, key: &str, expires_in: &str) {
    sqlx::query(
        "INSERT INTO idempotask_units (task, key, state, token, fence, marker, expires_at)
         VALUES ('pg_doubt', $1, 'locked', md5($1), NULL, NULL, now() + $2::interval)",
    )
    .bind(key.as_bytes())
    .bind(expires_in)
    .execute(pool)
    .await
    .unwrap();
}

/// A token that asks for its lock to be remembered a minute after it ran out.
fn remembered() -> LockToken {
    LockToken::generate().with_doubt_memory(Duration::from_secs(60))
}

/// What `begin` answers for `key` of `pg_doubt` to a token that would take a unit in doubt over:
/// whether it was acquired, and what it knew of a doubt.
async fn begin_doubt(store: &PostgresStore, key: &str) -> (bool, Option<Doubt>) {
    let unit = UnitOfWork::new("pg_doubt", key).unwrap();
    match store
        .begin(&unit, &remembered(), Duration::from_secs(30), Fencing::Off)
        .await
        .unwrap()
    {
        Begin::Acquired { in_doubt, .. } => (true, in_doubt.map(|doubt| *doubt)),
        _ => (false, None),
    }
}

/// The columns that versions after the first added to the table.
const ADDED_COLUMNS: [&str; 3] = ["doubt_memory", "doubt_earlier_fence", "doubt_expired_for"];

/// Six replicas migrate the table at once: each migration succeeds, and the table ends with
/// each column of this version once.
async fn migrate_at_once(pool: &PgPool) {
    let migrations: Vec<_> = (0..6)
        .map(|_| {
            let builder = PostgresStore::builder(pool.clone());
            tokio::spawn(async move { builder.migrate().await })
        })
        .collect();
    for migration in migrations {
        migration.await.unwrap().unwrap();
    }
    for column in ADDED_COLUMNS {
        let columns: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_attribute
             WHERE attrelid = 'idempotask_units'::regclass AND attname = $1
               AND NOT attisdropped",
        )
        .bind(column)
        .fetch_one(pool)
        .await
        .unwrap();
        assert_eq!(columns, 1, "{column}");
    }
}

/// Replicas of the new version deploy onto a table of the previous one that holds locks its
/// replicas wrote, and all migrate at once: every migration succeeds, the column is added once,
/// the replicas of the previous version go on writing, and a lock that ran out with no memory
/// (`NULL`: every row from before) is free, not in doubt, whether it ran out before the
/// migration or after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_migrating_an_earlier_table_at_once_leave_its_lapsed_locks_free_not_in_doubt() {
    let server = PostgresServer::start();
    let pool = server.pool(12).await;
    sqlx::raw_sql(EARLIER_SCHEMA).execute(&pool).await.unwrap();
    earlier_lock(&pool, "lapsed-before", "-1 second").await;
    earlier_lock(&pool, "held-across", "2 seconds").await;
    // This version refuses the earlier table until it is migrated, and says how.
    let err = PostgresStore::builder(pool.clone())
        .connect()
        .await
        .unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Configuration, "{err}");
    assert!(err.to_string().contains("PostgresStore::migrate"), "{err}");

    migrate_at_once(&pool).await;
    // A replica of the previous version names only the columns it knows.
    earlier_lock(&pool, "lapsed-after", "-1 second").await;

    let store = PostgresStore::builder(pool.clone())
        .connect()
        .await
        .unwrap();
    for key in ["lapsed-before", "lapsed-after"] {
        let seen = store
            .inspect(&UnitOfWork::new("pg_doubt", key).unwrap())
            .await
            .unwrap();
        assert_eq!(seen, idempotask::store::Inspection::empty(), "{key}");
        assert_eq!(begin_doubt(&store, key).await, (true, None), "{key}");
    }
    let held = UnitOfWork::new("pg_doubt", "held-across").unwrap();
    assert!(store.inspect(&held).await.unwrap().is_locked());
    assert_eq!(begin_doubt(&store, "held-across").await, (false, None));
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while store.inspect(&held).await.unwrap().is_locked() {
        assert!(std::time::Instant::now() < deadline, "never ran out");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(store.inspect(&held).await.unwrap().in_doubt.is_none());
    assert_eq!(begin_doubt(&store, "held-across").await, (true, None));
}

/// A table as the version before takeovers kept their doubt created it: `doubt_memory`, and
/// not the doubt a takeover found.
const DOUBT_MEMORY_SCHEMA: &str = "
CREATE TABLE idempotask_units (
    task       text        NOT NULL,
    key        bytea       NOT NULL,
    state      text        NOT NULL CHECK (state IN ('locked', 'done')),
    token      text,
    fence      bigint,
    marker     bytea,
    expires_at timestamptz NOT NULL,
    doubt_memory interval,
    PRIMARY KEY (task, key)
);
CREATE SEQUENCE idempotask_units_fence;
SELECT setval('idempotask_units_fence', 1000);
";

/// Replicas deploy onto a table of the version before takeovers kept their doubt, which holds
/// a unit in doubt, and all migrate at once: the table is refused until then, every migration
/// succeeds and adds the columns once, the unit is still in doubt, a replica of that version
/// still writes, and the delivery that takes the unit over carries its doubt: asked again, it
/// answers it, and released, it leaves the unit in doubt for the next one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_migrating_a_table_of_the_previous_version_keep_its_units_in_doubt() {
    let server = PostgresServer::start();
    let pool = server.pool(12).await;
    sqlx::raw_sql(DOUBT_MEMORY_SCHEMA)
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO idempotask_units
             (task, key, state, token, fence, marker, expires_at, doubt_memory)
         VALUES ('pg_doubt', 'lapsed-before', 'locked', 'before', 17, NULL,
                 now() - interval '1 second', interval '1 minute')",
    )
    .execute(&pool)
    .await
    .unwrap();
    let err = PostgresStore::builder(pool.clone())
        .connect()
        .await
        .unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Configuration, "{err}");
    assert!(err.to_string().contains("PostgresStore::migrate"), "{err}");

    migrate_at_once(&pool).await;
    // A replica of the previous version names only the columns it knows.
    sqlx::query(
        "INSERT INTO idempotask_units
             (task, key, state, token, fence, marker, expires_at, doubt_memory)
         VALUES ('pg_doubt', 'written-after', 'locked', 'after', NULL, NULL,
                 now() + interval '1 minute', interval '1 minute')",
    )
    .execute(&pool)
    .await
    .unwrap();

    let store = PostgresStore::builder(pool.clone())
        .connect()
        .await
        .unwrap();
    let unit = UnitOfWork::new("pg_doubt", "lapsed-before").unwrap();
    let seen = store.inspect(&unit).await.unwrap();
    assert_eq!(
        seen.in_doubt.and_then(|doubt| doubt.fencing_token),
        Some(17)
    );
    let token = remembered();
    let takeover = store
        .begin(&unit, &token, Duration::from_secs(30), Fencing::On)
        .await
        .unwrap();
    let Begin::Acquired {
        fencing_token: Some(granted),
        in_doubt: Some(doubt),
        ..
    } = takeover.clone()
    else {
        panic!("expected the unit taken over in doubt, got {takeover:?}");
    };
    assert_eq!(doubt.fencing_token, Some(17));
    assert!(granted > 17);
    let again = store
        .begin(&unit, &token, Duration::from_secs(30), Fencing::On)
        .await
        .unwrap();
    assert_eq!(
        again, takeover,
        "a repeated begin answers the doubt taken over"
    );
    assert!(
        store
            .release(&unit, &token.clone().granted(Some(granted)))
            .await
            .unwrap()
    );
    let seen = store.inspect(&unit).await.unwrap();
    assert!(!seen.is_locked(), "{seen:?}");
    assert_eq!(
        seen.in_doubt.and_then(|doubt| doubt.fencing_token),
        Some(granted)
    );
    let after = UnitOfWork::new("pg_doubt", "written-after").unwrap();
    assert!(store.inspect(&after).await.unwrap().is_locked());
}

/// Every replica migrates at each deploy. On a table that is up to date, the migration takes
/// no lock on the table, so it neither waits for a long transaction that touched the table nor
/// makes the store's statements queue behind it (`ALTER TABLE … ADD COLUMN IF NOT EXISTS`
/// takes `ACCESS EXCLUSIVE` even when the column is there).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrating_an_up_to_date_table_does_not_wait_for_open_transactions() {
    let server = PostgresServer::start();
    let (store, pool) = setup(&server).await;
    let mut open = pool.begin().await.unwrap();
    let _: i64 = sqlx::query_scalar("SELECT count(*) FROM idempotask_units")
        .fetch_one(&mut *open)
        .await
        .unwrap();
    let migrated = tokio::time::timeout(
        Duration::from_secs(20),
        PostgresStore::builder(pool.clone()).migrate(),
    )
    .await;
    assert!(
        matches!(migrated, Ok(Ok(()))),
        "the migration waited for an open transaction: {migrated:?}"
    );
    let ran: u8 = Task::new("pg_migrated_twice")
        .call("k")
        .store(store)
        .run(async { Ok::<_, Error>(1) })
        .await
        .unwrap();
    assert_eq!(ran, 1);
    open.rollback().await.unwrap();
}

/// Waits until `unit`'s lock has run out on the server's clock.
async fn until_lapsed(store: &PostgresStore, unit: &UnitOfWork) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while store.inspect(unit).await.unwrap().is_locked() {
        assert!(
            std::time::Instant::now() < deadline,
            "the lock never ran out"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A unit in doubt is kept by `purge_expired` (a lock that ran out with no memory is not),
/// shows in the operator's reads, and survives a transactional takeover that rolled back: the
/// body saw the doubt, its write is gone, and the next delivery is told again. A `Hold` task
/// inside a transaction leaves it alone; a delivery that commits settles it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unit_in_doubt_survives_purge_and_a_rolled_back_takeover_and_shows_to_operators() {
    let server = PostgresServer::start();
    let (store, pool) = setup(&server).await;
    let short = Duration::from_millis(200);
    let unit = UnitOfWork::new("pg_write", "doubt-tx").unwrap();
    let forgotten = UnitOfWork::new("pg_write", "no-memory").unwrap();
    let fence = match store
        .begin(&unit, &remembered(), short, Fencing::On)
        .await
        .unwrap()
    {
        Begin::Acquired {
            fencing_token: Some(fence),
            in_doubt: None,
            ..
        } => fence,
        other => panic!("expected a fresh fenced lock, got {other:?}"),
    };
    store
        .begin(&forgotten, &LockToken::generate(), short, Fencing::Off)
        .await
        .unwrap();
    until_lapsed(&store, &unit).await;
    until_lapsed(&store, &forgotten).await;

    assert_eq!(store.purge_expired().await.unwrap(), 1);
    let seen = store.inspect(&unit).await.unwrap();
    assert_eq!(
        seen.in_doubt.and_then(|doubt| doubt.fencing_token),
        Some(fence)
    );
    match store.read_unit(&unit).await.unwrap().map(|row| row.state) {
        Some(UnitState::InDoubt {
            fencing_token,
            expired_for,
            ..
        }) => {
            assert_eq!(fencing_token, Some(fence));
            assert!(expired_for < Duration::from_secs(60), "{expired_for:?}");
        }
        other => panic!("expected the unit in doubt, got {other:?}"),
    }
    let listed = store.list_task("pg_write", None, 10).await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert!(matches!(listed[0].state, UnitState::InDoubt { .. }));

    // Taken over inside a transaction that rolls back: the unit is in doubt again.
    let seen_by_body = Arc::new(std::sync::Mutex::new(None));
    let failed: Result<i64, BoxError> = WRITE
        .call("doubt-tx")
        .run_in_transaction(store.transaction(pool.begin().await.unwrap()), {
            let seen_by_body = Arc::clone(&seen_by_body);
            async move |db| {
                *seen_by_body.lock().unwrap() = idempotask::context().and_then(|c| c.in_doubt());
                write_effect(db, "doubt-tx", 1).await?;
                Err("the ledger said no".into())
            }
        })
        .await;
    assert!(failed.is_err());
    let told = seen_by_body.lock().unwrap().take();
    assert_eq!(told.and_then(|doubt| doubt.fencing_token), Some(fence));
    assert_eq!(effects(&pool, "doubt-tx").await, 0);
    let again = store.inspect(&unit).await.unwrap().in_doubt;
    assert_eq!(again.and_then(|doubt| doubt.fencing_token), Some(fence));

    // A `Hold` task writes nothing, inside a transaction too.
    let held: Result<i64, BoxError> = Task::new("pg_write")
        .in_doubt(InDoubt::Hold)
        .call("doubt-tx")
        .run_in_transaction(store.transaction(pool.begin().await.unwrap()), async |db| {
            write_effect(db, "doubt-tx", 2).await
        })
        .await;
    let err = held.unwrap_err();
    assert!(
        matches!(err.downcast_ref::<Error>(), Some(Error::InDoubt { .. })),
        "{err}"
    );
    assert!(store.inspect(&unit).await.unwrap().in_doubt.is_some());

    // A delivery that commits settles it, told of the doubt.
    let report = WRITE
        .call("doubt-tx")
        .run_in_transaction(store.transaction(pool.begin().await.unwrap()), async |db| {
            let told = idempotask::context().and_then(|c| c.in_doubt()).is_some();
            write_effect(db, "doubt-tx", i64::from(told)).await
        })
        .await;
    assert_eq!(report.unwrap(), 1, "the committing body was not told");
    assert!(store.inspect(&unit).await.unwrap().is_done());
    assert_eq!(effects(&pool, "doubt-tx").await, 1);
}

/// The holder of a lock that ran out, which nobody took over, renews it: the lock and its
/// memory are set again from the token, and its finish completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_holder_of_a_lapsed_lock_renews_it_with_its_memory_and_finishes() {
    let server = PostgresServer::start();
    let (store, pool) = setup(&server).await;
    let unit = UnitOfWork::new("pg_doubt", "renewed").unwrap();
    let token = LockToken::generate().with_doubt_memory(Duration::from_secs(30));
    store
        .begin(&unit, &token, Duration::from_millis(200), Fencing::Off)
        .await
        .unwrap();
    until_lapsed(&store, &unit).await;
    assert!(store.inspect(&unit).await.unwrap().in_doubt.is_some());
    let renewed = token.clone().with_doubt_memory(Duration::from_secs(90));
    assert!(
        store
            .renew(&unit, &renewed, Duration::from_secs(30))
            .await
            .unwrap()
    );
    let memory: f64 = sqlx::query_scalar(
        "SELECT extract(epoch FROM doubt_memory)::float8 FROM idempotask_units WHERE task = 'pg_doubt'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!((memory - 90.0).abs() < f64::EPSILON, "{memory}");
    let seen = store.inspect(&unit).await.unwrap();
    assert!(seen.is_locked() && seen.in_doubt.is_none(), "{seen:?}");
    // A store sees a marker as bytes; these are laid out as a real one is.
    let marker = format!(r#"D{}|{}|"1""#, unit.key().len(), unit.key()).into_bytes();
    assert_eq!(
        store
            .finish(&unit, &token, &marker, Duration::from_secs(60))
            .await
            .unwrap(),
        Finish::Completed
    );
}

/// The rights the deployment notes give the store's user, and no more: it connects, takes a
/// unit in doubt over with a new fencing token, and purges.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_least_privileged_user_takes_units_in_doubt_over() {
    let server = PostgresServer::start();
    let owner = server.pool(2).await;
    PostgresStore::builder(owner.clone())
        .migrate()
        .await
        .unwrap();
    sqlx::raw_sql(
        "CREATE ROLE app LOGIN;
         GRANT SELECT, INSERT, UPDATE, DELETE ON idempotask_units TO app;
         GRANT USAGE, SELECT ON SEQUENCE idempotask_units_fence TO app;",
    )
    .execute(&owner)
    .await
    .unwrap();
    let url = server
        .url()
        .replace("postgres://postgres@", "postgres://app@");
    let store = PostgresStore::connect(&url).await.unwrap();
    let unit = UnitOfWork::new("pg_doubt", "least-privilege").unwrap();
    let first = store
        .begin(
            &unit,
            &remembered(),
            Duration::from_millis(200),
            Fencing::On,
        )
        .await
        .unwrap();
    let Begin::Acquired {
        fencing_token: Some(first),
        ..
    } = first
    else {
        panic!("expected a fenced lock, got {first:?}");
    };
    until_lapsed(&store, &unit).await;
    let token = remembered();
    let next = match store
        .begin(&unit, &token, Duration::from_secs(30), Fencing::On)
        .await
        .unwrap()
    {
        Begin::Acquired {
            fencing_token: Some(next),
            in_doubt: Some(doubt),
            ..
        } => {
            assert_eq!(doubt.fencing_token, Some(first));
            assert!(next > first);
            next
        }
        other => panic!("expected the unit taken over in doubt, got {other:?}"),
    };
    // Released, the takeover leaves the unit in doubt: an `UPDATE`, no more rights.
    assert!(store.release(&unit, &token).await.unwrap());
    let seen = store.inspect(&unit).await.unwrap().in_doubt;
    assert_eq!(seen.and_then(|doubt| doubt.fencing_token), Some(next));
    // The operator's resolution needs no more rights than the store's statements.
    let freed = UnitOfWork::new("pg_doubt", "least-privilege-freed").unwrap();
    let holder = in_doubt(&store, &freed, Fencing::On).await;
    assert_eq!(free(&store, &freed, &holder).await, Resolved::Freed);
    store.purge_expired().await.unwrap();
}

/// Leaves `unit` in doubt: a lock of 100 ms, remembered for a minute, left to run out.
/// Answers its holder's token, as granted.
async fn in_doubt(store: &PostgresStore, unit: &UnitOfWork, fencing: Fencing) -> LockToken {
    let token = remembered();
    let Begin::Acquired {
        fencing_token,
        in_doubt: None,
        ..
    } = store
        .begin(unit, &token, Duration::from_millis(100), fencing)
        .await
        .unwrap()
    else {
        panic!("{unit:?} was not free");
    };
    until_lapsed(store, unit).await;
    token.granted(fencing_token)
}

/// Resolves `unit` if it is still in doubt with the lock of the token `shown`; answers what
/// that did.
async fn resolve(
    store: &PostgresStore,
    unit: &UnitOfWork,
    shown: &LockToken,
    resolution: &Resolution,
) -> Resolved {
    let resolved = store.resolve_exact(unit, shown.as_str(), resolution);
    resolved.await.unwrap()
}

/// Frees `unit` if it is still in doubt with `holder`'s lock; answers what that did.
async fn free(store: &PostgresStore, unit: &UnitOfWork, holder: &LockToken) -> Resolved {
    resolve(store, unit, holder, &Resolution::Free).await
}

/// The row of `key` of `pg_doubt` as it is stored: `(state, token, fence)`.
async fn raw_row(pool: &PgPool, key: &str) -> Option<(String, Option<String>, Option<i64>)> {
    sqlx::query_as(
        "SELECT state, token, fence FROM idempotask_units WHERE task = 'pg_doubt' AND key = $1",
    )
    .bind(key.as_bytes())
    .fetch_optional(pool)
    .await
    .unwrap()
}

/// How long the markers of the resolution tests are kept.
const DAY: Duration = Duration::from_secs(24 * 60 * 60);

/// Records `{"charge":"ch_1"}` as `unit`'s result, with the fencing token `fence`, for a day.
fn record(unit: &UnitOfWork, fence: Option<u64>) -> Resolution {
    let result =
        serde_json::value::RawValue::from_string(r#"{"charge":"ch_1"}"#.to_owned()).unwrap();
    Resolution::record(Marker::encode_resolution(unit, fence, &result), DAY)
}

/// `resolve_exact` records a result only over the lock in doubt it was shown: a marker written
/// for another key, or a token that is not the row's, writes nothing. The marker keeps the
/// row's fencing counter, as a finish does, and a second resolution finds it changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resolve_exact_records_only_over_the_lock_in_doubt_it_was_shown() {
    let server = PostgresServer::start();
    let (store, pool) = setup(&server).await;
    let unit = UnitOfWork::new("pg_doubt", "recorded").unwrap();

    // What the operator is shown: the holder's token, the lapse and the memory left.
    let holder = in_doubt(&store, &unit, Fencing::On).await;
    let fence = holder.fencing_token();
    let Some(UnitState::InDoubt {
        token,
        fencing_token,
        expired_for,
        forgotten_in,
        ..
    }) = store.read_unit(&unit).await.unwrap().map(|row| row.state)
    else {
        panic!("expected the unit in doubt");
    };
    assert_eq!((token.as_str(), fencing_token), (holder.as_str(), fence));
    assert!(expired_for < Duration::from_secs(30), "{expired_for:?}");
    assert!(
        forgotten_in > Duration::from_secs(30) && forgotten_in <= Duration::from_secs(60),
        "remembered a minute after it ran out: {forgotten_in:?}"
    );

    let other = UnitOfWork::new("pg_doubt", "other").unwrap();
    let refused = store
        .resolve_exact(&unit, &token, &record(&other, fence))
        .await
        .unwrap_err();
    assert_eq!(refused.kind(), StoreErrorKind::Configuration, "{refused}");
    let not_the_holder = remembered();
    let changed = resolve(&store, &unit, &not_the_holder, &record(&unit, fence)).await;
    assert_eq!(changed, Resolved::Changed);
    assert!(store.inspect(&unit).await.unwrap().in_doubt.is_some());

    let resolution = record(&unit, fence);
    // The token shown, as read.
    let record_shown = || store.resolve_exact(&unit, &token, &resolution);
    assert_eq!(record_shown().await.unwrap(), Resolved::Recorded);
    match store.read_unit(&unit).await.unwrap().map(|row| row.state) {
        Some(UnitState::Done { marker, ttl, .. }) => {
            assert_eq!(Marker::decode(&marker).unwrap().fencing_token(), fence);
            assert!(ttl > DAY / 2 && ttl <= DAY, "{ttl:?}");
        }
        other => panic!("expected the marker, got {other:?}"),
    }
    let kept = raw_row(&pool, "recorded").await.and_then(|row| row.2);
    assert_eq!(kept.map(i64::unsigned_abs), fence);
    assert_eq!(
        record_shown().await.unwrap(),
        Resolved::Changed,
        "the row holds the marker now"
    );
}

/// `resolve_exact` frees only a lock still in doubt: a fenced unit's row keeps its counter, as
/// a release leaves it, and an unfenced unit's row goes; a lock its holder renewed is left
/// alone (and its finish completes), and a unit whose memory ran out is free already.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resolve_exact_frees_only_a_lock_still_in_doubt() {
    let server = PostgresServer::start();
    let (store, pool) = setup(&server).await;
    let unit = |key: &str| UnitOfWork::new("pg_doubt", key).unwrap();

    for (key, fencing) in [("freed-fenced", Fencing::On), ("freed", Fencing::Off)] {
        let freed = unit(key);
        let holder = in_doubt(&store, &freed, fencing).await;
        assert_eq!(
            free(&store, &freed, &holder).await,
            Resolved::Freed,
            "{key}"
        );
        assert_eq!(store.read_unit(&freed).await.unwrap(), None, "{key}");
        let row = raw_row(&pool, key).await;
        match fencing {
            Fencing::On => assert!(
                matches!(&row, Some((locked, None, Some(counter)))
                    if locked == "locked" && Some(counter.unsigned_abs()) == holder.fencing_token()),
                "{row:?}"
            ),
            _ => assert_eq!(row, None),
        }
        assert_eq!(free(&store, &freed, &holder).await, Resolved::Gone, "{key}");
    }

    let renewed = unit("renewed");
    let holder = in_doubt(&store, &renewed, Fencing::On).await;
    assert!(store.renew(&renewed, &holder, DAY).await.unwrap());
    assert_eq!(free(&store, &renewed, &holder).await, Resolved::Changed);
    let Resolution::Record { marker, .. } = record(&renewed, holder.fencing_token()) else {
        unreachable!()
    };
    assert_eq!(
        store.finish(&renewed, &holder, &marker, DAY).await.unwrap(),
        Finish::Completed
    );

    let lapsed = unit("lapsed");
    let short_memory = LockToken::generate().with_doubt_memory(Duration::from_millis(100));
    store
        .begin(
            &lapsed,
            &short_memory,
            Duration::from_millis(100),
            Fencing::Off,
        )
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while store.read_unit(&lapsed).await.unwrap().is_some() {
        assert!(std::time::Instant::now() < deadline, "never forgotten");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let gone = resolve(&store, &lapsed, &short_memory, &record(&lapsed, None)).await;
    assert_eq!(gone, Resolved::Gone);
    assert_eq!(
        raw_row(&pool, "lapsed").await.map(|row| row.0),
        Some("locked".to_owned()),
        "the lapsed row, untouched until the purge"
    );
}

/// Operators resolving a unit in doubt while deliveries take it over, all at once, several
/// times over: exactly one of them settles it. A recording wins once, and the deliveries that
/// follow find its marker; or a delivery takes it over, and every resolution finds it changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn resolutions_racing_takeovers_settle_the_unit_once() {
    let server = PostgresServer::start();
    let (store, _pool) = setup(&server).await;
    for round in 0..20 {
        let unit = UnitOfWork::new("pg_doubt", format!("race-{round}")).unwrap();
        let holder = in_doubt(&store, &unit, Fencing::On).await;
        let mut racing = tokio::task::JoinSet::new();
        for racer in 0..8 {
            let (store, unit, holder) = (store.clone(), unit.clone(), holder.clone());
            racing.spawn(async move {
                if racer % 2 == 0 {
                    let resolution = record(&unit, holder.fencing_token());
                    let resolved = store.resolve_exact(&unit, holder.as_str(), &resolution);
                    resolved.await.unwrap() == Resolved::Recorded
                } else {
                    let token = remembered();
                    let begun = store.begin(&unit, &token, DAY, Fencing::On).await.unwrap();
                    matches!(
                        begun,
                        Begin::Acquired {
                            in_doubt: Some(_),
                            ..
                        }
                    )
                }
            });
        }
        let winners = racing
            .join_all()
            .await
            .into_iter()
            .filter(|won| *won)
            .count();
        assert_eq!(winners, 1, "round {round}");
    }
}
