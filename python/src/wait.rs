//! Waiting for the runtime's next message from Python: a call's events ([`Pending`]) and a
//! step's ([`StepCall`]) both wait this way, from a thread (the GIL released, signals handled)
//! or from an event loop (a future completed from the runtime).
//!
//! [`Pending`]: crate::pending::Pending
//! [`StepCall`]: crate::step_call::StepCall

use std::sync::Arc;
use std::time::Duration;

use pyo3::prelude::*;
use tokio::runtime::Handle;
use tokio::sync::mpsc::UnboundedReceiver;

/// Where the runtime's messages to one Python caller arrive.
pub(crate) type Inbox<T> = Arc<tokio::sync::Mutex<UnboundedReceiver<T>>>;

/// How often a blocked wait lets Python handle its signals and the core's log records.
const TICK: Duration = Duration::from_millis(200);

/// Input: an inbox. Output: its next message (`None`: every sender is gone), waited for with the
/// GIL released. Signals (Ctrl-C) are handled on each tick of the wait, and the core's queued
/// log records handed to `logging` then (a handler's `KeyboardInterrupt` is raised here).
pub(crate) fn next_blocking<T: Send>(
    py: Python<'_>,
    handle: &Handle,
    inbox: &Inbox<T>,
) -> PyResult<Option<T>> {
    loop {
        let inbox = Arc::clone(inbox);
        let handle = handle.clone();
        let next = py.detach(move || {
            handle.block_on(async {
                let mut inbox = inbox.lock().await;
                tokio::time::timeout(TICK, inbox.recv()).await
            })
        });
        if let Ok(next) = next {
            return Ok(next);
        }
        py.check_signals()?;
        // What the runtime logged meanwhile (a renewal's warning), on this tick.
        crate::logs::flush(py)?;
    }
}

/// Like [`next_blocking`] for asyncio: a future of `event_loop` that `resolve(future, ok,
/// value)` completes from the runtime through `loop.call_soon_threadsafe`, with what `convert`
/// makes of the next message (`ok` false: the exception it raised).
pub(crate) fn next_async<T, F>(
    py: Python<'_>,
    handle: &Handle,
    inbox: Inbox<T>,
    event_loop: Py<PyAny>,
    resolve: Py<PyAny>,
    convert: F,
) -> PyResult<Py<PyAny>>
where
    T: Send + 'static,
    F: FnOnce(Python<'_>, Option<T>) -> PyResult<Py<PyAny>> + Send + 'static,
{
    let future = event_loop.call_method0(py, "create_future")?;
    let answer = future.clone_ref(py);
    handle.spawn(async move {
        let next = inbox.lock().await.recv().await;
        // Taking the GIL can wait as long as some Python thread holds it: not on a worker of
        // the runtime, whose other calls' store I/O and renewals must go on.
        let resolved = tokio::task::spawn_blocking(move || {
            Python::attach(|py| {
                let (ok, value) = match convert(py, next) {
                    Ok(value) => (true, value),
                    Err(err) => (false, err.into_value(py).into_any()),
                };
                // What the runtime logged goes to `logging` on the event loop's thread, in
                // `resolve`, before the coroutine goes on. A closed loop has no one left to
                // tell.
                let _ = event_loop.call_method1(
                    py,
                    "call_soon_threadsafe",
                    (resolve, answer, ok, value),
                );
            });
        });
        // Only a panic in the closure fails it; the waiter's call ends on its own either way.
        let _ = resolved.await;
    });
    Ok(future)
}
