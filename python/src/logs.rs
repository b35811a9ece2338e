//! The core's `tracing` events as records of Python's `logging`, logger `idempotask`.
//!
//! The events of idempotask's crates (targets `idempotask…`) are emitted on the runtime's
//! worker threads, which must never wait for the GIL: a Python thread may hold it as long as it
//! likes, and a worker that waited for it would stall every other call's store I/O and lock
//! renewals. So the subscriber here only writes each event down (its level, message and fields,
//! as plain Rust values) in a queue, under a lock held for a push and nothing else, and the
//! queue is handed to `logging` by a thread that holds the GIL already: the Python caller, when
//! its call's `wait` returns, and the thread that completes an asyncio call's future. A
//! record therefore reaches `logging` on the thread of the call that ended next, with the
//! caller's frames as its origin, and the records of a call's end are out before its value is.
//!
//! Events are written down whatever `logging`'s level: only rare ends emit them (a lock lost, a
//! result not recorded, a unit in doubt, a store retried), so a call that goes well costs an
//! atomic load more. Spans and other crates' events (sqlx's statements) are never enabled.
//!
//! Fork safety: the queue's lock is held only for a push or a swap, never across Python or
//! I/O, and only on threads of a runtime, which Celery's prefork parent does not start before
//! it forks (the runtime is built on a process's first call). Records a child finds queued are
//! its parent's, and are left to the parent.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

use pyo3::prelude::*;
use pyo3::types::PyDict;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::Interest;
use tracing::{Event, Level, Metadata, Subscriber};

/// The records not yet handed to `logging`, and how many were dropped since the last hand-over.
static QUEUE: Mutex<(VecDeque<LogRecord>, u64)> = Mutex::new((VecDeque::new(), 0));
/// Whether `QUEUE` may hold records: the one thing a call that went well reads.
static QUEUED: AtomicBool = AtomicBool::new(false);
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
        let mut queue = QUEUE.lock().unwrap_or_else(PoisonError::into_inner);
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
/// nothing else in a Python process uses). Once, when the module is imported.
pub(crate) fn install() {
    // Already set: the module was initialised before in this process.
    let _ = tracing::subscriber::set_global_default(Bridge);
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
/// of idempotask's. A record `logging` refuses (a handler that raised) is reported by
/// `logging` itself; anything else that fails is lost with its record, never the caller's
/// error.
pub(crate) fn flush(py: Python<'_>) {
    if !QUEUED.load(Ordering::Acquire) {
        return;
    }
    let (records, dropped) = {
        let mut queue = QUEUE.lock().unwrap_or_else(PoisonError::into_inner);
        QUEUED.store(false, Ordering::Release);
        std::mem::take(&mut *queue)
    };
    let _ = emit(py, records, dropped);
}

fn emit(py: Python<'_>, records: VecDeque<LogRecord>, dropped: u64) -> PyResult<()> {
    let logger = py
        .import("logging")?
        .call_method1("getLogger", ("idempotask",))?;
    if dropped > 0 {
        logger.call_method1(
            "warning",
            (format!(
                "{dropped} earlier records of idempotask were dropped: more than {QUEUE_LIMIT} waited for a call to end"
            ),),
        )?;
    }
    let pid = std::process::id();
    for record in records.into_iter().filter(|record| record.pid == pid) {
        let level = python_level(record.level);
        if !logger.call_method1("isEnabledFor", (level,))?.is_truthy()? {
            continue;
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
    }
    Ok(())
}
