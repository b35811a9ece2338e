//! What the commands share: what one found, the JSON of a unit, the refusals several of them
//! make, and the confirmation on the terminal.

use std::io::{BufRead, IsTerminal, Write};
use std::time::Duration;

use idempotask::operator::Held;
use idempotask::store::UnitOfWork;
use serde_json::{Value, json};

use crate::exit::{Exit, Failure};
use crate::stored::preview;
use crate::target::Target;
use crate::time::human;

/// What a command found: the JSON document, the text for people, and the exit code.
pub(crate) struct Found {
    pub(crate) json: Value,
    pub(crate) text: String,
    pub(crate) exit: Exit,
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
pub(super) fn unusable_failure(
    unit: &UnitOfWork,
    location: &str,
    stored: &Held,
    forgetting: bool,
) -> Failure {
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

/// Input: a locked unit that `verb` (`forget`, `resolve`) was asked to change. Output: the
/// refusal, with when to try again.
pub(super) fn locked_refusal(
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
