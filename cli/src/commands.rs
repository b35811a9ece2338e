//! The three commands. Each returns what it found as a [`Found`]; `main` prints it.

use std::io::{BufRead, IsTerminal, Write};

use std::time::Duration;

use idempotask::operator::Forgot;
use idempotask::store::UnitOfWork;
use serde_json::{Value, json};

use crate::exit::{Exit, Failure};
use crate::render::{self, Counts};
use crate::stored::{Seen, preview, result_json};
use crate::target::Target;
use crate::time::{human, millis};

/// What a command found: the JSON document, the text for people, and the exit code.
pub(crate) struct Found {
    pub(crate) json: Value,
    pub(crate) text: String,
    pub(crate) exit: Exit,
}

/// `status`: done (exit 0), locked (3) or unknown (4); a key that holds something no delivery
/// can use is an error (1) that names it.
pub(crate) async fn status(target: &Target, task: &str, key: &str) -> Result<Found, Failure> {
    let unit = target.unit(task, key)?;
    let location = target.location(&unit);
    let (scope, name) = target.scope();
    let mut json = json!({
        scope: name,
        "task": task,
        "key": key,
        "digest": unit.digest(),
    });
    let seen = target.read(&unit).await?;
    let (text, exit) = match &seen {
        Seen::Marker {
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
        Seen::Lock {
            fencing_token,
            ttl,
            age_ms,
        } => {
            json["state"] = json!("locked");
            json["fencing_token"] = json!(fencing_token);
            json["lock_ttl_ms"] = json!(ttl.map(millis));
            json["lock_expires"] = json!(ttl.is_some());
            json["token_age_ms"] = json!(age_ms);
            (render::locked(&unit, *ttl, *age_ms), Exit::Locked)
        }
        Seen::Missing => {
            let known = target.task_exists(task).await?;
            json["state"] = json!("unknown");
            json["task_has_keys"] = json!(known);
            (
                render::unknown(&unit, &target.scope_text(), target.scope_flag(), known),
                Exit::Unknown,
            )
        }
        unusable => return Err(unusable_failure(&unit, &location, unusable, false)),
    };
    Ok(Found { json, text, exit })
}

/// Input: a unit and what its key holds, which no delivery can use. Output: the failure that
/// says so and what to do; `forgetting` when `forget` refuses it without `--force`.
fn unusable_failure(unit: &UnitOfWork, location: &str, stored: &Seen, forgetting: bool) -> Failure {
    let (task, key) = (unit.task(), unit.key());
    let remedy = if forgetting {
        "; pass --force to delete it (deliveries fail on it until it is gone)".to_owned()
    } else {
        format!(
            "; deliveries fail on it until it is gone: `idempotask forget --force --task {task} --key {key:?}` deletes it"
        )
    };
    match stored {
        Seen::Marker {
            marker: Ok(marker), ..
        } => Failure::new(
            Exit::Error,
            "key_mismatch",
            format!(
                "the marker found for key `{key}` of task `{task}` belongs to key `{}` (a forged value or a digest collision){remedy}",
                marker.key()
            ),
        ),
        Seen::Marker {
            marker: Err(err), ..
        } => Failure::new(
            Exit::Error,
            "unreadable",
            format!(
                "task `{task}` with key `{key}`: the stored marker cannot be read: {err}{remedy}"
            ),
        ),
        Seen::Foreign { bytes } => Failure::new(
            Exit::Error,
            "unreadable",
            format!(
                "task `{task}` with key `{key}`: `{location}` holds {}, which is not idempotask's{remedy}",
                preview(bytes)
            ),
        ),
        Seen::OtherType(kind) => Failure::new(
            Exit::Error,
            "wrong_type",
            format!(
                "task `{task}` with key `{key}`: `{location}` is a {kind} key, and idempotask writes only strings: something else uses this name; rename that data, or delete it with `redis-cli DEL` once nothing needs it"
            ),
        ),
        // Only unusable values reach here.
        Seen::Missing | Seen::Lock { .. } => Failure::new(
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
        Seen::Marker {
            bytes,
            ttl,
            marker: Ok(marker),
        } if marker.key() == unit.key() => (
            render::done(&unit, marker, *ttl),
            bytes,
            marker.fencing_token(),
            false,
        ),
        Seen::Lock { ttl, .. } => return Err(locked_refusal(&unit, &location, *ttl)),
        Seen::Missing => {
            return Err(Failure::new(
                Exit::Unknown,
                "unknown",
                format!(
                    "nothing to forget: task `{task}` has no marker for key `{key}` in {}",
                    target.scope_text()
                ),
            ));
        }
        Seen::OtherType(_) => {
            return Err(unusable_failure(&unit, &location, &seen, true));
        }
        Seen::Marker { bytes, .. } | Seen::Foreign { bytes } => {
            if !force {
                return Err(unusable_failure(&unit, &location, &seen, true));
            }
            let (what, fencing_token) = match &seen {
                Seen::Marker {
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
    };
    if !yes {
        confirm(&shown)?;
    }
    let forgot = target.forget_exact(&unit, bytes).await?;
    // A variant newer than this binary is not known to have deleted anything: it answers as
    // `Changed` does.
    let deleted = match forgot {
        Forgot::Deleted => true,
        Forgot::Gone => false,
        _ => {
            return Err(Failure::new(
                Exit::Error,
                "changed",
                format!(
                    "nothing deleted: the value of {task} {key:?} changed after it was read (a delivery wrote it meanwhile); see it with `idempotask status --task {task} --key {key:?}` and forget again if you still mean to"
                ),
            ));
        }
    };
    let (scope, name) = target.scope();
    let json = json!({
        scope: name,
        "task": task,
        "key": key,
        "digest": unit.digest(),
        "forgotten": deleted,
        "forced": forced,
        "fencing_token": fencing_token,
    });
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

fn locked_refusal(unit: &UnitOfWork, location: &str, lock_ttl: Option<Duration>) -> Failure {
    let (task, key) = (unit.task(), unit.key());
    let message = match lock_ttl {
        Some(ttl) => format!(
            "refusing to forget {task} {key:?}: it is locked (a delivery is running it; the lock expires in {}); try again once it has finished",
            human(ttl)
        ),
        None => format!(
            "refusing to forget {task} {key:?}: it is locked, and the lock never expires (it has no TTL, which idempotask always sets: something else changed it); `--force` never deletes a lock: once no delivery runs it, delete it with `redis-cli DEL {location}`"
        ),
    };
    Failure::new(Exit::Locked, "locked", message)
}

/// Asks on the terminal; without one, refuses (a script must say `--yes`).
fn confirm(what: &str) -> Result<(), Failure> {
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        return Err(Failure::usage(
            "refusing to forget without confirmation: stdin is not a terminal; pass --yes to forget non-interactively",
        ));
    }
    let mut stderr = std::io::stderr();
    let _ = write!(
        stderr,
        "{what}\nForget it, so that the next delivery runs the work again? [y/N] "
    );
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
            "not confirmed; nothing was deleted",
        ))
    }
}

/// `list`: every done and locked unit of a task, and the odd keys under its pattern, with
/// counts; unknown task → exit 4.
pub(crate) async fn list(
    target: &Target,
    task: &str,
    only_locked: bool,
    only_done: bool,
) -> Result<Found, Failure> {
    Target::check_task(task)?;
    let listing = target.list(task).await?;
    let scanned = listing.servers_scanned;
    let done = listing.entries.values().filter(|e| e.done).count();
    let locked = listing.entries.values().filter(|e| e.locked).count();
    let flagged = listing
        .entries
        .values()
        .filter(|e| e.problem.is_some())
        .count();
    let shown: Vec<_> = listing
        .entries
        .values()
        .filter(|e| (!only_locked || e.locked) && (!only_done || e.done))
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
            flagged,
        },
        &shown,
    );
    let exit = Exit::Ok;
    Ok(Found { json, text, exit })
}
