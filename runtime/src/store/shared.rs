//! [`SharedStore`]: any [`Store`] behind one pointer, for the process-wide store and for calls
//! that share one.

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use super::{Begin, Claim, Completion, Fencing, Finish, Inspection, Journal, StepEntry, Store};
use crate::error::StoreError;
use crate::unit::{LockToken, UnitOfWork};

type Boxed<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;
type BoxedBatch<'a, T> = Pin<Box<dyn Future<Output = Vec<Result<T, StoreError>>> + Send + 'a>>;

/// [`Store`] with boxed futures, so that it can be a trait object; every store is one.
///
/// Input: a store's `async fn`s. Output: the same operations behind `dyn`, one allocation per
/// call, which keeps `Store` itself free of boxes and of any macro.
trait ErasedStore: Send + Sync + fmt::Debug {
    fn max_key_len(&self) -> usize;
    fn batches_natively(&self) -> bool;
    fn begin<'a>(
        &'a self,
        unit: &'a UnitOfWork,
        token: &'a LockToken,
        lock_ttl: Duration,
        fencing: Fencing,
    ) -> Boxed<'a, Begin>;
    fn finish<'a>(
        &'a self,
        unit: &'a UnitOfWork,
        token: &'a LockToken,
        marker: &'a [u8],
        result_ttl: Duration,
    ) -> Boxed<'a, Finish>;
    fn release<'a>(&'a self, unit: &'a UnitOfWork, token: &'a LockToken) -> Boxed<'a, bool>;
    fn renew<'a>(
        &'a self,
        unit: &'a UnitOfWork,
        token: &'a LockToken,
        lock_ttl: Duration,
    ) -> Boxed<'a, bool>;
    fn inspect<'a>(&'a self, unit: &'a UnitOfWork) -> Boxed<'a, Inspection>;
    fn forget<'a>(&'a self, unit: &'a UnitOfWork) -> Boxed<'a, bool>;
    fn records_steps(&self) -> bool;
    fn read_journal<'a>(&'a self, unit: &'a UnitOfWork) -> Boxed<'a, Journal>;
    fn record_step<'a>(
        &'a self,
        unit: &'a UnitOfWork,
        token: &'a LockToken,
        entry: StepEntry<'a>,
        lock_ttl: Duration,
    ) -> Boxed<'a, bool>;
    fn begin_batch<'a>(
        &'a self,
        claims: &'a [Claim<'a>],
        lock_ttl: Duration,
        fencing: Fencing,
    ) -> BoxedBatch<'a, Begin>;
    fn finish_batch<'a>(
        &'a self,
        completions: &'a [Completion<'a>],
        result_ttl: Duration,
    ) -> BoxedBatch<'a, Finish>;
}

impl<S: Store> ErasedStore for S {
    fn max_key_len(&self) -> usize {
        Store::max_key_len(self)
    }
    fn batches_natively(&self) -> bool {
        Store::batches_natively(self)
    }
    fn begin<'a>(
        &'a self,
        unit: &'a UnitOfWork,
        token: &'a LockToken,
        lock_ttl: Duration,
        fencing: Fencing,
    ) -> Boxed<'a, Begin> {
        Box::pin(Store::begin(self, unit, token, lock_ttl, fencing))
    }
    fn finish<'a>(
        &'a self,
        unit: &'a UnitOfWork,
        token: &'a LockToken,
        marker: &'a [u8],
        result_ttl: Duration,
    ) -> Boxed<'a, Finish> {
        Box::pin(Store::finish(self, unit, token, marker, result_ttl))
    }
    fn release<'a>(&'a self, unit: &'a UnitOfWork, token: &'a LockToken) -> Boxed<'a, bool> {
        Box::pin(Store::release(self, unit, token))
    }
    fn renew<'a>(
        &'a self,
        unit: &'a UnitOfWork,
        token: &'a LockToken,
        lock_ttl: Duration,
    ) -> Boxed<'a, bool> {
        Box::pin(Store::renew(self, unit, token, lock_ttl))
    }
    fn inspect<'a>(&'a self, unit: &'a UnitOfWork) -> Boxed<'a, Inspection> {
        Box::pin(Store::inspect(self, unit))
    }
    fn forget<'a>(&'a self, unit: &'a UnitOfWork) -> Boxed<'a, bool> {
        Box::pin(Store::forget(self, unit))
    }
    fn records_steps(&self) -> bool {
        Store::records_steps(self)
    }
    fn read_journal<'a>(&'a self, unit: &'a UnitOfWork) -> Boxed<'a, Journal> {
        Box::pin(Store::read_journal(self, unit))
    }
    fn record_step<'a>(
        &'a self,
        unit: &'a UnitOfWork,
        token: &'a LockToken,
        entry: StepEntry<'a>,
        lock_ttl: Duration,
    ) -> Boxed<'a, bool> {
        Box::pin(Store::record_step(self, unit, token, entry, lock_ttl))
    }
    fn begin_batch<'a>(
        &'a self,
        claims: &'a [Claim<'a>],
        lock_ttl: Duration,
        fencing: Fencing,
    ) -> BoxedBatch<'a, Begin> {
        Box::pin(Store::begin_batch(self, claims, lock_ttl, fencing))
    }
    fn finish_batch<'a>(
        &'a self,
        completions: &'a [Completion<'a>],
        result_ttl: Duration,
    ) -> BoxedBatch<'a, Finish> {
        Box::pin(Store::finish_batch(self, completions, result_ttl))
    }
}

/// Any [`Store`] behind one reference-counted pointer: what [`install`](crate::install) keeps
/// for the whole process, and what several calls can share. Clones share the same store.
///
/// It is a [`Store`] itself, so it goes wherever a store does; wrapping a `SharedStore` again
/// hands back the same one.
///
/// ```
/// use idempotask::store::SharedStore;
/// use idempotask::{MemoryStore, Task};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idempotask::Error> {
/// let shared = SharedStore::new(MemoryStore::new());
/// let task = Task::new("t");
/// let first: u8 = task.call("k").store(shared.clone()).run(async { Ok::<_, idempotask::Error>(1) }).await?;
/// let again: u8 = task.call("k").store(shared).run(async { Ok::<_, idempotask::Error>(2) }).await?;
/// assert_eq!((first, again), (1, 1));
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct SharedStore(Arc<dyn ErasedStore>);

impl SharedStore {
    /// Shares `store`.
    pub fn new(store: impl Store) -> Self {
        let any: &dyn Any = &store;
        if let Some(shared) = any.downcast_ref::<Self>() {
            return shared.clone();
        }
        Self(Arc::new(store))
    }
}

impl fmt::Debug for SharedStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("SharedStore").field(&self.0).finish()
    }
}

impl Store for SharedStore {
    fn max_key_len(&self) -> usize {
        self.0.max_key_len()
    }

    fn batches_natively(&self) -> bool {
        self.0.batches_natively()
    }

    async fn begin(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        lock_ttl: Duration,
        fencing: Fencing,
    ) -> Result<Begin, StoreError> {
        self.0.begin(unit, token, lock_ttl, fencing).await
    }

    async fn finish(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        marker: &[u8],
        result_ttl: Duration,
    ) -> Result<Finish, StoreError> {
        self.0.finish(unit, token, marker, result_ttl).await
    }

    async fn release(&self, unit: &UnitOfWork, token: &LockToken) -> Result<bool, StoreError> {
        self.0.release(unit, token).await
    }

    async fn renew(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        lock_ttl: Duration,
    ) -> Result<bool, StoreError> {
        self.0.renew(unit, token, lock_ttl).await
    }

    async fn inspect(&self, unit: &UnitOfWork) -> Result<Inspection, StoreError> {
        self.0.inspect(unit).await
    }

    async fn forget(&self, unit: &UnitOfWork) -> Result<bool, StoreError> {
        self.0.forget(unit).await
    }

    fn records_steps(&self) -> bool {
        self.0.records_steps()
    }

    async fn read_journal(&self, unit: &UnitOfWork) -> Result<Journal, StoreError> {
        self.0.read_journal(unit).await
    }

    async fn record_step(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        entry: StepEntry<'_>,
        lock_ttl: Duration,
    ) -> Result<bool, StoreError> {
        self.0.record_step(unit, token, entry, lock_ttl).await
    }

    async fn begin_batch(
        &self,
        claims: &[Claim<'_>],
        lock_ttl: Duration,
        fencing: Fencing,
    ) -> Vec<Result<Begin, StoreError>> {
        self.0.begin_batch(claims, lock_ttl, fencing).await
    }

    async fn finish_batch(
        &self,
        completions: &[Completion<'_>],
        result_ttl: Duration,
    ) -> Vec<Result<Finish, StoreError>> {
        self.0.finish_batch(completions, result_ttl).await
    }
}
