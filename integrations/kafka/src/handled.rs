//! What became of one record: done, or sent to the dead-letter topic, and why.

use std::time::Duration;

use idempotask::{Error, Report};
use idempotask_consumer::BodyFailure;

use crate::{BadRecord, MissingKey};

/// One record and what became of one of its tries
/// ([`KafkaConsumer::next`](crate::KafkaConsumer::next) answers one per try that ended): done
/// or dead-lettered ([`Handled::is_final`]: its offset may then be committed), or to run again.
///
/// ```
/// use idempotask_kafka::{Handled, Processed};
///
/// fn log(processed: &Processed<String, std::io::Error>) {
///     let at = format!("{}/{}@{}", processed.topic, processed.partition, processed.offset);
///     match &processed.handled {
///         Handled::Done(report) => println!("{at}: {} after {} failures", report.value, processed.failures),
///         Handled::Failed { error, delay, .. } => println!("{at}: failed ({error}), again in {delay:?}"),
///         Handled::Deferred { error, delay, .. } => println!("{at}: {error}, again in {delay:?}"),
///         Handled::DeadLettered(why) => println!("{at}: dead-lettered ({}): {why}", why.reason()),
///     }
/// }
/// # let _ = log;
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub struct Processed<T, E> {
    /// The record's topic.
    pub topic: String,
    /// Its partition.
    pub partition: i32,
    /// Its offset.
    pub offset: i64,
    /// How many times its body failed (an `Err` or a panic) so far, this try included.
    pub failures: u32,
    /// How many times it waited for the store (a store error, no store, a misused task) or for
    /// a busy key so far, this try included.
    pub deferrals: u32,
    /// What became of it.
    pub handled: Handled<T, E>,
}

/// What became of one record. See the table in the [crate docs](crate).
#[derive(Debug)]
pub enum Handled<T, E> {
    /// The body ran and its result was stored, or the stored result of an earlier execution
    /// was handed back (the body did not run), or the body ran and lost its lock or marker
    /// (the side effect happened).
    Done(Report<T>),
    /// The body failed (an `Err` or a panic) below
    /// [`max_failures`](crate::Idempotent::max_failures): its lock was released, nothing was
    /// stored, and the record runs again in this consumer after `delay`. Its partition's
    /// commit waits for it.
    #[non_exhaustive]
    Failed {
        /// The body's error, or its panic.
        error: BodyFailure<E>,
        /// How many times the body failed for this record, this one included.
        failures: u32,
        /// When it runs again: the failure backoff for `failures`.
        delay: Duration,
    },
    /// idempotask could not decide yet: another delivery holds the key, the store failed or
    /// none is installed, or the task is misused. Nothing ran; the record runs again in this
    /// consumer after `delay`, and its partition's commit waits for it.
    #[non_exhaustive]
    Deferred {
        /// Why nothing ran.
        error: Error,
        /// The holder's remaining lock time for a busy key, otherwise the store backoff.
        delay: Duration,
    },
    /// No delivery of the record can succeed: it was copied to the dead-letter topic with the
    /// reason, and the broker acknowledged the copy before the offset moved past it.
    DeadLettered(Rejection<E>),
}

impl<T, E> Handled<T, E> {
    /// Whether the record ended with this try (done or dead-lettered), so that its offset may
    /// be committed; `false` for a try after which it runs again.
    ///
    /// ```
    /// use std::time::Duration;
    /// use idempotask_kafka::Handled;
    /// # fn check(handled: Handled<(), std::io::Error>) {
    /// if !handled.is_final() {
    ///     println!("runs again");
    /// }
    /// # }
    /// ```
    pub fn is_final(&self) -> bool {
        matches!(self, Self::Done(_) | Self::DeadLettered(_))
    }
}

/// Why a record went to the dead-letter topic; [`reason`](Self::reason) is the short name
/// written to the copy's [`REASON_HEADER`](crate::REASON_HEADER).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Rejection<E> {
    /// The record carries no key. Nothing ran.
    #[error(transparent)]
    MissingKey(MissingKey),
    /// The body's closure refused the record (a payload that does not decode). Nothing ran.
    #[error(transparent)]
    BadRecord(BadRecord),
    /// The body failed for the `failures`-th time, which is
    /// [`max_failures`](crate::Idempotent::max_failures). Nothing was stored.
    #[error("the body failed {failures} times, which is max_failures: {failure}")]
    GaveUp {
        /// The body's last error, or its panic.
        failure: BodyFailure<E>,
        /// How many times the body failed for this record.
        failures: u32,
    },
    /// idempotask refused the key or its stored result: [`Error::InvalidKey`],
    /// [`Error::KeyReuse`], [`Error::Codec`], [`Error::MarkerKeyMismatch`].
    #[error(transparent)]
    Refused(Error),
    /// The record's unit is in doubt and its task holds such units ([`Error::InDoubt`]). The
    /// record is sound: once an operator has resolved the unit (`idempotask resolve`), produce
    /// the dead-letter copy back to the topic, and it replays or runs.
    #[error(transparent)]
    InDoubt(Error),
}

impl<E> Rejection<E> {
    /// The short name of the reason: `missing-key`, `bad-record`, `gave-up`, `refused` or
    /// `in-doubt`.
    ///
    /// ```
    /// use idempotask_kafka::{BadRecord, Record, Rejection};
    /// let why: Rejection<std::io::Error> = Rejection::BadRecord(BadRecord::new(&Record::new("t", 0, 0), "empty"));
    /// assert_eq!(why.reason(), "bad-record");
    /// ```
    pub fn reason(&self) -> &'static str {
        match self {
            Self::MissingKey(_) => "missing-key",
            Self::BadRecord(_) => "bad-record",
            Self::GaveUp { .. } => "gave-up",
            Self::Refused(_) => "refused",
            Self::InDoubt(_) => "in-doubt",
        }
    }
}
