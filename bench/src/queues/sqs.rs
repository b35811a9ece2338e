//! The SQS side of the queue bench, on an SQS API server (`moto_server` in the bench script):
//! one standard queue per batch, with a dead-letter queue, as `idempotask-sqs` requires.
//!
//! SQS hands out at most 10 messages per `ReceiveMessage`, so "in flight" here is the
//! receive's `MaxNumberOfMessages`, at most 10: a run asked for 64 in flight measures 10, and
//! its rows say 10.

use aws_sdk_sqs::Client;
use aws_sdk_sqs::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_sqs::types::{
    DeleteMessageBatchRequestEntry, MessageAttributeValue, MessageSystemAttributeName,
    QueueAttributeName, SendMessageBatchRequestEntry,
};
use idempotask::store::BatchingStore;
use idempotask_redis::RedisStore;
use idempotask_sqs::{Attribute, Handled, Idempotent};

use super::batch::{Batch, Clocks, Consumed, QUEUE_TASK, Shared};
use super::config::{Broker, Consumer, QueueError};
use super::handwritten::run_read;

/// The message attribute that carries each message's key.
const KEY: &str = "key";

/// SQS's most messages per receive (and per batch call).
pub(super) const MOST_PER_RECEIVE: usize = 10;

/// The SQS side: a client of the server and the store the idempotask consumer uses.
pub(super) struct SqsBench {
    client: Client,
    /// The batching wrapper the crate's docs recommend over `RedisStore`: a receive's
    /// `begin`s reach Redis as one pipeline, and so do its `finish`es.
    store: BatchingStore<RedisStore>,
}

/// One received message as the bare and hand-written consumers see it.
struct Received {
    receipt: String,
    key: String,
    payload: Vec<u8>,
}

impl SqsBench {
    /// A client of the SQS API at `endpoint` (static test credentials, as a local server
    /// takes them).
    pub(super) fn new(endpoint: &str, store: &RedisStore) -> Self {
        let config = aws_sdk_sqs::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new("us-east-1"))
            .credentials_provider(Credentials::new("bench", "bench", None, None, "bench"))
            .endpoint_url(endpoint)
            .http_client(aws_smithy_http_client::Builder::new().build_http())
            .build();
        Self {
            client: Client::from_conf(config),
            store: BatchingStore::new(store.clone()),
        }
    }

    /// Sends the batch's messages to a queue of their own (untimed), then times a consumer
    /// over them, receiving up to `in_flight` (at most 10) at a time.
    pub(super) async fn measure(
        &self,
        batch: &Batch,
        shared: &Shared,
    ) -> Result<Consumed, QueueError> {
        let url = self.queue(&batch.name).await?;
        for first in (0..batch.messages).step_by(MOST_PER_RECEIVE) {
            let mut request = self.client.send_message_batch().queue_url(&url);
            for number in first..batch.messages.min(first + MOST_PER_RECEIVE) {
                let key = MessageAttributeValue::builder()
                    .data_type("String")
                    .string_value(batch.key(number))
                    .build()?;
                request = request.entries(
                    SendMessageBatchRequestEntry::builder()
                        .id(number.to_string())
                        .message_body(number.to_string())
                        .message_attributes(KEY, key)
                        .build()?,
                );
            }
            let sent = request.send().await?;
            if !sent.failed().is_empty() {
                return Err(format!("messages not sent: {:?}", sent.failed()).into());
            }
        }
        let cost = if batch.consumer == Consumer::Idempotask {
            self.idempotask(batch, shared, &url).await?
        } else {
            let clocks = Clocks::start(shared, Broker::Sqs).await?;
            self.by_hand(batch, shared, &url).await?;
            clocks.stop().await?
        };
        self.client.delete_queue().queue_url(&url).send().await?;
        Ok(cost)
    }

    /// Creates the batch's queue, with a dead-letter queue and a visibility timeout above the
    /// task's lock TTL, as `idempotask-sqs` requires of a queue it consumes.
    async fn queue(&self, name: &str) -> Result<String, QueueError> {
        let dead = self
            .client
            .create_queue()
            .queue_name(format!("{name}-dead"))
            .send()
            .await?;
        let dead_url = dead.queue_url().ok_or("no dead-letter queue URL")?;
        let attributes = self
            .client
            .get_queue_attributes()
            .queue_url(dead_url)
            .attribute_names(QueueAttributeName::QueueArn)
            .send()
            .await?;
        let arn = attributes
            .attributes()
            .and_then(|all| all.get(&QueueAttributeName::QueueArn))
            .ok_or("no dead-letter queue ARN")?;
        let visibility = QUEUE_TASK.settings().lock_ttl.as_secs() * 2 + 1;
        let created = self
            .client
            .create_queue()
            .queue_name(name)
            .attributes(
                QueueAttributeName::VisibilityTimeout,
                visibility.to_string(),
            )
            .attributes(
                QueueAttributeName::RedrivePolicy,
                format!(r#"{{"deadLetterTargetArn":"{arn}","maxReceiveCount":"5"}}"#),
            )
            .send()
            .await?;
        Ok(created.queue_url().ok_or("no queue URL")?.to_owned())
    }

    /// The integration's consumer over the batch: `next_batch` until every message is
    /// deleted.
    async fn idempotask(
        &self,
        batch: &Batch,
        shared: &Shared,
        url: &str,
    ) -> Result<Consumed, QueueError> {
        let batch_size = u8::try_from(batch.in_flight.min(MOST_PER_RECEIVE))?;
        let mut consumer = Idempotent::new(QUEUE_TASK.clone(), Attribute::new(KEY))
            .store(self.store.clone())
            .batch_size(batch_size)
            .wait_time(std::time::Duration::ZERO)
            .consume(self.client.clone(), url)
            .await?;
        let clocks = Clocks::start(shared, Broker::Sqs).await?;
        let bodies = &batch.bodies;
        let mut deleted = 0;
        let mut dry = 0;
        while deleted < batch.messages {
            let processed = consumer
                .next_batch(|message| {
                    let payload = message.body().as_bytes().to_vec();
                    Ok(async move { Ok::<_, std::convert::Infallible>(bodies.run(&payload)) })
                })
                .await?;
            dry = if processed.is_empty() { dry + 1 } else { 0 };
            if dry > 20 {
                return Err(format!("the queue ran dry after {deleted} messages").into());
            }
            for one in &processed {
                if !matches!(one.handled, Handled::Deleted(_)) || one.settled.is_err() {
                    return Err(format!("{} not deleted: {:?}", one.id, one.handled).into());
                }
            }
            deleted += processed.len();
        }
        clocks.stop().await
    }

    /// The bare or the hand-written consumer over the batch: `ReceiveMessage` of up to
    /// `in_flight` (at most 10) messages, each run (the hand-written one under its lock and
    /// marker, the receive's messages at once), then one `DeleteMessageBatch` of them.
    async fn by_hand(&self, batch: &Batch, shared: &Shared, url: &str) -> Result<(), QueueError> {
        let bodies = &batch.bodies;
        let most = i32::try_from(batch.in_flight.min(MOST_PER_RECEIVE))?;
        let mut deleted = 0;
        let mut dry = 0;
        while deleted < batch.messages {
            let received = self
                .client
                .receive_message()
                .queue_url(url)
                .max_number_of_messages(most)
                .message_attribute_names(KEY)
                .message_system_attribute_names(MessageSystemAttributeName::ApproximateReceiveCount)
                .send()
                .await?;
            let messages = received
                .messages()
                .iter()
                .map(|message| {
                    let key = message
                        .message_attributes()
                        .and_then(|attributes| attributes.get(KEY))
                        .and_then(MessageAttributeValue::string_value)
                        .ok_or("a message without its key")?;
                    Ok(Received {
                        receipt: message.receipt_handle().ok_or("no receipt")?.to_owned(),
                        key: key.to_owned(),
                        payload: message.body().unwrap_or_default().as_bytes().to_vec(),
                    })
                })
                .collect::<Result<Vec<_>, QueueError>>()?;
            dry = if messages.is_empty() { dry + 1 } else { 0 };
            if dry > 20 {
                return Err(format!("the queue ran dry after {deleted} messages").into());
            }
            if messages.is_empty() {
                continue;
            }
            let read: Vec<(&str, &[u8])> = messages
                .iter()
                .map(|message| (message.key.as_str(), message.payload.as_slice()))
                .collect();
            run_read(batch.consumer, &shared.redis, bodies, &read).await?;
            let mut delete = self.client.delete_message_batch().queue_url(url);
            for (n, message) in messages.iter().enumerate() {
                delete = delete.entries(
                    DeleteMessageBatchRequestEntry::builder()
                        .id(n.to_string())
                        .receipt_handle(&message.receipt)
                        .build()?,
                );
            }
            let reply = delete.send().await?;
            if !reply.failed().is_empty() {
                return Err(format!("messages not deleted: {:?}", reply.failed()).into());
            }
            deleted += messages.len();
        }
        Ok(())
    }
}
