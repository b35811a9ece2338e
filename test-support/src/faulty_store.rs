//! A store that fails on command: any real store behind switches that make it refuse every
//! operation (a server that is down), or apply the next `finish` and then lose its reply (the
//! ambiguous case a timeout makes). The integrations' conformance harness drives these through
//! every queue and HTTP consumer.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use idempotask::store::{
    Begin, Fencing, Finish, Inspection, Journal, LockToken, StepEntry, Store, StoreError,
    StoreErrorKind, UnitOfWork,
};

/// `inner` behind fault switches; clones share the switches.
#[derive(Debug, Clone)]
pub struct FaultyStore<S> {
    inner: Arc<S>,
    switches: Arc<Switches>,
}

#[derive(Debug, Default)]
struct Switches {
    down: AtomicBool,
    ambiguous_finish: AtomicBool,
}

impl<S: Store> FaultyStore<S> {
    /// `inner`, with no fault switched on.
    pub fn new(inner: S) -> Self {
        Self {
            inner: Arc::new(inner),
            switches: Arc::default(),
        }
    }

    /// From now on every operation is refused as by a server that is down (`down(true)`), or
    /// goes to the store again (`down(false)`). Nothing reaches the store while it is down.
    pub fn down(&self, down: bool) {
        self.switches.down.store(down, Ordering::SeqCst);
    }

    /// The next `finish` is applied, and then answers an ambiguous timeout, as when the reply
    /// is lost after the server wrote the marker.
    pub fn lose_next_finish_reply(&self) {
        self.switches.ambiguous_finish.store(true, Ordering::SeqCst);
    }

    /// Whether the switch of [`lose_next_finish_reply`](Self::lose_next_finish_reply) is still
    /// waiting for its `finish`.
    pub fn finish_reply_pending(&self) -> bool {
        self.switches.ambiguous_finish.load(Ordering::SeqCst)
    }

    fn refused(&self, operation: &'static str) -> Result<(), StoreError> {
        if self.switches.down.load(Ordering::SeqCst) {
            return Err(StoreError::new(
                operation,
                StoreErrorKind::Unreachable,
                "connection refused (the test switched the store off)",
            ));
        }
        Ok(())
    }
}

impl<S: Store> Store for FaultyStore<S> {
    fn max_key_len(&self) -> usize {
        self.inner.max_key_len()
    }

    async fn begin(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        lock_ttl: Duration,
        fencing: Fencing,
    ) -> Result<Begin, StoreError> {
        self.refused("begin")?;
        self.inner.begin(unit, token, lock_ttl, fencing).await
    }

    async fn finish(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        marker: &[u8],
        result_ttl: Duration,
    ) -> Result<Finish, StoreError> {
        self.refused("finish")?;
        let finished = self.inner.finish(unit, token, marker, result_ttl).await?;
        if self.switches.ambiguous_finish.swap(false, Ordering::SeqCst) {
            return Err(StoreError::ambiguous(
                "finish",
                StoreErrorKind::Timeout,
                format!("the reply to a finish that applied ({finished:?}) was lost"),
            ));
        }
        Ok(finished)
    }

    async fn release(&self, unit: &UnitOfWork, token: &LockToken) -> Result<bool, StoreError> {
        self.refused("release")?;
        self.inner.release(unit, token).await
    }

    async fn renew(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        lock_ttl: Duration,
    ) -> Result<bool, StoreError> {
        self.refused("renew")?;
        self.inner.renew(unit, token, lock_ttl).await
    }

    async fn inspect(&self, unit: &UnitOfWork) -> Result<Inspection, StoreError> {
        self.refused("inspect")?;
        self.inner.inspect(unit).await
    }

    async fn forget(&self, unit: &UnitOfWork) -> Result<bool, StoreError> {
        self.refused("forget")?;
        self.inner.forget(unit).await
    }

    fn records_steps(&self) -> bool {
        self.inner.records_steps()
    }

    async fn read_journal(&self, unit: &UnitOfWork) -> Result<Journal, StoreError> {
        self.refused("read_journal")?;
        self.inner.read_journal(unit).await
    }

    async fn record_step(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        entry: StepEntry<'_>,
        lock_ttl: Duration,
    ) -> Result<bool, StoreError> {
        self.refused("record_step")?;
        self.inner.record_step(unit, token, entry, lock_ttl).await
    }
}
