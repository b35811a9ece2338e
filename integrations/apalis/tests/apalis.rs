//! The apalis layer, driven as apalis drives it: duplicates replay the stored value, handler
//! errors pass through uncached, a busy key is an error apalis retries later, and a job without
//! a key never runs unprotected, and a job whose unit is held in doubt is killed, not retried. The kill -9 scenarios on real backends are the runs of the
//! `apalis_worker` example on apalis-redis and apalis-postgres, in `tests/example_queues.rs`.

use std::future::poll_fn;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use apalis::prelude::{
    AbortError, BoxDynError, Event, EventListenerExt, MemoryStorage, RetryAfterError,
    RetryPolicy as ApalisRetryPolicy, Service, Task as Job, TaskBuilder, TaskSink, WorkerBuilder,
    WorkerBuilderExt,
};
use idempotask::{InDoubt, MemoryStore, RetryPolicy, Task};
use idempotask_apalis::{IdempotencyKey, Idempotent, MissingKey};
use idempotask_test_support::doubt::leave_in_doubt;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Order {
    id: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Receipt {
    order: u64,
    charge: u32,
}

fn by_order(order: &Order) -> String {
    format!("order-charge-{}", order.id)
}

/// One delivery of `job`, as a worker makes it: wait until ready, then call.
async fn deliver<S: Service<Job<Order>>>(
    service: &mut S,
    job: Job<Order>,
) -> Result<S::Response, S::Error> {
    poll_fn(|cx| service.poll_ready(cx)).await?;
    service.call(job).await
}

/// A handler that charges the order and numbers the charge; its first `fail_first` calls fail
/// with an `AbortError` before charging.
fn charging(
    charges: Arc<AtomicU32>,
    fail_first: u32,
) -> impl FnMut(Order) -> std::pin::Pin<Box<dyn Future<Output = Result<Receipt, BoxDynError>> + Send>>
+ Clone
+ Send
+ 'static {
    let calls = Arc::new(AtomicU32::new(0));
    move |order: Order| {
        let (charges, calls) = (Arc::clone(&charges), Arc::clone(&calls));
        Box::pin(async move {
            if calls.fetch_add(1, Ordering::SeqCst) < fail_first {
                return Err(AbortError::new("the card was declined").into());
            }
            let charge = charges.fetch_add(1, Ordering::SeqCst) + 1;
            Ok(Receipt {
                order: order.id,
                charge,
            })
        })
    }
}

#[tokio::test]
async fn a_duplicate_job_gets_the_stored_value_and_the_handler_runs_once() {
    let charges = Arc::new(AtomicU32::new(0));
    let mut service = Idempotent::new(Task::new("charge_dup"), by_order)
        .store(MemoryStore::new())
        .handler(charging(Arc::clone(&charges), 0));

    let first = deliver(&mut service, Job::new(Order { id: 1 }))
        .await
        .unwrap();
    let again = deliver(&mut service, Job::new(Order { id: 1 }))
        .await
        .unwrap();
    let other = deliver(&mut service, Job::new(Order { id: 2 }))
        .await
        .unwrap();

    assert_eq!(
        first,
        Receipt {
            order: 1,
            charge: 1
        }
    );
    assert_eq!(again, first, "the duplicate replays the first receipt");
    assert_eq!(
        other,
        Receipt {
            order: 2,
            charge: 2
        }
    );
    assert_eq!(charges.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_handler_error_passes_through_uncached_and_the_next_attempt_runs() {
    let charges = Arc::new(AtomicU32::new(0));
    let mut service = Idempotent::new(Task::new("charge_err"), by_order)
        .store(MemoryStore::new())
        .handler(charging(Arc::clone(&charges), 1));

    let failed = deliver(&mut service, Job::new(Order { id: 3 }))
        .await
        .unwrap_err();
    // apalis decides Killed vs Failed by downcasting the error it gets: it must be the handler's.
    assert!(failed.downcast_ref::<AbortError>().is_some(), "{failed:?}");
    assert_eq!(charges.load(Ordering::SeqCst), 0);

    let retried = deliver(&mut service, Job::new(Order { id: 3 }))
        .await
        .unwrap();
    assert_eq!(
        retried,
        Receipt {
            order: 3,
            charge: 1
        }
    );
    let duplicate = deliver(&mut service, Job::new(Order { id: 3 }))
        .await
        .unwrap();
    assert_eq!(duplicate, retried);
    assert_eq!(charges.load(Ordering::SeqCst), 1);
}

// A panicking handler unwound through the layer: apalis got no error to retry, the job was
// left to however its worker survives a panic.
#[tokio::test]
async fn a_panicking_handler_is_an_error_the_lock_released_and_the_next_attempt_runs() {
    let charges = Arc::new(AtomicU32::new(0));
    let calls = Arc::new(AtomicU32::new(0));
    let handler = {
        let (charges, calls) = (Arc::clone(&charges), Arc::clone(&calls));
        move |order: Order| {
            let (charges, calls) = (Arc::clone(&charges), Arc::clone(&calls));
            async move {
                assert!(
                    calls.fetch_add(1, Ordering::SeqCst) > 0,
                    "the gateway client panicked"
                );
                let charge = charges.fetch_add(1, Ordering::SeqCst) + 1;
                Ok::<_, BoxDynError>(Receipt {
                    order: order.id,
                    charge,
                })
            }
        }
    };
    let mut service = Idempotent::new(Task::new("charge_panic"), by_order)
        .store(MemoryStore::new())
        .handler(handler);

    let failed = deliver(&mut service, Job::new(Order { id: 8 }))
        .await
        .unwrap_err();
    let panic = failed
        .downcast_ref::<idempotask::Panicked>()
        .unwrap_or_else(|| panic!("{failed:?}"));
    assert_eq!(panic.message(), "the gateway client panicked");
    // Not an `AbortError`: apalis retries it. The lock was released, so the retry runs at once.
    assert!(failed.downcast_ref::<AbortError>().is_none());
    let retried = deliver(&mut service, Job::new(Order { id: 8 }))
        .await
        .unwrap();
    assert_eq!(
        retried,
        Receipt {
            order: 8,
            charge: 1
        }
    );
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_busy_key_is_a_retry_after_error_and_nothing_runs() {
    let store = Arc::new(MemoryStore::new());
    // The task's own retry policy applies: give up at the first busy answer.
    let task = Task::new("charge_busy").retry(RetryPolicy::no_wait());
    let charges = Arc::new(AtomicU32::new(0));
    let mut service = Idempotent::new(task.clone(), by_order)
        .store(store.clone())
        .handler(charging(Arc::clone(&charges), 0));

    // Another worker holds the key of order 4 until told to finish.
    let (started_tx, started) = tokio::sync::oneshot::channel();
    let (finish, finish_rx) = tokio::sync::oneshot::channel::<()>();
    let holder_task = task.clone();
    let holder_store = store.clone();
    let holder = tokio::spawn(async move {
        holder_task
            .call("order-charge-4")
            .store(holder_store)
            .run(async {
                started_tx.send(()).unwrap();
                finish_rx.await.unwrap();
                Ok::<_, idempotask::Error>(Receipt {
                    order: 4,
                    charge: 99,
                })
            })
            .await
    });
    started.await.unwrap();

    let busy = deliver(&mut service, Job::new(Order { id: 4 }))
        .await
        .unwrap_err();
    let retry = busy
        .downcast_ref::<RetryAfterError>()
        .unwrap_or_else(|| panic!("not a RetryAfterError: {busy:?}"));
    let cause = std::error::Error::source(retry).unwrap();
    assert!(
        matches!(
            cause.downcast_ref::<idempotask::Error>(),
            Some(idempotask::Error::Contended { .. })
        ),
        "{cause:?}"
    );
    assert!(retry.get_duration() <= task.settings().lock_ttl);
    assert_eq!(charges.load(Ordering::SeqCst), 0, "nothing ran");

    // Once the holder finishes, the retry gets its result.
    finish.send(()).unwrap();
    holder.await.unwrap().unwrap();
    let later = deliver(&mut service, Job::new(Order { id: 4 }))
        .await
        .unwrap();
    assert_eq!(
        later,
        Receipt {
            order: 4,
            charge: 99
        }
    );
    assert_eq!(charges.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn the_push_key_is_an_opt_in_source_and_a_job_without_one_never_runs() {
    let charges = Arc::new(AtomicU32::new(0));
    let mut service = Idempotent::new(Task::new("charge_push_key"), IdempotencyKey)
        .store(MemoryStore::new())
        .handler(charging(Arc::clone(&charges), 0));
    let keyed = |id| {
        TaskBuilder::new(Order { id })
            .idempotency_key("checkout-77")
            .build()
    };

    let first = deliver(&mut service, keyed(5)).await.unwrap();
    // Same push key, other arguments: the key names the operation, so it replays.
    let again = deliver(&mut service, keyed(6)).await.unwrap();
    assert_eq!(again, first);

    let unkeyed = deliver(&mut service, Job::new(Order { id: 8 }))
        .await
        .unwrap_err();
    let abort = unkeyed
        .downcast_ref::<AbortError>()
        .unwrap_or_else(|| panic!("not an AbortError: {unkeyed:?}"));
    let cause = std::error::Error::source(abort).unwrap();
    assert!(cause.downcast_ref::<MissingKey>().is_some(), "{cause:?}");
    assert_eq!(charges.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_job_whose_unit_is_in_doubt_is_killed_not_retried_and_nothing_runs() {
    let store = Arc::new(MemoryStore::new());
    // A delivery of order 9 took the lock and its worker was killed before it stored a result.
    leave_in_doubt(&store, "charge_in_doubt", "order-charge-9").await;
    let mut queue = MemoryStorage::new();
    queue.push(Order { id: 9 }).await.unwrap();
    queue.push(Order { id: 10 }).await.unwrap();
    // Each delivery of order 9 reads its key once, the retries apalis makes too.
    let deliveries_of_9 = Arc::new(AtomicU32::new(0));
    let counted = Arc::clone(&deliveries_of_9);
    let key = move |order: &Order| {
        if order.id == 9 {
            counted.fetch_add(1, Ordering::SeqCst);
        }
        by_order(order)
    };
    // The handler's calls, by order; its first call fails, which apalis retries.
    let calls = Arc::new(Mutex::new(Vec::new()));
    let handler = {
        let calls = Arc::clone(&calls);
        move |order: Order| {
            let calls = Arc::clone(&calls);
            async move {
                let mut calls = calls.lock().unwrap();
                calls.push(order.id);
                if calls.len() == 1 {
                    return Err::<Receipt, BoxDynError>("the gateway timed out".into());
                }
                Ok(Receipt {
                    order: order.id,
                    charge: 1,
                })
            }
        }
    };
    let charge_once = Idempotent::new(Task::new("charge_in_doubt").in_doubt(InDoubt::Hold), key)
        .store(Arc::clone(&store))
        .handler(handler);
    let held = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&held);
    WorkerBuilder::new("charger-in-doubt")
        .backend(queue)
        .concurrency(1)
        .retry(ApalisRetryPolicy::retries(3))
        .on_event(move |worker, event| match event {
            Event::Error(error) => {
                let abort = error.downcast_ref::<AbortError>();
                let cause = abort.and_then(|abort| std::error::Error::source(abort));
                let cause = cause.and_then(|cause| cause.downcast_ref::<idempotask::Error>());
                seen.lock()
                    .unwrap()
                    .push(matches!(cause, Some(idempotask::Error::InDoubt { .. })));
            }
            Event::Success(_) => worker.stop().unwrap(),
            _ => {}
        })
        .build(charge_once)
        .run()
        .await
        .unwrap();

    // What apalis did: the in-doubt job ended in one abort, which its retry policy does not
    // retry, while order 10's failure was retried; the handler never saw order 9.
    assert_eq!(
        *held.lock().unwrap(),
        [true],
        "one error, the in-doubt abort"
    );
    assert_eq!(
        deliveries_of_9.load(Ordering::SeqCst),
        1,
        "killed, not retried"
    );
    assert_eq!(
        *calls.lock().unwrap(),
        [10, 10],
        "the retry policy retries failures"
    );
}

static WORKER_CHARGES: AtomicU32 = AtomicU32::new(0);

async fn charge(order: Order) -> Result<Receipt, BoxDynError> {
    let charge = WORKER_CHARGES.fetch_add(1, Ordering::SeqCst) + 1;
    Ok(Receipt {
        order: order.id,
        charge,
    })
}

#[tokio::test]
async fn a_worker_built_with_the_wrapped_handler_charges_each_order_once() {
    let mut queue = MemoryStorage::new();
    // Orders 1..=3, each delivered twice.
    let deliveries = [1, 2, 1, 3, 2, 3];
    for id in deliveries {
        queue.push(Order { id }).await.unwrap();
    }
    let charge_once = Idempotent::new(Task::new("charge_worker"), by_order)
        .store(MemoryStore::new())
        .handler(charge);
    let answered = AtomicU32::new(0);
    WorkerBuilder::new("charger")
        .backend(queue)
        .on_event(move |worker, event| {
            // Every delivery, the replayed ones too, ends in a success the worker reports.
            if matches!(event, Event::Success(_))
                && answered.fetch_add(1, Ordering::SeqCst) + 1 == 6
            {
                worker.stop().unwrap();
            }
        })
        .build(charge_once)
        .run()
        .await
        .unwrap();
    assert_eq!(WORKER_CHARGES.load(Ordering::SeqCst), 3);
}
