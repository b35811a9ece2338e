//! [`StreamError`]: what stopped the consumer from reading or settling a batch.

use std::time::Duration;

/// The consumer could not join its group, read, claim, settle or trim.
///
/// A batch whose settling failed is not lost: nothing of it was written (the settling is one
/// transaction), its entries stay pending, and a consumer claims them once they have been
/// idle for [`claim_idle`](crate::Idempotent::claim_idle); a stored result is then replayed.
///
/// ```
/// use std::time::Duration;
/// use idempotask_redis_streams::StreamError;
/// let err = StreamError::ClaimIdleBelowLockTtl { claim_idle: Duration::from_secs(5), lock_ttl: Duration::from_secs(30) };
/// assert!(err.to_string().starts_with("claim_idle (5s) is shorter than the task's lock TTL (30s)"));
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StreamError {
    /// A Redis command failed, or answered what it never answers.
    #[error("Redis failed at {action}: {source}")]
    Redis {
        /// What the consumer was doing: `XGROUP CREATE`, `XREADGROUP`, `XAUTOCLAIM`, ….
        action: &'static str,
        /// The client's error.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// [`claim_idle`](crate::Idempotent::claim_idle) is shorter than the task's lock TTL:
    /// entries of a crashed consumer would be claimed while its lock still holds their keys,
    /// and each claim would count as a delivery towards
    /// [`max_deliveries`](crate::Idempotent::max_deliveries). Refused when the consumer joins
    /// its group.
    #[error(
        "claim_idle ({claim_idle:?}) is shorter than the task's lock TTL ({lock_ttl:?}): entries of a crashed consumer would be claimed while its lock still holds their keys; set claim_idle to at least the lock TTL"
    )]
    ClaimIdleBelowLockTtl {
        /// The configured claim time.
        claim_idle: Duration,
        /// The task's lock TTL.
        lock_ttl: Duration,
    },
}

impl StreamError {
    pub(crate) fn redis(action: &'static str, err: redis::RedisError) -> Self {
        Self::Redis {
            action,
            source: Box::new(err),
        }
    }

    pub(crate) fn reply(action: &'static str, what: &str) -> Self {
        Self::Redis {
            action,
            source: format!("unexpected reply: {what}").into(),
        }
    }
}
