//! The mapping of a message's call onto a [`Verdict`], on a store whose answers each test
//! scripts (a busy key, a store that is down, a unit in doubt, a lost lock) or on a
//! `MemoryStore`, and the attacks on it: the failure count at and past the limit, a panic,
//! a store that is down (never an ack, never a failure), a deferral (never a failure), a
//! misused task (never given up).

use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use idempotask::store::{
    Begin, Doubt, Fencing, Finish, Inspection, LockToken, Store, StoreError, StoreErrorKind,
    UnitOfWork,
};
use idempotask::{Backoff, Error, InDoubt, MemoryStore, Outcome, RetryPolicy, Task};
use idempotask_consumer::{BodyFailure, ConsumerSettings, History, MIN_DELAY, Verdict};

const MS: Duration = Duration::from_millis(1);

/// A message's history, which also counts how often each count was asked for.
#[derive(Default)]
struct Counted {
    failures: u32,
    deferrals: u32,
    failures_asked: AtomicU32,
    deferrals_asked: AtomicU32,
}

impl Counted {
    fn failed(failures: u32) -> Self {
        Self {
            failures,
            ..Self::default()
        }
    }

    fn deferred(deferrals: u32) -> Self {
        Self {
            deferrals,
            ..Self::default()
        }
    }

    fn asked(&self) -> (u32, u32) {
        (
            self.failures_asked.load(Ordering::SeqCst),
            self.deferrals_asked.load(Ordering::SeqCst),
        )
    }
}

impl History for Counted {
    async fn failures(&self) -> u32 {
        self.failures_asked.fetch_add(1, Ordering::SeqCst);
        self.failures
    }

    async fn deferrals(&self) -> u32 {
        self.deferrals_asked.fetch_add(1, Ordering::SeqCst);
        self.deferrals
    }
}

fn down(operation: &'static str) -> StoreError {
    StoreError::new(operation, StoreErrorKind::Unreachable, "the store is down")
}

/// A store that answers `begin` and `finish` as the test says, and releases anything.
struct Scripted {
    begin: Mutex<Box<dyn FnMut() -> Result<Begin, StoreError> + Send>>,
    finish: fn() -> Result<Finish, StoreError>,
}

impl Scripted {
    fn new(begin: impl FnMut() -> Result<Begin, StoreError> + Send + 'static) -> Self {
        Self {
            begin: Mutex::new(Box::new(begin)),
            finish: || Ok(Finish::Completed),
        }
    }
}

impl std::fmt::Debug for Scripted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Scripted")
    }
}

impl Store for Scripted {
    async fn begin(
        &self,
        _: &UnitOfWork,
        _: &LockToken,
        _: Duration,
        _: Fencing,
    ) -> Result<Begin, StoreError> {
        (self.begin.lock().unwrap())()
    }
    async fn finish(
        &self,
        _: &UnitOfWork,
        _: &LockToken,
        _: &[u8],
        _: Duration,
    ) -> Result<Finish, StoreError> {
        (self.finish)()
    }
    async fn release(&self, _: &UnitOfWork, _: &LockToken) -> Result<bool, StoreError> {
        Ok(true)
    }
    async fn renew(&self, _: &UnitOfWork, _: &LockToken, _: Duration) -> Result<bool, StoreError> {
        Ok(true)
    }
    async fn inspect(&self, _: &UnitOfWork) -> Result<Inspection, StoreError> {
        Ok(Inspection::empty())
    }
    async fn forget(&self, _: &UnitOfWork) -> Result<bool, StoreError> {
        Ok(false)
    }
}

fn settings(name: &'static str) -> ConsumerSettings {
    ConsumerSettings::new(Task::new(name).retry(RetryPolicy::no_wait()))
        .failure_backoff(Backoff::new(100 * MS, 700 * MS))
        .store_backoff(Backoff::new(30 * MS, 90 * MS))
        .max_failures(3)
}

async fn fails(settings: &ConsumerSettings, history: &Counted) -> Verdict<u32, &'static str> {
    settings
        .run("order-1", b"{}", history, async { Err("declined") })
        .await
}

#[tokio::test]
async fn a_value_is_acked_and_a_duplicate_replays_it_without_asking_for_counts() {
    let settings = settings("ack").store(MemoryStore::new());
    let history = Counted::failed(2);
    for outcome in [Outcome::Executed, Outcome::Replayed] {
        let verdict = settings
            .run("order-1", b"{}", &history, async { Ok::<_, &str>(7_u32) })
            .await;
        assert!(
            matches!(&verdict, Verdict::Ack(report) if report.value == 7 && report.outcome == outcome),
            "{verdict:?}"
        );
    }
    assert_eq!(history.asked(), (0, 0));
}

#[tokio::test]
async fn failures_below_the_limit_retry_with_the_failure_backoff() {
    let settings = settings("retry").store(MemoryStore::new());
    for (before, delay) in [(0, 100 * MS), (1, 200 * MS)] {
        let history = Counted::failed(before);
        let verdict = fails(&settings, &history).await;
        assert!(
            matches!(&verdict, Verdict::Retry { failure: BodyFailure::Error("declined"), failures, delay: d, .. }
                if *failures == before + 1 && *d == delay),
            "{verdict:?}"
        );
        assert_eq!(history.asked(), (1, 0));
    }
}

#[tokio::test]
async fn the_failure_at_the_limit_gives_up_and_so_does_every_one_past_it() {
    let settings = settings("give_up").store(MemoryStore::new());
    for before in [2, 3, 40, u32::MAX] {
        let verdict = fails(&settings, &Counted::failed(before)).await;
        assert!(
            matches!(&verdict, Verdict::GiveUp { failure: BodyFailure::Error(_), failures, .. }
                if *failures == before.saturating_add(1)),
            "{before}: {verdict:?}"
        );
    }
    // A limit of 0 is taken as 1: the first failure ends the message, never a retry loop.
    let once = settings.max_failures(0);
    let verdict = fails(&once, &Counted::default()).await;
    assert!(
        matches!(verdict, Verdict::GiveUp { failures: 1, .. }),
        "{verdict:?}"
    );
}

#[tokio::test]
async fn a_panic_is_a_counted_failure_not_an_unwind() {
    let settings = settings("panics").store(MemoryStore::new());
    for (before, limit) in [(0, false), (2, true)] {
        let history = Counted::failed(before);
        let verdict: Verdict<u32, &str> = settings
            .run("order-1", b"{}", &history, async {
                panic!("the body broke")
            })
            .await;
        match verdict {
            Verdict::Retry {
                failure: BodyFailure::Panicked(panic),
                failures: 1,
                ..
            } if !limit => assert!(panic.to_string().contains("the body broke")),
            Verdict::GiveUp {
                failure: BodyFailure::Panicked(_),
                failures: 3,
                ..
            } if limit => {}
            other => panic!("{other:?}"),
        }
    }
    // The panic released the lock: the next delivery runs.
    let verdict = settings
        .run("order-1", b"{}", &Counted::default(), async {
            Ok::<_, &str>(1)
        })
        .await;
    assert!(matches!(verdict, Verdict::Ack(_)), "{verdict:?}");
}

#[tokio::test]
async fn a_store_that_is_down_never_acks_never_runs_the_body_and_is_no_failure() {
    let settings = settings("down").store(Scripted::new(|| Err(down("begin"))));
    let history = Counted {
        failures: 2,
        deferrals: 1,
        ..Counted::default()
    };
    let ran = AtomicU32::new(0);
    let verdict = settings
        .run("order-1", b"{}", &history, async {
            ran.fetch_add(1, Ordering::SeqCst);
            Ok::<_, &str>(1_u32)
        })
        .await;
    assert!(
        matches!(&verdict, Verdict::Defer { error: Error::Store(_), delay, deferral: Some(2), .. } if *delay == 60 * MS),
        "{verdict:?}"
    );
    assert_eq!(ran.load(Ordering::SeqCst), 0);
    // The failure count is not even read: a store outage cannot use up the message's tries.
    assert_eq!(history.asked(), (0, 1));
    // However long the outage, the store backoff's bound, not a dead letter.
    let verdict = fails(&settings, &Counted::deferred(u32::MAX)).await;
    assert!(
        matches!(&verdict, Verdict::Defer { delay, deferral: Some(u32::MAX), .. } if *delay == 90 * MS),
        "{verdict:?}"
    );
}

#[tokio::test]
async fn no_store_installed_defers() {
    let verdict = fails(&settings("no_store"), &Counted::default()).await;
    assert!(
        matches!(
            &verdict,
            Verdict::Defer {
                error: Error::NotConfigured,
                deferral: Some(1),
                ..
            }
        ),
        "{verdict:?}"
    );
}

#[tokio::test]
async fn a_busy_key_defers_for_the_holders_time_and_is_no_failure() {
    for (remaining, delay) in [
        (Some(Duration::from_secs(2)), Duration::from_secs(2)),
        // The store did not say: the lock TTL bounds the holder.
        (None, idempotask::DEFAULT_LOCK_TTL),
        // A lock about to expire still gets a moment.
        (Some(Duration::ZERO), MIN_DELAY),
    ] {
        let settings = settings("busy").store(Scripted::new(move || Ok(Begin::busy(remaining))));
        let history = Counted::failed(2);
        let verdict = fails(&settings, &history).await;
        assert!(
            matches!(&verdict, Verdict::Defer { error: Error::Contended { .. }, delay: d, deferral: None, .. } if *d == delay),
            "{verdict:?}"
        );
        assert_eq!(history.asked(), (0, 0));
    }
}

#[tokio::test]
async fn a_body_that_ran_is_acked_even_when_its_lock_or_marker_is_lost() {
    for finish in [
        (|| Ok(Finish::lost_nothing_written())) as fn() -> _,
        || Ok(Finish::lost_marker_written()),
        || Err(down("finish")),
    ] {
        let store = Scripted {
            finish,
            ..Scripted::new(|| Ok(Begin::acquired(None)))
        };
        // A finish that keeps failing is retried until the lock would have run out.
        let task = Task::new("lost").lock_ttl(Duration::from_millis(300));
        let settings = ConsumerSettings::new(task).store(store);
        let verdict = settings
            .run("order-1", b"{}", &Counted::default(), async {
                Ok::<_, &str>(5_u32)
            })
            .await;
        assert!(
            matches!(&verdict, Verdict::Ack(report) if matches!(report.outcome, Outcome::LockLost { .. } | Outcome::MarkerNotWritten)),
            "{verdict:?}"
        );
    }
}

#[tokio::test]
async fn a_unit_in_doubt_is_held_for_an_operator() {
    let task = Task::new("doubt")
        .retry(RetryPolicy::no_wait())
        .in_doubt(InDoubt::Hold);
    let doubt = Doubt::new(None, Duration::from_secs(1));
    let settings =
        ConsumerSettings::new(task).store(Scripted::new(move || Ok(Begin::InDoubt(doubt))));
    let history = Counted::default();
    let verdict = fails(&settings, &history).await;
    assert!(
        matches!(&verdict, Verdict::Hold(Error::InDoubt { .. })),
        "{verdict:?}"
    );
    assert_eq!(history.asked(), (0, 0));
}

#[tokio::test]
async fn a_reused_key_and_an_invalid_key_are_refused() {
    let settings = settings("refused")
        .store(MemoryStore::new())
        .fingerprint_payload(true);
    let history = Counted::default();
    let first = settings
        .run("order-1", b"{\"amount\":5}", &history, async {
            Ok::<_, &str>(1_u32)
        })
        .await;
    assert!(matches!(first, Verdict::Ack(_)), "{first:?}");
    let reused: Verdict<u32, &str> = settings
        .run("order-1", b"{\"amount\":500}", &history, async { Ok(2) })
        .await;
    assert!(
        matches!(&reused, Verdict::Refuse(Error::KeyReuse { .. })),
        "{reused:?}"
    );
    let same = settings
        .run("order-1", b"{\"amount\":5}", &history, async {
            Ok::<_, &str>(3_u32)
        })
        .await;
    assert!(
        matches!(&same, Verdict::Ack(report) if report.value == 1),
        "{same:?}"
    );
    let invalid = settings
        .run(
            "x".repeat(idempotask::store::MAX_KEY_LEN + 1),
            b"",
            &history,
            async { Ok::<_, &str>(4_u32) },
        )
        .await;
    assert!(
        matches!(&invalid, Verdict::Refuse(Error::InvalidKey(_))),
        "{invalid:?}"
    );
    assert_eq!(history.asked(), (0, 0));
}

#[tokio::test]
async fn a_misused_task_defers_instead_of_giving_the_message_up() {
    let settings = settings("reentered").store(MemoryStore::new());
    let inner = Mutex::new(None);
    let outer = settings
        .run("order-1", b"{}", &Counted::default(), async {
            let verdict: Verdict<u32, &str> = settings
                .run("order-1", b"{}", &Counted::deferred(1), async { Ok(1) })
                .await;
            *inner.lock().unwrap() = Some(verdict);
            Ok::<_, &str>(2_u32)
        })
        .await;
    assert!(matches!(outer, Verdict::Ack(_)), "{outer:?}");
    let inner = inner.lock().unwrap().take().unwrap();
    assert!(
        matches!(&inner, Verdict::Defer { error: Error::Reentered { .. }, delay, deferral: Some(2), .. } if *delay == 60 * MS),
        "{inner:?}"
    );
}

#[tokio::test]
async fn every_delay_is_at_least_the_floor() {
    let settings = ConsumerSettings::new(Task::new("floor"))
        .store(MemoryStore::new())
        .failure_backoff(Backoff::constant(Duration::ZERO));
    let verdict = fails(&settings, &Counted::default()).await;
    assert!(
        matches!(verdict, Verdict::Retry { delay, .. } if delay == MIN_DELAY),
        "{verdict:?}"
    );
}
