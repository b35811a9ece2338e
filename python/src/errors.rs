//! idempotask's errors as Python exceptions, each a subclass of `IdempotaskError` with the
//! figures a caller acts on as attributes.

use idempotask::store::StoreErrorKind;
use idempotask::{Error, StepErrorKind};
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

create_exception!(
    _native,
    IdempotaskError,
    PyException,
    "Every error of idempotask's own (never the task's exceptions, which propagate as raised)."
);
create_exception!(
    _native,
    Contended,
    IdempotaskError,
    "Another delivery holds the unit's lock: nothing ran. `lock_ttl_remaining` is the holder's remaining lock time in seconds (None when the store did not say); redeliver the message then."
);
create_exception!(
    _native,
    InDoubt,
    IdempotaskError,
    "The unit is in doubt and the task holds such units (`in_doubt=\"hold\"`): an earlier delivery's lock ran out without a release or a result. Nothing ran; an operator must resolve it."
);
create_exception!(
    _native,
    KeyReuse,
    IdempotaskError,
    "The key was used before with different fingerprinted arguments: nothing ran."
);
create_exception!(
    _native,
    StoreError,
    IdempotaskError,
    "The store could not be reached or did not answer in time. `ambiguous` says whether the outcome is unknown; retrying the delivery is safe either way."
);
create_exception!(
    _native,
    CodecError,
    IdempotaskError,
    "A result could not be stored or read back, or the arguments could not be fingerprinted; `kind` says which."
);

create_exception!(
    _native,
    LockNotHeld,
    IdempotaskError,
    "This delivery's lock ran out and another delivery took the unit over: the step did not run, and the call does not record a result. The other delivery's result is the unit's."
);
create_exception!(
    _native,
    StepError,
    IdempotaskError,
    "A step could not run or be replayed; `kind` says why: `order_changed`, `too_many`, `overlapping`, `unsupported` (nothing ran) or `unrecorded` (its effect happened, its record was not confirmed)."
);

/// A `CodecError` raised by the binding itself, with its `kind` (`fingerprint`: arguments that
/// have no JSON text the core takes), as every `CodecError` has one.
pub(crate) fn codec_error(kind: &str, message: String) -> PyErr {
    Python::attach(|py| {
        let exception = CodecError::new_err(message);
        // An exception instance takes any attribute; a failure here would only lose it.
        let _ = exception.value(py).setattr("kind", kind);
        exception
    })
}

/// Input: an error of the core. Output: the Python exception that carries it.
pub(crate) fn to_py_err(err: &Error) -> PyErr {
    let message = err.to_string();
    Python::attach(|py| {
        let exception = match err {
            Error::Contended { .. } => Contended::new_err(message),
            Error::InDoubt { .. } => InDoubt::new_err(message),
            Error::KeyReuse { .. } => KeyReuse::new_err(message),
            Error::Store(_) => StoreError::new_err(message),
            Error::Codec { .. } => CodecError::new_err(message),
            Error::LockNotHeld { .. } => LockNotHeld::new_err(message),
            Error::Step { .. } => StepError::new_err(message),
            _ => IdempotaskError::new_err(message),
        };
        // An exception instance takes any attribute; a failure here would only lose one.
        let _ = attributes(exception.value(py), err);
        exception
    })
}

/// Sets the figures of `err` on its exception `value`.
fn attributes(value: &Bound<'_, pyo3::exceptions::PyBaseException>, err: &Error) -> PyResult<()> {
    match err {
        Error::Contended {
            lock_ttl_remaining,
            attempts,
            ..
        } => {
            value.setattr(
                "lock_ttl_remaining",
                lock_ttl_remaining.map(|left| left.as_secs_f64()),
            )?;
            value.setattr("attempts", *attempts)?;
        }
        Error::InDoubt { doubt, .. } => {
            value.setattr("expired_for", doubt.expired_for.as_secs_f64())?;
            value.setattr("fencing_token", doubt.fencing_token)?;
        }
        Error::Store(store) => {
            value.setattr("ambiguous", store.is_ambiguous())?;
            value.setattr("kind", store_kind(store.kind()))?;
        }
        Error::Codec { kind, .. } => {
            value.setattr("kind", format!("{kind:?}").to_lowercase())?;
        }
        Error::Step { kind, .. } => {
            value.setattr("kind", step_kind(*kind))?;
        }
        _ => {}
    }
    Ok(())
}

fn store_kind(kind: StoreErrorKind) -> &'static str {
    match kind {
        StoreErrorKind::Unreachable => "unreachable",
        StoreErrorKind::Timeout => "timeout",
        StoreErrorKind::Rejected => "rejected",
        StoreErrorKind::Protocol => "protocol",
        _ => "configuration",
    }
}

fn step_kind(kind: StepErrorKind) -> &'static str {
    match kind {
        StepErrorKind::OrderChanged => "order_changed",
        StepErrorKind::TooMany => "too_many",
        StepErrorKind::Overlapping => "overlapping",
        StepErrorKind::Unsupported => "unsupported",
        StepErrorKind::Unrecorded => "unrecorded",
        _ => "other",
    }
}

/// Adds the exception classes to the module.
pub(crate) fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = module.py();
    module.add("IdempotaskError", py.get_type::<IdempotaskError>())?;
    module.add("Contended", py.get_type::<Contended>())?;
    module.add("InDoubt", py.get_type::<InDoubt>())?;
    module.add("KeyReuse", py.get_type::<KeyReuse>())?;
    module.add("StoreError", py.get_type::<StoreError>())?;
    module.add("CodecError", py.get_type::<CodecError>())?;
    module.add("LockNotHeld", py.get_type::<LockNotHeld>())?;
    module.add("StepError", py.get_type::<StepError>())?;
    Ok(())
}
