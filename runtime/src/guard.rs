//! What keeps a running body's lock honest: released after an error, a panic or a drop, and
//! renewed while the body runs when the task asks for it.

use std::convert::Infallible;
use std::future::{Future, poll_fn};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::pin;
use std::task::Poll;
use std::time::Duration;

use tokio::time::{Instant, sleep};
use tracing::Instrument;

use crate::context::Lease;
use crate::error::StoreError;
use crate::observe::{KeyLogging, renewal};
use crate::store::{SharedStore, Store};
use crate::unit::{LockToken, UnitOfWork};

pub(crate) type Panic = Box<dyn std::any::Any + Send>;

/// Input: the body's future. Output: a future that yields the body's output, or the payload of
/// a panic raised while polling it, so the lock can be released before the panic resumes.
pub(crate) async fn catching_panics<F: Future>(body: F) -> Result<F::Output, Panic> {
    let mut body = pin!(body);
    poll_fn(
        |cx| match catch_unwind(AssertUnwindSafe(|| body.as_mut().poll(cx))) {
            Ok(Poll::Ready(output)) => Poll::Ready(Ok(output)),
            Ok(Poll::Pending) => Poll::Pending,
            Err(panic) => Poll::Ready(Err(panic)),
        },
    )
    .await
}

/// What the watchdog needs to renew one lock.
pub(crate) struct Renewal<'a> {
    pub(crate) store: &'a SharedStore,
    pub(crate) unit: &'a UnitOfWork,
    pub(crate) token: &'a LockToken,
    pub(crate) lease: &'a Lease,
    pub(crate) lock_ttl: Duration,
    pub(crate) logging: KeyLogging,
}

/// Input: the guarded body. Output: the same, while a watchdog renews the lock every third of
/// its TTL and marks the lease lost when a renewal finds the lock gone.
pub(crate) async fn renewing<F: Future>(body: F, renewal_of: Renewal<'_>) -> F::Output {
    let Renewal {
        store,
        unit,
        token,
        lease,
        lock_ttl,
        logging,
    } = renewal_of;
    let renewals = async {
        let interval = (lock_ttl / 3).max(Duration::from_millis(1));
        loop {
            sleep(interval).await;
            let sent = Instant::now();
            match store.renew(unit, token, lock_ttl).await {
                Ok(true) => {
                    lease.renewed(sent, lock_ttl);
                    renewal(unit.task(), "renewed");
                }
                Ok(false) => {
                    lease.lose();
                    renewal(unit.task(), "lost");
                    tracing::warn!(
                        task = unit.task(),
                        key = logging.show(unit),
                        "the lock was lost while the task ran; another delivery may run it too"
                    );
                    break;
                }
                Err(err) => {
                    renewal(unit.task(), "failed");
                    tracing::warn!(task = unit.task(), key = logging.show(unit), error = %err, "could not renew the lock; trying again");
                    if !lease.held() {
                        lease.lose();
                        break;
                    }
                }
            }
        }
        std::future::pending::<Infallible>().await
    };
    tokio::select! {
        biased;
        output = body => output,
        never = renewals => match never {},
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

/// Releases the lock in the background if the call is dropped while its body runs.
pub(crate) struct ReleaseOnDrop {
    pub(crate) store: Option<(SharedStore, UnitOfWork, LockToken, KeyLogging)>,
}

impl ReleaseOnDrop {
    pub(crate) fn disarm(&mut self) {
        self.store = None;
    }
}

impl Drop for ReleaseOnDrop {
    fn drop(&mut self) {
        if let Some((store, unit, token, logging)) = self.store.take() {
            release_in_background(Some(store), &unit, &token, logging);
        }
    }
}
