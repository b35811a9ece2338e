//! A store wrapper for the checks: a connection that is slow in the ways that matter to the
//! runner (a `begin` applied late, a reply that comes late, a slow `finish`).

use std::sync::Arc;
use std::time::Duration;

use idempotask::store::{Begin, Fencing, Finish, Inspection, SharedStore, Store};
use idempotask::store::{LockToken, StoreError, UnitOfWork};
use tokio::time::sleep;

/// A store whose commands travel one connection, in order, and take their time: a `begin` is
/// applied `begin_delay` after it was sent, whether or not anyone still waits for its reply,
/// and its reply arrives `reply_delay` after that; a `finish` is applied `finish_delay` after
/// it was sent.
#[derive(Debug)]
pub(super) struct SlowConnection {
    pub(super) inner: SharedStore,
    pub(super) begin_delay: Duration,
    pub(super) reply_delay: Duration,
    pub(super) finish_delay: Duration,
    pub(super) order: Arc<tokio::sync::Mutex<()>>,
    /// Signalled each time a `begin` has been sent, in the connection's order, before its
    /// delay.
    pub(super) beginning: Arc<tokio::sync::Notify>,
    /// Signalled each time a `begin` has been applied to the store.
    pub(super) begun: Arc<tokio::sync::Notify>,
    /// Signalled each time a `finish` has been sent, before its delay.
    pub(super) finishing: Arc<tokio::sync::Notify>,
}

impl SlowConnection {
    /// `inner` without delays; set the ones a check needs.
    pub(super) fn new(inner: &SharedStore) -> Self {
        Self {
            inner: inner.clone(),
            begin_delay: Duration::ZERO,
            reply_delay: Duration::ZERO,
            finish_delay: Duration::ZERO,
            order: Arc::default(),
            beginning: Arc::default(),
            begun: Arc::default(),
            finishing: Arc::default(),
        }
    }
}

impl Store for SlowConnection {
    async fn begin(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        lock_ttl: Duration,
        fencing: Fencing,
    ) -> Result<Begin, StoreError> {
        let (inner, unit, token) = (self.inner.clone(), unit.clone(), token.clone());
        let (order, delay) = (Arc::clone(&self.order), self.begin_delay);
        let (beginning, begun) = (Arc::clone(&self.beginning), Arc::clone(&self.begun));
        // Sent: it is applied even if the caller stops waiting.
        let sent = tokio::spawn(async move {
            let _turn = order.lock().await;
            // Only now is it in the connection's order: an operation sent after this
            // signal is applied after it.
            beginning.notify_one();
            sleep(delay).await;
            let answer = inner.begin(&unit, &token, lock_ttl, fencing).await;
            begun.notify_one();
            answer
        });
        let answer = sent.await.expect("the begin task panicked");
        sleep(self.reply_delay).await;
        answer
    }

    async fn finish(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        marker: &[u8],
        result_ttl: Duration,
    ) -> Result<Finish, StoreError> {
        self.finishing.notify_one();
        sleep(self.finish_delay).await;
        let _turn = self.order.lock().await;
        self.inner.finish(unit, token, marker, result_ttl).await
    }

    async fn release(&self, unit: &UnitOfWork, token: &LockToken) -> Result<bool, StoreError> {
        let _turn = self.order.lock().await;
        self.inner.release(unit, token).await
    }

    async fn renew(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        lock_ttl: Duration,
    ) -> Result<bool, StoreError> {
        let _turn = self.order.lock().await;
        self.inner.renew(unit, token, lock_ttl).await
    }

    async fn inspect(&self, unit: &UnitOfWork) -> Result<Inspection, StoreError> {
        self.inner.inspect(unit).await
    }

    async fn forget(&self, unit: &UnitOfWork) -> Result<bool, StoreError> {
        self.inner.forget(unit).await
    }
}
