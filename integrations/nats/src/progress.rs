//! Progress acks: how a message being worked on keeps JetStream from delivering it again.

use std::convert::Infallible;
use std::time::Duration;

use async_nats::jetstream::{AckKind, Message};

/// Sends `+WPI` for `message` every `every`, for as long as it is polled; it never ends.
///
/// Each progress ack restarts the consumer's AckWait for this message. A lost one costs nothing
/// as long as the next arrives in time, which is why `every` is a third of the clock it beats.
pub(crate) async fn in_progress(message: &Message, every: Duration) -> Infallible {
    loop {
        tokio::time::sleep(every).await;
        // A progress ack that cannot be sent means the connection is down; the final ack
        // reports that, and until then there is nothing better to do than to try again.
        let _ = message.ack_with(AckKind::Progress).await;
    }
}
