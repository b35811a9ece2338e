//! [`Stored`]: a Python body's result as the core stores it, JSON text passed through as it is.

use serde::de::{Deserialize, Deserializer};
use serde::ser::{Error as _, Serialize, Serializer};
use serde_json::value::RawValue;

/// The result of a Python body, as the core records and replays it.
///
/// The JSON text Python wrote goes into the marker byte for byte, and a replay hands the stored
/// text back to Python as it is: no number goes through a float or a 64-bit integer on the way
/// (`2**100` comes back as `2**100`), and a marker a Rust worker wrote reads back in Python the
/// same way.
#[derive(Debug)]
pub(crate) enum Stored {
    /// The result's JSON text.
    Json(Box<RawValue>),
    /// The body succeeded but its value is not JSON (`json.dumps` refused it): why. Its
    /// serialisation fails with the reason, so the core records the marker as unstorable, as
    /// it does for a Rust value that JSON cannot carry, and duplicates get `CodecError`
    /// instead of running again.
    Unstorable(String),
}

impl Serialize for Stored {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Json(json) => json.serialize(serializer),
            Self::Unstorable(reason) => Err(S::Error::custom(reason)),
        }
    }
}

impl<'de> Deserialize<'de> for Stored {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Box::<RawValue>::deserialize(deserializer).map(Self::Json)
    }
}
