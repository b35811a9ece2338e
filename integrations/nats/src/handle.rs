//! Handling one message: the call under its key, the acknowledgement its outcome becomes, and
//! [`AckError`] when that acknowledgement could not be sent.

use crate::consumer::Idempotent;
use crate::failures::MessageHistory;
use crate::handled::takes_term_reason;
use crate::key::MessageKey;
use crate::progress;
use crate::{Handled, Rejection};
use async_nats::jetstream::{AckKind, Message};
use idempotask_consumer::Verdict;
use serde::Serialize;
use serde::de::DeserializeOwned;

impl<K: MessageKey> Idempotent<K> {
    /// Runs `body` for `message` at most once per key, then acks, naks or terminates the
    /// message as its outcome says, and returns the outcome.
    ///
    /// `body` is only polled once the lock is held, so creating it costs nothing and a
    /// duplicate never starts it. Until the acknowledgement is sent, progress acks keep
    /// JetStream from redelivering the message (see [`progress_interval`](Self::progress_interval)).
    /// The body's `Ok` type is stored as JSON, so it must implement `Serialize` and
    /// `DeserializeOwned` (`()` does).
    ///
    /// ```
    /// use idempotask::{MemoryStore, Outcome, Task};
    /// use idempotask_nats::{Handled, Idempotent, MsgId};
    /// # use async_nats::jetstream::Message;
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    /// # // A delivery as a pull consumer hands it over, without a server: its acks queue up.
    /// # let client = async_nats::ConnectOptions::new().retry_on_initial_connect().connect("127.0.0.1:9").await?;
    /// # let mut headers = async_nats::HeaderMap::new();
    /// # headers.insert("Nats-Msg-Id", "order-7");
    /// # let message = Message {
    /// #     message: async_nats::Message {
    /// #         subject: "orders.new".into(),
    /// #         reply: Some("$JS.ACK.ORDERS.charger.1.7.7.1764547200000000000.0".into()),
    /// #         payload: "{}".into(), headers: Some(headers), status: None, description: None, length: 0,
    /// #     },
    /// #     context: async_nats::jetstream::new(client),
    /// # };
    /// let charge_once = Idempotent::new(Task::new("order_charge"), MsgId).store(MemoryStore::new());
    /// let mut outcomes = Vec::new();
    /// for _delivery in 0..2 {
    ///     match charge_once.handle(&message, async { Ok::<_, std::io::Error>(42_u32) }).await? {
    ///         Handled::Acked(report) => outcomes.push((report.value, report.outcome)),
    ///         Handled::Failed { error, delay, .. } => eprintln!("back in {delay:?}: {error}"),
    ///         Handled::Deferred { error, delay, .. } => eprintln!("back in {delay:?}: {error}"),
    ///         Handled::Terminated(why) => eprintln!("dead-lettered: {why}"),
    ///         _ => {}
    ///     }
    /// }
    /// assert_eq!(outcomes, [(42, Outcome::Executed), (42, Outcome::Replayed)]);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`AckError`] when the acknowledgement could not be queued on the connection (the message
    /// has no reply subject, or the client is closed). A queued ack is not confirmed: one lost
    /// with the connection raises no error (see the crate docs). Either way the outcome is in
    /// the store; JetStream delivers the message again after `AckWait`, and that delivery is
    /// replayed or run as the store says. The error carries the outcome
    /// ([`AckError::into_handled`]): the body's value or error is not lost with the ack.
    pub async fn handle<T, E, F>(
        &self,
        message: &Message,
        body: F,
    ) -> Result<Handled<T, E>, AckError<T, E>>
    where
        T: Serialize + DeserializeOwned,
        F: Future<Output = Result<T, E>>,
    {
        let handled = self.process(message, body).await;
        let kind = handled.ack_kind();
        let sent = match (handled.term_reason(), &message.reply) {
            (Some(reason), Some(reply))
                if takes_term_reason(&message.context.client().server_info().version) =>
            {
                let term = format!("+TERM {reason}");
                message
                    .context
                    .client()
                    .publish(reply.clone(), term.into())
                    .await
                    .map_err(Into::into)
            }
            _ => message.ack_with(kind).await,
        };
        match sent {
            Ok(()) => Ok(handled),
            Err(source) => Err(AckError {
                kind,
                handled,
                source,
            }),
        }
    }

    /// Like [`handle`](Self::handle), without sending the final acknowledgement: send
    /// [`handled.ack_kind()`](Handled::ack_kind) yourself, for instance with `double_ack_with`
    /// to wait until JetStream has it, or after writing the result somewhere first.
    ///
    /// Progress acks go out while this runs and stop when it returns: none is still on its way
    /// out then, so the acknowledgement you send after it is the message's last. Acknowledge
    /// before the consumer's `AckWait` has passed, or JetStream delivers the message again
    /// (which is safe: a stored result is replayed).
    pub async fn process<T, E, F>(&self, message: &Message, body: F) -> Handled<T, E>
    where
        T: Serialize + DeserializeOwned,
        F: Future<Output = Result<T, E>>,
    {
        self.check_consumer_once(message);
        let lease = progress::Lease::default();
        let progress = self
            .progress
            .start(message, self.progress_interval(), lease.clone())
            .await;
        let handled = self.decide(message, body, lease).await;
        progress.stop().await;
        handled
    }

    /// What `message` gets once `body` has run, or has not.
    async fn decide<T, E, F>(
        &self,
        message: &Message,
        body: F,
        lease: progress::Lease,
    ) -> Handled<T, E>
    where
        T: Serialize + DeserializeOwned,
        F: Future<Output = Result<T, E>>,
    {
        let key = match self.key.key(message) {
            Ok(key) => key,
            Err(missing) => return Handled::Terminated(Rejection::MissingKey(missing)),
        };
        let history = MessageHistory {
            counts: &self.failures,
            message,
        };
        let body = async move {
            lease.record();
            body.await
        };
        let verdict = self
            .settings
            .run(key, &message.payload, &history, body)
            .await;
        match &verdict {
            Verdict::Retry { failures, .. } => self.failures.record(message, *failures).await,
            Verdict::GiveUp { .. } => self.failures.forget(message),
            _ => {}
        }
        Handled::from_verdict(verdict)
    }
}

/// The acknowledgement of a handled message could not be queued on the connection (the
/// message has no reply subject, or the client is closed). A dropped connection does not
/// always show here: publishing only queues the ack.
///
/// What the message's outcome stored stays stored: JetStream delivers it again after `AckWait`
/// and the redelivery is replayed (or run, if nothing was stored).
#[derive(thiserror::Error)]
#[error(
    "could not send {kind:?} to JetStream; it delivers the message again after AckWait: {source}"
)]
pub struct AckError<T, E> {
    kind: AckKind,
    handled: Handled<T, E>,
    #[source]
    source: Box<dyn std::error::Error + Send + Sync>,
}

impl<T, E> AckError<T, E> {
    /// The acknowledgement that was not sent.
    pub fn ack_kind(&self) -> AckKind {
        self.kind
    }

    /// What became of the message, whose acknowledgement this is.
    pub fn handled(&self) -> &Handled<T, E> {
        &self.handled
    }

    /// What became of the message: the body's value or error, which the failed ack does not
    /// undo.
    pub fn into_handled(self) -> Handled<T, E> {
        self.handled
    }
}

// By hand, so that a value or error without `Debug` still leaves the error printable.
impl<T, E> std::fmt::Debug for AckError<T, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AckError")
            .field("kind", &self.kind)
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}
