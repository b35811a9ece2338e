//! The native module of the Python package `idempotask` (`idempotask._native`): the core's
//! runner, its stores and its fingerprints, for the decorator in `python/idempotask/`.
//!
//! The protocol and the runner are the Rust core's; this crate adapts one call of it to a
//! Python body (`pending`) and the body's steps to the core's `TaskContext::step` (`steps`,
//! `step_call`), builds the stores from URLs once per process (`store`, safe
//! under a fork) and maps the core's errors to Python exceptions (`errors`). The Python
//! layer only computes keys and fingerprints' JSON from the arguments and runs the function.

use pyo3::prelude::*;

mod errors;
mod logs;
mod options;
mod pending;
mod runtime;
mod step_call;
mod steps;
mod store;
mod stored;
mod task;
mod wait;

/// The fingerprint the Rust core computes for the JSON text `json` (the SHA-256 of its
/// canonical form), as stored in markers.
#[pyfunction]
fn fingerprint(json: &str) -> PyResult<String> {
    Ok(task::fingerprint_of(json)?.as_str().to_owned())
}

/// A marker's parts: its key, fingerprint, fencing token and result's JSON.
type MarkerParts = (String, Option<String>, Option<u64>, Option<String>);

/// Decodes a stored completion marker: `(key, fingerprint, fencing_token, result_json)`;
/// `result_json` is `None` for a result that could not be stored. `ValueError` for bytes that
/// are not a marker.
#[pyfunction]
fn decode_marker(marker: &[u8]) -> PyResult<MarkerParts> {
    use idempotask::operator::{Marker, StoredResult};
    let marker = Marker::decode(marker)
        .map_err(|err| pyo3::exceptions::PyValueError::new_err(err.to_string()))?;
    let result = match marker.result() {
        StoredResult::Json(json) => Some(json.get().to_owned()),
        _ => None,
    };
    Ok((
        marker.key().to_owned(),
        marker.fingerprint().map(str::to_owned),
        marker.fencing_token(),
        result,
    ))
}

#[pymodule]
fn _native(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<task::NativeTask>()?;
    module.add_class::<pending::Pending>()?;
    module.add_class::<step_call::StepCall>()?;
    module.add_class::<store::MemoryStore>()?;
    module.add_class::<store::RedisStore>()?;
    module.add_class::<store::RedisClusterStore>()?;
    module.add_class::<store::PostgresStore>()?;
    module.add_class::<store::LocalResultCache>()?;
    module.add_function(wrap_pyfunction!(fingerprint, module)?)?;
    module.add_function(wrap_pyfunction!(decode_marker, module)?)?;
    errors::register(module)?;
    wait::install(module)?;
    logs::install(module)
}
