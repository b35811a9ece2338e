//! The NATS JetStream side of the queue bench.

use async_nats::jetstream::{self, consumer::pull, message::PublishMessage};
use futures_util::StreamExt;
use idempotask_redis::RedisStore;
use redis::aio::ConnectionManager;

use super::batch::{Batch, Clocks, Consumed, QUEUE_TASK, Shared};
use super::config::{Broker, Consumer, QueueError};
use super::handwritten::{Handwritten, handwritten};

/// The NATS side: one connection, one stream for the run's subjects.
pub(super) struct NatsBench {
    context: jetstream::Context,
    stream: jetstream::stream::Stream,
    /// One for the whole run, as a long-running consumer has: its consumer check (and the
    /// failure bucket's creation) happens once, not in every timed batch.
    integration: idempotask_nats::Idempotent<idempotask_nats::MsgId>,
}

impl NatsBench {
    pub(super) async fn new(url: &str, run: u64, store: &RedisStore) -> Result<Self, QueueError> {
        let context = jetstream::new(async_nats::connect(url).await?);
        let stream = context
            .create_stream(jetstream::stream::Config {
                name: format!("QB{run}"),
                subjects: vec![format!("qb{run}.>")],
                ..Default::default()
            })
            .await?;
        let integration =
            idempotask_nats::Idempotent::new(QUEUE_TASK.clone(), idempotask_nats::MsgId)
                .store(store.clone());
        Ok(Self {
            context,
            stream,
            integration,
        })
    }

    /// Publishes the batch's messages (untimed), then times a consumer of their own over them.
    pub(super) async fn measure(
        &self,
        batch: &Batch,
        shared: &Shared,
    ) -> Result<Consumed, QueueError> {
        let subject = batch.name.replace('-', ".");
        let mut acks = Vec::with_capacity(256);
        for number in 0..batch.messages {
            let message = PublishMessage::build()
                .payload(number.to_string().into())
                .message_id(batch.key(number));
            acks.push(self.context.send_publish(subject.clone(), message).await?);
            if acks.len() == 256 || number + 1 == batch.messages {
                for ack in acks.drain(..) {
                    ack.await?;
                }
            }
        }
        let consumer = self
            .stream
            .create_consumer(pull::Config {
                durable_name: Some(batch.name.clone()),
                filter_subject: subject,
                max_ack_pending: i64::try_from(batch.in_flight)?,
                ..Default::default()
            })
            .await?;
        let clocks = Clocks::start(shared, Broker::Nats).await?;
        // The consumer's `max_ack_pending` keeps no more than `in_flight` messages out; the pull
        // requests ask for async-nats's default batch, as a worker's loop does. Batches of one
        // message stalled now and then for a pull request's whole expiry (30 s).
        let messages = consumer.messages().await?;
        let integration = &self.integration;
        messages
            .take(batch.messages)
            .map(|message| {
                let mut redis = shared.redis.clone();
                async move {
                    let message = message?;
                    self.consume(batch, integration, &mut redis, &message).await
                }
            })
            .buffer_unordered(batch.in_flight)
            .fold(Ok(()), |done: Result<(), QueueError>, one| async move {
                done.and(one)
            })
            .await?;
        let cost = clocks.stop().await?;
        self.stream.delete_consumer(&batch.name).await?;
        Ok(cost)
    }

    /// One message through the batch's consumer, acked once handled.
    async fn consume(
        &self,
        batch: &Batch,
        integration: &idempotask_nats::Idempotent<idempotask_nats::MsgId>,
        redis: &mut ConnectionManager,
        message: &jetstream::Message,
    ) -> Result<(), QueueError> {
        let bodies = &batch.bodies;
        match batch.consumer {
            Consumer::Bare => {
                bodies.run(&message.payload);
                message.ack().await?;
            }
            Consumer::Handwritten => {
                let key = nats_key(message)?;
                let done = handwritten(redis, key, || bodies.run(&message.payload)).await?;
                if done == Handwritten::Busy {
                    return Err(format!("{key} was busy").into());
                }
                message.ack().await?;
            }
            Consumer::Idempotask => {
                let body =
                    async { Ok::<_, std::convert::Infallible>(bodies.run(&message.payload)) };
                let handled = integration
                    .handle(message, body)
                    .await
                    .map_err(|err| err.to_string())?;
                if !matches!(handled, idempotask_nats::Handled::Acked(_)) {
                    return Err(format!("not acked: {handled:?}").into());
                }
            }
        }
        Ok(())
    }
}

/// The `Nats-Msg-Id` the bench published `message` with.
fn nats_key(message: &jetstream::Message) -> Result<&str, QueueError> {
    message
        .headers
        .as_ref()
        .and_then(|headers| headers.get(async_nats::header::NATS_MESSAGE_ID))
        .map(async_nats::HeaderValue::as_str)
        .ok_or_else(|| "a message without its Nats-Msg-Id".into())
}
