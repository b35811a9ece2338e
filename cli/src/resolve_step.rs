//! `resolve --step`: settles a unit held at its step in doubt by recording that step's value,
//! so that the next delivery replays it and goes on with the step after it.

use std::time::Duration;

use idempotask::operator::{Resolution, Resolved, step_entry};
use serde_json::json;
use serde_json::value::RawValue;

use crate::commands::{Found, InDoubt, changed, confirm, read_in_doubt, unit_json};
use crate::exit::{Exit, Failure};
use crate::steps::{self, Next};
use crate::target::Target;
use crate::time::{human, millis};

/// The step an operator names, and the value its effect had.
pub(crate) struct HeldStep {
    /// The step's name, as the body gives it (`"charge"`).
    pub(crate) name: String,
    /// The key part, for a step named with one.
    pub(crate) part: Option<String>,
    /// The step's value as JSON, what its type reads back.
    pub(crate) value: Box<RawValue>,
    /// How long the journal is kept when the unit never gets its result.
    pub(crate) kept_for: Duration,
}

impl HeldStep {
    /// The step as `status` lists it: `mail[ada@example.com]`.
    fn label(&self) -> String {
        match &self.part {
            Some(part) => format!("{}[{part}]", self.name),
            None => self.name.clone(),
        }
    }
}

/// `resolve --step-result`: for a unit in doubt (refused otherwise, with the exit code of its
/// state), shows its journal and the entry to append, and after a confirmation records the step
/// at the journal's end and frees the unit, only while it still holds the lock that was read
/// and shown, still run out. A store that records no steps is refused before anything is
/// written.
pub(crate) async fn resolve_step(
    target: &Target,
    task: &str,
    key: &str,
    step: HeldStep,
    yes: bool,
) -> Result<Found, Failure> {
    let InDoubt {
        unit,
        bytes,
        fencing_token,
        mut shown,
    } = read_in_doubt(target, task, key).await?;
    let Some(journal) = target.journal(&unit).await? else {
        return Err(Failure::usage(format!(
            "{} keeps no journal of steps: resolve {task} {key:?} with --result or --free",
            target.scope_text()
        )));
    };
    let label = step.label();
    let position = journal.len();
    shown.push_str(&steps::text(Some(&journal), Next::InDoubt));
    let question = format!(
        "Record step {label} = {} at position {position} (kept for {}) and free the unit, so that the next delivery replays {} step(s) and goes on after {label}?",
        step.value.get(),
        human(step.kept_for),
        position + 1,
    );
    if !yes {
        confirm(&shown, &question, "resolve", "written")?;
    }
    let entry = step_entry(&step.name, step.part.as_deref(), &step.value);
    let resolution = Resolution::record_step(entry, step.kept_for);
    let text = match target.resolve_exact(&unit, &bytes, &resolution).await? {
        Resolved::StepRecorded => format!(
            "recorded step {label} = {} of {task} {key:?} at position {position} and freed it; the next delivery replays it and goes on after it",
            step.value.get()
        ),
        Resolved::Gone => {
            return Err(Failure::new(
                Exit::Unknown,
                "gone",
                format!(
                    "nothing recorded: {task} {key:?} became free after it was read (its doubt memory ran out, someone freed it, or its holder came back and released it); the next delivery runs step {label} again"
                ),
            ));
        }
        // `Changed`, and a variant newer than this binary, which is not known to have
        // written anything.
        _ => {
            return Err(changed(
                &unit,
                "written:",
                "a delivery took it over, its holder came back and recorded a step, finished or renewed it, or someone resolved it",
                "",
            ));
        }
    };
    let mut json = unit_json(target, &unit);
    json["resolved"] = json!("step_recorded");
    json["fencing_token"] = json!(fencing_token);
    json["step"] = json!({
        "position": position,
        "step": step.name,
        "part": step.part,
        "ok": step.value,
    });
    json["journal_ttl_ms"] = json!(millis(step.kept_for));
    Ok(Found {
        json,
        text,
        exit: Exit::Ok,
    })
}
