//! [`SqsError`]: what stopped the consumer from starting, receiving or settling.

use std::time::Duration;

/// The consumer could not start, or could not receive a batch.
///
/// Settling a batch never fails as a whole: a delete or a visibility change SQS refused is
/// reported on its message ([`Processed::settled`](crate::Processed::settled)).
///
/// ```
/// use std::time::Duration;
/// use idempotask_sqs::SqsError;
/// let err = SqsError::VisibilityBelowLockTtl { visibility_timeout: Duration::from_secs(5), lock_ttl: Duration::from_secs(30) };
/// assert!(err.to_string().starts_with("the queue's visibility timeout (5s) is shorter than the task's lock TTL (30s)"));
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SqsError {
    /// An SQS call failed, or answered what it never answers.
    #[error("SQS failed at {action}: {source}")]
    Sqs {
        /// What the consumer was doing: `GetQueueAttributes`, `ReceiveMessage`.
        action: &'static str,
        /// The SDK's error.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The queue's visibility timeout is shorter than the task's lock TTL: a message whose
    /// consumer died would be received again while its lock still holds the key, and deferred
    /// for nothing (each such receive counting towards the redrive policy's
    /// `maxReceiveCount`). Refused at [`consume`](crate::Idempotent::consume).
    #[error(
        "the queue's visibility timeout ({visibility_timeout:?}) is shorter than the task's lock TTL ({lock_ttl:?}): a message whose consumer died would come back while its lock still holds the key; raise the queue's VisibilityTimeout to at least the lock TTL, or lower the lock TTL"
    )]
    VisibilityBelowLockTtl {
        /// The queue's `VisibilityTimeout`.
        visibility_timeout: Duration,
        /// The task's lock TTL.
        lock_ttl: Duration,
    },
    /// The queue has no redrive policy (no dead-letter queue): a message no delivery can
    /// succeed with (no key, a body that does not decode, a body that keeps failing) would
    /// come back for ever. Refused at [`consume`](crate::Idempotent::consume).
    #[error(
        "the queue has no redrive policy: a message that can never be handled would come back for ever; give it a dead-letter queue (RedrivePolicy with deadLetterTargetArn and maxReceiveCount)"
    )]
    NoRedrivePolicy,
}

impl SqsError {
    pub(crate) fn sqs(action: &'static str, err: impl std::error::Error) -> Self {
        // The SDK's own `Display` says only "service error": its context names the cause.
        let text = aws_sdk_sqs::error::DisplayErrorContext(err).to_string();
        Self::Sqs {
            action,
            source: text.into(),
        }
    }

    pub(crate) fn reply(action: &'static str, what: &str) -> Self {
        Self::Sqs {
            action,
            source: format!("unexpected reply: {what}").into(),
        }
    }
}
