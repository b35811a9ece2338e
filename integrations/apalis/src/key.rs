//! Where a job's idempotency key comes from: its arguments, or the key it was pushed with.

use apalis_core::task::Task as Job;

/// Where the idempotency key of an apalis job comes from.
///
/// Implemented for every `Fn(&Args) -> String` (the key derived from the job's arguments, the
/// usual choice) and for [`IdempotencyKey`] (the key the producer pushed the job with).
///
/// The key must name one business operation: two jobs that must not both take effect get the same
/// key, two that must both take effect get different ones. A generated value (a UUID made by the
/// worker, the job's attempt) defeats the point.
///
/// ```
/// use idempotask_apalis::JobKey;
/// use apalis_core::task::Task as Job;
///
/// struct Order { id: u64 }
///
/// let by_order = |order: &Order| format!("order-charge-{}", order.id);
/// let job = Job::new(Order { id: 42 });
/// assert_eq!(by_order.key(&job).unwrap(), "order-charge-42");
/// ```
pub trait JobKey<Args>: Send + Sync + 'static {
    /// The key of `job`.
    ///
    /// # Errors
    /// [`MissingKey`] when the job carries no key; the job is then aborted, not run.
    fn key(&self, job: &Job<Args>) -> Result<String, MissingKey>;
}

impl<Args, F> JobKey<Args> for F
where
    F: Fn(&Args) -> String + Send + Sync + 'static,
{
    fn key(&self, job: &Job<Args>) -> Result<String, MissingKey> {
        Ok(self(&job.args))
    }
}

/// The key the producer gave the job when it pushed it (apalis's
/// [`ExecutionContext::idempotency_key`](apalis_core::task::ExecutionContext::idempotency_key),
/// set with `TaskBuilder::idempotency_key`).
///
/// Opt in to it when the producer already names each operation. A job pushed without a key fails
/// with [`MissingKey`] as an `AbortError` and does not run: running it unprotected would silently
/// drop the guarantee.
///
/// ```
/// use apalis_core::task::builder::TaskBuilder;
/// use idempotask_apalis::{IdempotencyKey, JobKey};
///
/// let job = TaskBuilder::new(42_u64).idempotency_key("order-charge-42").build();
/// assert_eq!(IdempotencyKey.key(&job).unwrap(), "order-charge-42");
///
/// let unkeyed = TaskBuilder::new(43_u64).build();
/// assert!(IdempotencyKey.key(&unkeyed).is_err());
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IdempotencyKey;

impl<Args> JobKey<Args> for IdempotencyKey {
    fn key(&self, job: &Job<Args>) -> Result<String, MissingKey> {
        job.idempotency_key()
            .map(str::to_owned)
            .ok_or_else(|| MissingKey::new(job.task_id().map(ToString::to_string)))
    }
}

/// A job that carries no idempotency key where one was expected.
///
/// Nothing ran. Push the job with a key (`TaskBuilder::idempotency_key`), or key the task by the
/// job's arguments instead of [`IdempotencyKey`].
///
/// ```
/// use idempotask_apalis::MissingKey;
/// let err = MissingKey::new(Some("01J9ZQ".to_owned()));
/// assert_eq!(err.job_id(), Some("01J9ZQ"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "job {} has no idempotency key; push it with `TaskBuilder::idempotency_key`, or key the task by the job's arguments",
    .job_id.as_deref().unwrap_or("(without an id)")
)]
pub struct MissingKey {
    job_id: Option<String>,
}

impl MissingKey {
    /// The error for the job with id `job_id` (for [`JobKey`] implementations).
    pub fn new(job_id: Option<String>) -> Self {
        Self { job_id }
    }

    /// The apalis id of the job, if it had one.
    pub fn job_id(&self) -> Option<&str> {
        self.job_id.as_deref()
    }
}
