//! Misuse the runner refuses up front instead of failing later with a lock held: a task that
//! calls itself with its own key, a call outside a tokio runtime, a lock TTL below the floor.
//! And what it bears: a marker written before a deploy added a fingerprint, which is replayed
//! rather than refused; a body that blocks its thread while its lock is renewed (by a
//! watchdog, and in its own task); a result TTL shorter than the lock TTL.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use idempotask::{Error, Fingerprint, LockRenewal, MemoryStore, Outcome, Task};

#[tokio::test]
async fn a_task_that_calls_itself_with_its_own_key_is_refused_at_once() {
    let store = MemoryStore::new();
    let task = Task::new("recursive").lock_ttl(Duration::from_secs(2));
    let runs = AtomicUsize::new(0);
    let started = Instant::now();
    let outer: Result<String, Error> = task
        .call("k")
        .store(store.clone())
        .run(async {
            runs.fetch_add(1, Ordering::SeqCst);
            // Boxed: a task future holding another task future is large.
            let inner: Result<String, Error> = Box::pin(
                task.call("k")
                    .store(store.clone())
                    .run(async { Ok("inner".to_owned()) }),
            )
            .await;
            assert!(
                matches!(&inner, Err(Error::Reentered { task, key, .. }) if task == "recursive" && key == "k"),
                "{inner:?}"
            );
            // Another key of the same task is another unit: it runs.
            let other: String = Box::pin(
                task.call("other")
                    .store(store.clone())
                    .run(async { Ok::<_, Error>("other".to_owned()) }),
            )
            .await?;
            Ok(format!("outer, {other}"))
        })
        .await;
    assert_eq!(outer.unwrap(), "outer, other");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    // Refused at once, not after waiting out the outer call's 2 s lock.
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}

/// The smallest executor that is not tokio: polls on one thread, parks between wake-ups.
fn block_on<F: Future>(future: F) -> F::Output {
    struct Signal(Mutex<bool>, Condvar);
    impl Wake for Signal {
        fn wake(self: Arc<Self>) {
            *self.0.lock().unwrap() = true;
            self.1.notify_one();
        }
    }
    let signal = Arc::new(Signal(Mutex::new(false), Condvar::new()));
    let waker = Waker::from(Arc::clone(&signal));
    let mut cx = Context::from_waker(&waker);
    let mut future = std::pin::pin!(future);
    loop {
        if let Poll::Ready(output) = future.as_mut().poll(&mut cx) {
            return output;
        }
        let mut woken = signal.0.lock().unwrap();
        while !*woken {
            woken = signal.1.wait(woken).unwrap();
        }
        *woken = false;
    }
}

#[test]
fn a_call_outside_a_tokio_runtime_is_refused_before_the_store() {
    let store = MemoryStore::new();
    let runs = AtomicUsize::new(0);
    let task = Task::new("no-runtime").renew(true);
    let result: Result<u8, Error> = block_on(task.call("k").store(store.clone()).run(async {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok(1)
    }));
    assert!(matches!(result, Err(Error::NoRuntime)), "{result:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    // Nothing was taken: inside a runtime the unit runs at once.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let value: u8 = runtime
        .block_on(task.call("k").store(store).run(async { Ok::<_, Error>(2) }))
        .unwrap();
    assert_eq!(value, 2);
}

#[test]
#[should_panic(expected = "lock TTL must be at least `idempotask::MIN_TTL` (100 ms)")]
fn a_zero_lock_ttl_is_refused() {
    let _ = Task::new("zero").lock_ttl(Duration::ZERO);
}

// A 1 ms lock with `renew` was taken: on MemoryStore 2 or 3 of 8 concurrent deliveries ran
// their body (the lock expired before its first renewal), on Redis none did (every grant came
// too late). One floor, `MIN_TTL`, refuses it on every store.
#[test]
#[should_panic(expected = "lock TTL must be at least `idempotask::MIN_TTL` (100 ms)")]
fn a_lock_ttl_below_the_floor_is_refused() {
    let _ = Task::new("short")
        .lock_ttl(idempotask::MIN_TTL.saturating_sub(Duration::from_nanos(1)))
        .renew(true);
}

#[test]
fn a_lock_ttl_of_the_floor_is_taken() {
    let task = Task::new("floor").lock_ttl(idempotask::MIN_TTL);
    assert_eq!(task.settings().lock_ttl, Duration::from_millis(100));
}

#[tokio::test]
async fn a_result_stored_before_a_fingerprint_was_declared_is_replayed() {
    let store = MemoryStore::new();
    let task = Task::new("deployed");
    // Before the deploy: no fingerprint.
    let first: u32 = task
        .call("order-1")
        .store(store.clone())
        .run(async { Ok::<_, Error>(10) })
        .await
        .unwrap();
    // After it: the same arguments, now fingerprinted, get the stored result.
    let runs = AtomicUsize::new(0);
    let after: u32 = task
        .call("order-1")
        .fingerprint(Fingerprint::of(&(1200_u64,)).unwrap())
        .store(store.clone())
        .run(async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Error>(20)
        })
        .await
        .unwrap();
    assert_eq!((first, after, runs.load(Ordering::SeqCst)), (10, 10, 0));
    // A result stored with a fingerprint still refuses other arguments.
    let fingerprinted = Task::new("deployed-later");
    let _: u32 = fingerprinted
        .call("order-2")
        .fingerprint(Fingerprint::of(&(1200_u64,)).unwrap())
        .store(store.clone())
        .run(async { Ok::<_, Error>(1) })
        .await
        .unwrap();
    let other: Result<u32, Error> = fingerprinted
        .call("order-2")
        .fingerprint(Fingerprint::of(&(1300_u64,)).unwrap())
        .store(store)
        .run(async { Ok(2) })
        .await;
    assert!(matches!(other, Err(Error::KeyReuse { .. })), "{other:?}");
}

/// `renew(true)` keeps the lock of a body that blocks its thread (a synchronous call) past its
/// TTL: the watchdog is a task of its own, on another worker. A second delivery meanwhile finds
/// the unit busy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_keeps_the_lock_of_a_body_that_blocks_its_thread() {
    let store = MemoryStore::new();
    // Renewed every third of it, so each renewal has more than a second to land on a loaded
    // machine.
    let ttl = Duration::from_secs(2);
    let task = Arc::new(Task::new("blocking").lock_ttl(ttl).renew(true));
    let runs = Arc::new(AtomicUsize::new(0));
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let holder = {
        let (task, store, runs) = (Arc::clone(&task), store.clone(), Arc::clone(&runs));
        tokio::spawn(async move {
            task.call("k")
                .store(store)
                .run(async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    started_tx.send(()).unwrap();
                    // Blocks this worker thread for two and a half lock TTLs: the second
                    // delivery comes half a TTL past the first lock's expiry and a TTL before
                    // the body ends.
                    std::thread::sleep(ttl * 5 / 2);
                    Ok::<u8, Error>(1)
                })
                .await
        })
    };
    started_rx.await.unwrap();
    tokio::time::sleep(ttl + ttl / 2).await;
    let second: Result<u8, Error> = Task::new("blocking")
        .lock_ttl(ttl)
        .retry(idempotask::RetryPolicy::no_wait())
        .call("k")
        .store(store.clone())
        .run(async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok(2)
        })
        .await;
    assert!(
        matches!(second, Err(Error::Contended { .. })),
        "the blocked holder's lock was not renewed: {second:?}"
    );
    assert_eq!(holder.await.unwrap().unwrap(), 1);
    assert_eq!(runs.load(Ordering::SeqCst), 1, "both bodies ran");
}

/// `LockRenewal::InTask` renews from the body's own task, so a body that blocks its thread
/// past its TTL stops its renewals with it, as `LockRenewal::InTask` warns: the
/// lock runs out under it and it is told so (`LockLost`), never `Executed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_task_renewal_stops_while_the_body_blocks_its_thread_and_says_so() {
    let ttl = Duration::from_millis(300);
    let report = Task::new("blocking-cooperative")
        .lock_ttl(ttl)
        .lock_renewal(LockRenewal::InTask)
        .call("k")
        .store(MemoryStore::new())
        .run_reported(async move {
            std::thread::sleep(ttl * 2);
            Ok::<bool, Error>(idempotask::context().unwrap().lock_held())
        })
        .await
        .unwrap();
    assert!(!report.value, "the blocked body's lease was renewed");
    assert!(
        matches!(report.outcome, Outcome::LockLost { .. }),
        "{:?}",
        report.outcome
    );
}

/// `renew = "in_task"` on the attribute renews in the body's own task: a body that awaits past
/// its TTL keeps its lock (not `Off`), and one that then blocks its thread past it loses it (not
/// `Watchdog`, which renews through blocking).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_attributes_in_task_renewal_renews_while_the_body_awaits_and_not_while_it_blocks() {
    const TTL: Duration = Duration::from_secs(1);
    #[idempotask::idempotent_task(key = "r-{id}", lock_ttl = 1, renew = "in_task")]
    async fn renewed_in_its_task(id: u64) -> Result<(bool, bool), Error> {
        let ctx = idempotask::context().expect("inside the body");
        tokio::time::sleep(TTL * 2).await;
        let while_awaiting = ctx.lock_held();
        std::thread::sleep(TTL * 2);
        Ok((while_awaiting, ctx.lock_held()))
    }
    let held = idempotask::with_store(MemoryStore::new(), renewed_in_its_task(1))
        .await
        .unwrap();
    assert_eq!(held, (true, false), "(held after awaiting, after blocking)");
}

/// Renewal in the body's task holds through a body that only awaits but always has work
/// ready, which spends tokio's per-poll budget on every poll: the renewals are polled first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_task_renewal_holds_through_a_body_that_spends_its_budget() {
    // Renewed every third of it, so each renewal has more than a second to land on a loaded
    // machine.
    let ttl = Duration::from_secs(2);
    let report = Task::new("busy-cooperative")
        .lock_ttl(ttl)
        .lock_renewal(LockRenewal::InTask)
        .call("k")
        .store(MemoryStore::new())
        .run_reported(async move {
            // Half a TTL past the lock's expiry, were it not renewed.
            let until = tokio::time::Instant::now() + ttl * 3 / 2;
            while tokio::time::Instant::now() < until {
                tokio::task::consume_budget().await;
            }
            Ok::<bool, Error>(idempotask::context().unwrap().lock_held())
        })
        .await
        .unwrap();
    assert!(report.value, "the busy body's lease ran out");
    assert_eq!(report.outcome, Outcome::Executed);
}

/// A body that panics after its renewals began, with renewal in its own task: the panic
/// reaches the caller, the lock is released (the next delivery runs at once), and nothing is
/// stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_under_in_task_renewal_frees_the_lock_and_resumes() {
    let store = MemoryStore::new();
    let ttl = Duration::from_millis(300);
    let task = Task::new("panicking-cooperative")
        .lock_ttl(ttl)
        .lock_renewal(LockRenewal::InTask)
        .retry(idempotask::RetryPolicy::no_wait());
    let panicking = {
        let (task, store) = (task.clone(), store.clone());
        tokio::spawn(async move {
            task.call("k")
                .store(store)
                .run(async move {
                    // Past the first renewal, so that one is in flight or done.
                    tokio::time::sleep(ttl / 2).await;
                    panic!("the body panicked");
                    #[allow(unreachable_code)]
                    Ok::<u8, Error>(0)
                })
                .await
        })
    };
    let joined = panicking.await;
    assert!(
        joined.is_err_and(|err| err.is_panic()),
        "the panic was swallowed"
    );
    let next: u8 = task
        .call("k")
        .store(store)
        .run(async { Ok::<u8, Error>(2) })
        .await
        .expect("the panicked holder's lock was left behind");
    assert_eq!(next, 2, "a result was stored for the panicked body");
}

/// A result JSON cannot carry (`NaN` is written as `null`, which does not read back as a
/// float) is found at the first execution: duplicates get the unstorable error, not a decoding
/// error that reads like a changed return type, and the body does not run again.
#[tokio::test]
async fn a_result_that_does_not_survive_json_is_stored_as_unstorable() {
    let store = MemoryStore::new();
    let task = Task::new("not-a-number");
    let runs = AtomicUsize::new(0);
    let first: f64 = task
        .call("k")
        .store(store.clone())
        .run(async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Error>(f64::NAN)
        })
        .await
        .unwrap();
    assert!(first.is_nan());
    let again: Result<f64, Error> = task
        .call("k")
        .store(store)
        .run(async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok(1.0)
        })
        .await;
    assert!(
        matches!(
            &again,
            Err(Error::Codec {
                kind: idempotask::CodecErrorKind::Unstorable,
                ..
            })
        ),
        "{again:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

// `Task::result_ttl` shorter than its lock TTL was taken as it was: the result expired while
// a duplicate could still be waiting out the first delivery's lock, and the duplicate ran.
#[tokio::test]
async fn a_result_ttl_shorter_than_the_lock_ttl_is_kept_as_long_as_the_lock() {
    let store = MemoryStore::new();
    let lock_ttl = Duration::from_secs(3);
    let task = Task::new("short_result")
        .lock_ttl(lock_ttl)
        .result_ttl(Duration::from_millis(20));
    assert_eq!(task.settings().result_ttl, lock_ttl);
    let runs = AtomicUsize::new(0);
    let deliver = || {
        task.call("k").store(store.clone()).run(async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Error>(7_u32)
        })
    };
    assert_eq!(deliver().await.unwrap(), 7);
    // Past the result TTL that was asked for, well within the lock TTL: the result is there.
    tokio::time::sleep(Duration::from_millis(120)).await;
    assert_eq!(deliver().await.unwrap(), 7);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}
