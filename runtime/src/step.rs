//! Steps: a body's side effects recorded one at a time in its unit's journal, so that a rerun
//! replays the finished ones and resumes at the first that did not finish.

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::time::Instant;

use crate::backoff::STORE_RETRY_BACKOFF;
use crate::context::TaskContext;
use crate::error::{CallerKey, CodecErrorKind, Error, codec};
use crate::store::{StepEntry, Store};

mod entry;

/// How many steps a body may record, unless its task says otherwise
/// ([`Task::max_steps`](crate::Task::max_steps)).
pub const DEFAULT_MAX_STEPS: u32 = 100;

/// How long one step's journal entry may be, in bytes, unless its task says otherwise
/// ([`Task::max_step_bytes`](crate::Task::max_step_bytes)).
pub const DEFAULT_MAX_STEP_BYTES: usize = 64 * 1024;

/// How many times a step's record is sent when the store fails.
const RECORD_ATTEMPTS: u32 = 3;

/// The name of a step in its unit's journal: a string literal, or a literal with a key part
/// for a step that runs once per item (`("mail", recipient)`).
///
/// A rerun matches each step to the journal by its place and its name, so a name says which
/// effect a recorded result belongs to: a body that calls its steps in another order gets
/// [`StepErrorKind::OrderChanged`] instead of another step's result.
///
/// ```
/// use idempotask::StepName;
/// assert_eq!(StepName::from("charge").to_string(), "charge");
/// assert_eq!(StepName::from(("mail", "ada@example.com")).to_string(), "mail[ada@example.com]");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepName {
    name: &'static str,
    part: Option<String>,
}

impl StepName {
    /// The literal part of the name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The key part, for a step named with one.
    pub fn part(&self) -> Option<&str> {
        self.part.as_deref()
    }
}

impl From<&'static str> for StepName {
    fn from(name: &'static str) -> Self {
        Self { name, part: None }
    }
}

impl<P: fmt::Display> From<(&'static str, P)> for StepName {
    fn from((name, part): (&'static str, P)) -> Self {
        Self {
            name,
            part: Some(part.to_string()),
        }
    }
}

impl fmt::Display for StepName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.part {
            Some(part) => write!(f, "{}[{part}]", self.name),
            None => f.write_str(self.name),
        }
    }
}

/// Why a step could not run or be replayed ([`Error::Step`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StepErrorKind {
    /// The journal's entry at this step's place belongs to another step: the body calls its
    /// steps in another order than the run that recorded them. Nothing ran; the journal is
    /// left as it is, and every rerun of this body stops here until the unit is resolved.
    OrderChanged,
    /// The body called more steps than its task allows. Nothing ran.
    TooMany,
    /// A step was called while another step of the same body was running (two steps joined):
    /// a rerun could not tell their results apart. Nothing ran.
    Overlapping,
    /// The store does not record steps, or the call cannot (inside a database transaction,
    /// which holds the unit itself). Nothing ran.
    Unsupported,
    /// The step's effect happened but the store did not confirm its record (it failed or did
    /// not answer). The call keeps the unit in doubt instead of releasing it.
    Unrecorded,
}

/// Where a body is in its journal; kept in the lease that every clone of its context shares.
#[derive(Debug, Default)]
pub(crate) struct Cursor {
    armed: Option<Armed>,
    /// The journal as the store answered it at the body's first step; `None` until then.
    recorded: Option<Vec<Vec<u8>>>,
    next: u32,
    running: bool,
}

/// What a step needs from its call, set once the lock is granted.
#[derive(Debug)]
struct Armed {
    kept_for: Duration,
    max_steps: u32,
    max_step_bytes: usize,
}

/// The settings a call's steps run with.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StepLimits {
    pub(crate) kept_for: Duration,
    pub(crate) max_steps: u32,
    pub(crate) max_step_bytes: usize,
}

impl Cursor {
    /// Lets the body's steps run, once the lock is granted.
    pub(crate) fn arm(cursor: &Mutex<Self>, limits: StepLimits) {
        let mut cursor = cursor.lock().unwrap_or_else(PoisonError::into_inner);
        cursor.armed = Some(Armed {
            kept_for: limits.kept_for,
            max_steps: limits.max_steps,
            max_step_bytes: limits.max_step_bytes,
        });
    }
}

/// What the cursor says a step does.
enum Turn<T> {
    Replay(T),
    Run { position: u32, max_bytes: usize },
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
    /// Runs `effect` as the step `name` of this body, once: its value is recorded in the
    /// unit's journal when it succeeds, and a rerun of the body (after a crash, an error, a
    /// lost lock) gets the recorded value back without running `effect` again, then goes on
    /// at the first step that did not finish.
    ///
    /// Before the effect starts, the step checks that this holder's lock is still valid by its
    /// own clock (no store command), and asks the store as [`fence`](Self::fence) does when it
    /// is not; the record is written only under the lock, by its token
    /// and fencing token, at the journal's next place (one store command, which also renews
    /// the lock). A holder whose lock was taken over gets [`Error::LockNotHeld`] at its next
    /// step, which then does not run, and the call answers `LockNotHeld` whatever the body
    /// returns. A step whose effect fails (`Err`) records nothing and is run again by a rerun.
    ///
    /// Steps run one at a time, in the same order on every run: name a step that runs once
    /// per item with a key part, `("mail", recipient)`.
    ///
    /// # Errors
    /// The effect's own error; [`Error::Step`] when the step cannot run or be replayed (see
    /// [`StepErrorKind`]); [`Error::LockNotHeld`] for a holder that lost its lock;
    /// [`Error::Codec`] for a recorded value that does not decode into `T`.
    ///
    /// ```
    /// use std::sync::atomic::{AtomicU32, Ordering};
    /// use idempotask::{MemoryStore, Task};
    ///
    /// static CHARGES: AtomicU32 = AtomicU32::new(0);
    /// static CHECKOUT: Task = Task::new("checkout");
    ///
    /// async fn checkout(store: &MemoryStore, mail_works: bool) -> Result<String, idempotask::Error> {
    ///     CHECKOUT.call("order-7").store(store.clone()).run(async {
    ///         let ctx = idempotask::context().expect("inside a task");
    ///         let charge: u32 = ctx.step("charge", async {
    ///             Ok::<_, idempotask::Error>(CHARGES.fetch_add(1, Ordering::SeqCst) + 1)
    ///         }).await?;
    ///         let receipt: String = ctx.step("mail", async {
    ///             if mail_works { Ok(format!("receipt for charge {charge}")) }
    ///             else { Err(idempotask::Error::NotConfigured) }
    ///         }).await?;
    ///         Ok(receipt)
    ///     }).await
    /// }
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let store = MemoryStore::new();
    /// assert!(checkout(&store, false).await.is_err(), "the mail step failed");
    /// // The rerun replays the charge and runs the mail step.
    /// assert_eq!(checkout(&store, true).await.unwrap(), "receipt for charge 1");
    /// assert_eq!(CHARGES.load(Ordering::SeqCst), 1, "charged once");
    /// # }
    /// ```
    pub async fn step<T, E, F>(&self, name: impl Into<StepName>, effect: F) -> Result<T, E>
    where
        T: Serialize + DeserializeOwned,
        E: From<Error>,
        F: Future<Output = Result<T, E>>,
    {
        let name = name.into();
        let kept_for = self.reserve(&name)?;
        let running = Running(&self.lease().steps);
        self.load_journal(&name).await?;
        let (position, max_bytes) = match self.next_turn(&name)? {
            Turn::Replay(value) => return Ok(value),
            Turn::Run {
                position,
                max_bytes,
            } => (position, max_bytes),
        };
        if !self.lease().held() {
            // Ran out by this holder's clock: the store says whether the lock is still its
            // own (nobody took the unit over) before the effect may start.
            self.fence().await?;
        }
        let value = effect.await?;
        let (bytes, encoded) = entry::encode(&name, &value, max_bytes);
        if let Err(reason) = &encoded {
            tracing::warn!(
                task = self.task(),
                step = %name,
                error = %reason,
                "a step succeeded but its value cannot be recorded; reruns get an error instead of running it again"
            );
        }
        self.record(&name, StepEntry::new(position, &bytes, kept_for))
            .await?;
        let mut cursor = self.cursor();
        cursor.next = position + 1;
        drop(cursor);
        drop(running);
        Ok(value)
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
        let mut cursor = self.cursor();
        let Some(armed) = &cursor.armed else {
            return Err(self.step_error(name, StepErrorKind::Unsupported, "steps cannot be recorded inside a database transaction, which holds the unit until it ends"));
        };
        let kept_for = armed.kept_for;
        if cursor.running {
            return Err(self.step_error(
                name,
                StepErrorKind::Overlapping,
                "another step of this body is still running; steps run one at a time",
            ));
        }
        if !self
            .lease()
            .fence()
            .is_some_and(|fence| fence.store().records_steps())
        {
            return Err(self.step_error(
                name,
                StepErrorKind::Unsupported,
                "the task's store does not record steps",
            ));
        }
        cursor.running = true;
        Ok(kept_for)
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
        self.cursor().recorded = Some(journal.into_entries());
        Ok(())
    }

    /// Replays the step from the journal, or says where it goes.
    fn next_turn<T: DeserializeOwned>(&self, name: &StepName) -> Result<Turn<T>, Error> {
        let mut cursor = self.cursor();
        let Some(armed) = &cursor.armed else {
            return Err(self.step_error(
                name,
                StepErrorKind::Unsupported,
                "the call has no store lock to record steps under",
            ));
        };
        let (max_steps, max_bytes) = (armed.max_steps, armed.max_step_bytes);
        let position = cursor.next;
        let recorded = cursor.recorded.as_deref().unwrap_or_default();
        if let Some(entry) = recorded.get(position as usize) {
            let value = self.replayed(name, position, entry)?;
            cursor.next += 1;
            return Ok(Turn::Replay(value));
        }
        if position >= max_steps {
            return Err(self.step_error(
                name,
                StepErrorKind::TooMany,
                &format!("the body called more than {max_steps} steps (`Task::max_steps`)"),
            ));
        }
        Ok(Turn::Run {
            position,
            max_bytes,
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
            return Err(self.step_error(name, StepErrorKind::OrderChanged, &format!("the journal's step {position} is `{}`: the body calls its steps in another order than the run that recorded them", read.shown())));
        }
        read.value().map_err(|(unstorable, reason)| {
            if unstorable {
                codec(unit, CodecErrorKind::Unstorable, format!("step `{name}` succeeded but its value could not be recorded: {reason}"))
            } else {
                codec(unit, CodecErrorKind::Undecodable, format!("the recorded value of step `{name}` does not decode into the step's type: {reason}"))
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
                Ok(_) => return Err(self.fence_refused()),
                Err(err) => {
                    failures += 1;
                    if !err.is_retryable() || failures >= RECORD_ATTEMPTS {
                        self.lease().unrecorded.store(true, Ordering::Release);
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

    fn step_error(&self, name: &StepName, kind: StepErrorKind, reason: &str) -> Error {
        Error::Step {
            task: self.task().to_owned(),
            key: CallerKey::plain(self.key()).shown_as(self.logging()),
            kind,
            reason: format!("step `{name}`: {reason}"),
        }
    }
}
