//! The process's tokio runtime: built on first use, and built again in a forked child.
//!
//! A fork copies the parent's memory but only the thread that called `fork`: a runtime built in
//! the parent has no worker threads in the child, and its connections are the parent's
//! sockets. Celery's prefork pool forks after the application module (and so the decorator and
//! the store) was imported, so the runtime, like the stores, is keyed by the process id that
//! built it, and a child builds its own on its first call.

use std::sync::{Mutex, PoisonError};

use pyo3::PyResult;
use pyo3::exceptions::PyRuntimeError;
use tokio::runtime::{Builder, Handle, Runtime};

/// The runtime and the process that built it.
static RUNTIME: Mutex<Option<(u32, Runtime)>> = Mutex::new(None);

/// A handle to this process's runtime, built now if this process has none.
///
/// Two worker threads: they only drive the store's I/O, the timers, the waits on busy locks
/// and the lock renewals; the Python bodies run in the caller's own thread.
pub(crate) fn handle() -> PyResult<Handle> {
    let pid = std::process::id();
    let mut slot = RUNTIME.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((built_by, runtime)) = slot.as_ref()
        && *built_by == pid
    {
        return Ok(runtime.handle().clone());
    }
    // A parent's runtime, copied by a fork: dropping it would wait for worker threads that do
    // not exist in this process. It is left as it is (a few kilobytes, once per child).
    if let Some(inherited) = slot.take() {
        std::mem::forget(inherited);
    }
    let runtime = Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("idempotask")
        .enable_all()
        .build()
        .map_err(|err| {
            PyRuntimeError::new_err(format!("cannot start idempotask's runtime: {err}"))
        })?;
    let handle = runtime.handle().clone();
    *slot = Some((pid, runtime));
    Ok(handle)
}
