//! What a store whose units live inside a transaction ([`TransactionScope`]) must do, through
//! the runner that drives it ([`Call::run_in_transaction`](idempotask::Call::run_in_transaction)).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use idempotask::store::{LockToken, SharedStore, Store, TransactionScope};
use idempotask::{Error, Task};
use tokio::task::JoinSet;

use super::{LONG, acquire};

/// A store the transaction checks can open fresh transactions on, and call the plain way too.
///
#[doc = include_str!("opens_transactions.md")]
pub trait OpensTransactions: Send + Sync + 'static {
    /// One transaction of the store.
    type Transaction<'a>: TransactionScope
    where
        Self: 'a;

    /// The same store, for plain calls and inspection.
    fn plain(&self) -> SharedStore;

    /// A fresh transaction.
    fn open(&self) -> impl Future<Output = Self::Transaction<'_>> + Send;
}

fn task(name: &'static str) -> Task {
    Task::new(name)
}

/// Checks that a committed transaction's result is replayed, in a transaction and outside.
///
/// # Panics
/// When the store does not.
#[doc = example!(transactions a_committed_transaction_is_replayed)]
pub async fn a_committed_transaction_is_replayed<S: OpensTransactions>(store: S) {
    let task = task("tx_replayed");
    let runs = AtomicUsize::new(0);
    for amount in [500, 900] {
        let moved: u32 = task
            .call("transfer-1")
            .run_in_transaction(store.open().await, async |_| {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Error>(amount)
            })
            .await
            .unwrap();
        assert_eq!(moved, 500);
    }
    let plain: u32 = task
        .call("transfer-1")
        .store(store.plain())
        .run(async { Ok::<_, Error>(0) })
        .await
        .unwrap();
    assert_eq!((plain, runs.load(Ordering::SeqCst)), (500, 1));
}

/// Checks that a body's `Err` commits nothing: no marker, and the next delivery runs.
///
/// # Panics
/// When the store does not.
#[doc = example!(transactions a_failed_transaction_stores_nothing)]
pub async fn a_failed_transaction_stores_nothing<S: OpensTransactions>(store: S) {
    let task = task("tx_failed");
    let failed: Result<u32, Error> = task
        .call("transfer-2")
        .run_in_transaction(store.open().await, async |_| Err(Error::NotConfigured))
        .await;
    assert!(matches!(failed, Err(Error::NotConfigured)), "{failed:?}");
    let seen = store.plain().inspect(&unit_of(&task, "transfer-2")).await;
    assert!(!seen.unwrap().is_done());
    let next: u32 = task
        .call("transfer-2")
        .run_in_transaction(store.open().await, async |_| Ok::<_, Error>(7))
        .await
        .unwrap();
    assert_eq!(next, 7);
}

/// Checks that a call dropped while its body runs stores nothing, and the next delivery runs.
///
/// # Panics
/// When the store does not.
#[doc = example!(transactions a_dropped_transaction_stores_nothing)]
pub async fn a_dropped_transaction_stores_nothing<S: OpensTransactions>(store: S) {
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let dropped = task("tx_dropped");
    let mut call = Box::pin(dropped.call("transfer-3").run_in_transaction(
        store.open().await,
        async |_| {
            started_tx.send(()).unwrap();
            std::future::pending::<()>().await;
            Ok::<u32, Error>(1)
        },
    ));
    tokio::select! {
        ended = &mut call => panic!("the body never ends, yet the call did: {ended:?}"),
        started = started_rx => started.unwrap(),
    }
    drop(call);
    // The next delivery waits for the dropped transaction's rollback, then runs.
    let next: u32 = dropped
        .call("transfer-3")
        .run_in_transaction(store.open().await, async |_| Ok::<_, Error>(2))
        .await
        .unwrap();
    assert_eq!(next, 2);
}

/// Checks that concurrent transactional deliveries of one key run the body once, and that
/// every one of them gets its result.
///
/// # Panics
/// When the store does not.
#[doc = example!(transactions concurrent_transactions_run_the_body_once)]
pub async fn concurrent_transactions_run_the_body_once<S: OpensTransactions>(store: S) {
    // Local tasks: the deliveries interleave at every await, as spawned ones would, without
    // asking the compiler to prove a generic transaction's body `Send`.
    let store = Arc::new(store);
    let runs = Arc::new(AtomicUsize::new(0));
    let local = tokio::task::LocalSet::new();
    let values = local
        .run_until(async {
            let mut deliveries = JoinSet::new();
            for delivery in 0..8_u32 {
                let store = Arc::clone(&store);
                let runs = Arc::clone(&runs);
                deliveries.spawn_local(async move {
                    task("tx_concurrent")
                        .call("transfer-4")
                        .run_in_transaction(store.open().await, async |_| {
                            runs.fetch_add(1, Ordering::SeqCst);
                            tokio::task::yield_now().await;
                            Ok::<_, Error>(delivery)
                        })
                        .await
                });
            }
            let mut values = Vec::new();
            while let Some(joined) = deliveries.join_next().await {
                values.push(joined.unwrap().unwrap());
            }
            values
        })
        .await;
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert!(
        values.windows(2).all(|pair| pair[0] == pair[1]),
        "{values:?}"
    );
}

/// Checks that a transaction meeting a plain call's lock is contended at once and does not
/// run; the plain holder can still finish.
///
/// # Panics
/// When the store does not.
#[doc = example!(transactions a_plain_holder_makes_a_transaction_contended)]
pub async fn a_plain_holder_makes_a_transaction_contended<S: OpensTransactions>(store: S) {
    let task = task("tx_contended");
    let plain = store.plain();
    let unit = unit_of(&task, "transfer-5");
    let holder = LockToken::generate();
    acquire(&plain, &unit, &holder, LONG).await;
    let runs = AtomicUsize::new(0);
    let contended: Result<u32, Error> = task
        .call("transfer-5")
        .run_in_transaction(store.open().await, async |_| {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok(1)
        })
        .await;
    assert!(
        matches!(contended, Err(Error::Contended { .. })),
        "{contended:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    assert!(plain.release(&unit, &holder).await.unwrap());
}

/// The unit a check's call of `task` with `key` runs.
fn unit_of(task: &Task, key: &str) -> idempotask::store::UnitOfWork {
    idempotask::store::UnitOfWork::new(task.name(), key).unwrap()
}
