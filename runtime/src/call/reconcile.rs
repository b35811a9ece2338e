//! Reconciling a unit in doubt: before the body runs again, ask the downstream system whether
//! the earlier delivery's side effect happened.

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::Call;
use crate::context::{TaskContext, context};
use crate::error::Error;
use crate::outcome::Report;

/// What a reconcile function found out about a unit [in doubt](crate::store::Doubt): the
/// earlier delivery's result, or that its work was not done.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reconciled<T> {
    /// The work was done (the payment provider knows the charge): this is its result, stored
    /// as if the body had returned it. The body does not run.
    Done(T),
    /// The work was not done: the body runs.
    NotDone,
}

/// A [`Call`] whose unit, if found [in doubt](crate::store::Doubt), is first reconciled with
/// the downstream system; built by [`Call::reconcile`], run like the call.
#[derive(Debug)]
#[must_use = "a call does nothing until it is run"]
pub struct Reconciling<'t, R> {
    call: Call<'t>,
    reconcile: R,
}

impl<'t> Call<'t> {
    /// Reconciles a unit in doubt before running the body again: when this delivery takes over
    /// a unit whose earlier delivery's lock ran out without a release or a result,
    /// `reconcile` is called first, with the lock held, with the body's
    /// [`TaskContext`] (its key, what is known of the earlier delivery in
    /// [`in_doubt`](TaskContext::in_doubt)). It asks the downstream system (a payment
    /// provider's lookup by idempotency key) and answers:
    ///
    /// - [`Reconciled::Done`]: that result is stored as the body's would be, and returned;
    ///   the outcome is [`Outcome::Reconciled`](crate::Outcome::Reconciled);
    /// - [`Reconciled::NotDone`]: the body runs;
    /// - an error: nothing is stored, and the unit stays in doubt for the next delivery.
    ///
    /// A unit that was free never calls it. This is `reconcile = path` on the attribute.
    ///
    /// ```
    /// use std::time::Duration;
    /// use idempotask::store::{Fencing, LockToken, Store, UnitOfWork};
    /// use idempotask::{MemoryStore, Outcome, Reconciled, Task, TaskContext};
    ///
    /// static CHARGE: Task = Task::new("charge_customer");
    ///
    /// /// The provider's lookup by idempotency key (here: it has the charge).
    /// async fn charge_known_to_provider(ctx: TaskContext) -> Result<Reconciled<String>, idempotask::Error> {
    ///     Ok(Reconciled::Done(format!("ch_{}", ctx.key())))
    /// }
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idempotask::Error> {
    /// let store = MemoryStore::new();
    /// // A worker took the unit and died: its lock runs out, remembered.
    /// let unit = UnitOfWork::new("charge_customer", "order-7")?;
    /// let dead = LockToken::generate().with_doubt_memory(Duration::from_secs(60));
    /// store.begin(&unit, &dead, Duration::from_millis(100), Fencing::Off).await?;
    /// tokio::time::sleep(Duration::from_millis(150)).await;
    ///
    /// let report = CHARGE
    ///     .call("order-7")
    ///     .store(store.clone())
    ///     .reconcile(charge_known_to_provider)
    ///     .run_reported(async { Ok::<_, idempotask::Error>("a second charge".to_owned()) })
    ///     .await?;
    /// assert_eq!((report.value.as_str(), report.outcome), ("ch_order-7", Outcome::Reconciled));
    /// # Ok(()) }
    /// ```
    pub fn reconcile<R, Fut>(self, reconcile: R) -> Reconciling<'t, R>
    where
        R: FnOnce(TaskContext) -> Fut,
    {
        Reconciling {
            call: self,
            reconcile,
        }
    }
}

impl<R, Fut, T, E> Reconciling<'_, R>
where
    R: FnOnce(TaskContext) -> Fut,
    Fut: Future<Output = Result<Reconciled<T>, E>>,
    T: Serialize + DeserializeOwned,
    E: From<Error>,
{
    /// [`Call::run`], reconciling a unit in doubt first.
    ///
    /// # Errors
    /// As [`Call::run`], and the reconcile function's own error.
    pub fn run<F: Future<Output = Result<T, E>>>(
        self,
        body: F,
    ) -> impl Future<Output = Result<T, E>> {
        let body = Box::pin(reconciled_first(self.reconcile, body));
        self.call
            .drive(body, |result| result.map(|report| report.value))
    }

    /// [`Call::run_reported`], reconciling a unit in doubt first.
    ///
    /// # Errors
    /// As [`Call::run`], and the reconcile function's own error.
    pub fn run_reported<F: Future<Output = Result<T, E>>>(
        self,
        body: F,
    ) -> impl Future<Output = Result<Report<T>, E>> {
        let body = Box::pin(reconciled_first(self.reconcile, body));
        self.call.drive(body, |result| result)
    }
}

/// The body as the runner sees it: in doubt, `reconcile` first; its answer, or the body's.
pub(crate) async fn reconciled_first<T, E, R, Fut, F>(reconcile: R, body: F) -> Result<T, E>
where
    R: FnOnce(TaskContext) -> Fut,
    Fut: Future<Output = Result<Reconciled<T>, E>>,
    F: Future<Output = Result<T, E>>,
{
    if let Some(ctx) = context().filter(|ctx| ctx.in_doubt().is_some())
        && let Reconciled::Done(value) = reconcile(ctx.clone()).await?
    {
        ctx.mark_reconciled();
        return Ok(value);
    }
    body.await
}
