//! `RedisClusterStore` under the cluster's own events, each test on a cluster of its own:
//! slots moving between masters while tasks run, and a master killed while tasks run.
//!
//! Both print their figures (recorded in `docs/reliability.md`) straight to stderr, so they show
//! in the test command's output without `--nocapture`.

use idempotask_test_support as support;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::Write as _;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idempotask::store::SharedStore;
use idempotask::store::{Store, UnitOfWork};
use idempotask::{Error, Outcome, Report, RetryPolicy, Task};
use idempotask_redis::RedisClusterStore;
use rand::seq::SliceRandom as _;
use support::cluster::{RedisCluster, SlotMove};

/// How long one call may take before the test calls it hung: far beyond every timeout involved.
const HUNG: Duration = Duration::from_secs(45);
/// A queue's pause before it redelivers a failed message.
const REDELIVERY: Duration = Duration::from_millis(50);
/// How long a queue keeps redelivering one message before it gives up on it (dead-letters it).
const GIVE_UP: Duration = Duration::from_secs(20);

/// What the deliveries of a test did, unit by unit.
#[derive(Default)]
struct Ledger {
    /// The fencing token of every execution of each key's body, in order.
    executions: Mutex<HashMap<String, Vec<u64>>>,
    /// Failed calls by what they failed with; only typed, retryable errors count here.
    failures: Mutex<BTreeMap<String, usize>>,
    /// Calls that failed with anything else.
    untyped: Mutex<Vec<String>>,
    /// Messages still failing (with typed errors) when the queue gave up on them.
    gave_up: Mutex<Vec<String>>,
    hung: AtomicUsize,
    calls: AtomicUsize,
}

impl Ledger {
    fn failed(&self) -> usize {
        self.failures.lock().unwrap().values().sum()
    }

    /// Keys whose body ran more than once, with their fencing tokens.
    fn duplicates(&self) -> BTreeMap<String, Vec<u64>> {
        let executions = self.executions.lock().unwrap();
        executions
            .iter()
            .filter(|(_, fences)| fences.len() > 1)
            .map(|(key, fences)| (key.clone(), fences.clone()))
            .collect()
    }
}

/// Delivers `key` until a call succeeds, as a queue would: a call that fails with a typed,
/// retryable error is counted and redelivered after a pause, for up to [`GIVE_UP`]. `None` when
/// the queue gave up, or a call failed with anything else or hung (all recorded).
async fn deliver(
    task: &'static Task,
    store: SharedStore,
    key: String,
    ledger: Arc<Ledger>,
    body_time: Duration,
) -> Option<Report<String>> {
    let give_up = tokio::time::Instant::now() + GIVE_UP;
    while tokio::time::Instant::now() < give_up {
        ledger.calls.fetch_add(1, Ordering::Relaxed);
        let body = {
            let (ledger, key) = (ledger.clone(), key.clone());
            async move {
                let fence = idempotask::context()
                    .and_then(|ctx| ctx.fencing_token())
                    .unwrap_or(0);
                ledger
                    .executions
                    .lock()
                    .unwrap()
                    .entry(key.clone())
                    .or_default()
                    .push(fence);
                tokio::time::sleep(body_time).await;
                Ok::<_, Error>(format!("{key}@{fence}"))
            }
        };
        let call = task
            .call(key.clone())
            .store(store.clone())
            .run_reported(body);
        let failure = match tokio::time::timeout(HUNG, call).await {
            Err(_) => {
                ledger.hung.fetch_add(1, Ordering::Relaxed);
                return None;
            }
            Ok(Ok(report)) => return Some(report),
            Ok(Err(Error::Store(err))) if err.is_retryable() => format!("store: {}", err.kind()),
            Ok(Err(Error::Contended { .. })) => "contended".to_owned(),
            Ok(Err(other)) => {
                ledger.untyped.lock().unwrap().push(other.to_string());
                return None;
            }
        };
        *ledger.failures.lock().unwrap().entry(failure).or_default() += 1;
        tokio::time::sleep(REDELIVERY).await;
    }
    ledger.gave_up.lock().unwrap().push(key);
    None
}

/// The hash slot of `task`'s unit for `key`.
fn slot(cluster: &RedisCluster, store: &RedisClusterStore, task: &Task, key: &str) -> u16 {
    let unit = UnitOfWork::new(task.name(), key).unwrap();
    cluster.slot_of(&store.key(&unit))
}

/// Prints a line to the real stderr, past the test harness's capture.
fn figure(line: &str) {
    let _ = writeln!(std::io::stderr(), "{line}");
}

// ---- slot migration ----

const BATCHES: usize = 8;
const PER_BATCH: usize = 20;

/// Moves `slot` from its master to the next one (by port), the way `redis-cli --cluster
/// reshard` does; before the next move every node agrees on the new owner, so no move starts
/// from a stale view. Answers how many keys moved.
fn move_slot(cluster: &RedisCluster, slot: u16) -> usize {
    SlotMove::start(cluster, slot).finish(cluster)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[expect(
    clippy::too_many_lines,
    reason = "one scenario told in order: pick the slots, move them under load, count"
)]
async fn slots_moving_while_tasks_run_fail_nothing_untyped_and_duplicate_nothing() {
    static SHIP: Task = Task::new("ship_order")
        .lock_ttl(Duration::from_secs(10))
        .fencing(true);
    let cluster = Arc::new(RedisCluster::start());
    let cluster_store = cluster.store_in("migration").await;
    let store = SharedStore::new(cluster_store.clone());
    let ledger = Arc::new(Ledger::default());

    let batches: Vec<Vec<String>> = (0..BATCHES)
        .map(|b| (0..PER_BATCH).map(|i| format!("order-{b}-{i}")).collect())
        .collect();
    // Every slot that holds one of the units moves, in random order.
    let mut slots: Vec<u16> = batches
        .iter()
        .flatten()
        .map(|key| slot(&cluster, &cluster_store, &SHIP, key))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    slots.shuffle(&mut rand::rng());
    let owner = |masters: &[support::cluster::Master], slot: u16| {
        masters.iter().find(|m| m.owns(slot)).map(|m| m.id.clone())
    };
    let masters = cluster.masters();
    let owners_before: Vec<_> = slots.iter().map(|&s| owner(&masters, s)).collect();

    let started = Arc::new(tokio::sync::Notify::new());
    let migration = {
        let (cluster, slots, started) = (cluster.clone(), slots.clone(), started.clone());
        tokio::spawn(async move {
            // The first deliveries are under way (their locks held) before any slot moves.
            started.notified().await;
            tokio::task::spawn_blocking(move || {
                slots
                    .iter()
                    .map(|&slot| move_slot(&cluster, slot))
                    .sum::<usize>()
            })
            .await
            .unwrap()
        })
    };

    // Round r delivers batch r twice at once (fresh units: locks live while slots move) and
    // every earlier batch once more (finished units: markers that must move intact).
    let mut results: HashMap<String, Vec<String>> = HashMap::new();
    let mut round = 0;
    while round < BATCHES || !migration.is_finished() {
        let mut deliveries = Vec::new();
        for (b, batch) in batches.iter().enumerate().take(round + 1) {
            let copies = if b == round { 2 } else { 1 };
            for key in batch {
                for _ in 0..copies {
                    let (store, ledger, key) = (store.clone(), ledger.clone(), key.clone());
                    deliveries.push(tokio::spawn(async move {
                        let report =
                            deliver(&SHIP, store, key.clone(), ledger, Duration::from_millis(30))
                                .await;
                        (key, report)
                    }));
                }
            }
        }
        if round == 0 {
            started.notify_one();
        }
        for delivery in deliveries {
            let (key, report) = delivery.await.unwrap();
            if let Some(report) = report {
                assert!(
                    matches!(report.outcome, Outcome::Executed | Outcome::Replayed),
                    "{key}: {:?}",
                    report.outcome
                );
                results.entry(key).or_default().push(report.value);
            }
        }
        round += 1;
    }
    let keys_moved = migration.await.unwrap();

    let duplicates = ledger.duplicates();
    let untyped = ledger.untyped.lock().unwrap().clone();
    let gave_up: BTreeSet<String> = ledger.gave_up.lock().unwrap().iter().cloned().collect();
    let failures = ledger.failures.lock().unwrap().clone();
    figure(&format!(
        "cluster slot migration: {} slots moved ({keys_moved} keys) in {round} rounds; {} units, {} task calls, {} failed with typed retryable errors {failures:?}, {} untyped, {} hung, {} units given up after {} s of typed errors, {} duplicate executions",
        slots.len(),
        BATCHES * PER_BATCH,
        ledger.calls.load(Ordering::Relaxed),
        ledger.failed(),
        untyped.len(),
        ledger.hung.load(Ordering::Relaxed),
        gave_up.len(),
        GIVE_UP.as_secs(),
        duplicates.len(),
    ));
    assert!(untyped.is_empty(), "{untyped:?}");
    assert_eq!(ledger.hung.load(Ordering::Relaxed), 0);
    assert!(duplicates.is_empty(), "ran more than once: {duplicates:?}");
    assert_eq!(results.len() + gave_up.len(), BATCHES * PER_BATCH);
    for (key, values) in &results {
        assert!(values.iter().all(|v| *v == values[0]), "{key}: {values:?}");
    }
    // The slots really moved: each now belongs to another master than before the test.
    let masters = cluster.masters();
    for (&slot, before) in slots.iter().zip(&owners_before) {
        let after = owner(&masters, slot);
        assert!(
            after.is_some() && after != *before,
            "slot {slot} did not move"
        );
    }
}

// ---- failover ----

const HELD: usize = 30;
const WAVE: usize = 32;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[expect(
    clippy::too_many_lines,
    reason = "one scenario told in order: hold locks, run load, kill, count what survived"
)]
async fn a_master_killed_while_tasks_run_fails_over_with_typed_errors_only() {
    static WORK: Task = Task::new("send_invoice")
        .lock_ttl(Duration::from_secs(5))
        .fencing(true);
    static HOLD: Task = Task::new("export_report").lock_ttl(Duration::from_secs(120));
    // Quick to declare a dead master failed, so the test's outage lasts a few seconds.
    let cluster = RedisCluster::start_with_node_timeout(Duration::from_millis(1500));
    let cluster_store = cluster.store_in("failover").await;
    let store = SharedStore::new(cluster_store.clone());
    let ledger = Arc::new(Ledger::default());
    let victim = cluster.masters()[0].clone();

    // Holders: bodies that keep their locks until told to finish, on every master.
    let (finish_tx, finish_rx) = tokio::sync::watch::channel(false);
    let (held_tx, mut held_rx) = tokio::sync::mpsc::unbounded_channel();
    let holders: Vec<_> = (0..HELD)
        .map(|i| {
            let (store, mut finish_rx, held_tx) =
                (store.clone(), finish_rx.clone(), held_tx.clone());
            let key = format!("report-{i}");
            tokio::spawn(async move {
                HOLD.call(key.clone())
                    .store(store)
                    .run_reported(async move {
                        held_tx.send(key.clone()).unwrap();
                        finish_rx.wait_for(|finish| *finish).await.unwrap();
                        Ok::<_, Error>(key)
                    })
                    .await
            })
        })
        .collect();
    for _ in 0..HELD {
        held_rx.recv().await.unwrap();
    }
    let held_on_victim: Vec<String> = (0..HELD)
        .map(|i| format!("report-{i}"))
        .filter(|key| victim.owns(slot(&cluster, &cluster_store, &HOLD, key)))
        .collect();

    // The workload: waves of fresh units, each delivered twice at once, until told to stop.
    let stop = Arc::new(AtomicBool::new(false));
    let (waves_tx, mut waves_rx) = tokio::sync::watch::channel(0_usize);
    let workload = {
        let (store, ledger, stop) = (store.clone(), ledger.clone(), stop.clone());
        tokio::spawn(async move {
            let mut confirmed = Vec::new();
            let mut wave = 0;
            while !stop.load(Ordering::SeqCst) {
                let deliveries: Vec<_> = (0..WAVE * 2)
                    .map(|i| {
                        let key = format!("invoice-{wave}-{}", i / 2);
                        let (store, ledger) = (store.clone(), ledger.clone());
                        tokio::spawn(async move {
                            let report = deliver(
                                &WORK,
                                store,
                                key.clone(),
                                ledger,
                                Duration::from_millis(20),
                            )
                            .await;
                            (key, report)
                        })
                    })
                    .collect();
                for delivery in deliveries {
                    let (key, report) = delivery.await.unwrap();
                    if report.is_some_and(|r| r.outcome == Outcome::Executed) {
                        confirmed.push(key);
                    }
                }
                wave += 1;
                waves_tx.send_replace(wave);
            }
            confirmed
        })
    };

    // Kill the master while waves run, and wait (off the async workers) for the takeover.
    waves_rx.wait_for(|&waves| waves >= 2).await.unwrap();
    let victim_port = victim.port;
    let cluster = tokio::task::spawn_blocking(move || {
        let mut cluster = cluster;
        let id = cluster.kill(victim_port);
        cluster.wait_for_failover(&id);
        cluster
    })
    .await
    .unwrap();
    let after = *waves_rx.borrow();
    waves_rx
        .wait_for(|&waves| waves >= after + 3)
        .await
        .unwrap();
    stop.store(true, Ordering::SeqCst);
    let confirmed = workload.await.unwrap();

    // Locks: a held lock missing after the takeover was lost to asynchronous replication, and
    // a second delivery then runs the body while the first holder still does.
    let mut locks_lost = Vec::new();
    for i in 0..HELD {
        let key = format!("report-{i}");
        let unit = UnitOfWork::new(HOLD.name(), key.as_str()).unwrap();
        let seen = tokio::time::timeout(HUNG, async {
            loop {
                match store.inspect(&unit).await {
                    Ok(seen) => break seen,
                    Err(_) => tokio::time::sleep(REDELIVERY).await,
                }
            }
        })
        .await
        .expect("inspect hung");
        if !seen.is_locked() {
            locks_lost.push(key);
        }
    }
    let mut second_holders = 0;
    let intruding = HOLD.clone().retry(RetryPolicy::no_wait());
    for i in 0..HELD {
        let intruder = intruding
            .call(format!("report-{i}"))
            .store(store.clone())
            .run(async { Ok::<_, Error>(String::new()) });
        match tokio::time::timeout(HUNG, intruder).await.expect("hung") {
            Ok(_) => second_holders += 1,
            Err(Error::Contended { .. }) => {}
            Err(Error::Store(err)) if err.is_retryable() => {}
            Err(other) => panic!("untyped: {other}"),
        }
    }
    finish_tx.send_replace(true);
    let mut holder_outcomes: BTreeMap<String, usize> = BTreeMap::new();
    for holder in holders {
        let outcome = match tokio::time::timeout(HUNG, holder)
            .await
            .expect("holder hung")
        {
            Ok(Ok(report)) => format!("{:?}", report.outcome),
            Ok(Err(Error::Store(err))) if err.is_retryable() => {
                format!("store: {}", err.kind())
            }
            Ok(Err(other)) => panic!("untyped: {other}"),
            Err(join) => panic!("a holder panicked: {join}"),
        };
        *holder_outcomes.entry(outcome).or_default() += 1;
    }

    // Markers: a result that `finish` confirmed and the promoted replica never got.
    let mut markers_lost = Vec::new();
    for key in &confirmed {
        let unit = UnitOfWork::new(WORK.name(), key.as_str()).unwrap();
        let seen = tokio::time::timeout(HUNG, async {
            loop {
                match store.inspect(&unit).await {
                    Ok(seen) => break seen,
                    Err(_) => tokio::time::sleep(REDELIVERY).await,
                }
            }
        })
        .await
        .expect("inspect hung");
        if !seen.is_done() {
            markers_lost.push(key.clone());
        }
    }

    let duplicates = ledger.duplicates();
    let untyped = ledger.untyped.lock().unwrap().clone();
    let gave_up = ledger.gave_up.lock().unwrap().len();
    let failures = ledger.failures.lock().unwrap().clone();
    figure(&format!(
        "cluster failover (kill -9 of 1 of 3 masters): {} task calls, {} failed with typed retryable errors {failures:?}, {} untyped, {} hung, {gave_up} given up; {} units confirmed done, markers lost {}; locks held {HELD} ({} on the killed master), locks lost {}, second holders {second_holders}; holders finished {holder_outcomes:?}; duplicate executions {}",
        ledger.calls.load(Ordering::Relaxed),
        ledger.failed(),
        untyped.len(),
        ledger.hung.load(Ordering::Relaxed),
        confirmed.len(),
        markers_lost.len(),
        held_on_victim.len(),
        locks_lost.len(),
        duplicates.len(),
    ));
    assert!(untyped.is_empty(), "{untyped:?}");
    assert_eq!(ledger.hung.load(Ordering::Relaxed), 0);
    // Only the killed master's slots can lose anything.
    for key in &locks_lost {
        assert!(
            held_on_victim.contains(key),
            "{key} lost its lock on a live master"
        );
    }
    for key in markers_lost.iter().chain(duplicates.keys()) {
        assert!(
            victim.owns(slot(&cluster, &cluster_store, &WORK, key)),
            "{key} lost its marker or ran twice on a live master"
        );
    }
    // And where a body did run twice, the later run had the larger fencing token, so a
    // database that checks it rejects the earlier writer.
    for (key, fences) in &duplicates {
        assert!(fences.windows(2).all(|w| w[0] < w[1]), "{key}: {fences:?}");
    }
    assert_eq!(cluster.masters().len(), 3);
}
