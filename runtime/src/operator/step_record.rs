//! [`StepRecord`]: one entry of a unit's journal of steps, as an operator is shown it.

use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;

use crate::marker::StoredResult;

/// One finished step of a unit that has not finished, decoded from an entry of its journal
/// ([`Operator::journal`](super::Operator::journal)): the step's name, its key part, and what it
/// recorded (its value as JSON, or why its value could not be stored).
///
/// A rerun of the unit's body replays these steps without running their effects again, and
/// goes on at the first step the journal lacks. The entry's layout is in `docs/protocol.md`
/// ("The journal's layout"): `{"step":"charge","ok":<value>}`, with `"part"` for a step named
/// with a key part and `"unstorable"` in place of `"ok"` for a value that could not be stored.
///
/// ```
/// use idempotask::operator::{StepRecord, StoredResult};
///
/// let charge = StepRecord::decode(br#"{"step":"charge","ok":{"id":"ch_1"}}"#)?;
/// assert_eq!(charge.label(), "charge");
/// assert!(matches!(&charge.result, StoredResult::Json(json) if json.get() == r#"{"id":"ch_1"}"#));
///
/// let mail = StepRecord::decode(br#"{"step":"mail","part":"ada@example.com","unstorable":"too long"}"#)?;
/// assert_eq!(mail.label(), "mail[ada@example.com]");
/// assert!(matches!(&mail.result, StoredResult::Unstorable(why) if why == "too long"));
///
/// // A step whose value is `()` or `None` recorded `null`: a value like any other.
/// let ledger = StepRecord::decode(br#"{"step":"ledger","ok":null}"#)?;
/// assert!(matches!(&ledger.result, StoredResult::Json(json) if json.get() == "null"));
///
/// assert!(StepRecord::decode(b"not json").is_err());
/// assert!(StepRecord::decode(br#"{"step":"charge"}"#).is_err(), "neither a value nor a reason");
/// # Ok::<(), idempotask::operator::StepRecordError>(())
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct StepRecord {
    /// The step's name, the literal the body gave it (`"charge"`).
    pub name: String,
    /// The key part, for a step named with one (`("mail", recipient)`).
    pub part: Option<String>,
    /// What the step recorded: its value as JSON, or why the value could not be stored (the
    /// step ran once, and a rerun gets an error for it instead of running it again).
    pub result: StoredResult,
}

/// An entry as stored. `ok` is present with `null` for a step whose value is `()` or `None`,
/// so presence is told apart from `null` by `deserialize_with`, which only a present field
/// reaches.
#[derive(Deserialize)]
struct Stored {
    step: String,
    #[serde(default)]
    part: Option<String>,
    #[serde(default, deserialize_with = "present")]
    ok: Option<Box<RawValue>>,
    #[serde(default)]
    unstorable: Option<String>,
}

fn present<'de, D: Deserializer<'de>>(value: D) -> Result<Option<Box<RawValue>>, D::Error> {
    Box::<RawValue>::deserialize(value).map(Some)
}

impl StepRecord {
    /// Decodes one entry of a unit's journal.
    ///
    /// # Errors
    /// [`StepRecordError`] when the bytes are not a journal entry: not JSON, no step name, or
    /// neither a value nor the reason it could not be stored.
    pub fn decode(bytes: &[u8]) -> Result<Self, StepRecordError> {
        let stored: Stored = serde_json::from_slice(bytes)
            .map_err(|err| StepRecordError(format!("not a journal entry: {err}")))?;
        // A reason wins over a value, as a rerun reads the entry.
        let result = match (stored.unstorable, stored.ok) {
            (Some(reason), _) => StoredResult::Unstorable(reason),
            (None, Some(json)) => StoredResult::Json(json),
            (None, None) => {
                return Err(StepRecordError(format!(
                    "the entry of step `{}` holds neither a value nor a reason",
                    stored.step
                )));
            }
        };
        Ok(Self {
            name: stored.step,
            part: stored.part,
            result,
        })
    }

    /// The step's name as the runtime's errors and logs show it: `charge`, or `mail[<part>]`
    /// for a step named with a key part.
    pub fn label(&self) -> String {
        match &self.part {
            Some(part) => format!("{}[{part}]", self.name),
            None => self.name.clone(),
        }
    }
}

/// Bytes that are not an entry of a journal of steps ([`StepRecord::decode`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct StepRecordError(String);
