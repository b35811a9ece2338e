//! One SQS message as the consumer hands it to a body: its id, body, attributes and counts.

use std::collections::BTreeMap;

use aws_sdk_sqs::types::MessageSystemAttributeName;
use serde::de::DeserializeOwned;

/// One message of the queue: its id, its body, its string and number message attributes, how
/// many times SQS has handed it out, and its FIFO message group.
///
/// ```
/// use idempotask_sqs::Message;
///
/// let message = Message::new("m-1", r#"{"amount":5}"#).with_attribute("order_id", "7");
/// assert_eq!(message.id(), "m-1");
/// assert_eq!(message.attribute("order_id"), Some("7"));
/// assert_eq!(message.receive_count(), 1);
/// assert_eq!(message.receipt_handle(), "");
///
/// #[derive(serde::Deserialize)]
/// struct Order { amount: u32 }
/// let order: Order = message.json().unwrap();
/// assert_eq!(order.amount, 5);
/// assert!(Message::new("m-2", "not json").json::<Order>().is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    id: String,
    pub(crate) receipt: String,
    body: String,
    attributes: BTreeMap<String, String>,
    receive_count: u32,
    group: Option<String>,
}

impl Message {
    /// A message with `id` and `body`, received once, in no group (for tests, and for bodies
    /// called outside a consumer).
    ///
    /// ```
    /// use idempotask_sqs::Message;
    /// let message = Message::new("m-1", "{}");
    /// assert_eq!((message.id(), message.body(), message.receive_count()), ("m-1", "{}", 1));
    /// ```
    pub fn new(id: impl Into<String>, body: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            receipt: String::new(),
            body: body.into(),
            attributes: BTreeMap::new(),
            receive_count: 1,
            group: None,
        }
    }

    /// The message with the string message attribute `name` set to `value`.
    #[must_use]
    ///
    /// ```
    /// use idempotask_sqs::Message;
    /// let message = Message::new("m-1", "{}").with_attribute("order_id", "7");
    /// assert_eq!(message.attribute("order_id"), Some("7"));
    /// ```
    pub fn with_attribute(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.attributes.insert(name.into(), value.into());
        self
    }

    /// The message in the FIFO message group `group`.
    #[must_use]
    ///
    /// ```
    /// use idempotask_sqs::Message;
    /// assert_eq!(Message::new("m-1", "{}").with_group("customer-3").group(), Some("customer-3"));
    /// ```
    pub fn with_group(mut self, group: impl Into<String>) -> Self {
        self.group = Some(group.into());
        self
    }

    /// The id SQS gave the message when it was sent (the same on every receive of it).
    ///
    /// ```
    /// use idempotask_sqs::Message;
    /// assert_eq!(Message::new("5fea7756", "{}").id(), "5fea7756");
    /// ```
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The message's body.
    ///
    /// ```
    /// use idempotask_sqs::Message;
    /// assert_eq!(Message::new("m-1", r#"{"id":5}"#).body(), r#"{"id":5}"#);
    /// ```
    pub fn body(&self) -> &str {
        &self.body
    }

    /// The value of the message attribute `name`, of type `String` or `Number` (a `Number`'s
    /// value is its text); `None` when the message has none, or a binary one.
    ///
    /// ```
    /// use idempotask_sqs::Message;
    /// let message = Message::new("m-1", "{}").with_attribute("order_id", "7");
    /// assert_eq!(message.attribute("order_id"), Some("7"));
    /// assert_eq!(message.attribute("refund_id"), None);
    /// ```
    pub fn attribute(&self, name: &str) -> Option<&str> {
        self.attributes.get(name).map(String::as_str)
    }

    /// Every string and number message attribute, by name.
    ///
    /// ```
    /// use idempotask_sqs::Message;
    /// let message = Message::new("m-1", "{}").with_attribute("b", "2").with_attribute("a", "1");
    /// assert_eq!(message.attributes().collect::<Vec<_>>(), [("a", "1"), ("b", "2")]);
    /// ```
    pub fn attributes(&self) -> impl Iterator<Item = (&str, &str)> {
        self.attributes
            .iter()
            .map(|(name, value)| (name.as_str(), value.as_str()))
    }

    /// How many times SQS has handed the message out, this receive included
    /// (`ApproximateReceiveCount`): 1 on its first receive.
    ///
    /// ```
    /// use idempotask_sqs::Message;
    /// assert_eq!(Message::new("m-1", "{}").receive_count(), 1);
    /// ```
    pub fn receive_count(&self) -> u32 {
        self.receive_count
    }

    /// The receipt handle of this receive, for a call of your own on the message (a
    /// `ChangeMessageVisibility` of a body that knows it needs longer); empty for a message
    /// made with [`new`](Self::new). The consumer deletes or hands back the message itself:
    /// a body that deletes it before its work is done loses it if the work fails.
    ///
    /// ```
    /// use idempotask_sqs::Message;
    /// assert_eq!(Message::new("m-1", "{}").receipt_handle(), "");
    /// ```
    pub fn receipt_handle(&self) -> &str {
        &self.receipt
    }

    /// The message's FIFO message group (`MessageGroupId`); `None` on a standard queue.
    ///
    /// ```
    /// use idempotask_sqs::Message;
    /// assert_eq!(Message::new("m-1", "{}").group(), None);
    /// ```
    pub fn group(&self) -> Option<&str> {
        self.group.as_deref()
    }

    /// The body decoded from JSON: what a body's closure calls before it returns the body, so
    /// that a message that does not decode is rejected with a [`BadMessage`] instead of being
    /// run and retried.
    ///
    /// # Errors
    /// [`BadMessage`] when the body is not JSON of type `T`.
    ///
    /// ```
    /// use idempotask_sqs::Message;
    /// let ids: Vec<u32> = Message::new("m-1", "[1, 2]").json().unwrap();
    /// assert_eq!(ids, [1, 2]);
    /// ```
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, BadMessage> {
        serde_json::from_str(&self.body).map_err(|err| {
            BadMessage::new(self, format!("its body is not the expected JSON: {err}"))
        })
    }

    /// The bytes the payload check hashes: the body, then every attribute and value, each
    /// prefixed with its length.
    pub(crate) fn payload(&self) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(self.body.len() + 8);
        let parts = std::iter::once(self.body.as_str()).chain(
            self.attributes
                .iter()
                .flat_map(|(name, value)| [name.as_str(), value.as_str()]),
        );
        for part in parts {
            bytes.extend_from_slice(&(part.len() as u64).to_be_bytes());
            bytes.extend_from_slice(part.as_bytes());
        }
        bytes
    }

    /// Input: a message of a `ReceiveMessage` reply. Output: the message, or `None` for one
    /// without an id or a receipt handle (SQS always sends both).
    pub(crate) fn from_sdk(message: &aws_sdk_sqs::types::Message) -> Option<Self> {
        let system = message.attributes();
        let system = |name: MessageSystemAttributeName| system.and_then(|all| all.get(&name));
        let attributes = message
            .message_attributes()
            .into_iter()
            .flatten()
            .filter_map(|(name, value)| Some((name.clone(), value.string_value()?.to_owned())))
            .collect();
        Some(Self {
            id: message.message_id()?.to_owned(),
            receipt: message.receipt_handle()?.to_owned(),
            body: message.body().unwrap_or_default().to_owned(),
            attributes,
            receive_count: system(MessageSystemAttributeName::ApproximateReceiveCount)
                .and_then(|count| count.parse().ok())
                .unwrap_or(1),
            group: system(MessageSystemAttributeName::MessageGroupId).cloned(),
        })
    }
}

/// A message the body cannot take: its body does not decode, or a check of the body's own
/// failed. Nothing ran; the message is not deleted (a redelivery would bring the same body):
/// it goes the way of every rejected message, to the queue's redrive policy.
///
/// ```
/// use idempotask_sqs::{BadMessage, Message};
///
/// let message = Message::new("m-5", "not json");
/// let err: BadMessage = message.json::<u32>().unwrap_err();
/// assert_eq!(err.message_id(), "m-5");
/// assert!(err.to_string().starts_with("message m-5 cannot be handled: its body is not the expected JSON"));
/// let err = BadMessage::new(&message, "the amount is negative");
/// assert_eq!(err.to_string(), "message m-5 cannot be handled: the amount is negative");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("message {message_id} cannot be handled: {why}")]
pub struct BadMessage {
    message_id: String,
    why: String,
}

impl BadMessage {
    /// `message` cannot be handled, for the reason `why`.
    ///
    /// ```
    /// use idempotask_sqs::{BadMessage, Message};
    /// let err = BadMessage::new(&Message::new("m-2", "{}"), "the amount is negative");
    /// assert_eq!(err.to_string(), "message m-2 cannot be handled: the amount is negative");
    /// ```
    pub fn new(message: &Message, why: impl Into<String>) -> Self {
        Self {
            message_id: message.id.clone(),
            why: why.into(),
        }
    }

    /// The id of the message.
    ///
    /// ```
    /// use idempotask_sqs::{BadMessage, Message};
    /// assert_eq!(BadMessage::new(&Message::new("m-2", "{}"), "bad").message_id(), "m-2");
    /// ```
    pub fn message_id(&self) -> &str {
        &self.message_id
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_payload_tells_attributes_apart_from_their_split() {
        let one = Message::new("1", "b").with_attribute("ab", "c").payload();
        let other = Message::new("1", "b").with_attribute("a", "bc").payload();
        assert_ne!(one, other);
    }
}
