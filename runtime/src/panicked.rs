//! A panic in a task's body, caught and turned into a value: what the queue and HTTP
//! integrations settle a delivery with, as they would a body's error.

use std::any::Any;
use std::future::{Future, poll_fn};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::pin;
use std::task::Poll;

/// A panic raised while a call ran, caught by [`catch_panic`]: its message, as `panic!`
/// formatted it.
///
/// A panicking body is a failed body like one that returned `Err`: the runner has released its
/// lock and stored nothing. The queue integrations count it against their `max_failures`,
/// retry it with backoff and dead-letter it like any failure, so a panic never leaves a
/// delivery unsettled.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let caught = idempotask::catch_panic(async { panic!("card {} declined", 42) }).await;
/// let panic: idempotask::Panicked = caught.unwrap_err();
/// assert_eq!(panic.message(), "card 42 declined");
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the task panicked: {message}")]
pub struct Panicked {
    message: String,
}

impl Panicked {
    /// The panic's message; a payload that is not a string (from `std::panic::panic_any`) reads
    /// `"a panic without a message"`.
    pub fn message(&self) -> &str {
        &self.message
    }

    fn from_payload(payload: &(dyn Any + Send)) -> Self {
        let message = if let Some(message) = payload.downcast_ref::<&'static str>() {
            (*message).to_owned()
        } else if let Some(message) = payload.downcast_ref::<String>() {
            message.clone()
        } else {
            "a panic without a message".to_owned()
        };
        Self { message }
    }
}

/// Input: a future, typically a task's [`Call`](crate::Call) being run. Output: its output, or
/// the panic raised while it was polled, as [`Panicked`].
///
/// The runner releases the lock of a body that panics and then lets the panic go on; an
/// integration that must settle every delivery catches it here, around the whole call, so that
/// a panic in the body or in the result's `Serialize` becomes a failure it can count.
///
/// The future is asserted unwind-safe: what a panic leaves half-updated is the future's own
/// state, which is dropped with it.
///
/// # Errors
/// [`Panicked`] when polling the future panicked; the future is dropped.
///
/// ```
/// use idempotask::{MemoryStore, Task, catch_panic};
///
/// static SEND: Task = Task::new("send_receipt");
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let call = SEND.call("receipt-9").store(MemoryStore::new());
/// let ran = catch_panic(call.run(async { panic!("smtp refused") as Result<(), idempotask::Error> })).await;
/// assert_eq!(ran.unwrap_err().message(), "smtp refused");
/// # }
/// ```
pub async fn catch_panic<F: Future>(future: F) -> Result<F::Output, Panicked> {
    catching_panics(future)
        .await
        .map_err(|payload| Panicked::from_payload(&*payload))
}

/// A panic's payload, as `std::panic::resume_unwind` takes it back.
pub(crate) type Panic = Box<dyn Any + Send>;

/// Input: a future. Output: a future that yields its output, or the payload of a panic raised
/// while polling it: the runner releases the body's lock before the panic resumes.
pub(crate) async fn catching_panics<F: Future>(future: F) -> Result<F::Output, Panic> {
    let mut future = pin!(future);
    poll_fn(
        |cx| match catch_unwind(AssertUnwindSafe(|| future.as_mut().poll(cx))) {
            Ok(Poll::Ready(output)) => Poll::Ready(Ok(output)),
            Ok(Poll::Pending) => Poll::Pending,
            Err(payload) => Poll::Ready(Err(payload)),
        },
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn reads_the_message_of_every_kind_of_payload() {
        let literal = catch_panic(async { panic!("literal") }).await.unwrap_err();
        assert_eq!(literal.message(), "literal");
        let formatted = catch_panic(async { panic!("order {}", 7) })
            .await
            .unwrap_err();
        assert_eq!(formatted.message(), "order 7");
        let any = catch_panic(async { std::panic::panic_any(7_u8) })
            .await
            .unwrap_err();
        assert_eq!(any.message(), "a panic without a message");
        assert_eq!(catch_panic(async { 5 }).await, Ok(5));
    }
}
