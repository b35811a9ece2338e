//! Hooks for `runtime/benches/client_side.rs`. Not a public API: it changes without notice.
//!
//! The criterion benchmarks measure the client-side work of one task call through public items
//! where there are some; this reaches the one step that has none.

use serde_json::value::RawValue;

use crate::marker::Marker;

/// The completion marker bytes that a successful call with result `json` stores.
pub fn encode_marker(key: &str, fencing_token: Option<u64>, json: &RawValue) -> Vec<u8> {
    Marker::encode(key, fencing_token, None, Ok(json))
}
