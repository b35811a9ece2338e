//! Text for people; the JSON documents are built next to the commands.

use std::fmt::Write;
use std::time::Duration;

use idempotask::operator::Marker;
use idempotask::store::UnitOfWork;

use crate::scan::Entry;
use crate::stored::result_json;
use crate::time::human;

pub(crate) fn done(unit: &UnitOfWork, marker: &Marker, ttl: Option<Duration>) -> String {
    let mut text = format!("{} {:?}: done\n", unit.task(), unit.key());
    if let Some(token) = marker.fencing_token() {
        let _ = writeln!(text, "  fencing token  {token}");
    }
    let _ = writeln!(text, "  result         {}", result_json(marker));
    let expiry = ttl.map_or_else(|| "never".to_owned(), |ttl| format!("in {}", human(ttl)));
    let _ = write!(text, "  expires        {expiry}");
    text
}

/// `lock_ttl` is `None` for a lock without an expiry.
pub(crate) fn locked(unit: &UnitOfWork, lock_ttl: Option<Duration>, age_ms: Option<u64>) -> String {
    let mut text = format!(
        "{} {:?}: locked (a delivery is running it)\n  lock expires   {}",
        unit.task(),
        unit.key(),
        lock_expiry(lock_ttl)
    );
    if let Some(age) = age_ms {
        let _ = write!(
            text,
            "\n  token age      about {}",
            human(Duration::from_millis(age))
        );
    }
    text
}

/// What `status` and `resolve` show of a unit in doubt.
pub(crate) fn in_doubt(
    unit: &UnitOfWork,
    fencing_token: Option<u64>,
    expired_for: Duration,
    forgotten_in: Duration,
) -> String {
    let mut text = format!(
        "{} {:?}: in doubt (a delivery's lock ran out without a release or a result: its side effect may or may not have happened)\n",
        unit.task(),
        unit.key()
    );
    if let Some(token) = fencing_token {
        let _ = writeln!(text, "  fencing token  {token}");
    }
    let _ = write!(
        text,
        "  lock ran out   {} ago\n  remembered     for {} more (then a delivery runs it as new)",
        human(expired_for),
        human(forgotten_in)
    );
    text
}

/// What to do about a unit in doubt, after [`in_doubt`] in `status`.
pub(crate) fn resolve_hint(unit: &UnitOfWork, fenced: bool) -> String {
    let ask = if fenced {
        "ask the downstream system (with the fencing token) whether the effect happened"
    } else {
        "find out downstream whether the effect happened"
    };
    let command = format!(
        "idempotask resolve --task {} --key {:?}",
        unit.task(),
        unit.key()
    );
    format!(
        "  resolve it     {ask}, then\n                   {command} --result '<its result as JSON>'   if it did\n                   {command} --free   if it did not\n                 until then the next delivery reruns it (a task that holds units in doubt fails instead)"
    )
}

/// `in 29.9 s`, or `never (it has no TTL; …)`.
pub(crate) fn lock_expiry(lock_ttl: Option<Duration>) -> String {
    lock_ttl.map_or_else(
        || {
            "never (it has no TTL, which idempotask always sets: something else changed it)"
                .to_owned()
        },
        |ttl| format!("in {}", human(ttl)),
    )
}

/// `scope` is "namespace `…`" or "table `…`"; `scope_flag` the option that changes it.
pub(crate) fn unknown(
    unit: &UnitOfWork,
    scope: &str,
    scope_flag: &str,
    task_has_keys: bool,
) -> String {
    let mut text = format!(
        "{} {:?}: unknown (never ran, failed, expired or forgotten); a delivery will run it",
        unit.task(),
        unit.key()
    );
    if !task_has_keys {
        let _ = write!(
            text,
            "\n  note: task `{}` has no keys at all in {scope}; check --task and {scope_flag}",
            unit.task()
        );
    }
    text
}

/// A listing's counts: they are the task's, whatever the filter shows.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Counts {
    pub(crate) done: usize,
    pub(crate) locked: usize,
    pub(crate) in_doubt: usize,
    /// Keys with a problem: unreadable, written for another key, or of another type.
    pub(crate) flagged: usize,
}

/// `scope` is "namespace `…`" or "table `…`".
pub(crate) fn listing(
    task: &str,
    scope: &str,
    cluster_masters: Option<usize>,
    counts: Counts,
    entries: &[&Entry],
) -> String {
    let Counts {
        done,
        locked,
        in_doubt,
        flagged,
    } = counts;
    let mut text = format!("{task} in {scope}: {done} done, {locked} locked");
    if in_doubt > 0 {
        let _ = write!(text, ", {in_doubt} in doubt");
    }
    if flagged > 0 {
        let _ = write!(text, ", {flagged} flagged");
    }
    if let Some(masters) = cluster_masters {
        let _ = write!(text, " (on {masters} cluster masters)");
    }
    for entry in entries {
        let state = match (entry.done, entry.locked, entry.in_doubt) {
            (true, _, _) => "done",
            (_, true, _) => "locked",
            (_, _, true) => "doubt",
            _ => "odd",
        };
        let name = entry.key.as_ref().map_or_else(
            || format!("digest:{}", &entry.digest),
            |key| format!("{key:?}"),
        );
        let _ = write!(text, "\n{state:<6}  {name}");
        if let Some(token) = entry.fencing_token {
            let _ = write!(text, "  fencing token {token}");
        }
        if let Some(ms) = entry.lock_ttl_ms {
            let _ = write!(
                text,
                "  lock expires in {}",
                human(Duration::from_millis(ms))
            );
        } else if entry.lock_expires == Some(false) {
            let _ = write!(text, "  lock never expires (it has no TTL)");
        }
        if let (Some(expired), Some(forgotten)) = (entry.expired_for_ms, entry.forgotten_in_ms) {
            let _ = write!(
                text,
                "  lock ran out {} ago, remembered for {} more",
                human(Duration::from_millis(expired)),
                human(Duration::from_millis(forgotten))
            );
        }
        if let Some(err) = &entry.error {
            let _ = write!(text, "  warning: {err}");
        }
    }
    text
}
