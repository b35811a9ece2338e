//! Where a message's idempotency key comes from: the producer's `Nats-Msg-Id`, or the message.

use async_nats::header::NATS_MESSAGE_ID;
use async_nats::jetstream::Message;

/// Where the idempotency key of a JetStream message comes from.
///
/// Implemented for every `Fn(&Message) -> Option<String>` (a key read from the subject, a
/// header or the decoded payload; `None` when the message has none) and for [`MsgId`] (the
/// `Nats-Msg-Id` header the producer published with).
///
/// The key must name one business operation: two messages that must not both take effect get
/// the same key, two that must both take effect get different ones. A value made up by the
/// consumer (a UUID, the delivery count, the stream sequence of a message the producer may have
/// published twice) defeats the point.
///
/// ```
/// use async_nats::jetstream::Message;
/// use idempotask_nats::MessageKey;
///
/// #[derive(serde::Deserialize)]
/// struct Order { id: u64 }
///
/// // The key from the decoded payload: a message that does not decode has none.
/// let by_order = |message: &Message| {
///     let order: Order = serde_json::from_slice(&message.payload).ok()?;
///     Some(format!("order-charge-{}", order.id))
/// };
/// # fn assert_key<K: MessageKey>(_: &K) {}
/// assert_key(&by_order);
/// ```
pub trait MessageKey: Send + Sync + 'static {
    /// The key of `message`.
    ///
    /// # Errors
    /// [`MissingKey`] when the message carries no key; it is then terminated, not run.
    fn key(&self, message: &Message) -> Result<String, MissingKey>;
}

impl<F> MessageKey for F
where
    F: Fn(&Message) -> Option<String> + Send + Sync + 'static,
{
    fn key(&self, message: &Message) -> Result<String, MissingKey> {
        self(message).ok_or_else(|| MissingKey::of(message, "the key function found none"))
    }
}

/// The key the producer published the message with: its `Nats-Msg-Id` header
/// (`PublishMessage::message_id` in async-nats, `-H Nats-Msg-Id:…` in the `nats` CLI).
///
/// JetStream itself drops a second publish with the same id, but only within the stream's
/// duplicate window (two minutes by default), and it never stops a *redelivery* of the one
/// message it kept: the id as idempotask's key covers both, for as long as the task keeps
/// results. A message published without the header (or with an empty one) fails with
/// [`MissingKey`] and is terminated: running it unprotected would silently drop the guarantee.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MsgId;

impl MessageKey for MsgId {
    fn key(&self, message: &Message) -> Result<String, MissingKey> {
        message
            .headers
            .as_ref()
            .and_then(|headers| headers.get(NATS_MESSAGE_ID))
            .map(|id| id.as_str().to_owned())
            .filter(|id| !id.is_empty())
            .ok_or_else(|| MissingKey::of(message, "it has no `Nats-Msg-Id` header"))
    }
}

/// A message that carries no idempotency key where one was expected.
///
/// Nothing ran and the message is terminated (`AckKind::Term`): no redelivery can bring a key.
/// Publish it with a `Nats-Msg-Id`, or key the task by something the message does carry.
///
/// ```
/// use idempotask_nats::MissingKey;
/// let err = MissingKey::new("orders.created", Some(17));
/// assert_eq!(err.subject(), "orders.created");
/// assert_eq!(err.stream_sequence(), Some(17));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "message {} on `{subject}` has no idempotency key ({why}); publish it with a `Nats-Msg-Id`, or key the task by what the message carries",
    .stream_sequence.map_or_else(|| "(without a stream sequence)".to_owned(), |seq| format!("#{seq}"))
)]
pub struct MissingKey {
    subject: String,
    stream_sequence: Option<u64>,
    why: &'static str,
}

impl MissingKey {
    /// The error for the message on `subject` at `stream_sequence` (for [`MessageKey`]
    /// implementations).
    pub fn new(subject: impl Into<String>, stream_sequence: Option<u64>) -> Self {
        Self {
            subject: subject.into(),
            stream_sequence,
            why: "none was found",
        }
    }

    fn of(message: &Message, why: &'static str) -> Self {
        Self {
            subject: message.subject.to_string(),
            stream_sequence: message.info().ok().map(|info| info.stream_sequence),
            why,
        }
    }

    /// The subject the message was published on.
    pub fn subject(&self) -> &str {
        &self.subject
    }

    /// The message's sequence in its stream, when its reply subject says.
    pub fn stream_sequence(&self) -> Option<u64> {
        self.stream_sequence
    }
}
