//! `status`: what one unit holds, and the steps it recorded.

use idempotask::operator::Held;
use serde_json::json;

use crate::exit::{Exit, Failure};
use crate::render;
use crate::steps::{self, Next};
use crate::stored::result_json;
use crate::target::Target;
use crate::time::millis;

use super::shared::{Found, unit_json, unusable_failure};

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
