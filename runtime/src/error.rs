//! The errors a task call can return, each saying what the caller can do about it.

use std::time::Duration;

use crate::observe::KeyLogging;
use crate::unit::{InvalidKey, UnitOfWork};

/// Everything that can keep an idempotent task from returning its body's value.
///
/// A task's own error type must implement `From<idempotask::Error>` so that these can travel
/// through the task's declared return type (one `#[from]` variant with thiserror; `anyhow::Error`
/// works as it is).
///
/// ```
/// #[derive(Debug, thiserror::Error)]
/// enum PaymentError {
///     #[error("card declined")]
///     Declined,
///     #[error(transparent)]
///     Idempotency(#[from] idempotask::Error),
/// }
/// let err: PaymentError = idempotask::Error::NotConfigured.into();
/// assert!(matches!(err, PaymentError::Idempotency(idempotask::Error::NotConfigured)));
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Another delivery holds the lock for this key and did not finish while this one waited.
    ///
    /// Nothing ran. Hand the message back to the queue (nack, or let its visibility timeout
    /// lapse) so it is delivered again later: by then the holder has stored its result, which
    /// the redelivery gets back, or its lock has expired and the redelivery runs the task.
    #[error(
        "task `{task}` with key `{key}` is being run by another worker{}; nothing ran, redeliver it later",
        remaining_suffix(*.lock_ttl_remaining)
    )]
    #[non_exhaustive]
    Contended {
        /// The task's stable name.
        task: String,
        /// The caller's key (shown as the task's [`KeyLogging`](crate::KeyLogging) says).
        key: CallerKey,
        /// How long the holder's lock had left at the last look, when the store said.
        lock_ttl_remaining: Option<Duration>,
        /// How many times this call asked for the lock.
        attempts: u32,
    },

    /// The unit is in doubt and its task holds such units ([`InDoubt::Hold`](crate::InDoubt)):
    /// an earlier delivery's lock ran out without a release or a marker, so its side effect
    /// may have happened, and the body did not run again.
    ///
    /// Nothing ran. Do not redeliver it blindly: dead-letter the message (or answer the
    /// client that the request is in doubt) and let an operator find out whether the effect
    /// happened, then record a result or free the unit (`idempotask resolve`). Every later
    /// delivery gets this error until then.
    #[error(
        "task `{task}` with key `{key}` is in doubt: an earlier delivery's lock ran out {} ms ago without a release or a result; nothing ran, an operator must resolve it",
        .doubt.expired_for.as_millis()
    )]
    #[non_exhaustive]
    InDoubt {
        /// The task's stable name.
        task: String,
        /// The caller's key (shown as the task's [`KeyLogging`](crate::KeyLogging) says).
        key: CallerKey,
        /// What the store knows of the earlier delivery.
        doubt: crate::store::Doubt,
    },

    /// The key was used before with different arguments (the `fingerprint` parameters differ).
    ///
    /// This is almost always a bug at the caller: two different business operations were given
    /// the same idempotency key. Nothing ran; the stored result of the first operation stays.
    #[error(
        "key `{key}` of task `{task}` was already used with different arguments; an idempotency key must name one operation"
    )]
    #[non_exhaustive]
    KeyReuse {
        /// The task's stable name.
        task: String,
        /// The caller's key (shown as the task's [`KeyLogging`](crate::KeyLogging) says).
        key: CallerKey,
    },

    /// A body asked [`TaskContext::fence`](crate::TaskContext::fence) before a side effect,
    /// and the store no longer holds this delivery's lock: it ran out and another delivery took
    /// the unit over, or the store forgot it, or an operator resolved the unit.
    ///
    /// The effect after the fence must not start: return this error from the body (`?`). The
    /// call answers it whatever error the body returned after a refused fence. What ran before
    /// the fence stays done; a later delivery replays the result of the delivery that holds the
    /// unit now, or runs if none does. (Not to be confused with
    /// [`Outcome::LockLost`](crate::Outcome::LockLost): there the body's work was done.)
    #[error(
        "task `{task}` with key `{key}` no longer holds its lock: its fence was refused and the body stopped there; redeliver it after the current holder"
    )]
    #[non_exhaustive]
    LockNotHeld {
        /// The task's stable name.
        task: String,
        /// The caller's key (shown as the task's [`KeyLogging`](crate::KeyLogging) says).
        key: CallerKey,
    },

    /// The store could not be reached or did not answer in time.
    ///
    /// The call failed closed: the body did not run unless [`StoreError::is_ambiguous`] says the
    /// outcome is unknown. Retrying the delivery is safe either way.
    #[error(transparent)]
    Store(#[from] StoreError),

    /// A result could not be stored or read back, or the arguments could not be fingerprinted;
    /// [`kind`](CodecErrorKind) says which, and whether the work ran.
    ///
    /// For [`Undecodable`](CodecErrorKind::Undecodable), [`Unstorable`](CodecErrorKind::Unstorable)
    /// and [`Unreadable`](CodecErrorKind::Unreadable) the work was done once and is not run again:
    /// usually the task's return type changed between deployments. Keep it compatible, rename
    /// the task, or `forget` the key on purpose. For [`Fingerprint`](CodecErrorKind::Fingerprint)
    /// nothing ran.
    #[error("task `{task}` with key `{key}`: {reason}")]
    #[non_exhaustive]
    Codec {
        /// The task's stable name.
        task: String,
        /// The caller's key (shown as the task's [`KeyLogging`](crate::KeyLogging) says).
        key: CallerKey,
        /// What could not be encoded or decoded.
        kind: CodecErrorKind,
        /// What went wrong, in words.
        reason: String,
    },

    /// A step of the body could not run or be replayed; [`kind`](crate::step::kind::StepErrorKind) says
    /// why, and whether its effect happened.
    #[error("task `{task}` with key `{key}`: {reason}")]
    #[non_exhaustive]
    Step {
        /// The task's stable name.
        task: String,
        /// The caller's key (shown as the task's [`KeyLogging`](crate::KeyLogging) says).
        key: CallerKey,
        /// Why.
        kind: crate::step::kind::StepErrorKind,
        /// What went wrong, in words, starting with the step's name.
        reason: String,
    },

    /// The marker stored under this key's name was written for another caller key: a collision
    /// of the key digests (about one in 2^48 pairs of keys) or a value written by something
    /// other than idempotask.
    ///
    /// Nothing ran and the other key's result was not handed out. `forget` the unit on purpose
    /// to let it run, or rename the task.
    #[error(
        "the marker found for key `{key}` of task `{task}` belongs to key `{stored_key}`; nothing ran and its result was not used"
    )]
    #[non_exhaustive]
    MarkerKeyMismatch {
        /// The task's stable name.
        task: String,
        /// The caller's key (shown as the task's [`KeyLogging`](crate::KeyLogging) says).
        key: CallerKey,
        /// The key the stored marker names (shown as the caller's key is).
        stored_key: CallerKey,
    },

    /// The caller key (or task name) is not usable; fix it at the caller.
    #[error(transparent)]
    InvalidKey(#[from] InvalidKey),

    /// The body of this very unit called it again (a task that calls itself with the same
    /// key): the inner call would wait on the outer call's lock until it expired, then run a
    /// second time.
    ///
    /// Nothing ran for the inner call. Call the work directly, or give the inner call a key
    /// of its own.
    #[error(
        "task `{task}` with key `{key}` was called from its own body; nothing ran, call the work directly or give the inner call its own key"
    )]
    #[non_exhaustive]
    Reentered {
        /// The task's stable name.
        task: String,
        /// The caller's key (shown as the task's [`KeyLogging`](crate::KeyLogging) says).
        key: CallerKey,
    },

    /// The call was polled outside a `tokio` runtime, which idempotask needs for its timers,
    /// renewals and background releases. Nothing ran.
    #[error(
        "an idempotent task was run outside a tokio runtime; nothing ran, run it inside one (`#[tokio::main]`, `Runtime::block_on`)"
    )]
    NoRuntime,

    /// Two different `#[idempotent_task]` functions of this program have the same task name
    /// (the default name is the bare function name, so `billing::notify` and
    /// `shipping::notify` would collide), and would share their units of work: one's body would
    /// be skipped and answered with the other's result.
    ///
    /// Nothing ran. The task that was used first keeps the name; give the other its own with
    /// `name = "…"` (a stable name survives moving the function, too).
    #[error(
        "task name `{task}` is taken: the idempotent tasks defined at {first} and at {second} would share their results; nothing ran, give one of them its own `name = \"…\"`"
    )]
    #[non_exhaustive]
    TaskNameTaken {
        /// The name both tasks have.
        task: String,
        /// Where the task that was used first is defined (`file:line:column`).
        first: String,
        /// Where this task is defined.
        second: String,
    },

    /// No store was installed and the task names none.
    ///
    /// Call [`install`](crate::install) at start-up, or give the task a store. idempotask never
    /// falls back to an in-process store on its own: that would silently drop the guarantee
    /// across processes.
    #[error(
        "no idempotency store is installed; call `idempotask::install(store)` at start-up or give the task a `store`"
    )]
    NotConfigured,
}

/// What a [`Error::Codec`] could not encode or decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CodecErrorKind {
    /// The stored result does not decode into the task's return type. The work ran once.
    Undecodable,
    /// The first execution's result could not be encoded, so none was stored. The work ran once.
    Unstorable,
    /// The stored marker is not one this build can read. The work ran once, as far as the store
    /// knows.
    Unreadable,
    /// The `fingerprint` arguments cannot be serialised. Nothing ran.
    Fingerprint,
}

fn remaining_suffix(remaining: Option<Duration>) -> String {
    remaining.map_or_else(String::new, |left| {
        format!(" (its lock expires in {} ms)", left.as_millis())
    })
}

/// A store operation that failed.
///
/// # Behaviour
/// [`is_ambiguous`](Self::is_ambiguous) tells whether the store may have applied the operation
/// even though no answer arrived (a timeout or a connection lost after the request was sent).
/// Every store operation of idempotask is safe to repeat with the same lock token, which is how
/// the task runner resolves the ambiguity itself before it gives up.
#[derive(Debug, thiserror::Error)]
#[error("store operation `{operation}` failed ({kind}){}: {message}", if *.ambiguous { ", outcome unknown" } else { "" })]
pub struct StoreError {
    operation: &'static str,
    kind: StoreErrorKind,
    ambiguous: bool,
    message: String,
    #[source]
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl StoreError {
    /// An error for `operation` (`"begin"`, `"finish"`, …) that proves nothing was applied:
    /// the store refused the request, or it never reached the store.
    ///
    /// ```
    /// use idempotask::store::{StoreError, StoreErrorKind};
    /// let err = StoreError::new("begin", StoreErrorKind::Unreachable, "connection refused");
    /// assert!(!err.is_ambiguous());
    /// assert_eq!(err.kind(), StoreErrorKind::Unreachable);
    /// ```
    pub fn new(operation: &'static str, kind: StoreErrorKind, message: impl Into<String>) -> Self {
        Self {
            operation,
            kind,
            ambiguous: false,
            message: message.into(),
            source: None,
        }
    }

    /// An error for `operation` after which the store may have applied it: the request was
    /// sent, and no answer came (a timeout, a connection lost mid-call).
    ///
    /// ```
    /// use idempotask::store::{StoreError, StoreErrorKind};
    /// let err = StoreError::ambiguous("begin", StoreErrorKind::Timeout, "no reply within 2 s");
    /// assert!(err.is_ambiguous());
    /// ```
    pub fn ambiguous(
        operation: &'static str,
        kind: StoreErrorKind,
        message: impl Into<String>,
    ) -> Self {
        Self {
            ambiguous: true,
            ..Self::new(operation, kind, message)
        }
    }

    /// The same error, [ambiguous](Self::is_ambiguous) when `ambiguous` is true: for a store
    /// that carries the ambiguity over from its client's errors (a command that may have been
    /// sent, or re-sent by the client).
    ///
    /// ```
    /// use idempotask::store::{StoreError, StoreErrorKind};
    /// let resent = true;
    /// let err = StoreError::new("finish", StoreErrorKind::Timeout, "no answer").ambiguous_if(resent);
    /// assert!(err.is_ambiguous());
    /// ```
    #[must_use]
    pub fn ambiguous_if(mut self, ambiguous: bool) -> Self {
        self.ambiguous = ambiguous;
        self
    }

    /// The same error with its underlying cause attached.
    #[must_use]
    pub fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(Box::new(source));
        self
    }

    /// Which store operation failed.
    pub fn operation(&self) -> &'static str {
        self.operation
    }

    /// What kind of failure it was.
    pub fn kind(&self) -> StoreErrorKind {
        self.kind
    }

    /// What the store said of it, without the operation and kind that `Display` adds: for a
    /// store that answers one failure to several units, each in an error of its own.
    ///
    /// ```
    /// use idempotask::store::{StoreError, StoreErrorKind};
    /// let err = StoreError::new("begin", StoreErrorKind::Unreachable, "connection refused");
    /// assert_eq!(err.message(), "connection refused");
    /// ```
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Whether the store may have applied the operation although it did not confirm it.
    pub fn is_ambiguous(&self) -> bool {
        self.ambiguous
    }

    /// Whether trying again later can succeed (everything but a rejected configuration).
    pub fn is_retryable(&self) -> bool {
        !matches!(self.kind, StoreErrorKind::Configuration)
    }
}

/// The kinds of [`StoreError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreErrorKind {
    /// The store could not be reached (refused, reset, DNS, TLS).
    Unreachable,
    /// The store did not answer within the response timeout.
    Timeout,
    /// The store refused the command (out of memory under `noeviction`, read-only replica,
    /// missing ACL permission, still loading its data set).
    Rejected,
    /// The store answered something idempotask does not understand (a different protocol
    /// version, a foreign value under one of its keys).
    Protocol,
    /// The store's configuration is wrong (a bad URL, bad credentials, a bad namespace).
    Configuration,
}

impl std::fmt::Display for StoreErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Unreachable => "unreachable",
            Self::Timeout => "timed out",
            Self::Rejected => "rejected",
            Self::Protocol => "unexpected reply",
            Self::Configuration => "misconfigured",
        })
    }
}

/// A caller's key inside an [`Error`]. Its `Display` and `Debug` show it as the task's
/// [`KeyLogging`] says: the key itself, or with [`KeyLogging::Hash`] its digest (the one spans and
/// store keys show), so that an error logged anywhere carries no key a task hides.
/// [`as_str`](Self::as_str) gives the key itself to code that asks.
///
/// ```
/// use idempotask::{Error, KeyLogging, MemoryStore, Task};
/// use idempotask::store::{Fencing, LockToken, Store, UnitOfWork};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let store = MemoryStore::new();
/// let unit = UnitOfWork::new("statement", "jane@example.com").unwrap();
/// let ttl = std::time::Duration::from_secs(30);
/// store.begin(&unit, &LockToken::generate(), ttl, Fencing::Off).await.unwrap(); // held elsewhere
///
/// let task = Task::new("statement")
///     .log_key(KeyLogging::Hash)
///     .retry(idempotask::RetryPolicy::no_wait());
/// let err = task.call("jane@example.com").store(store).run(async { Ok::<u8, Error>(1) }).await;
/// let Err(Error::Contended { key, .. }) = err else { panic!("{err:?}") };
/// assert_eq!(key.as_str(), "jane@example.com");
/// assert_eq!(key.to_string(), unit.digest());
/// assert!(!format!("{key:?}").contains("jane"));
/// # }
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct CallerKey {
    key: String,
    /// What stands for the key in `Display` and `Debug`, when not the key itself.
    shown: Option<String>,
}

impl CallerKey {
    /// A key shown as it is.
    pub(crate) fn plain(key: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            shown: None,
        }
    }

    /// The key itself, whatever the task's key logging.
    pub fn as_str(&self) -> &str {
        &self.key
    }

    /// Whether `Display` and `Debug` show the key's digest instead of the key.
    pub fn is_hidden(&self) -> bool {
        self.shown.is_some()
    }

    pub(crate) fn shown_as(mut self, logging: KeyLogging) -> Self {
        if logging == KeyLogging::Hash && self.shown.is_none() {
            self.shown = Some(crate::unit::digest_of(&self.key));
        }
        self
    }
}

impl std::fmt::Display for CallerKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.shown.as_deref().unwrap_or(&self.key))
    }
}

impl std::fmt::Debug for CallerKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self.shown.as_deref().unwrap_or(&self.key), f)
    }
}

impl PartialEq<str> for CallerKey {
    fn eq(&self, other: &str) -> bool {
        self.key == other
    }
}

impl PartialEq<&str> for CallerKey {
    fn eq(&self, other: &&str) -> bool {
        self.key == *other
    }
}

impl Error {
    /// The same error, its keys shown as `logging` says: the one place where a task's key
    /// logging reaches its errors, on their way out of the runner.
    pub(crate) fn keys_shown_as(self, logging: KeyLogging) -> Self {
        match self {
            Self::Contended {
                task,
                key,
                lock_ttl_remaining,
                attempts,
            } => Self::Contended {
                task,
                key: key.shown_as(logging),
                lock_ttl_remaining,
                attempts,
            },
            Self::InDoubt { task, key, doubt } => Self::InDoubt {
                task,
                key: key.shown_as(logging),
                doubt,
            },
            Self::KeyReuse { task, key } => Self::KeyReuse {
                task,
                key: key.shown_as(logging),
            },
            Self::LockNotHeld { task, key } => Self::LockNotHeld {
                task,
                key: key.shown_as(logging),
            },
            Self::Codec {
                task,
                key,
                kind,
                reason,
            } => Self::Codec {
                task,
                key: key.shown_as(logging),
                kind,
                reason,
            },
            Self::Step {
                task,
                key,
                kind,
                reason,
            } => Self::Step {
                task,
                key: key.shown_as(logging),
                kind,
                reason,
            },
            Self::MarkerKeyMismatch {
                task,
                key,
                stored_key,
            } => Self::MarkerKeyMismatch {
                task,
                key: key.shown_as(logging),
                stored_key: stored_key.shown_as(logging),
            },
            Self::Reentered { task, key } => Self::Reentered {
                task,
                key: key.shown_as(logging),
            },
            other => other,
        }
    }
}

/// The error of a call that found the unit locked for as long as its retry policy waits.
pub(crate) fn contended(
    unit: &UnitOfWork,
    lock_ttl_remaining: Option<Duration>,
    attempts: u32,
) -> Error {
    Error::Contended {
        task: unit.task().to_owned(),
        key: CallerKey::plain(unit.key()),
        lock_ttl_remaining,
        attempts,
    }
}

/// The error of a fence that found the lock no longer the caller's, its key shown as
/// `logging` says.
pub(crate) fn lock_lost(unit: &UnitOfWork, logging: KeyLogging) -> Error {
    Error::LockNotHeld {
        task: unit.task().to_owned(),
        key: CallerKey::plain(unit.key()).shown_as(logging),
    }
}

/// The call's error for a unit held in doubt.
pub(crate) fn held_in_doubt(unit: &UnitOfWork, doubt: crate::store::Doubt) -> Error {
    Error::InDoubt {
        task: unit.task().to_owned(),
        key: CallerKey::plain(unit.key()),
        doubt,
    }
}

/// Stores find a unit by a digest of its key; the marker's own copy of the key tells a digest
/// collision (or a marker written by something else) from this key's result.
pub(crate) fn check_marker_key(unit: &UnitOfWork, stored_key: &str) -> Result<(), Error> {
    if stored_key == unit.key() {
        return Ok(());
    }
    Err(Error::MarkerKeyMismatch {
        task: unit.task().to_owned(),
        key: CallerKey::plain(unit.key()),
        stored_key: CallerKey::plain(stored_key),
    })
}

/// A [`Error::Codec`] of `kind` for `unit`.
pub(crate) fn codec(unit: &UnitOfWork, kind: CodecErrorKind, reason: String) -> Error {
    Error::Codec {
        task: unit.task().to_owned(),
        key: CallerKey::plain(unit.key()),
        kind,
        reason,
    }
}
