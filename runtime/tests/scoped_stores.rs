//! Users' own tests, as the testing guide teaches them: several tests in one binary, run in
//! parallel by cargo, each with a store scoped to it. With `install` in each test instead, one
//! task ran 29 times for 20 keys: a test's duplicates met the fresh store another test had just
//! installed. Here a third test keeps installing fresh stores the whole time, and the scoped
//! tests must not notice.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use idempotask::testing::deliver_concurrently;
use idempotask::{Error, MemoryStore, Task, idempotent_task};

const KEYS: u64 = 20;
const ROUNDS: u64 = 20;

static RECEIPTS: AtomicU32 = AtomicU32::new(0);
static REFUNDS: AtomicU32 = AtomicU32::new(0);
/// Set while a scoped test still runs, so that the hostile neighbour keeps installing.
static SCOPED_RUNNING: AtomicU32 = AtomicU32::new(2);

#[idempotent_task(key = "receipt-{round}-{order_id}")]
async fn send_receipt(round: u64, order_id: u64) -> Result<u64, Error> {
    RECEIPTS.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(2)).await;
    Ok(order_id)
}

#[idempotent_task(key = "refund-{round}-{order_id}")]
async fn refund(round: u64, order_id: u64) -> Result<u64, Error> {
    REFUNDS.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(2)).await;
    Ok(order_id)
}

/// The order the `delivery`-th delivery of a round is for: each one twice.
fn order_of(delivery: usize) -> u64 {
    u64::try_from(delivery).unwrap() % KEYS
}

/// Every key of a round delivered twice at once, in a store scoped to the round; answers how
/// many times the body ran in all.
async fn rounds<F, Fut>(task: F, runs: &AtomicU32) -> u32
where
    F: Fn(u64, u64) -> Fut + Copy + Send + 'static,
    Fut: Future<Output = Result<u64, Error>> + Send + 'static,
{
    for round in 0..ROUNDS {
        let results = idempotask::with_store(MemoryStore::new(), async move {
            let deliveries = usize::try_from(2 * KEYS).unwrap();
            deliver_concurrently(deliveries, move |i| task(round, order_of(i))).await
        })
        .await;
        for (i, result) in results.into_iter().enumerate() {
            assert_eq!(result.unwrap(), order_of(i));
        }
    }
    SCOPED_RUNNING.fetch_sub(1, Ordering::SeqCst);
    runs.load(Ordering::SeqCst)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn receipts_run_once_per_key_in_a_scoped_store() {
    let runs = rounds(send_receipt, &RECEIPTS).await;
    assert_eq!(u64::from(runs), KEYS * ROUNDS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn refunds_run_once_per_key_in_a_scoped_store() {
    let runs = rounds(refund, &REFUNDS).await;
    assert_eq!(u64::from(runs), KEYS * ROUNDS);
}

/// The neighbour that replaces the process-wide store as fast as it can while the scoped
/// tests run: what two tests that each `install` do to each other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_neighbour_installing_stores_all_the_time() {
    let installed = AtomicBool::new(false);
    while SCOPED_RUNNING.load(Ordering::SeqCst) > 0 {
        idempotask::install(MemoryStore::new());
        installed.store(true, Ordering::SeqCst);
        tokio::task::yield_now().await;
    }
    assert!(installed.load(Ordering::SeqCst));
}

#[tokio::test]
async fn a_scoped_store_comes_before_the_installed_one_and_only_inside() {
    let task = Task::new("scoped_precedence");
    let scoped = MemoryStore::new();
    let unit = idempotask::store::UnitOfWork::new("scoped_precedence", "k").unwrap();
    let value: u8 = idempotask::with_store(scoped.clone(), async {
        task.call("k").run(async { Ok::<_, Error>(1) }).await
    })
    .await
    .unwrap();
    assert_eq!(value, 1);
    let seen = idempotask::store::Store::inspect(&scoped, &unit).await;
    assert!(seen.unwrap().is_done(), "the scoped store holds the result");
    // Outside the scope, the call is back to the installed store (some other test's, or none):
    // the scoped store sees no second call.
    let _ = task.call("k2").run(async { Ok::<_, Error>(2) }).await;
    let unit2 = idempotask::store::UnitOfWork::new("scoped_precedence", "k2").unwrap();
    let seen = idempotask::store::Store::inspect(&scoped, &unit2).await;
    assert!(!seen.unwrap().is_done());
}
