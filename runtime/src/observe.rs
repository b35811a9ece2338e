//! What a task call tells operators: one `tracing` span per call and, with the `metrics`
//! feature, counters and histograms through the [`metrics`](https://docs.rs/metrics) facade.
//!
//! # The span
//! Every call of a [`Task`](crate::Task) runs inside an `INFO` span named `idempotask.call`
//! (target `idempotask`) with these fields, filled in as the call goes:
//!
//! | field | value |
//! |---|---|
//! | `task` | the task's stable name |
//! | `key` | the caller key, or its digest with [`KeyLogging::Hash`] |
//! | `outcome` | `executed`, `replayed`, `reconciled`, `contended`, `failed`, `lock_lost`, `marker_not_written` or `in_doubt` (held, [`InDoubt::Hold`](crate::InDoubt::Hold)) |
//! | `attempts` | how many times the call asked for the lock |
//! | `fencing_token` | the token of the execution that produced the value |
//! | `waited_ms` | how long the call spent getting the lock or the stored result |
//!
//! The span is created once per call; with no subscriber interested in it, creating it and
//! recording into it costs a cached callsite check and allocates nothing. Warnings (a lost lock,
//! a result that could not be recorded, a lock that could not be released, a unit found in
//! doubt, a body that used more than 80 % of a lock TTL it does not renew) are logged inside it
//! and carry `task` and `key` themselves too, so they stay readable when spans are filtered out.
//!
//! # Metrics (feature `metrics`)
//!
//! | name | kind | labels |
//! |---|---|---|
//! | `idempotask_calls_total` | counter | `task`, `outcome` (as the span's) |
//! | `idempotask_lock_wait_seconds` | histogram | `task` |
//! | `idempotask_lock_waits_total` | counter | `task`: calls that found the unit busy and asked again (whatever they got in the end) |
//! | `idempotask_body_duration_seconds` | histogram | `task` |
//! | `idempotask_lock_renewals_total` | counter | `task`, `result` (`renewed`, `lost`, `failed`) |
//! | `idempotask_lock_ttl_used_ratio` | histogram | `task`: the share of its lock TTL each body used, from the request for the lock to the body's end (renewed locks included: above 1 means renewal carried it) |
//! | `idempotask_in_doubt_total` | counter | `task`, `policy` (`rerun`, `hold`): units found [in doubt](crate::store::Doubt) |
//! | `idempotask_held_overdue_total` | counter | `task`: deliveries that met a unit held longer than the task's [`hold_alert_after`](crate::Task::hold_alert_after) |
//!
//! | `idempotask_steps_total` | counter | `task`, `outcome` (as the step span's): every [step](crate::TaskContext::step) of a body, once |
//! | `idempotask_steps_refused_total` | counter | `task`, `kind` (`order_changed`, `too_many`, `overlapping`, `unsupported`): steps refused before their effect, by [`StepErrorKind`] |
//!
//! Nothing is recorded until the application installs a recorder (an exporter such as
//! `metrics-exporter-prometheus`).
//!
//! # The step span
//! Each [step](crate::TaskContext::step) of a body runs inside an `INFO` span named
//! `idempotask.step` (target `idempotask`), a child of its call's span, with these fields; the
//! step's effect runs inside it, so that its own spans and events nest there:
//!
//! | field | value |
//! |---|---|
//! | `task` | the task's stable name |
//! | `step` | the step's name, with its key part (`mail[ada@example.com]`) |
//! | `position` | its place in the unit's journal, from 0 (none for a step refused before it has one) |
//! | `outcome` | `ran` (its effect ran and its record is confirmed), `replayed` (its recorded value, without running its effect), `reconciled` (the step in doubt, found done by its reconcile function), `held` (the step in doubt, held), `refused` (before its effect: `kind` says why), `unrecorded` (its effect ran and its record was not confirmed: the unit stays in doubt), `failed` (its effect or its reconcile function answered an error, the lock was lost, or the store failed) |
//! | `kind` | for `refused`: `order_changed`, `too_many`, `overlapping` or `unsupported` |
//!
//! A call without steps creates no step span and counts nothing more.

use std::fmt;
use std::time::Duration;

use tracing::Span;
use tracing::field::Empty;

use crate::step::kind::StepErrorKind;
use crate::unit::UnitOfWork;

/// The name of the counter of calls, by `task` and `outcome` (one of [`OUTCOMES`]): what a
/// dashboard reads back from the metrics.
///
/// ```
/// assert_eq!(idempotask::observe::CALLS_TOTAL, "idempotask_calls_total");
/// ```
pub const CALLS_TOTAL: &str = "idempotask_calls_total";

/// The name of the counter of calls that found their unit busy and asked again, by `task`.
///
/// ```
/// assert_eq!(idempotask::observe::LOCK_WAITS_TOTAL, "idempotask_lock_waits_total");
/// ```
pub const LOCK_WAITS_TOTAL: &str = "idempotask_lock_waits_total";

/// Every value of the `outcome` field and label, as the span and [`CALLS_TOTAL`] spell them;
/// a later release may add some.
///
/// ```
/// assert!(idempotask::observe::OUTCOMES.contains(&"contended"));
/// ```
pub const OUTCOMES: &[&str] = &[
    "executed",
    "replayed",
    "reconciled",
    "contended",
    "failed",
    "lock_lost",
    "marker_not_written",
    "in_doubt",
];

/// The share of its lock TTL past which a body that does not renew its lock is warned about.
const LOCK_TTL_WARNING_SHARE: f64 = 0.8;

/// How the caller key appears in logs and spans; see [`Task::log_key`](crate::Task::log_key).
///
/// Keys are chosen by the caller and sometimes carry what logs must not (an e-mail address, an
/// account number). With [`Hash`](Self::Hash) the logs show the key's digest instead, the same
/// digest that is part of the Redis key, so an operator can still find the unit with
/// `idempotask list` or `redis-cli`. The choice holds for every output of the task: its span,
/// its warnings, and the `Display` and `Debug` of the errors it returns (their keys are
/// [`CallerKey`](crate::CallerKey)s; `as_str` still gives the key to code that asks).
///
/// ```
/// use idempotask::{KeyLogging, Task};
/// static SEND: Task = Task::new("send_statement").log_key(KeyLogging::Hash);
/// assert_eq!(SEND.settings().log_key, KeyLogging::Hash);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyLogging {
    /// The caller key as given (the default).
    #[default]
    Plain,
    /// The caller key's digest ([`UnitOfWork::digest`](crate::store::UnitOfWork::digest)), as in the
    /// Redis key.
    Hash,
}

impl KeyLogging {
    /// The text that stands for `unit`'s key in logs.
    pub(crate) fn show(self, unit: &UnitOfWork) -> &str {
        match self {
            Self::Plain => unit.key(),
            Self::Hash => unit.digest(),
        }
    }
}

/// How one call ended, as the span's `outcome` field and the `outcome` metric label say it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ending {
    Executed,
    Replayed,
    Reconciled,
    Contended,
    Failed,
    LockLost,
    MarkerNotWritten,
    InDoubt,
}

impl Ending {
    fn as_str(self) -> &'static str {
        match self {
            Self::Executed => "executed",
            Self::Replayed => "replayed",
            Self::Reconciled => "reconciled",
            Self::Contended => "contended",
            Self::Failed => "failed",
            Self::LockLost => "lock_lost",
            Self::MarkerNotWritten => "marker_not_written",
            Self::InDoubt => "in_doubt",
        }
    }
}

/// The span of one call and what it needs to name its metrics.
pub(crate) struct Observation<'t> {
    span: Span,
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    task: &'t std::borrow::Cow<'static, str>,
}

impl<'t> Observation<'t> {
    /// Input: the task's name. Output: the call's span with only `task` set yet.
    #[allow(
        clippy::ptr_arg,
        reason = "a clone of the `Cow` labels metrics without copying a static name"
    )]
    pub(crate) fn start(task: &'t std::borrow::Cow<'static, str>) -> Self {
        let span = tracing::info_span!(
            target: "idempotask",
            "idempotask.call",
            task = &**task,
            key = Empty,
            outcome = Empty,
            attempts = Empty,
            fencing_token = Empty,
            waited_ms = Empty,
        );
        Self { span, task }
    }

    pub(crate) fn span(&self) -> &Span {
        &self.span
    }

    pub(crate) fn key(&self, unit: &UnitOfWork, logging: KeyLogging) {
        self.span.record("key", logging.show(unit));
    }

    /// The lock (or the stored result) was obtained, or waiting was given up, after `waited`.
    pub(crate) fn waited(&self, attempts: u32, waited: Duration) {
        self.span.record("attempts", attempts);
        self.span.record(
            "waited_ms",
            u64::try_from(waited.as_millis()).unwrap_or(u64::MAX),
        );
        #[cfg(feature = "metrics")]
        {
            metrics::histogram!("idempotask_lock_wait_seconds", "task" => self.task.clone())
                .record(waited.as_secs_f64());
            if attempts > 1 {
                metrics::counter!(LOCK_WAITS_TOTAL, "task" => self.task.clone()).increment(1);
            }
        }
    }

    pub(crate) fn fencing_token(&self, token: Option<u64>) {
        if let Some(token) = token {
            self.span.record("fencing_token", token);
        }
    }

    #[cfg_attr(not(feature = "metrics"), allow(clippy::unused_self, unused_variables))]
    pub(crate) fn body_ran(&self, duration: Duration) {
        #[cfg(feature = "metrics")]
        metrics::histogram!("idempotask_body_duration_seconds", "task" => self.task.clone())
            .record(duration.as_secs_f64());
    }

    /// How much of its lock TTL a body used, from the request for the lock to its end: a
    /// histogram of the share, and one `WARN` past 80 % for a lock nobody renews. The seed's
    /// advice: set the TTL well above the task's p99, and watch the tasks that approach it.
    #[cfg_attr(not(feature = "metrics"), allow(clippy::unused_self))]
    pub(crate) fn lock_used(
        &self,
        unit: &UnitOfWork,
        logging: KeyLogging,
        used: Duration,
        ttl: Duration,
        renewed: bool,
    ) {
        let share = used.as_secs_f64() / ttl.as_secs_f64().max(f64::MIN_POSITIVE);
        #[cfg(feature = "metrics")]
        metrics::histogram!("idempotask_lock_ttl_used_ratio", "task" => self.task.clone())
            .record(share);
        if !renewed && share > LOCK_TTL_WARNING_SHARE {
            tracing::warn!(
                target: "idempotask",
                task = unit.task(),
                key = logging.show(unit),
                used_ms = u64::try_from(used.as_millis()).unwrap_or(u64::MAX),
                lock_ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
                "the task ran for more than 80 % of its lock TTL without renewal; a slower run would let a duplicate start: raise `lock_ttl` or turn on `renew`"
            );
        }
    }

    /// Records `Failed` unless an ending was recorded already.
    pub(crate) fn ended(&self, ending: Ending) {
        self.span.record("outcome", ending.as_str());
        #[cfg(feature = "metrics")]
        metrics::counter!(
            CALLS_TOTAL,
            "task" => self.task.clone(),
            "outcome" => ending.as_str(),
        )
        .increment(1);
    }
}

/// How one step ended, as its span's `outcome` field and the `outcome` label of
/// `idempotask_steps_total` say it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StepEnding {
    Ran,
    Replayed,
    Reconciled,
    Held,
    Refused(StepErrorKind),
    Unrecorded,
    Failed,
}

impl StepEnding {
    fn as_str(self) -> &'static str {
        match self {
            Self::Ran => "ran",
            Self::Replayed => "replayed",
            Self::Reconciled => "reconciled",
            Self::Held => "held",
            Self::Refused(_) => "refused",
            Self::Unrecorded => "unrecorded",
            Self::Failed => "failed",
        }
    }
}

/// The `kind` label of a refused step.
fn refusal(kind: StepErrorKind) -> &'static str {
    match kind {
        StepErrorKind::OrderChanged => "order_changed",
        StepErrorKind::TooMany => "too_many",
        StepErrorKind::Overlapping => "overlapping",
        StepErrorKind::Unsupported => "unsupported",
        StepErrorKind::Unrecorded => "unrecorded",
    }
}

/// The span of one step; its ending is recorded once, into the span and the counters.
pub(crate) struct StepObservation {
    span: Span,
}

impl StepObservation {
    /// Input: the task's name and the step's. Output: the step's span, with its place and its
    /// ending still to come.
    pub(crate) fn start(task: &str, step: &impl fmt::Display) -> Self {
        let span = tracing::info_span!(
            target: "idempotask",
            "idempotask.step",
            task,
            step = %step,
            position = Empty,
            outcome = Empty,
            kind = Empty,
        );
        Self { span }
    }

    pub(crate) fn span(&self) -> &Span {
        &self.span
    }

    pub(crate) fn position(&self, position: u32) {
        self.span.record("position", position);
    }

    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(crate) fn ended(&self, task: &str, ending: StepEnding) {
        self.span.record("outcome", ending.as_str());
        if let StepEnding::Refused(kind) = ending {
            self.span.record("kind", refusal(kind));
        }
        #[cfg(feature = "metrics")]
        {
            metrics::counter!(
                "idempotask_steps_total",
                "task" => task.to_owned(),
                "outcome" => ending.as_str(),
            )
            .increment(1);
            if let StepEnding::Refused(kind) = ending {
                metrics::counter!(
                    "idempotask_steps_refused_total",
                    "task" => task.to_owned(),
                    "kind" => refusal(kind),
                )
                .increment(1);
            }
        }
    }
}

/// A unit found in doubt, and what its task's policy makes of it: one `WARN` and a count; an
/// `ERROR` and a count of its own for a unit held longer than the task's `hold_alert_after`.
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn in_doubt(
    unit: &UnitOfWork,
    logging: KeyLogging,
    policy: crate::InDoubt,
    hold_alert_after: Option<Duration>,
    doubt: &crate::store::Doubt,
) {
    let expired_ms = u64::try_from(doubt.expired_for.as_millis()).unwrap_or(u64::MAX);
    let overdue = policy == crate::InDoubt::Hold
        && hold_alert_after.is_some_and(|after| doubt.expired_for >= after);
    if overdue {
        tracing::error!(
            target: "idempotask",
            task = unit.task(),
            key = logging.show(unit),
            earlier_fencing_token = doubt.fencing_token,
            expired_ms,
            "unit held longer than the task's hold_alert_after: resolve it (idempotask resolve), or its deliveries keep failing with InDoubt"
        );
        #[cfg(feature = "metrics")]
        metrics::counter!("idempotask_held_overdue_total", "task" => unit.task().to_owned())
            .increment(1);
    } else {
        tracing::warn!(
            target: "idempotask",
            task = unit.task(),
            key = logging.show(unit),
            policy = policy.as_str(),
            earlier_fencing_token = doubt.fencing_token,
            expired_ms,
            "unit in doubt: an earlier delivery's lock ran out without a release or a result, so its side effect may have happened"
        );
    }
    #[cfg(feature = "metrics")]
    metrics::counter!(
        "idempotask_in_doubt_total",
        "task" => unit.task().to_owned(),
        "policy" => policy.as_str(),
    )
    .increment(1);
}

/// One renewal of a lock by the watchdog: `renewed`, `lost` or `failed`.
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn renewal(task: &str, result: &'static str) {
    #[cfg(feature = "metrics")]
    metrics::counter!(
        "idempotask_lock_renewals_total",
        "task" => task.to_owned(),
        "result" => result,
    )
    .increment(1);
}

#[cfg(test)]
mod tests {
    use super::{Ending, OUTCOMES};

    #[test]
    fn outcomes_names_every_ending_once_in_order() {
        let every = [
            Ending::Executed,
            Ending::Replayed,
            Ending::Reconciled,
            Ending::Contended,
            Ending::Failed,
            Ending::LockLost,
            Ending::MarkerNotWritten,
            Ending::InDoubt,
        ];
        // Exhaustive: a new ending fails to compile here until it is listed above.
        for ending in every {
            match ending {
                Ending::Executed
                | Ending::Replayed
                | Ending::Reconciled
                | Ending::Contended
                | Ending::Failed
                | Ending::LockLost
                | Ending::MarkerNotWritten
                | Ending::InDoubt => {}
            }
        }
        assert_eq!(every.map(Ending::as_str).as_slice(), OUTCOMES);
    }
}
