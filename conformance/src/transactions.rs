//! What a store whose units live inside a transaction ([`TransactionScope`]) must do, through
//! the runner that drives it ([`Call::run_in_transaction`](idempotask::Call::run_in_transaction)).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idempotask::store::{Begin, Fencing, LockToken, SharedStore, Store, StoreError};
use idempotask::store::{StoreErrorKind, TransactionScope, UnitOfWork};
use idempotask::{Error, RetryPolicy, StepErrorKind, Task};
use tokio::task::JoinSet;

use super::{LONG, acquire, outlive};

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

/// Checks that a transaction's steps are recorded outside it: a body that fails after a step
/// rolls back, and the next delivery replays the step instead of running its effect again,
/// then commits. A store whose transactions record no steps
/// ([`TransactionScope::step_store`]) must refuse the step before its effect instead.
///
/// # Panics
/// When the store does neither.
#[doc = example!(transactions steps_outlive_a_rolled_back_transaction)]
pub async fn steps_outlive_a_rolled_back_transaction<S: OpensTransactions>(store: S) {
    let task = task("tx_steps");
    let charges = AtomicUsize::new(0);
    for fails in [true, false] {
        let paid: Result<usize, Error> = task
            .call("transfer-8")
            .run_in_transaction(store.open().await, async |_| {
                let ctx = idempotask::context().expect("inside a task");
                let charge = ctx
                    .step("charge", async {
                        Ok::<_, Error>(charges.fetch_add(1, Ordering::SeqCst) + 1)
                    })
                    .await?;
                if fails {
                    return Err(Error::NotConfigured);
                }
                Ok(charge)
            })
            .await;
        match paid {
            Err(Error::Step {
                kind: StepErrorKind::Unsupported,
                ..
            }) => {
                assert_eq!(
                    charges.load(Ordering::SeqCst),
                    0,
                    "refused after its effect"
                );
                return;
            }
            Err(Error::NotConfigured) if fails => {}
            Ok(charge) if !fails => assert_eq!(charge, 1, "the step ran again"),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(charges.load(Ordering::SeqCst), 1);
    let seen = store.plain().inspect(&unit_of(&task, "transfer-8")).await;
    assert!(seen.unwrap().is_done());
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

/// What [`FaultyCommit`] does to the commit of the transaction it wraps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CommitFault {
    /// The commit is refused before it reaches the database: the transaction rolls back.
    Refused,
    /// The commit applies and its reply is lost.
    ReplyLost,
    /// The commit comes once the call's lock TTL has passed, while a second delivery waits.
    Overdue,
}

/// A transaction whose commit meets `fault`.
struct FaultyCommit<T> {
    inner: T,
    fault: CommitFault,
    lock_ttl: Duration,
    /// Signalled once the transaction's `begin` has answered.
    begun: Arc<tokio::sync::Notify>,
}

impl<T: TransactionScope> TransactionScope for FaultyCommit<T> {
    type Handle = T::Handle;

    fn max_key_len(&self) -> usize {
        self.inner.max_key_len()
    }

    fn begin(
        &mut self,
        unit: &UnitOfWork,
        token: &LockToken,
        lock_ttl: Duration,
        fencing: Fencing,
    ) -> impl Future<Output = Result<Begin, StoreError>> + Send {
        let begun = Arc::clone(&self.begun);
        let answer = self.inner.begin(unit, token, lock_ttl, fencing);
        async move {
            let answer = answer.await;
            begun.notify_one();
            answer
        }
    }

    fn handle(&mut self) -> &mut Self::Handle {
        self.inner.handle()
    }

    async fn commit(
        self,
        unit: &UnitOfWork,
        token: &LockToken,
        marker: &[u8],
        result_ttl: Duration,
    ) -> Result<(), StoreError> {
        match self.fault {
            CommitFault::Refused => {
                self.inner.abort().await;
                Err(StoreError::new(
                    "commit",
                    StoreErrorKind::Unreachable,
                    "injected: refused before it applied",
                ))
            }
            CommitFault::ReplyLost => {
                self.inner.commit(unit, token, marker, result_ttl).await?;
                Err(StoreError::new(
                    "commit",
                    StoreErrorKind::Timeout,
                    "injected: it applied and its reply was lost",
                )
                .ambiguous_if(true))
            }
            CommitFault::Overdue => {
                outlive(self.lock_ttl).await;
                self.inner.commit(unit, token, marker, result_ttl).await
            }
        }
    }

    fn abort(self) -> impl Future<Output = ()> + Send {
        self.inner.abort()
    }
}

/// Checks that a transactional call reports what its commit did: `Ok` only when its marker
/// committed, an error that is not ambiguous only when nothing did; and that a commit coming
/// after the lock TTL still holds the unit against a second delivery (the transaction's row
/// lock is the lock: it cannot lapse), which replays the committed result or is told the unit
/// is busy, and never runs.
///
/// # Panics
/// When the store or the runner does not.
#[doc = example!(transactions commit_faults_are_reported_as_they_happened)]
pub async fn commit_faults_are_reported_as_they_happened<S: OpensTransactions>(store: S) {
    // Long enough that the first delivery's grant reaches it with time left on a loaded
    // machine (a grant that comes too late does not run the body).
    let lock_ttl = Duration::from_secs(1);
    let task = Task::new("tx_commit_faults").lock_ttl(lock_ttl);
    let second_delivery = Task::new("tx_commit_faults")
        .lock_ttl(lock_ttl)
        .retry(RetryPolicy::no_wait());
    let plain = store.plain();
    for (key, fault) in [
        ("refused", CommitFault::Refused),
        ("reply-lost", CommitFault::ReplyLost),
        ("overdue", CommitFault::Overdue),
    ] {
        let runs = AtomicUsize::new(0);
        let begun = Arc::new(tokio::sync::Notify::new());
        let transaction = FaultyCommit {
            inner: store.open().await,
            fault,
            lock_ttl,
            begun: Arc::clone(&begun),
        };
        let first = task.call(key).run_in_transaction(transaction, async |_| {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<u32, Error>(1)
        });
        // Past the lock TTL of the first delivery's grant, while it has not committed yet.
        let second = async {
            begun.notified().await;
            outlive(lock_ttl).await;
            second_delivery
                .call(key)
                .store(plain.clone())
                .run(async {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok::<u32, Error>(2)
                })
                .await
        };
        let (first, second) = if fault == CommitFault::Overdue {
            let (first, second) = tokio::join!(first, second);
            (first, Some(second))
        } else {
            (first.await, None)
        };
        let stored = plain.inspect(&unit_of(&task, key)).await.unwrap().is_done();
        let fits = match &first {
            Ok(1) => stored,
            Err(Error::Store(err)) if err.is_ambiguous() => true,
            Err(Error::Store(_)) => !stored,
            _ => false,
        };
        assert!(
            fits,
            "{key}: the call answered {first:?} while the marker is {}",
            if stored { "committed" } else { "not committed" }
        );
        if let Some(second) = second {
            assert!(
                matches!(second, Ok(1) | Err(Error::Contended { .. })),
                "{key}: a second delivery during a commit past the lock TTL answered {second:?}"
            );
        }
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{key}: bodies run");
    }
}
