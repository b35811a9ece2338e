//! What became of one message, and the acknowledgement that says so to JetStream.

use std::time::Duration;

use async_nats::jetstream::AckKind;
use idempotask::{Error, Report};
use idempotask_consumer::{BodyFailure, Verdict};

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
    /// The body returned an error or panicked: the lock was released, nothing was stored, and
    /// the message is nak'd for JetStream to deliver again after `delay`.
    #[non_exhaustive]
    Failed {
        /// The body's error, or its panic.
        error: BodyFailure<E>,
        /// The delay asked of JetStream: the failure backoff
        /// ([`Idempotent::failure_backoff`](crate::Idempotent::failure_backoff)) for
        /// this failure of the message.
        delay: Duration,
    },
    /// The body failed for the `failures`-th time, at or past
    /// [`Idempotent::max_failures`](crate::Idempotent::max_failures): nothing was stored, and
    /// the message is terminated (`AckKind::Term`) instead of being tried again.
    #[non_exhaustive]
    GaveUp {
        /// The body's last error, or its panic.
        error: BodyFailure<E>,
        /// How many times the body failed for this message, this time included; deliveries
        /// that were deferred do not count.
        failures: u32,
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
        /// The holder's remaining lock time for `Contended`, otherwise the store backoff
        /// ([`Idempotent::store_backoff`](crate::Idempotent::store_backoff)) for this delivery.
        delay: Duration,
    },
    /// No delivery of this message can succeed: it is terminated (`AckKind::Term`, with
    /// [`term_reason`](Self::term_reason) on servers that take one), which ends its
    /// redeliveries and raises JetStream's `MSG_TERMINATED` advisory (see the crate docs for
    /// what that takes to be a dead-letter path).
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
    /// The message's unit is in doubt and its task holds such units ([`Error::InDoubt`],
    /// [`InDoubt::Hold`](idempotask::InDoubt::Hold)): an earlier delivery's lock ran out
    /// without a release or a result, and nothing ran for this one. Unlike a refused key, the
    /// message is sound: once an operator has resolved the unit (recorded a result or freed
    /// it), re-drive it from the stream, and it replays or runs.
    #[error(transparent)]
    InDoubt(Error),
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

    /// Why the message is terminated, for the `+TERM` that [`ack_kind`](Self::ack_kind) calls
    /// for; `None` for every other acknowledgement. A [`Terminated`](Self::Terminated)
    /// message's reason is its [`Rejection`]'s text (which shows the key as the task's
    /// [`KeyLogging`](idempotask::KeyLogging) says); a message that [gave up](Self::GaveUp)
    /// says how many failures ended it.
    ///
    /// [`Idempotent::handle`](crate::Idempotent::handle) sends it as `+TERM <reason>` to a
    /// server of version 2.10.4 or later, which puts it in the `reason` of the
    /// `MSG_TERMINATED` advisory, and a bare `+TERM` to an older one, which would take a
    /// `+TERM` followed by anything for no acknowledgement at all and deliver the message
    /// again after `AckWait`.
    pub fn term_reason(&self) -> Option<String> {
        match self {
            Self::Terminated(rejection) => Some(rejection.to_string()),
            Self::GaveUp { failures, .. } => Some(format!(
                "the body failed {failures} times, which is max_failures"
            )),
            _ => None,
        }
    }
}

/// The oldest server version that reads a reason after `+TERM` (nats-server 2.10.4).
const TERM_REASON_SINCE: (u64, u64, u64) = (2, 10, 4);

/// Input: a server's version as it announces it (`2.10.4`, `2.11.0-RC.1`). Output: whether it
/// reads a reason after `+TERM`; an unreadable version is taken for one that does not.
pub(crate) fn takes_term_reason(version: &str) -> bool {
    let release = version.split(['-', '+']).next().unwrap_or_default();
    let mut parts = release.split('.').map(str::parse::<u64>);
    match (parts.next(), parts.next(), parts.next()) {
        (Some(Ok(major)), Some(Ok(minor)), Some(Ok(patch))) => {
            (major, minor, patch) >= TERM_REASON_SINCE
        }
        _ => false,
    }
}

impl<T, E> Handled<T, E> {
    /// Input: what the consumer core made of a message's call. Output: the same in
    /// JetStream's verbs: an ack, a delayed nak, or a `+TERM`.
    pub(crate) fn from_verdict(verdict: Verdict<T, E>) -> Self {
        match verdict {
            Verdict::Ack(report) => Self::Acked(report),
            Verdict::Retry { failure, delay, .. } => Self::Failed {
                error: failure,
                delay,
            },
            Verdict::GiveUp {
                failure, failures, ..
            } => Self::GaveUp {
                error: failure,
                failures,
            },
            Verdict::Defer { error, delay, .. } => Self::Deferred { error, delay },
            Verdict::Refuse(err) => Self::Terminated(Rejection::Refused(err)),
            Verdict::Hold(err) => Self::Terminated(Rejection::InDoubt(err)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_servers_from_2_10_4_on_take_a_term_reason() {
        for version in ["2.10.4", "2.10.29", "2.11.0-RC.1", "2.12.1", "3.0.0"] {
            assert!(takes_term_reason(version), "{version}");
        }
        for version in ["2.9.10", "2.10.3", "2.2", "", "v2.11.0"] {
            assert!(!takes_term_reason(version), "{version}");
        }
    }
}
