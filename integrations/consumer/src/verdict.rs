//! One message's call, and what its end calls for from the queue.

use std::future::Future;
use std::time::Duration;

use idempotask::{Error, Fingerprint, Panicked, Redelivery, Report, catch_panic};
use serde::Serialize;
use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};

use crate::delay::{MIN_DELAY, retry_delay};
use crate::{ConsumerSettings, History};

/// What the queue must do with a message once its call has ended: ack it, hand it back for a
/// delay, or end it on the dead-letter path, and why. See the [crate docs](crate) for which end
/// of a call is which.
///
/// ```
/// use std::time::Duration;
/// use idempotask_consumer::Verdict;
///
/// // A queue's settle step: its own verbs for each verdict.
/// fn verb<T, E>(verdict: &Verdict<T, E>) -> String {
///     match verdict {
///         Verdict::Ack(_) => "ack".to_owned(),
///         Verdict::Retry { delay, .. } | Verdict::Defer { delay, .. } => format!("nak {delay:?}"),
///         Verdict::Hold(err) => format!("dead-letter, reason: {err}"),
///         Verdict::GiveUp { .. } | Verdict::Refuse(_) => "dead-letter".to_owned(),
///     }
/// }
/// # let _ = verb::<(), ()>;
/// ```
///
/// Exhaustive on purpose: a new way for a call to end must be mapped by every queue
/// integration, so adding one breaks each integration's `match` until it is.
#[derive(Debug)]
pub enum Verdict<T, E> {
    /// The body ran and its result was stored, or the stored result of an earlier execution was
    /// handed back (the body did not run), or the body ran but its lock or marker was lost
    /// (the side effect happened; running it again would not undo it): ack the message.
    Ack(Report<T>),
    /// The body failed, for the `failures`-th time, below
    /// [`max_failures`](ConsumerSettings::max_failures): its lock was released, nothing was
    /// stored. Hand the message back for `delay`, and record `failures` where its next
    /// delivery's [`History::failures`] reads it.
    #[non_exhaustive]
    Retry {
        /// The body's error, or its panic.
        failure: BodyFailure<E>,
        /// How many times the body failed for this message, this one included.
        failures: u32,
        /// The [`failure_backoff`](ConsumerSettings::failure_backoff)'s delay for `failures`.
        delay: Duration,
    },
    /// The body failed for the `failures`-th time, at or past
    /// [`max_failures`](ConsumerSettings::max_failures): nothing was stored. End the message on
    /// the dead-letter path instead of trying it again.
    #[non_exhaustive]
    GiveUp {
        /// The body's last error, or its panic.
        failure: BodyFailure<E>,
        /// How many times the body failed for this message, this one included; deferrals do
        /// not count.
        failures: u32,
    },
    /// idempotask could not decide yet, and the body did not run (or its lock was released):
    /// hand the message back for `delay`. Not a failure of the message.
    #[non_exhaustive]
    Defer {
        /// Why: [`Error::Contended`], [`Error::Store`], [`Error::NotConfigured`], or a misused
        /// task (`Reentered`, `TaskNameTaken`, `NoRuntime`, logged as an error: the deploy is
        /// wrong, not the message, which must outlive the fix).
        error: Error,
        /// For a busy key, the holder's remaining lock time (the lock TTL when the store did
        /// not say); otherwise the [`store_backoff`](ConsumerSettings::store_backoff)'s delay for
        /// `deferral`.
        delay: Duration,
        /// `None` for a busy key, which says nothing about the store; otherwise which deferral
        /// for the store this is ([`History::deferrals`] plus one), for a queue that counts
        /// them.
        deferral: Option<u32>,
    },
    /// No delivery of this message can succeed ([`Redelivery::Never`]): its key is invalid or
    /// reused with another payload, or the stored result cannot be read or is not its own.
    /// End it on the dead-letter path. Nothing ran for this delivery, except on an
    /// [`Error::Codec`] (see [`Redelivery`]).
    Refuse(Error),
    /// The message's unit is in doubt and its task holds such units ([`Error::InDoubt`]): an
    /// earlier delivery's lock ran out without a release or a result, and nothing ran for this
    /// one. The message is sound, but every delivery would be held until an operator resolves
    /// the unit: end it on the dead-letter path with the error as its reason, for re-driving
    /// after that.
    Hold(Error),
}

/// Why a body gave no value: it returned an error, or it panicked. Both are failures of the
/// body alike: counted against [`max_failures`](ConsumerSettings::max_failures), retried with the
/// failure backoff, the message given up once they are used up.
///
/// ```
/// use idempotask_consumer::BodyFailure;
/// let failure: BodyFailure<std::io::Error> = BodyFailure::Error(std::io::Error::other("declined"));
/// assert_eq!(failure.to_string(), "declined");
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum BodyFailure<E> {
    /// The body's `Err`.
    Error(E),
    /// The body panicked. idempotask released its lock, as after an `Err`; the panic is caught
    /// so that the message is settled instead of left to the queue's redelivery clock.
    Panicked(Panicked),
}

impl<E> BodyFailure<E> {
    /// The body's error, or its panic: for a queue whose own failure type has a variant for
    /// each, without a wildcard arm.
    ///
    /// ```
    /// use idempotask_consumer::BodyFailure;
    /// let failure: BodyFailure<&str> = BodyFailure::Error("declined");
    /// assert_eq!(failure.into_error().ok(), Some("declined"));
    /// ```
    ///
    /// # Errors
    /// The body's panic, when it panicked.
    pub fn into_error(self) -> Result<E, Panicked> {
        match self {
            Self::Error(err) => Ok(err),
            Self::Panicked(panic) => Err(panic),
        }
    }
}

impl<E: std::fmt::Display> std::fmt::Display for BodyFailure<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Error(err) => err.fmt(f),
            Self::Panicked(panic) => panic.fmt(f),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for BodyFailure<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Error(err) => Some(err),
            Self::Panicked(panic) => Some(panic),
        }
    }
}

/// Why a message's call ended without a value: the body said so, or idempotask did.
enum Failure<E> {
    Body(E),
    Idempotask(Error),
}

impl<E> From<Error> for Failure<E> {
    fn from(err: Error) -> Self {
        Self::Idempotask(err)
    }
}

impl ConsumerSettings {
    /// Runs `body` for one message at most once per `key` and answers what the queue must do
    /// with the message ([`Verdict`]); `history` says what came before this delivery.
    ///
    /// `body` is only polled once the lock is held, so creating it costs nothing and a
    /// duplicate never starts it. A panic in it is caught (around the whole call: the runner
    /// releases the lock of a body that panics and lets the panic go on), so that it is a
    /// failure of the body, counted and settled, instead of a message left to the queue's
    /// redelivery clock. `payload` is hashed only with
    /// [`fingerprint_payload`](Self::fingerprint_payload) on. The body's `Ok` type is stored as
    /// JSON, so it must implement `Serialize` and `DeserializeOwned` (`()` does).
    ///
    /// ```
    /// use idempotask::{MemoryStore, Outcome, Task};
    /// use idempotask_consumer::{ConsumerSettings, History, Verdict};
    ///
    /// struct First;
    /// impl History for First {
    ///     async fn failures(&self) -> u32 { 0 }
    ///     async fn deferrals(&self) -> u32 { 0 }
    /// }
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let settings = ConsumerSettings::new(Task::new("order_charge")).store(MemoryStore::new());
    /// let mut outcomes = Vec::new();
    /// for _delivery in 0..2 {
    ///     let body = async { Ok::<_, std::io::Error>(42_u32) };
    ///     if let Verdict::Ack(report) = settings.run("order-7", b"{}", &First, body).await {
    ///         outcomes.push((report.value, report.outcome));
    ///     }
    /// }
    /// assert_eq!(outcomes, [(42, Outcome::Executed), (42, Outcome::Replayed)]);
    /// # }
    /// ```
    pub fn run<T, E, F, H>(
        &self,
        key: impl Into<String>,
        payload: &[u8],
        history: &H,
        body: F,
    ) -> impl Future<Output = Verdict<T, E>>
    where
        T: Serialize + DeserializeOwned,
        F: Future<Output = Result<T, E>>,
        H: History + ?Sized,
    {
        let mut call = self.task.call(key);
        if let Some(store) = &self.store {
            call = call.store(store.clone());
        }
        if self.fingerprint_payload {
            // The digest of the bytes stands for them: serialising them through JSON would
            // cost a value per byte.
            let digest = Sha256::digest(payload);
            call = call.fingerprint(Fingerprint::from_sha256(digest.into()));
        }
        // On the heap before the call's future exists: an async block keeps what it captures
        // for as long as it lives, beside every future it awaits, so a body captured inline
        // would be paid for again in this future and in every integration's future around it.
        // (Started here instead, the call's future would be kept so, next to the count's.)
        let body = Box::pin(async move { body.await.map_err(Failure::Body) });
        async move {
            let failure = match catch_panic(call.run_reported(body)).await {
                Ok(Ok(report)) => return Verdict::Ack(report),
                Ok(Err(Failure::Idempotask(err))) => return self.undecided(err, history).await,
                Ok(Err(Failure::Body(error))) => BodyFailure::Error(error),
                Err(panic) => BodyFailure::Panicked(panic),
            };
            let failures = history.failures().await.saturating_add(1);
            if failures >= self.max_failures {
                return Verdict::GiveUp { failure, failures };
            }
            Verdict::Retry {
                failure,
                failures,
                delay: retry_delay(&self.failure_backoff, failures),
            }
        }
    }

    /// Input: an error of idempotask's own. Output: a deferral when a later delivery can
    /// succeed, the dead-letter path when none can.
    async fn undecided<T, E, H>(&self, err: Error, history: &H) -> Verdict<T, E>
    where
        H: History + ?Sized,
    {
        match err.redelivery() {
            Redelivery::AfterHolder(remaining) => {
                // The holder has stored its result or lost its lock by then: either way the
                // redelivery decides at once instead of finding the lock taken again.
                let delay = remaining
                    .unwrap_or(self.task.settings().lock_ttl)
                    .max(MIN_DELAY);
                Verdict::Defer {
                    error: err,
                    delay,
                    deferral: None,
                }
            }
            // Not a fault of the message, but every delivery would be held too: the
            // dead-letter path, under a verdict of its own that says an operator must act.
            Redelivery::Never if matches!(err, Error::InDoubt { .. }) => Verdict::Hold(err),
            Redelivery::Never => Verdict::Refuse(err),
            // A store error, no store installed, misuse, or anything newer: fail closed and try
            // later.
            _ => {
                let deferral = history.deferrals().await.saturating_add(1);
                if err.is_misuse() {
                    // The program is wrong, not the message: giving it up would lose it, while
                    // a deferred message waits for the fixed deploy.
                    tracing::error!(
                        error = %err,
                        deferral,
                        "the task is misused; the message is delivered again later, fix the program"
                    );
                }
                Verdict::Defer {
                    error: err,
                    delay: retry_delay(&self.store_backoff, deferral),
                    deferral: Some(deferral),
                }
            }
        }
    }
}
