//! How a step runs: the body's cursor in its unit's journal, the replay, the record, and the
//! step in doubt.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::time::Instant;
use tracing::Instrument;

use super::cursor::Cursor;
use super::entry;
use super::kind::StepErrorKind;
use super::name::StepName;
use crate::backoff::STORE_RETRY_BACKOFF;
use crate::call::reconcile::Reconciled;
use crate::context::TaskContext;
use crate::error::{CallerKey, CodecErrorKind, Error, codec, held_in_doubt};
use crate::observe::{StepEnding, StepObservation};
use crate::store::{Doubt, StepEntry, Store};

/// How many times a step's record is sent when the store fails.
const RECORD_ATTEMPTS: u32 = 3;

/// What the cursor says a step does.
enum Turn<T> {
    Replay {
        value: T,
        position: u32,
    },
    Run {
        position: u32,
        max_bytes: usize,
        /// The unit's doubt, when this is the step it is about: the first its journal lacks.
        doubt: Option<Doubt>,
        /// The doubt came with the journal and the task holds units in doubt.
        held: bool,
    },
}

/// What a step in doubt does.
#[derive(Debug, Clone, Copy)]
pub(super) enum WhenInDoubt {
    Rerun,
    Hold,
    Reconcile,
}

/// The reconcile function of a step that has none.
type NoReconcile<T, E> = fn() -> std::future::Ready<Result<Reconciled<T>, E>>;

/// No reconcile function, for the steps that have none.
pub(super) fn no_reconcile<T, E>() -> Option<NoReconcile<T, E>> {
    None
}

/// Frees the cursor for the next step, however the step ends (an error, a cancel).
struct Running<'a>(&'a Mutex<Cursor>);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .running = false;
    }
}

impl TaskContext {
    pub(super) async fn run_step<T, E, F, R, RF>(
        &self,
        name: StepName,
        when_in_doubt: WhenInDoubt,
        reconcile: Option<R>,
        effect: F,
    ) -> Result<T, E>
    where
        T: Serialize + DeserializeOwned,
        E: From<Error>,
        F: Future<Output = Result<T, E>>,
        R: FnOnce() -> RF,
        RF: Future<Output = Result<Reconciled<T>, E>>,
    {
        let observed = StepObservation::start(self.task(), &name.shown(self.logging()));
        let span = observed.span().clone();
        self.observed_step(&observed, name, when_in_doubt, reconcile, effect)
            .instrument(span)
            .await
    }

    /// [`run_step`](Self::run_step) inside the step's span, its ending recorded at each way
    /// out.
    async fn observed_step<T, E, F, R, RF>(
        &self,
        observed: &StepObservation,
        name: StepName,
        when_in_doubt: WhenInDoubt,
        reconcile: Option<R>,
        effect: F,
    ) -> Result<T, E>
    where
        T: Serialize + DeserializeOwned,
        E: From<Error>,
        F: Future<Output = Result<T, E>>,
        R: FnOnce() -> RF,
        RF: Future<Output = Result<Reconciled<T>, E>>,
    {
        let ended = |ending| observed.ended(self.task(), ending);
        let failed = |err: Error| {
            ended(match &err {
                Error::Step {
                    kind: StepErrorKind::Unrecorded,
                    ..
                } => StepEnding::Unrecorded,
                Error::Step { kind, .. } => StepEnding::Refused(*kind),
                _ => StepEnding::Failed,
            });
            err
        };
        let kept_for = self.reserve(&name).map_err(failed)?;
        let running = Running(&self.lease().steps);
        self.load_journal(&name).await.map_err(failed)?;
        let (position, max_bytes, doubt, held) = match self.next_turn(&name).map_err(failed)? {
            Turn::Replay { value, position } => {
                observed.position(position);
                ended(StepEnding::Replayed);
                return Ok(value);
            }
            Turn::Run {
                position,
                max_bytes,
                doubt,
                held,
            } => (position, max_bytes, doubt, held),
        };
        let when_in_doubt = if held {
            WhenInDoubt::Hold
        } else {
            when_in_doubt
        };
        observed.position(position);
        if !self.lease().held() {
            // Ran out by this holder's clock: the store says whether the lock is still its
            // own (nobody took the unit over) before the effect may start.
            self.fence().await.map_err(failed)?;
        }
        let mut found = None;
        if let Some(doubt) = doubt {
            if self.in_doubt().is_none() {
                // The journal's doubt (a transactional execution that died), which no `begin`
                // saw: it is logged and counted here, once per delivery that meets it.
                self.observe_journal_doubt(when_in_doubt, &doubt);
            }
            match when_in_doubt {
                WhenInDoubt::Rerun => {}
                WhenInDoubt::Hold => {
                    ended(StepEnding::Held);
                    return Err(self.held(&name, doubt).into());
                }
                WhenInDoubt::Reconcile => {
                    if let Some(reconcile) = reconcile {
                        let reconciled = reconcile()
                            .await
                            .inspect_err(|_| ended(StepEnding::Failed))?;
                        if let Reconciled::Done(value) = reconciled {
                            found = Some(value);
                        }
                    }
                }
            }
        }
        let reconciled = found.is_some();
        let value = match found {
            Some(value) => value,
            None => effect.await.inspect_err(|_| ended(StepEnding::Failed))?,
        };
        let (bytes, encoded) = entry::encode(&name, &value, max_bytes);
        if let Err(reason) = &encoded {
            tracing::warn!(
                task = self.task(),
                step = %name.shown(self.logging()),
                error = %reason,
                "a step succeeded but its value cannot be recorded; reruns get an error instead of running it again"
            );
        }
        self.record(&name, StepEntry::new(position, &bytes, kept_for))
            .await
            .map_err(failed)?;
        ended(if reconciled {
            StepEnding::Reconciled
        } else {
            StepEnding::Ran
        });
        let mut cursor = self.cursor();
        cursor.next = position + 1;
        drop(cursor);
        drop(running);
        Ok(value)
    }

    /// Logs and counts a doubt only the journal reported, as `begin`'s are: an overdue hold
    /// (older than the task's `hold_alert_after`) is an `ERROR` and its own count.
    fn observe_journal_doubt(&self, when_in_doubt: WhenInDoubt, doubt: &Doubt) {
        // The task's policies are rerun and hold; a step reconciled runs (its reconcile or
        // its effect), so it counts as rerun.
        let policy = match when_in_doubt {
            WhenInDoubt::Hold => crate::InDoubt::Hold,
            WhenInDoubt::Rerun | WhenInDoubt::Reconcile => crate::InDoubt::Rerun,
        };
        let hold_alert_after = self
            .lease()
            .fence()
            .and_then(|fence| fence.steps().hold_alert_after);
        crate::observe::in_doubt(self.unit(), self.logging(), policy, hold_alert_after, doubt);
    }

    /// The error of a step in doubt that holds its unit.
    fn held(&self, name: &StepName, doubt: Doubt) -> Error {
        tracing::warn!(
            task = self.task(),
            key = self.logging().show(self.unit()),
            step = %name.shown(self.logging()),
            "the step in doubt is held: an earlier holder may have started it; resolve the unit to go on"
        );
        held_in_doubt(self.unit(), doubt).keys_shown_as(self.logging())
    }

    fn cursor(&self) -> std::sync::MutexGuard<'_, Cursor> {
        self.lease()
            .steps
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes the cursor for this step, refusing what can never be recorded; the journal's
    /// keep time.
    fn reserve(&self, name: &StepName) -> Result<Duration, Error> {
        let Some(fence) = self.lease().fence() else {
            return Err(self.step_error(name, StepErrorKind::Unsupported, "this database transaction has no store to record steps outside it (`TransactionScope::step_store`)"));
        };
        // A body that went on after a refusal that held the unit must not move the journal on:
        // the next step would take the place of the one whose effect is in doubt.
        if let Some(kind) = self.lease().held_by() {
            return Err(self.step_error(
                name,
                kind,
                "an earlier step of this execution was refused and holds the unit; no step runs until it is resolved",
            ));
        }
        let mut cursor = self.cursor();
        if cursor.running {
            return Err(self.step_error(
                name,
                StepErrorKind::Overlapping,
                "another step of this body is still running; steps run one at a time",
            ));
        }
        if !fence.store().records_steps() {
            return Err(self.step_error(
                name,
                StepErrorKind::Unsupported,
                "the task's store does not record steps",
            ));
        }
        cursor.running = true;
        Ok(fence.steps().kept_for)
    }

    /// Reads the unit's journal at the body's first step, again when the store fails.
    async fn load_journal(&self, name: &StepName) -> Result<(), Error> {
        if self.cursor().recorded.is_some() {
            return Ok(());
        }
        let Some(fence) = self.lease().fence() else {
            return Err(self.step_error(
                name,
                StepErrorKind::Unsupported,
                "the call has no store lock to record steps under",
            ));
        };
        let mut failures = 0;
        let journal = loop {
            match fence.store().read_journal(self.unit()).await {
                Ok(journal) => break journal,
                Err(err) => {
                    failures += 1;
                    if !err.is_retryable() || failures >= RECORD_ATTEMPTS {
                        return Err(Error::Store(err));
                    }
                }
            }
            tokio::time::sleep(STORE_RETRY_BACKOFF.delay(failures)).await;
        };
        let mut cursor = self.cursor();
        cursor.doubt = journal.doubt();
        cursor.recorded = Some(journal.into_entries());
        Ok(())
    }

    /// Replays the step from the journal, or says where it goes.
    fn next_turn<T: DeserializeOwned>(&self, name: &StepName) -> Result<Turn<T>, Error> {
        let Some(fence) = self.lease().fence() else {
            return Err(self.step_error(
                name,
                StepErrorKind::Unsupported,
                "the call has no store lock to record steps under",
            ));
        };
        let limits = fence.steps();
        let (max_steps, max_bytes) = (limits.max_steps, limits.max_step_bytes);
        let mut cursor = self.cursor();
        let position = cursor.next;
        let recorded = cursor.recorded.as_deref().unwrap_or_default();
        if let Some(entry) = recorded.get(position as usize) {
            let value = self.replayed(name, position, entry)?;
            cursor.next += 1;
            return Ok(Turn::Replay { value, position });
        }
        if position >= max_steps {
            return Err(self.step_error(
                name,
                StepErrorKind::TooMany,
                &format!("the body called more than {max_steps} steps (`Task::max_steps`)"),
            ));
        }
        // The first step the journal lacks is the one a holder that died may have started.
        let doubt = self
            .in_doubt()
            .or(cursor.doubt)
            .filter(|_| position as usize == recorded.len());
        let held = doubt.is_some() && self.in_doubt().is_none() && limits.holds_doubt;
        Ok(Turn::Run {
            position,
            max_bytes,
            doubt,
            held,
        })
    }

    fn replayed<T: DeserializeOwned>(
        &self,
        name: &StepName,
        position: u32,
        recorded: &[u8],
    ) -> Result<T, Error> {
        let unit = self.unit();
        let read = entry::Read::parse(recorded).map_err(|reason| {
            codec(
                unit,
                CodecErrorKind::Unreadable,
                format!("step {position} of the journal cannot be read: {reason}"),
            )
        })?;
        if !read.is(name) {
            return Err(self.order_changed(name, position, &read.shown(self.logging())));
        }
        read.value().map_err(|(unstorable, reason)| {
            if unstorable {
                codec(unit, CodecErrorKind::Unstorable, format!("step `{}` succeeded but its value could not be recorded: {reason}", name.shown(self.logging())))
            } else {
                codec(unit, CodecErrorKind::Undecodable, format!("the recorded value of step `{}` does not decode into the step's type: {reason}", name.shown(self.logging())))
            }
        })
    }

    /// Sends the record, again when the store fails (the same entry at the same place is
    /// recorded once however often it is sent).
    async fn record(&self, name: &StepName, entry: StepEntry<'_>) -> Result<(), Error> {
        let Some(fence) = self.lease().fence() else {
            return Err(self.step_error(
                name,
                StepErrorKind::Unsupported,
                "the call has no store lock to record steps under",
            ));
        };
        let mut failures = 0;
        loop {
            let sent = Instant::now();
            match fence
                .store()
                .record_step(self.unit(), fence.token(), entry, fence.lock_ttl())
                .await
            {
                // The watchdog may have found the lock gone while the record was in flight.
                Ok(true) if !self.lease().is_lost() => {
                    self.lease().renewed(sent, fence.lock_ttl());
                    return Ok(());
                }
                // The effect happened unrecorded. A refusal need not mean the lock is gone
                // (a quorum that cannot tell a failed attempt's entry from a confirmed one
                // refuses too): released, a lock still ours would let the next delivery run
                // the effect again at once; left to lapse, the unit is in doubt.
                Ok(_) => {
                    self.lease().hold(StepErrorKind::Unrecorded);
                    return Err(self.fence_refused());
                }
                Err(err) => {
                    failures += 1;
                    if !err.is_retryable() || failures >= RECORD_ATTEMPTS {
                        self.lease().hold(StepErrorKind::Unrecorded);
                        return Err(self.step_error(
                            name,
                            StepErrorKind::Unrecorded,
                            &format!("its effect happened but its record was not confirmed: {err}"),
                        ));
                    }
                }
            }
            tokio::time::sleep(STORE_RETRY_BACKOFF.delay(failures)).await;
        }
    }

    /// The error of a step whose place in the journal holds another step (`recorded`). The
    /// unit is held: released, its next delivery would run the same body on the same journal,
    /// or a changed one on a journal it does not match.
    fn order_changed(&self, name: &StepName, position: u32, recorded: &str) -> Error {
        self.lease().hold(StepErrorKind::OrderChanged);
        tracing::warn!(
            task = self.task(),
            key = self.logging().show(self.unit()),
            step = %name.shown(self.logging()),
            recorded,
            "the body's steps changed order: the unit is held in doubt; resolve it to go on"
        );
        self.step_error(name, StepErrorKind::OrderChanged, &format!("the journal's step {position} is `{recorded}`: the body calls its steps in another order than the run that recorded them; the unit is held until it is resolved"))
    }

    fn step_error(&self, name: &StepName, kind: StepErrorKind, reason: &str) -> Error {
        Error::Step {
            task: self.task().to_owned(),
            key: CallerKey::plain(self.key()).shown_as(self.logging()),
            kind,
            reason: format!("step `{}`: {reason}", name.shown(self.logging())),
        }
    }
}
