//! The core's `tracing` events as records of Python's `logging`, logger `idempotask`.
//!
//! The events of idempotask's crates (targets `idempotask…`) are emitted on the runtime's
//! worker threads, which must never wait for the GIL: a Python thread may hold it as long as it
//! likes, and a worker that waited for it would stall every other call's store I/O and lock
//! renewals. So the subscriber here only writes each event down (its level, message and fields,
//! as plain Rust values) in a queue, under a lock held for a push and nothing else, and the
//! queue is handed to `logging` by a thread that holds the GIL already:
//!
//! - a plain call's caller, in `Pending.wait` (the decorator's `_run_sync`), when an event of
//!   its call arrives and on each of its 200 ms ticks while it waits;
//! - for an asyncio call, the event loop's thread, in the callback that completes the call's
//!   future (the decorator's `_resolve`);
//! - the interpreter's exit (`atexit`), for records that no call came to take.
//!
//! A record therefore reaches `logging` on the thread of a call that waited or ended next, with
//! that call's frames as its origin, and the records of a call's end are out before its value
//! is. What remains: a record emitted while no call waits (a renewal's warning during a long
//! body of the only call) waits for the next call's event or the exit.
//!
//! Events are written down whatever `logging`'s level: only rare ends emit them (a lock lost, a
//! result not recorded, a unit in doubt, a store retried), so a call that goes well costs an
//! atomic load more. Spans and other crates' events (sqlx's statements) are never enabled.
//!
//! Fork safety: a runtime thread may hold the queue's lock, for a push, at the moment another
//! thread forks; the child would inherit it locked, with no thread left to unlock it. So the
//! module registers `os.register_at_fork` hooks: before a fork the forking thread takes the
//! lock (a push is short and never waits for the GIL), the parent releases it after, and the
//! child empties the queue (its records and its count of dropped ones are the parent's, which
//! the parent hands to `logging` itself) and releases it. A fork that bypasses `os.fork` runs
//! no hook; records it finds queued still carry the parent's pid and are left out.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::Interest;
use tracing::{Event, Level, Metadata, Subscriber};

/// The records not yet handed to `logging`, and how many were dropped since the last hand-over.
type Queue = (VecDeque<LogRecord>, u64);
/// The queue, locked for a push or a swap, never across Python or I/O.
static QUEUE: Mutex<Queue> = Mutex::new((VecDeque::new(), 0));
/// Whether `QUEUE` may hold records: the one thing a call that went well reads.
static QUEUED: AtomicBool = AtomicBool::new(false);
/// Whether the fork hooks and the exit's hand-over are registered (a module initialised twice
/// in a process registers them once).
static HOOKED: AtomicBool = AtomicBool::new(false);
/// How many records the queue keeps for a process that makes no further call: beyond it, the
/// oldest are dropped and counted.
const QUEUE_LIMIT: usize = 1024;

/// One event, written down on the thread that emitted it.
#[derive(Debug)]
struct LogRecord {
    /// The process that emitted it: a child forked with records still queued drops the
    /// parent's, which the parent hands to `logging` itself.
    pid: u32,
    level: Level,
    target: &'static str,
    message: String,
    fields: Vec<(&'static str, FieldValue)>,
}

/// A field's value, as Python gets it.
#[derive(Debug)]
enum FieldValue {
    Text(String),
    Unsigned(u64),
    Signed(i64),
    Float(f64),
    Bool(bool),
}

impl std::fmt::Display for FieldValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Text(text) => f.write_str(text),
            Self::Unsigned(value) => write!(f, "{value}"),
            Self::Signed(value) => write!(f, "{value}"),
            Self::Float(value) => write!(f, "{value}"),
            Self::Bool(value) => write!(f, "{value}"),
        }
    }
}

/// Collects an event's message and fields.
#[derive(Default)]
struct Fields {
    message: String,
    fields: Vec<(&'static str, FieldValue)>,
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.message, "{value:?}");
        } else {
            self.fields
                .push((field.name(), FieldValue::Text(format!("{value:?}"))));
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        } else {
            self.fields
                .push((field.name(), FieldValue::Text(value.to_owned())));
        }
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.fields
            .push((field.name(), FieldValue::Text(value.to_string())));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.fields
            .push((field.name(), FieldValue::Unsigned(value)));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.fields.push((field.name(), FieldValue::Signed(value)));
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.fields.push((field.name(), FieldValue::Float(value)));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.fields.push((field.name(), FieldValue::Bool(value)));
    }
}

/// The subscriber: idempotask's events into the queue, nothing else.
struct Bridge;

/// Whether a callsite is an event of one of idempotask's crates.
fn ours(metadata: &Metadata<'_>) -> bool {
    metadata.is_event() && metadata.target().starts_with("idempotask")
}

impl Subscriber for Bridge {
    fn register_callsite(&self, metadata: &'static Metadata<'static>) -> Interest {
        if ours(metadata) {
            Interest::always()
        } else {
            Interest::never()
        }
    }

    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        ours(metadata)
    }

    fn new_span(&self, _: &Attributes<'_>) -> Id {
        // Never called: no span is enabled.
        Id::from_u64(1)
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        let record = LogRecord {
            pid: std::process::id(),
            level: *event.metadata().level(),
            target: event.metadata().target(),
            message: fields.message,
            fields: fields.fields,
        };
        let mut queue = lock();
        let (records, dropped) = &mut *queue;
        if records.len() >= QUEUE_LIMIT {
            records.pop_front();
            *dropped += 1;
        }
        records.push_back(record);
        QUEUED.store(true, Ordering::Release);
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}

/// Makes the bridge the process's subscriber of `tracing` (the extension's own copy of it, which
/// nothing else in a Python process uses), registers the fork hooks and the exit's hand-over,
/// and names `logging`'s level 5 `TRACE` unless something named it already. Once, when the
/// module is imported.
pub(crate) fn install(module: &Bound<'_, PyModule>) -> PyResult<()> {
    // Already set: the module was initialised before in this process.
    let _ = tracing::subscriber::set_global_default(Bridge);
    let py = module.py();
    module.add_function(wrap_pyfunction!(flush_logs, module)?)?;
    module.add_function(wrap_pyfunction!(queued_records, module)?)?;
    // Once a process: a second `before` hook would take the lock its thread holds already.
    if HOOKED.swap(true, Ordering::AcqRel) {
        return Ok(());
    }
    let logging = py.import("logging")?;
    if logging
        .call_method1("getLevelName", (5,))?
        .extract::<String>()
        .is_ok_and(|name| name == "Level 5")
    {
        logging.call_method1("addLevelName", (5, "TRACE"))?;
    }
    let os = py.import("os")?;
    // No `register_at_fork` on a platform without `fork`.
    if os.hasattr("register_at_fork")? {
        let hooks = PyDict::new(py);
        hooks.set_item("before", wrap_pyfunction!(before_fork, module)?)?;
        hooks.set_item(
            "after_in_parent",
            wrap_pyfunction!(after_fork_in_parent, module)?,
        )?;
        hooks.set_item(
            "after_in_child",
            wrap_pyfunction!(after_fork_in_child, module)?,
        )?;
        os.call_method("register_at_fork", (), Some(&hooks))?;
    }
    py.import("atexit")?
        .call_method1("register", (module.getattr("flush_logs")?,))?;
    Ok(())
}

fn lock() -> MutexGuard<'static, Queue> {
    QUEUE.lock().unwrap_or_else(PoisonError::into_inner)
}

thread_local! {
    /// The queue's lock, held by the thread that forks from `before_fork` to the fork's end.
    static FORKING: RefCell<Option<MutexGuard<'static, Queue>>> = const { RefCell::new(None) };
}

/// `os.fork`'s `before` hook: the forking thread takes the queue's lock, so that no runtime
/// thread holds it when the process is copied.
#[pyfunction]
fn before_fork() {
    // Taken with the GIL held: a push holds the lock briefly and never waits for the GIL.
    let guard = lock();
    FORKING.with(|held| *held.borrow_mut() = Some(guard));
}

/// `os.fork`'s `after_in_parent` hook: the lock taken before the fork is released.
#[pyfunction]
fn after_fork_in_parent() {
    FORKING.with(|held| drop(held.borrow_mut().take()));
}

/// `os.fork`'s `after_in_child` hook: the child's queue, the parent's records and count of
/// dropped ones, is emptied (the parent hands them to `logging`), and its lock released.
#[pyfunction]
fn after_fork_in_child() {
    FORKING.with(|held| {
        if let Some(mut queue) = held.borrow_mut().take() {
            *queue = (VecDeque::new(), 0);
            QUEUED.store(false, Ordering::Release);
        }
    });
}

/// Hands the queued records to `logging` now (the decorator's asyncio callback and `atexit`
/// call it); raises what a handler raised that is not an `Exception` (`KeyboardInterrupt`).
#[pyfunction]
fn flush_logs(py: Python<'_>) -> PyResult<()> {
    flush(py)
}

/// How many records wait for a hand-over to `logging` (for tests and diagnostics).
#[pyfunction]
fn queued_records() -> usize {
    lock().0.len()
}

/// `logging`'s number for a level: `TRACE` is 5, below `DEBUG`, so that a logger at `DEBUG`
/// does not take the core's most detailed events.
fn python_level(level: Level) -> u8 {
    match level {
        Level::ERROR => 40,
        Level::WARN => 30,
        Level::INFO => 20,
        Level::DEBUG => 10,
        Level::TRACE => 5,
    }
}

/// Hands the queued records to `logging` on the calling thread, which holds the GIL and no lock
/// of idempotask's. A record that a filter or handler fails with an `Exception` is reported on
/// `sys.stderr` as `logging.Handler.handleError` reports one (once per hand-over, when
/// `logging.raiseExceptions` is set), and the other records go on; anything else raised
/// (`KeyboardInterrupt`, `SystemExit`) stops the hand-over and is the caller's (the records
/// not handed yet are dropped).
pub(crate) fn flush(py: Python<'_>) -> PyResult<()> {
    if !QUEUED.load(Ordering::Acquire) {
        return Ok(());
    }
    let (records, dropped) = {
        let mut queue = lock();
        QUEUED.store(false, Ordering::Release);
        std::mem::take(&mut *queue)
    };
    let mut failures = Failures::default();
    let logger = match py
        .import("logging")
        .and_then(|logging| logging.call_method1("getLogger", ("idempotask",)))
    {
        Ok(logger) => logger,
        Err(err) => return failures.settle(py, Err(err)),
    };
    if dropped > 0 {
        let warned = logger.call_method1(
            "warning",
            (format!(
                "{dropped} earlier records of idempotask were dropped: more than {QUEUE_LIMIT} waited for a call to end"
            ),),
        );
        failures.settle(py, warned.map(drop))?;
    }
    let pid = std::process::id();
    for record in records.into_iter().filter(|record| record.pid == pid) {
        failures.settle(py, emit(py, &logger, record))?;
    }
    Ok(())
}

/// Whether a hand-over reported a failed record already.
#[derive(Default)]
struct Failures {
    reported: bool,
}

impl Failures {
    /// One record's hand-over: an `Exception` is reported (the first of the hand-over only)
    /// and swallowed, anything else is returned.
    fn settle(&mut self, py: Python<'_>, result: PyResult<()>) -> PyResult<()> {
        let Err(err) = result else {
            return Ok(());
        };
        if !err.is_instance_of::<PyException>(py) {
            return Err(err);
        }
        if !self.reported {
            self.reported = true;
            let raise = py
                .import("logging")
                .and_then(|logging| logging.getattr("raiseExceptions"))
                .and_then(|raise| raise.is_truthy())
                .unwrap_or(true);
            if raise {
                // As `logging.Handler.handleError` writes it.
                let header = py.import("sys").and_then(|sys| {
                    sys.getattr("stderr")?.call_method1(
                        "write",
                        ("--- Logging error (a record of idempotask's) ---\n",),
                    )
                });
                if header.is_ok() {
                    err.display(py);
                }
            }
        }
        Ok(())
    }
}

/// One record to `logger`, if it is enabled for the record's level.
fn emit(py: Python<'_>, logger: &Bound<'_, PyAny>, record: LogRecord) -> PyResult<()> {
    let level = python_level(record.level);
    if !logger.call_method1("isEnabledFor", (level,))?.is_truthy()? {
        return Ok(());
    }
    let mut message = record.message;
    let fields = PyDict::new(py);
    for (name, value) in &record.fields {
        let _ = write!(message, " {name}={value}");
        match value {
            FieldValue::Text(text) => fields.set_item(name, text)?,
            FieldValue::Unsigned(value) => fields.set_item(name, value)?,
            FieldValue::Signed(value) => fields.set_item(name, value)?,
            FieldValue::Float(value) => fields.set_item(name, value)?,
            FieldValue::Bool(value) => fields.set_item(name, value)?,
        }
    }
    let extra = PyDict::new(py);
    extra.set_item("idempotask", fields)?;
    extra.set_item("idempotask_target", record.target)?;
    let kwargs = PyDict::new(py);
    kwargs.set_item("extra", extra)?;
    // `%` in the message is text: `logging` formats `msg % args` only with arguments.
    logger.call_method("log", (level, message), Some(&kwargs))?;
    Ok(())
}
