//! What became of one message: deleted, handed back for a later receive, or rejected, and
//! whether SQS took the verb.

use std::time::Duration;

use idempotask::{Error, Report};
use idempotask_consumer::BodyFailure;

use crate::{BadMessage, MissingKey};

/// One message of a batch and what became of it
/// ([`SqsConsumer::next_batch`](crate::SqsConsumer::next_batch) answers one per message).
///
/// ```
/// use idempotask_sqs::{Handled, Processed};
///
/// fn log(processed: &Processed<String, std::io::Error>) {
///     match &processed.handled {
///         Handled::Deleted(report) => println!("{}: {}", processed.id, report.value),
///         Handled::Failed { error, delay, .. } => println!("{}: failed ({error}), back in {delay:?}", processed.id),
///         Handled::Deferred { error, delay, .. } => println!("{}: {error}, back in {delay:?}", processed.id),
///         Handled::Behind { message_id, .. } => println!("{}: waits for {message_id} of its group", processed.id),
///         Handled::Rejected(why) => println!("{}: left to the redrive policy: {why}", processed.id),
///     }
///     if let Err(failure) = &processed.settled {
///         eprintln!("{}: SQS refused the settling: {failure}", processed.id);
///     }
/// }
/// # let _ = log;
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub struct Processed<T, E> {
    /// The message's id.
    pub id: String,
    /// Which receive of the message this was (`ApproximateReceiveCount`): 1 for the first.
    pub receive_count: u32,
    /// What became of it.
    pub handled: Handled<T, E>,
    /// Whether SQS took what the message was given: its entry of the batch's
    /// `DeleteMessageBatch`, or of its `ChangeMessageVisibilityBatch`. A message whose delete
    /// failed comes back after its visibility timeout, and its stored result is then replayed.
    pub settled: Result<(), SettleFailure>,
}

/// What became of one message, and what SQS was told. See the table in the
/// [crate docs](crate).
#[derive(Debug)]
pub enum Handled<T, E> {
    /// The body ran and its result was stored, or the stored result of an earlier execution
    /// was handed back (the body did not run), or the body ran and lost its lock or marker
    /// (the side effect happened): deleted, in the batch's `DeleteMessageBatch`.
    Deleted(Report<T>),
    /// The body failed (an `Err` or a panic) below
    /// [`max_failures`](crate::Idempotent::max_failures): its lock was released, nothing was
    /// stored, and the message's visibility timeout was set to `delay`.
    #[non_exhaustive]
    Failed {
        /// The body's error, or its panic.
        error: BodyFailure<E>,
        /// How many times the body failed for this message, this one included (counted by
        /// receives: see the crate docs).
        failures: u32,
        /// When SQS hands it out again: the failure backoff for `failures`, in whole seconds.
        delay: Duration,
    },
    /// idempotask could not decide yet: another delivery holds the key, the store failed or
    /// none is installed, or the task is misused. Nothing ran; the message's visibility
    /// timeout was set to `delay`. Never deleted.
    #[non_exhaustive]
    Deferred {
        /// Why nothing ran.
        error: Error,
        /// The holder's remaining lock time for a busy key, otherwise the store backoff, in
        /// whole seconds.
        delay: Duration,
    },
    /// FIFO queues: an earlier message of the same message group in this batch did not
    /// finish, so this one did not run, to keep the group's order; it was handed back at once
    /// and comes after that one.
    #[non_exhaustive]
    Behind {
        /// The id of the group's earlier message that stopped it.
        message_id: String,
    },
    /// No delivery of the message can succeed, or its body has failed too often: not deleted,
    /// and handed back at once, for the queue's redrive policy to move to its dead-letter
    /// queue (see the crate docs).
    Rejected(Rejection<E>),
}

/// Why a message was rejected; [`reason`](Self::reason) is a short name for logs and metrics.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Rejection<E> {
    /// The message carries no key. Nothing ran.
    #[error(transparent)]
    MissingKey(MissingKey),
    /// The body's closure refused the message (a body that does not decode). Nothing ran.
    #[error(transparent)]
    BadMessage(BadMessage),
    /// The body failed for the `failures`-th time, which is
    /// [`max_failures`](crate::Idempotent::max_failures). Nothing was stored.
    #[error("the body failed {failures} times, which is max_failures: {failure}")]
    GaveUp {
        /// The body's last error, or its panic.
        failure: BodyFailure<E>,
        /// How many times the body failed for this message.
        failures: u32,
    },
    /// idempotask refused the key or its stored result: [`Error::InvalidKey`],
    /// [`Error::KeyReuse`], [`Error::Codec`], [`Error::MarkerKeyMismatch`].
    #[error(transparent)]
    Refused(Error),
    /// The message's unit is in doubt and its task holds such units ([`Error::InDoubt`]). The
    /// message is sound: once an operator has resolved the unit, redrive it from the
    /// dead-letter queue, and it replays or runs.
    #[error(transparent)]
    InDoubt(Error),
}

impl<E> Rejection<E> {
    /// The short name of the reason: `missing-key`, `bad-message`, `gave-up`, `refused` or
    /// `in-doubt`.
    ///
    /// ```
    /// use idempotask_sqs::{Message, MissingKey, Rejection};
    /// let why: Rejection<std::io::Error> = Rejection::MissingKey(MissingKey::new(&Message::new("m-1", ""), "none"));
    /// assert_eq!(why.reason(), "missing-key");
    /// ```
    pub fn reason(&self) -> &'static str {
        match self {
            Self::MissingKey(_) => "missing-key",
            Self::BadMessage(_) => "bad-message",
            Self::GaveUp { .. } => "gave-up",
            Self::Refused(_) => "refused",
            Self::InDoubt(_) => "in-doubt",
        }
    }
}

/// SQS did not take a message's settling: its entry of the batch's `DeleteMessageBatch` or
/// `ChangeMessageVisibilityBatch` failed (a receipt handle that expired, a throttled call), or
/// the whole call failed. Nothing is lost: a message whose delete failed is received again
/// after its visibility timeout and replays its stored result.
///
/// ```
/// use idempotask_sqs::SettleFailure;
/// let failure = SettleFailure::new("DeleteMessageBatch", "ReceiptHandleIsInvalid", "the receipt handle has expired");
/// assert_eq!(failure.to_string(), "DeleteMessageBatch refused the message: ReceiptHandleIsInvalid: the receipt handle has expired");
/// assert_eq!(failure.code(), "ReceiptHandleIsInvalid");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{action} refused the message: {code}: {message}")]
pub struct SettleFailure {
    action: &'static str,
    code: String,
    message: String,
}

impl SettleFailure {
    /// `action` (`DeleteMessageBatch`, `ChangeMessageVisibilityBatch`) failed for a message
    /// with the error `code` and `message`.
    ///
    /// ```
    /// use idempotask_sqs::SettleFailure;
    /// let failure = SettleFailure::new("ChangeMessageVisibilityBatch", "MessageNotInflight", "not in flight");
    /// assert_eq!(failure.action(), "ChangeMessageVisibilityBatch");
    /// ```
    pub fn new(action: &'static str, code: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            action,
            code: code.into(),
            message: message.into(),
        }
    }

    /// The call that failed: `DeleteMessageBatch` or `ChangeMessageVisibilityBatch`.
    ///
    /// ```
    /// use idempotask_sqs::SettleFailure;
    /// assert_eq!(SettleFailure::new("DeleteMessageBatch", "CallFailed", "timeout").action(), "DeleteMessageBatch");
    /// ```
    pub fn action(&self) -> &'static str {
        self.action
    }

    /// SQS's error code for the entry (`ReceiptHandleIsInvalid`, …), or `CallFailed` when the
    /// whole call failed.
    ///
    /// ```
    /// use idempotask_sqs::SettleFailure;
    /// assert_eq!(SettleFailure::new("DeleteMessageBatch", "CallFailed", "timeout").code(), "CallFailed");
    /// ```
    pub fn code(&self) -> &str {
        &self.code
    }
}
