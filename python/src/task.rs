//! [`NativeTask`]: a task as the Python decorator builds it, and the start of its calls.

use std::sync::Arc;

use idempotask::{Fingerprint, Task};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::errors::codec_error;
use crate::options::{Options, seconds};
use crate::pending::{Pending, drive};

/// A task: its stable name and settings, built once when the decorator is applied.
#[pyclass(frozen, module = "idempotask._native", name = "Task")]
#[derive(Debug)]
pub(crate) struct NativeTask {
    /// The task that waits on a busy unit with the core's backoff.
    waiting: Arc<Task>,
    /// The same task answering `Contended` at once.
    not_waiting: Arc<Task>,
    /// Whether a unit in doubt is first reconciled by the Python layer's reconcile function.
    reconciles: bool,
}

/// An optional duration argument in seconds or a `timedelta`.
fn duration(value: Option<&Bound<'_, PyAny>>) -> PyResult<Option<std::time::Duration>> {
    value.map(seconds).transpose()
}

#[pymethods]
impl NativeTask {
    #[new]
    #[pyo3(signature = (
        name, *, lock_ttl=None, result_ttl=None, renew=false, fencing=false, log_key=None,
        in_doubt=None, doubt_memory=None, hold_alert_after=None, max_attempts=None, max_wait=None,
        initial_backoff=None, max_backoff=None, reconcile=false, max_steps=None,
        max_step_bytes=None,
    ))]
    #[expect(
        clippy::too_many_arguments,
        reason = "one keyword argument per option, as Python passes them"
    )]
    fn new(
        name: &str,
        lock_ttl: Option<&Bound<'_, PyAny>>,
        result_ttl: Option<&Bound<'_, PyAny>>,
        renew: bool,
        fencing: bool,
        log_key: Option<String>,
        in_doubt: Option<String>,
        doubt_memory: Option<&Bound<'_, PyAny>>,
        hold_alert_after: Option<&Bound<'_, PyAny>>,
        max_attempts: Option<u32>,
        max_wait: Option<&Bound<'_, PyAny>>,
        initial_backoff: Option<&Bound<'_, PyAny>>,
        max_backoff: Option<&Bound<'_, PyAny>>,
        reconcile: bool,
        max_steps: Option<u32>,
        max_step_bytes: Option<usize>,
    ) -> PyResult<Self> {
        idempotask::store::check_task_name(name)
            .map_err(|err| PyValueError::new_err(format!("task name {name:?}: {err}")))?;
        let options = Options {
            lock_ttl: duration(lock_ttl)?,
            result_ttl: duration(result_ttl)?,
            renew,
            fencing,
            log_key,
            in_doubt,
            doubt_memory: duration(doubt_memory)?,
            hold_alert_after: duration(hold_alert_after)?,
            max_attempts,
            max_wait: duration(max_wait)?,
            initial_backoff: duration(initial_backoff)?,
            max_backoff: duration(max_backoff)?,
            max_steps,
            max_step_bytes,
            reconcile,
        };
        Ok(Self {
            waiting: Arc::new(options.task(name, true)?),
            not_waiting: Arc::new(options.task(name, false)?),
            reconciles: reconcile,
        })
    }

    /// The task's stable name.
    #[getter]
    fn name(&self) -> &str {
        self.waiting.name()
    }

    /// `key` as this task shows it in logs and errors: the key, or its digest with
    /// `log_key="hash"`.
    fn shown_key(&self, key: String) -> PyResult<String> {
        if self.waiting.settings().log_key != idempotask::KeyLogging::Hash {
            return Ok(key);
        }
        let unit = idempotask::store::UnitOfWork::new(self.waiting.name(), key)
            .map_err(|err| PyValueError::new_err(err.to_string()))?;
        Ok(unit.digest().to_owned())
    }

    /// The lock TTL in seconds.
    #[getter]
    fn lock_ttl(&self) -> f64 {
        self.waiting.settings().lock_ttl.as_secs_f64()
    }

    /// Starts one call for `key` on `store`: the call asks for the lock on idempotask's
    /// runtime, and the returned [`Pending`] says when the body is to run. `fingerprint` is
    /// the JSON text of the fingerprinted arguments; `wait` false answers a busy unit at once.
    #[pyo3(signature = (store, key, fingerprint=None, wait=true))]
    fn start(
        &self,
        store: &Bound<'_, PyAny>,
        key: String,
        fingerprint: Option<&str>,
        wait: bool,
    ) -> PyResult<Pending> {
        // Records a call left behind (a release after its caller went away) go out now; a
        // handler's `KeyboardInterrupt` stops the call before it starts.
        crate::logs::flush(store.py())?;
        let lazy = crate::store::lazy_of(store)?;
        let fingerprint = fingerprint.map(fingerprint_of).transpose()?;
        let task = Arc::clone(if wait {
            &self.waiting
        } else {
            &self.not_waiting
        });
        let handle = crate::runtime::handle()?;
        let (events, receiver) = tokio::sync::mpsc::unbounded_channel();
        let (cancel, cancelled) = tokio::sync::watch::channel(false);
        handle.spawn(drive(
            task,
            self.reconciles,
            lazy,
            key,
            fingerprint,
            events,
            cancelled,
        ));
        Ok(Pending::new(handle, receiver, cancel))
    }

    fn __repr__(&self) -> String {
        format!("Task({:?})", self.waiting.name())
    }
}

/// Input: JSON text. Output: its fingerprint, the one the Rust core computes for the same
/// value (`Fingerprint::of_json`), or `CodecError` for text that is not JSON.
pub(crate) fn fingerprint_of(json: &str) -> PyResult<Fingerprint> {
    Fingerprint::of_json(json.as_bytes()).ok_or_else(|| {
        codec_error(
            "fingerprint",
            "the fingerprinted arguments are not one JSON value the core takes (nested more than 128 deep?)".to_owned(),
        )
    })
}
