//! Progress acks: how a message being worked on keeps JetStream from delivering it again, for
//! as long as its body holds the lock.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_nats::jetstream::{AckKind, Message};
use idempotask::TaskContext;

/// The lock of the body being run, once it has started: what the progress acks follow.
#[derive(Clone, Default)]
pub(crate) struct Lease(Arc<OnceLock<TaskContext>>);

impl Lease {
    /// Records the context of the body being run; called from inside the body, the only place
    /// where idempotask hands it out.
    pub(crate) fn record(&self) {
        if let Some(context) = idempotask::context() {
            let _ = self.0.set(context);
        }
    }

    /// Whether the body has started and its lock is gone: lost to another holder, or its TTL
    /// passed without a renewal.
    fn lost(&self) -> bool {
        self.0.get().is_some_and(|context| !context.lock_held())
    }
}

/// Stops the progress acks when dropped, however the call that started them ends.
pub(crate) struct Progress(Option<tokio::task::JoinHandle<()>>);

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(task) = &self.0 {
            task.abort();
        }
    }
}

/// Input: a message about to be handled. Output: a guard, while which a task of its own sends
/// `+WPI` for the message every `every`, until `lease` says the body's lock is gone.
///
/// Each progress ack restarts the consumer's `AckWait` for this message. A lost one costs
/// nothing as long as the next arrives in time, which is why `every` is a third of the clock it
/// beats. The acks run as a task of their own, not next to the body, so that a body which
/// blocks its thread cannot starve them; and they stop with the lock, so that JetStream
/// redelivers a message whose worker can no longer finish it under its lock. Outside a tokio
/// runtime nothing is sent: idempotask refuses to run the call there anyway.
pub(crate) async fn start(message: &Message, every: Duration, lease: Lease) -> Progress {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return Progress(None);
    };
    let message = message.clone();
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let task = runtime.spawn(async move {
        let _ = started_tx.send(());
        loop {
            tokio::time::sleep(every).await;
            if lease.lost() {
                return;
            }
            // A progress ack that cannot be sent means the connection is down; the final ack
            // reports that, and until then there is nothing better to do than to try again.
            let _ = message.ack_with(AckKind::Progress).await;
        }
    });
    let progress = Progress(Some(task));
    // A task spawned from a worker waits in that worker's own slot, which other workers do not
    // take: were the body to block this thread first, the acks would never start. Once it has
    // been polled, its timer wakes it on whichever worker is free.
    let _ = started_rx.await;
    progress
}
