//! [`SharedOperator`]: any [`Operator`] behind one pointer, for a tool that picks its store at
//! run time.

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use super::held::{Held, Listed};
use super::page::{Cursor, Page, Scope, Stats};
use super::{Forgot, Operator, Resolution, Resolved};
use crate::error::StoreError;
use crate::store::Journal;
use crate::unit::UnitOfWork;

type Boxed<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// [`Operator`] with boxed futures, so that it can be a trait object; every operator is one.
///
/// Input: an operator's `async fn`s. Output: the same calls behind `dyn`, one allocation per
/// call, which keeps `Operator` itself free of boxes and of any macro. The provided methods
/// are here too, so that a store's own `task_exists` and `stats` survive the erasure.
trait ErasedOperator: Send + Sync + fmt::Debug {
    fn scope(&self) -> Scope;
    fn location(&self, unit: &UnitOfWork) -> String;
    fn read<'a>(&'a self, unit: &'a UnitOfWork) -> Boxed<'a, Held>;
    fn list<'a>(&'a self, task: &'a str, from: Option<&'a Cursor>, limit: usize)
    -> Boxed<'a, Page>;
    fn forget_exact<'a>(&'a self, unit: &'a UnitOfWork, shown: &'a [u8]) -> Boxed<'a, Forgot>;
    fn resolve_exact<'a>(
        &'a self,
        unit: &'a UnitOfWork,
        shown: &'a [u8],
        resolution: &'a Resolution,
    ) -> Boxed<'a, Resolved>;
    fn task_exists<'a>(&'a self, task: &'a str) -> Boxed<'a, bool>;
    fn stats<'a>(&'a self, task: &'a str) -> Boxed<'a, Stats>;
    fn journal<'a>(&'a self, unit: &'a UnitOfWork) -> Boxed<'a, Journal>;
    fn listed_journal<'a>(&'a self, listed: &'a Listed) -> Boxed<'a, Journal>;
}

impl<O: Operator> ErasedOperator for O {
    fn scope(&self) -> Scope {
        Operator::scope(self)
    }
    fn location(&self, unit: &UnitOfWork) -> String {
        Operator::location(self, unit)
    }
    fn read<'a>(&'a self, unit: &'a UnitOfWork) -> Boxed<'a, Held> {
        Box::pin(Operator::read(self, unit))
    }
    fn list<'a>(
        &'a self,
        task: &'a str,
        from: Option<&'a Cursor>,
        limit: usize,
    ) -> Boxed<'a, Page> {
        Box::pin(Operator::list(self, task, from, limit))
    }
    fn forget_exact<'a>(&'a self, unit: &'a UnitOfWork, shown: &'a [u8]) -> Boxed<'a, Forgot> {
        Box::pin(Operator::forget_exact(self, unit, shown))
    }
    fn resolve_exact<'a>(
        &'a self,
        unit: &'a UnitOfWork,
        shown: &'a [u8],
        resolution: &'a Resolution,
    ) -> Boxed<'a, Resolved> {
        Box::pin(Operator::resolve_exact(self, unit, shown, resolution))
    }
    fn task_exists<'a>(&'a self, task: &'a str) -> Boxed<'a, bool> {
        Box::pin(Operator::task_exists(self, task))
    }
    fn stats<'a>(&'a self, task: &'a str) -> Boxed<'a, Stats> {
        Box::pin(Operator::stats(self, task))
    }
    fn journal<'a>(&'a self, unit: &'a UnitOfWork) -> Boxed<'a, Journal> {
        Box::pin(Operator::journal(self, unit))
    }
    fn listed_journal<'a>(&'a self, listed: &'a Listed) -> Boxed<'a, Journal> {
        Box::pin(Operator::listed_journal(self, listed))
    }
}

/// Any [`Operator`] behind one reference-counted pointer: what a tool keeps when it learns
/// which store it talks to only at run time (the `idempotask` command picks Redis, a Redis
/// Cluster or PostgreSQL from its URL). Clones share the same operator.
///
/// It is an [`Operator`] itself; sharing a `SharedOperator` again hands back the same one.
///
/// ```
/// use idempotask::operator::{Held, Operator, SharedOperator};
/// use idempotask::{MemoryStore, Task};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = MemoryStore::new();
/// Task::new("refund").call("order-7").store(store.clone()).run(async { Ok::<_, idempotask::Error>(5) }).await?;
///
/// let operators = [SharedOperator::new(store.clone()), SharedOperator::new(MemoryStore::new())];
/// let unit = operators[0].scope().unit("refund", "order-7")?;
/// assert!(matches!(operators[0].read(&unit).await?, Held::Marker { .. }));
/// assert!(matches!(operators[1].read(&unit).await?, Held::Nothing));
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct SharedOperator(Arc<dyn ErasedOperator>);

impl SharedOperator {
    /// Shares `operator`.
    pub fn new(operator: impl Operator) -> Self {
        let any: &dyn Any = &operator;
        if let Some(shared) = any.downcast_ref::<Self>() {
            return shared.clone();
        }
        Self(Arc::new(operator))
    }
}

impl fmt::Debug for SharedOperator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("SharedOperator").field(&self.0).finish()
    }
}

impl Operator for SharedOperator {
    fn scope(&self) -> Scope {
        self.0.scope()
    }

    fn location(&self, unit: &UnitOfWork) -> String {
        self.0.location(unit)
    }

    async fn read(&self, unit: &UnitOfWork) -> Result<Held, StoreError> {
        self.0.read(unit).await
    }

    async fn list(
        &self,
        task: &str,
        from: Option<&Cursor>,
        limit: usize,
    ) -> Result<Page, StoreError> {
        self.0.list(task, from, limit).await
    }

    async fn forget_exact(&self, unit: &UnitOfWork, shown: &[u8]) -> Result<Forgot, StoreError> {
        self.0.forget_exact(unit, shown).await
    }

    async fn resolve_exact(
        &self,
        unit: &UnitOfWork,
        shown: &[u8],
        resolution: &Resolution,
    ) -> Result<Resolved, StoreError> {
        self.0.resolve_exact(unit, shown, resolution).await
    }

    async fn task_exists(&self, task: &str) -> Result<bool, StoreError> {
        self.0.task_exists(task).await
    }

    async fn stats(&self, task: &str) -> Result<Stats, StoreError> {
        self.0.stats(task).await
    }

    async fn journal(&self, unit: &UnitOfWork) -> Result<Journal, StoreError> {
        self.0.journal(unit).await
    }

    async fn listed_journal(&self, listed: &Listed) -> Result<Journal, StoreError> {
        self.0.listed_journal(listed).await
    }
}
