//! Steps inside `run_in_transaction`, on a scope of the test's own: without a step store they
//! are refused before their effect; with one, their records outlive the transaction's rollback
//! and the rerun replays them; a record the store refuses makes the call answer `LockNotHeld`
//! and roll back, whatever the body makes of the step's error.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use idempotask::store::{
    Begin, Doubt, Fencing, Finish, Inspection, Journal, LockToken, SharedStore, StepEntry, Store,
    StoreError, StoreErrorKind, TransactionScope, UnitOfWork,
};
use idempotask::{Error, InDoubt, StepErrorKind, Task};

static PAY: Task = Task::new("tx_pay");

/// A journal kept outside any transaction, recording only while `holds` (the transaction is
/// still running, as far as it knows).
#[derive(Debug, Clone, Default)]
struct Journaled {
    entries: Arc<Mutex<Vec<Vec<u8>>>>,
    holds: Arc<AtomicBool>,
    /// What the journal reports of an execution that died inside its transaction.
    doubt: Arc<Mutex<Option<Doubt>>>,
}

fn not_here(operation: &'static str) -> StoreError {
    StoreError::new(operation, StoreErrorKind::Configuration, "steps only")
}

impl Store for Journaled {
    async fn begin(
        &self,
        _: &UnitOfWork,
        _: &LockToken,
        _: Duration,
        _: Fencing,
    ) -> Result<Begin, StoreError> {
        Err(not_here("begin"))
    }
    async fn finish(
        &self,
        _: &UnitOfWork,
        _: &LockToken,
        _: &[u8],
        _: Duration,
    ) -> Result<Finish, StoreError> {
        Err(not_here("finish"))
    }
    async fn release(&self, _: &UnitOfWork, _: &LockToken) -> Result<bool, StoreError> {
        Err(not_here("release"))
    }
    async fn renew(&self, _: &UnitOfWork, _: &LockToken, _: Duration) -> Result<bool, StoreError> {
        Ok(self.holds.load(Ordering::SeqCst))
    }
    async fn inspect(&self, _: &UnitOfWork) -> Result<Inspection, StoreError> {
        Err(not_here("inspect"))
    }
    async fn forget(&self, _: &UnitOfWork) -> Result<bool, StoreError> {
        Err(not_here("forget"))
    }
    fn records_steps(&self) -> bool {
        true
    }
    async fn read_journal(&self, _: &UnitOfWork) -> Result<Journal, StoreError> {
        let entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        let journal = Journal::from_entries(entries.clone());
        Ok(
            match *self.doubt.lock().unwrap_or_else(PoisonError::into_inner) {
                Some(doubt) => journal.in_doubt(doubt),
                None => journal,
            },
        )
    }
    async fn record_step(
        &self,
        _: &UnitOfWork,
        _: &LockToken,
        entry: StepEntry<'_>,
        _: Duration,
    ) -> Result<bool, StoreError> {
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        let next = u32::try_from(entries.len()).unwrap();
        if !self.holds.load(Ordering::SeqCst) || entry.position != next {
            return Ok(false);
        }
        entries.push(entry.bytes.to_vec());
        Ok(true)
    }
}

/// A transaction that always takes the unit, and says how it ended.
struct Transaction {
    steps: Option<Journaled>,
    handle: (),
    ended: Arc<Mutex<Vec<&'static str>>>,
}

impl TransactionScope for Transaction {
    type Handle = ();

    async fn begin(
        &mut self,
        _: &UnitOfWork,
        _: &LockToken,
        _: Duration,
        _: Fencing,
    ) -> Result<Begin, StoreError> {
        Ok(Begin::acquired(None))
    }

    fn handle(&mut self) -> &mut () {
        &mut self.handle
    }

    async fn commit(
        self,
        _: &UnitOfWork,
        _: &LockToken,
        _: &[u8],
        _: Duration,
    ) -> Result<(), StoreError> {
        self.ended.lock().unwrap().push("commit");
        Ok(())
    }

    async fn abort(self) {
        self.ended.lock().unwrap().push("rollback");
    }

    async fn step_store(&mut self) -> Result<Option<SharedStore>, StoreError> {
        Ok(self.steps.clone().map(SharedStore::new))
    }
}

/// One delivery: a charge as a step, then `fails` or the charge.
async fn pay(
    scope: Transaction,
    counter: &AtomicU32,
    fails: bool,
    swallow: bool,
) -> Result<u32, Error> {
    PAY.call("order-7")
        .run_in_transaction(scope, async |()| {
            let ctx = idempotask::context().expect("inside a task");
            let step = ctx
                .step("charge", async {
                    Ok::<_, Error>(counter.fetch_add(1, Ordering::SeqCst) + 1)
                })
                .await;
            let value = match step {
                Err(_) if swallow => 0,
                other => other?,
            };
            if fails {
                return Err(Error::NotConfigured);
            }
            Ok(value)
        })
        .await
}

fn scope(steps: Option<&Journaled>) -> (Transaction, Arc<Mutex<Vec<&'static str>>>) {
    let ended = Arc::new(Mutex::new(Vec::new()));
    let transaction = Transaction {
        steps: steps.cloned(),
        handle: (),
        ended: Arc::clone(&ended),
    };
    (transaction, ended)
}

#[tokio::test]
async fn without_a_step_store_a_step_is_refused_before_its_effect() {
    let charges = AtomicU32::new(0);
    let (transaction, ended) = scope(None);
    let err = pay(transaction, &charges, false, false).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::Step {
                kind: StepErrorKind::Unsupported,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(charges.load(Ordering::SeqCst), 0);
    assert_eq!(*ended.lock().unwrap(), ["rollback"]);
}

#[tokio::test]
async fn a_rollback_keeps_the_steps_and_the_rerun_replays_them() {
    let journal = Journaled::default();
    journal.holds.store(true, Ordering::SeqCst);
    let charges = AtomicU32::new(0);

    let (transaction, ended) = scope(Some(&journal));
    assert!(pay(transaction, &charges, true, false).await.is_err());
    assert_eq!(*ended.lock().unwrap(), ["rollback"]);
    assert_eq!(
        journal.entries.lock().unwrap().len(),
        1,
        "the step's record"
    );

    let (transaction, ended) = scope(Some(&journal));
    assert_eq!(pay(transaction, &charges, false, false).await.unwrap(), 1);
    assert_eq!(*ended.lock().unwrap(), ["commit"]);
    assert_eq!(charges.load(Ordering::SeqCst), 1, "charged twice");
}

/// The step store no longer finds the transaction holding the unit: the step's record is
/// refused, and the call rolls back with `LockNotHeld` even though the body returns `Ok`.
#[tokio::test]
async fn a_refused_record_rolls_the_call_back_whatever_the_body_returns() {
    let journal = Journaled::default();
    let charges = AtomicU32::new(0);
    let (transaction, ended) = scope(Some(&journal));
    let err = pay(transaction, &charges, false, true).await.unwrap_err();
    assert!(matches!(err, Error::LockNotHeld { .. }), "{err}");
    assert_eq!(*ended.lock().unwrap(), ["rollback"]);
    assert!(journal.entries.lock().unwrap().is_empty());
}

/// Every `ERROR` event's message, for the test below.
#[derive(Clone, Default)]
struct Errors(Arc<Mutex<Vec<String>>>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Errors {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct Message(String);
        impl tracing::field::Visit for Message {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    self.0 = format!("{value:?}");
                }
            }
        }
        if *event.metadata().level() == tracing::Level::ERROR {
            let mut message = Message(String::new());
            event.record(&mut message);
            self.0.lock().unwrap().push(message.0);
        }
    }
}

/// A step the journal says is in doubt (an execution that died inside its transaction, which
/// no `begin` saw) is held under `InDoubt::Hold`, and counts as an overdue hold past the
/// task's `hold_alert_after`, as a unit `begin` holds does; a younger doubt does not.
#[tokio::test(flavor = "current_thread")]
async fn a_journal_doubt_held_past_hold_alert_after_is_an_overdue_hold() {
    use tracing_subscriber::layer::SubscriberExt;

    static HELD: Task = Task::new("tx_held")
        .in_doubt(InDoubt::Hold)
        .hold_alert_after(Duration::from_secs(3600));
    let errors = Errors::default();
    let _logs =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(errors.clone()));
    let journal = Journaled::default();
    journal.holds.store(true, Ordering::SeqCst);
    let charges = AtomicU32::new(0);
    let deliver = |expired_for: Duration| {
        *journal.doubt.lock().unwrap() = Some(Doubt::new(None, expired_for));
        let (transaction, _) = scope(Some(&journal));
        let charges = &charges;
        HELD.call("order-8")
            .run_in_transaction(transaction, async move |()| {
                let ctx = idempotask::context().expect("inside a task");
                ctx.step("charge", async {
                    Ok::<_, Error>(charges.fetch_add(1, Ordering::SeqCst))
                })
                .await
            })
    };

    let young = deliver(Duration::from_secs(60)).await.unwrap_err();
    assert!(matches!(young, Error::InDoubt { .. }), "{young}");
    assert!(errors.0.lock().unwrap().is_empty());

    let old = deliver(Duration::from_secs(2 * 3600)).await.unwrap_err();
    assert!(matches!(old, Error::InDoubt { .. }), "{old}");
    let logged = errors.0.lock().unwrap().clone();
    assert_eq!(logged.len(), 1, "{logged:?}");
    assert!(logged[0].contains("hold_alert_after"), "{logged:?}");
    assert_eq!(charges.load(Ordering::SeqCst), 0, "a held step never runs");
}
