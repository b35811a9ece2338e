//! What became of one entry: acked, left pending for a later try, or dead-lettered, and why.

use std::time::Duration;

use idempotask::{Error, Report};
use idempotask_consumer::BodyFailure;

use crate::{BadEntry, MissingKey};

/// One entry of a batch and what became of it
/// ([`StreamConsumer::next_batch`](crate::StreamConsumer::next_batch) answers one per entry).
///
/// ```
/// use idempotask_redis_streams::{Handled, Processed};
///
/// fn log(processed: &Processed<String, std::io::Error>) {
///     match &processed.handled {
///         Handled::Acked(report) => println!("{}: {}", processed.id, report.value),
///         Handled::Failed { error, delay, .. } => println!("{}: failed ({error}), again in {delay:?}", processed.id),
///         Handled::Deferred { error, delay, .. } => println!("{}: {error}, again in {delay:?}", processed.id),
///         Handled::DeadLettered(why) => println!("{}: dead-lettered: {why}", processed.id),
///     }
/// }
/// # let _ = log;
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub struct Processed<T, E> {
    /// The entry's id in the stream.
    pub id: String,
    /// Which delivery of the entry this was: 1 when it was read for the first time, one more
    /// for each claim from a consumer that stopped answering (local retries do not count).
    pub deliveries: u32,
    /// What became of it.
    pub handled: Handled<T, E>,
}

/// What became of one entry, and what the consumer group was told. See the table in the
/// [crate docs](crate).
///
/// ```
/// use idempotask_redis_streams::Handled;
///
/// // Whether the group still holds the entry pending, for a later try.
/// fn pending<T, E>(handled: &Handled<T, E>) -> bool {
///     matches!(handled, Handled::Failed { .. } | Handled::Deferred { .. })
/// }
/// # let _ = pending::<(), ()>;
/// ```
#[derive(Debug)]
pub enum Handled<T, E> {
    /// The body ran and its result was stored, or the stored result of an earlier execution
    /// was handed back (the body did not run), or the body ran and lost its lock or marker
    /// (the side effect happened): `XACK`ed.
    Acked(Report<T>),
    /// The body failed (an `Err` or a panic) below
    /// [`max_failures`](crate::Idempotent::max_failures): its lock was released, nothing was
    /// stored, the failure count was recorded, and the entry is left pending; this consumer
    /// runs it again after `delay`.
    #[non_exhaustive]
    Failed {
        /// The body's error, or its panic.
        error: BodyFailure<E>,
        /// How many times the body failed for this entry, this one included.
        failures: u32,
        /// When it runs again: the failure backoff for `failures`.
        delay: Duration,
    },
    /// idempotask could not decide yet: another delivery holds the key, the store failed or
    /// none is installed, or the task is misused. Nothing ran; the entry is left pending and
    /// runs again after `delay`. Never acked.
    #[non_exhaustive]
    Deferred {
        /// Why nothing ran.
        error: Error,
        /// The holder's remaining lock time for a busy key, otherwise the store backoff.
        delay: Duration,
    },
    /// No delivery of the entry can succeed, or it has been delivered too often: copied to the
    /// dead-letter stream with the reason, and `XACK`ed in the same transaction.
    DeadLettered(Rejection<E>),
}

/// Why an entry was dead-lettered; [`reason`](Self::reason) is the short name written to the
/// dead-letter entry's [`REASON_FIELD`](crate::REASON_FIELD).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Rejection<E> {
    /// The entry carries no key. Nothing ran.
    #[error(transparent)]
    MissingKey(MissingKey),
    /// The body's closure refused the entry (a field missing, a payload that does not
    /// decode). Nothing ran.
    #[error(transparent)]
    BadEntry(BadEntry),
    /// The body failed for the `failures`-th time, which is
    /// [`max_failures`](crate::Idempotent::max_failures). Nothing was stored.
    #[error("the body failed {failures} times, which is max_failures: {failure}")]
    GaveUp {
        /// The body's last error, or its panic.
        failure: BodyFailure<E>,
        /// How many times the body failed for this entry.
        failures: u32,
    },
    /// The entry was delivered more than
    /// [`max_deliveries`](crate::Idempotent::max_deliveries) times: the consumers it was given
    /// to stopped answering before they settled it (a crash that no panic handler sees, an
    /// out-of-memory kill). Nothing ran for this delivery.
    #[error(
        "the entry was delivered {deliveries} times, more than max_deliveries, without being settled"
    )]
    TooManyDeliveries {
        /// This delivery's count.
        deliveries: u32,
    },
    /// idempotask refused the key or its stored result: [`Error::InvalidKey`],
    /// [`Error::KeyReuse`], [`Error::Codec`], [`Error::MarkerKeyMismatch`].
    #[error(transparent)]
    Refused(Error),
    /// The entry's unit is in doubt and its task holds such units ([`Error::InDoubt`]). The
    /// entry is sound: once an operator has resolved the unit, add it back to the stream
    /// (`XADD` of the dead-letter entry's fields), and it replays or runs.
    #[error(transparent)]
    InDoubt(Error),
}

impl<E> Rejection<E> {
    /// The short name of the reason: `missing-key`, `bad-entry`, `gave-up`,
    /// `max-deliveries`, `refused` or `in-doubt`.
    ///
    /// ```
    /// use idempotask_redis_streams::Rejection;
    /// let why: Rejection<std::io::Error> = Rejection::TooManyDeliveries { deliveries: 6 };
    /// assert_eq!(why.reason(), "max-deliveries");
    /// ```
    pub fn reason(&self) -> &'static str {
        match self {
            Self::MissingKey(_) => "missing-key",
            Self::BadEntry(_) => "bad-entry",
            Self::GaveUp { .. } => "gave-up",
            Self::TooManyDeliveries { .. } => "max-deliveries",
            Self::Refused(_) => "refused",
            Self::InDoubt(_) => "in-doubt",
        }
    }
}
