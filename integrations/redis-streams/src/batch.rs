//! [`Batch`]: the entries of one read, run, and what each calls for from the group, before it
//! is written.

use std::time::Duration;

use idempotask_consumer::Verdict;
use tokio::time::Instant;

use crate::ops::Settlement;
use crate::{Entry, Handled, Processed, Rejection};

/// The entries of one read once they have run, not yet settled: what became of each
/// ([`processed`](Self::processed)), and the acks, dead letters and failure counts that
/// [`StreamConsumer::settle`](crate::StreamConsumer::settle) writes in one transaction.
///
/// Until it is settled, every entry of the batch stays pending: a consumer that dies (or drops
/// the batch) leaves them to be claimed after [`claim_idle`](crate::Idempotent::claim_idle),
/// and a result that was stored is then replayed, never run again.
///
/// ```no_run
/// use idempotask::Task;
/// use idempotask_redis_streams::{EntryId, Handled, Idempotent};
///
/// # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let mut consumer = Idempotent::new(Task::new("order_charge"), EntryId)
///     .consume("redis://127.0.0.1:6379", "orders", "chargers", "worker-1")
///     .await?;
/// let batch = consumer.run_batch(|_entry| Ok(async { Ok::<_, std::io::Error>(()) })).await?;
/// for processed in batch.processed() {
///     if let Handled::Acked(_) = processed.handled {
///         println!("{} done; recorded before its ack", processed.id);
///     }
/// }
/// consumer.settle(batch).await?;
/// # Ok(()) }
/// ```
#[must_use = "a batch that is not settled leaves its entries pending until another consumer claims them"]
pub struct Batch<T, E> {
    pub(crate) processed: Vec<Processed<T, E>>,
    pub(crate) settlement: Settlement,
    pub(crate) held: Vec<Held>,
}

impl<T, E> Batch<T, E> {
    /// What became of each entry of the batch, in the order they were read (see the example
    /// above).
    pub fn processed(&self) -> &[Processed<T, E>] {
        &self.processed
    }

    /// Whether the batch has no entry (nothing came within the read's
    /// [`block`](crate::Idempotent::block)): then settling it writes nothing.
    pub fn is_empty(&self) -> bool {
        self.processed.is_empty()
    }

    /// Input: each entry of a batch and what its run became, or why it did not run. Output:
    /// what each entry gets, what the group must be told, and the entries to keep for a later
    /// try.
    pub(crate) fn decide(ran: Vec<Ran<T, E>>) -> Self
    where
        E: std::fmt::Display,
    {
        let mut settlement = Settlement::default();
        let mut held = Vec::new();
        let mut processed = Vec::with_capacity(ran.len());
        let now = Instant::now();
        for (delivery, verdict) in ran {
            let id = delivery.entry.id().to_owned();
            let deliveries = delivery.deliveries;
            let mut wait = |delay: Duration, deferrals: u32| {
                held.push(Held {
                    due: now + delay,
                    deferrals,
                    deliveries: delivery.deliveries,
                    entry: delivery.entry.clone(),
                });
            };
            let handled = match verdict.map(from_verdict) {
                Ok(Ok(handled)) => {
                    match &handled {
                        Handled::Acked(_) => settlement.acked.push(id.clone()),
                        Handled::Failed {
                            failures, delay, ..
                        } => {
                            settlement.failures.push((id.clone(), *failures));
                            wait(*delay, delivery.deferrals);
                        }
                        Handled::Deferred { delay, .. } => {
                            wait(*delay, delivery.deferrals.saturating_add(1));
                        }
                        Handled::DeadLettered(_) => {}
                    }
                    handled
                }
                Ok(Err(rejection)) | Err(rejection) => {
                    settlement.dead.push((
                        delivery.entry.clone(),
                        rejection.reason(),
                        rejection.to_string(),
                    ));
                    Handled::DeadLettered(rejection)
                }
            };
            processed.push(Processed {
                id,
                deliveries,
                handled,
            });
        }
        Self {
            processed,
            settlement,
            held,
        }
    }
}

impl<T: std::fmt::Debug, E: std::fmt::Debug> std::fmt::Debug for Batch<T, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batch")
            .field("processed", &self.processed)
            .finish_non_exhaustive()
    }
}

/// An entry left pending for a later try in its consumer.
pub(crate) struct Held {
    pub(crate) entry: Entry,
    pub(crate) deliveries: u32,
    pub(crate) deferrals: u32,
    pub(crate) due: Instant,
}

/// An entry to run in a batch.
pub(crate) struct Delivery {
    pub(crate) entry: Entry,
    pub(crate) deliveries: u32,
    pub(crate) deferrals: u32,
}

/// An entry of a batch and what its run became, or why it did not run.
pub(crate) type Ran<T, E> = (Delivery, Result<Verdict<T, E>, Rejection<E>>);

/// Input: what the consumer core made of an entry's call. Output: what the entry gets, or why
/// it is dead-lettered.
fn from_verdict<T, E>(verdict: Verdict<T, E>) -> Result<Handled<T, E>, Rejection<E>> {
    match verdict {
        Verdict::Ack(report) => Ok(Handled::Acked(report)),
        Verdict::Retry {
            failure,
            failures,
            delay,
            ..
        } => Ok(Handled::Failed {
            error: failure,
            failures,
            delay,
        }),
        Verdict::GiveUp {
            failure, failures, ..
        } => Err(Rejection::GaveUp { failure, failures }),
        Verdict::Defer { error, delay, .. } => Ok(Handled::Deferred { error, delay }),
        Verdict::Refuse(err) => Err(Rejection::Refused(err)),
        Verdict::Hold(err) => Err(Rejection::InDoubt(err)),
    }
}
