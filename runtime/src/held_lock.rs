//! What keeps a running body's lock honest: released after an error, a panic or a drop, and
//! renewed while the body runs when the task asks for it.

use std::future::{Future, poll_fn};
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::{Instant, sleep};
use tracing::Instrument;

use crate::backoff::STORE_RETRY_BACKOFF;
use crate::context::Lease;
use crate::error::StoreError;
use crate::lock_renewal::LockRenewal;
use crate::marker::lock_lost_marker;
use crate::observe::{KeyLogging, renewal as observe_renewal};
use crate::outcome::Outcome;
use crate::store::{Finish, SharedStore, Store};
use crate::unit::{LockToken, UnitOfWork};

/// What the watchdog needs to renew one lock; owned, since it runs as a task of its own.
pub(crate) struct Renewal {
    pub(crate) store: SharedStore,
    pub(crate) unit: UnitOfWork,
    pub(crate) token: LockToken,
    pub(crate) lease: Arc<Lease>,
    pub(crate) lock_ttl: Duration,
    pub(crate) logging: KeyLogging,
}

/// Input: the guarded body. Output: the same, while a watchdog renews the lock every third of
/// its TTL and marks the lease lost when a renewal finds the lock gone.
///
/// The watchdog is a task of its own on the runtime, not a branch polled next to the body, and
/// on a multi-thread runtime every poll of the body runs in `block_in_place`. A body that
/// blocks its thread (a synchronous call, `std::thread::sleep`) may block the very worker that
/// tokio left to drive the timers and the sockets: the one parked on the driver, woken by the
/// reply to `begin` or by a timer, which wakes no other worker for the tasks it runs then. No
/// thread would then end the watchdog's sleep nor read a store's reply, whatever the number of
/// workers, and the lock would expire under the body. `block_in_place` hands the worker (its
/// queue, and with it the driving of timers and I/O) to another thread for as long as the
/// poll lasts; a poll that does not block gets it back at once. It stops when the body is
/// done or the call is dropped. What it cannot do is run on a `current_thread` runtime whose
/// only thread the body blocks.
///
/// With [`LockRenewal::InTask`] the renewals are polled by the body's own task instead (see
/// [`in_task`]).
pub(crate) async fn renewing<F: Future>(body: F, renewal: Renewal, how: LockRenewal) -> F::Output {
    if how == LockRenewal::InTask {
        return in_task(body, renewal).await;
    }
    let span = tracing::Span::current();
    let watchdog = tokio::spawn(renew_until_lost(renewal).instrument(span));
    let _stop = AbortOnDrop(watchdog);
    let may_block = matches!(
        tokio::runtime::Handle::current().runtime_flavor(),
        tokio::runtime::RuntimeFlavor::MultiThread
    );
    let mut body = pin!(body);
    poll_fn(|cx| {
        if may_block {
            tokio::task::block_in_place(|| body.as_mut().poll(cx))
        } else {
            body.as_mut().poll(cx)
        }
    })
    .await
}

/// Input: the guarded body. Output: the same, with its renewals polled by the same task each
/// time it wakes: no watchdog task, no hand-off per poll. A body that blocks its thread blocks
/// its renewals with it; [`LockRenewal::InTask`] says so.
async fn in_task<F: Future>(body: F, renewal: Renewal) -> F::Output {
    let mut body = pin!(body);
    // Unconstrained, and polled before the body: a body that always has work ready (a fast
    // stream, a full channel) spends tokio's per-poll budget, and a timer polled after it would
    // then answer "pending" on every poll, however late; the renewals' first clock also starts
    // with the body's first poll, not after it.
    let mut renewals = pin!(tokio::task::unconstrained(renew_until_lost(renewal)));
    let mut renewing = true;
    poll_fn(|cx| {
        // Once the renewals end (the lock is lost), their future is done and not polled again.
        if renewing && renewals.as_mut().poll(cx).is_ready() {
            renewing = false;
        }
        body.as_mut().poll(cx)
    })
    .await
}

async fn renew_until_lost(renewal: Renewal) {
    let Renewal {
        store,
        unit,
        token,
        lease,
        lock_ttl,
        logging,
    } = renewal;
    // At least 33 ms: a task's lock TTL is at least `MIN_TTL`.
    let interval = lock_ttl / 3;
    loop {
        sleep(interval).await;
        if lease.is_lost() {
            // A refused fence found the lock gone already, and said so.
            return;
        }
        let sent = Instant::now();
        match store.renew(&unit, &token, lock_ttl).await {
            Ok(true) => {
                lease.renewed(sent, lock_ttl);
                observe_renewal(unit.task(), "renewed");
            }
            Ok(false) => {
                lease.lose();
                observe_renewal(unit.task(), "lost");
                tracing::warn!(
                    task = unit.task(),
                    key = logging.show(&unit),
                    "the lock was lost while the task ran; another delivery may run it too"
                );
                return;
            }
            Err(err) => {
                observe_renewal(unit.task(), "failed");
                tracing::warn!(task = unit.task(), key = logging.show(&unit), error = %err, "could not renew the lock; trying again");
                if !lease.held() {
                    lease.lose();
                    return;
                }
            }
        }
    }
}

/// Aborts a spawned task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Releases the lock after a failed or panicked body; a failure only means it expires later.
pub(crate) async fn release(
    store: &SharedStore,
    unit: &UnitOfWork,
    token: &LockToken,
    logging: KeyLogging,
) {
    if let Err(err) = store.release(unit, token).await {
        log_release_failure(unit, &err, logging);
    }
}

pub(crate) fn log_release_failure(unit: &UnitOfWork, err: &StoreError, logging: KeyLogging) {
    tracing::warn!(
        task = unit.task(),
        key = logging.show(unit),
        error = %err,
        "could not release the lock; the next delivery waits until it expires"
    );
}

pub(crate) fn release_in_background(
    store: Option<SharedStore>,
    unit: &UnitOfWork,
    token: &LockToken,
    logging: KeyLogging,
) {
    let (Some(store), Ok(runtime)) = (store, tokio::runtime::Handle::try_current()) else {
        return;
    };
    let (unit, token) = (unit.clone(), token.clone());
    runtime.spawn(
        async move {
            if let Err(err) = store.release(&unit, &token).await {
                log_release_failure(&unit, &err, logging);
            }
        }
        .in_current_span(),
    );
}

/// What a call that is dropped leaves to the background: nothing, the release of a lock it may
/// hold, or the recording of a result its body already produced.
pub(crate) struct OnDrop {
    pending: Pending,
    /// The marker a `Finish` stores: kept here, so that the call records it from here too
    /// instead of keeping a copy.
    marker: Vec<u8>,
}

enum Pending {
    Nothing,
    /// From before the first `begin` is sent until the body's outcome is known: a `begin`
    /// still in flight when the call is dropped may take the lock after all (the store applies
    /// it, its reply goes nowhere), so the release follows it on the same connection.
    Release {
        store: SharedStore,
        unit: UnitOfWork,
        token: LockToken,
        logging: KeyLogging,
    },
    /// Once the body succeeded: its marker is stored even if the caller stops waiting, so the
    /// work is not run again by the next delivery.
    Finish {
        store: SharedStore,
        unit: UnitOfWork,
        token: LockToken,
        logging: KeyLogging,
        result_ttl: Duration,
        lease: Arc<Lease>,
    },
}

impl OnDrop {
    /// Releases `token`'s lock on `unit` if dropped.
    pub(crate) fn release(
        store: &SharedStore,
        unit: &UnitOfWork,
        token: &LockToken,
        logging: KeyLogging,
    ) -> Self {
        Self {
            pending: Pending::Release {
                store: store.clone(),
                unit: unit.clone(),
                token: token.clone(),
                logging,
            },
            marker: Vec::new(),
        }
    }

    /// From now on, stores `marker` in the background if dropped (the body succeeded), as the
    /// holder of `granted`: the lock as it was granted, with its fencing token, which `finish`
    /// compares whole. Answers the marker, kept here rather than copied: the call records it
    /// from here.
    pub(crate) fn finish_instead(
        &mut self,
        granted: &LockToken,
        marker: Vec<u8>,
        result_ttl: Duration,
        lease: &Arc<Lease>,
    ) -> &[u8] {
        if let Pending::Release {
            store,
            unit,
            logging,
            ..
        } = std::mem::replace(&mut self.pending, Pending::Nothing)
        {
            self.pending = Pending::Finish {
                store,
                unit,
                token: granted.clone(),
                logging,
                result_ttl,
                lease: Arc::clone(lease),
            };
        }
        self.marker = marker;
        &self.marker
    }

    /// The call took care of everything itself.
    pub(crate) fn disarm(&mut self) {
        self.pending = Pending::Nothing;
    }
}

impl Drop for OnDrop {
    fn drop(&mut self) {
        match std::mem::replace(&mut self.pending, Pending::Nothing) {
            Pending::Nothing => {}
            Pending::Release {
                store,
                unit,
                token,
                logging,
            } => release_in_background(Some(store), &unit, &token, logging),
            Pending::Finish {
                store,
                unit,
                token,
                logging,
                result_ttl,
                lease,
            } => {
                let Ok(runtime) = tokio::runtime::Handle::try_current() else {
                    return;
                };
                let marker = std::mem::take(&mut self.marker);
                runtime.spawn(
                    async move {
                        Recording::of(&store, &unit, &token, logging, &lease)
                            .record(&marker, result_ttl)
                            .await;
                    }
                    .in_current_span(),
                );
            }
        }
    }
}

/// Storing the marker of a successful execution, retrying while the lock is still ours.
pub(crate) struct Recording<'a> {
    pub(crate) store: &'a SharedStore,
    pub(crate) unit: &'a UnitOfWork,
    pub(crate) token: &'a LockToken,
    pub(crate) logging: KeyLogging,
    pub(crate) lease: &'a Arc<Lease>,
}

impl<'a> Recording<'a> {
    pub(crate) fn of(
        store: &'a SharedStore,
        unit: &'a UnitOfWork,
        token: &'a LockToken,
        logging: KeyLogging,
        lease: &'a Arc<Lease>,
    ) -> Self {
        Self {
            store,
            unit,
            token,
            logging,
            lease,
        }
    }

    pub(crate) async fn record(&self, marker: &[u8], result_ttl: Duration) -> Outcome {
        let Self {
            store,
            unit,
            token,
            lease,
            ..
        } = *self;
        let mut failures: u32 = 0;
        loop {
            match store.finish(unit, token, marker, result_ttl).await {
                Ok(Finish::Completed) if lease.held() => return self.completed(),
                // A store keeps a lapsed lock that nobody took over as its holder's (it
                // remembers it for the doubt), and answers a re-sent finish that finds its own
                // marker as the first one was answered. An answer that comes after the lease
                // ended cannot tell whether the finish applied before the lock lapsed, and the
                // lease ends no later than the store's lock: the lock may have been gone, and
                // a duplicate may have run beside the body.
                Ok(Finish::Completed) => return self.lost(true),
                Ok(Finish::LockLost { marker_written }) => return self.lost(marker_written),
                Err(err) => {
                    failures += 1;
                    let pause = STORE_RETRY_BACKOFF.delay(failures);
                    if !err.is_retryable() || Instant::now() + pause >= lease.expires_at() {
                        return self.unconfirmed(marker, &err).await;
                    }
                    // Boxed: a timer is large, and most recordings never wait.
                    Box::pin(sleep(pause)).await;
                }
            }
        }
    }

    /// The marker is stored and the lock was held until the store said so.
    fn completed(&self) -> Outcome {
        if self.lease.reconciled() {
            Outcome::Reconciled
        } else {
            Outcome::Executed
        }
    }

    /// The lock had lapsed (or may have) before the finish applied.
    fn lost(&self, marker_written: bool) -> Outcome {
        tracing::warn!(
            task = self.unit.task(),
            key = self.logging.show(self.unit),
            fencing_token = self.token.fencing_token(),
            marker_written,
            "the lock expired before the task finished; another delivery may have run it too"
        );
        Outcome::LockLost { marker_written }
    }

    /// Input: the last error of a finish that never got an answer. Output: what the unit holds,
    /// read back once. A finish may have applied and lost only its reply (a timeout is
    /// ambiguous): the call's own marker there means it did, and the outcome says so instead of
    /// reporting a result as unrecorded while every later delivery replays it. The read-back
    /// costs a round trip on this failure path only.
    async fn unconfirmed(&self, marker: &[u8], err: &StoreError) -> Outcome {
        let seen = self.store.inspect(self.unit).await;
        let ours = seen
            .as_ref()
            .ok()
            .and_then(|seen| seen.marker.as_deref())
            .is_some_and(|stored| is_own_marker(stored, marker));
        if ours {
            return if self.lease.held() {
                self.completed()
            } else {
                self.lost(true)
            };
        }
        tracing::warn!(
            task = self.unit.task(),
            key = self.logging.show(self.unit),
            fencing_token = self.token.fencing_token(),
            error = %err,
            "the task succeeded but its completion could not be recorded; a redelivery after the lock expires will run it again"
        );
        Outcome::MarkerNotWritten
    }
}

/// Whether `stored` is `marker` as a store keeps it: as written, or with the lock-lost flag a
/// store adds when it writes it after the lock expired.
fn is_own_marker(stored: &[u8], marker: &[u8]) -> bool {
    stored == marker || lock_lost_marker(marker).is_some_and(|lost| stored == lost.as_slice())
}
