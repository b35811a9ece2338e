//! The service that runs each apalis job through a `Task`, and how its errors reach apalis.

use std::future::Future;
use std::pin::Pin;

use std::task::{Context, Poll};
use std::time::Duration;

use apalis_core::error::{AbortError, BoxDynError, RetryAfterError};
use apalis_core::layers::{Layer, Service};
use apalis_core::task::Task as Job;
use apalis_core::task::task_fn::{TaskFn, task_fn};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::Idempotent;
use super::key::JobKey;
use idempotask::{Error, Redelivery};

/// A handler service whose jobs run at most once per key; made by [`Idempotent`].
///
/// Its error type is apalis's `BoxDynError`, and the handler's own errors pass through it as they
/// are: see the [module docs](super) for what each outcome becomes. A worker calls it like any
/// tower service:
///
/// ```
/// use std::future::poll_fn;
/// use apalis_core::error::BoxDynError;
/// use apalis_core::layers::Service;
/// use apalis_core::task::Task as Job;
/// use idempotask_apalis::Idempotent;
/// use idempotask::{MemoryStore, Task};
///
/// async fn issue_refund(order: u64) -> Result<String, BoxDynError> {
///     Ok(format!("re_{order}"))
/// }
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), BoxDynError> {
/// let mut service = Idempotent::new(Task::new("refund"), |order: &u64| format!("refund-{order}"))
///     .store(MemoryStore::new())
///     .handler(issue_refund);
/// for _delivery in 0..2 {
///     poll_fn(|cx| service.poll_ready(cx)).await?;
///     assert_eq!(service.call(Job::new(42)).await?, "re_42");
/// }
/// # Ok(()) }
/// ```
pub struct IdempotentService<S, K> {
    pub(super) inner: S,
    pub(super) config: Idempotent<K>,
}

impl<S: Clone, K> Clone for IdempotentService<S, K> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            config: self.config.clone(),
        }
    }
}

impl<S, K> std::fmt::Debug for IdempotentService<S, K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotentService")
            .field("task", &self.config.task.name())
            .field("inner", &std::any::type_name::<S>())
            .finish_non_exhaustive()
    }
}

/// Why a job's call ended without a value: the handler said so, or idempotask did.
enum Failure {
    Handler(BoxDynError),
    Idempotask(Error),
}

impl From<Error> for Failure {
    fn from(err: Error) -> Self {
        Self::Idempotask(err)
    }
}

impl<S, K, Args> Service<Job<Args>> for IdempotentService<S, K>
where
    S: Service<Job<Args>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxDynError>,
    S::Response: Serialize + DeserializeOwned + Send + Sync + 'static,
    K: JobKey<Args>,
    Args: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxDynError;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, BoxDynError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxDynError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, job: Job<Args>) -> Self::Future {
        let key = self.config.key.key(&job);
        // The handler is called only once the lock is held, so a duplicate never starts it; the
        // instance that `poll_ready` prepared is the one that runs, as tower requires.
        let ready = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, ready);
        let config = self.config.clone();
        Box::pin(async move {
            let key = key.map_err(|missing| Box::new(AbortError::new(missing)) as BoxDynError)?;
            let mut call = config.task.call(key);
            if let Some(store) = &config.store {
                call = call.store(store.clone());
            }
            let body = async move {
                inner
                    .call(job)
                    .await
                    .map_err(|err| Failure::Handler(err.into()))
            };
            // A panic becomes the job's error, retried by apalis like any handler failure; left
            // to unwind, it would end the worker's task with the job unsettled.
            match idempotask::catch_panic(call.run(body)).await {
                Ok(ran) => ran.map_err(|failure| match failure {
                    Failure::Handler(err) => err,
                    Failure::Idempotask(err) => to_apalis(err, config.task.settings().lock_ttl),
                }),
                Err(panic) => Err(Box::new(panic) as BoxDynError),
            }
        })
    }
}

/// Input: an error of idempotask's own. Output: the error apalis acts on: retry later when the key
/// is busy, abort when no retry can succeed (a unit held in doubt among them: a retry would be
/// held too, until an operator resolves it), an ordinary (retried) failure otherwise.
fn to_apalis(err: Error, lock_ttl: Duration) -> BoxDynError {
    match err.redelivery() {
        Redelivery::AfterHolder(remaining) => {
            let wait = remaining.unwrap_or(lock_ttl);
            Box::new(RetryAfterError::new(err, wait))
        }
        Redelivery::Never => Box::new(AbortError::new(err)),
        // A store error, no store installed, misuse, and anything newer: an ordinary failure,
        // retried (apalis reports it). Aborting on misuse would kill a bad deploy's backlog.
        _ => Box::new(err),
    }
}

impl<K> Idempotent<K> {
    /// Wraps an apalis handler function (any `async fn(Args, extractors…)` that `build` accepts)
    /// so that its jobs run at most once per key.
    ///
    /// The handler's `Ok` type is stored as JSON, so it must implement `Serialize` and
    /// `DeserializeOwned` (`()` does).
    pub fn handler<F, Args, FnArgs>(
        self,
        handler: F,
    ) -> IdempotentService<TaskFn<F, Args, FnArgs>, K> {
        self.layer(task_fn(handler))
    }
}

impl<S, K> Layer<S> for Idempotent<K> {
    type Service = IdempotentService<S, K>;

    fn layer(&self, inner: S) -> Self::Service {
        IdempotentService {
            inner,
            config: self.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_misused_task_is_retried_not_killed() {
        let misuse = to_apalis(Error::NoRuntime, Duration::from_secs(30));
        assert!(misuse.downcast_ref::<AbortError>().is_none(), "{misuse:?}");
        assert!(misuse.downcast_ref::<Error>().is_some(), "{misuse:?}");
        let unusable = Error::from(idempotask::store::check_task_name("").unwrap_err());
        let unusable = to_apalis(unusable, Duration::from_secs(30));
        assert!(
            unusable.downcast_ref::<AbortError>().is_some(),
            "{unusable:?}"
        );
    }
}
