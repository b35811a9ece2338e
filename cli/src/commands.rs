//! The four commands. Each returns what it found as a [`Found`]; `main` prints it.

use std::io::{BufRead, IsTerminal, Write};

use std::time::Duration;

use idempotask::operator::{Forgot, Held, Marker, Resolution, Resolved};
use idempotask::store::UnitOfWork;
use serde_json::value::RawValue;
use serde_json::{Value, json};

use crate::exit::{Exit, Failure};
use crate::render::{self, Counts};
use crate::steps::{self, Next};
use crate::stored::{preview, result_json};
use crate::target::Target;
use crate::time::{human, millis};

/// What a command found: the JSON document, the text for people, and the exit code.
pub(crate) struct Found {
    pub(crate) json: Value,
    pub(crate) text: String,
    pub(crate) exit: Exit,
}

/// `status`: done (exit 0), locked (3), unknown (4) or in doubt (5), with the steps a unit
/// that has not finished recorded; a key that holds something no delivery can use is an
/// error (1) that names it.
pub(crate) async fn status(target: &Target, task: &str, key: &str) -> Result<Found, Failure> {
    let unit = target.unit(task, key)?;
    let location = target.location(&unit);
    let mut json = unit_json(target, &unit);
    let seen = target.read(&unit).await?;
    let (text, exit) = match &seen {
        Held::Marker {
            marker: Ok(marker),
            ttl,
            ..
        } if marker.key() == unit.key() => {
            json["state"] = json!("done");
            json["fencing_token"] = json!(marker.fencing_token());
            json["result"] = result_json(marker);
            json["ttl_ms"] = json!(ttl.map(millis));
            (render::done(&unit, marker, *ttl), Exit::Ok)
        }
        Held::Lock {
            fencing_token,
            lock_ttl_remaining: ttl,
            age,
            ..
        } => {
            let age_ms = age.map(millis);
            json["state"] = json!("locked");
            json["fencing_token"] = json!(fencing_token);
            json["lock_ttl_ms"] = json!(ttl.map(millis));
            json["lock_expires"] = json!(ttl.is_some());
            json["token_age_ms"] = json!(age_ms);
            let steps = steps::add(target, &unit, Next::Running, &mut json).await?;
            (render::locked(&unit, *ttl, age_ms) + &steps, Exit::Locked)
        }
        Held::InDoubt {
            fencing_token,
            expired_for,
            forgotten_in,
            ..
        } => {
            json["state"] = json!("in_doubt");
            json["fencing_token"] = json!(fencing_token);
            json["expired_for_ms"] = json!(millis(*expired_for));
            json["forgotten_in_ms"] = json!(millis(*forgotten_in));
            let steps = steps::add(target, &unit, Next::InDoubt, &mut json).await?;
            let text = format!(
                "{}{steps}\n{}",
                render::in_doubt(&unit, *fencing_token, *expired_for, *forgotten_in),
                render::resolve_hint(&unit, fencing_token.is_some())
            );
            (text, Exit::InDoubt)
        }
        Held::Nothing => {
            let known = target.task_exists(task).await?;
            json["state"] = json!("unknown");
            json["task_has_keys"] = json!(known);
            let steps = steps::add(target, &unit, Next::Waiting, &mut json).await?;
            // A journal is the task's too, though a listing finds only units.
            let seen = known || !steps.is_empty();
            (
                render::unknown(&unit, &target.scope_text(), target.scope_flag(), seen) + &steps,
                Exit::Unknown,
            )
        }
        unusable => return Err(unusable_failure(&unit, &location, unusable, false)),
    };
    Ok(Found { json, text, exit })
}

/// The JSON every command about one unit starts from: where, which task and key, the digest.
pub(crate) fn unit_json(target: &Target, unit: &UnitOfWork) -> Value {
    let (scope, name) = target.scope();
    json!({
        scope: name,
        "task": unit.task(),
        "key": unit.key(),
        "digest": unit.digest(),
    })
}

/// Input: a unit that changed between the read an operator was shown and the write that
/// depended on it; what was not done ("deleted: the value of"), why it may have changed, and
/// what to add to the advice. Output: the failure (`changed`, exit 1).
pub(crate) fn changed(unit: &UnitOfWork, nothing: &str, why: &str, then: &str) -> Failure {
    let (task, key) = (unit.task(), unit.key());
    Failure::new(
        Exit::Error,
        "changed",
        format!(
            "nothing {nothing} {task} {key:?} changed after it was read ({why}); see it with `idempotask status --task {task} --key {key:?}`{then}"
        ),
    )
}

/// Input: a unit and what its key holds, which no delivery can use. Output: the failure that
/// says so and what to do; `forgetting` when `forget` refuses it without `--force`.
fn unusable_failure(unit: &UnitOfWork, location: &str, stored: &Held, forgetting: bool) -> Failure {
    let (task, key) = (unit.task(), unit.key());
    let remedy = if forgetting {
        "; pass --force to delete it (deliveries fail on it until it is gone)".to_owned()
    } else {
        format!(
            "; deliveries fail on it until it is gone: `idempotask forget --force --task {task} --key {key:?}` deletes it"
        )
    };
    match stored {
        Held::Marker {
            marker: Ok(marker), ..
        } => Failure::new(
            Exit::Error,
            "key_mismatch",
            format!(
                "the marker found for key `{key}` of task `{task}` belongs to key `{}` (a forged value or a digest collision){remedy}",
                marker.key()
            ),
        ),
        Held::Marker {
            marker: Err(err), ..
        } => Failure::new(
            Exit::Error,
            "unreadable",
            format!(
                "task `{task}` with key `{key}`: the stored marker cannot be read: {err}{remedy}"
            ),
        ),
        Held::Foreign { bytes, .. } => Failure::new(
            Exit::Error,
            "unreadable",
            format!(
                "task `{task}` with key `{key}`: `{location}` holds {}, which is not idempotask's{remedy}",
                preview(bytes)
            ),
        ),
        Held::OtherType { kind, .. } => Failure::new(
            Exit::Error,
            "wrong_type",
            format!(
                "task `{task}` with key `{key}`: `{location}` is a {kind} key, and idempotask writes only strings: something else uses this name; rename that data, or delete it with `redis-cli DEL` once nothing needs it"
            ),
        ),
        // Only unusable values reach here, and what a later version of the core shows.
        _ => Failure::new(
            Exit::Error,
            "unreadable",
            format!("`{location}`: {stored:?}"),
        ),
    }
}

/// `forget`: deletes a done key's marker after a confirmation; refuses while it is locked. With
/// `force`, also a marker that is unreadable or was written for another key (never a lock). The
/// delete happens only if the key still holds the bytes that were checked and shown.
pub(crate) async fn forget(
    target: &Target,
    task: &str,
    key: &str,
    yes: bool,
    force: bool,
) -> Result<Found, Failure> {
    let unit = target.unit(task, key)?;
    let location = target.location(&unit);
    let seen = target.read(&unit).await?;
    // What the operator is shown, the exact bytes behind it, and whether only `--force` lets
    // them go.
    let (shown, bytes, fencing_token, forced) = match &seen {
        Held::Marker {
            bytes,
            ttl,
            marker: Ok(marker),
            ..
        } if marker.key() == unit.key() => (
            render::done(&unit, marker, *ttl),
            bytes,
            marker.fencing_token(),
            false,
        ),
        Held::Lock {
            lock_ttl_remaining, ..
        } => {
            return Err(locked_refusal(
                &unit,
                &location,
                *lock_ttl_remaining,
                "forget",
            ));
        }
        Held::InDoubt { expired_for, .. } => return Err(in_doubt_refusal(&unit, *expired_for)),
        Held::Nothing => {
            return Err(Failure::new(
                Exit::Unknown,
                "unknown",
                format!(
                    "nothing to forget: task `{task}` has no marker for key `{key}` in {}",
                    target.scope_text()
                ),
            ));
        }
        Held::Marker { bytes, .. } | Held::Foreign { bytes, .. } => {
            if !force {
                return Err(unusable_failure(&unit, &location, &seen, true));
            }
            let (what, fencing_token) = match &seen {
                Held::Marker {
                    marker: Ok(marker), ..
                } => (
                    format!("a marker written for key {:?}", marker.key()),
                    marker.fencing_token(),
                ),
                _ => ("a value no delivery can read".to_owned(), None),
            };
            let shown = format!(
                "{task} {key:?}: {what}\n  stored         {}",
                preview(bytes)
            );
            (shown, bytes, fencing_token, true)
        }
        // Data of another type, and what a later version of the core shows: never deleted.
        _ => return Err(unusable_failure(&unit, &location, &seen, true)),
    };
    if !yes {
        confirm(
            &shown,
            "Forget it, so that the next delivery runs the work again?",
            "forget",
            "deleted",
        )?;
    }
    let forgot = target.forget_exact(&unit, bytes).await?;
    // A variant newer than this binary is not known to have deleted anything: it answers as
    // `Changed` does.
    let deleted = match forgot {
        Forgot::Deleted => true,
        Forgot::Gone => false,
        _ => {
            return Err(changed(
                &unit,
                "deleted: the value of",
                "a delivery wrote it meanwhile",
                " and forget again if you still mean to",
            ));
        }
    };
    let mut json = unit_json(target, &unit);
    json["forgotten"] = json!(deleted);
    json["forced"] = json!(forced);
    json["fencing_token"] = json!(fencing_token);
    let text = if deleted {
        format!("forgot {task} {key:?}; the next delivery runs it again")
    } else {
        format!("{task} {key:?} expired or was forgotten meanwhile; nothing deleted")
    };
    Ok(Found {
        json,
        text,
        exit: Exit::Ok,
    })
}

/// Input: a unit in doubt that `forget` was asked to delete. Output: the refusal, with what
/// settles it instead.
fn in_doubt_refusal(unit: &UnitOfWork, expired_for: Duration) -> Failure {
    let (task, key) = (unit.task(), unit.key());
    Failure::new(
        Exit::InDoubt,
        "in_doubt",
        format!(
            "refusing to forget {task} {key:?}: it is in doubt, not done (a delivery's lock ran out {} ago without a release or a result), and `forget` deletes only results; find out downstream whether its side effect happened, then `idempotask resolve --task {task} --key {key:?}` with `--result '<its result as JSON>'` or `--free`",
            human(expired_for)
        ),
    )
}

/// Input: a locked unit that `verb` (`forget`, `resolve`) was asked to change. Output: the
/// refusal, with when to try again.
fn locked_refusal(
    unit: &UnitOfWork,
    location: &str,
    lock_ttl: Option<Duration>,
    verb: &str,
) -> Failure {
    let (task, key) = (unit.task(), unit.key());
    let message = match lock_ttl {
        Some(ttl) => format!(
            "refusing to {verb} {task} {key:?}: it is locked (a delivery is running it; the lock expires in {}); try again once it has finished",
            human(ttl)
        ),
        None => format!(
            "refusing to {verb} {task} {key:?}: it is locked, and the lock never expires (it has no TTL, which idempotask always sets: something else changed it); `--force` never deletes a lock: once no delivery runs it, delete it with `redis-cli DEL {location}`"
        ),
    };
    Failure::new(Exit::Locked, "locked", message)
}

/// Shows `what` and asks `question` on the terminal; without one, refuses (a script must say
/// `--yes`). `verb` names the command and `undone` what a refusal leaves undone ("deleted").
pub(crate) fn confirm(what: &str, question: &str, verb: &str, undone: &str) -> Result<(), Failure> {
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        return Err(Failure::usage(format!(
            "refusing to {verb} without confirmation: stdin is not a terminal; pass --yes to {verb} non-interactively"
        )));
    }
    let mut stderr = std::io::stderr();
    let _ = write!(stderr, "{what}\n{question} [y/N] ");
    let _ = stderr.flush();
    let mut answer = String::new();
    stdin
        .lock()
        .read_line(&mut answer)
        .map_err(|err| Failure::new(Exit::Error, "io", format!("cannot read the answer: {err}")))?;
    if matches!(answer.trim(), "y" | "Y" | "yes" | "YES" | "Yes") {
        Ok(())
    } else {
        Err(Failure::new(
            Exit::Error,
            "declined",
            format!("not confirmed; nothing was {undone}"),
        ))
    }
}

/// Which of a task's units `list` shows; the counts are always the whole task's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Only {
    All,
    Done,
    Locked,
    /// In doubt, and with `older_than`, run out at least that long ago.
    InDoubt {
        older_than: Option<Duration>,
    },
}

/// `list`: every done, locked and in-doubt unit of a task, and the odd keys under its pattern,
/// with counts; unknown task → exit 4.
pub(crate) async fn list(target: &Target, task: &str, only: Only) -> Result<Found, Failure> {
    Target::check_task(task)?;
    let listing = target.list(task).await?;
    let scanned = listing.servers_scanned;
    let done = listing.entries.values().filter(|e| e.done).count();
    let locked = listing.entries.values().filter(|e| e.locked).count();
    let in_doubt = listing.entries.values().filter(|e| e.in_doubt).count();
    let flagged = listing
        .entries
        .values()
        .filter(|e| e.problem.is_some())
        .count();
    let shown: Vec<_> = listing
        .entries
        .values()
        .filter(|e| match only {
            Only::All => true,
            Only::Done => e.done,
            Only::Locked => e.locked,
            Only::InDoubt { older_than } => {
                e.in_doubt
                    && older_than.is_none_or(|age| {
                        e.expired_for_ms
                            .is_some_and(|ms| u128::from(ms) >= age.as_millis())
                    })
            }
        })
        .collect();
    if listing.keys_seen == 0 {
        return Err(Failure::new(
            Exit::Unknown,
            "unknown_task",
            format!(
                "unknown task: `{task}` has no keys in {}; check --task and {}",
                target.scope_text(),
                target.scope_flag()
            ),
        ));
    }
    let (scope, name) = target.scope();
    let json = json!({
        scope: name,
        "task": task,
        "cluster": target.is_cluster(),
        "servers_scanned": scanned,
        "done": done,
        "locked": locked,
        "in_doubt": in_doubt,
        "flagged": flagged,
        "entries": shown,
    });
    let cluster_masters = target.is_cluster().then_some(scanned);
    let text = render::listing(
        task,
        &format!("{scope} {name}"),
        cluster_masters,
        Counts {
            done,
            locked,
            in_doubt,
            flagged,
        },
        &shown,
    );
    let exit = Exit::Ok;
    Ok(Found { json, text, exit })
}

/// What `resolve` is asked to do with a unit in doubt.
pub(crate) enum Settle {
    /// The effect happened: record this result, kept for `result_ttl`.
    Record {
        result: Box<RawValue>,
        result_ttl: Duration,
    },
    /// The effect did not happen: free the unit.
    Free,
}

/// A unit in doubt `resolve` read: the lock's bytes to compare, and what the operator is shown.
pub(crate) struct InDoubt {
    pub(crate) unit: UnitOfWork,
    pub(crate) bytes: Vec<u8>,
    pub(crate) fencing_token: Option<u64>,
    pub(crate) shown: String,
}

/// Input: the unit `resolve` was asked about. Output: it in doubt, or the refusal with the
/// exit code of its state (done 1, locked 3, unknown 4).
pub(crate) async fn read_in_doubt(
    target: &Target,
    task: &str,
    key: &str,
) -> Result<InDoubt, Failure> {
    let unit = target.unit(task, key)?;
    let seen = target.read(&unit).await?;
    let Held::InDoubt {
        bytes,
        fencing_token,
        expired_for,
        forgotten_in,
        ..
    } = seen
    else {
        return Err(not_in_doubt(target, &unit, &target.location(&unit), &seen));
    };
    let shown = render::in_doubt(&unit, fencing_token, expired_for, forgotten_in);
    Ok(InDoubt {
        unit,
        bytes,
        fencing_token,
        shown,
    })
}

/// `resolve`: records a result for a unit in doubt, or frees it, after a confirmation; only
/// while it still holds the lock that was read and shown, still run out ([`read_in_doubt`]).
pub(crate) async fn resolve(
    target: &Target,
    task: &str,
    key: &str,
    settle: Settle,
    yes: bool,
) -> Result<Found, Failure> {
    let InDoubt {
        unit,
        bytes,
        fencing_token,
        shown,
    } = read_in_doubt(target, task, key).await?;
    let (resolution, question, recorded) = match settle {
        Settle::Record { result, result_ttl } => (
            Resolution::record(
                Marker::encode_resolution(&unit, fencing_token, &result),
                result_ttl,
            ),
            format!(
                "Record {} as its result, kept for {}, so that every delivery gets it back?",
                result.get(),
                human(result_ttl)
            ),
            Some((result, result_ttl)),
        ),
        Settle::Free => (
            Resolution::Free,
            "Free it, so that the next delivery runs the work as new?".to_owned(),
            None,
        ),
    };
    if !yes {
        confirm(&shown, &question, "resolve", "written")?;
    }
    let resolved = target.resolve_exact(&unit, &bytes, &resolution).await?;
    let (word, text) = match (resolved, &recorded) {
        (Resolved::Recorded, Some((result, ttl))) => (
            "recorded",
            format!(
                "recorded {} as the result of {task} {key:?}; every delivery gets it back (kept for {})",
                result.get(),
                human(*ttl)
            ),
        ),
        (Resolved::Freed, None) => (
            "freed",
            format!("freed {task} {key:?}; the next delivery runs it as new, with no doubt"),
        ),
        (Resolved::Gone, None) => (
            "gone",
            format!(
                "{task} {key:?} became free meanwhile (its doubt memory ran out, someone freed it, or its holder came back and released it); nothing to free: the next delivery runs it as new"
            ),
        ),
        (Resolved::Gone, Some(_)) => {
            return Err(Failure::new(
                Exit::Unknown,
                "gone",
                format!(
                    "nothing recorded: {task} {key:?} became free after it was read (its doubt memory ran out, someone freed it, or its holder came back and released it); the next delivery runs it as new"
                ),
            ));
        }
        // `Changed`, and a variant newer than this binary, which is not known to have written
        // anything.
        _ => {
            return Err(changed(
                &unit,
                "written:",
                "a delivery took it over, its holder came back and finished or renewed it, or someone resolved it",
                "",
            ));
        }
    };
    let mut json = unit_json(target, &unit);
    json["resolved"] = json!(word);
    json["fencing_token"] = json!(fencing_token);
    json["result"] = json!(recorded.as_ref().map(|(result, _)| result));
    json["result_ttl_ms"] = json!(recorded.as_ref().map(|(_, ttl)| millis(*ttl)));
    Ok(Found {
        json,
        text,
        exit: Exit::Ok,
    })
}

/// Input: a unit `resolve` was asked about and what it holds, which is no lock in doubt.
/// Output: the refusal, with the exit code of the unit's state.
fn not_in_doubt(target: &Target, unit: &UnitOfWork, location: &str, seen: &Held) -> Failure {
    let (task, key) = (unit.task(), unit.key());
    match seen {
        Held::Lock {
            lock_ttl_remaining, ..
        } => {
            let mut failure = locked_refusal(unit, location, *lock_ttl_remaining, "resolve");
            failure.kind = "not_in_doubt";
            failure.message.push_str(
                "; it is not in doubt: only a lock that ran out without a release or a result is",
            );
            failure
        }
        Held::Nothing => Failure::new(
            Exit::Unknown,
            "not_in_doubt",
            format!(
                "nothing to resolve: task `{task}` has nothing for key `{key}` in {} (never ran, failed, expired, forgotten or freed); a delivery runs it as new",
                target.scope_text()
            ),
        ),
        Held::Marker {
            marker: Ok(marker), ..
        } if marker.key() == key => Failure::new(
            Exit::Error,
            "not_in_doubt",
            format!(
                "refusing to resolve {task} {key:?}: it is done, not in doubt (its result is stored: see it with `idempotask status --task {task} --key {key:?}`)"
            ),
        ),
        unusable => unusable_failure(unit, location, unusable, false),
    }
}
