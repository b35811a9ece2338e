//! A journal entry's bytes: one JSON object per finished step.
//!
//! `{"step":"charge","ok":<the step's value>}`, with `"part":"…"` after the name for a step
//! named with a key part, and `"unstorable":"<reason>"` in place of `"ok"` for a value that
//! could not be recorded. The layout is the same from Python.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::value::RawValue;

use super::name::StepName;
use crate::observe::KeyLogging;
use crate::unit::digest_of;

#[derive(Serialize)]
struct Written<'a, T> {
    step: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    part: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ok: Option<&'a T>,
    #[serde(skip_serializing_if = "Option::is_none")]
    unstorable: Option<&'a str>,
}

/// A journal entry as read back.
#[derive(Deserialize)]
pub(super) struct Read<'a> {
    #[serde(borrow)]
    step: std::borrow::Cow<'a, str>,
    #[serde(default, borrow)]
    part: Option<std::borrow::Cow<'a, str>>,
    /// Present with `null` for a value that encodes as `null` (`()`, `None`): told apart from
    /// an absent `ok` by `deserialize_with`, which only a present field reaches.
    #[serde(default, deserialize_with = "present")]
    ok: Option<&'a RawValue>,
    #[serde(default)]
    unstorable: Option<String>,
}

fn present<'de: 'a, 'a, D: Deserializer<'de>>(value: D) -> Result<Option<&'a RawValue>, D::Error> {
    <&RawValue>::deserialize(value).map(Some)
}

impl<'a> Read<'a> {
    pub(super) fn parse(bytes: &'a [u8]) -> Result<Self, String> {
        serde_json::from_slice(bytes).map_err(|err| format!("not a journal entry: {err}"))
    }

    /// Whether the entry is the one of the step `name`.
    pub(super) fn is(&self, name: &StepName) -> bool {
        self.step == name.name() && self.part.as_deref() == name.part()
    }

    /// The entry's name, as [`StepName`]'s `Display` shows one.
    pub(super) fn shown(&self, logging: KeyLogging) -> String {
        match &self.part {
            Some(part) if logging == KeyLogging::Hash => {
                format!("{}[#{}]", self.step, digest_of(part))
            }
            Some(part) => format!("{}[{part}]", self.step),
            None => self.step.to_string(),
        }
    }

    /// The recorded value; `Err` with the reason it was not recorded, or why it does not
    /// decode into `T` (the second element says which: `true` for an unstorable value).
    pub(super) fn value<T: DeserializeOwned>(&self) -> Result<T, (bool, String)> {
        if let Some(reason) = &self.unstorable {
            return Err((true, reason.clone()));
        }
        let Some(ok) = self.ok else {
            return Err((
                false,
                "the entry holds neither a value nor a reason".to_owned(),
            ));
        };
        serde_json::from_str(ok.get()).map_err(|err| (false, err.to_string()))
    }
}

/// The entry of the step `name` that returned `value`; an entry that records why the value
/// could not be stored when its JSON fails, does not read back into `T`, or is longer than
/// `max_bytes`.
pub(super) fn encode<T: Serialize + DeserializeOwned>(
    name: &StepName,
    value: &T,
    max_bytes: usize,
) -> (Vec<u8>, Result<(), String>) {
    encode_named(name.name(), name.part(), value, max_bytes)
}

/// [`encode`], for a step named by text: an operator's tool records a step's value with the
/// name it was told, not one a body gave as a literal.
pub(crate) fn encode_named<T: Serialize + DeserializeOwned>(
    step: &str,
    part: Option<&str>,
    value: &T,
    max_bytes: usize,
) -> (Vec<u8>, Result<(), String>) {
    let written = Written {
        step,
        part,
        ok: Some(value),
        unstorable: None,
    };
    let reason = match serde_json::to_vec(&written) {
        Err(err) => err.to_string(),
        Ok(bytes) if bytes.len() > max_bytes => format!(
            "its entry is {} bytes, over the task's limit of {max_bytes} (`Task::max_step_bytes`)",
            bytes.len()
        ),
        Ok(bytes) => match Read::parse(&bytes)
            .and_then(|read| read.value::<T>().map(drop).map_err(|(_, reason)| reason))
        {
            Ok(()) => return (bytes, Ok(())),
            Err(err) => format!("its JSON form does not read back into the step's type: {err}"),
        },
    };
    let unstorable = Written::<()> {
        step,
        part,
        ok: None,
        unstorable: Some(&reason),
    };
    let bytes = serde_json::to_vec(&unstorable).unwrap_or_default();
    (bytes, Err(reason))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Input: a step's value. Output: it as a rerun reads it back from its entry.
    fn replayed<T: Serialize + DeserializeOwned>(value: &T) -> Result<T, (bool, String)> {
        let (bytes, encoded) = encode(&StepName::from("charge"), value, 1024);
        assert_eq!(encoded, Ok(()), "{}", String::from_utf8_lossy(&bytes));
        Read::parse(&bytes).unwrap().value()
    }

    #[test]
    fn values_that_encode_as_null_are_recorded_and_replayed() {
        // `()` and `None` encode as `"ok":null`, which must not read as a missing value.
        assert_eq!(replayed(&()), Ok(()));
        assert_eq!(replayed(&None::<u32>), Ok(None));
        assert_eq!(replayed(&Some(7_u32)), Ok(Some(7)));
        let missing = Read::parse(br#"{"step":"charge"}"#).unwrap();
        assert!(matches!(missing.value::<()>(), Err((false, _))));
    }
}
