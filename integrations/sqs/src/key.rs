//! Where a message's idempotency key comes from: a message attribute the producer set, the
//! message id, or a function of the message.

use crate::Message;

/// Where the idempotency key of an SQS message comes from.
///
/// Implemented for [`Attribute`] (a message attribute the producer set), [`MessageId`] (the id
/// SQS gave the message) and every `Fn(&Message) -> Option<String>` (`None` when the message
/// has no key).
///
/// The key must name one business operation: two messages that must not both take effect get
/// the same key. A producer that retries a `SendMessage` after a lost reply sends the message
/// twice, under two ids: only a key the producer chose ([`Attribute`]) makes the two one unit.
///
/// ```
/// use idempotask_sqs::{Attribute, Message, MessageKey};
///
/// let message = Message::new("m-1", "{}").with_attribute("order_id", "7");
/// assert_eq!(Attribute::new("order_id").key(&message).unwrap(), "7");
/// assert!(Attribute::new("refund_id").key(&message).is_err());
/// let prefixed = |message: &Message| message.attribute("order_id").map(|id| format!("order-{id}"));
/// assert_eq!(prefixed.key(&message).unwrap(), "order-7");
/// ```
pub trait MessageKey: Send + Sync + 'static {
    /// The key of `message`.
    ///
    /// # Errors
    /// [`MissingKey`] when the message carries none: it is then rejected, never run.
    fn key(&self, message: &Message) -> Result<String, MissingKey>;
}

impl<F> MessageKey for F
where
    F: Fn(&Message) -> Option<String> + Send + Sync + 'static,
{
    fn key(&self, message: &Message) -> Result<String, MissingKey> {
        self(message).ok_or_else(|| MissingKey::new(message, "the key function found none"))
    }
}

/// The key is the value of a `String` or `Number` message attribute the producer set
/// (`--message-attributes order_id={DataType=String,StringValue=7}`). A message without it or
/// with an empty one is rejected with [`MissingKey`], never run unprotected.
///
/// ```
/// use idempotask_sqs::{Attribute, Message, MessageKey};
/// let by_order = Attribute::new("order_id");
/// assert_eq!(by_order.name(), "order_id");
/// let empty = Message::new("m-3", "{}").with_attribute("order_id", "");
/// assert_eq!(by_order.key(&empty).unwrap_err().message_id(), "m-3");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attribute(String);

impl Attribute {
    /// The key is the value of the message attribute `name`.
    ///
    /// ```
    /// use idempotask_sqs::Attribute;
    /// assert_eq!(Attribute::new("order_id").name(), "order_id");
    /// ```
    pub fn new(name: impl Into<String>) -> Self {
        Self(name.into())
    }

    /// The attribute's name.
    ///
    /// ```
    /// use idempotask_sqs::Attribute;
    /// assert_eq!(Attribute::new("order_id").name(), "order_id");
    /// ```
    pub fn name(&self) -> &str {
        &self.0
    }
}

impl MessageKey for Attribute {
    fn key(&self, message: &Message) -> Result<String, MissingKey> {
        match message.attribute(&self.0) {
            None => Err(MissingKey::new(
                message,
                format!("it has no `{}` string or number attribute", self.0),
            )),
            Some("") => Err(MissingKey::new(
                message,
                format!("its `{}` attribute is empty", self.0),
            )),
            Some(value) => Ok(value.to_owned()),
        }
    }
}

/// The key is the message's id. Every receive of one message (a redelivery after a crash, a
/// retry) is then one unit; a message the producer sent twice is two. Prefer an
/// [`Attribute`] the producer chose when it may retry its `SendMessage`.
///
/// ```
/// use idempotask_sqs::{Message, MessageId, MessageKey};
/// assert_eq!(MessageId.key(&Message::new("5fea7756-0ea4", "{}")).unwrap(), "5fea7756-0ea4");
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MessageId;

impl MessageKey for MessageId {
    fn key(&self, message: &Message) -> Result<String, MissingKey> {
        Ok(message.id().to_owned())
    }
}

/// A message that carries no idempotency key where one was expected. Nothing ran, and the
/// message is not deleted: no redelivery can bring a key, so it goes to the queue's redrive
/// policy (its dead-letter queue) with the other rejected messages.
///
/// ```
/// use idempotask_sqs::{Attribute, Message, MessageKey};
/// let err = Attribute::new("order_id").key(&Message::new("m-9", "{}")).unwrap_err();
/// assert_eq!(
///     err.to_string(),
///     "message m-9 has no idempotency key (it has no `order_id` string or number attribute); add it to the message, or key the task by what the message carries"
/// );
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "message {message_id} has no idempotency key ({why}); add it to the message, or key the task by what the message carries"
)]
pub struct MissingKey {
    message_id: String,
    why: String,
}

impl MissingKey {
    /// `message` has no key, for the reason `why` (for [`MessageKey`] implementations).
    ///
    /// ```
    /// use idempotask_sqs::{Message, MissingKey};
    /// let err = MissingKey::new(&Message::new("m-4", "{}"), "its tenant is unknown");
    /// assert!(err.to_string().starts_with("message m-4 has no idempotency key (its tenant is unknown)"));
    /// ```
    pub fn new(message: &Message, why: impl Into<String>) -> Self {
        Self {
            message_id: message.id().to_owned(),
            why: why.into(),
        }
    }

    /// The id of the message.
    ///
    /// ```
    /// use idempotask_sqs::{Message, MissingKey};
    /// assert_eq!(MissingKey::new(&Message::new("m-4", "{}"), "none").message_id(), "m-4");
    /// ```
    pub fn message_id(&self) -> &str {
        &self.message_id
    }
}
