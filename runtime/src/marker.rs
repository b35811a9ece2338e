//! The completion marker: the versioned JSON envelope stored once a unit of work succeeded.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::fingerprint::Fingerprint;

/// The envelope version this build writes and reads.
const VERSION: u8 = 1;

/// What a completed unit of work left behind: its result and how it got there.
///
/// Stored as a small JSON object (`{"v":1,"key":…,"fence":…,"at":…,"ok":…}`) so that an operator
/// can read it with `redis-cli GET`. Duplicates get [`result`](Self::result) back instead of
/// running the task again.
///
/// ```
/// use idempotask::{Marker, StoredResult};
/// let marker = Marker::decode(br#"{"v":1,"key":"order-42","fence":7,"at":1700000000000,"ok":{"id":"ch_1"}}"#)?;
/// assert_eq!(marker.key(), "order-42");
/// assert_eq!(marker.fencing_token(), 7);
/// assert!(matches!(marker.result(), StoredResult::Json(json) if json.get() == r#"{"id":"ch_1"}"#));
/// # Ok::<(), idempotask::MarkerError>(())
/// ```
#[derive(Debug, Clone)]
pub struct Marker {
    key: String,
    fencing_token: u64,
    completed_at: SystemTime,
    fingerprint: Option<String>,
    result: StoredResult,
}

/// The result kept in a [`Marker`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum StoredResult {
    /// The task's `Ok` value as JSON.
    Json(Box<RawValue>),
    /// The task succeeded but its value could not be encoded; this is why.
    ///
    /// The marker is written anyway so that a duplicate gets a clear error instead of running
    /// the side effect a second time.
    Unstorable(String),
}

#[derive(Serialize, Deserialize)]
struct Envelope<'a> {
    v: u8,
    #[serde(borrow)]
    key: std::borrow::Cow<'a, str>,
    fence: u64,
    at: u64,
    #[serde(default, skip_serializing_if = "Option::is_none", borrow)]
    fp: Option<std::borrow::Cow<'a, str>>,
    // `Option` alone would read a stored `null` (the result of a `()` task) as "no result".
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        borrow,
        deserialize_with = "present"
    )]
    ok: Option<&'a RawValue>,
    #[serde(default, skip_serializing_if = "Option::is_none", borrow)]
    unstorable: Option<std::borrow::Cow<'a, str>>,
}

fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(d).map(Some)
}

impl Marker {
    /// Encodes the marker for a successful execution whose value serialised to `result`
    /// (or failed to, with the reason).
    pub(crate) fn encode(
        key: &str,
        fencing_token: u64,
        fingerprint: Option<&Fingerprint>,
        result: Result<&RawValue, &str>,
    ) -> Vec<u8> {
        let at = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis();
        let envelope = Envelope {
            v: VERSION,
            key: key.into(),
            fence: fencing_token,
            at: u64::try_from(at).unwrap_or(u64::MAX),
            fp: fingerprint.map(|fp| fp.as_str().into()),
            ok: result.ok(),
            unstorable: result.err().map(Into::into),
        };
        // An envelope of strings, integers and already-valid JSON always serialises.
        serde_json::to_vec(&envelope).unwrap_or_default()
    }

    /// Reads a stored marker.
    ///
    /// # Errors
    /// [`MarkerError`] when the bytes are not a marker of a version this build understands. The
    /// bytes come from the store, so nothing here panics on them.
    pub fn decode(bytes: &[u8]) -> Result<Self, MarkerError> {
        let envelope: Envelope<'_> = serde_json::from_slice(bytes)
            .map_err(|err| MarkerError(format!("not a completion marker: {err}")))?;
        if envelope.v != VERSION {
            return Err(MarkerError(format!(
                "marker version {} is not {VERSION}; it was written by another idempotask release",
                envelope.v
            )));
        }
        let result = match (envelope.ok, envelope.unstorable) {
            (Some(json), None) => StoredResult::Json(json.to_owned()),
            (None, Some(reason)) => StoredResult::Unstorable(reason.into_owned()),
            _ => {
                return Err(MarkerError(
                    "a marker must hold exactly one of `ok` and `unstorable`".to_owned(),
                ));
            }
        };
        Ok(Self {
            key: envelope.key.into_owned(),
            fencing_token: envelope.fence,
            completed_at: UNIX_EPOCH + Duration::from_millis(envelope.at),
            fingerprint: envelope.fp.map(std::borrow::Cow::into_owned),
            result,
        })
    }

    /// The caller key the work was done for.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The fencing token of the execution that stored this marker.
    pub fn fencing_token(&self) -> u64 {
        self.fencing_token
    }

    /// When the execution finished (the worker's clock).
    pub fn completed_at(&self) -> SystemTime {
        self.completed_at
    }

    /// The fingerprint of the arguments, when the task declared one.
    pub fn fingerprint(&self) -> Option<&str> {
        self.fingerprint.as_deref()
    }

    /// The stored result.
    pub fn result(&self) -> &StoredResult {
        &self.result
    }
}

/// Stored bytes that are not a completion marker this build can read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct MarkerError(String);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_a_result_and_its_metadata() {
        let json = RawValue::from_string(r#"{"id":"ch_1","cents":1200}"#.to_owned()).unwrap();
        let fp = Fingerprint::of(&(1200_u64,)).unwrap();
        let bytes = Marker::encode("order:{42}\n", 17, Some(&fp), Ok(&json));
        let marker = Marker::decode(&bytes).unwrap();
        assert_eq!(marker.key(), "order:{42}\n");
        assert_eq!(marker.fencing_token(), 17);
        assert_eq!(marker.fingerprint(), Some(fp.as_str()));
        assert!(marker.completed_at() > UNIX_EPOCH + Duration::from_secs(1_600_000_000));
        match marker.result() {
            StoredResult::Json(stored) => assert_eq!(stored.get(), json.get()),
            StoredResult::Unstorable(why) => panic!("unexpected: {why}"),
        }
    }

    #[test]
    fn a_null_result_is_a_result() {
        let null = RawValue::from_string("null".to_owned()).unwrap();
        let marker = Marker::decode(&Marker::encode("k", 1, None, Ok(&null))).unwrap();
        assert!(matches!(marker.result(), StoredResult::Json(json) if json.get() == "null"));
    }

    #[test]
    fn keeps_the_reason_a_result_was_not_stored() {
        let bytes = Marker::encode("k", 1, None, Err("map key must be a string"));
        let marker = Marker::decode(&bytes).unwrap();
        assert!(
            matches!(marker.result(), StoredResult::Unstorable(why) if why == "map key must be a string")
        );
    }

    #[test]
    fn unit_result_marker_is_small() {
        let null = RawValue::from_string("null".to_owned()).unwrap();
        let bytes = Marker::encode("order-42", 1_764_460_000_000, None, Ok(&null));
        assert!(bytes.len() <= 80, "{}", String::from_utf8_lossy(&bytes));
    }

    #[test]
    fn rejects_foreign_and_future_bytes_without_panicking() {
        for bad in [
            &b""[..],
            b"\xff\xfe",
            b"OK",
            b"{}",
            br#"{"v":2,"key":"k","fence":1,"at":1,"ok":null}"#,
            br#"{"v":1,"key":"k","fence":1,"at":1}"#,
            br#"{"v":1,"key":"k","fence":-1,"at":1,"ok":1}"#,
        ] {
            assert!(Marker::decode(bad).is_err(), "{bad:?}");
        }
    }
}
