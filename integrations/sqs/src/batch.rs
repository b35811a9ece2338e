//! [`Batch`]: what a receive's messages became, before SQS is told; and its settling, one
//! `DeleteMessageBatch` and one `ChangeMessageVisibilityBatch`.

use std::time::Duration;

use crate::calls::{change_visibility, delete};
use aws_sdk_sqs::Client;

use crate::{Handled, Message, Processed};

/// The messages of one receive and what became of each, not yet settled: made by
/// [`SqsConsumer::run_batch`](crate::SqsConsumer::run_batch), settled by
/// [`SqsConsumer::settle`](crate::SqsConsumer::settle). Dropped unsettled, its
/// messages come back after their visibility timeout, and the finished ones replay their
/// stored results.
///
/// ```no_run
/// # use idempotask::Task;
/// # use idempotask_sqs::{Idempotent, MessageId};
/// # async fn run(client: aws_sdk_sqs::Client, url: &str) -> Result<(), idempotask_sqs::SqsError> {
/// # let mut consumer = Idempotent::new(Task::new("refund"), MessageId).consume(client, url).await?;
/// let batch = consumer.run_batch(|_| Ok(async { Ok::<_, std::io::Error>(()) })).await?;
/// if !batch.is_empty() {
///     println!("{} messages ran", batch.messages().count());
/// }
/// consumer.settle(batch).await;
/// # Ok(()) }
/// ```
#[must_use = "a batch that is not settled leaves its messages to come back after their visibility timeout"]
#[derive(Debug)]
pub struct Batch<T, E> {
    pub(crate) ran: Vec<Ran<T, E>>,
}

/// A message of a batch, its entry id in the batch's calls, and what its run became.
#[derive(Debug)]
pub(crate) struct Ran<T, E> {
    pub(crate) message: Message,
    pub(crate) entry: String,
    pub(crate) handled: Handled<T, E>,
}

impl<T, E> Batch<T, E> {
    /// Each message of the batch and what became of it, in the order SQS gave them.
    ///
    /// ```
    /// # use idempotask::Task;
    /// # use idempotask_sqs::{Idempotent, MessageId};
    /// # async fn run(client: aws_sdk_sqs::Client, url: &str) -> Result<(), idempotask_sqs::SqsError> {
    /// # let mut consumer = Idempotent::new(Task::new("refund"), MessageId).consume(client, url).await?;
    /// let batch = consumer.run_batch(|_| Ok(async { Ok::<_, std::io::Error>(()) })).await?;
    /// for (message, handled) in batch.messages() {
    ///     println!("{}: {handled:?}", message.id());
    /// }
    /// # consumer.settle(batch).await; Ok(()) }
    /// ```
    pub fn messages(&self) -> impl Iterator<Item = (&Message, &Handled<T, E>)> {
        self.ran.iter().map(|ran| (&ran.message, &ran.handled))
    }

    /// Whether the batch has no message (nothing came within the receive's
    /// [`wait_time`](crate::Idempotent::wait_time)).
    ///
    /// ```
    /// # use idempotask::Task;
    /// # use idempotask_sqs::{Idempotent, MessageId};
    /// # async fn run(client: aws_sdk_sqs::Client, url: &str) -> Result<(), idempotask_sqs::SqsError> {
    /// # let mut consumer = Idempotent::new(Task::new("refund"), MessageId).consume(client, url).await?;
    /// let batch = consumer.run_batch(|_| Ok(async { Ok::<_, std::io::Error>(()) })).await?;
    /// if batch.is_empty() {
    ///     println!("nothing came");
    /// }
    /// # consumer.settle(batch).await; Ok(()) }
    /// ```
    pub fn is_empty(&self) -> bool {
        self.ran.is_empty()
    }
}

/// Input: a batch's messages and what each became. Output: what SQS took of their settling,
/// one `DeleteMessageBatch` and one `ChangeMessageVisibilityBatch`.
pub(crate) async fn settle<T, E>(
    client: &Client,
    queue_url: &str,
    batch: Batch<T, E>,
) -> Vec<Processed<T, E>> {
    let ran = batch.ran;
    let mut deletes = Vec::new();
    let mut changes = Vec::new();
    for one in &ran {
        let receipt = one.message.receipt.clone();
        match &one.handled {
            Handled::Deleted(_) => deletes.push((one.entry.clone(), receipt)),
            Handled::Failed { delay, .. } | Handled::Deferred { delay, .. } => {
                changes.push((one.entry.clone(), receipt, *delay));
            }
            // Visible again at once: behind its group's first, or for the redrive policy to
            // count this receive and move it on the next.
            Handled::Behind { .. } | Handled::Rejected(_) => {
                changes.push((one.entry.clone(), receipt, Duration::ZERO));
            }
        }
    }
    let (delete_failures, change_failures) = futures_util::future::join(
        delete(client, queue_url, &deletes),
        change_visibility(client, queue_url, &changes),
    )
    .await;
    let mut failures = delete_failures;
    failures.extend(change_failures);
    ran.into_iter()
        .map(|one| {
            let settled = failures.remove(&one.entry).map_or(Ok(()), Err);
            if let Err(failure) = &settled {
                tracing::warn!(message = one.message.id(), error = %failure, "SQS did not take the settling of a message");
            }
            Processed {
                id: one.message.id().to_owned(),
                receive_count: one.message.receive_count(),
                handled: one.handled,
                settled,
            }
        })
        .collect()
}
