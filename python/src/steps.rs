//! A Python body's steps, run through the core's [`TaskContext::step`]: the journal, its
//! record format, the replay and the refusals are the Rust core's, so a step recorded by a Python
//! worker replays in a Rust worker and the other way round.
//!
//! While the Python body runs, its call's body future (on the runtime, inside the task's
//! context) serves the body's step requests: each is a [`StepRequest`] with a channel each way.
//! The future runs `ctx.step(name, effect)` (or `step_or_hold`, `step_or_reconcile`), whose
//! effect sends the Python caller [`StepEvent::Run`] and waits for its [`StepAnswer`] (the
//! value's JSON, or that the function raised); a reconcile function is asked the same way with
//! [`StepEvent::Reconcile`]. The step ends with [`StepEvent::Replayed`] (the recorded JSON: the
//! function did not run), [`StepEvent::Recorded`] (the value Python answered is in the journal)
//! or [`StepEvent::Failed`].
//!
//! The body's own answer ends the serving, but not a step in flight: a step whose value was
//! answered is recorded before the call releases or finishes, so that an effect that happened
//! is never released for a rerun to repeat; a step still waiting for Python's answer then takes
//! it as a raise (nothing recorded).

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use idempotask::{Error, Reconciled, StepName, TaskContext};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use serde_json::value::RawValue;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};
use tokio::sync::{oneshot, watch};

use crate::stored::Stored;

/// What a step does when it is the one in doubt: the core's three step functions.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Policy {
    /// `TaskContext::step`: run it again.
    Rerun,
    /// `TaskContext::step_or_hold`: do not run it; `InDoubt`.
    Hold,
    /// `TaskContext::step_or_reconcile`: ask the Python reconcile function first.
    Reconcile,
}

impl Policy {
    /// Input: the policy's name as the Python layer passes it. Output: the policy.
    pub(crate) fn named(name: &str) -> PyResult<Self> {
        match name {
            "rerun" => Ok(Self::Rerun),
            "hold" => Ok(Self::Hold),
            "reconcile" => Ok(Self::Reconcile),
            other => Err(PyValueError::new_err(format!(
                "a step's policy is \"rerun\", \"hold\" or \"reconcile\", not {other:?}"
            ))),
        }
    }
}

/// One step the Python body asks its call to run.
#[derive(Debug)]
pub(crate) struct StepRequest {
    pub(crate) name: StepName,
    pub(crate) policy: Policy,
    /// Where the step's events go to the Python caller.
    pub(crate) events: UnboundedSender<StepEvent>,
    /// Where the Python caller's answers come from.
    pub(crate) answers: UnboundedReceiver<StepAnswer>,
}

/// What a step tells its Python caller.
#[derive(Debug)]
pub(crate) enum StepEvent {
    /// Run the function now and answer its value (or that it raised).
    Run,
    /// This is the step in doubt: run the reconcile function now and answer what it found.
    Reconcile,
    /// The journal holds this step's value, this JSON: the function does not run.
    Replayed(Box<RawValue>),
    /// The value the caller answered (the function's, or the reconcile function's) is recorded.
    Recorded,
    /// The step ended without a value.
    Failed(StepFailure),
}

/// Why a step ended without a value.
#[derive(Debug)]
pub(crate) enum StepFailure {
    /// The core refused or could not record the step (`Error::Step`, `LockNotHeld`, `InDoubt`,
    /// a store's or a codec's error).
    Core(Error),
    /// The Python function (or the reconcile function) raised, or its caller went away:
    /// nothing was recorded. The exception stays with the Python caller.
    Raised,
    /// What the binding never expects (a step outside a task's context): why.
    Unexpected(&'static str),
}

impl From<Error> for StepFailure {
    fn from(err: Error) -> Self {
        Self::Core(err)
    }
}

/// What the Python caller answers a step.
#[derive(Debug)]
pub(crate) enum StepAnswer {
    /// The function returned this value (its JSON, or why it has none).
    Value(Stored),
    /// The reconcile function's answer.
    Reconciled(Reconciled<Stored>),
    /// The function (or the reconcile function) raised.
    Raised,
}

/// Input: the body's answer to come, and the channel of the body's step requests. Output: the
/// body's answer (`Err`: it was dropped, the body raised), once every step in flight ended.
///
/// Runs inside the task's context, as the body future of the core's call.
pub(crate) async fn serve(
    mut answer: oneshot::Receiver<Stored>,
    mut requests: UnboundedReceiver<StepRequest>,
) -> Result<Stored, oneshot::error::RecvError> {
    let context = idempotask::context();
    let (over, body_over) = watch::channel(false);
    let mut running = FuturesUnordered::new();
    let answered = loop {
        tokio::select! {
            answered = &mut answer => break answered,
            Some(request) = requests.recv() => {
                running.push(run(context.clone(), request, body_over.clone()));
            }
            Some(()) = running.next(), if !running.is_empty() => {}
        }
    };
    // Steps asked for from now on find nobody (a task the body left running).
    drop(requests);
    over.send_replace(true);
    // A value answered is recorded before the call goes on to release or finish.
    while running.next().await.is_some() {}
    answered
}

/// Runs one step through the core and tells the Python caller how it ended.
async fn run(context: Option<TaskContext>, request: StepRequest, body_over: watch::Receiver<bool>) {
    let StepRequest {
        name,
        policy,
        events,
        answers,
    } = request;
    let Some(context) = context else {
        // The body future runs in its task's context: unreachable, but not worth a panic.
        let _ = events.send(StepEvent::Failed(StepFailure::Unexpected(
            "the step's call has no task context",
        )));
        return;
    };
    let asking = Asking {
        events: &events,
        answers: tokio::sync::Mutex::new(answers),
        body_over,
        supplied: AtomicBool::new(false),
    };
    let effect = async {
        match asking.ask(StepEvent::Run).await {
            Some(StepAnswer::Value(value)) => {
                asking.supplied.store(true, Ordering::Release);
                Ok(value)
            }
            _ => Err(StepFailure::Raised),
        }
    };
    let ended = match policy {
        Policy::Rerun => context.step(name, effect).await,
        Policy::Hold => context.step_or_hold(name, effect).await,
        Policy::Reconcile => {
            let reconcile = || async {
                match asking.ask(StepEvent::Reconcile).await {
                    Some(StepAnswer::Reconciled(found)) => {
                        if matches!(found, Reconciled::Done(_)) {
                            asking.supplied.store(true, Ordering::Release);
                        }
                        Ok(found)
                    }
                    _ => Err(StepFailure::Raised),
                }
            };
            context.step_or_reconcile(name, reconcile, effect).await
        }
    };
    let event = match ended {
        Ok(_) if asking.supplied.load(Ordering::Acquire) => StepEvent::Recorded,
        Ok(Stored::Json(json)) => StepEvent::Replayed(json),
        // A replayed value always has JSON: an entry recorded as unstorable replays as a
        // codec error.
        Ok(Stored::Unstorable(_)) => {
            StepEvent::Failed(StepFailure::Unexpected("a replayed step has no JSON"))
        }
        Err(failure) => StepEvent::Failed(failure),
    };
    // A caller that went away needs no answer.
    let _ = events.send(event);
}

/// A step's side of its conversation with the Python caller.
struct Asking<'a> {
    events: &'a UnboundedSender<StepEvent>,
    /// Shared by the effect and the reconcile function, which never wait at once.
    answers: tokio::sync::Mutex<UnboundedReceiver<StepAnswer>>,
    body_over: watch::Receiver<bool>,
    /// Whether the caller answered a value to record (else the step's value is a replay).
    supplied: AtomicBool,
}

impl Asking<'_> {
    /// Sends `event` and waits for the caller's answer; `None` when the caller went away or the
    /// body ended meanwhile.
    async fn ask(&self, event: StepEvent) -> Option<StepAnswer> {
        if self.events.send(event).is_err() {
            return None;
        }
        let mut answers = self.answers.lock().await;
        let mut body_over = self.body_over.clone();
        tokio::select! {
            // An answer sent before the body's own is taken, even once the body is over.
            biased;
            answer = answers.recv() => answer,
            _ = body_over.wait_for(|over| *over) => None,
        }
    }
}

/// How many distinct step names a process keeps: a name is leaked once to be the `&'static str`
/// the core's `StepName` takes, so a name made of data (an order id in it) would grow the
/// process without end. Such data goes into the key part, `("mail", recipient)`.
const MAX_NAMES: usize = 10_000;

/// The names steps were called with in this process.
static NAMES: Mutex<BTreeSet<&'static str>> = Mutex::new(BTreeSet::new());

/// Input: a step's name and key part as Python gives them. Output: the core's `StepName`.
pub(crate) fn step_name(name: &str, part: Option<String>) -> PyResult<StepName> {
    let name = interned(name)?;
    Ok(match part {
        Some(part) => StepName::from((name, part)),
        None => StepName::from(name),
    })
}

fn interned(name: &str) -> PyResult<&'static str> {
    let mut names = NAMES.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(known) = names.get(name) {
        return Ok(known);
    }
    if names.len() >= MAX_NAMES {
        return Err(PyValueError::new_err(format!(
            "step name {name:?}: this process has seen {MAX_NAMES} distinct step names; a step's name is a fixed word, and what varies goes into its key part, ctx.step((\"mail\", recipient), ...)"
        )));
    }
    let leaked: &'static str = Box::leak(name.to_owned().into_boxed_str());
    names.insert(leaked);
    Ok(leaked)
}

/// The error of a step asked for where none can run.
pub(crate) fn not_in_body() -> PyErr {
    PyRuntimeError::new_err(
        "a step runs inside its task's body, while the body runs (not in a reconcile= function, nor after the body returned)",
    )
}
