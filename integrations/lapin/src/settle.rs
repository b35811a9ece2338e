//! What a delivery's outcome becomes for RabbitMQ: ack, a delayed redelivery, or the dead-letter
//! exchange.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use idempotask::{Error, Panicked, Report};
use idempotask_consumer::{BodyFailure, History};
use lapin::BasicProperties;
use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicNackOptions, BasicRejectOptions};
use lapin::types::AMQPValue;

use crate::key::MissingKey;
use crate::topology::{PublishError, RetryQueue, long_string};

/// The header counting a message's failed runs (body errors).
pub const FAILURES_HEADER: &str = "x-idempotask-failures";
/// The header counting a message's redeliveries for store errors.
pub const STORE_ERRORS_HEADER: &str = "x-idempotask-store-errors";
/// The header that says why idempotask sent a message to the dead-letter exchange itself:
/// [`IN_DOUBT`] for a unit held in doubt.
pub const REASON_HEADER: &str = "x-idempotask-reason";
/// The [`REASON_HEADER`] of a message whose unit is held in doubt
/// ([`Error::InDoubt`]): nothing ran, and the unit waits for an operator.
pub const IN_DOUBT: &str = "in-doubt";
/// The header holding the text of the error that sent a message to the dead-letter exchange,
/// next to [`REASON_HEADER`]; it shows the key as the task's
/// [`KeyLogging`](idempotask::KeyLogging) says.
pub const ERROR_HEADER: &str = "x-idempotask-error";

/// What became of one delivery; see the [crate docs](crate) for the whole table.
#[derive(Debug)]
#[non_exhaustive]
pub enum Settled<T, E> {
    /// The body ran and its result was stored, or a stored result was replayed: the delivery
    /// was acked. The report says which ([`Outcome`](idempotask::Outcome)).
    Acked(Report<T>),
    /// The delivery went to the retry queue, to come back after `delay`, and was then acked.
    #[non_exhaustive]
    Retrying {
        /// Why it did not finish now.
        cause: Cause<E>,
        /// How long it waits in the retry queue (at least).
        delay: Duration,
    },
    /// The delivery was rejected without requeue: it went to the work queue's dead-letter
    /// exchange and will not come back on its own. A delivery whose unit is held in doubt
    /// went there as a copy with its reason in the headers ([`REASON_HEADER`]), and was acked.
    DeadLettered(Cause<E>),
}

/// What a run of a delivery calls for, not yet done: see [`Idempotent::run`](crate::Idempotent::run).
#[derive(Debug)]
#[must_use = "the delivery stays unacked until the decision is settled"]
pub struct Decision<T, E> {
    pub(crate) delivery: Delivery,
    pub(crate) key: Option<String>,
    pub(crate) action: Action,
    pub(crate) settled: Settled<T, E>,
    pub(crate) retries: Arc<RetryQueue>,
    pub(crate) unpublished: Arc<Unpublished>,
}

impl<T, E> Decision<T, E> {
    /// What the delivery will become once settled.
    pub fn settled(&self) -> &Settled<T, E> {
        &self.settled
    }

    /// The delivery that was run, which [`settle`](Self::settle) settles.
    pub fn delivery(&self) -> &Delivery {
        &self.delivery
    }

    /// Settles the delivery that was run on the broker: acks it, publishes its delayed
    /// redelivery (confirmed by the broker) and then acks it, or rejects it without requeue
    /// (for a unit held in doubt: publishes a copy with the reason to the dead-letter exchange,
    /// confirmed, and then acks it).
    ///
    /// When the delayed redelivery cannot be published, the delivery is held unacked for the
    /// delay it would have waited in the retry queue, then nacked with requeue, and the count
    /// the copy would have carried is kept in this process for the delivery's key: a message
    /// whose body keeps failing still reaches the dead-letter exchange after
    /// [`max_failures`](crate::Idempotent::max_failures) runs, each at least the backoff apart,
    /// instead of coming straight back in a loop.
    ///
    /// # Errors
    /// [`SettleError`] when the broker could not be told; the delivery then comes back. It
    /// holds what would have been answered ([`SettleError::into_settled`]).
    pub async fn settle(self) -> Result<Settled<T, E>, SettleError<T, E>> {
        let Self {
            delivery,
            key,
            action,
            settled,
            retries,
            unpublished,
        } = self;
        match settle(&delivery, key, &retries, &unpublished, action).await {
            Ok(()) => Ok(settled),
            Err(failure) => Err(SettleError { settled, failure }),
        }
    }
}

/// Why a delivery was not acked as done.
#[derive(Debug)]
#[non_exhaustive]
pub enum Cause<E> {
    /// The body's own error; nothing was stored.
    Body(E),
    /// The body panicked; idempotask released its lock and stored nothing, as after an error,
    /// and the panic counts as one of the message's failures.
    Panicked(Panicked),
    /// An error of idempotask's: the key is busy, the store failed, the key cannot be used.
    Idempotask(Error),
    /// The delivery carries no key.
    MissingKey(MissingKey),
}

impl<E> Cause<E> {
    /// The cause of a body's failure: its error or its panic.
    pub(crate) fn of(failure: BodyFailure<E>) -> Self {
        match failure.into_error() {
            Ok(err) => Self::Body(err),
            Err(panic) => Self::Panicked(panic),
        }
    }
}

impl<E: std::fmt::Display> std::fmt::Display for Cause<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Body(err) => err.fmt(f),
            Self::Panicked(panic) => panic.fmt(f),
            Self::Idempotask(err) => err.fmt(f),
            Self::MissingKey(err) => err.fmt(f),
        }
    }
}

/// The broker could not be told what became of a delivery: [`Decision::settle`] and
/// [`Idempotent::process`](crate::Idempotent::process) answer it with that outcome, which the
/// failure does not undo (a stored result stays stored, and the delivery comes back to be
/// replayed).
///
/// ```
/// use idempotask_lapin::{SettleError, Settled};
///
/// // A consumer loop's error arm: log why, and keep the value the body produced.
/// fn charge_of(err: SettleError<String, std::io::Error>) -> Option<String> {
///     eprintln!("not settled: {err}");
///     match err.into_settled() {
///         Settled::Acked(report) => Some(report.value),
///         _ => None,
///     }
/// }
/// # let _ = charge_of;
/// ```
pub struct SettleError<T, E> {
    settled: Settled<T, E>,
    failure: SettleFailure,
}

impl<T, E> SettleError<T, E> {
    /// What the broker failed at.
    pub fn failure(&self) -> &SettleFailure {
        &self.failure
    }

    /// What the delivery's outcome was, which the broker was not told.
    pub fn settled(&self) -> &Settled<T, E> {
        &self.settled
    }

    /// What the delivery's outcome was: the body's value or error, which the failed settle
    /// does not undo.
    pub fn into_settled(self) -> Settled<T, E> {
        self.settled
    }
}

impl<T, E> std::fmt::Display for SettleError<T, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.failure.fmt(f)
    }
}

// By hand, so that a value or error without `Debug` still leaves the error printable.
impl<T, E> std::fmt::Debug for SettleError<T, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let settled = match &self.settled {
            Settled::Acked(_) => "Acked",
            Settled::Retrying { .. } => "Retrying",
            Settled::DeadLettered(_) => "DeadLettered",
        };
        f.debug_struct("SettleError")
            .field("settled", &settled)
            .field("failure", &self.failure)
            .finish()
    }
}

impl<T, E> std::error::Error for SettleError<T, E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        std::error::Error::source(&self.failure)
    }
}

/// What the broker failed at while a delivery was being settled.
///
/// When the redelivery could not be published, the original delivery was nacked with requeue
/// (or, when its channel is gone, the broker requeues it itself): it comes back, possibly at
/// once, and nothing is lost.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SettleFailure {
    /// `basic.ack`, `basic.reject` or `basic.nack` failed; the broker redelivers an unsettled
    /// delivery when its channel closes.
    #[error("{action} of the delivery failed: {source}")]
    #[non_exhaustive]
    Broker {
        /// `"ack"`, `"reject"` or `"nack"`.
        action: &'static str,
        /// The channel's error.
        source: lapin::Error,
    },
    /// lapin did not send the ack, reject or nack: the delivery was settled already (by the body,
    /// through the `&Delivery` it was given), or its channel failed ("poisoned"), in which case
    /// the broker puts it back in the queue itself.
    #[error(
        "the delivery was not settled: it was settled already, or its channel failed (the broker then requeues it)"
    )]
    NotSent,
    /// The delayed redelivery could not be published; the original was held for the delay and
    /// then nacked with requeue (see [`Decision::settle`]).
    #[error("the delivery could not be sent to the retry queue: {0}")]
    Retry(#[from] PublishError),
}

/// What a delivery's headers, and the counts of its copies that could not be published, say
/// of its earlier deliveries: the history the consumer core counts by.
pub(crate) struct Seen<'a> {
    pub(crate) delivery: &'a Delivery,
    pub(crate) key: &'a str,
    pub(crate) unpublished: &'a Unpublished,
}

impl Seen<'_> {
    /// The count in `header` this message has reached: what its headers say, or what a retry
    /// copy that could not be published would have said.
    pub(crate) fn count(&self, header: &'static str) -> u32 {
        count(&self.delivery.properties, header).max(self.unpublished.get(self.key, header))
    }
}

impl History for Seen<'_> {
    async fn failures(&self) -> u32 {
        self.count(FAILURES_HEADER)
    }

    async fn deferrals(&self) -> u32 {
        self.count(STORE_ERRORS_HEADER)
    }
}

/// The counts that retry copies would have carried, by key, for copies that could not be
/// published: the original comes back with its old headers, so without these a message whose
/// copy never gets published would never reach `max_failures`.
#[derive(Debug, Default)]
pub(crate) struct Unpublished(Mutex<HashMap<(String, &'static str), u32>>);

/// Keys beyond this many are not tallied; their deliveries are still held for the delay, so a
/// flood of failing keys slows down rather than grows the map.
const MAX_UNPUBLISHED: usize = 10_000;

impl Unpublished {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<(String, &'static str), u32>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The count in `header` kept for `key`, 0 when none is.
    pub(crate) fn get(&self, key: &str, header: &'static str) -> u32 {
        self.map()
            .get(&(key.to_owned(), header))
            .copied()
            .unwrap_or(0)
    }

    fn set(&self, key: String, header: &'static str, count: u32) {
        let mut map = self.map();
        if map.len() < MAX_UNPUBLISHED || map.contains_key(&(key.clone(), header)) {
            map.insert((key, header), count);
        }
    }

    fn clear(&self, key: &str) {
        let mut map = self.map();
        if !map.is_empty() {
            map.retain(|(kept, _), _| kept != key);
        }
    }
}

/// How `settle` should end a delivery.
#[derive(Debug)]
pub(crate) enum Action {
    Ack,
    Retry {
        delay: Duration,
        header: &'static str,
        count: u32,
    },
    DeadLetter,
    /// To the dead-letter exchange with `reason` and `error` in the headers, which a rejection
    /// cannot carry: a copy, confirmed, then the original acked.
    DeadLetterWithReason {
        reason: &'static str,
        error: String,
    },
}

/// Input: a delivery and the action its outcome calls for. Output: the delivery settled on the
/// broker (a delayed redelivery is confirmed by the broker before the original is acked).
async fn settle(
    delivery: &Delivery,
    key: Option<String>,
    retries: &RetryQueue,
    unpublished: &Unpublished,
    action: Action,
) -> Result<(), SettleFailure> {
    let forget = |key: Option<String>| {
        if let Some(key) = key {
            unpublished.clear(&key);
        }
    };
    match action {
        Action::Ack => {
            forget(key);
            sent("ack", delivery.ack(BasicAckOptions::default()).await)
        }
        Action::DeadLetter => {
            forget(key);
            reject(delivery).await
        }
        Action::DeadLetterWithReason { reason, error } => {
            forget(key);
            let properties = with_header(
                &with_header(&delivery.properties, REASON_HEADER, long_string(reason)),
                ERROR_HEADER,
                long_string(&error),
            );
            let routing_key = delivery.routing_key.as_str();
            match retries
                .dead_letter(&delivery.data, properties, routing_key)
                .await
            {
                Some(Ok(())) => sent("ack", delivery.ack(BasicAckOptions::default()).await),
                // No exchange named: dead-lettered by the broker, without the reason.
                None => reject(delivery).await,
                Some(Err(err)) => {
                    // The copy is not on the broker, so the original goes there the plain way
                    // rather than being acked away.
                    tracing::warn!(
                        error = ?err,
                        reason,
                        "the copy for the dead-letter exchange, with its reason, was not confirmed; rejecting the delivery to it without the reason"
                    );
                    reject(delivery).await
                }
            }
        }
        Action::Retry {
            delay,
            header,
            count,
        } => {
            let properties = with_count(&delivery.properties, header, count);
            if let Err(err) = retries.publish(&delivery.data, properties, delay).await {
                // Not published: the original stays the only copy, so it goes back as it is,
                // but only after the delay, since a requeued delivery comes back at once.
                if let Some(key) = key {
                    unpublished.set(key, header, count);
                }
                tracing::warn!(
                    error = %err,
                    delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                    "the delayed redelivery could not be published; holding the delivery for the delay before requeueing it"
                );
                tokio::time::sleep(delay).await;
                let _ = delivery
                    .nack(BasicNackOptions {
                        requeue: true,
                        multiple: false,
                    })
                    .await;
                return Err(err.into());
            }
            forget(key);
            // Between the confirm and this ack, a crash leaves two copies (the redelivery and
            // the unacked original, which the broker requeues): at-least-once, which the key's
            // lock and stored result absorb.
            sent("ack", delivery.ack(BasicAckOptions::default()).await)
        }
    }
}

/// Rejects `delivery` without requeue: to the work queue's dead-letter exchange.
async fn reject(delivery: &Delivery) -> Result<(), SettleFailure> {
    sent(
        "reject",
        delivery.reject(BasicRejectOptions { requeue: false }).await,
    )
}

/// Input: what lapin answered an ack, reject or nack with. Output: whether it was sent.
fn sent(action: &'static str, result: Result<bool, lapin::Error>) -> Result<(), SettleFailure> {
    match result {
        Ok(true) => Ok(()),
        Ok(false) => Err(SettleFailure::NotSent),
        Err(source) => Err(SettleFailure::Broker { action, source }),
    }
}

/// The number in `header` of a delivery; 0 when absent or not a non-negative integer.
pub(crate) fn count(properties: &BasicProperties, header: &str) -> u32 {
    let Some(value) = properties
        .headers()
        .as_ref()
        .and_then(|headers| headers.inner().get(header))
    else {
        return 0;
    };
    let number = match value {
        AMQPValue::ShortShortUInt(n) => Some(u64::from(*n)),
        AMQPValue::ShortUInt(n) => Some(u64::from(*n)),
        AMQPValue::LongUInt(n) => Some(u64::from(*n)),
        AMQPValue::ShortShortInt(n) => u64::try_from(*n).ok(),
        AMQPValue::ShortInt(n) => u64::try_from(*n).ok(),
        AMQPValue::LongInt(n) => u64::try_from(*n).ok(),
        AMQPValue::LongLongInt(n) => u64::try_from(*n).ok(),
        _ => None,
    };
    number.map_or(0, |n| u32::try_from(n).unwrap_or(u32::MAX))
}

/// `properties` with `header` set to `count`, the other headers kept.
fn with_count(properties: &BasicProperties, header: &str, count: u32) -> BasicProperties {
    with_header(properties, header, AMQPValue::LongLongInt(i64::from(count)))
}

/// `properties` with `header` set to `value`, the other headers kept.
fn with_header(properties: &BasicProperties, header: &str, value: AMQPValue) -> BasicProperties {
    let mut headers = properties.headers().clone().unwrap_or_default();
    headers.insert(header.into(), value);
    properties.clone().with_headers(headers)
}

#[cfg(test)]
mod tests {
    use super::*;
    use idempotask::Backoff;
    use idempotask_consumer::{MIN_DELAY, retry_delay};
    use lapin::types::FieldTable;

    #[test]
    fn retry_delays_double_up_to_their_bound_and_never_below_the_floor() {
        let backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        let delays: Vec<u128> = (1..=6)
            .map(|n| retry_delay(&backoff, n).as_millis())
            .collect();
        assert_eq!(delays, [100, 200, 400, 800, 1000, 1000]);
        assert_eq!(retry_delay(&backoff, u32::MAX), Duration::from_secs(1));
        assert_eq!(
            retry_delay(&Backoff::constant(Duration::ZERO), 3),
            MIN_DELAY
        );
    }

    #[test]
    fn a_count_survives_the_round_trip_and_garbage_reads_as_zero() {
        let properties = with_count(&BasicProperties::default(), FAILURES_HEADER, 3);
        assert_eq!(count(&properties, FAILURES_HEADER), 3);
        assert_eq!(count(&properties, STORE_ERRORS_HEADER), 0);
        let mut headers = FieldTable::default();
        headers.insert(FAILURES_HEADER.into(), AMQPValue::LongLongInt(-4));
        headers.insert(STORE_ERRORS_HEADER.into(), AMQPValue::Boolean(true));
        let garbage = BasicProperties::default().with_headers(headers);
        assert_eq!(count(&garbage, FAILURES_HEADER), 0);
        assert_eq!(count(&garbage, STORE_ERRORS_HEADER), 0);
    }
}
