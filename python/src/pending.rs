//! [`Pending`]: one call in flight, between the runtime thread that runs the core's `Call` and
//! the Python thread (or event loop) that runs the body.
//!
//! The call runs on idempotask's runtime: it asks for the lock (waiting on a busy unit with the
//! core's backoff), and its body, instead of doing the work, sends the Python caller a
//! [`Event::Run`] and waits for the body's result. The caller runs the Python function in its
//! own thread and answers with [`Pending::finish`] (its JSON), [`Pending::unstorable`] or
//! [`Pending::fail`] (it raised); the call then records the marker or releases the lock and
//! sends [`Event::Done`]. The lock's renewal keeps running on the runtime while the Python body
//! blocks, and the GIL is released whenever the caller waits.
//!
//! A task with a reconcile function (`reconcile=` of the decorator) that takes over a unit in
//! doubt first sends [`Event::Reconcile`]: the caller runs its Python reconcile function and
//! answers with [`Pending::reconciled`] (done, with the result's JSON),
//! [`Pending::reconciled_unstorable`], [`Pending::not_done`] (then `Run` follows) or
//! [`Pending::fail`] (it raised: nothing is stored and the unit stays in doubt).
//!
//! While the body runs, its steps (`idempotask.context().step(...)`) are asked for with
//! [`Pending::step`] and run by the body future, through the core's `TaskContext::step`
//! (`steps`).
//!
//! A caller that stops waiting (Ctrl-C, a Celery time limit, a cancelled coroutine) calls
//! [`Pending::cancel`] (the Python layer does, in a `finally`; dropping the `Pending` does it
//! too): a call still waiting for the lock stops there, and one whose body was handed over takes
//! it as a raise and releases the lock. Without it, a call that got the lock after its caller
//! left would wait for a body nobody runs, holding the lock.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use idempotask::{Error, Fingerprint, Outcome, Reconciled, Report, Task};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use serde_json::value::RawValue;
use tokio::runtime::Handle;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};
use tokio::sync::{oneshot, watch};

use crate::errors::to_py_err;
use crate::step_call::StepCall;
use crate::steps::{Policy, StepRequest, not_in_body, step_name};
use crate::store::Lazy;
use crate::stored::Stored;
use crate::wait::{Inbox, next_async, next_blocking};

/// What the call tells its Python caller.
#[derive(Debug)]
pub(crate) enum Event {
    /// The lock is held: run the body now and answer through `body`.
    Run {
        body: oneshot::Sender<Stored>,
        /// Where the body's steps are asked for while it runs.
        steps: UnboundedSender<StepRequest>,
        fencing_token: Option<u64>,
        attempt: u32,
        /// How long the earlier delivery's lock had been expired, for a unit taken over in
        /// doubt.
        in_doubt: Option<Duration>,
    },
    /// The unit is in doubt and the task reconciles: run the reconcile function now and
    /// answer through `answer` (dropped: it raised).
    Reconcile {
        answer: oneshot::Sender<Reconciled<Stored>>,
        fencing_token: Option<u64>,
        attempt: u32,
        /// How long the earlier delivery's lock had been expired.
        in_doubt: Option<Duration>,
    },
    /// The call is over.
    Done(Result<Report<Stored>, CallError>),
}

/// Why a call ended without a value.
#[derive(Debug)]
pub(crate) enum CallError {
    /// idempotask's own error: nothing ran, or the result could not be read.
    Core(Error),
    /// The body raised (or its caller went away): the lock was released, nothing was stored.
    /// The exception itself stays with the Python caller, which raises it as it was.
    Raised,
}

impl From<Error> for CallError {
    fn from(err: Error) -> Self {
        Self::Core(err)
    }
}

/// Input: a task (and whether it reconciles a unit in doubt), its store, the caller's key and
/// fingerprint. Output: the events of one call of it, sent to the Python caller: at most one
/// `Reconcile`, at most one `Run`, then `Done`.
pub(crate) async fn drive(
    task: Arc<Task>,
    reconciles: bool,
    store: Arc<Lazy>,
    key: String,
    fingerprint: Option<Fingerprint>,
    events: UnboundedSender<Event>,
    mut cancelled: watch::Receiver<bool>,
) {
    // The core's call may be dropped at any await: before the body's answer it releases the
    // lock in the background, after a value was handed over it records it there.
    let result = tokio::select! {
        result = run(&task, reconciles, &store, key, fingerprint, &events) => result,
        () = gone(&mut cancelled) => Err(CallError::Raised),
    };
    // The caller may have gone (a cancelled coroutine): then nobody needs the answer.
    let _ = events.send(Event::Done(result));
}

/// Returns once the Python caller cancelled the call; never, once it dropped it.
async fn gone(cancelled: &mut watch::Receiver<bool>) {
    if cancelled.wait_for(|cancelled| *cancelled).await.is_err() {
        // A dropped `Pending` without a cancel: the call goes on to its own end (its next event
        // finds nobody and is taken as a raise). Stopping it here could cut a release or a
        // recording short.
        std::future::pending::<()>().await;
    }
}

async fn run(
    task: &Task,
    reconciles: bool,
    store: &Lazy,
    key: String,
    fingerprint: Option<Fingerprint>,
    events: &UnboundedSender<Event>,
) -> Result<Report<Stored>, CallError> {
    let store = store.get().await.map_err(Error::Store)?;
    let mut call = task.call(key).store(store);
    if let Some(fingerprint) = fingerprint {
        call = call.fingerprint(fingerprint);
    }
    let body = async {
        let (body, result) = oneshot::channel();
        let (steps, requests) = tokio::sync::mpsc::unbounded_channel();
        let context = idempotask::context();
        let run = Event::Run {
            body,
            steps,
            fencing_token: context
                .as_ref()
                .and_then(idempotask::TaskContext::fencing_token),
            attempt: context.as_ref().map_or(1, idempotask::TaskContext::attempt),
            in_doubt: context
                .as_ref()
                .and_then(idempotask::TaskContext::in_doubt)
                .map(|doubt| doubt.expired_for),
        };
        if events.send(run).is_err() {
            return Err(CallError::Raised);
        }
        // A dropped sender is a caller that went away mid-body: released, as a raise is.
        crate::steps::serve(result, requests)
            .await
            .map_err(|_| CallError::Raised)
    };
    if !reconciles {
        return call.run_reported(body).await;
    }
    let reconcile = |context: idempotask::TaskContext| async move {
        let (answer, answered) = oneshot::channel();
        let reconcile = Event::Reconcile {
            answer,
            fencing_token: context.fencing_token(),
            attempt: context.attempt(),
            in_doubt: context.in_doubt().map(|doubt| doubt.expired_for),
        };
        if events.send(reconcile).is_err() {
            return Err(CallError::Raised);
        }
        // A dropped sender is a reconcile function that raised (or a caller that went away):
        // an error, which leaves the unit in doubt.
        answered.await.map_err(|_| CallError::Raised)
    };
    call.reconcile(reconcile).run_reported(body).await
}

/// One call in flight, as Python holds it.
///
/// Dropping it does not stop the call at once: a call still waiting for the lock goes on until
/// it gets it or gives up, then finds nobody to run the body and releases the lock; a call
/// whose body was running takes the drop for a raise and releases; a result already handed
/// over is recorded. Stopping it sooner would cut a release or a recording short.
#[pyclass(frozen, module = "idempotask._native")]
#[derive(Debug)]
pub(crate) struct Pending {
    shared: Arc<Shared>,
    handle: Handle,
    cancel: watch::Sender<bool>,
}

#[derive(Debug)]
struct Shared {
    events: Inbox<Event>,
    /// Where the body's result goes, once the call said `Run`.
    body: Mutex<Option<oneshot::Sender<Stored>>>,
    /// Where the body's steps are asked for, from `Run` until the body's result is answered.
    steps: Mutex<Option<UnboundedSender<StepRequest>>>,
    /// Where the reconcile function's answer goes, once the call said `Reconcile`.
    reconcile: Mutex<Option<oneshot::Sender<Reconciled<Stored>>>>,
    /// A `Run` or `Reconcile` was handed to the caller (and no `Run` is yet to follow): from
    /// then on the call ends by itself once answered (or its answer dropped), and a cancel must
    /// not stop it, which could cut its release or recording short.
    handed: AtomicBool,
}

impl Pending {
    pub(crate) fn new(
        handle: Handle,
        events: UnboundedReceiver<Event>,
        cancel: watch::Sender<bool>,
    ) -> Self {
        Self {
            shared: Arc::new(Shared {
                events: Arc::new(tokio::sync::Mutex::new(events)),
                body: Mutex::new(None),
                steps: Mutex::new(None),
                reconcile: Mutex::new(None),
                handed: AtomicBool::new(false),
            }),
            handle,
            cancel,
        }
    }

    /// Sends the body's result to the call.
    fn answer(&self, result: Option<Stored>) -> PyResult<()> {
        self.shared
            .steps
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let body = self
            .shared
            .body
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .ok_or_else(|| {
                PyRuntimeError::new_err("the call is not waiting for a body's result")
            })?;
        if let Some(result) = result {
            // The call is gone only when it was stopped; then nothing waits for the answer.
            let _ = body.send(result);
        }
        Ok(())
    }

    /// Sends the reconcile function's answer to the call.
    fn answer_reconcile(&self, answer: Reconciled<Stored>) -> PyResult<()> {
        let reconcile = self
            .shared
            .reconcile
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .ok_or_else(|| {
                PyRuntimeError::new_err("the call is not waiting for a reconcile function's answer")
            })?;
        // The call is gone only when it was stopped; then nothing waits for the answer.
        let _ = reconcile.send(answer);
        Ok(())
    }
}

#[pymethods]
impl Pending {
    /// Waits, with the GIL released, for the call's next event: `("run", fencing_token,
    /// attempt, in_doubt)`, `("reconcile", fencing_token, attempt, in_doubt)`, `("done", json, outcome, fencing_token, marker_written)` (`json` is `None` for a value
    /// that has no JSON form; the body's own value is then the answer), `("raised",)`, or an `IdempotaskError`. Signals (Ctrl-C)
    /// are handled while it waits, and the core's queued log records handed to `logging` on
    /// each 200 ms tick and before it returns (a handler's `KeyboardInterrupt` is raised here).
    fn wait(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let event = next_blocking(py, &self.handle, &self.shared.events)?;
        let event = to_python(py, &self.shared, event);
        // What the call logged on the runtime, before its caller goes on. A handler's
        // `KeyboardInterrupt` wins over the event, as Ctrl-C in the caller would: a call
        // handed to no one is cancelled by the decorator.
        crate::logs::flush(py)?;
        event
    }

    /// Like [`wait`](Self::wait) for asyncio: a future of `loop` that `resolve(future, ok,
    /// value)` completes from the runtime thread through `loop.call_soon_threadsafe`.
    fn wait_async(
        &self,
        py: Python<'_>,
        event_loop: Py<PyAny>,
        resolve: Py<PyAny>,
    ) -> PyResult<Py<PyAny>> {
        let shared = Arc::clone(&self.shared);
        next_async(
            py,
            &self.handle,
            Arc::clone(&self.shared.events),
            event_loop,
            resolve,
            move |py, event| to_python(py, &shared, event),
        )
    }

    /// The body returned a value whose JSON text is `json`: the call stores it. Text that is
    /// not JSON is stored as unstorable, as a value `json.dumps` refused.
    fn finish(&self, json: String) -> PyResult<()> {
        let stored = match RawValue::from_string(json) {
            Ok(json) => Stored::Json(json),
            Err(err) => Stored::Unstorable(format!("the result's text is not JSON: {err}")),
        };
        self.answer(Some(stored))
    }

    /// The body returned a value that has no JSON form, for `reason`: duplicates get a
    /// `CodecError` instead of running again.
    fn unstorable(&self, reason: String) -> PyResult<()> {
        self.answer(Some(Stored::Unstorable(reason)))
    }

    /// The body raised: the call releases the lock and stores nothing. Or the reconcile
    /// function raised: nothing is stored and the unit stays in doubt.
    fn fail(&self) -> PyResult<()> {
        let reconcile = self
            .shared
            .reconcile
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if reconcile.is_some() {
            return Ok(());
        }
        self.answer(None)
    }

    /// The reconcile function found the work done, with a result whose JSON text is `json`:
    /// the call stores it as the body's would be (outcome `reconciled`); the body does not run.
    fn reconciled(&self, json: String) -> PyResult<()> {
        let stored = match RawValue::from_string(json) {
            Ok(json) => Stored::Json(json),
            Err(err) => Stored::Unstorable(format!("the result's text is not JSON: {err}")),
        };
        self.answer_reconcile(Reconciled::Done(stored))
    }

    /// The reconcile function found the work done, with a result that has no JSON form.
    fn reconciled_unstorable(&self, reason: String) -> PyResult<()> {
        self.answer_reconcile(Reconciled::Done(Stored::Unstorable(reason)))
    }

    /// The reconcile function found the work not done: the body runs (`Run` follows).
    fn not_done(&self) -> PyResult<()> {
        // A `Run` follows, not yet handed over: until then a cancel stops the call.
        self.shared.handed.store(false, Ordering::SeqCst);
        self.answer_reconcile(Reconciled::NotDone)
    }

    /// Asks the running body's call to run the step `name` (with the key part `part`) under
    /// `policy` (`"rerun"`, `"hold"` or `"reconcile"`: the core's `step`, `step_or_hold`,
    /// `step_or_reconcile`); its events come through the returned `StepCall`. A
    /// `RuntimeError` outside the body.
    #[pyo3(signature = (name, part=None, policy="rerun"))]
    fn step(&self, name: &str, part: Option<String>, policy: &str) -> PyResult<StepCall> {
        let policy = Policy::named(policy)?;
        let steps = self
            .shared
            .steps
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .ok_or_else(not_in_body)?;
        StepCall::start(self.handle.clone(), &steps, step_name(name, part)?, policy)
    }

    /// The caller stops waiting: a call still waiting for the lock gives up, one whose body was
    /// handed over and not answered releases the lock, a value already handed over is still
    /// recorded. Nothing, once the call is over. The Python layer calls it on every way out.
    fn cancel(&self) {
        // A call whose `Run` or `Reconcile` was handed over ends by itself: dropping the answer
        // below is a raise, which it settles (a release) without being cut short. Any other
        // call (waiting for the lock, or with an event not yet read) is stopped.
        if !self.shared.handed.load(Ordering::SeqCst) {
            self.cancel.send_replace(true);
        }
        // A `Run` or `Reconcile` not yet read, or read and not answered: nobody will answer it
        // now.
        self.shared
            .steps
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        self.shared
            .body
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        self.shared
            .reconcile
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
    }
}

/// Input: the call's next event (`None`: the call is gone). Output: its Python form, as
/// [`Pending::wait`] says.
fn to_python(py: Python<'_>, shared: &Shared, event: Option<Event>) -> PyResult<Py<PyAny>> {
    let event = event.ok_or_else(|| PyRuntimeError::new_err("the call ended without an answer"))?;
    match event {
        Event::Run {
            body,
            steps,
            fencing_token,
            attempt,
            in_doubt,
        } => {
            *shared.body.lock().unwrap_or_else(PoisonError::into_inner) = Some(body);
            *shared.steps.lock().unwrap_or_else(PoisonError::into_inner) = Some(steps);
            shared.handed.store(true, Ordering::SeqCst);
            let in_doubt = in_doubt.map(|expired| expired.as_secs_f64());
            Ok(("run", fencing_token, attempt, in_doubt)
                .into_pyobject(py)?
                .into_any()
                .unbind())
        }
        Event::Reconcile {
            answer,
            fencing_token,
            attempt,
            in_doubt,
        } => {
            *shared
                .reconcile
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = Some(answer);
            shared.handed.store(true, Ordering::SeqCst);
            let in_doubt = in_doubt.map(|expired| expired.as_secs_f64());
            Ok(("reconcile", fencing_token, attempt, in_doubt)
                .into_pyobject(py)?
                .into_any()
                .unbind())
        }
        Event::Done(Ok(report)) => {
            let json = match &report.value {
                Stored::Json(json) => Some(json.get()),
                Stored::Unstorable(_) => None,
            };
            let (outcome, marker_written) = outcome_of(report.outcome);
            Ok(
                ("done", json, outcome, report.fencing_token, marker_written)
                    .into_pyobject(py)?
                    .into_any()
                    .unbind(),
            )
        }
        Event::Done(Err(CallError::Raised)) => {
            Ok(("raised",).into_pyobject(py)?.into_any().unbind())
        }
        Event::Done(Err(CallError::Core(err))) => Err(to_py_err(&err)),
    }
}

/// Input: a call's outcome. Output: its name and whether the unit's marker is in the store as
/// far as the call knows (false only when this call's result may not be recorded).
fn outcome_of(outcome: Outcome) -> (&'static str, bool) {
    match outcome {
        Outcome::Executed => ("executed", true),
        Outcome::Replayed => ("replayed", true),
        Outcome::Reconciled => ("reconciled", true),
        Outcome::LockLost { marker_written, .. } => ("lock_lost", marker_written),
        Outcome::MarkerNotWritten => ("marker_not_written", false),
        _ => ("other", false),
    }
}
