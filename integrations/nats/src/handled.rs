//! What became of one message, and the acknowledgement that says so to JetStream.

use std::time::Duration;

use async_nats::jetstream::AckKind;
use idempotask::{Error, Redelivery, Report};

use crate::backoff::{Backoff, MIN_DELAY};
use crate::key::MissingKey;

/// What became of one message; [`ack_kind`](Self::ack_kind) is the acknowledgement it calls
/// for, which [`Idempotent::handle`](crate::Idempotent::handle) sends (and
/// [`Idempotent::process`](crate::Idempotent::process) leaves to the caller).
///
/// See the table in the [crate docs](crate) for which outcome is which.
#[derive(Debug)]
#[non_exhaustive]
pub enum Handled<T, E> {
    /// The body ran and its result was stored, or the stored result of an earlier execution
    /// was handed back (the body did not run): acked.
    Acked(Report<T>),
    /// The body returned this error: the lock was released, nothing was stored, and the
    /// message is nak'd for JetStream to deliver again after `delay`.
    #[non_exhaustive]
    Failed {
        /// The body's error.
        error: E,
        /// The delay asked of JetStream: the failure backoff
        /// ([`Idempotent::failure_retry_delay`](crate::Idempotent::failure_retry_delay)) for
        /// this delivery.
        delay: Duration,
    },
    /// The body returned this error on delivery `delivered`, at or past
    /// [`Idempotent::max_failures`](crate::Idempotent::max_failures): nothing was stored, and
    /// the message is terminated (`AckKind::Term`) instead of being tried again.
    #[non_exhaustive]
    GaveUp {
        /// The body's last error.
        error: E,
        /// JetStream's count of this message's deliveries, this one included.
        delivered: i64,
    },
    /// idempotask could not decide yet: another delivery holds the key
    /// ([`Error::Contended`]), the store failed ([`Error::Store`]), none is installed, or the
    /// task is misused by the program (`Reentered`, `TaskNameTaken`, `NoRuntime`: a deploy's
    /// bug, logged as an error, not the message's). Nothing ran; the message is nak'd with
    /// `delay`.
    #[non_exhaustive]
    Deferred {
        /// Why nothing ran.
        error: Error,
        /// The holder's remaining lock time for `Contended`, a bounded backoff otherwise.
        delay: Duration,
    },
    /// No delivery of this message can succeed: it is terminated (`AckKind::Term`), which
    /// ends its redeliveries and raises JetStream's `MSG_TERMINATED` advisory (see the crate
    /// docs for what that takes to be a dead-letter path).
    Terminated(Rejection),
}

/// Why a message was terminated.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Rejection {
    /// The message carries no key.
    #[error(transparent)]
    MissingKey(#[from] MissingKey),
    /// idempotask refused the key or its stored result: [`Error::InvalidKey`],
    /// [`Error::KeyReuse`], [`Error::Codec`], [`Error::MarkerKeyMismatch`].
    #[error(transparent)]
    Refused(Error),
}

impl<T, E> Handled<T, E> {
    /// The acknowledgement this outcome calls for: `Ack`, `Nak(Some(delay))` or `Term`.
    pub fn ack_kind(&self) -> AckKind {
        match self {
            Self::Acked(_) => AckKind::Ack,
            Self::Failed { delay, .. } | Self::Deferred { delay, .. } => AckKind::Nak(Some(*delay)),
            Self::GaveUp { .. } | Self::Terminated(_) => AckKind::Term,
        }
    }
}

/// Input: an error of idempotask's own for a message delivered `delivered` times. Output: a
/// delayed nak when a later delivery can succeed, a term when none can.
pub(crate) fn undecided<T, E>(
    err: Error,
    lock_ttl: Duration,
    store_backoff: Backoff,
    delivered: i64,
) -> Handled<T, E> {
    match err.redelivery() {
        Redelivery::AfterHolder(remaining) => {
            // The holder has stored its result or lost its lock by then: either way the
            // redelivery decides at once instead of finding the lock taken again.
            let delay = remaining.unwrap_or(lock_ttl).max(MIN_DELAY);
            Handled::Deferred { error: err, delay }
        }
        Redelivery::Never => Handled::Terminated(Rejection::Refused(err)),
        // A store error, no store installed, misuse, or anything newer: fail closed and try
        // later.
        _ => {
            if err.is_misuse() {
                // The program is wrong, not the message: terminating would delete the backlog
                // on a WorkQueue or Interest stream, while a deferred message waits for the
                // fixed deploy.
                tracing::error!(
                    error = %err,
                    delivered,
                    "the task is misused; the message is delivered again later, fix the program"
                );
            }
            Handled::Deferred {
                error: err,
                delay: store_backoff.after(delivered),
            }
        }
    }
}
