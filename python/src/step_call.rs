//! [`StepCall`]: one step of a Python body in flight, as Python holds it.

use std::sync::{Arc, Mutex, PoisonError};

use idempotask::{Reconciled, StepName};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use serde_json::value::RawValue;
use tokio::runtime::Handle;
use tokio::sync::mpsc::{UnboundedSender, unbounded_channel};

use crate::errors::to_py_err;
use crate::steps::{Policy, StepAnswer, StepEvent, StepFailure, StepRequest, not_in_body};
use crate::stored::Stored;
use crate::wait::{Inbox, next_async, next_blocking};

/// One step of a running body, asked for with `Pending.step`: its events come through
/// [`wait`](Self::wait) (or [`wait_async`](Self::wait_async)), and the caller answers a `run`
/// with [`finish`](Self::finish), [`unstorable`](Self::unstorable) or [`fail`](Self::fail), a
/// `reconcile` with [`reconciled`](Self::reconciled), [`reconciled_unstorable`](Self::reconciled_unstorable),
/// [`not_done`](Self::not_done) or [`fail`](Self::fail).
///
/// Dropping it (or [`cancel`](Self::cancel)) is a raise for a question not yet answered; a value
/// already answered is recorded all the same.
#[pyclass(frozen, module = "idempotask._native")]
#[derive(Debug)]
pub(crate) struct StepCall {
    events: Inbox<StepEvent>,
    answers: Mutex<Option<UnboundedSender<StepAnswer>>>,
    handle: Handle,
}

impl StepCall {
    /// Asks the body's call, through `steps`, to run the step `name` under `policy`.
    pub(crate) fn start(
        handle: Handle,
        steps: &UnboundedSender<StepRequest>,
        name: StepName,
        policy: Policy,
    ) -> PyResult<Self> {
        let (events, events_received) = unbounded_channel();
        let (answers, answers_received) = unbounded_channel();
        steps
            .send(StepRequest {
                name,
                policy,
                events,
                answers: answers_received,
            })
            .map_err(|_| not_in_body())?;
        Ok(Self {
            events: Arc::new(tokio::sync::Mutex::new(events_received)),
            answers: Mutex::new(Some(answers)),
            handle,
        })
    }

    fn answer(&self, answer: StepAnswer) -> PyResult<()> {
        let answers = self.answers.lock().unwrap_or_else(PoisonError::into_inner);
        let answers = answers
            .as_ref()
            .ok_or_else(|| PyRuntimeError::new_err("the step was cancelled"))?;
        // The step is gone only when its body ended; its `wait` says so.
        let _ = answers.send(answer);
        Ok(())
    }
}

#[pymethods]
impl StepCall {
    /// Waits, with the GIL released, for the step's next event: `("run",)`, `("reconcile",)`,
    /// `("replayed", json)`, `("recorded",)`, `("raised",)` (the caller's function raised:
    /// nothing was recorded), or an `IdempotaskError` (`StepError`, `LockNotHeld`, `InDoubt`,
    /// `StoreError`, `CodecError`). Signals are handled while it waits, as `Pending.wait` does.
    fn wait(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let event = next_blocking(py, &self.handle, &self.events)?;
        let event = to_python(py, event);
        crate::logs::flush(py)?;
        event
    }

    /// Like [`wait`](Self::wait) for asyncio, as `Pending.wait_async`.
    fn wait_async(
        &self,
        py: Python<'_>,
        event_loop: Py<PyAny>,
        resolve: Py<PyAny>,
    ) -> PyResult<Py<PyAny>> {
        next_async(
            py,
            &self.handle,
            Arc::clone(&self.events),
            event_loop,
            resolve,
            to_python,
        )
    }

    /// The function returned a value whose JSON text is `json`: the step records it. Text that
    /// is not JSON is recorded as unstorable.
    fn finish(&self, json: String) -> PyResult<()> {
        self.answer(StepAnswer::Value(stored(json)))
    }

    /// The function returned a value that has no JSON form, for `reason`: the step is recorded
    /// as unstorable, and a rerun gets a `CodecError` for it instead of running it again.
    fn unstorable(&self, reason: String) -> PyResult<()> {
        self.answer(StepAnswer::Value(Stored::Unstorable(reason)))
    }

    /// The function (or the reconcile function) raised: nothing is recorded.
    fn fail(&self) -> PyResult<()> {
        self.answer(StepAnswer::Raised)
    }

    /// The reconcile function found the effect done, with a value whose JSON text is `json`:
    /// recorded as the step's, and the function does not run.
    fn reconciled(&self, json: String) -> PyResult<()> {
        self.answer(StepAnswer::Reconciled(Reconciled::Done(stored(json))))
    }

    /// The reconcile function found the effect done, with a value that has no JSON form.
    fn reconciled_unstorable(&self, reason: String) -> PyResult<()> {
        self.answer(StepAnswer::Reconciled(Reconciled::Done(
            Stored::Unstorable(reason),
        )))
    }

    /// The reconcile function found the effect not done: `run` follows.
    fn not_done(&self) -> PyResult<()> {
        self.answer(StepAnswer::Reconciled(Reconciled::NotDone))
    }

    /// The caller stops waiting: a question not yet answered is taken as a raise; a value
    /// already answered is recorded all the same.
    fn cancel(&self) {
        self.answers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
    }
}

/// Input: a value's JSON text. Output: the step's value, unstorable for text that is not JSON.
fn stored(json: String) -> Stored {
    match RawValue::from_string(json) {
        Ok(json) => Stored::Json(json),
        Err(err) => Stored::Unstorable(format!("the value's text is not JSON: {err}")),
    }
}

/// Input: the step's next event (`None`: its call is gone). Output: its Python form, as
/// [`StepCall::wait`] says.
fn to_python(py: Python<'_>, event: Option<StepEvent>) -> PyResult<Py<PyAny>> {
    let event = event.ok_or_else(|| {
        PyRuntimeError::new_err("the step ended without an answer: its task's body is over")
    })?;
    let event = match event {
        StepEvent::Run => ("run",).into_pyobject(py)?.into_any(),
        StepEvent::Reconcile => ("reconcile",).into_pyobject(py)?.into_any(),
        StepEvent::Replayed(json) => ("replayed", json.get()).into_pyobject(py)?.into_any(),
        StepEvent::Recorded => ("recorded",).into_pyobject(py)?.into_any(),
        StepEvent::Failed(StepFailure::Raised) => ("raised",).into_pyobject(py)?.into_any(),
        StepEvent::Failed(StepFailure::Core(err)) => return Err(to_py_err(&err)),
        StepEvent::Failed(StepFailure::Unexpected(why)) => {
            return Err(PyRuntimeError::new_err(why));
        }
    };
    Ok(event.unbind())
}
