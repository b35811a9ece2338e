//! One case of the fault harness: set the unit up, run the call under its plan, let the
//! background settle, then hold what the caller saw against what the store holds and deliver
//! again.

use std::future::{Future, poll_fn};
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::Poll;
use std::time::Duration;

use idempotask::operator::{Marker, StoredResult};
use idempotask::store::{Fencing, LockToken, SharedStore, Store, UnitOfWork};
use idempotask::{Error, InDoubt, Outcome, Report, RetryPolicy, Task};
use tokio::time::Instant;

use super::faulty::Faulty;
use super::plan::{Plan, Point};
use super::probe::{IN_CALL, Probe};
use super::shapes::{Body, Caller, Prior, Shape};
use super::verdict::{CaseError, Ended, check_ending};

/// Short enough to wait out in every case that leaves a lock behind, long enough that a
/// renewal (every third of it) comes well before it expires.
pub(super) const LOCK_TTL: Duration = Duration::from_millis(450);

/// How much later than its lock TTL a unit may become runnable again: the background work of a
/// dropped call, and a loaded machine.
const SLACK: Duration = Duration::from_secs(2);

/// What one case found.
pub(super) struct Case {
    /// The operations that reached the store, in order, and which of them the call awaited.
    pub(super) trace: Vec<&'static str>,
    pub(super) foreground: Vec<usize>,
    /// Whether the plan happened (a drop point the call never reached does not count).
    pub(super) fired: bool,
    pub(super) violations: Vec<String>,
}

fn task(shape: &Shape, retry: RetryPolicy) -> Task {
    Task::named(format!(
        "faults-{}",
        shape.name.replace([' ', ',', '\''], "-")
    ))
    .lock_ttl(LOCK_TTL)
    .fencing(shape.fencing)
    .renew(shape.body == Body::OutlastsARenewal)
    .in_doubt(shape.in_doubt)
    .doubt_memory(if shape.remembered {
        idempotask::DEFAULT_DOUBT_MEMORY
    } else {
        Duration::ZERO
    })
    .retry(retry)
}

/// A key no other case of this process used.
fn fresh_key() -> String {
    static CASES: AtomicU64 = AtomicU64::new(0);
    format!("case-{}", CASES.fetch_add(1, Ordering::Relaxed))
}

/// Runs one case of `shape` on `store` under `plan`.
pub(super) async fn run(store: &SharedStore, shape: &Shape, plan: Plan) -> Case {
    let key = fresh_key();
    let fencing = if shape.fencing {
        Fencing::On
    } else {
        Fencing::Off
    };
    let probe = Probe::new(plan, LOCK_TTL, fencing);
    let faulty = Faulty {
        inner: store.clone(),
        probe: Arc::clone(&probe),
    };
    let retry = if shape.prior == Prior::Held {
        RetryPolicy::no_wait()
    } else {
        RetryPolicy::new()
    };
    let task = task(shape, retry);
    let unit = UnitOfWork::new(task.name(), key.as_str()).expect("a valid key");
    let foreign = LockToken::generate();
    let prior = prepare(store, shape, &task, &key, &unit, &foreign).await;
    let (trace_start, _) = probe.trace();

    let runtime = tokio::runtime::Handle::current();
    let baseline = runtime.metrics().num_alive_tasks();
    let ended = match shape.caller {
        Caller::Operator => drive(&probe, task.status(key.as_str(), &faulty))
            .await
            .map_or(Ended::Dropped, Ended::Status),
        Caller::Delivery { other_arguments } => {
            let arguments = if other_arguments { "b" } else { "a" };
            deliver(&faulty, &task, &key, arguments, shape.body)
                .await
                .map_or(Ended::Dropped, Ended::Delivered)
        }
    };
    probe.answered();
    settle(&probe, baseline).await;
    probe.flush(store).await;
    probe.recover();
    let settled = Instant::now();
    let (trace, foreground) = probe.trace();
    let fired = probe.fired();

    let stored = stored_value(store, &unit).await;
    check_ending(&probe, shape, &ended, stored, prior);
    if shape.prior == Prior::Held {
        match store.inspect(&unit).await {
            Ok(seen) if seen.is_locked() => {}
            seen => probe.violation(format!(
                "the lock of the delivery that held the unit is gone after the call: {seen:?}"
            )),
        }
        let _ = store.release(&unit, &foreign).await;
        probe.held_by(None);
    }
    redeliver(&faulty, shape, &key, stored, settled).await;
    let mut violations = probe.violations();
    if !violations.is_empty() {
        let shown: Vec<_> = trace.iter().skip(trace_start.len()).collect();
        violations.insert(
            0,
            format!(
                "case `{}`, plan {plan:?}, operations {shown:?}:",
                shape.name
            ),
        );
    }
    Case {
        trace: trace[trace_start.len()..].to_vec(),
        foreground: foreground
            .into_iter()
            .filter_map(|index| index.checked_sub(trace_start.len()))
            .collect(),
        fired,
        violations,
    }
}

/// Sets the unit up as `shape` says, behind the wrapper's back; answers the stored value.
async fn prepare(
    store: &SharedStore,
    shape: &Shape,
    task: &Task,
    key: &str,
    unit: &UnitOfWork,
    foreign: &LockToken,
) -> Option<u32> {
    match shape.prior {
        Prior::Nothing => None,
        Prior::Done => {
            let done = task
                .call(key)
                .store(store.clone())
                .fingerprint_of(&"a")
                .expect("a string serialises")
                .run(async { Ok::<u32, Error>(0) })
                .await;
            assert!(
                matches!(done, Ok(0)),
                "setting up a stored result: {done:?}"
            );
            Some(0)
        }
        Prior::Held => {
            let taken = store.begin(unit, foreign, LONG, Fencing::Off).await;
            assert!(
                matches!(taken, Ok(idempotask::store::Begin::Acquired { .. })),
                "setting up a held unit: {taken:?}"
            );
            None
        }
        Prior::Lapsed => {
            // A worker killed after its `begin`: its lock runs out, and the store remembers it.
            let killed = LockToken::generate().with_doubt_memory(LONG);
            let fencing = if shape.fencing {
                Fencing::On
            } else {
                Fencing::Off
            };
            let taken = store.begin(unit, &killed, ABANDONED_TTL, fencing).await;
            assert!(
                matches!(
                    taken,
                    Ok(idempotask::store::Begin::Acquired { in_doubt: None, .. })
                ),
                "setting up a unit in doubt: {taken:?}"
            );
            tokio::time::sleep(ABANDONED_TTL * 2).await;
            None
        }
    }
}

/// The lock TTL of the delivery that leaves a unit in doubt.
const ABANDONED_TTL: Duration = Duration::from_millis(100);

/// Whether `store` remembers a lock that ran out for its token's doubt memory, as every store
/// shipped with idempotask does.
pub(super) async fn remembers_doubt(store: &SharedStore) -> bool {
    let unit = UnitOfWork::new("faults-doubt-probe", fresh_key().as_str()).expect("a valid key");
    let killed = LockToken::generate().with_doubt_memory(LONG);
    let taken = store
        .begin(&unit, &killed, ABANDONED_TTL, Fencing::Off)
        .await;
    assert!(
        matches!(taken, Ok(idempotask::store::Begin::Acquired { .. })),
        "probing whether the store remembers a lock that ran out: {taken:?}"
    );
    tokio::time::sleep(ABANDONED_TTL * 2).await;
    let seen = store.inspect(&unit).await;
    seen.is_ok_and(|seen| seen.in_doubt.is_some())
}

const LONG: Duration = Duration::from_secs(60);

/// One delivery through the wrapper, polled by the harness so it can be dropped where the plan
/// says.
async fn deliver(
    faulty: &Faulty,
    task: &Task,
    key: &str,
    arguments: &str,
    body: Body,
) -> Option<Result<Report<u32>, CaseError>> {
    let probe = &faulty.probe;
    let delivery = probe.next_delivery();
    let unit = UnitOfWork::new(task.name(), key).expect("a valid key");
    let run = async {
        probe.body_starts(&faulty.inner, &unit, delivery).await;
        let _running = Running(probe);
        probe.park(Point::BodyStarted).await;
        if body == Body::OutlastsARenewal {
            probe.renewal_after(probe.renewals()).await;
        }
        probe.park(Point::BodyDone).await;
        if body == Body::Fails {
            Err(CaseError::Body)
        } else {
            Ok(delivery)
        }
    };
    let call = match task
        .call(key)
        .store(faulty.clone())
        .fingerprint_of(&arguments)
    {
        Ok(call) => call,
        Err(err) => return Some(Err(err.into())),
    };
    drive(probe, call.run_reported(run)).await
}

/// Marks the body as no longer running, however it ends.
struct Running<'p>(&'p Probe);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.body_ends();
    }
}

/// Polls `future` as the call under test; `None` when the plan dropped it.
async fn drive<F: Future>(probe: &Probe, future: F) -> Option<F::Output> {
    let mut future = pin!(IN_CALL.scope((), future));
    poll_fn(|cx| match future.as_mut().poll(cx) {
        Poll::Ready(output) => Poll::Ready(Some(output)),
        Poll::Pending if probe.drop_now() => Poll::Ready(None),
        Poll::Pending => Poll::Pending,
    })
    .await
}

/// Waits until the work the call left to the background (a release, a recording, a watchdog)
/// is over. Nothing signals that, so: the runtime is back to as many tasks as before the call,
/// no operation is in flight, and none starts for a while. The task count alone is not enough:
/// a store's own short tasks (a pool returning a connection) can end meanwhile and hide one of
/// the call's that has yet to reach the store.
async fn settle(probe: &Probe, baseline: usize) {
    const QUIET: Duration = Duration::from_millis(50);
    let runtime = tokio::runtime::Handle::current();
    let deadline = Instant::now() + LOCK_TTL + SLACK * 4;
    loop {
        let (seen, in_flight) = probe.activity();
        if in_flight == 0 && runtime.metrics().num_alive_tasks() <= baseline {
            tokio::time::sleep(QUIET).await;
            if probe.activity() == (seen, 0) {
                return;
            }
        } else {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        if Instant::now() > deadline {
            probe.violation("the call's background work was still running 8 s after it ended");
            return;
        }
    }
}

/// The value of the result `store` holds for `unit`, if any.
async fn stored_value(store: &SharedStore, unit: &UnitOfWork) -> Option<u32> {
    let seen = store.inspect(unit).await.ok()?;
    let marker = Marker::decode(seen.marker.as_deref()?).ok()?;
    match marker.result() {
        StoredResult::Json(json) => serde_json::from_str(json.get()).ok(),
        _ => None,
    }
}

/// A later delivery, with the store healthy: it must find the unit runnable (or done) within
/// its lock TTL, and replay exactly what is stored. A unit that was in doubt before the call
/// and has no result is still in doubt: only a result ends a doubt.
async fn redeliver(faulty: &Faulty, shape: &Shape, key: &str, stored: Option<u32>, since: Instant) {
    let patient = RetryPolicy::new()
        .max_attempts(u32::MAX)
        .max_wait(LOCK_TTL + SLACK);
    let task = task(shape, patient);
    let again = deliver(faulty, &task, key, "a", Body::Succeeds).await;
    let waited = since.elapsed();
    let probe = &faulty.probe;
    let still_in_doubt = shape.prior == Prior::Lapsed && stored.is_none();
    match again {
        Some(Err(CaseError::Call(Error::InDoubt { .. })))
            if still_in_doubt && shape.in_doubt == InDoubt::Hold => {}
        Some(Ok(report)) if shape.in_doubt == InDoubt::Hold && still_in_doubt => {
            probe.violation(format!(
                "the next delivery of a held unit in doubt answered {:?}: it ran",
                report.outcome
            ));
        }
        Some(Ok(report)) => {
            let expected = if stored.is_some() {
                Outcome::Replayed
            } else {
                Outcome::Executed
            };
            if report.outcome != expected || (stored.is_some() && Some(report.value) != stored) {
                probe.violation(format!(
                    "the next delivery answered {:?} {} while the store held {stored:?}",
                    report.outcome, report.value
                ));
            }
            if still_in_doubt && report.in_doubt.is_none() {
                probe.violation(
                    "the unit was in doubt and no result was recorded, yet the next delivery was not told",
                );
            }
        }
        other => probe.violation(format!(
            "the next delivery, {} ms after the call, failed: {:?}",
            waited.as_millis(),
            other.map(|ended| ended.map(|report| report.value))
        )),
    }
    if waited > LOCK_TTL + SLACK {
        probe.violation(format!(
            "the unit was runnable again only {} ms after the call, past its {} ms lock TTL",
            waited.as_millis(),
            LOCK_TTL.as_millis()
        ));
    }
}
