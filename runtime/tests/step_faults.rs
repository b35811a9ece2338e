//! Steps under a store that fails: a record applied whose reply was lost, a store down when a
//! step's record is sent, and journal entries that no run of the body wrote.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use idempotask::store::{
    Begin, Fencing, Finish, Inspection, Journal, LockToken, StepEntry, Store, StoreError,
    StoreErrorKind, UnitOfWork,
};
use idempotask::{CodecErrorKind, Error, MemoryStore, StepErrorKind, Task};

/// `MemoryStore` whose `record_step` can apply and lose its reply once, fail every time, or
/// refuse every record while the lock is still the caller's (as `RedlockStore` does when the
/// servers that answered cannot tell a failed attempt's entry from a confirmed one).
#[derive(Debug, Clone, Default)]
struct Lossy {
    inner: MemoryStore,
    lose_next_reply: Arc<AtomicBool>,
    down: Arc<AtomicBool>,
    refuse: Arc<AtomicBool>,
    records: Arc<AtomicU32>,
}

impl Store for Lossy {
    async fn begin(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        lock_ttl: Duration,
        fencing: Fencing,
    ) -> Result<Begin, StoreError> {
        self.inner.begin(unit, token, lock_ttl, fencing).await
    }
    async fn finish(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        marker: &[u8],
        result_ttl: Duration,
    ) -> Result<Finish, StoreError> {
        self.inner.finish(unit, token, marker, result_ttl).await
    }
    async fn release(&self, unit: &UnitOfWork, token: &LockToken) -> Result<bool, StoreError> {
        self.inner.release(unit, token).await
    }
    async fn renew(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        lock_ttl: Duration,
    ) -> Result<bool, StoreError> {
        self.inner.renew(unit, token, lock_ttl).await
    }
    async fn inspect(&self, unit: &UnitOfWork) -> Result<Inspection, StoreError> {
        self.inner.inspect(unit).await
    }
    async fn forget(&self, unit: &UnitOfWork) -> Result<bool, StoreError> {
        self.inner.forget(unit).await
    }
    fn records_steps(&self) -> bool {
        true
    }
    async fn read_journal(&self, unit: &UnitOfWork) -> Result<Journal, StoreError> {
        self.inner.read_journal(unit).await
    }
    async fn record_step(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        entry: StepEntry<'_>,
        lock_ttl: Duration,
    ) -> Result<bool, StoreError> {
        self.records.fetch_add(1, Ordering::SeqCst);
        if self.down.load(Ordering::SeqCst) {
            return Err(StoreError::new(
                "record_step",
                StoreErrorKind::Unreachable,
                "down",
            ));
        }
        if self.refuse.load(Ordering::SeqCst) {
            return Ok(false);
        }
        let recorded = self.inner.record_step(unit, token, entry, lock_ttl).await?;
        if self.lose_next_reply.swap(false, Ordering::SeqCst) {
            return Err(StoreError::ambiguous(
                "record_step",
                StoreErrorKind::Timeout,
                "the reply was lost",
            ));
        }
        Ok(recorded)
    }
}

/// What a call must answer for a hostile entry.
type Expected = fn(&Error) -> bool;

async fn two_steps(task: &Task, store: &Lossy, effects: &Arc<AtomicU32>) -> Result<u32, Error> {
    let effects = Arc::clone(effects);
    task.call("order-1")
        .store(store.clone())
        .run(async move {
            let ctx = idempotask::context().unwrap();
            let first: u32 = ctx
                .step("first", async {
                    Ok::<_, Error>(effects.fetch_add(1, Ordering::SeqCst))
                })
                .await?;
            let second: u32 = ctx
                .step("second", async {
                    Ok::<_, Error>(effects.fetch_add(10, Ordering::SeqCst))
                })
                .await?;
            Ok(first + second)
        })
        .await
}

#[tokio::test]
async fn a_record_whose_reply_was_lost_is_sent_again_and_recorded_once() {
    let store = Lossy::default();
    store.lose_next_reply.store(true, Ordering::SeqCst);
    let effects = Arc::new(AtomicU32::new(0));
    let task = Task::new("lost-reply");
    assert_eq!(two_steps(&task, &store, &effects).await.unwrap(), 1);
    assert_eq!(effects.load(Ordering::SeqCst), 11, "an effect ran twice");
    assert_eq!(
        store.records.load(Ordering::SeqCst),
        3,
        "the lost record was not sent again"
    );
}

#[tokio::test]
async fn a_store_down_at_a_record_leaves_the_unit_to_lapse_into_doubt() {
    let store = Lossy::default();
    store.down.store(true, Ordering::SeqCst);
    let effects = Arc::new(AtomicU32::new(0));
    let task = Task::new("down-at-record").lock_ttl(Duration::from_millis(300));
    let failed = two_steps(&task, &store, &effects).await;
    assert!(
        matches!(
            &failed,
            Err(Error::Step {
                kind: StepErrorKind::Unrecorded,
                ..
            })
        ),
        "{failed:?}"
    );
    assert_eq!(
        effects.load(Ordering::SeqCst),
        1,
        "the second step ran after the first failed"
    );
    let unit = UnitOfWork::new("down-at-record", "order-1").unwrap();
    // Locked still, or already run out and remembered: either way not released.
    let held = store.inspect(&unit).await.unwrap();
    assert!(
        held.is_locked() || held.in_doubt.is_some(),
        "the lock was released: a delivery would run the effect again at once: {held:?}"
    );
    store.down.store(false, Ordering::SeqCst);
    // Expiry is what is under test: the lock must run out before the unit is taken over.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let held_step = task
        .call("order-1")
        .store(store.clone())
        .run(async {
            let ctx = idempotask::context().unwrap();
            assert!(ctx.in_doubt().is_some(), "the lapsed lock left no doubt");
            ctx.step_or_hold("first", async { Ok::<u32, Error>(99) })
                .await
        })
        .await;
    assert!(
        matches!(held_step, Err(Error::InDoubt { .. })),
        "{held_step:?}"
    );
}

/// A record refused after its step's effect ran: the runner cannot tell a lock lost from a
/// refusal the store could not decide, so it must not release the lock. Released, a lock that
/// was still its own frees the unit, and the next delivery runs the effect again at once.
#[tokio::test]
async fn a_refused_record_leaves_the_lock_to_lapse() {
    let store = Lossy::default();
    store.refuse.store(true, Ordering::SeqCst);
    let effects = Arc::new(AtomicU32::new(0));
    let task = Task::new("refused-record");
    let failed = two_steps(&task, &store, &effects).await;
    assert!(
        matches!(failed, Err(Error::LockNotHeld { .. })),
        "{failed:?}"
    );
    assert_eq!(effects.load(Ordering::SeqCst), 1);
    let unit = UnitOfWork::new("refused-record", "order-1").unwrap();
    let held = store.inspect(&unit).await.unwrap();
    assert!(
        held.is_locked(),
        "the lock was released: a delivery would run the effect again at once: {held:?}"
    );
}

#[tokio::test]
async fn journal_entries_no_run_wrote_are_typed_errors_not_panics() {
    let store = Lossy::default();
    let cases: [(&[u8], Expected); 4] = [
        (b"\xff\xfe not json", |err| {
            matches!(
                err,
                Error::Codec {
                    kind: CodecErrorKind::Unreadable,
                    ..
                }
            )
        }),
        (br#"{"step":"first","ok":"text, not a number"}"#, |err| {
            matches!(
                err,
                Error::Codec {
                    kind: CodecErrorKind::Undecodable,
                    ..
                }
            )
        }),
        (br#"{"step":"first"}"#, |err| {
            matches!(
                err,
                Error::Codec {
                    kind: CodecErrorKind::Undecodable,
                    ..
                }
            )
        }),
        (br#"{"step":"other","ok":1}"#, |err| {
            matches!(
                err,
                Error::Step {
                    kind: StepErrorKind::OrderChanged,
                    ..
                }
            )
        }),
    ];
    for (index, (entry, expected)) in cases.into_iter().enumerate() {
        let task = Task::named(format!("hostile-{index}"));
        let unit = UnitOfWork::new(task.name(), "order-1").unwrap();
        let token = LockToken::generate();
        store
            .begin(&unit, &token, Duration::from_secs(30), Fencing::Off)
            .await
            .unwrap();
        let written = StepEntry::new(0, entry, Duration::from_secs(60));
        assert!(
            store
                .record_step(&unit, &token, written, Duration::from_secs(30))
                .await
                .unwrap()
        );
        assert!(store.release(&unit, &token).await.unwrap());
        let effects = Arc::new(AtomicU32::new(0));
        let answer = two_steps(&task, &store, &effects).await;
        let err = answer.expect_err("a hostile entry was replayed");
        assert!(expected(&err), "entry {index}: {err:?}");
        assert_eq!(
            effects.load(Ordering::SeqCst),
            0,
            "entry {index}: an effect ran"
        );
    }
}

/// A body that swallows a step's refusal and goes on: the refusal held the unit, so no later
/// step may take the refused step's place in the journal, and the body's `Ok` is not the
/// unit's result.
#[tokio::test]
async fn a_body_that_goes_on_after_a_held_step_runs_no_step_and_records_nothing() {
    let store = Lossy::default();
    store.down.store(true, Ordering::SeqCst);
    let effects = Arc::new(AtomicU32::new(0));
    let counted = Arc::clone(&effects);
    let task = Task::new("swallowed").lock_ttl(Duration::from_secs(30));
    let answered = task
        .call("order-1")
        .store(store.clone())
        .run(async move {
            let ctx = idempotask::context().unwrap();
            let unrecorded = ctx
                .step("first", async {
                    Ok::<u32, Error>(counted.fetch_add(1, Ordering::SeqCst))
                })
                .await;
            let later = ctx
                .step("second", async {
                    Ok::<u32, Error>(counted.fetch_add(10, Ordering::SeqCst))
                })
                .await;
            Ok((
                unrecorded.map_err(|err| err.to_string()),
                later.map_err(|err| err.to_string()),
            ))
        })
        .await;
    assert!(
        matches!(
            answered,
            Err(Error::Step {
                kind: StepErrorKind::Unrecorded,
                ..
            })
        ),
        "the body's Ok after a held step was taken as the result: {answered:?}"
    );
    assert_eq!(
        effects.load(Ordering::SeqCst),
        1,
        "a step ran after the refusal that held the unit"
    );
    let unit = UnitOfWork::new("swallowed", "order-1").unwrap();
    let held = store.inspect(&unit).await.unwrap();
    assert!(held.marker.is_none(), "a value was recorded: {held:?}");
    assert!(held.is_locked(), "the lock was released: {held:?}");
}
