//! One call of a task: take the lock or the stored result, run the body, record the outcome.

use std::panic::resume_unwind;
use std::pin::Pin;
use std::sync::Arc;

use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::time::Instant;
use tracing::Instrument;

use crate::context::{Fence, Lease, TaskContext};
use crate::error::{CallerKey, CodecErrorKind, Error, codec, lock_lost};
use crate::fingerprint::Fingerprint;
use crate::held_lock::{OnDrop, Recording, Renewal, release, renewing};
use crate::install::current;
use crate::marker::{Marker, MarkerView};
use crate::observe::{Ending, Observation};
use crate::outcome::{Outcome, Report};
use crate::panicked::catching_panics;
use crate::store::{SharedStore, Store};
use crate::task::Task;
use crate::unit::{LockToken, UnitOfWork};
use begin::{Start, begin, stored_marker, unreadable};

mod begin;
pub(crate) mod reconcile;
mod transaction;

/// One delivery of a [`Task`] for one caller key; [`run`](Self::run) it with the body.
#[derive(Debug)]
#[must_use = "a call does nothing until it is run"]
pub struct Call<'t> {
    pub(crate) task: &'t Task,
    pub(crate) key: String,
    pub(crate) fingerprint: Option<Fingerprint>,
    pub(crate) store: Option<SharedStore>,
}

/// The return type of a task: a `Result`, whose parts the other checks look at.
#[diagnostic::on_unimplemented(
    message = "an idempotent task must return a `Result`, not `{Self}`",
    label = "its `Ok` value is stored for duplicates and its errors are never cached",
    note = "return `Result<T, E>` where `T` is what duplicates get back"
)]
pub trait TaskOutput {
    /// The success type.
    type Ok;
    /// The error type.
    type Err;

    /// The value as a `Result`.
    ///
    /// # Errors
    /// The task's own error.
    fn into_result(self) -> Result<Self::Ok, Self::Err>;

    /// A `Result` as the task's return type.
    fn from_result(result: Result<Self::Ok, Self::Err>) -> Self;
}

impl<T, E> TaskOutput for Result<T, E> {
    type Ok = T;
    type Err = E;

    fn into_result(self) -> Self {
        self
    }

    fn from_result(result: Self) -> Self {
        result
    }
}

/// The fingerprint of the `fingerprint = [..]` parameters.
///
/// # Errors
/// [`Error::Codec`] when the parameters cannot be serialised.
pub(crate) fn fingerprint<T: Serialize + ?Sized>(
    task: &Task,
    key: &str,
    value: &T,
) -> Result<Fingerprint, Error> {
    Fingerprint::of(value).map_err(|err| {
        Error::Codec {
            task: task.name().to_owned(),
            key: CallerKey::plain(key),
            kind: CodecErrorKind::Fingerprint,
            reason: format!("the `fingerprint` parameters cannot be serialised: {err}"),
        }
        .keys_shown_as(task.log_key)
    })
}

impl Task {
    /// One call of this task for the caller's `key`.
    pub fn call(&self, key: impl Into<String>) -> Call<'_> {
        Call {
            task: self,
            key: key.into(),
            fingerprint: None,
            store: None,
        }
    }
}

impl Call<'_> {
    /// Checks that a reused key comes with the same arguments: a later call whose fingerprint
    /// differs gets [`Error::KeyReuse`].
    pub fn fingerprint(mut self, fingerprint: Fingerprint) -> Self {
        self.fingerprint = Some(fingerprint);
        self
    }

    /// Like [`fingerprint`](Self::fingerprint), computed from `arguments` (a tuple for several).
    ///
    /// # Errors
    /// [`Error::Codec`] of kind [`Fingerprint`](crate::CodecErrorKind::Fingerprint) when the
    /// arguments cannot be serialised; nothing ran.
    pub fn fingerprint_of<A: Serialize + ?Sized>(self, arguments: &A) -> Result<Self, Error> {
        let fingerprint = fingerprint(self.task, &self.key, arguments)?;
        Ok(self.fingerprint(fingerprint))
    }

    /// Uses `store` for this call instead of the installed one (a [`SharedStore`] is used as
    /// it is, not wrapped again).
    pub fn store(mut self, store: impl Store) -> Self {
        self.store = Some(SharedStore::new(store));
        self
    }

    /// Runs `body` at most once for this key and returns its value, or the stored value of the
    /// execution that already happened.
    ///
    /// `body` is only polled once the lock is held, so creating it costs nothing. It is moved
    /// to the heap once, when `run` is called, so the call's own future stays small (about
    /// 1 KiB) whatever the body holds across its awaits.
    ///
    /// # Behaviour
    /// - Done already: the stored value, decoded; the body does not run.
    /// - Locked by another delivery: waits as the task's [`RetryPolicy`](crate::RetryPolicy) says, asking again
    ///   after each wait, then [`Error::Contended`].
    /// - Lock taken: runs the body with [`context()`](crate::context) set. `Ok` stores the
    ///   result and releases the lock; `Err` releases the lock and stores nothing (errors are
    ///   never cached); a panic releases the lock and resumes. If this future is dropped while
    ///   the body runs, the lock is released in the background (or expires with its TTL).
    /// - Store failures are retried a few times with the same lock token; if the store still
    ///   cannot confirm the lock, the body does not run ([`Error::Store`]).
    ///
    /// # Errors
    /// The body's own error, or an [`Error`] converted into `E`.
    pub fn run<T, E, F>(self, body: F) -> impl Future<Output = Result<T, E>>
    where
        T: Serialize + DeserializeOwned,
        E: From<Error>,
        F: Future<Output = Result<T, E>>,
    {
        self.drive(Box::pin(body), |result| result.map(|report| report.value))
    }

    /// Like [`run`](Self::run), and also says how the value came about.
    ///
    /// The call runs in an `idempotask.call` span whose fields say what happened; see
    /// [`observe`](crate::observe).
    ///
    /// # Errors
    /// As [`run`](Self::run).
    pub fn run_reported<T, E, F>(self, body: F) -> impl Future<Output = Result<Report<T>, E>>
    where
        T: Serialize + DeserializeOwned,
        E: From<Error>,
        F: Future<Output = Result<T, E>>,
    {
        self.drive(Box::pin(body), |result| result)
    }

    /// The one `async` part of every way of running a call. The body's future comes boxed,
    /// once, before any state of the runner exists: each layer below holds a pointer to it,
    /// where holding the future itself would store it once per layer that awaits it.
    ///
    /// An `async` block rather than an `async fn`: an `async fn` moves each argument into a
    /// local of its own and keeps both.
    #[expect(
        clippy::manual_async_fn,
        reason = "an `async fn` would store the call twice in its future"
    )]
    pub(crate) fn drive<T, E, B, O>(
        self,
        body: Pin<Box<B>>,
        finish: impl FnOnce(Result<Report<T>, E>) -> O,
    ) -> impl Future<Output = O>
    where
        T: Serialize + DeserializeOwned,
        E: From<Error>,
        B: Future<Output: TaskOutput<Ok = T, Err = E>>,
    {
        async move {
            let observation = Observation::start(&self.task.name);
            let span = observation.span().clone();
            let result = self.run_observed(body, &observation).instrument(span).await;
            finish(concluded(&observation, result))
        }
    }

    /// Runs the call; an error comes with how the call ended, for the observation.
    async fn run_observed<T, E, B>(
        &self,
        body: Pin<Box<B>>,
        observation: &Observation<'_>,
    ) -> Result<Report<T>, (E, Ending)>
    where
        T: Serialize + DeserializeOwned,
        E: From<Error>,
        B: Future<Output: TaskOutput<Ok = T, Err = E>>,
    {
        let store = self
            .store
            .clone()
            .or_else(current)
            .ok_or_else(|| self.failed(Error::NotConfigured))?;
        let unit = self
            .unit(store.max_key_len(), observation)
            .map_err(|err| self.failed(err))?;
        let logging = self.task.log_key;
        let token = self.task.lock_token();
        // Armed before the first `begin` is sent: dropped while one is in flight, the call may
        // hold a lock nobody else knows of.
        let mut on_drop = OnDrop::release(&store, &unit, &token, logging);
        // In a block of its own, so that the answer's storage ends with it instead of staying
        // in the call's future through the body and the recording.
        let (fencing_token, attempts, lease, in_doubt) = {
            let waiting = Instant::now();
            let start = match begin(self.task, &store, &unit, &token).await {
                Ok(start) => start,
                Err(err) => {
                    if let Error::Contended { attempts, .. } = &err {
                        observation.waited(*attempts, waiting.elapsed());
                    }
                    // A failed `begin` cleans up after itself (see `begin`).
                    on_drop.disarm();
                    return Err(self.failed(err));
                }
            };
            let (Start::Replay { attempts, .. } | Start::Run { attempts, .. }) = &start;
            observation.waited(*attempts, waiting.elapsed());
            match start {
                Start::Replay { marker, attempts } => {
                    on_drop.disarm();
                    return self.replayed(&unit, &marker, attempts, observation);
                }
                Start::Run {
                    fencing_token,
                    attempts,
                    lease,
                    in_doubt,
                } => (fencing_token, attempts, lease, in_doubt),
            }
        };
        observation.fencing_token(fencing_token);
        // From here on the store recognises our lock by its token, fencing token and the doubt
        // it took over (a release then leaves the unit in doubt: only a result ends a doubt).
        let mut token = token.granted(fencing_token);
        if let Some(doubt) = &in_doubt {
            token = token.taking_over(**doubt);
        }
        let context = self.context(&store, &unit, &token, &lease, attempts);
        let context = context.with_doubt(in_doubt.clone());
        let guarded = context.scope(catching_panics(body));
        let running = Instant::now();
        let result = if self.task.renewal.is_on() {
            let renewal = Renewal {
                store: store.clone(),
                unit: unit.clone(),
                token: token.clone(),
                lease: Arc::clone(&lease),
                lock_ttl: self.task.lock_ttl,
                logging,
            };
            // Boxed: the watchdog's state would otherwise be part of every call's future,
            // renewed or not.
            Box::pin(renewing(guarded, renewal, self.task.renewal)).await
        } else {
            guarded.await
        };
        self.body_ran(observation, &unit, &lease, running);
        // The `match` ends before the recording's await, so that its value does not stay in
        // the call's future.
        let value = match result.map(TaskOutput::into_result) {
            Err(panic) => {
                on_drop.disarm();
                observation.ended(Ending::Failed);
                if releases_after_failure(&unit, logging, &lease) {
                    release(&store, &unit, &token, logging).await;
                }
                resume_unwind(panic)
            }
            Ok(Err(err)) => {
                on_drop.disarm();
                if releases_after_failure(&unit, logging, &lease) {
                    release(&store, &unit, &token, logging).await;
                }
                return Err(self.body_failed(err, &unit, &lease));
            }
            // Refused at a fence or a step, the value is not this unit's result.
            Ok(Ok(_)) if lease.was_fenced_out() || lease.holds() => {
                on_drop.disarm();
                return Err(self.failed(lease.refusal(&unit, logging)));
            }
            Ok(Ok(value)) => value,
        };
        // Encoded while a drop (or a panic in `Serialize`) still releases.
        let marker = self.marker_for(&unit, &token, &value);
        // From here a dropped call still records the result in the background: the side
        // effect happened.
        let kept_for = self.task.kept_for();
        let marker = on_drop.finish_instead(&token, marker, kept_for, &lease);
        let outcome = Recording::of(&store, &unit, &token, logging, &lease)
            .record(marker, kept_for)
            .await;
        on_drop.disarm();
        Ok(Report {
            value,
            outcome,
            fencing_token,
            attempts,
            in_doubt: in_doubt.map(|doubt| *doubt),
        })
    }

    /// Observes the body's time and how much of its lock it used.
    fn body_ran(
        &self,
        observation: &Observation<'_>,
        unit: &UnitOfWork,
        lease: &Lease,
        since: Instant,
    ) {
        observation.body_ran(since.elapsed());
        let renewed = self.task.renewal.is_on();
        observation.lock_used(
            unit,
            self.task.log_key,
            lease.age(),
            self.task.lock_ttl,
            renewed,
        );
    }

    /// The body's context, once the lock is granted: its fence armed, with its steps' limits.
    fn context(
        &self,
        store: &SharedStore,
        unit: &UnitOfWork,
        token: &LockToken,
        lease: &Arc<Lease>,
        attempts: u32,
    ) -> TaskContext {
        lease.arm_fence(Fence::new(
            store,
            token,
            self.task.lock_ttl,
            self.task.step_limits(),
        ));
        TaskContext::new(
            unit.clone(),
            token.fencing_token(),
            attempts,
            Arc::clone(lease),
        )
    }

    /// The call's error for a body's `Err`: the body's own, or [`Error::LockNotHeld`] when a
    /// fence of the body was refused (whatever the body returned after it).
    fn body_failed<E: From<Error>>(&self, err: E, unit: &UnitOfWork, lease: &Lease) -> (E, Ending) {
        if lease.was_fenced_out() {
            self.failed(lock_lost(unit, self.task.log_key))
        } else {
            (err, Ending::Failed)
        }
    }

    /// An error of idempotask's own as the call's error, with how the call ended. Every error
    /// of the runner's leaves through here, so this is where the task's key logging applies to
    /// the keys it carries.
    pub(crate) fn failed<E: From<Error>>(&self, err: Error) -> (E, Ending) {
        let ending = match err {
            Error::Contended { .. } => Ending::Contended,
            Error::InDoubt { .. } => Ending::InDoubt,
            _ => Ending::Failed,
        };
        (E::from(err.keys_shown_as(self.task.log_key)), ending)
    }

    /// The unit this call runs, once the call is known to be allowed: its task's name is its
    /// own, its key valid for a store that takes keys up to `max_key_len` bytes, and the call
    /// neither made from inside the same unit nor outside a tokio runtime.
    fn unit(&self, max_key_len: usize, observation: &Observation<'_>) -> Result<UnitOfWork, Error> {
        crate::task_names::claim(self.task)?;
        let unit = UnitOfWork::with_limit(self.task.name(), self.key.as_str(), max_key_len)?;
        observation.key(&unit, self.task.log_key);
        refuse_misuse(&unit)?;
        Ok(unit)
    }

    /// The report of a duplicate delivery that found the stored `marker` after `attempts` asks.
    pub(crate) fn replayed<T: DeserializeOwned, E: From<Error>>(
        &self,
        unit: &UnitOfWork,
        marker: &[u8],
        attempts: u32,
        observation: &Observation<'_>,
    ) -> Result<Report<T>, (E, Ending)> {
        let marker = stored_marker(unit, marker).map_err(|err| self.failed(err))?;
        observation.fencing_token(marker.fencing_token);
        let value = self.replay(unit, &marker).map_err(|err| self.failed(err))?;
        Ok(Report {
            value,
            outcome: Outcome::Replayed,
            fencing_token: marker.fencing_token,
            attempts,
            in_doubt: None,
        })
    }

    /// Decodes a stored result for a duplicate delivery: its JSON is parsed once, into `T`.
    pub(crate) fn replay<T: DeserializeOwned>(
        &self,
        unit: &UnitOfWork,
        marker: &MarkerView<'_>,
    ) -> Result<T, Error> {
        if let Some(expected) = &self.fingerprint {
            match marker.fingerprint {
                Some(stored) if stored == expected.as_str() => {}
                Some(_) => {
                    return Err(Error::KeyReuse {
                        task: unit.task().to_owned(),
                        key: CallerKey::plain(unit.key()),
                    });
                }
                // Stored before the task declared a fingerprint (a deploy added it): there is
                // nothing to compare, and refusing would turn every redelivery of work done
                // before the deploy into an error.
                None => tracing::warn!(
                    task = unit.task(),
                    key = self.task.log_key.show(unit),
                    "the stored result has no fingerprint to compare the arguments with; it is replayed as it is"
                ),
            }
        }
        match marker.result {
            Ok(json) => serde_json::from_str(json).map_err(|err| {
                // Text that is not JSON at all is a damaged marker, whichever error the
                // decoder met first; JSON of another shape is the task's type that changed.
                if serde_json::from_str::<serde::de::IgnoredAny>(json).is_err() {
                    let not_json =
                        format!("not a completion marker: the result is not JSON: {err}");
                    return unreadable(unit, &not_json);
                }
                codec(
                    unit,
                    CodecErrorKind::Undecodable,
                    format!("its stored result does not decode into the task's return type: {err}"),
                )
            }),
            Err(reason) => Err(codec(
                unit,
                CodecErrorKind::Unstorable,
                format!(
                    "the first execution succeeded but its result could not be stored: {reason}"
                ),
            )),
        }
    }

    /// The completion marker of a successful execution that returned `value`. A value that
    /// cannot be encoded is recorded as such, so duplicates get an error instead of running.
    pub(crate) fn marker_for<T: Serialize + DeserializeOwned>(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        value: &T,
    ) -> Vec<u8> {
        let (marker, encoded) = Marker::encode_value(
            unit.key(),
            token,
            token.fencing_token(),
            self.fingerprint.as_ref(),
            value,
        );
        if let Err(reason) = &encoded {
            tracing::warn!(
                task = unit.task(),
                key = self.task.log_key.show(unit),
                error = %reason,
                "the task succeeded but its result cannot be stored; duplicates will get an error instead of running it again"
            );
        }
        marker
    }
}

/// Input: how a call ended. Output: its result for the caller, once the ending is recorded on
/// the call's span and metrics (here, and only here, for every way of running a call).
fn concluded<T, E>(
    observation: &Observation<'_>,
    result: Result<Report<T>, (E, Ending)>,
) -> Result<Report<T>, E> {
    match result {
        Ok(report) => {
            observation.ended(match report.outcome {
                Outcome::Executed => Ending::Executed,
                Outcome::Replayed => Ending::Replayed,
                Outcome::Reconciled => Ending::Reconciled,
                Outcome::LockLost { .. } => Ending::LockLost,
                Outcome::MarkerNotWritten => Ending::MarkerNotWritten,
            });
            Ok(report)
        }
        Err((err, ending)) => {
            observation.ended(ending);
            Err(err)
        }
    }
}

/// Misuse that would otherwise fail late with a lock held: a call from the body of the very
/// unit it names (it would wait on its own lock until it expired, then run again), and a call
/// outside a tokio runtime (its timers and background releases would panic).
fn refuse_misuse(unit: &UnitOfWork) -> Result<(), Error> {
    if let Some(running) = crate::context::context()
        && running.task() == unit.task()
        && running.key() == unit.key()
    {
        return Err(Error::Reentered {
            task: unit.task().to_owned(),
            key: CallerKey::plain(unit.key()),
        });
    }
    if tokio::runtime::Handle::try_current().is_err() {
        return Err(Error::NoRuntime);
    }
    Ok(())
}

/// Whether the lock of a body that failed or panicked is released: not when the unit is held
/// (one of its steps' effects happened without a confirmed record, or its steps changed
/// order). Released, the unit would run again at once; left to lapse, it is in doubt, as after
/// a crash, until a result is recorded or an operator resolves it.
fn releases_after_failure(
    unit: &UnitOfWork,
    logging: crate::observe::KeyLogging,
    lease: &Lease,
) -> bool {
    if !lease.holds() {
        return true;
    }
    tracing::warn!(
        task = unit.task(),
        key = logging.show(unit),
        "the unit is held: the lock is left to lapse and the unit to be in doubt"
    );
    false
}
