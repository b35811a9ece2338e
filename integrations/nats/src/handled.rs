//! What became of one message, and the acknowledgement that says so to JetStream.

use std::time::Duration;

use async_nats::jetstream::AckKind;
use idempotask::{Error, Report};

use crate::key::MissingKey;

/// What became of one message; [`ack_kind`](Self::ack_kind) is what was sent to JetStream.
///
/// See the table in the [crate docs](crate) for which outcome is which.
#[derive(Debug)]
#[non_exhaustive]
pub enum Handled<T, E> {
    /// The body ran and its result was stored, or the stored result of an earlier execution
    /// was handed back (the body did not run): acked.
    Acked(Report<T>),
    /// The body returned this error: the lock was released, nothing was stored, and the
    /// message was nak'd for JetStream to deliver again (after `delay`, when one is set).
    Failed {
        /// The body's error.
        error: E,
        /// The delay asked of JetStream, from [`Idempotent::failure_delay`](crate::Idempotent::failure_delay).
        delay: Option<Duration>,
    },
    /// idempotask could not decide yet: another delivery holds the key
    /// ([`Error::Contended`]) or the store failed ([`Error::Store`]). Nothing ran; the message
    /// was nak'd with `delay`.
    Deferred {
        /// Why nothing ran.
        error: Error,
        /// The holder's remaining lock time for `Contended`, a bounded backoff otherwise.
        delay: Duration,
    },
    /// No delivery of this message can succeed: it was terminated (`AckKind::Term`), which
    /// ends its redeliveries and raises JetStream's `MSG_TERMINATED` advisory, the dead-letter
    /// path.
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
    /// [`Error::KeyReuse`], [`Error::Codec`], [`Error::MarkerKeyMismatch`], or a misuse of the
    /// task (`Reentered`, `TaskNameTaken`, `NoRuntime`).
    #[error(transparent)]
    Refused(Error),
}

impl<T, E> Handled<T, E> {
    /// The acknowledgement this outcome sends.
    ///
    /// ```
    /// use std::time::Duration;
    /// use async_nats::jetstream::AckKind;
    /// use idempotask_nats::Handled;
    ///
    /// let failed: Handled<(), &str> = Handled::failed("card declined", None);
    /// assert!(matches!(failed.ack_kind(), AckKind::Nak(None)));
    /// ```
    pub fn ack_kind(&self) -> AckKind {
        match self {
            Self::Acked(_) => AckKind::Ack,
            Self::Failed { delay, .. } => AckKind::Nak(*delay),
            Self::Deferred { delay, .. } => AckKind::Nak(Some(*delay)),
            Self::Terminated(_) => AckKind::Term,
        }
    }

    /// The outcome of a body that returned `error`, nak'd after `delay`.
    pub fn failed(error: E, delay: Option<Duration>) -> Self {
        Self::Failed { error, delay }
    }
}

/// How long a message whose store call failed waits before its next delivery: `first`,
/// doubling with each delivery, at most `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Backoff {
    pub(crate) first: Duration,
    pub(crate) max: Duration,
}

impl Backoff {
    /// The delay after the `delivered`-th delivery (1-based) failed.
    pub(crate) fn after(self, delivered: i64) -> Duration {
        let doublings = u32::try_from(delivered.saturating_sub(1).clamp(0, 20)).unwrap_or(20);
        self.first.saturating_mul(1 << doublings).min(self.max)
    }
}

/// Input: an error of idempotask's own for a message delivered `delivered` times. Output: what
/// the message gets: a delayed nak when a later delivery can succeed, a term when none can.
pub(crate) fn refused<T, E>(
    err: Error,
    lock_ttl: Duration,
    store_backoff: Backoff,
    delivered: i64,
) -> Handled<T, E> {
    match err {
        Error::Contended {
            lock_ttl_remaining, ..
        } => {
            // The holder has stored its result or lost its lock by then: either way the
            // redelivery decides at once instead of finding the lock taken again.
            let delay = lock_ttl_remaining.unwrap_or(lock_ttl);
            Handled::Deferred { error: err, delay }
        }
        Error::KeyReuse { .. }
        | Error::Codec { .. }
        | Error::InvalidKey(_)
        | Error::MarkerKeyMismatch { .. }
        | Error::Reentered { .. }
        | Error::NoRuntime
        | Error::TaskNameTaken { .. } => Handled::Terminated(Rejection::Refused(err)),
        // A store error, no store installed, or anything newer: fail closed and try later.
        _ => Handled::Deferred {
            error: err,
            delay: store_backoff.after(delivered),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_backoff_doubles_up_to_its_bound() {
        let backoff = Backoff {
            first: Duration::from_millis(100),
            max: Duration::from_millis(700),
        };
        let delays: Vec<u128> = [0, 1, 2, 3, 4, 9999]
            .map(|n| backoff.after(n).as_millis())
            .to_vec();
        assert_eq!(delays, [100, 100, 200, 400, 700, 700]);
    }
}
