//! `forget`: deleting a done unit's marker, only as it was shown.

use std::time::Duration;

use idempotask::operator::{Forgot, Held};
use idempotask::store::UnitOfWork;
use serde_json::json;

use crate::exit::{Exit, Failure};
use crate::render;
use crate::stored::preview;
use crate::target::Target;
use crate::time::human;

use super::shared::{Found, changed, confirm, locked_refusal, unit_json, unusable_failure};

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
