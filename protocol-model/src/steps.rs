//! The protocol of a unit with steps, as a model that the checker explores.
//!
//! One unit of work has [`StepsModel::steps`] side effects, done in order by a body that several
//! workers may run: each worker takes deliveries of the unit, at most
//! [`StepsModel::deliveries`] each. What the model keeps:
//!
//! - **The store** holds the unit's lock (its holder, its fencing token, whether it ran out),
//!   the highest fencing token granted, the journal of finished steps (each entry with the
//!   fencing token of the holder that wrote it), whether the unit is in doubt (a lock ran out
//!   without a release or a marker, and no step was recorded since), whether it is held, and the
//!   marker.
//! - **A worker** is idle, or runs the body under a grant: its fencing token, the next step, the
//!   step in doubt (the first step the journal lacks when the grant took the unit over in doubt),
//!   whether the next step's effect has happened and waits to be recorded, and whether its lease
//!   is still valid by its own clock.
//! - **The world** counts how many times each step's effect happened, and how many journal
//!   writes each step got.
//!
//! Time is not a number: a worker's lease may lapse at any moment ([`Action::Pause`]: a pause
//! past the TTL, a slow clock), and the store lets a lock run out only once its holder's lease
//! has lapsed ([`Action::Expire`]): the bounded clock drift every lease-based lock assumes. A
//! worker starts an effect only while its lease holds, so a holder whose lock was taken over
//! never starts its next effect. A worker may crash at any point ([`Action::Crash`]), and a
//! body may fail before an effect and release the lock ([`Action::Fail`]). A step whose future
//! returns an error is taken at its word, as a body's error is today: its effect did not
//! happen, and the next delivery runs it again; a step that errs after its effect is the step's
//! own bug, outside the model. A holder may renew its own lock after it ran out, as long as
//! nobody took it over ([`Action::Renew`]).
//!
//! The protocol's rules, each one a guard or an update below:
//! 1. `begin` grants the lock when it is free or ran out, with the next fencing token, and
//!    answers the journal: the body replays the recorded steps without running them.
//! 2. A grant that took over a unit in doubt marks the first step the journal lacks as in doubt
//!    by itself; that step gets the unit's policy: rerun it, hold the unit, or reconcile (ask the
//!    downstream system whether the effect happened, and record it without running when it did).
//! 3. A step's result is recorded only when no later grant was made (the fencing token is the
//!    highest), at the journal's next position; a refused write ends the body with `LockLost`.
//! 4. The marker is written only after every step is recorded, under the same fencing rule.
//!
//! The properties ([`StepsModel::properties`]): under `hold` and `reconcile`, every step's
//! effect happens at most once; a unit whose marker is written had every step's effect exactly
//! once; no journal position is written twice (no two holders write one record); every recorded
//! step's effect happened.
//!
//! [`Bug`] plants a protocol mistake, so that the checker is shown to find each.

use stateright::{Model, Property};

/// The most steps, workers and deliveries the model's fixed-size arrays hold.
pub const MAX_STEPS: usize = 3;
/// The most workers.
pub const MAX_WORKERS: usize = 3;

/// What a takeover does with the step in doubt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Policy {
    /// Run it again: at least once.
    Rerun,
    /// Hold the unit for an operator: at most once.
    Hold,
    /// Ask the downstream system, run it only when its effect did not happen: exactly once.
    Reconcile,
}

/// A planted protocol mistake.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Bug {
    /// None: the protocol as designed.
    None,
    /// A step is recorded without checking that no later grant was made: a holder whose lock
    /// was taken over overwrites its successor's entry.
    RecordWithoutFencing,
    /// A takeover resumes at the first step the journal lacks as if it were fresh, instead of
    /// treating it as in doubt.
    NoStepInDoubt,
    /// The marker is written before the last step is recorded.
    FinishBeforeLastStep,
}

/// The unit's record in the store.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Store {
    /// The lock: holder, fencing token, whether it ran out.
    pub lock: Option<Lock>,
    /// The highest fencing token granted.
    pub fencing: u8,
    /// The fencing token each recorded step was written with, in step order.
    pub journal: Vec<u8>,
    /// A lock ran out without a release or a marker, and no step was recorded since.
    pub in_doubt: bool,
    /// The unit is held: every delivery gets `Error::InDoubt` until an operator resolves it.
    pub held: bool,
    /// The completion marker is written.
    pub marker: bool,
}

/// A granted lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Lock {
    /// The worker holding it.
    pub holder: u8,
    /// Its fencing token.
    pub fencing: u8,
    /// It ran out (its holder may still run, as a zombie).
    pub expired: bool,
}

/// A worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Worker {
    /// Waiting for a delivery; `left` more may come.
    Idle {
        /// Deliveries left to this worker.
        left: u8,
    },
    /// Running the body under a grant.
    Running(Run),
}

/// A body running under a grant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Run {
    /// Deliveries left after this one.
    pub left: u8,
    /// The grant's fencing token.
    pub fencing: u8,
    /// The next step to run (the steps before it are recorded or replayed).
    pub next: u8,
    /// The step in doubt, when the grant took the unit over in doubt.
    pub in_doubt: Option<u8>,
    /// The next step's effect happened (or reconcile found it happened) and waits to be
    /// recorded.
    pub effect_done: bool,
    /// The lease is valid by the worker's own clock.
    pub lease: bool,
}

/// The whole system.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct State {
    /// The store.
    pub store: Store,
    /// The workers.
    pub workers: Vec<Worker>,
    /// How many times each step's effect happened.
    pub effects: [u8; MAX_STEPS],
    /// How many journal writes each step got.
    pub writes: [u8; MAX_STEPS],
    /// A grant found a step already recorded: a later delivery resumed the body after it.
    pub resumed: bool,
}

/// What can happen next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// A delivery reaches the worker, which calls `begin`.
    Begin(u8),
    /// The worker runs its next step's effect (or, for a step in doubt, applies the policy).
    Effect(u8),
    /// The worker records its next step's result.
    Record(u8),
    /// The worker writes the marker.
    Finish(u8),
    /// The worker's renewal reaches the store.
    Renew(u8),
    /// The worker's lease lapses by its own clock (a pause, a slow renewal).
    Pause(u8),
    /// The store's lock runs out (its holder's lease lapsed first).
    Expire,
    /// The worker's process dies.
    Crash(u8),
    /// The body fails before its next effect, and the worker releases the lock.
    Fail(u8),
}

/// The model: its size, the policy for a step in doubt, and a planted bug.
#[derive(Debug, Clone)]
pub struct StepsModel {
    /// Steps in the body (at most [`MAX_STEPS`]).
    pub steps: u8,
    /// Workers (at most [`MAX_WORKERS`]).
    pub workers: u8,
    /// Deliveries each worker takes.
    pub deliveries: u8,
    /// What a takeover does with the step in doubt.
    pub policy: Policy,
    /// The planted mistake, if any.
    pub bug: Bug,
}

impl StepsModel {
    fn running(state: &State, worker: u8) -> Option<Run> {
        match state.workers[usize::from(worker)] {
            Worker::Running(run) => Some(run),
            Worker::Idle { .. } => None,
        }
    }

    /// Ends `worker`'s delivery (done, failed, lost or crashed).
    fn stop(state: &mut State, worker: u8, left: u8) {
        state.workers[usize::from(worker)] = Worker::Idle { left };
    }

    fn begin(&self, state: &mut State, worker: u8, left: u8) {
        let store = &mut state.store;
        if store.marker || store.held {
            // A replay, or `Error::InDoubt`: nothing runs.
            Self::stop(state, worker, left - 1);
            return;
        }
        match store.lock {
            Some(lock) if !lock.expired => {} // busy: the delivery waits and asks again
            taken => {
                let took_over = taken.is_some() || store.in_doubt;
                store.fencing += 1;
                store.lock = Some(Lock {
                    holder: worker,
                    fencing: store.fencing,
                    expired: false,
                });
                store.in_doubt |= took_over;
                let recorded = u8::try_from(store.journal.len()).unwrap_or(u8::MAX);
                state.resumed |= recorded > 0;
                let in_doubt =
                    (took_over && recorded < self.steps && self.bug != Bug::NoStepInDoubt)
                        .then_some(recorded);
                state.workers[usize::from(worker)] = Worker::Running(Run {
                    left: left - 1,
                    fencing: store.fencing,
                    next: recorded,
                    in_doubt,
                    effect_done: false,
                    lease: true,
                });
            }
        }
    }

    fn effect(&self, state: &mut State, worker: u8, mut run: Run) {
        let step = usize::from(run.next);
        if run.in_doubt == Some(run.next) {
            match self.policy {
                Policy::Hold => {
                    state.store.held = true;
                    if state
                        .store
                        .lock
                        .is_some_and(|lock| lock.fencing == run.fencing)
                    {
                        state.store.lock = None;
                    }
                    Self::stop(state, worker, run.left);
                    return;
                }
                // The downstream system tells whether the effect happened.
                Policy::Reconcile if state.effects[step] > 0 => {}
                Policy::Rerun | Policy::Reconcile => state.effects[step] += 1,
            }
        } else {
            state.effects[step] += 1;
        }
        run.effect_done = true;
        state.workers[usize::from(worker)] = Worker::Running(run);
    }

    fn record(&self, state: &mut State, worker: u8, mut run: Run) {
        let store = &mut state.store;
        let step = usize::from(run.next);
        let current = store.fencing == run.fencing;
        if self.bug == Bug::RecordWithoutFencing {
            if store.journal.len() <= step {
                store.journal.resize(step + 1, 0);
            }
            store.journal[step] = run.fencing;
        } else if current && store.journal.len() == step {
            store.journal.push(run.fencing);
        } else {
            // LockLost: a later grant was made; the body ends without its result.
            Self::stop(state, worker, run.left);
            return;
        }
        store.in_doubt = false;
        state.writes[step] += 1;
        run.next += 1;
        run.effect_done = false;
        state.workers[usize::from(worker)] = Worker::Running(run);
    }

    fn finish(state: &mut State, worker: u8, run: Run) {
        let store = &mut state.store;
        if store.fencing == run.fencing {
            store.marker = true;
            store.lock = None;
            store.in_doubt = false;
        }
        Self::stop(state, worker, run.left);
    }
}

impl Model for StepsModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            store: Store {
                lock: None,
                fencing: 0,
                journal: Vec::new(),
                in_doubt: false,
                held: false,
                marker: false,
            },
            workers: vec![
                Worker::Idle {
                    left: self.deliveries
                };
                usize::from(self.workers)
            ],
            effects: [0; MAX_STEPS],
            writes: [0; MAX_STEPS],
            resumed: false,
        }]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        for worker in 0..self.workers {
            match state.workers[usize::from(worker)] {
                Worker::Idle { left } if left > 0 => actions.push(Action::Begin(worker)),
                Worker::Idle { .. } => {}
                Worker::Running(run) => {
                    let finishing = if self.bug == Bug::FinishBeforeLastStep {
                        run.next + 1 >= self.steps
                    } else {
                        run.next == self.steps
                    };
                    if finishing {
                        actions.push(Action::Finish(worker));
                    }
                    if run.next < self.steps {
                        if run.effect_done {
                            actions.push(Action::Record(worker));
                        } else if run.lease {
                            actions.push(Action::Effect(worker));
                            actions.push(Action::Fail(worker));
                        }
                    }
                    if run.lease {
                        actions.push(Action::Pause(worker));
                    } else {
                        actions.push(Action::Renew(worker));
                    }
                    actions.push(Action::Crash(worker));
                }
            }
        }
        if let Some(lock) = state.store.lock
            && !lock.expired
            && Self::running(state, lock.holder)
                .is_none_or(|run| run.fencing != lock.fencing || !run.lease)
        {
            actions.push(Action::Expire);
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut state = last.clone();
        match action {
            Action::Begin(worker) => {
                let Worker::Idle { left } = state.workers[usize::from(worker)] else {
                    return None;
                };
                self.begin(&mut state, worker, left);
            }
            Action::Effect(worker) => self.effect(&mut state, worker, Self::running(last, worker)?),
            Action::Record(worker) => self.record(&mut state, worker, Self::running(last, worker)?),
            Action::Finish(worker) => {
                Self::finish(&mut state, worker, Self::running(last, worker)?);
            }
            Action::Renew(worker) => {
                let mut run = Self::running(last, worker)?;
                match &mut state.store.lock {
                    // Its own lock, even one that ran out while nobody took it over: the store
                    // lets the holder renew it (the unit stays marked in doubt until a step is
                    // recorded, which only makes a later takeover more careful).
                    Some(lock) if lock.fencing == run.fencing => {
                        lock.expired = false;
                        run.lease = true;
                        state.workers[usize::from(worker)] = Worker::Running(run);
                    }
                    // The lock is gone: the runner marks the lease lost and the body ends.
                    _ => Self::stop(&mut state, worker, run.left),
                }
            }
            Action::Pause(worker) => {
                let mut run = Self::running(last, worker)?;
                run.lease = false;
                state.workers[usize::from(worker)] = Worker::Running(run);
            }
            Action::Expire => {
                let lock = state.store.lock.as_mut()?;
                lock.expired = true;
                state.store.in_doubt = true;
            }
            Action::Crash(worker) => {
                let run = Self::running(last, worker)?;
                Self::stop(&mut state, worker, run.left);
            }
            Action::Fail(worker) => {
                let run = Self::running(last, worker)?;
                if state
                    .store
                    .lock
                    .is_some_and(|lock| lock.fencing == run.fencing && !lock.expired)
                {
                    state.store.lock = None;
                }
                Self::stop(&mut state, worker, run.left);
            }
        }
        Some(state)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(
                "an effect at most once under hold and reconcile",
                |model: &Self, state: &State| {
                    model.policy == Policy::Rerun || state.effects.iter().all(|&n| n <= 1)
                },
            ),
            Property::always(
                "a marked unit had every effect exactly once",
                |model: &Self, state: &State| {
                    !state.store.marker
                        || (model.policy == Policy::Rerun
                            && state.effects[..usize::from(model.steps)]
                                .iter()
                                .all(|&n| n >= 1))
                        || state.effects[..usize::from(model.steps)]
                            .iter()
                            .all(|&n| n == 1)
                },
            ),
            Property::always(
                "no journal position is written twice",
                |_: &Self, state: &State| state.writes.iter().all(|&n| n <= 1),
            ),
            Property::always(
                "every recorded step's effect happened",
                |_: &Self, state: &State| {
                    state
                        .store
                        .journal
                        .iter()
                        .enumerate()
                        .all(|(step, _)| state.effects[step] >= 1)
                },
            ),
            Property::sometimes("the unit completes", |_: &Self, state: &State| {
                state.store.marker
            }),
            Property::sometimes(
                "a takeover resumes after a recorded step",
                |_: &Self, state: &State| state.store.marker && state.resumed,
            ),
        ]
    }
}
