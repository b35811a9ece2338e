//! The renewal watchdog while the body blocks its worker thread, on every store: two
//! deliveries of one key on a multi-thread runtime with one worker thread and with two, a body
//! that sleeps its thread for more than three lock TTLs. The lock must be renewed all along:
//! the body runs once, its result is stored as that of a lock still held, and the second
//! delivery, which keeps asking, gets that result instead of running beside it. And renewals
//! that lose the lock (in the body's task and by the watchdog) end, and the call says so.
//!
// `renew` lost to a thread-blocking body on Redis: the worker that ran the body was the one
// parked on tokio's timer and I/O driver (it had just been woken by the reply to `begin`, or by
// a timer), and tokio wakes no other worker for the chain of tasks that wake-up runs. With the
// body blocking that thread, nothing polled the timers or the sockets: the watchdog's sleep
// never ended, the lock expired, and a second delivery ran its body.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idempotask::store::Store;
use idempotask::{Error, LockRenewal, MemoryStore, Outcome, RetryPolicy, Task};
use idempotask_test_support as support;

use support::RedisServer;
use support::cluster::RedisCluster;
use support::postgres::PostgresServer;
use support::quorum::Quorum;

/// Long enough that a renewal gets through on a machine whose cores are busy (one every
/// 667 ms, each with 1.3 s to arrive); a watchdog that cannot run at all loses it mid-body.
const LOCK_TTL: Duration = Duration::from_secs(2);
/// How long the body blocks its thread: more than three lock TTLs.
const BLOCKED_FOR: Duration = Duration::from_millis(6500);
/// The worker thread counts the guarantees guide says are enough.
const WORKER_THREADS: [usize; 2] = [1, 2];

/// Two deliveries of one key on a runtime of each of [`WORKER_THREADS`] worker threads, each
/// arriving after a short wait (a consumer woken by its timer or its socket, as a queue
/// consumer is), the second 50 ms after the first. The body that gets the lock blocks the
/// worker thread it runs on; the other delivery keeps asking every 50 ms at most, for far
/// longer than the body blocks, so that a lock that expires even once is taken by it. Panics
/// unless the body ran exactly once, never beside another run, recorded as a lock still held,
/// and both deliveries got its value.
fn blocking_body_runs_once<S, F>(connect: impl Fn() -> F)
where
    S: Store + Clone,
    F: Future<Output = S>,
{
    for workers in WORKER_THREADS {
        blocking_body_runs_on(workers, &connect);
    }
}

/// [`blocking_body_runs_once`] on a runtime of `workers` worker threads.
fn blocking_body_runs_on<S, F>(workers: usize, connect: impl Fn() -> F)
where
    S: Store + Clone,
    F: Future<Output = S>,
{
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let store = connect().await;
        // One key per runtime: the runs of one test share their server.
        let key = format!("blocking-{workers}");
        let task = Arc::new(
            Task::new("renewal_while_blocked")
                .lock_ttl(LOCK_TTL)
                .renew(true)
                .retry(
                    RetryPolicy::new()
                        .max_backoff(Duration::from_millis(50))
                        .max_attempts(10_000)
                        .max_wait(BLOCKED_FOR * 10),
                ),
        );
        let runs = Arc::new(AtomicUsize::new(0));
        let inside = Arc::new(AtomicUsize::new(0));
        let overlaps = Arc::new(AtomicUsize::new(0));
        let deliveries: Vec<_> = [Duration::from_millis(10), Duration::from_millis(60)]
            .into_iter()
            .enumerate()
            .map(|(delivery, arrives_after)| {
                let (task, store, key) = (Arc::clone(&task), store.clone(), key.clone());
                let (runs, inside, overlaps) =
                    (Arc::clone(&runs), Arc::clone(&inside), Arc::clone(&overlaps));
                tokio::spawn(async move {
                    tokio::time::sleep(arrives_after).await;
                    task.call(key)
                        .store(store)
                        .run_reported(async move {
                            runs.fetch_add(1, Ordering::SeqCst);
                            if inside.fetch_add(1, Ordering::SeqCst) > 0 {
                                overlaps.fetch_add(1, Ordering::SeqCst);
                            }
                            // A synchronous call: the thread does nothing else meanwhile.
                            std::thread::sleep(BLOCKED_FOR);
                            inside.fetch_sub(1, Ordering::SeqCst);
                            Ok::<usize, Error>(delivery)
                        })
                        .await
                })
            })
            .collect();
        let mut reports = Vec::new();
        for delivery in deliveries {
            reports.push(
                delivery
                    .await
                    .unwrap()
                    .expect("both deliveries get the value"),
            );
        }
        assert_eq!(
            (
                runs.load(Ordering::SeqCst),
                overlaps.load(Ordering::SeqCst)
            ),
            (1, 0),
            "with {workers} worker thread(s), the lock expired while the body blocked its thread, and the second delivery ran too: {reports:?}"
        );
        // Either delivery may be the one that runs: on a busy machine the second one can ask
        // first.
        let mut outcomes: Vec<_> = reports.iter().map(|report| report.outcome).collect();
        outcomes.sort_by_key(|outcome| *outcome != Outcome::Executed);
        assert_eq!(
            outcomes,
            [Outcome::Executed, Outcome::Replayed],
            "with {workers} worker thread(s), the lock was not renewed while the body blocked its thread: {reports:?}"
        );
        assert_eq!(reports[1].value, reports[0].value, "{reports:?}");
    });
}

#[test]
fn memory() {
    blocking_body_runs_once(|| async { MemoryStore::new() });
}

/// Redis 7: `renew` is a script.
#[test]
fn redis() {
    let server = RedisServer::start();
    blocking_body_runs_once(|| server.store());
}

/// Valkey 8.1: `renew` is a plain `SET … IFEQ`.
#[test]
fn valkey() {
    let server = RedisServer::start_valkey();
    blocking_body_runs_once(|| server.store());
}

#[test]
fn cluster() {
    let cluster = RedisCluster::start();
    blocking_body_runs_once(|| cluster.fresh_store());
}

#[test]
fn quorum() {
    let quorum = Quorum::start(3);
    blocking_body_runs_once(|| quorum.store());
}

#[test]
fn postgres() {
    let server = PostgresServer::start();
    blocking_body_runs_once(|| server.store());
}

/// Renewals that end (the store stays down past the lock TTL, so the lease runs out) are not
/// polled again, in the body's task as by the watchdog: the body runs on to its end, and the
/// call reports the lost lock instead of `Executed`, in both modes.
#[test]
fn renewals_that_lose_the_lock_end_and_the_call_says_so() {
    use support::faulty_store::FaultyStore;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let ttl = Duration::from_millis(300);
        for how in [LockRenewal::InTask, LockRenewal::Watchdog] {
            let store = FaultyStore::new(MemoryStore::new());
            let outage = store.clone();
            let report = Task::new("renewal_lost")
                .lock_ttl(ttl)
                .lock_renewal(how)
                .call(format!("k-{how:?}"))
                .store(store)
                .run_reported(async move {
                    outage.down(true);
                    // The renewals fail through the whole TTL, and the lease runs out.
                    tokio::time::sleep(ttl * 2).await;
                    outage.down(false);
                    // The body goes on awaiting after its renewals ended.
                    tokio::time::sleep(ttl).await;
                    Ok::<bool, Error>(idempotask::context().unwrap().lock_held())
                })
                .await
                .unwrap();
            assert!(!report.value, "{how:?}: the lease was held");
            assert!(
                matches!(report.outcome, Outcome::LockLost { .. }),
                "{how:?}: {:?}",
                report.outcome
            );
        }
    });
}
