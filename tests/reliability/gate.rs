//! A store that parks the call at a chosen step, so a test can drop the call right there.
//!
//! It forwards every operation to a real `RedisStore`; at the chosen operation it signals the
//! test, before or after the real call, and never returns: the test then drops the call.

use std::sync::Mutex;
use std::time::Duration;

use idempotask::store::Fencing;
use idempotask::store::{Begin, Finish, Inspection, LockToken, Store, StoreError, UnitOfWork};
use idempotask_redis::RedisStore;
use tokio::sync::oneshot;

/// Where the call stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stop {
    /// Before the request reaches Redis.
    Before(&'static str),
    /// After Redis applied it, before the caller sees the reply.
    After(&'static str),
}

#[derive(Debug)]
pub(crate) struct Gate {
    inner: RedisStore,
    stop: Stop,
    reached: Mutex<Option<oneshot::Sender<()>>>,
}

impl Gate {
    pub(crate) fn new(inner: RedisStore, stop: Stop) -> (Self, oneshot::Receiver<()>) {
        let (tx, rx) = oneshot::channel();
        (
            Self {
                inner,
                stop,
                reached: Mutex::new(Some(tx)),
            },
            rx,
        )
    }

    async fn checkpoint(&self, here: Stop) {
        if here != self.stop {
            return;
        }
        let reached = self.reached.lock().unwrap().take();
        if let Some(tx) = reached {
            let _ = tx.send(());
            std::future::pending::<()>().await;
        }
    }
}

impl Store for Gate {
    async fn begin(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        lock_ttl: Duration,
        fencing: Fencing,
    ) -> Result<Begin, StoreError> {
        self.checkpoint(Stop::Before("begin")).await;
        let answer = self.inner.begin(unit, token, lock_ttl, fencing).await;
        self.checkpoint(Stop::After("begin")).await;
        answer
    }

    async fn finish(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        marker: &[u8],
        result_ttl: Duration,
    ) -> Result<Finish, StoreError> {
        self.checkpoint(Stop::Before("finish")).await;
        let answer = self.inner.finish(unit, token, marker, result_ttl).await;
        self.checkpoint(Stop::After("finish")).await;
        answer
    }

    async fn release(&self, unit: &UnitOfWork, token: &LockToken) -> Result<bool, StoreError> {
        self.checkpoint(Stop::Before("release")).await;
        let answer = self.inner.release(unit, token).await;
        self.checkpoint(Stop::After("release")).await;
        answer
    }

    async fn renew(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        lock_ttl: Duration,
    ) -> Result<bool, StoreError> {
        self.inner.renew(unit, token, lock_ttl).await
    }

    async fn inspect(&self, unit: &UnitOfWork) -> Result<Inspection, StoreError> {
        self.inner.inspect(unit).await
    }

    async fn forget(&self, unit: &UnitOfWork) -> Result<bool, StoreError> {
        self.inner.forget(unit).await
    }
}
