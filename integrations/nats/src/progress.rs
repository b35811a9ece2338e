//! Progress acks: how a message being worked on keeps JetStream from delivering it again, for
//! as long as its body holds the lock.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};
use std::time::Duration;

use async_nats::Subject;
use async_nats::jetstream::Message;
use idempotask::TaskContext;
use tokio::sync::{Mutex as AsyncMutex, Notify, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;

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

/// A message being handled, whose `+WPI` the ticker sends when it is due.
struct Entry {
    client: async_nats::Client,
    reply: Subject,
    lease: Lease,
    every: Duration,
    due: Instant,
}

#[derive(Default)]
struct State {
    entries: HashMap<u64, Entry>,
    next_id: u64,
    /// The task sending the acks; spawned on the first message, again if its runtime ended.
    task: Option<JoinHandle<()>>,
    /// When the ticker wakes next on its own, once it has run.
    wakes_at: Option<Instant>,
    /// How long the ticker sleeps with no message: the longest interval of the messages added
    /// so far, so that one message with a short `AckWait` does not keep the ticker waking
    /// often for as long as it lives.
    idle: Duration,
}

/// The progress acks of every message one `Idempotent` (and its clones) is handling, sent by one
/// task of their own.
///
/// One task for all messages rather than one per message: a message costs an entry in a map
/// (no task, no timer, no copy of the message), which matters to a consumer with many messages
/// in flight, while each message still gets its `+WPI` every `every`. The task runs on its own,
/// not next to the bodies, so that a body which blocks its thread cannot starve it.
#[derive(Default)]
pub(crate) struct Ticker {
    state: Mutex<State>,
    wake: Arc<Notify>,
    /// Held while the ticker sends a message's `+WPI`, and by [`Progress::stop`]: once a
    /// message's acks are stopped, none of its progress acks is still on its way out, so none
    /// follows its final acknowledgement.
    sending: Arc<AsyncMutex<()>>,
}

impl Drop for Ticker {
    fn drop(&mut self) {
        let state = self.state.get_mut().unwrap_or_else(PoisonError::into_inner);
        if let Some(task) = &state.task {
            task.abort();
        }
    }
}

/// Stops a message's progress acks when dropped, however the call that started them ends;
/// [`stop`](Self::stop) also waits for one that is being sent.
pub(crate) struct Progress {
    ticker: Weak<Ticker>,
    id: u64,
}

impl Progress {
    /// Stops the message's progress acks once none of them is being sent, so that the final
    /// acknowledgement, sent after this on the same connection, is the last word on the
    /// message. A `+WPI` that came after a `-NAK` with a delay would restart the message's
    /// `AckWait` and replace the delay.
    pub(crate) async fn stop(self) {
        if let Some(ticker) = self.ticker.upgrade() {
            let _sending = ticker.sending.lock().await;
            drop(self);
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(ticker) = self.ticker.upgrade() {
            ticker.lock().entries.remove(&self.id);
        }
    }
}

impl Ticker {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic under the lock leaves the map consistent: every change is one call.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Input: a message about to be handled. Output: a guard, while which `+WPI` goes out for
    /// the message every `every`, until `lease` says the body's lock is gone.
    ///
    /// Each progress ack restarts the consumer's `AckWait` for this message. A lost one costs
    /// nothing as long as the next arrives in time, which is why `every` is a third of the
    /// clock it beats. The acks stop with the lock, so that JetStream redelivers a message whose
    /// worker can no longer finish it under its lock. Outside a tokio runtime, or for a message
    /// without a reply subject, nothing is sent: idempotask refuses to run the call there
    /// anyway, and such a message cannot be acked.
    pub(crate) async fn start(
        self: &Arc<Self>,
        message: &Message,
        every: Duration,
        lease: Lease,
    ) -> Progress {
        let ticker = Arc::downgrade(self);
        let (Ok(runtime), Some(reply)) = (tokio::runtime::Handle::try_current(), &message.reply)
        else {
            return Progress { ticker, id: 0 };
        };
        let due = Instant::now() + every;
        let entry = Entry {
            client: message.context.client(),
            reply: reply.clone(),
            lease,
            every,
            due,
        };
        let (id, started) = {
            let mut state = self.lock();
            state.next_id += 1;
            let id = state.next_id;
            state.entries.insert(id, entry);
            state.idle = state.idle.max(every);
            // Waking the ticker costs a thread wake-up; it is needed only if it would sleep
            // past this message's first ack, which its idle sleep does not when the message's
            // interval is the longest yet.
            if state.wakes_at.is_none_or(|wakes_at| due < wakes_at) {
                self.wake.notify_one();
            }
            let mut started = None;
            if state.task.as_ref().is_none_or(JoinHandle::is_finished) {
                let (started_tx, started_rx) = oneshot::channel();
                let (wake, sending) = (Arc::clone(&self.wake), Arc::clone(&self.sending));
                state.task =
                    Some(runtime.spawn(tick(Weak::clone(&ticker), wake, sending, started_tx)));
                started = Some(started_rx);
            }
            (id, started)
        };
        let progress = Progress { ticker, id };
        // A task spawned from a worker waits in that worker's own slot, which other workers do
        // not take: were the body to block this thread first, the acks would never start. Once
        // it has been polled, its timer wakes it on whichever worker is free.
        if let Some(started) = started {
            let _ = started.await;
        }
        progress
    }

    /// The messages whose `+WPI` is due, their next one set; a message whose lock is gone is
    /// dropped, its acks stopped. Also says when to wake next: when the next one is due, or,
    /// with no message, after the longest interval, so that a message added meanwhile is due
    /// no sooner than that unless its interval is shorter (its `start` then wakes the ticker).
    fn due(&self) -> (Vec<(u64, async_nats::Client, Subject)>, Instant) {
        let now = Instant::now();
        let mut state = self.lock();
        state
            .entries
            .retain(|_, entry| entry.due > now || !entry.lease.lost());
        let mut sends = Vec::new();
        let mut next: Option<Instant> = None;
        for (id, entry) in &mut state.entries {
            if entry.due <= now {
                sends.push((*id, entry.client.clone(), entry.reply.clone()));
                entry.due = now + entry.every;
            }
            next = Some(next.map_or(entry.due, |next| next.min(entry.due)));
        }
        let wakes_at = next.unwrap_or(now + state.idle);
        state.wakes_at = Some(wakes_at);
        (sends, wakes_at)
    }
}

/// The ticker's task: sends each message's `+WPI` when due, sleeps until the next one is, and
/// ends with the ticker (its `Drop` aborts it; it holds only a weak reference meanwhile).
async fn tick(
    ticker: Weak<Ticker>,
    wake: Arc<Notify>,
    sending: Arc<AsyncMutex<()>>,
    started: oneshot::Sender<()>,
) {
    let _ = started.send(());
    loop {
        let Some((sends, wakes_at)) = ticker.upgrade().map(|ticker| ticker.due()) else {
            return;
        };
        for (id, client, reply) in sends {
            let _sending = sending.lock().await;
            // Stopped since `due` picked it: its final acknowledgement may be out already.
            let handled = ticker
                .upgrade()
                .is_some_and(|ticker| ticker.lock().entries.contains_key(&id));
            if !handled {
                continue;
            }
            // A progress ack that cannot be sent means the connection is down; the final ack
            // reports that, and until then there is nothing better to do than to try again.
            let _ = client.publish(reply, "+WPI".into()).await;
        }
        // Woken by its timer, or by a message due sooner.
        let _ = tokio::time::timeout_at(wakes_at, wake.notified()).await;
    }
}
