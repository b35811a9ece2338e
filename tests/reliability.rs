//! The reliability suite: faults injected for real into a server the test started, and what
//! must hold under each. One module per family of faults; the scenarios with several processes
//! stay here, next to the worker this binary re-runs itself as. Every scenario records its
//! figures (see `support::report`); `scripts/reliability.sh` collects them into
//! `docs/reliability.md`.
//!
//! Short TTLs (0.3–2 s) keep the whole suite within a few minutes.

use idempotask_test_support as support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use idempotask::store::{
    Begin, Fencing, LockToken, SharedStore, Store, StoreErrorKind, UnitOfWork,
};
use idempotask::{Error, Outcome, RetryPolicy, Task};
use idempotask_redis::RedisStore;
use serde::{Deserialize, Serialize};
use support::proxy::Proxy;
use support::report::record;
use support::workers::{self, Worker, Workers};
use support::{Flavor, RedisServer, scan_keys};

#[path = "reliability/gate.rs"]
mod gate;

/// The pause between redeliveries of `support::deliver_until_done`.
const RETRY_PAUSE: Duration = Duration::from_millis(20);

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
        Flavor::Redis8 => record(&format!("{scenario}, Redis 8.2"), figures),
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

#[path = "reliability/bad_input.rs"]
mod bad_input;
#[path = "reliability/deliveries.rs"]
mod deliveries;
#[path = "reliability/network.rs"]
mod network;
#[path = "reliability/security.rs"]
mod security;
#[path = "reliability/server_faults.rs"]
mod server_faults;

// ---- scenarios with several OS processes: this binary re-runs itself as a worker ----

/// What a worker process does, and on which server.
#[derive(Serialize, Deserialize)]
enum Role {
    /// Runs one task whose body makes its side effect and then hangs until it is killed.
    DiesAfterSideEffect { url: String },
    /// Floods the server with `FLOOD_DELIVERIES_PER_KEY / FLOOD_PROCESSES` deliveries per key.
    Floods { url: String },
}

/// A worker process; does nothing when run as an ordinary test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker() {
    match workers::config::<Role>() {
        Some(Role::DiesAfterSideEffect { url }) => worker_dies_after_side_effect(&url).await,
        Some(Role::Floods { url }) => worker_floods(&url).await,
        None => {}
    }
}

/// Long enough that the immediate redelivery, which follows the kill, the reaping and a new
/// connection, still finds the dead worker's lock on a loaded machine.
const S04_LOCK_TTL: Duration = Duration::from_secs(3);

async fn worker_dies_after_side_effect(url: &str) {
    let store = RedisStore::connect(url).await.unwrap();
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let _: Result<u8, Error> = Task::new("s04")
        .lock_ttl(S04_LOCK_TTL)
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
    let child = Worker::spawn("worker", &Role::DiesAfterSideEffect { url: server.url() });
    let mut conn = server.connection().await;
    let done: Option<(String, String)> = redis::cmd("BLPOP")
        .arg("s04:effect-done")
        .arg(30)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(done.is_some(), "the worker never reached its side effect");
    child.kill().await;
    let killed_at = Instant::now();

    let store = server.store().await;
    let task = Task::new("s04").lock_ttl(S04_LOCK_TTL);
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
        .retry(RetryPolicy::new().max_wait(S04_LOCK_TTL * 3))
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
        "4. worker `kill -9` after the side effect, before the marker (lock TTL 3 s)",
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
                let (value, errors) = support::deliver_until_done(RETRY_PAUSE, || {
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

/// What a flooding worker reports.
#[derive(Serialize, Deserialize)]
struct FloodSummary {
    /// Deliveries whose body ran in this process.
    executed: u32,
    /// How long the deliveries that did not run waited for the result, in µs.
    wait_p50: u64,
    wait_p99: u64,
    /// The value each key's deliveries got (all the same within the process).
    values: BTreeMap<u32, String>,
    /// Typed errors retried on the way.
    retries: u32,
}

async fn worker_floods(url: &str) {
    let store = RedisStore::connect(url).await.unwrap();
    let client = redis::Client::open(url).unwrap();
    let conn = client.get_multiplexed_async_connection().await.unwrap();
    workers::wait_for_start().await;
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
                let (report, retries) = support::deliver_until_done(RETRY_PAUSE, || {
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
    let mut values: BTreeMap<u32, String> = BTreeMap::new();
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
        waits
            .get(at)
            .map_or(0, |wait| u64::try_from(wait.as_micros()).unwrap())
    };
    workers::report(&FloodSummary {
        executed,
        wait_p50: percentile(50),
        wait_p99: percentile(99),
        values,
        retries,
    });
}

// 1. 64 concurrent deliveries per key, 1,000 keys, across 2 processes.
on_both_servers!(s01_concurrent_deliveries_across_processes_run_each_key_once);
async fn s01_concurrent_deliveries_across_processes_run_each_key_once(server_flavor: Flavor) {
    let server = RedisServer::start_flavor(server_flavor, &[]);
    let mut workers = Workers::spawn(
        FLOOD_PROCESSES,
        "worker",
        &Role::Floods { url: server.url() },
    );
    let mut conn = server.connection().await;
    workers.start_together(Duration::from_secs(60)).await;
    let started = Instant::now();
    let summaries: Vec<FloodSummary> = workers.reports(Duration::from_secs(600)).await;
    let took = started.elapsed();
    let effects: std::collections::HashMap<u32, u32> = redis::cmd("HGETALL")
        .arg("s01:effects")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(effects.len(), FLOOD_KEYS as usize);
    let duplicates: u32 = effects.values().map(|n| n - 1).sum();
    assert_eq!(duplicates, 0, "a side effect ran twice");
    let executed: u32 = summaries.iter().map(|s| s.executed).sum();
    assert_eq!(executed, FLOOD_KEYS);
    assert!(
        summaries.iter().all(|s| s.values == summaries[0].values),
        "the processes saw different results"
    );
    let p50 = summaries.iter().map(|s| s.wait_p50).max().unwrap();
    let p99 = summaries.iter().map(|s| s.wait_p99).max().unwrap();
    let retries: u32 = summaries.iter().map(|s| s.retries).sum();
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
