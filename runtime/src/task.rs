//! [`Task`]: a stable name and the settings every call of it uses.

use std::borrow::Cow;
use std::panic::Location;
use std::time::Duration;

use crate::doubt::{DEFAULT_DOUBT_MEMORY, InDoubt};
use crate::lock_renewal::LockRenewal;
use crate::observe::KeyLogging;
use crate::retry::RetryPolicy;
use crate::step::cursor::{DEFAULT_MAX_STEP_BYTES, DEFAULT_MAX_STEPS, StepLimits};
use crate::store::{Fencing, LockToken};
use crate::ttl::{MIN_TTL, clamp_ttl};

/// How long a lock lasts unless renewed, by default.
pub const DEFAULT_LOCK_TTL: Duration = Duration::from_secs(30);
/// How long a completion marker (and the result in it) is kept, by default.
pub const DEFAULT_RESULT_TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// What a [`Task`] is set to, as [`Task::settings`] reads it; the builder methods of [`Task`]
/// set each field.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct Settings {
    /// How long the lock lasts unless renewed.
    pub lock_ttl: Duration,
    /// How long the completion marker and the result are kept.
    pub result_ttl: Duration,
    /// How a delivery waits while another holds the lock.
    pub retry: RetryPolicy,
    /// Whether and how the lock is renewed while the body runs.
    pub renewal: LockRenewal,
    /// Whether each execution gets a fencing token.
    pub fencing: bool,
    /// How the caller key appears in logs.
    pub log_key: KeyLogging,
    /// What a delivery does with a unit left in doubt.
    pub in_doubt: InDoubt,
    /// How long the store remembers a lock that ran out without a release or a marker.
    pub doubt_memory: Duration,
    /// With [`InDoubt::Hold`], how long a unit may stay held before a delivery that meets it
    /// raises the alarm; `None`: never.
    pub hold_alert_after: Option<Duration>,
}

/// An idempotent task: a stable name and the settings every call of it uses.
///
/// This is what `#[idempotent_task]` expands to, and a public API of its own for code that
/// cannot use the attribute (closures, dynamic task names). A task is cheap to build and can
/// live in a `static`.
///
/// ```
/// use std::time::Duration;
/// use idempotask::{MemoryStore, Task};
///
/// static CHARGE: Task = Task::new("charge_customer")
///     .lock_ttl(Duration::from_secs(10))
///     .result_ttl(Duration::from_secs(7 * 24 * 3600));
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idempotask::Error> {
/// idempotask::install(MemoryStore::new());
/// let charge = |id: &str| Ok::<_, idempotask::Error>(id.to_owned());
/// let charge_id: String = CHARGE.call("order-42").run(async { charge("ch_1") }).await?;
/// let replayed: String = CHARGE.call("order-42").run(async { charge("ch_2") }).await?;
/// assert_eq!(replayed, charge_id);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct Task {
    /// Where `#[idempotent_task]` defined this task; `None` for tasks built by hand, whose
    /// name the author chose and may share on purpose (a replay tool naming a worker's task).
    pub(crate) defined_at: Option<&'static Location<'static>>,
    pub(crate) name: Cow<'static, str>,
    pub(crate) lock_ttl: Duration,
    pub(crate) result_ttl: Duration,
    pub(crate) retry: RetryPolicy,
    pub(crate) renewal: LockRenewal,
    pub(crate) fencing: Fencing,
    pub(crate) log_key: KeyLogging,
    pub(crate) in_doubt: InDoubt,
    pub(crate) doubt_memory: Duration,
    pub(crate) hold_alert_after: Option<Duration>,
    pub(crate) max_steps: u32,
    pub(crate) max_step_bytes: usize,
}

impl Task {
    /// A task with the default settings: lock TTL [`DEFAULT_LOCK_TTL`], result TTL
    /// [`DEFAULT_RESULT_TTL`], [`RetryPolicy::new`], no lock renewal, no fencing token.
    ///
    /// The name goes into store keys: keep it stable across releases, or old results are no
    /// longer found and the work runs again.
    pub const fn new(name: &'static str) -> Self {
        Self {
            defined_at: None,
            name: Cow::Borrowed(name),
            lock_ttl: DEFAULT_LOCK_TTL,
            result_ttl: DEFAULT_RESULT_TTL,
            retry: RetryPolicy::new(),
            renewal: LockRenewal::Off,
            fencing: Fencing::Off,
            log_key: KeyLogging::Plain,
            in_doubt: InDoubt::Rerun,
            doubt_memory: DEFAULT_DOUBT_MEMORY,
            hold_alert_after: None,
            max_steps: DEFAULT_MAX_STEPS,
            max_step_bytes: DEFAULT_MAX_STEP_BYTES,
        }
    }

    /// Like [`new`](Self::new) for a name known only at run time.
    pub fn named(name: impl Into<String>) -> Self {
        Self {
            name: Cow::Owned(name.into()),
            ..Self::new("")
        }
    }

    /// How long the lock lasts (unless renewed). A holder that runs longer loses it and a
    /// duplicate may start. Longer than [`MAX_TTL`](crate::MAX_TTL) is kept as `MAX_TTL`.
    ///
    /// # Panics
    /// When `ttl` is shorter than [`MIN_TTL`] (100 ms), zero included: such a lock can expire
    /// before its renewal or its grant's reply arrives. In a `static` this is a compile-time
    /// error.
    ///
    /// ```compile_fail
    /// static SHORT_LOCK: idempotask::Task =
    ///     idempotask::Task::new("t").lock_ttl(std::time::Duration::from_millis(99));
    /// ```
    pub const fn lock_ttl(mut self, ttl: Duration) -> Self {
        assert!(
            ttl.as_nanos() >= MIN_TTL.as_nanos(),
            "a task's lock TTL must be at least `idempotask::MIN_TTL` (100 ms): a shorter lock can expire before its renewal or its grant's reply arrives"
        );
        self.lock_ttl = clamp_ttl(ttl);
        self
    }

    /// How long the completion marker and the stored result are kept. Longer than
    /// [`MAX_TTL`](crate::MAX_TTL) (`Duration::MAX` for "keep it") is kept as `MAX_TTL`.
    ///
    /// Results are kept at least as long as the lock TTL, whatever the order of the two
    /// settings: a result that expired before a lock of the same length would let a duplicate
    /// that waited that long on the lock find neither and run again. The attribute refuses a
    /// shorter `result_ttl` at compile time; a `Task` keeps the longer of the two, and
    /// [`settings`](Self::settings) reports what is kept.
    ///
    /// ```
    /// use std::time::Duration;
    /// let task = idempotask::Task::new("t")
    ///     .lock_ttl(Duration::from_secs(60))
    ///     .result_ttl(Duration::from_secs(5));
    /// assert_eq!(task.settings().result_ttl, Duration::from_secs(60));
    /// ```
    ///
    /// # Panics
    /// When `ttl` is zero: a result kept for no time makes every delivery run. In a `static`
    /// this is a compile-time error. A result TTL shorter than [`MIN_TTL`] is not refused,
    /// since the result is kept as long as the lock anyway.
    pub const fn result_ttl(mut self, ttl: Duration) -> Self {
        assert!(
            !ttl.is_zero(),
            "a task's result TTL must be greater than zero: a result kept for no time makes every delivery run"
        );
        self.result_ttl = clamp_ttl(ttl);
        self
    }

    /// How a delivery waits while another holds the lock.
    pub const fn retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = policy;
        self
    }

    /// Whether the lock is renewed every third of its TTL while the body runs (default off):
    /// `true` is [`LockRenewal::Watchdog`], which renews through a body that blocks its thread,
    /// `false` is [`LockRenewal::Off`]. [`lock_renewal`](Self::lock_renewal) chooses
    /// [`LockRenewal::InTask`], which costs nothing per poll, for bodies that only await.
    ///
    /// ```
    /// use idempotask::{LockRenewal, Task};
    /// let task = Task::new("export").renew(true);
    /// assert_eq!(task.settings().renewal, LockRenewal::Watchdog);
    /// ```
    pub const fn renew(self, renew: bool) -> Self {
        self.lock_renewal(if renew {
            LockRenewal::Watchdog
        } else {
            LockRenewal::Off
        })
    }

    /// Whether and how the lock is renewed while the body runs (default
    /// [`LockRenewal::Off`]); [`LockRenewal`] compares the two ways.
    ///
    /// ```
    /// use idempotask::{LockRenewal, Task};
    /// let task = Task::new("export").lock_renewal(LockRenewal::InTask);
    /// assert_eq!(task.settings().renewal, LockRenewal::InTask);
    /// ```
    pub const fn lock_renewal(mut self, renewal: LockRenewal) -> Self {
        self.renewal = renewal;
        self
    }

    /// Whether each execution gets a fencing token (default off).
    ///
    /// A fencing token is greater than that of every earlier execution of the same unit of
    /// work, across lock expiries and releases; a body passes
    /// [`TaskContext::fencing_token`](crate::TaskContext::fencing_token) to the database it
    /// writes to, which refuses a token lower than the highest it has seen, so a holder whose
    /// lock was taken over cannot overwrite its successor's work. On Redis it costs a script on
    /// every fresh start (a plain `SET` without it).
    ///
    /// ```
    /// use idempotask::{MemoryStore, Task};
    /// static SETTLE: Task = Task::new("settle").fencing(true);
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idempotask::Error> {
    /// let token = SETTLE
    ///     .call("invoice-9")
    ///     .store(MemoryStore::new())
    ///     .run(async { Ok::<_, idempotask::Error>(idempotask::context().unwrap().fencing_token()) })
    ///     .await?;
    /// assert!(token.is_some());
    /// # Ok(()) }
    /// ```
    pub const fn fencing(mut self, fencing: bool) -> Self {
        self.fencing = if fencing { Fencing::On } else { Fencing::Off };
        self
    }

    /// How the caller key appears in this task's span, its warnings and the `Display` and
    /// `Debug` of its errors (default [`KeyLogging::Plain`]); see [`observe`](crate::observe)
    /// and [`CallerKey`](crate::CallerKey).
    pub const fn log_key(mut self, logging: KeyLogging) -> Self {
        self.log_key = logging;
        self
    }

    /// What a delivery does with a unit left in doubt: one whose earlier delivery's lock ran
    /// out without a release or a marker, so that its side effect may or may not have
    /// happened (default [`InDoubt::Rerun`]). See [`Doubt`](crate::store::Doubt) and the
    /// [guarantees guide](crate::guide::guarantees).
    pub const fn in_doubt(mut self, policy: InDoubt) -> Self {
        self.in_doubt = policy;
        self
    }

    /// How long the store remembers a lock whose TTL ran out without a release or a marker
    /// (default [`DEFAULT_DOUBT_MEMORY`], a day). Within it, the delivery that takes the unit
    /// over knows that it is in doubt; after it, the unit is free and runs again as if new.
    /// Zero turns detection off. Longer than [`MAX_TTL`](crate::MAX_TTL) is kept as
    /// `MAX_TTL`.
    ///
    /// ```
    /// use std::time::Duration;
    /// let task = idempotask::Task::new("t").doubt_memory(Duration::from_secs(7 * 24 * 3600));
    /// assert_eq!(task.settings().doubt_memory, Duration::from_secs(7 * 24 * 3600));
    /// ```
    pub const fn doubt_memory(mut self, memory: Duration) -> Self {
        self.doubt_memory = clamp_ttl(memory);
        self
    }

    /// With [`InDoubt::Hold`], raises the alarm on a unit held longer than `after`: each
    /// delivery that meets such a unit logs an `ERROR` (not the `WARN` of every held unit) and
    /// counts it in `idempotask_held_overdue_total`, so that a held unit nobody resolved
    /// reaches an alert instead of a log line. `idempotask list --in-doubt --older-than` shows
    /// the same units without a delivery. Held for how long is counted from the moment the
    /// earlier lock ran out, on the store's clock.
    ///
    /// ```
    /// use std::time::Duration;
    /// use idempotask::{InDoubt, Task};
    /// static SEND: Task = Task::new("send_invoice")
    ///     .in_doubt(InDoubt::Hold)
    ///     .hold_alert_after(Duration::from_secs(3600));
    /// assert_eq!(SEND.settings().hold_alert_after, Some(Duration::from_secs(3600)));
    /// ```
    pub const fn hold_alert_after(mut self, after: Duration) -> Self {
        self.hold_alert_after = Some(after);
        self
    }

    /// How many steps ([`TaskContext::step`](crate::TaskContext::step)) one body may record;
    /// the step after the last one allowed gets [`StepErrorKind::TooMany`](crate::StepErrorKind)
    /// before its effect runs. [`DEFAULT_MAX_STEPS`](crate::DEFAULT_MAX_STEPS) unless set.
    ///
    /// ```
    /// static IMPORT: idempotask::Task = idempotask::Task::new("import").max_steps(1_000);
    /// # let _ = &IMPORT;
    /// ```
    pub const fn max_steps(mut self, max_steps: u32) -> Self {
        self.max_steps = max_steps;
        self
    }

    /// How long one step's journal entry may be, in bytes (its name and its value's JSON): a
    /// longer value is not recorded, and a rerun gets
    /// [`CodecErrorKind::Unstorable`](crate::CodecErrorKind) for that step instead of running
    /// its effect again. [`DEFAULT_MAX_STEP_BYTES`](crate::DEFAULT_MAX_STEP_BYTES) unless set.
    ///
    /// ```
    /// static IMPORT: idempotask::Task = idempotask::Task::new("import").max_step_bytes(4096);
    /// # let _ = &IMPORT;
    /// ```
    pub const fn max_step_bytes(mut self, max_bytes: usize) -> Self {
        self.max_step_bytes = max_bytes;
        self
    }

    /// What a call's steps run with.
    pub(crate) const fn step_limits(&self) -> StepLimits {
        StepLimits {
            kept_for: self.kept_for(),
            max_steps: self.max_steps,
            max_step_bytes: self.max_step_bytes,
            holds_doubt: matches!(self.in_doubt, InDoubt::Hold),
            hold_alert_after: self.hold_alert_after,
        }
    }

    /// Marks the task as the one `#[idempotent_task]` defines where it is expanded, so that
    /// two such tasks with one name are refused ([`Error::TaskNameTaken`](crate::Error)).
    #[track_caller]
    pub(crate) const fn defined_by_attribute(mut self) -> Self {
        self.defined_at = Some(Location::caller());
        self
    }

    /// The stable name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// What this task is set to.
    ///
    /// ```
    /// use std::time::Duration;
    /// let task = idempotask::Task::new("export").lock_ttl(Duration::from_secs(10)).renew(true);
    /// let settings = task.settings();
    /// assert_eq!(settings.lock_ttl, Duration::from_secs(10));
    /// assert!(settings.renewal.is_on());
    /// ```
    pub const fn settings(&self) -> Settings {
        Settings {
            lock_ttl: self.lock_ttl,
            result_ttl: self.kept_for(),
            retry: self.retry,
            renewal: self.renewal,
            fencing: matches!(self.fencing, Fencing::On),
            log_key: self.log_key,
            in_doubt: self.in_doubt,
            doubt_memory: self.doubt_memory,
            hold_alert_after: self.hold_alert_after,
        }
    }

    /// A token for one delivery's lock, asking the store to remember it as this task says and
    /// to leave units in doubt alone when the task holds them.
    pub(crate) fn lock_token(&self) -> LockToken {
        let token = LockToken::generate().with_doubt_memory(self.doubt_memory);
        match self.in_doubt {
            InDoubt::Hold => token.leaving_doubt(),
            InDoubt::Rerun => token,
        }
    }

    /// How long a result is kept: the result TTL, and at least the lock TTL.
    pub(crate) const fn kept_for(&self) -> Duration {
        if self.result_ttl.as_millis() < self.lock_ttl.as_millis() {
            self.lock_ttl
        } else {
            self.result_ttl
        }
    }
}
