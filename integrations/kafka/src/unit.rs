//! One record's unit: its call, retried in this consumer until it is done or given up, and the
//! dead-letter copy of a record given up.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use idempotask_consumer::{History, Verdict, retry_delay};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;

use crate::{BadRecord, Handled, Idempotent, Processed, Record, Rejection};

/// The header of a dead-letter copy that names the record it copies: `topic/partition@offset`.
pub const SOURCE_HEADER: &str = "idempotask-source";
/// The header of a dead-letter copy that says why ([`Rejection::reason`]).
pub const REASON_HEADER: &str = "idempotask-reason";
/// The header of a dead-letter copy with the error's text.
pub const ERROR_HEADER: &str = "idempotask-error";

/// A body's future, boxed once so that the unit holds it by pointer.
pub(crate) type BodyFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;
/// The caller's body, behind one pointer for every unit.
pub(crate) type Body<T, E> =
    dyn Fn(&Record) -> Result<BodyFuture<T, E>, BadRecord> + Send + Sync + 'static;

/// The counts of one record's earlier tries, kept in this consumer.
#[derive(Default)]
struct Tries {
    failures: u32,
    deferrals: u32,
}

impl History for Tries {
    async fn failures(&self) -> u32 {
        self.failures
    }

    async fn deferrals(&self) -> u32 {
        self.deferrals
    }
}

/// Input: a record, the consumer's settings and body. Output: what became of it, once it is
/// done or its dead-letter copy is acknowledged (never before: its offset is committed then);
/// each try after which it runs again is sent to `tries_ended` on the way.
pub(crate) async fn run_unit<T, E>(
    idempotent: &Idempotent,
    producer: &FutureProducer,
    body: &Body<T, E>,
    record: Record,
    tries_ended: &mpsc::UnboundedSender<Processed<T, E>>,
) -> Processed<T, E>
where
    T: Serialize + DeserializeOwned,
    E: std::fmt::Display,
{
    let mut tries = Tries::default();
    let key = match record.unreadable() {
        Some(bad) => Err(Rejection::BadRecord(bad)),
        None => idempotent.key.key(&record).map_err(Rejection::MissingKey),
    };
    let outcome = match key {
        Err(rejection) => Err(rejection),
        Ok(key) => loop {
            let future = match body(&record) {
                Ok(future) => future,
                Err(bad) => break Err(Rejection::BadRecord(bad)),
            };
            let verdict = idempotent
                .settings
                .run(key.clone(), record.payload(), &tries, future)
                .await;
            match verdict {
                Verdict::Ack(report) => break Ok(report),
                Verdict::Retry {
                    failure,
                    failures,
                    delay,
                    ..
                } => {
                    tries.failures = failures;
                    let handled = Handled::Failed {
                        error: failure,
                        failures,
                        delay,
                    };
                    let _ = tries_ended.send(processed(&record, &tries, handled));
                    tokio::time::sleep(delay).await;
                }
                Verdict::Defer {
                    error,
                    delay,
                    deferral,
                    ..
                } => {
                    tries.deferrals = deferral.unwrap_or(tries.deferrals.saturating_add(1));
                    let handled = Handled::Deferred { error, delay };
                    let _ = tries_ended.send(processed(&record, &tries, handled));
                    tokio::time::sleep(delay).await;
                }
                Verdict::GiveUp {
                    failure, failures, ..
                } => {
                    tries.failures = failures;
                    break Err(Rejection::GaveUp { failure, failures });
                }
                Verdict::Refuse(err) => break Err(Rejection::Refused(err)),
                Verdict::Hold(err) => break Err(Rejection::InDoubt(err)),
            }
        },
    };
    let handled = match outcome {
        Ok(report) => Handled::Done(report),
        Err(rejection) => {
            let (reason, error) = (rejection.reason(), rejection.to_string());
            dead_letter(idempotent, producer, &record, reason, &error).await;
            Handled::DeadLettered(rejection)
        }
    };
    processed(&record, &tries, handled)
}

/// What became of a try of `record`.
fn processed<T, E>(record: &Record, tries: &Tries, handled: Handled<T, E>) -> Processed<T, E> {
    Processed {
        topic: record.topic().to_owned(),
        partition: record.partition(),
        offset: record.offset(),
        failures: tries.failures,
        deferrals: tries.deferrals,
        handled,
    }
}

/// Input: a record no delivery can succeed with. Output: its copy on the dead-letter topic,
/// acknowledged by the broker; sent again after the store backoff until it is.
async fn dead_letter(
    idempotent: &Idempotent,
    producer: &FutureProducer,
    record: &Record,
    reason: &str,
    error: &str,
) {
    let topic = idempotent.dead_letter_topic_for(record.topic());
    let source = format!(
        "{}/{}@{}",
        record.topic(),
        record.partition(),
        record.offset()
    );
    let mut headers = OwnedHeaders::new_with_capacity(record.headers().count() + 3);
    for (key, value) in record.headers() {
        headers = headers.insert(Header { key, value });
    }
    headers = headers
        .insert(Header {
            key: SOURCE_HEADER,
            value: Some(&source),
        })
        .insert(Header {
            key: REASON_HEADER,
            value: Some(reason),
        })
        .insert(Header {
            key: ERROR_HEADER,
            value: Some(error),
        });
    let mut attempt = 0_u32;
    loop {
        let mut copy = FutureRecord::to(&topic)
            .payload(record.payload())
            .headers(headers.clone());
        if let Some(key) = record.key() {
            copy = copy.key(key);
        }
        match producer.send(copy, idempotent.dead_letter_timeout).await {
            Ok(_) => return,
            Err((err, _)) => {
                attempt = attempt.saturating_add(1);
                let delay: Duration = retry_delay(&idempotent.store_backoff, attempt);
                tracing::warn!(
                    error = %err,
                    topic,
                    source,
                    attempt,
                    "the dead-letter copy was not acknowledged; sending it again in {delay:?}"
                );
                tokio::time::sleep(delay).await;
            }
        }
    }
}
