//! The store wrapper of the fault harness: it injects one planned fault, parks the call at each
//! operation so the harness can drop it there, and checks every operation that reaches the
//! store against what the store held just before.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use idempotask::store::{Begin, Fencing, Finish, Inspection, SharedStore, Store, StoreErrorKind};
use idempotask::store::{LockToken, StoreError, UnitOfWork};

use super::op::{Answer, Op};
use super::oracle::{Lock, Written, finish_answer, own_marker, shown};
use super::plan::{Fault, Plan, Point};

tokio::task_local! {
    /// Set while the harness polls the call under test: an operation made from inside it is
    /// the call's own (one it awaits), not one the call left to the background.
    pub(super) static IN_CALL: ();
}

/// How far a store's clock may be from what the harness measured around an operation.
const STORE_CLOCK_TOLERANCE: Duration = Duration::from_millis(5);

/// How much longer than the call's lock TTL an overdue operation waits.
const OVERDUE_MARGIN: Duration = Duration::from_millis(60);

/// The lock of the second delivery that takes the unit over: short, so the next delivery does
/// not wait long for it.
const SECOND_HOLDER_TTL: Duration = Duration::from_millis(100);

/// How long the store remembers the second delivery's lock once it ran out.
const SECOND_HOLDER_MEMORY: Duration = Duration::from_secs(60);

/// What one case saw, shared by the wrapper, the body and the harness.
#[derive(Debug)]
pub(super) struct Probe {
    state: Mutex<State>,
    /// Counts the renewals that reached the store, for a body that waits for one.
    renewals: tokio::sync::watch::Sender<u32>,
    /// One operation at a time reaches the store, as on one connection, so that each one is
    /// checked against the state it found.
    order: tokio::sync::Mutex<()>,
    /// The call's lock TTL, which an overdue operation waits out.
    lock_ttl: Duration,
    /// Whether the call's task asks for fencing tokens, as the second holder then does.
    fencing: Fencing,
}

#[derive(Debug)]
#[allow(clippy::struct_excessive_bools)] // independent facts of one case, not a state machine
struct State {
    plan: Plan,
    fired: bool,
    down: bool,
    trace: Vec<&'static str>,
    foreground: Vec<usize>,
    parked: Option<Point>,
    late: Vec<(UnitOfWork, Op)>,
    /// The token of the lock's holder, as the store's answers tell it.
    holder: Option<String>,
    /// Whether the call under test answered.
    answered: bool,
    /// When and how the call's own marker was first stored.
    written: Option<Written>,
    /// Whether a second delivery asked for the unit during the call.
    taken_over: bool,
    deliveries: u32,
    started: BTreeSet<u32>,
    running: u32,
    /// Operations that reached the wrapper and have not answered yet (or were dropped).
    in_flight: u32,
    violations: Vec<String>,
}

impl Probe {
    pub(super) fn new(plan: Plan, lock_ttl: Duration, fencing: Fencing) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State {
                plan,
                fired: false,
                down: false,
                trace: Vec::new(),
                foreground: Vec::new(),
                parked: None,
                late: Vec::new(),
                holder: None,
                answered: false,
                written: None,
                taken_over: false,
                deliveries: 0,
                started: BTreeSet::new(),
                running: 0,
                in_flight: 0,
                violations: Vec::new(),
            }),
            renewals: tokio::sync::watch::Sender::new(0),
            order: tokio::sync::Mutex::new(()),
            lock_ttl,
            fencing,
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn violation(&self, violation: impl fmt::Display) {
        self.state().violations.push(violation.to_string());
    }

    pub(super) fn violations(&self) -> Vec<String> {
        self.state().violations.clone()
    }

    /// The operations that reached the store, in order, and which of them the call awaited.
    pub(super) fn trace(&self) -> (Vec<&'static str>, Vec<usize>) {
        let state = self.state();
        (state.trace.clone(), state.foreground.clone())
    }

    /// How many operations reached the wrapper so far, and how many of them are unanswered.
    pub(super) fn activity(&self) -> (usize, u32) {
        let state = self.state();
        (state.trace.len(), state.in_flight)
    }

    pub(super) fn fired(&self) -> bool {
        self.state().fired
    }

    /// The call under test answered: what its operations do from now on, it did not wait for.
    pub(super) fn answered(&self) {
        self.state().answered = true;
    }

    /// When and how the call's own marker was first stored, if it was.
    pub(super) fn written(&self) -> Option<Written> {
        self.state().written
    }

    /// The store is back: the call under test is over.
    pub(super) fn recover(&self) {
        let mut state = self.state();
        state.down = false;
        state.plan = Plan::Nothing;
    }

    /// A lock taken behind the wrapper's back, by the harness.
    pub(super) fn held_by(&self, token: Option<&LockToken>) {
        self.state().holder = token.map(|token| token.as_str().to_owned());
    }

    pub(super) fn next_delivery(&self) -> u32 {
        let mut state = self.state();
        state.deliveries += 1;
        state.deliveries
    }

    pub(super) fn started(&self, delivery: u32) -> bool {
        self.state().started.contains(&delivery)
    }

    /// Whether the harness should drop the call now that it is suspended.
    pub(super) fn drop_now(&self) -> bool {
        let mut state = self.state();
        match state.plan {
            Plan::DropAt(point) if state.parked == Some(point) => {
                state.fired = true;
                true
            }
            _ => false,
        }
    }

    /// Suspends the call under test once at `point`, where the harness may drop it.
    pub(super) async fn park(&self, point: Point) {
        if IN_CALL.try_with(|()| ()).is_err() {
            return;
        }
        self.state().parked = Some(point);
        tokio::task::yield_now().await;
        self.state().parked = None;
    }

    /// The body of `delivery` starts: nothing may be stored and no other body may be running.
    pub(super) async fn body_starts(&self, store: &SharedStore, unit: &UnitOfWork, delivery: u32) {
        let seen = store.inspect(unit).await;
        let mut state = self.state();
        if let Ok(seen) = &seen
            && seen.is_done()
        {
            state.violations.push(format!(
                "delivery {delivery}'s body started while a result was stored"
            ));
        }
        if state.running > 0 {
            state.violations.push(format!(
                "delivery {delivery}'s body started while another body was running"
            ));
        }
        state.running += 1;
        state.started.insert(delivery);
    }

    pub(super) fn body_ends(&self) {
        self.state().running -= 1;
    }

    /// Waits until a renewal newer than the first `seen` ones reached the store.
    pub(super) async fn renewal_after(&self, seen: u32) {
        let mut renewals = self.renewals.subscribe();
        let _ = renewals.wait_for(|count| *count > seen).await;
    }

    pub(super) fn renewals(&self) -> u32 {
        *self.renewals.borrow()
    }

    /// Applies the operations whose fault made them late, once nothing else will come.
    pub(super) async fn flush(&self, store: &SharedStore) {
        let _turn = self.order.lock().await;
        let late = std::mem::take(&mut self.state().late);
        for (unit, op) in late {
            self.checked(store, &unit, &op, Applied::Late).await;
        }
    }

    /// Input: one operation of the call on `store`. Output: what the call gets back: the
    /// store's answer, or the planned fault.
    pub(super) async fn perform(
        self: &Arc<Self>,
        store: &SharedStore,
        unit: &UnitOfWork,
        op: Op,
    ) -> Result<Answer, StoreError> {
        self.state().in_flight += 1;
        let _answered = InFlight(self);
        let foreground = IN_CALL.try_with(|()| ()).is_ok();
        let (index, fault) = {
            let mut state = self.state();
            let index = state.trace.len();
            state.trace.push(op.name());
            if foreground {
                state.foreground.push(index);
            }
            let fault = match state.plan {
                _ if state.down => Some(Fault::Refused),
                Plan::Inject { at, fault } if at == index => {
                    state.fired = true;
                    state.down = fault == Fault::Down;
                    Some(fault)
                }
                _ => None,
            };
            (index, fault)
        };
        if let Op::Renew { .. } = op {
            self.renewals.send_modify(|count| *count += 1);
        }
        self.park(Point::Before(index)).await;
        let injected = |kind, ambiguous, what: &str| {
            StoreError::new(op.name(), kind, format!("injected: {what}")).ambiguous_if(ambiguous)
        };
        let answer = match fault {
            Some(Fault::Refused | Fault::Down) => Err(injected(
                StoreErrorKind::Unreachable,
                false,
                "refused before it applied",
            )),
            Some(Fault::Unconfirmed) => Err(injected(
                StoreErrorKind::Timeout,
                true,
                "timed out; it did not apply",
            )),
            Some(Fault::AppliedLate) => {
                let timeout =
                    injected(StoreErrorKind::Timeout, true, "timed out; it applies later");
                self.state().late.push((unit.clone(), op));
                Err(timeout)
            }
            Some(Fault::ReplyLost) => {
                self.apply(store, unit, &op, false).await;
                Err(injected(
                    StoreErrorKind::Timeout,
                    true,
                    "it applied and its reply was lost",
                ))
            }
            Some(Fault::Resent) => {
                self.apply(store, unit, &op, false).await;
                Ok(self.apply(store, unit, &op, foreground).await)
            }
            Some(Fault::Overdue) => {
                self.outlive_the_lock().await;
                Ok(self.apply(store, unit, &op, foreground).await)
            }
            Some(Fault::OverdueReplyLost | Fault::TakenOverReplyLost) => {
                self.outlive_the_lock().await;
                if fault == Some(Fault::TakenOverReplyLost) {
                    self.second_holder_takes(store, unit).await;
                }
                self.apply(store, unit, &op, false).await;
                Err(injected(
                    StoreErrorKind::Timeout,
                    true,
                    "it applied past the lock TTL and its reply was lost",
                ))
            }
            Some(Fault::OverdueResent) => {
                self.outlive_the_lock().await;
                self.apply(store, unit, &op, false).await;
                Ok(self.apply(store, unit, &op, foreground).await)
            }
            Some(Fault::TakenOver) => {
                self.outlive_the_lock().await;
                self.second_holder_takes(store, unit).await;
                Ok(self.apply(store, unit, &op, foreground).await)
            }
            Some(Fault::AnsweredLate | Fault::AnsweredLateTakenOver) => {
                let answer = self.apply(store, unit, &op, foreground).await;
                self.outlive_the_lock().await;
                if fault == Some(Fault::AnsweredLateTakenOver) {
                    self.second_holder_takes(store, unit).await;
                }
                Ok(answer)
            }
            None => Ok(self.apply(store, unit, &op, foreground).await),
        };
        self.park(Point::After(index)).await;
        answer
    }

    /// Applies `op`, then the late operations waiting for the next one to pass, in a task of its
    /// own: a caller dropped meanwhile (a watchdog aborted as its body ends) must not leave an
    /// operation sent to the store and never checked, nor a late one taken from the list and
    /// never applied. The store would have applied what was sent; the harness must see it.
    async fn apply(
        self: &Arc<Self>,
        store: &SharedStore,
        unit: &UnitOfWork,
        op: &Op,
        seen: bool,
    ) -> Answer {
        let (probe, store, unit, op) = (Arc::clone(self), store.clone(), unit.clone(), op.clone());
        tokio::spawn(async move { probe.apply_in_turn(&store, &unit, &op, seen).await })
            .await
            .unwrap_or_else(|err| std::panic::resume_unwind(err.into_panic()))
    }

    async fn apply_in_turn(
        &self,
        store: &SharedStore,
        unit: &UnitOfWork,
        op: &Op,
        seen: bool,
    ) -> Answer {
        let _turn = self.order.lock().await;
        let answer = self.checked(store, unit, op, Applied::Now { seen }).await;
        let late = std::mem::take(&mut self.state().late);
        for (unit, op) in late {
            self.checked(store, &unit, &op, Applied::Late).await;
        }
        answer
    }

    /// Waits until the call's lock has run out, however recently it was taken or renewed.
    async fn outlive_the_lock(&self) {
        tokio::time::sleep(self.lock_ttl + OVERDUE_MARGIN).await;
    }

    /// A second delivery takes the unit, then dies: its lock runs out soon after, and the
    /// store remembers it, as a killed worker's.
    async fn second_holder_takes(self: &Arc<Self>, store: &SharedStore, unit: &UnitOfWork) {
        let second = Op::Begin {
            token: LockToken::generate().with_doubt_memory(SECOND_HOLDER_MEMORY),
            lock_ttl: SECOND_HOLDER_TTL,
            fencing: self.fencing,
        };
        self.state().taken_over = true;
        // A unit that is done, or held by the harness for longer, is not taken: the fault is
        // then only a delay.
        if let Answer::Begin(Err(err)) = self.apply(store, unit, &second, false).await {
            self.violation(format!(
                "a second delivery could not ask for the unit after the call's lock ran out: {err}"
            ));
        }
    }

    /// Whether a second delivery asked for the unit while the call's operation was delayed.
    pub(super) fn taken_over(&self) -> bool {
        self.state().taken_over
    }

    /// Applies `op` and checks what it did against what the store held before.
    async fn checked(
        &self,
        store: &SharedStore,
        unit: &UnitOfWork,
        op: &Op,
        applied: Applied,
    ) -> Answer {
        let looked = tokio::time::Instant::now();
        let before = store.inspect(unit).await;
        let answer = op.apply(store, unit).await;
        // A lock the first look saw with less time left than this may have expired before
        // the operation reached it: then the operation found nothing, whoever held it.
        let took = looked.elapsed();
        let after = store.inspect(unit).await;
        let (Ok(before), Ok(after)) = (before, after) else {
            self.violation(format!(
                "the harness could not inspect the store around a {}",
                op.name()
            ));
            return answer;
        };
        self.check(op, &before, took, &answer, &after, applied);
        answer
    }

    #[allow(clippy::too_many_lines)] // every rule on one operation, in one place
    fn check(
        &self,
        op: &Op,
        before: &Inspection,
        took: Duration,
        answer: &Answer,
        after: &Inspection,
        applied: Applied,
    ) {
        let mut state = self.state();
        if !before.is_locked() {
            state.holder = None;
        }
        let by = op.token().map(LockToken::as_str);
        let name = op.name();
        let mut broken = Vec::new();
        if let Op::Finish { marker, .. } = op {
            let ours = |stored: &Option<Vec<u8>>| {
                stored
                    .as_deref()
                    .is_some_and(|stored| own_marker(stored, marker).is_some())
            };
            let held = state.holder.is_some() && state.holder.as_deref() == by;
            let lock = match before.lock_ttl {
                Some(left) if held && left > took + STORE_CLOCK_TOLERANCE => Lock::Held,
                Some(_) if held => Lock::Expiring,
                _ => Lock::Lapsed,
            };
            if state.written.is_none() && !ours(&before.marker) && ours(&after.marker) {
                state.written = Some(Written {
                    lock,
                    before_the_answer: !state.answered && applied != Applied::Late,
                });
            }
            broken.extend(finish_answer(marker, before, answer, after, lock));
        }
        // A late operation can apply while the call still runs: a concurrent renewal lets it
        // through. The call learns of that write once one of its own reads of the unit whose
        // answer it gets (a finish that finds its marker, an inspection that sees it) comes
        // after it.
        let sees_the_marker = match op {
            Op::Finish { marker, .. } => before
                .marker
                .as_deref()
                .is_some_and(|stored| own_marker(stored, marker).is_some()),
            Op::Inspect => before.marker.is_some(),
            _ => false,
        };
        if applied == (Applied::Now { seen: true })
            && sees_the_marker
            && !state.answered
            && let Some(written) = &mut state.written
        {
            written.before_the_answer = true;
        }
        if let Some(stored) = &before.marker
            && after.marker.as_ref() != Some(stored)
        {
            broken.push(format!(
                "a {name} replaced or deleted the stored result (after it: {})",
                shown(after)
            ));
        }
        // A server's clock is read in whole milliseconds, and a Redis server reads it once per
        // event loop (a loaded cluster node's loop can take a few): within that of its expiry,
        // a lock the look saw may be gone when the operation reaches it.
        let outlived = before
            .lock_ttl
            .is_some_and(|left| left > took + STORE_CLOCK_TOLERANCE);
        let foreign = outlived && state.holder.as_deref() != by;
        if foreign && matches!(op, Op::Finish { .. } | Op::Release { .. }) && !after.is_locked() {
            broken.push(format!(
                "a {name} by a delivery that did not hold the lock deleted or overwrote it"
            ));
        }
        if foreign && let Answer::Begin(Ok(Begin::Acquired { .. })) = answer {
            broken.push("a begin was granted a lock another delivery held".to_owned());
        }
        if let Op::Forget = op {
            broken.push("the call forgot the unit's result".to_owned());
        }
        match answer {
            Answer::Begin(Ok(Begin::Acquired { .. })) => state.holder = by.map(str::to_owned),
            Answer::Finish(Ok(Finish::Completed)) => state.holder = None,
            Answer::Flag(Ok(true)) if matches!(op, Op::Release { .. }) => state.holder = None,
            _ => {}
        }
        state.violations.extend(broken);
    }
}

/// How an operation reached the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Applied {
    /// When the call sent it; `seen`: its answer reaches the call (not a lost reply).
    Now { seen: bool },
    /// After a later operation, its fault having delayed it.
    Late,
}

/// Counts an operation as answered however its future ends, dropped included.
struct InFlight<'p>(&'p Probe);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.state().in_flight -= 1;
    }
}

#[cfg(test)]
mod tests;
