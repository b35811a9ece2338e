//! What is particular to `PostgresStore` and transactional completion: concurrent deliveries
//! from one process and from two, bodies that fail or are dropped inside their transaction, a
//! waiting delivery that replays or runs depending on how the first one ended, a server
//! restart mid-run, and units in doubt: the migration of tables of earlier versions by
//! replicas at once, purge, the operator's reads and resolutions, a takeover inside a
//! transaction that rolls back, a takeover released, and the least-privileged user; journals
//! of steps racing takeovers, resends and purges, and the migration that adds their table;
//! steps inside transactions, recorded outside them.
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

/// Waiters on a busy key keep asking for as long as the slowest holder may take.
static PLAIN_RACE: Task = Task::new("pg_plain_race").retry(
    idempotask::RetryPolicy::new()
        .max_attempts(1000)
        .max_wait(Duration::from_secs(60)),
);

/// One plain delivery of `key` through `store` whose body writes one effect and counts its
/// run; on a busy key it keeps asking.
async fn deliver_plain(
    store: PostgresStore,
    pool: PgPool,
    key: String,
    runs: Arc<AtomicUsize>,
) -> Result<i64, BoxError> {
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
            deliver_plain(
                store.clone(),
                pool.clone(),
                plain_key.clone(),
                Arc::clone(&plain_runs),
            )
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

#[path = "postgres/batches.rs"]
mod batches;
#[path = "postgres/deliveries.rs"]
mod deliveries;
#[path = "postgres/doubt.rs"]
mod doubt;
#[path = "postgres/group_commit.rs"]
mod group_commit;
#[path = "postgres/server.rs"]
mod server;
#[path = "postgres/steps.rs"]
mod steps;
#[path = "postgres/transactional_steps.rs"]
mod transactional_steps;
