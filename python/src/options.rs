//! A task's options as Python gives them (keyword arguments of the decorator), checked once,
//! when the decorator is applied, and turned into an [`idempotask::Task`].

use std::time::Duration;

use idempotask::{InDoubt, KeyLogging, MIN_TTL, RetryPolicy, Task};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;

/// Input: seconds (an `int` or a `float`) or a `datetime.timedelta`. Output: a duration; a
/// negative or non-finite number is refused.
pub(crate) fn seconds(value: &Bound<'_, PyAny>) -> PyResult<Duration> {
    let secs: f64 = if value.hasattr("total_seconds")? {
        value.call_method0("total_seconds")?.extract()?
    } else if value.is_instance_of::<pyo3::types::PyBool>() {
        return Err(PyTypeError::new_err(
            "expected seconds or a timedelta, got a bool",
        ));
    } else {
        value
            .extract()
            .map_err(|_| PyTypeError::new_err("expected seconds (int or float) or a timedelta"))?
    };
    Duration::try_from_secs_f64(secs)
        .map_err(|_| PyValueError::new_err(format!("{secs} is not a duration in seconds")))
}

/// The options of one task, as the decorator's keyword arguments name them.
#[derive(Debug, Default)]
pub(crate) struct Options {
    pub(crate) lock_ttl: Option<Duration>,
    pub(crate) result_ttl: Option<Duration>,
    pub(crate) renew: bool,
    pub(crate) fencing: bool,
    pub(crate) log_key: Option<String>,
    pub(crate) in_doubt: Option<String>,
    pub(crate) doubt_memory: Option<Duration>,
    pub(crate) hold_alert_after: Option<Duration>,
    pub(crate) max_attempts: Option<u32>,
    pub(crate) max_wait: Option<Duration>,
    pub(crate) initial_backoff: Option<Duration>,
    pub(crate) max_backoff: Option<Duration>,
    pub(crate) max_steps: Option<u32>,
    pub(crate) max_step_bytes: Option<usize>,
    /// Whether the task has a reconcile function (`reconcile=`).
    pub(crate) reconcile: bool,
}

impl Options {
    /// Input: the options and the task's name. Output: the task, or a `ValueError` saying what
    /// is wrong with an option, as the Rust attribute refuses it at compile time.
    ///
    /// `wait` false: the task never waits on a busy unit (`on_busy="retry"` or `"raise"`), it
    /// answers `Contended` at once with the holder's remaining lock time.
    pub(crate) fn task(&self, name: &str, wait: bool) -> PyResult<Task> {
        let mut task = Task::named(name);
        if let Some(ttl) = self.lock_ttl {
            if ttl < MIN_TTL {
                return Err(PyValueError::new_err(format!(
                    "lock_ttl must be at least {} ms: a shorter lock can expire before its renewal or its grant's reply arrives",
                    MIN_TTL.as_millis()
                )));
            }
            task = task.lock_ttl(ttl);
        }
        if let Some(ttl) = self.result_ttl {
            if ttl.is_zero() {
                return Err(PyValueError::new_err(
                    "result_ttl must be greater than zero: a result kept for no time makes every delivery run",
                ));
            }
            if ttl < task.settings().lock_ttl {
                return Err(PyValueError::new_err(
                    "result_ttl must be at least lock_ttl: a result that expires before a lock of the same length lets a duplicate that waited that long run again",
                ));
            }
            task = task.result_ttl(ttl);
        }
        task = task.renew(self.renew).fencing(self.fencing);
        task = task.log_key(match self.log_key.as_deref() {
            None | Some("plain") => KeyLogging::Plain,
            Some("hash") => KeyLogging::Hash,
            Some(other) => {
                return Err(PyValueError::new_err(format!(
                    "log_key must be \"plain\" or \"hash\", not {other:?}"
                )));
            }
        });
        task = task.in_doubt(match self.in_doubt.as_deref() {
            None | Some("rerun") => InDoubt::Rerun,
            Some("hold") if self.reconcile => {
                return Err(PyValueError::new_err(
                    "reconcile runs on a unit in doubt, which in_doubt=\"hold\" never runs; keep one of the two (in_doubt=\"rerun\", the default, goes with reconcile)",
                ));
            }
            Some("hold") => InDoubt::Hold,
            Some(other) => {
                return Err(PyValueError::new_err(format!(
                    "in_doubt must be \"rerun\" or \"hold\", not {other:?}"
                )));
            }
        });
        if let Some(memory) = self.doubt_memory {
            task = task.doubt_memory(memory);
        }
        if let Some(after) = self.hold_alert_after {
            if task.settings().in_doubt != InDoubt::Hold {
                return Err(PyValueError::new_err(
                    "hold_alert_after raises the alarm on a unit held in doubt, and only in_doubt=\"hold\" holds units; add in_doubt=\"hold\" or leave hold_alert_after out",
                ));
            }
            task = task.hold_alert_after(after);
        }
        if let Some(max_steps) = self.max_steps {
            task = task.max_steps(max_steps);
        }
        if let Some(max_bytes) = self.max_step_bytes {
            task = task.max_step_bytes(max_bytes);
        }
        Ok(task.retry(self.retry(wait)))
    }

    fn retry(&self, wait: bool) -> RetryPolicy {
        if !wait {
            return RetryPolicy::no_wait();
        }
        let mut policy = RetryPolicy::new();
        if let Some(attempts) = self.max_attempts {
            policy = policy.max_attempts(attempts);
        }
        if let Some(wait) = self.max_wait {
            policy = policy.max_wait(wait);
        }
        if let Some(backoff) = self.initial_backoff {
            policy = policy.initial_backoff(backoff);
        }
        if let Some(backoff) = self.max_backoff {
            policy = policy.max_backoff(backoff);
        }
        policy
    }
}
