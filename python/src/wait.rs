//! Waiting for the runtime's next message from Python: a call's events ([`Pending`]) and a
//! step's ([`StepCall`]) both wait this way, from a thread (the GIL released, signals handled)
//! or from an event loop (a future completed from the runtime).
//!
//! An event for an event loop is handed over by a thread of the runtime's blocking pool, which
//! takes the GIL to call `loop.call_soon_threadsafe`. That call writes to the loop's wake-up
//! socket with the GIL released, and takes it back after: by then the loop may have run the
//! callback and the program ended. A thread that asks for the GIL while the interpreter
//! finalizes is ended by Python itself with `pthread_exit`, whose unwinding through Rust frames
//! aborts the process. So the interpreter's exit (`atexit`) waits for the hand-overs inside
//! Python to leave it, and none enters after.
//!
//! [`Pending`]: crate::pending::Pending
//! [`StepCall`]: crate::step_call::StepCall

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

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
            // The interpreter is exiting: nobody waits for the answer any more.
            let Some(_inside) = Inside::enter() else {
                return;
            };
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

/// How many hand-overs are inside Python now (holding the GIL or about to take it back).
static INSIDE: AtomicUsize = AtomicUsize::new(0);
/// Set at the interpreter's exit: no hand-over enters Python after it.
static EXITING: AtomicBool = AtomicBool::new(false);

/// How long the exit waits for the hand-overs inside Python: each only calls
/// `call_soon_threadsafe`.
const EXIT_WAIT: Duration = Duration::from_secs(5);

/// A hand-over inside Python, counted until it leaves.
struct Inside;

impl Inside {
    /// Counts a hand-over in, unless the interpreter is exiting. Counted first and checked
    /// after (both in one total order with the exit's flag and count), so that the exit either
    /// sees it counted or it sees the exit's flag.
    fn enter() -> Option<Self> {
        INSIDE.fetch_add(1, Ordering::SeqCst);
        if EXITING.load(Ordering::SeqCst) {
            INSIDE.fetch_sub(1, Ordering::SeqCst);
            return None;
        }
        Some(Self)
    }
}

impl Drop for Inside {
    fn drop(&mut self) {
        INSIDE.fetch_sub(1, Ordering::SeqCst);
    }
}

/// `atexit`'s hook: no hand-over enters Python from now on, and those inside are waited for
/// (the GIL released, so that they can finish), for up to 5 s.
#[pyfunction]
fn settle_handovers(py: Python<'_>) {
    EXITING.store(true, Ordering::SeqCst);
    py.detach(|| {
        let deadline = Instant::now() + EXIT_WAIT;
        // Polled, not signalled: a lock that a pool thread could hold at a fork would be
        // inherited locked by the child. This runs once, at exit, for microseconds.
        while INSIDE.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
    });
}

/// Adds [`settle_handovers`] to the module and registers it with `atexit`.
pub(crate) fn install(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_function(wrap_pyfunction!(settle_handovers, module)?)?;
    module
        .py()
        .import("atexit")?
        .call_method1("register", (module.getattr("settle_handovers")?,))?;
    Ok(())
}
