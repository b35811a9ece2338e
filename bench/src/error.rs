//! The one error of a benchmark run: what went wrong, in words.

use std::fmt;

/// A benchmark that could not run (Redis unreachable, a task failed, bad arguments), or lines
/// the plot cannot draw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BenchError(pub String);

impl fmt::Display for BenchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BenchError {}

impl From<redis::RedisError> for BenchError {
    fn from(err: redis::RedisError) -> Self {
        Self(format!("redis: {err}"))
    }
}

impl From<idempotask::Error> for BenchError {
    fn from(err: idempotask::Error) -> Self {
        Self(format!("task: {err}"))
    }
}

impl From<idempotask::InvalidKey> for BenchError {
    fn from(err: idempotask::InvalidKey) -> Self {
        Self(format!("key: {err}"))
    }
}

impl From<idempotask::store::StoreError> for BenchError {
    fn from(err: idempotask::store::StoreError) -> Self {
        Self(format!("store: {err}"))
    }
}

impl From<serde_json::Error> for BenchError {
    fn from(err: serde_json::Error) -> Self {
        Self(format!("json: {err}"))
    }
}
