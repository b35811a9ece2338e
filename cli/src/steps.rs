//! The steps a unit that has not finished recorded, as `status` shows them: each decoded with
//! the core's [`StepRecord`], and where the next one stands.

use std::fmt::Write;

use idempotask::operator::{StepRecord, StoredResult};
use idempotask::store::{Journal, UnitOfWork};
use serde_json::{Value, json};

use crate::exit::Failure;
use crate::stored::preview;
use crate::target::Target;

/// The longest a recorded value is shown in text, in characters; `--json` has it whole.
const SHOWN_CHARS: usize = 60;

/// Where a unit whose steps are shown stands, which says what its next step is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Next {
    /// A delivery holds the lock: it runs the next step now.
    Running,
    /// A delivery's lock ran out: the next step may have started, without its record.
    InDoubt,
    /// No delivery holds it (one failed after its steps, or gave up): the next delivery
    /// replays them.
    Waiting,
}

/// Input: a unit that has not finished, where it stands, and its JSON document so far.
/// Output: the lines its text gains for its steps; the document gains `steps` and
/// `next_step`.
pub(crate) async fn add(
    target: &Target,
    unit: &UnitOfWork,
    next: Next,
    document: &mut Value,
) -> Result<String, Failure> {
    let journal = target.journal(unit).await?;
    let (steps, next_step) = json(journal.as_ref(), next);
    document["steps"] = steps;
    document["next_step"] = next_step;
    Ok(text(journal.as_ref(), next))
}

/// The journal as the JSON document shows it: one object per entry, in the journal's layout
/// with its position, and where the next step stands; `null` where the store keeps none.
pub(crate) fn json(journal: Option<&Journal>, next: Next) -> (Value, Value) {
    let Some(journal) = journal else {
        return (Value::Null, Value::Null);
    };
    let steps = journal
        .entries()
        .iter()
        .enumerate()
        .map(|(position, entry)| match StepRecord::decode(entry) {
            Ok(record) => {
                let mut step = json!({
                    "position": position,
                    "step": record.name,
                    "part": record.part,
                });
                match &record.result {
                    StoredResult::Json(raw) => step["ok"] = value_of(raw.get()),
                    StoredResult::Unstorable(reason) => step["unstorable"] = json!(reason),
                    // A kind of record newer than this binary.
                    _ => step["unreadable"] = json!("a kind of record this version cannot show"),
                }
                step
            }
            Err(err) => json!({
                "position": position,
                "unreadable": err.to_string(),
                "stored": String::from_utf8_lossy(entry),
            }),
        })
        .collect();
    let next = if journal.is_empty() {
        Value::Null
    } else {
        json!({ "position": journal.len(), "state": match next {
            Next::Running => "running",
            Next::InDoubt => "in_doubt",
            Next::Waiting => "waiting",
        }})
    };
    (Value::Array(steps), next)
}

/// A recorded value as JSON, or as its text when it is not JSON.
fn value_of(raw: &str) -> Value {
    serde_json::from_str(raw).unwrap_or_else(|_| Value::String(raw.to_owned()))
}

/// The lines `status` adds for the steps in `journal`; nothing for a unit without any.
pub(crate) fn text(journal: Option<&Journal>, next: Next) -> String {
    let Some(journal) = journal.filter(|journal| !journal.is_empty()) else {
        return String::new();
    };
    let count = journal.len();
    let recorded = if count == 1 {
        "1 recorded".to_owned()
    } else {
        format!("{count} recorded")
    };
    let about = match next {
        Next::Running => {
            format!("step {count} is running now (unless the body is past its last step)")
        }
        Next::InDoubt => format!(
            "step {count} is the one in doubt: its effect may have happened without its record (unless the body was past its last step)"
        ),
        Next::Waiting => format!("the next delivery replays them and runs from step {count}"),
    };
    let rows: Vec<(String, String)> = journal
        .entries()
        .iter()
        .map(|entry| match StepRecord::decode(entry) {
            Ok(record) => (label(&record), shown(&record.result)),
            Err(err) => (
                "?".to_owned(),
                format!("unreadable: {err}; stored {}", preview(entry)),
            ),
        })
        .collect();
    let width = rows.iter().map(|(label, _)| label.chars().count()).max();
    let mut text = format!("\n  steps          {recorded}; {about}");
    for (position, (label, state)) in rows.iter().enumerate() {
        let _ = write!(
            text,
            "\n    {position:>3}  {label:<width$}  {state}",
            width = width.unwrap_or(0)
        );
    }
    text
}

/// `charge`, or `mail[ada@example.com]`.
fn label(record: &StepRecord) -> String {
    printable(&record.label())
}

/// `text` with its control characters escaped, so that one step stays on one line.
fn printable(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// What a step recorded, cut after [`SHOWN_CHARS`] characters.
fn shown(result: &StoredResult) -> String {
    match result {
        StoredResult::Json(raw) => {
            let text = printable(raw.get());
            let mut shown: String = text.chars().take(SHOWN_CHARS).collect();
            if text.chars().nth(SHOWN_CHARS).is_some() {
                shown.push('…');
            }
            shown
        }
        StoredResult::Unstorable(reason) => format!("unstorable: {}", printable(reason)),
        _ => "a kind of record this version cannot show".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn journal(entries: &[&str]) -> Journal {
        Journal::from_entries(entries.iter().map(|e| e.as_bytes().to_vec()).collect())
    }

    #[test]
    fn each_step_shows_its_position_name_and_state() {
        let long = format!(r#"{{"step":"ledger","ok":"{}"}}"#, "x".repeat(100));
        let journal = journal(&[
            r#"{"step":"charge","ok":{"id":"ch_1"}}"#,
            r#"{"step":"mail","part":"ada@example.com","unstorable":"too long"}"#,
            &long,
            "garbage",
        ]);
        let text = text(Some(&journal), Next::InDoubt);
        assert!(
            text.starts_with("\n  steps          4 recorded; step 4 is the one in doubt"),
            "{text}"
        );
        assert!(
            text.contains("\n      0  charge                 {\"id\":\"ch_1\"}"),
            "{text}"
        );
        assert!(
            text.contains("\n      1  mail[ada@example.com]  unstorable: too long"),
            "{text}"
        );
        assert!(
            text.contains(&format!("\"{}…", "x".repeat(SHOWN_CHARS - 1))),
            "{text}"
        );
        assert!(
            text.contains("\n      3  ?  ") && text.contains("unreadable: not a journal entry"),
            "{text}"
        );
        assert_eq!(super::text(Some(&Journal::default()), Next::Running), "");
        assert_eq!(super::text(None, Next::Running), "");
    }

    #[test]
    fn the_json_has_each_entry_whole_with_its_position_and_the_next_step() {
        let journal = journal(&[
            r#"{"step":"charge","ok":null}"#,
            r#"{"step":"mail","part":"ada","unstorable":"too long"}"#,
        ]);
        let (steps, next) = json(Some(&journal), Next::Running);
        assert_eq!(
            steps,
            json!([
                {"position": 0, "step": "charge", "part": null, "ok": null},
                {"position": 1, "step": "mail", "part": "ada", "unstorable": "too long"},
            ])
        );
        assert_eq!(next, json!({"position": 2, "state": "running"}));
        assert_eq!(
            json(Some(&Journal::default()), Next::Waiting),
            (json!([]), Value::Null)
        );
        assert_eq!(json(None, Next::Waiting), (Value::Null, Value::Null));
    }
}
