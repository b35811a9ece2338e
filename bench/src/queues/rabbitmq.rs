//! The RabbitMQ side of the queue bench.

use futures_util::StreamExt;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions};
use lapin::options::{BasicNackOptions, ConfirmSelectOptions};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Connection as AmqpConnection, ConnectionProperties};
use redis::aio::ConnectionManager;

use super::batch::{Batch, Clocks, Consumed, QUEUE_TASK, Shared};
use super::config::{Broker, Consumer, QueueError};
use super::handwritten::{Handwritten, handwritten};

/// The RabbitMQ side: one connection, a confirmed channel to publish on.
pub(super) struct RabbitBench {
    connection: AmqpConnection,
    publisher: lapin::Channel,
}

impl RabbitBench {
    pub(super) async fn new(url: &str) -> Result<Self, QueueError> {
        let connection = AmqpConnection::connect(url, ConnectionProperties::default()).await?;
        let publisher = connection.create_channel().await?;
        publisher
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        Ok(Self {
            connection,
            publisher,
        })
    }

    /// Declares the batch's queue and publishes its messages (untimed), then times a consumer
    /// on a channel of its own over them.
    pub(super) async fn measure(
        &self,
        batch: &Batch,
        shared: &Shared,
    ) -> Result<Consumed, QueueError> {
        let channel = self.connection.create_channel().await?;
        let topology = idempotask_lapin::Topology::new(batch.name.as_str());
        let retries = topology.declare(&channel).await?;
        let mut confirms = Vec::with_capacity(256);
        for number in 0..batch.messages {
            let properties = BasicProperties::default().with_message_id(batch.key(number).into());
            let confirm = self
                .publisher
                .basic_publish(
                    "".into(),
                    batch.name.as_str().into(),
                    BasicPublishOptions::default(),
                    number.to_string().as_bytes(),
                    properties,
                )
                .await?;
            confirms.push(confirm);
            if confirms.len() == 256 || number + 1 == batch.messages {
                for confirm in confirms.drain(..) {
                    if !confirm.await?.is_ack() {
                        return Err("a publish was not confirmed".into());
                    }
                }
            }
        }
        let prefetch = u16::try_from(batch.in_flight)?;
        channel
            .basic_qos(prefetch, BasicQosOptions::default())
            .await?;
        let integration = idempotask_lapin::Idempotent::new(
            QUEUE_TASK.clone(),
            idempotask_lapin::MessageId,
            retries,
        )
        .store(shared.store.clone());
        let clocks = Clocks::start(shared, Broker::Rabbitmq).await?;
        let deliveries = channel
            .basic_consume(
                batch.name.as_str().into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        deliveries
            .take(batch.messages)
            .map(|delivery| {
                let (integration, mut redis) = (&integration, shared.redis.clone());
                async move { consume_delivery(batch, integration, &mut redis, delivery?).await }
            })
            .buffer_unordered(batch.in_flight)
            .fold(Ok(()), |done: Result<(), QueueError>, one| async move {
                done.and(one)
            })
            .await?;
        let cost = clocks.stop().await?;
        channel.close(200, "done".into()).await?;
        Ok(cost)
    }
}

/// One delivery through the batch's consumer, acked once handled.
async fn consume_delivery(
    batch: &Batch,
    integration: &idempotask_lapin::Idempotent<idempotask_lapin::MessageId>,
    redis: &mut ConnectionManager,
    delivery: lapin::message::Delivery,
) -> Result<(), QueueError> {
    let bodies = &batch.bodies;
    match batch.consumer {
        Consumer::Bare => {
            bodies.run(&delivery.data);
            delivery.ack(BasicAckOptions::default()).await?;
        }
        Consumer::Handwritten => {
            let key = delivery
                .properties
                .message_id()
                .as_ref()
                .ok_or("a delivery without its message_id")?
                .to_string();
            match handwritten(redis, &key, || bodies.run(&delivery.data)).await? {
                Handwritten::Busy => {
                    let requeue = BasicNackOptions {
                        requeue: true,
                        multiple: false,
                    };
                    delivery.nack(requeue).await?;
                    return Err(format!("{key} was busy").into());
                }
                Handwritten::Done | Handwritten::Replayed => {
                    delivery.ack(BasicAckOptions::default()).await?;
                }
            }
        }
        Consumer::Idempotask => {
            let settled = integration
                .process(delivery, |delivery| {
                    let value = bodies.run(&delivery.data);
                    async move { Ok::<_, std::convert::Infallible>(value) }
                })
                .await
                .map_err(|err| err.to_string())?;
            if !matches!(settled, idempotask_lapin::Settled::Acked(_)) {
                return Err(format!("not acked: {settled:?}").into());
            }
        }
    }
    Ok(())
}
