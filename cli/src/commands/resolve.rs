//! `resolve`: settling a unit in doubt, only while it holds the lock that was shown.

use std::time::Duration;

use idempotask::operator::{Held, Marker, Resolution, Resolved};
use idempotask::store::UnitOfWork;
use serde_json::json;
use serde_json::value::RawValue;

use crate::exit::{Exit, Failure};
use crate::render;
use crate::target::Target;
use crate::time::{human, millis};

use super::shared::{Found, changed, confirm, locked_refusal, unit_json, unusable_failure};

/// What `resolve` is asked to do with a unit in doubt.
pub(crate) enum Settle {
    /// The effect happened: record this result, kept for `result_ttl`.
    Record {
        result: Box<RawValue>,
        result_ttl: Duration,
    },
    /// The effect did not happen: free the unit; with `discard_steps`, delete its journal of
    /// steps too, so that the next delivery runs the whole body as new.
    Free { discard_steps: bool },
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
    let mut recorded_steps = 0;
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
        Settle::Free { discard_steps } => {
            if let Some(journal) = target.journal(&unit).await? {
                recorded_steps = journal.len();
            }
            free(discard_steps, recorded_steps)
        }
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
        (Resolved::Freed, None) if resolution.discards_steps() => (
            "freed_discarding_steps",
            format!(
                "freed {task} {key:?} and deleted its journal of steps; the next delivery runs the whole body as new"
            ),
        ),
        (Resolved::Freed, None) if recorded_steps > 0 => (
            "freed",
            format!(
                "freed {task} {key:?}, keeping its journal: the next delivery replays its {recorded_steps} recorded step(s) and runs the next one again (a unit held because its body changed its step order is held again: free it with --discard-steps)"
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

/// Input: whether `--discard-steps` was given, and how many steps the unit's journal holds.
/// Output: the resolution that frees it, the question to confirm, and no result to record.
fn free(
    discard_steps: bool,
    recorded: usize,
) -> (Resolution, String, Option<(Box<RawValue>, Duration)>) {
    let (resolution, question) = match (discard_steps, recorded) {
        (true, _) => (
            Resolution::FreeDiscardingSteps,
            format!(
                "Free it and delete its journal of {recorded} step(s), so that the next delivery runs the whole body as new (the recorded steps' effects run again)?"
            ),
        ),
        (false, 0) => (
            Resolution::Free,
            "Free it, so that the next delivery runs the work as new?".to_owned(),
        ),
        (false, _) => (
            Resolution::Free,
            format!(
                "Free it, keeping its journal of {recorded} step(s), so that the next delivery replays them and runs the next step again? (A unit held because its body changed its step order stays held after this: free it with --discard-steps instead.)"
            ),
        ),
    };
    (resolution, question, None)
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
