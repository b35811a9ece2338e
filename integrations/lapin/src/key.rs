//! Where a delivery's idempotency key comes from: its AMQP `message_id`, or a function of it.

use lapin::message::Delivery;

/// Where the idempotency key of an AMQP delivery comes from.
///
/// Implemented for [`MessageId`] (the `message_id` property the producer set) and for every
/// `Fn(&Delivery) -> Option<String>`: a key read from the delivery's headers, routing key or
/// decoded payload, `None` when the delivery has none.
///
/// The key must name one business operation: two messages that must not both take effect get the
/// same key, two that must both take effect get different ones. A generated value (a UUID made by
/// the consumer, the delivery tag, the `redelivered` flag) defeats the point.
///
/// ```
/// use idempotask_lapin::DeliveryKey;
/// use lapin::message::Delivery;
///
/// #[derive(serde::Deserialize)]
/// struct Order {
///     order: u64,
/// }
///
/// // The order id inside a JSON payload such as `{"order": 42}`.
/// let by_order = |delivery: &Delivery| {
///     let order: Order = serde_json::from_slice(&delivery.data).ok()?;
///     Some(format!("order-charge-{}", order.order))
/// };
/// let delivery = Delivery::mock(1, "".into(), "orders".into(), false, br#"{"order": 42}"#.to_vec());
/// assert_eq!(by_order.key(&delivery).unwrap(), "order-charge-42");
///
/// let garbage = Delivery::mock(2, "".into(), "orders".into(), false, b"\xff".to_vec());
/// assert!(by_order.key(&garbage).is_err());
/// ```
pub trait DeliveryKey: Send + Sync + 'static {
    /// The key of `delivery`.
    ///
    /// # Errors
    /// [`MissingKey`] when the delivery carries no usable key; it is then rejected to the
    /// dead-letter exchange, not run.
    fn key(&self, delivery: &Delivery) -> Result<String, MissingKey>;
}

impl<F> DeliveryKey for F
where
    F: Fn(&Delivery) -> Option<String> + Send + Sync + 'static,
{
    fn key(&self, delivery: &Delivery) -> Result<String, MissingKey> {
        self(delivery).ok_or_else(|| MissingKey::of(delivery))
    }
}

/// The AMQP `message_id` property the producer set (`BasicProperties::with_message_id`).
///
/// Opt in to it when every producer names each operation in `message_id`. A delivery without one
/// (or with an empty one) is rejected to the dead-letter exchange with [`MissingKey`] and does not
/// run: running it unprotected would silently drop the guarantee.
///
/// ```
/// use idempotask_lapin::{DeliveryKey, MessageId};
/// use lapin::BasicProperties;
/// use lapin::message::Delivery;
///
/// let mut delivery = Delivery::mock(1, "".into(), "orders".into(), false, b"{}".to_vec());
/// assert!(MessageId.key(&delivery).is_err());
/// delivery.properties = BasicProperties::default().with_message_id("order-charge-42".into());
/// assert_eq!(MessageId.key(&delivery).unwrap(), "order-charge-42");
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MessageId;

impl DeliveryKey for MessageId {
    fn key(&self, delivery: &Delivery) -> Result<String, MissingKey> {
        match delivery.properties.message_id() {
            Some(id) if !id.as_str().is_empty() => Ok(id.as_str().to_owned()),
            _ => Err(MissingKey::of(delivery)),
        }
    }
}

/// A delivery that carries no usable idempotency key.
///
/// Nothing ran; the delivery was rejected without requeue, so it went to the work queue's
/// dead-letter exchange. Publish it with a `message_id`, or key the consumer by something every
/// message carries.
///
/// ```
/// use idempotask_lapin::MissingKey;
/// let err = MissingKey::new("orders", 7);
/// assert_eq!((err.routing_key(), err.delivery_tag()), ("orders", 7));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "delivery {delivery_tag} (routing key `{routing_key}`) has no idempotency key; publish it with a `message_id`, or key the consumer by something every message carries"
)]
pub struct MissingKey {
    routing_key: String,
    delivery_tag: u64,
}

impl MissingKey {
    /// The error for the delivery with `routing_key` and `delivery_tag` (for [`DeliveryKey`]
    /// implementations).
    pub fn new(routing_key: impl Into<String>, delivery_tag: u64) -> Self {
        Self {
            routing_key: routing_key.into(),
            delivery_tag,
        }
    }

    /// The error for `delivery`.
    pub fn of(delivery: &Delivery) -> Self {
        Self::new(delivery.routing_key.as_str(), delivery.delivery_tag)
    }

    /// The routing key the message was published with.
    pub fn routing_key(&self) -> &str {
        &self.routing_key
    }

    /// The delivery tag of the delivery on its channel.
    pub fn delivery_tag(&self) -> u64 {
        self.delivery_tag
    }
}
