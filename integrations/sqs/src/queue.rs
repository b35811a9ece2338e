//! [`SqsConsumer`]: a consumer of one queue, which receives batches, runs their messages and
//! settles them.

use std::future::Future;
use std::pin::pin;
use std::time::Duration;

use aws_sdk_sqs::Client;
use aws_sdk_sqs::types::{MessageSystemAttributeName, QueueAttributeName};
use futures_util::future::{Either, join_all, select};
use idempotask_consumer::{History, Verdict};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::batch::{Batch, Ran, settle};
use crate::calls::change_visibility;
use crate::{BadMessage, Handled, Idempotent, Message, MessageKey, Processed, Rejection, SqsError};

/// A consumer of one SQS queue, made by [`Idempotent::consume`]: it receives messages in
/// batches, runs each through the task, and settles them (see the [crate docs](crate)).
///
/// It keeps nothing between batches: a message handed back is SQS's again, received by
/// whichever consumer asks first once its visibility timeout is over.
///
/// ```no_run
/// use idempotask::Task;
/// use idempotask_sqs::{Idempotent, MessageId, SqsConsumer};
///
/// # async fn run(client: aws_sdk_sqs::Client, url: &str) -> Result<(), idempotask_sqs::SqsError> {
/// let mut consumer: SqsConsumer<MessageId> =
///     Idempotent::new(Task::new("refund"), MessageId).consume(client, url).await?;
/// loop {
///     consumer.next_batch(|message| {
///         let bytes = message.body().len();
///         Ok(async move { Ok::<_, std::io::Error>(bytes) })
///     }).await?;
/// }
/// # }
/// ```
pub struct SqsConsumer<K> {
    idempotent: Idempotent<K>,
    client: Client,
    queue_url: String,
    queue: QueueFacts,
}

/// What the consumer read of its queue's attributes at the start.
#[derive(Debug, Clone, Copy)]
struct QueueFacts {
    visibility_timeout: Duration,
    fifo: bool,
    max_receive_count: u32,
}

/// A message of a batch at its place in the receive, and its key and body's future, or why it
/// does not run.
type Planned<Fut, E> = (usize, Message, Result<(String, Fut), Rejection<E>>);

impl<K: MessageKey> Idempotent<K> {
    /// Binds the consumer to the queue at `queue_url`, through `client` (an
    /// `aws_sdk_sqs::Client`, built from `aws_config::load_from_env()` or a config of your
    /// own). It reads the queue's attributes first (`GetQueueAttributes`) and refuses a queue
    /// it cannot consume safely.
    ///
    /// ```no_run
    /// use idempotask::Task;
    /// use idempotask_sqs::{Attribute, Idempotent};
    ///
    /// # async fn start(client: aws_sdk_sqs::Client) -> Result<(), idempotask_sqs::SqsError> {
    /// let url = "https://sqs.eu-west-1.amazonaws.com/123456789012/orders";
    /// let consumer = Idempotent::new(Task::new("order_charge"), Attribute::new("order_id"))
    ///     .consume(client, url)
    ///     .await?;
    /// # let _ = consumer; Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`SqsError::VisibilityBelowLockTtl`] when the queue's visibility timeout is shorter
    /// than the task's lock TTL; [`SqsError::NoRedrivePolicy`] when the queue has no
    /// dead-letter queue; [`SqsError::Sqs`] when `GetQueueAttributes` fails (no such queue,
    /// no permission, SQS unreachable).
    pub async fn consume(
        self,
        client: Client,
        queue_url: impl Into<String>,
    ) -> Result<SqsConsumer<K>, SqsError> {
        const ACTION: &str = "GetQueueAttributes";
        let queue_url = queue_url.into();
        let output = client
            .get_queue_attributes()
            .queue_url(&queue_url)
            .attribute_names(QueueAttributeName::VisibilityTimeout)
            .attribute_names(QueueAttributeName::FifoQueue)
            .attribute_names(QueueAttributeName::RedrivePolicy)
            .send()
            .await
            .map_err(|err| SqsError::sqs(ACTION, err))?;
        let attribute = |name: QueueAttributeName| {
            output
                .attributes()
                .and_then(|all| all.get(&name))
                .map(String::as_str)
        };
        let visibility_timeout = attribute(QueueAttributeName::VisibilityTimeout)
            .and_then(|seconds| seconds.parse().ok())
            .map(Duration::from_secs)
            .ok_or_else(|| SqsError::reply(ACTION, "no VisibilityTimeout"))?;
        let lock_ttl = self.task().settings().lock_ttl;
        if visibility_timeout < lock_ttl {
            return Err(SqsError::VisibilityBelowLockTtl {
                visibility_timeout,
                lock_ttl,
            });
        }
        let max_receive_count = attribute(QueueAttributeName::RedrivePolicy)
            .and_then(max_receive_count)
            .ok_or(SqsError::NoRedrivePolicy)?;
        let fifo = attribute(QueueAttributeName::FifoQueue) == Some("true");
        Ok(SqsConsumer {
            idempotent: self,
            client,
            queue_url,
            queue: QueueFacts {
                visibility_timeout,
                fifo,
                max_receive_count,
            },
        })
    }
}

/// Input: a queue's `RedrivePolicy` (JSON). Output: its `maxReceiveCount`, when it names a
/// dead-letter queue.
fn max_receive_count(policy: &str) -> Option<u32> {
    let policy: serde_json::Value = serde_json::from_str(policy).ok()?;
    policy.get("deadLetterTargetArn")?.as_str()?;
    match policy.get("maxReceiveCount")? {
        serde_json::Value::Number(count) => count.as_u64()?.try_into().ok(),
        serde_json::Value::String(count) => count.parse().ok(),
        _ => None,
    }
}

impl<K: MessageKey> SqsConsumer<K> {
    /// Receives a batch (up to [`batch_size`](Idempotent::batch_size) messages, waiting up to
    /// [`wait_time`](Idempotent::wait_time) when there are none) and handles every message of
    /// it. An empty batch means nothing came.
    ///
    /// For each message, `body` is called with it before its unit begins: it decodes what it
    /// needs (a [`BadMessage`] rejects the message, nothing ran) and returns the body's
    /// future, which is only polled once the lock is held (a duplicate never polls it). The
    /// batch's bodies run at the same time, except that on a FIFO queue the messages of one
    /// group run one after the other, and stop at the first that does not finish. While they
    /// run, the batch's visibility timeout is renewed every
    /// [`extend_at`](Idempotent::extend_at) of it. Then the finished messages are deleted with
    /// one `DeleteMessageBatch`, and the others given their visibility timeout with one
    /// `ChangeMessageVisibilityBatch`; what SQS answered for each is in its
    /// [`Processed::settled`]. The body's `Ok` type is stored as JSON, so it must implement
    /// `Serialize` and `DeserializeOwned` (`()` does).
    ///
    /// ```no_run
    /// use idempotask::Task;
    /// use idempotask_sqs::{Attribute, Handled, Idempotent};
    ///
    /// #[derive(serde::Deserialize)]
    /// struct Order { amount: u64 }
    ///
    /// async fn charge(amount: u64) -> Result<String, std::io::Error> {
    ///     Ok(format!("ch_{amount}"))
    /// }
    ///
    /// # async fn run(client: aws_sdk_sqs::Client, url: &str) -> Result<(), idempotask_sqs::SqsError> {
    /// let mut consumer = Idempotent::new(Task::new("order_charge"), Attribute::new("order_id"))
    ///     .consume(client, url)
    ///     .await?;
    /// loop {
    ///     let batch = consumer
    ///         .next_batch(|message| {
    ///             let order: Order = message.json()?;
    ///             Ok(charge(order.amount))
    ///         })
    ///         .await?;
    ///     for processed in batch {
    ///         if let Handled::Rejected(why) = &processed.handled {
    ///             eprintln!("{} rejected: {why}", processed.id);
    ///         }
    ///     }
    /// }
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`SqsError::Sqs`] when the `ReceiveMessage` failed; nothing was run then.
    pub async fn next_batch<T, E, F, Fut>(
        &mut self,
        body: F,
    ) -> Result<Vec<Processed<T, E>>, SqsError>
    where
        T: Serialize + DeserializeOwned,
        F: FnMut(&Message) -> Result<Fut, BadMessage>,
        Fut: Future<Output = Result<T, E>>,
    {
        let batch = self.run_batch(body).await?;
        Ok(self.settle(batch).await)
    }

    /// [`next_batch`](Self::next_batch) without its settling: receives a batch and runs it,
    /// and answers what became of each message, none of them deleted or handed back yet, for
    /// [`settle`](Self::settle). Between the two, what the batch did is known and SQS has not
    /// been told: a program that must act before its messages are deleted (log, forward the
    /// results) acts there. Settle within the visibility timeout: its renewal stops with the
    /// run.
    ///
    /// ```no_run
    /// use idempotask::Task;
    /// use idempotask_sqs::{Handled, Idempotent, MessageId};
    ///
    /// # async fn run(client: aws_sdk_sqs::Client, url: &str) -> Result<(), idempotask_sqs::SqsError> {
    /// let mut consumer = Idempotent::new(Task::new("refund"), MessageId).consume(client, url).await?;
    /// let batch = consumer
    ///     .run_batch(|message| {
    ///         let bytes = message.body().len();
    ///         Ok(async move { Ok::<_, std::io::Error>(bytes) })
    ///     })
    ///     .await?;
    /// for (message, handled) in batch.messages() {
    ///     if let Handled::Deleted(report) = handled {
    ///         println!("{}: {} bytes, about to be deleted", message.id(), report.value);
    ///     }
    /// }
    /// let processed = consumer.settle(batch).await;
    /// # let _ = processed; Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`SqsError::Sqs`] when the `ReceiveMessage` failed; nothing was run then.
    pub async fn run_batch<T, E, F, Fut>(&mut self, mut body: F) -> Result<Batch<T, E>, SqsError>
    where
        T: Serialize + DeserializeOwned,
        F: FnMut(&Message) -> Result<Fut, BadMessage>,
        Fut: Future<Output = Result<T, E>>,
    {
        let messages = self.receive().await?;
        if messages.is_empty() {
            return Ok(Batch { ran: Vec::new() });
        }
        // The batch's messages by group, each group in the order SQS gave them: on a standard
        // queue every message is a group of its own.
        let mut groups: Vec<Vec<(usize, Message)>> = Vec::new();
        for (at, message) in messages.into_iter().enumerate() {
            let group = message
                .group()
                .filter(|_| self.queue.fifo)
                .map(str::to_owned);
            let same = groups
                .iter_mut()
                .find(|members| group.is_some() && members[0].1.group() == group.as_deref());
            match same {
                Some(members) => members.push((at, message)),
                None => groups.push(vec![(at, message)]),
            }
        }
        let receipts: Vec<(String, String)> = groups
            .iter()
            .flatten()
            .map(|(at, message)| (entry_id(*at), message.receipt.clone()))
            .collect();
        let key = &self.idempotent.key;
        let runs = groups.into_iter().map(|members| {
            let planned: Vec<_> = members
                .into_iter()
                .map(|(at, message)| {
                    let plan = match key.key(&message) {
                        Err(missing) => Err(Rejection::MissingKey(missing)),
                        Ok(key) => match body(&message) {
                            Err(bad) => Err(Rejection::BadMessage(bad)),
                            Ok(future) => Ok((key, future)),
                        },
                    };
                    (at, message, plan)
                })
                .collect();
            self.run_group(planned)
        });
        let ran = {
            let extend = extend(
                &self.client,
                &self.queue_url,
                self.queue.visibility_timeout,
                self.idempotent.extend_at,
                &receipts,
            );
            match select(pin!(join_all(runs)), pin!(extend)).await {
                Either::Left((ran, _)) => ran,
                Either::Right(((), _)) => unreachable!("the extension never ends"),
            }
        };
        let mut ran: Vec<(usize, Ran<T, E>)> = ran.into_iter().flatten().collect();
        ran.sort_by_key(|(at, _)| *at);
        Ok(Batch {
            ran: ran.into_iter().map(|(_, ran)| ran).collect(),
        })
    }

    /// Settles a [`Batch`]: deletes its finished messages with one `DeleteMessageBatch` and
    /// hands the others back with one `ChangeMessageVisibilityBatch` (see the crate docs'
    /// table), and answers what became of each message and whether SQS took it
    /// ([`Processed::settled`]).
    ///
    /// ```no_run
    /// # use idempotask::Task;
    /// # use idempotask_sqs::{Idempotent, MessageId};
    /// # async fn run(client: aws_sdk_sqs::Client, url: &str) -> Result<(), idempotask_sqs::SqsError> {
    /// # let mut consumer = Idempotent::new(Task::new("refund"), MessageId).consume(client, url).await?;
    /// let batch = consumer.run_batch(|_| Ok(async { Ok::<_, std::io::Error>(()) })).await?;
    /// for processed in consumer.settle(batch).await {
    ///     if let Err(failure) = processed.settled {
    ///         eprintln!("{}: {failure}", processed.id);
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn settle<T, E>(&self, batch: Batch<T, E>) -> Vec<Processed<T, E>> {
        settle(&self.client, &self.queue_url, batch).await
    }

    /// The queue's visibility timeout, as read at the start.
    ///
    /// ```no_run
    /// # use idempotask::Task;
    /// # use idempotask_sqs::{Idempotent, MessageId};
    /// # async fn start(client: aws_sdk_sqs::Client) -> Result<(), idempotask_sqs::SqsError> {
    /// let consumer = Idempotent::new(Task::new("refund"), MessageId).consume(client, "https://sqs…/refunds").await?;
    /// println!("messages are invisible for {:?} once received", consumer.visibility_timeout());
    /// # Ok(()) }
    /// ```
    pub fn visibility_timeout(&self) -> Duration {
        self.queue.visibility_timeout
    }

    /// The redrive policy's `maxReceiveCount`: the receive after which SQS moves a message to
    /// the dead-letter queue.
    ///
    /// ```no_run
    /// # use idempotask::Task;
    /// # use idempotask_sqs::{Idempotent, MessageId};
    /// # async fn start(client: aws_sdk_sqs::Client) -> Result<(), idempotask_sqs::SqsError> {
    /// let consumer = Idempotent::new(Task::new("refund"), MessageId).consume(client, "https://sqs…/refunds").await?;
    /// assert!(consumer.max_receive_count() >= 1);
    /// # Ok(()) }
    /// ```
    pub fn max_receive_count(&self) -> u32 {
        self.queue.max_receive_count
    }

    /// Whether the queue is a FIFO queue, whose message groups keep their order.
    ///
    /// ```no_run
    /// # use idempotask::Task;
    /// # use idempotask_sqs::{Idempotent, MessageId};
    /// # async fn start(client: aws_sdk_sqs::Client) -> Result<(), idempotask_sqs::SqsError> {
    /// let consumer = Idempotent::new(Task::new("refund"), MessageId).consume(client, "https://sqs…/refunds.fifo").await?;
    /// assert!(consumer.is_fifo());
    /// # Ok(()) }
    /// ```
    pub fn is_fifo(&self) -> bool {
        self.queue.fifo
    }

    /// The settings the consumer runs with.
    ///
    /// ```no_run
    /// # use idempotask::Task;
    /// # use idempotask_sqs::{Idempotent, MessageId};
    /// # async fn start(client: aws_sdk_sqs::Client) -> Result<(), idempotask_sqs::SqsError> {
    /// let consumer = Idempotent::new(Task::new("refund"), MessageId).consume(client, "https://sqs…/refunds").await?;
    /// assert_eq!(consumer.idempotent().task().name(), "refund");
    /// # Ok(()) }
    /// ```
    pub fn idempotent(&self) -> &Idempotent<K> {
        &self.idempotent
    }

    /// One `ReceiveMessage`: the messages, with their receive counts and groups.
    async fn receive(&self) -> Result<Vec<Message>, SqsError> {
        let wait = i32::try_from(self.idempotent.wait_time.as_secs()).unwrap_or(20);
        let output = self
            .client
            .receive_message()
            .queue_url(&self.queue_url)
            .max_number_of_messages(i32::from(self.idempotent.batch_size))
            .wait_time_seconds(wait)
            .message_system_attribute_names(MessageSystemAttributeName::ApproximateReceiveCount)
            .message_system_attribute_names(MessageSystemAttributeName::MessageGroupId)
            .message_attribute_names("All")
            .send()
            .await
            .map_err(|err| SqsError::sqs("ReceiveMessage", err))?;
        Ok(output
            .messages()
            .iter()
            .filter_map(Message::from_sdk)
            .collect())
    }

    /// Runs the messages of one group one after the other; once one does not finish, the
    /// group's later ones do not run. On a standard queue a group is one message.
    async fn run_group<T, E, Fut>(&self, planned: Vec<Planned<Fut, E>>) -> Vec<(usize, Ran<T, E>)>
    where
        T: Serialize + DeserializeOwned,
        Fut: Future<Output = Result<T, E>>,
    {
        let mut ran = Vec::with_capacity(planned.len());
        let mut stopped: Option<String> = None;
        for (at, message, plan) in planned {
            let handled = match (&stopped, plan) {
                (Some(first), _) => Handled::Behind {
                    message_id: first.clone(),
                },
                (None, Err(rejection)) => Handled::Rejected(rejection),
                (None, Ok((key, future))) => {
                    let history = Received(message.receive_count());
                    let payload = message.payload();
                    let verdict = self
                        .idempotent
                        .settings
                        .run(key, &payload, &history, future)
                        .await;
                    handled(verdict)
                }
            };
            if stopped.is_none() && !matches!(handled, Handled::Deleted(_)) {
                stopped = Some(message.id().to_owned());
            }
            let entry = entry_id(at);
            ran.push((
                at,
                Ran {
                    message,
                    entry,
                    handled,
                },
            ));
        }
        ran
    }
}

/// Input: what the consumer core made of a message's call. Output: what the message gets.
fn handled<T, E>(verdict: Verdict<T, E>) -> Handled<T, E> {
    match verdict {
        Verdict::Ack(report) => Handled::Deleted(report),
        Verdict::Retry {
            failure,
            failures,
            delay,
            ..
        } => Handled::Failed {
            error: failure,
            failures,
            delay: whole_seconds(delay),
        },
        Verdict::GiveUp {
            failure, failures, ..
        } => Handled::Rejected(Rejection::GaveUp { failure, failures }),
        Verdict::Defer { error, delay, .. } => Handled::Deferred {
            error,
            delay: whole_seconds(delay),
        },
        Verdict::Refuse(err) => Handled::Rejected(Rejection::Refused(err)),
        Verdict::Hold(err) => Handled::Rejected(Rejection::InDoubt(err)),
    }
}

/// Input: a delay. Output: the delay SQS applies, in whole seconds.
fn whole_seconds(delay: Duration) -> Duration {
    Duration::from_secs(
        crate::calls::visibility_seconds(delay)
            .unsigned_abs()
            .into(),
    )
}

/// The id of the `at`-th message of a batch in its `…Batch` calls.
pub(crate) fn entry_id(at: usize) -> String {
    format!("m{at}")
}

/// What SQS knows of a message's earlier deliveries: its receive count, which stands for both
/// counts (it is never below either).
struct Received(u32);

impl History for Received {
    async fn failures(&self) -> u32 {
        self.0.saturating_sub(1)
    }

    async fn deferrals(&self) -> u32 {
        self.0.saturating_sub(1)
    }
}

/// Every `extend_at` of `visibility`, gives the batch's messages a fresh visibility timeout,
/// so that none is handed to another consumer while the batch runs; never ends.
async fn extend(
    client: &Client,
    queue_url: &str,
    visibility: Duration,
    extend_at: f64,
    receipts: &[(String, String)],
) {
    let every = visibility
        .mul_f64(extend_at)
        .max(Duration::from_millis(100));
    let changes: Vec<(String, String, Duration)> = receipts
        .iter()
        .map(|(id, receipt)| (id.clone(), receipt.clone(), visibility))
        .collect();
    loop {
        tokio::time::sleep(every).await;
        let failed = change_visibility(client, queue_url, &changes).await;
        for (entry, failure) in failed {
            tracing::warn!(entry, error = %failure, "could not extend a running message's visibility timeout");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_redrive_policy_needs_a_target_and_a_count() {
        let policy =
            r#"{"deadLetterTargetArn":"arn:aws:sqs:us-east-1:1:dead","maxReceiveCount":"3"}"#;
        assert_eq!(max_receive_count(policy), Some(3));
        let numeric =
            r#"{"deadLetterTargetArn":"arn:aws:sqs:us-east-1:1:dead","maxReceiveCount":4}"#;
        assert_eq!(max_receive_count(numeric), Some(4));
        assert_eq!(max_receive_count(r#"{"maxReceiveCount":3}"#), None);
        assert_eq!(max_receive_count("not json"), None);
    }
}
