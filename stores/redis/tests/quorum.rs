//! `RedlockStore` under faults injected for real into five redis-servers the tests start:
//! racing processes, servers killed, a majority down, a partition, restarts with and without
//! persistence.
//!
//! A sixth server, the ledger, is not part of the quorum: it counts side effects and tells this
//! test how far its worker processes are, so killing quorum servers never loses a count. Every
//! scenario prints a `FIGURES` line.

use idempotask_test_support as support;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use idempotask::store::{Begin, Fencing, LockToken, Store, StoreErrorKind, UnitOfWork};
use idempotask::{Error, Outcome, Report, RetryPolicy, Task};
use idempotask_redis::RedlockStore;
use serde::{Deserialize, Serialize};
use support::RedisServer;
use support::quorum::{BusyLoops, Quorum};
use support::workers::{self, Workers};

/// The pause between redeliveries of `support::deliver_until_done`.
const RETRY_PAUSE: Duration = Duration::from_millis(10);

const SERVERS: usize = 5;
const KEYS: u32 = 200;
const DELIVERIES_PER_KEY: u32 = 16;
const PROCESSES: u32 = 2;
/// Executions the parent waits for before it kills servers in the middle of the race.
const KILL_AFTER: usize = 60;
const LOCK_TTL: Duration = Duration::from_secs(10);
/// How many times a delivery whose call gave up is delivered again.
const REDELIVERIES: u32 = 20;
const BODY: Duration = Duration::from_millis(30);

/// The races load the machine on purpose (two worker processes, and busy loops for the loaded
/// ones): one at a time, so that a race measures the load it sets up and not its neighbour's.
static RACES: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn figures(scenario: &str, figures: &str) {
    println!("FIGURES | {scenario} | {figures} |");
}

/// A delivery of `key` whose body has started and keeps the lock until `release` is sent; the
/// body counts itself in `ran` and answers `value`.
struct Held<T> {
    release: tokio::sync::oneshot::Sender<()>,
    report: tokio::task::JoinHandle<Result<Report<T>, Error>>,
}

async fn hold<T>(
    task: &Task,
    store: &RedlockStore,
    key: &str,
    ran: &Arc<AtomicU32>,
    value: T,
) -> Held<T>
where
    T: Serialize + serde::de::DeserializeOwned + Send + Sync + 'static,
{
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let (release, release_rx) = tokio::sync::oneshot::channel::<()>();
    let (task, store, ran, key) = (task.clone(), store.clone(), ran.clone(), key.to_owned());
    let report = tokio::spawn(async move {
        task.call(key)
            .store(store)
            .run_reported(async move {
                ran.fetch_add(1, Ordering::SeqCst);
                started_tx.send(()).unwrap();
                release_rx.await.unwrap();
                Ok::<_, Error>(value)
            })
            .await
    });
    started_rx.await.unwrap();
    Held { release, report }
}

async fn store(urls: Vec<String>, server_timeout: Duration) -> RedlockStore {
    RedlockStore::builder(urls)
        .server_timeout(server_timeout)
        .connect()
        .await
        .unwrap()
}

/// Where a worker process finds the quorum and the ledger.
#[derive(Serialize, Deserialize)]
struct WorkerConfig {
    urls: Vec<String>,
    ledger: String,
}

/// What one worker process reports.
#[derive(Debug, Serialize, Deserialize)]
struct WorkerSummary {
    deliveries: u32,
    /// Deliveries that ran the body, whatever the outcome of recording it.
    executed: u32,
    /// Deliveries whose body ran but whose marker no majority stored.
    marker_not_written: u32,
    /// Calls that ended in an error (a store error or `Contended`), each delivered again.
    gave_up: u32,
    /// Deliveries that still gave up after `REDELIVERIES` redeliveries.
    lost: u32,
    /// The first few errors, to say why.
    errors: Vec<String>,
    /// The value each key's deliveries got (all the same within the process).
    values: HashMap<u32, String>,
}

/// A connection to the ledger that waits for its answers as long as a lock lasts: on a loaded
/// machine a count that timed out after it applied would fail the body, and the delivery run
/// again would look like a second execution.
async fn patient_connection(url: &str) -> redis::aio::MultiplexedConnection {
    let patient = redis::AsyncConnectionConfig::new().set_response_timeout(Some(LOCK_TTL));
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection_with_config(&patient)
        .await
        .unwrap()
}

/// What a delivery came to: the report of its last call, how many of its calls gave up, and
/// the first of their errors.
type Delivered = (Result<Report<String>, Error>, u32, Option<String>);

/// One delivery of `key` in a worker: its body counts itself on the ledger. A call that gives
/// up is delivered again, as a queue would, up to `REDELIVERIES` times: how often that happens
/// is counted.
async fn deliver(
    task: &Task,
    store: &RedlockStore,
    conn: &redis::aio::MultiplexedConnection,
    key: u32,
) -> Delivered {
    let mut gave_up = 0;
    let mut first_error = None;
    loop {
        let mut conn = conn.clone();
        let report = task
            .call(format!("k{key}"))
            .store(store.clone())
            .run_reported(async move {
                let _: i64 = redis::cmd("HINCRBY")
                    .arg("race:effects")
                    .arg(key)
                    .arg(1)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                let _: i64 = redis::cmd("RPUSH")
                    .arg("race:executed")
                    .arg(key)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                // Keep the lock a while so that both processes' deliveries overlap.
                tokio::time::sleep(BODY).await;
                Ok::<_, Error>(format!("{}-{}", std::process::id(), rand::random::<u64>()))
            })
            .await;
        match report {
            Err(err @ (Error::Store(_) | Error::Contended { .. })) if gave_up < REDELIVERIES => {
                gave_up += 1;
                first_error.get_or_insert(err.to_string());
                tokio::time::sleep(RETRY_PAUSE).await;
            }
            report => return (report, gave_up, first_error),
        }
    }
}

/// A worker process; does nothing when run as an ordinary test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker() {
    let Some(WorkerConfig { urls, ledger }) = workers::config() else {
        return;
    };
    // The defaults, as a user gets them.
    let store = RedlockStore::connect(urls).await.unwrap();
    let conn = patient_connection(&ledger).await;
    workers::wait_for_start().await;
    let task = Arc::new(Task::new("race").lock_ttl(LOCK_TTL));
    // All deliveries of a key at once, 25 keys at a time.
    let keys_in_flight = Arc::new(tokio::sync::Semaphore::new(25));
    let mut deliveries = Vec::new();
    for key in 0..KEYS {
        let permit = Arc::new(keys_in_flight.clone().acquire_owned().await.unwrap());
        for _ in 0..DELIVERIES_PER_KEY / PROCESSES {
            let (task, store, conn, permit) =
                (task.clone(), store.clone(), conn.clone(), permit.clone());
            deliveries.push(tokio::spawn(async move {
                let (report, gave_up, first_error) = deliver(&task, &store, &conn, key).await;
                drop(permit);
                (key, report, gave_up, first_error)
            }));
        }
    }
    let mut summary = WorkerSummary {
        deliveries: 0,
        executed: 0,
        marker_not_written: 0,
        gave_up: 0,
        lost: 0,
        errors: Vec::new(),
        values: HashMap::new(),
    };
    for delivery in deliveries {
        let (key, report, gave_up, first_error) = delivery.await.unwrap();
        summary.deliveries += 1;
        summary.gave_up += gave_up;
        if summary.errors.len() < 3 {
            summary.errors.extend(first_error);
        }
        let report = match report {
            Ok(report) => report,
            Err(err @ (Error::Store(_) | Error::Contended { .. })) => {
                summary.lost += 1;
                if summary.errors.len() < 6 {
                    summary.errors.push(err.to_string());
                }
                continue;
            }
            Err(other) => panic!("an error a queue cannot retry: {other:?}"),
        };
        match report.outcome {
            Outcome::Replayed => {}
            Outcome::MarkerNotWritten => {
                summary.executed += 1;
                summary.marker_not_written += 1;
            }
            _ => summary.executed += 1,
        }
        let first = summary
            .values
            .entry(key)
            .or_insert_with(|| report.value.clone());
        assert_eq!(*first, report.value, "two results for key {key}");
    }
    workers::report(&summary);
}

/// Races two worker processes over `KEYS` keys, `DELIVERIES_PER_KEY` deliveries each; with
/// `kill`, kills those servers with SIGKILL once `KILL_AFTER` bodies ran. Asserts that every
/// key ran exactly once and that no call gave up (the workers would deliver it again, as a queue
/// does, and count it); answers the figures line.
async fn race(quorum: &Quorum, kill: &[usize]) -> String {
    let ledger = RedisServer::start();
    let mut conn = patient_connection(&ledger.url()).await;
    let config = WorkerConfig {
        urls: quorum.urls(),
        ledger: ledger.url(),
    };
    let mut workers = Workers::spawn(PROCESSES as usize, "worker", &config);
    workers.start_together(Duration::from_secs(60)).await;
    let started = Instant::now();
    if !kill.is_empty() {
        // Polled rather than a blocking pop, which the client's response timeout would cut
        // short on a loaded machine.
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let executed: usize = redis::cmd("LLEN")
                .arg("race:executed")
                .query_async(&mut conn)
                .await
                .unwrap();
            if executed >= KILL_AFTER {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the race stalled before the kill"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        for &index in kill {
            quorum.signal(index, "KILL");
        }
    }
    let summaries: Vec<WorkerSummary> = workers.reports(Duration::from_secs(600)).await;
    let took = started.elapsed();
    // Counted on the ledger, which no kill touches.
    let effects: HashMap<u32, u32> = redis::cmd("HGETALL")
        .arg("race:effects")
        .query_async(&mut conn)
        .await
        .unwrap();
    let twice = effects.values().filter(|&&n| n > 1).count();
    let never = KEYS as usize - effects.len();
    let deliveries: u32 = summaries.iter().map(|s| s.deliveries).sum();
    let executed: u32 = summaries.iter().map(|s| s.executed).sum();
    let gave_up: u32 = summaries.iter().map(|s| s.gave_up).sum();
    let lost: u32 = summaries.iter().map(|s| s.lost).sum();
    let not_written: u32 = summaries.iter().map(|s| s.marker_not_written).sum();
    let errors: Vec<&String> = summaries.iter().flat_map(|s| &s.errors).collect();
    let line = format!(
        "{deliveries} deliveries ({DELIVERIES_PER_KEY} per key × {KEYS} keys, {PROCESSES} processes, {} ms bodies, {} s lock TTL) in {} ms: {} side effects, {twice} keys run more than once, {never} never run, {gave_up} calls gave up ({lost} deliveries still after {REDELIVERIES} redeliveries), {not_written} markers not written",
        BODY.as_millis(),
        LOCK_TTL.as_secs(),
        took.as_millis(),
        effects.values().sum::<u32>()
    );
    assert!(
        twice == 0 && never == 0 && gave_up == 0 && executed == KEYS,
        "{line}; {executed} executions reported; errors: {errors:?}"
    );
    for key in 0..KEYS {
        assert_eq!(
            summaries[0].values.get(&key),
            summaries[1].values.get(&key),
            "the processes saw different results for key {key}"
        );
    }
    format!("{line}, identical results in both processes")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_racing_run_each_side_effect_once() {
    let _one_race_at_a_time = RACES.lock().await;
    let quorum = Quorum::start(SERVERS);
    let line = race(&quorum, &[]).await;
    figures("two processes race, 5 servers", &line);
}

// Regression: healthy servers that answered after the per-server timeout were all left out at
// once, and bodies ran twice (95 of 200 keys) while 3,174 deliveries gave up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_racing_on_loaded_cores_run_each_side_effect_once() {
    let _one_race_at_a_time = RACES.lock().await;
    let quorum = Quorum::start(SERVERS);
    let _load = BusyLoops::start(2, Duration::from_secs(900));
    let line = race(&quorum, &[]).await;
    figures(
        "two processes race, 5 servers, both cores loaded by two busy loops",
        &line,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_killed_mid_race_change_nothing_and_the_survivors_keep_working() {
    let _one_race_at_a_time = RACES.lock().await;
    let quorum = Quorum::start(SERVERS);
    let load = BusyLoops::start(2, Duration::from_secs(900));
    let line = race(&quorum, &[0, 3]).await;
    drop(load);
    // A store connected now reaches only the three survivors, a majority: it works.
    let store = store(quorum.urls(), Duration::from_millis(200)).await;
    let task = Task::new("after-kill");
    let first = task
        .call("k")
        .store(store.clone())
        .run_reported(async { Ok::<_, Error>(7) })
        .await
        .unwrap();
    let again = task
        .call("k")
        .store(store)
        .run_reported(async { Ok::<_, Error>(8) })
        .await
        .unwrap();
    assert_eq!(
        (first.outcome, again.outcome, again.value),
        (Outcome::Executed, Outcome::Replayed, 7)
    );
    figures(
        "`kill -9` of 2 of 5 servers after 60 executions, both cores loaded by two busy loops",
        &format!("{line}; afterwards a new key runs once and replays on the 3 survivors"),
    );
}

// Regression: a delivery's own `SET` that timed out in an earlier round, applied late and never
// released, was counted in a later round's majority with the expiry of the earlier request; it
// expired under the holder and a second delivery took that server and ran beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_lock_of_ones_own_is_renewed_before_it_counts_in_a_majority() {
    let quorum = Quorum::start(3);
    let store = store(quorum.urls(), Duration::from_millis(500)).await;
    let unit = UnitOfWork::new("late-own-lock", "k").unwrap();
    let key = store.key(&unit);
    let (first, other, second) = (
        LockToken::generate(),
        LockToken::generate(),
        LockToken::generate(),
    );
    // Server 0 holds `first`'s lock from a request long ago, about to expire; server 2 a
    // passing waiter's.
    for (index, token) in [(0, &first), (2, &other)] {
        let mut conn = quorum.servers[index].connection().await;
        let _: () = redis::cmd("SET")
            .arg(&key)
            .arg(format!("L{}", token.as_str()))
            .arg("PX")
            .arg(300)
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    let ttl = Duration::from_secs(10);
    let granted = store.begin(&unit, &first, ttl, Fencing::Off).await.unwrap();
    assert!(matches!(granted, Begin::Acquired { .. }), "{granted:?}");
    // Both old locks' expiries pass; `first` still believes it holds the unit for 10 s.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let intruder = store
        .begin(&unit, &second, ttl, Fencing::Off)
        .await
        .unwrap();
    assert!(
        matches!(intruder, Begin::Busy { .. }),
        "a second delivery got the lock while the first holds it: {intruder:?}"
    );
    figures(
        "a late lock of the delivery's own, 300 ms left, found by its next `begin`",
        "renewed to the lock TTL before it counts: a second delivery 500 ms later is busy",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_majority_down_fails_every_call_closed() {
    let quorum = Quorum::start(SERVERS);
    let store = store(quorum.urls(), Duration::from_millis(200)).await;
    let ran = Arc::new(AtomicU32::new(0));
    let task = Task::new("majority-down").lock_ttl(Duration::from_secs(2));

    // A body that is running when the majority goes: its result cannot be recorded.
    let running = hold(&task, &store, "running", &ran, 1).await;
    for index in [1, 2, 4] {
        quorum.signal(index, "KILL");
    }
    running.release.send(()).unwrap();
    let report = running.report.await.unwrap().unwrap();
    assert_eq!(report.outcome, Outcome::MarkerNotWritten);

    let mut kinds = HashMap::new();
    let calls = 20;
    for key in 0..calls {
        let result = task
            .call(format!("k{key}"))
            .store(store.clone())
            .run(async {
                ran.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Error>(1)
            })
            .await;
        match result {
            Err(Error::Store(err)) => {
                assert!(
                    matches!(
                        err.kind(),
                        StoreErrorKind::Unreachable | StoreErrorKind::Timeout
                    ),
                    "{err}"
                );
                assert!(err.to_string().contains("no majority"), "{err}");
                *kinds.entry(err.kind().to_string()).or_insert(0) += 1;
            }
            other => panic!("expected a typed store error, got {other:?}"),
        }
    }
    assert_eq!(
        ran.load(Ordering::SeqCst),
        1,
        "a body ran without a majority"
    );
    let unit = idempotask::store::UnitOfWork::new("majority-down", "k0").unwrap();
    let status = store.inspect(&unit).await;
    assert!(
        status.is_err(),
        "inspect answered without a majority: {status:?}"
    );
    figures(
        "3 of 5 servers down",
        &format!(
            "{calls} calls: {calls} typed store errors ({kinds:?}), 0 bodies run; a body running when the majority went: value returned with `MarkerNotWritten`"
        ),
    );
}

// Regression: servers that did not answer counted as free, so a waiter that found two servers
// down and the holder on two of the three others was told "free now" on every round; it asked
// again at once until its 64 attempts ran out while the holder worked, and gave up `Contended`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_beside_servers_that_are_down_waits_for_the_holder() {
    let quorum = Quorum::start(SERVERS);
    let store = store(quorum.urls(), Duration::from_millis(200)).await;
    let ran = Arc::new(AtomicU32::new(0));
    let task = Task::new("waiter-beside-down").lock_ttl(Duration::from_secs(10));
    let holder = hold(&task, &store, "k", &ran, 1).await;
    // The holder keeps a majority counted with two servers that then die, and a third that
    // loses its lock (a restart without persistence): it is left with two of the survivors.
    for index in [0, 3] {
        quorum.signal(index, "KILL");
    }
    let mut fifth = redis::Client::open(quorum.urls()[4].as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let () = redis::cmd("FLUSHALL")
        .query_async(&mut fifth)
        .await
        .unwrap();
    let second = {
        let (task, store, ran) = (task.clone(), store.clone(), ran.clone());
        tokio::spawn(async move {
            task.call("k")
                .store(store)
                .run_reported(async move {
                    ran.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, Error>(2)
                })
                .await
        })
    };
    // The holder's body takes a while, as bodies do.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    holder.release.send(()).unwrap();
    let held = holder.report.await.unwrap().unwrap();
    let waited = match second.await.unwrap() {
        Ok(report) => report,
        Err(err) => panic!("the waiter did not wait for the holder: {err}"),
    };
    assert_eq!(
        (waited.outcome, waited.value, ran.load(Ordering::SeqCst)),
        (Outcome::Replayed, held.value, 1)
    );
    // Backing off by the retry policy over 1.5 s takes about a dozen attempts, not 64.
    assert!(waited.attempts <= 32, "{} attempts", waited.attempts);
    figures(
        "a holder left on 2 of the 3 survivors of 5 servers, a waiter beside it",
        &format!(
            "the holder `{:?}`; the waiter `{:?}` after {} attempts over the holder's 1.5 s body",
            held.outcome, waited.outcome, waited.attempts
        ),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_never_makes_a_second_holder() {
    let quorum = Quorum::start(SERVERS);
    let store = store(quorum.urls(), Duration::from_millis(200)).await;
    let task = Task::new("partition")
        .lock_ttl(Duration::from_secs(10))
        .retry(RetryPolicy::no_wait());
    let holder_ran = Arc::new(AtomicU32::new(0));
    let holder = hold(&task, &store, "k", &holder_ran, "holder".to_owned()).await;

    let intruder_ran = AtomicU32::new(0);
    let intrude = || async {
        task.call("k")
            .store(store.clone())
            .run(async {
                intruder_ran.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Error>("intruder".to_owned())
            })
            .await
    };
    let mut answers = Vec::new();
    // Each side of the partition in turn: the servers of the other side stop answering.
    for paused in [&[0, 1][..], &[2, 3, 4][..], &[0, 4][..]] {
        for &index in paused {
            quorum.signal(index, "STOP");
        }
        let answer = intrude().await;
        assert!(
            matches!(answer, Err(Error::Contended { .. } | Error::Store(_))),
            "{answer:?}"
        );
        answers.push(match answer {
            Err(Error::Contended { .. }) => "contended".to_owned(),
            Err(err) => format!("store error: {err}"),
            Ok(_) => unreachable!(),
        });
        for &index in paused {
            quorum.signal(index, "CONT");
        }
    }
    holder.release.send(()).unwrap();
    let report = holder.report.await.unwrap().unwrap();
    assert_eq!(report.outcome, Outcome::Executed);
    let (value, _) = support::deliver_until_done(RETRY_PAUSE, intrude).await;
    assert_eq!(value, "holder");
    assert_eq!(holder_ran.load(Ordering::SeqCst), 1);
    assert_eq!(
        intruder_ran.load(Ordering::SeqCst),
        0,
        "a second holder ran"
    );
    figures(
        "partition by SIGSTOP (2, 3, then 2 of 5 servers paused)",
        &format!(
            "the intruder got: {}; 0 intruder bodies; the holder finished `Executed` and the intruder then replayed its value",
            answers
                .iter()
                .map(|a| a.split(':').next().unwrap_or_default())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    );
}

/// A holder keeps the lock on all five servers while three of them go down and come back:
/// restarted at once, or (`keep_out`) killed and started again only after that long. Answers
/// how many bodies ran, the value a redelivery got, and the holder's outcome.
async fn restart_while_held(
    quorum: &mut Quorum,
    keep_out: Option<Duration>,
) -> (u32, String, Outcome) {
    // The holder must outlast the restarts; with `keep_out` it finishes while they are out.
    let ttl = keep_out.map_or(Duration::from_secs(10), |_| Duration::from_millis(1500));
    let store = store(quorum.urls(), Duration::from_millis(200)).await;
    let task = Task::new("restart")
        .lock_ttl(ttl)
        .retry(RetryPolicy::no_wait());
    let ran = Arc::new(AtomicU32::new(0));
    let Held {
        release: finish_tx,
        report: holder,
    } = hold(&task, &store, "k", &ran, "first".to_owned()).await;
    let held_since = Instant::now();
    let redeliver = || {
        task.call("k").store(store.clone()).run_reported(async {
            ran.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Error>("second".to_owned())
        })
    };
    let mut finish_tx = Some(finish_tx);
    let mut holder = Some(holder);
    let mut holder_outcome = None;
    if let Some(keep_out) = keep_out {
        for index in 0..3 {
            quorum.signal(index, "KILL");
        }
        // While they are out, no majority forms without the holder's servers.
        let answer = redeliver().await;
        assert!(
            matches!(answer, Err(Error::Store(_) | Error::Contended { .. })),
            "{answer:?}"
        );
        // The holder finishes within its lock; its result reaches the two servers up.
        finish_tx.take().unwrap().send(()).unwrap();
        holder_outcome = Some(holder.take().unwrap().await.unwrap().unwrap().outcome);
        // Keeping the servers out for longer than the longest lock TTL is the remedy itself:
        // time is what it waits for.
        tokio::time::sleep(keep_out.saturating_sub(held_since.elapsed())).await;
    }
    for server in &mut quorum.servers[..3] {
        server.restart();
    }
    // One redelivery while the holder may still run, once the restarted servers answer
    // again (until then it fails closed): it runs only if the lock was forgotten.
    let deadline = Instant::now() + Duration::from_secs(10);
    let early = loop {
        match redeliver().await {
            Err(Error::Store(_)) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            answer => break answer,
        }
    };
    if let Some(finish_tx) = finish_tx {
        finish_tx.send(()).unwrap();
    }
    if let Some(holder) = holder {
        holder_outcome = Some(holder.await.unwrap().unwrap().outcome);
    }
    let value = match early {
        Ok(report) => report.value,
        Err(Error::Store(_) | Error::Contended { .. }) => {
            let (report, _) = tokio::time::timeout(
                Duration::from_secs(10),
                support::deliver_until_done(RETRY_PAUSE, redeliver),
            )
            .await
            .expect("the redelivery never got an answer");
            report.value
        }
        Err(other) => panic!("{other:?}"),
    };
    (ran.load(Ordering::SeqCst), value, holder_outcome.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_without_persistence_duplicates_and_the_remedies_prevent_it() {
    // Naive: three servers restarted empty while the lock is held hand it out again.
    let mut naive = Quorum::start(SERVERS);
    let (naive_runs, naive_value, _) = restart_while_held(&mut naive, None).await;
    assert_eq!(
        (naive_runs, naive_value.as_str()),
        (2, "second"),
        "the documented caveat: a second holder"
    );

    // AOF with `appendfsync always`: the restarted servers come back with the lock.
    let mut aof = Quorum::start_with(SERVERS, &["--appendonly", "yes", "--appendfsync", "always"]);
    let (aof_runs, aof_value, aof_holder) = restart_while_held(&mut aof, None).await;
    assert_eq!((aof_runs, aof_value.as_str()), (1, "first"));
    assert_eq!(aof_holder, Outcome::Executed);

    // Without persistence, kept out for longer than the lock TTL before they come back.
    let mut kept_out = Quorum::start(SERVERS);
    let (kept_runs, kept_value, kept_holder) =
        restart_while_held(&mut kept_out, Some(Duration::from_secs(2))).await;
    assert_eq!((kept_runs, kept_value.as_str()), (1, "first"));
    figures(
        "3 of 5 servers restarted while a lock is held",
        &format!(
            "no persistence, restarted at once: bodies run {naive_runs} (a duplicate: the caveat); AOF `always`: {aof_runs}, the second delivery replayed; no persistence but kept out 2 s (> 1.5 s lock TTL): {kept_runs} (holder `{kept_holder:?}`, its marker on the 2 survivors answers the redelivery)"
        ),
    );
}
