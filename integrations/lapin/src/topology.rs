//! The queues a consumer needs, declared the one way that works: a work queue that dead-letters
//! rejected messages, a retry queue whose expired messages go back to the work queue, and a
//! dead-letter queue that keeps what can never succeed.

use std::time::Duration;

use lapin::options::{
    BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions, QueueBindOptions,
    QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Confirmation, ExchangeKind};

/// The names of a work queue and of the queues and exchange around it; [`declare`](Self::declare)
/// creates them.
///
/// | name | what it is |
/// | --- | --- |
/// | [`queue`](Self::queue) (`orders`) | the work queue the consumer reads; its dead-letter exchange is the one below |
/// | [`retry_queue`](Self::retry_queue) (`orders.retry`) | no consumer; each message waits out its own `expiration`, then is dead-lettered through the default exchange back to the work queue |
/// | [`dead_letter_exchange`](Self::dead_letter_exchange) (`orders.dead-letter`) | a fanout exchange that receives what the work queue rejects without requeue |
/// | [`dead_letter_queue`](Self::dead_letter_queue) (`orders.dead`) | bound to it: the messages that can never succeed, for an operator |
///
/// Every queue is durable and a classic queue; messages published to the retry queue are
/// persistent when the original was. Declaring a queue that exists with other arguments fails
/// with `PRECONDITION_FAILED`: declare these names only through this type, or give it the names
/// of queues declared the same way.
///
/// ```no_run
/// use idempotask_lapin::Topology;
/// # async fn demo(channel: lapin::Channel) -> Result<(), lapin::Error> {
/// let topology = Topology::new("orders");
/// let retries = topology.declare(&channel).await?;
/// assert_eq!(retries.queue(), "orders.retry");
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    queue: String,
    retry_queue: String,
    dead_letter_exchange: String,
    dead_letter_queue: String,
}

impl Topology {
    /// The topology around the work queue `queue`, the other names derived from it
    /// (`<queue>.retry`, `<queue>.dead-letter`, `<queue>.dead`).
    ///
    /// ```
    /// let topology = idempotask_lapin::Topology::new("orders");
    /// assert_eq!(topology.dead_letter_queue(), "orders.dead");
    /// ```
    pub fn new(queue: impl Into<String>) -> Self {
        let queue = queue.into();
        Self {
            retry_queue: format!("{queue}.retry"),
            dead_letter_exchange: format!("{queue}.dead-letter"),
            dead_letter_queue: format!("{queue}.dead"),
            queue,
        }
    }

    /// Names the retry queue instead of `<queue>.retry`.
    #[must_use]
    pub fn retry_queue_named(mut self, name: impl Into<String>) -> Self {
        self.retry_queue = name.into();
        self
    }

    /// Names the dead-letter exchange and queue instead of `<queue>.dead-letter` and
    /// `<queue>.dead`.
    #[must_use]
    pub fn dead_letter_named(
        mut self,
        exchange: impl Into<String>,
        queue: impl Into<String>,
    ) -> Self {
        self.dead_letter_exchange = exchange.into();
        self.dead_letter_queue = queue.into();
        self
    }

    /// The work queue.
    pub fn queue(&self) -> &str {
        &self.queue
    }

    /// The queue where a message waits before it is delivered again.
    pub fn retry_queue(&self) -> &str {
        &self.retry_queue
    }

    /// The exchange rejected messages are dead-lettered to.
    pub fn dead_letter_exchange(&self) -> &str {
        &self.dead_letter_exchange
    }

    /// The queue that keeps the dead-lettered messages.
    pub fn dead_letter_queue(&self) -> &str {
        &self.dead_letter_queue
    }

    /// Declares the exchange and the three queues (idempotent when they exist as declared here),
    /// turns on publisher confirms on `channel`, and answers the [`RetryQueue`] a consumer
    /// publishes its delayed redeliveries to, on that channel (and its deliveries held in
    /// doubt, to the dead-letter exchange).
    ///
    /// # Errors
    /// The broker's error: a queue of one of these names exists with other arguments
    /// (`PRECONDITION_FAILED`), the user may not configure them, the channel is closed.
    pub async fn declare(&self, channel: &Channel) -> Result<RetryQueue, lapin::Error> {
        let durable = QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        };
        channel
            .exchange_declare(
                self.dead_letter_exchange.as_str().into(),
                ExchangeKind::Fanout,
                ExchangeDeclareOptions {
                    durable: true,
                    ..ExchangeDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await?;
        channel
            .queue_declare(
                self.dead_letter_queue.as_str().into(),
                durable,
                FieldTable::default(),
            )
            .await?;
        channel
            .queue_bind(
                self.dead_letter_queue.as_str().into(),
                self.dead_letter_exchange.as_str().into(),
                "".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await?;
        let mut work = FieldTable::default();
        work.insert(
            "x-dead-letter-exchange".into(),
            long_string(&self.dead_letter_exchange),
        );
        channel
            .queue_declare(self.queue.as_str().into(), durable, work)
            .await?;
        // Expired messages leave through the default exchange, which routes by queue name.
        let mut retry = FieldTable::default();
        retry.insert("x-dead-letter-exchange".into(), long_string(""));
        retry.insert("x-dead-letter-routing-key".into(), long_string(&self.queue));
        channel
            .queue_declare(self.retry_queue.as_str().into(), durable, retry)
            .await?;
        Ok(RetryQueue::new(channel.clone(), self.retry_queue.clone())
            .await?
            .dead_letter_exchange(self.dead_letter_exchange.clone()))
    }
}

pub(crate) fn long_string(value: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(value.as_bytes().to_vec()))
}

/// Where a consumer sends a delivery to be delivered again later: a queue without consumers whose
/// messages expire after their own `expiration` into the work queue (see [`Topology`]), published
/// to on a channel with publisher confirms.
///
/// Made by [`Topology::declare`], or by [`new`](Self::new) for a retry queue declared elsewhere
/// (it must dead-letter to the work queue: `x-dead-letter-exchange = ""` and
/// `x-dead-letter-routing-key = <work queue>`), with the work queue's dead-letter exchange
/// named by [`dead_letter_exchange`](Self::dead_letter_exchange).
///
/// # Behaviour
/// It publishes on its channel for life: when that channel closes (a channel error, the
/// connection lost), every publish fails with [`PublishError::ChannelClosed`] and the deliveries
/// are held for their delay and requeued (see [`Decision::settle`](crate::Decision::settle));
/// make a new one on a new channel when the consumer reconnects.
#[derive(Clone)]
pub struct RetryQueue {
    channel: Channel,
    queue: String,
    dead_letter_exchange: Option<String>,
}

impl std::fmt::Debug for RetryQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RetryQueue")
            .field("queue", &self.queue)
            .field("dead_letter_exchange", &self.dead_letter_exchange)
            .field("channel", &self.channel.id())
            .finish()
    }
}

impl RetryQueue {
    /// Publishes to the existing queue `queue` on `channel`, turning on publisher confirms there.
    ///
    /// # Errors
    /// The broker's error when confirms cannot be turned on (a closed channel, one in
    /// transaction mode).
    pub async fn new(channel: Channel, queue: impl Into<String>) -> Result<Self, lapin::Error> {
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        Ok(Self {
            channel,
            queue: queue.into(),
            dead_letter_exchange: None,
        })
    }

    /// Names the work queue's dead-letter exchange, which [`Topology::declare`] does itself: a
    /// delivery whose unit is held in doubt is then published there with its reason in the
    /// headers ([`REASON_HEADER`](crate::REASON_HEADER), [`ERROR_HEADER`](crate::ERROR_HEADER))
    /// rather than rejected to it without them (see the [crate docs](crate)).
    #[must_use]
    pub fn dead_letter_exchange(mut self, exchange: impl Into<String>) -> Self {
        self.dead_letter_exchange = Some(exchange.into());
        self
    }

    /// The retry queue's name.
    pub fn queue(&self) -> &str {
        &self.queue
    }

    /// Publishes `data` with `properties` (`expiration` set to `delay`) and waits for the broker
    /// to confirm it.
    pub(crate) async fn publish(
        &self,
        data: &[u8],
        properties: BasicProperties,
        delay: Duration,
    ) -> Result<(), PublishError> {
        let expiration = ShortString::from(delay.as_millis().to_string());
        let properties = properties.with_expiration(expiration);
        self.confirmed("", &self.queue, data, properties).await
    }

    /// Publishes `data` with `properties` to the dead-letter exchange, when one is named, under
    /// `routing_key` (as the broker's own dead-lettering keeps it), and waits for the broker to
    /// confirm it; `None` when none is named.
    pub(crate) async fn dead_letter(
        &self,
        data: &[u8],
        properties: BasicProperties,
        routing_key: &str,
    ) -> Option<Result<(), PublishError>> {
        let exchange = self.dead_letter_exchange.as_deref()?;
        Some(
            self.confirmed(exchange, routing_key, data, properties)
                .await,
        )
    }

    /// Input: a message and where to publish it. Output: whether the broker confirmed that a
    /// queue took it.
    async fn confirmed(
        &self,
        exchange: &str,
        routing_key: &str,
        data: &[u8],
        properties: BasicProperties,
    ) -> Result<(), PublishError> {
        if !self.channel.status().connected() {
            return Err(PublishError::ChannelClosed);
        }
        let confirm = self
            .channel
            .basic_publish(
                exchange.into(),
                routing_key.into(),
                BasicPublishOptions {
                    mandatory: true,
                    ..BasicPublishOptions::default()
                },
                data,
                properties,
            )
            .await?
            .await?;
        match confirm {
            Confirmation::Ack(None) => Ok(()),
            Confirmation::Ack(Some(_)) => Err(PublishError::Unroutable),
            Confirmation::Nack(_) => Err(PublishError::Nacked),
            Confirmation::NotRequested => Err(PublishError::NotConfirmed),
        }
    }
}

/// Why a delayed redelivery (or a copy for the dead-letter exchange) was not published.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PublishError {
    /// The broker or the channel failed.
    #[error(transparent)]
    Broker(#[from] lapin::Error),
    /// The broker refused the message (`basic.nack`: an internal error of the queue).
    #[error("the broker refused the message (basic.nack)")]
    Nacked,
    /// No queue took the message, so it went nowhere: no queue of the retry queue's name
    /// exists (or none is bound to the dead-letter exchange).
    #[error(
        "no queue took the message: the retry queue does not exist, or no queue is bound to the dead-letter exchange; declare them (`Topology::declare`)"
    )]
    Unroutable,
    /// The retry queue's channel is closed; it does not reopen. Make a new [`RetryQueue`]
    /// ([`Topology::declare`] on a new channel) and a new consumer with it.
    #[error(
        "the retry queue's channel is closed; make a new `RetryQueue` (`Topology::declare` on a new channel)"
    )]
    ChannelClosed,
    /// The channel is not in confirm mode, so the broker never said whether it took the message.
    #[error(
        "the retry queue's channel has no publisher confirms; make the `RetryQueue` with `RetryQueue::new` or `Topology::declare`"
    )]
    NotConfirmed,
}
