//! The completion marker: the compact record stored once a unit of work succeeded.

use serde_json::value::RawValue;

use crate::fingerprint::Fingerprint;

/// The first byte of every marker: it tells a marker from a lock in a store that keeps both
/// under one key.
pub(crate) const TAG: u8 = b'D';

/// What a completed unit of work left behind: its result and the key it was done for.
///
/// Stored as one line of text that an operator can read with `redis-cli GET`:
///
/// ```text
/// D<key length>[,f<fencing token>][,p<fingerprint>][,u]|<caller key>|<result>
/// ```
///
/// `<result>` is the task's `Ok` value as JSON, or with `,u` the reason it could not be
/// encoded. The key's length comes first, so a key that contains `|` reads back unchanged. A
/// `()` result for a 29-character key is 38 bytes. Duplicates get [`result`](Self::result)
/// back instead of running the task again.
///
/// ```
/// use idempotask::ops::{Marker, StoredResult};
/// let marker = Marker::decode(br#"D8,f7|order-42|{"id":"ch_1"}"#)?;
/// assert_eq!(marker.key(), "order-42");
/// assert_eq!(marker.fencing_token(), Some(7));
/// assert!(matches!(marker.result(), StoredResult::Json(json) if json.get() == r#"{"id":"ch_1"}"#));
/// # Ok::<(), idempotask::ops::MarkerError>(())
/// ```
#[derive(Debug, Clone)]
pub struct Marker {
    key: String,
    fencing_token: Option<u64>,
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

impl Marker {
    /// Encodes the marker for a successful execution whose value serialised to `result`
    /// (or failed to, with the reason).
    pub(crate) fn encode(
        key: &str,
        fencing_token: Option<u64>,
        fingerprint: Option<&Fingerprint>,
        result: Result<&RawValue, &str>,
    ) -> Vec<u8> {
        let body = match result {
            Ok(json) => json.get(),
            Err(reason) => reason,
        };
        let fingerprint = fingerprint.map(Fingerprint::as_str);
        let mut out =
            Vec::with_capacity(key.len() + body.len() + fingerprint.map_or(0, str::len) + 32);
        out.push(TAG);
        out.extend_from_slice(key.len().to_string().as_bytes());
        if let Some(fence) = fencing_token {
            out.extend_from_slice(b",f");
            out.extend_from_slice(fence.to_string().as_bytes());
        }
        if let Some(fingerprint) = fingerprint {
            out.extend_from_slice(b",p");
            out.extend_from_slice(fingerprint.as_bytes());
        }
        if result.is_err() {
            out.extend_from_slice(b",u");
        }
        out.push(b'|');
        out.extend_from_slice(key.as_bytes());
        out.push(b'|');
        out.extend_from_slice(body.as_bytes());
        out
    }

    /// Reads a stored marker.
    ///
    /// # Errors
    /// [`MarkerError`] when the bytes are not a marker this build understands. The bytes come
    /// from the store, so nothing here panics on them.
    pub fn decode(bytes: &[u8]) -> Result<Self, MarkerError> {
        let invalid = |why: &str| MarkerError(format!("not a completion marker: {why}"));
        let rest = bytes
            .strip_prefix(&[TAG])
            .ok_or_else(|| invalid("it does not start with `D`"))?;
        let header_end = rest
            .iter()
            .position(|&b| b == b'|')
            .ok_or_else(|| invalid("no `|` after the header"))?;
        let header = std::str::from_utf8(&rest[..header_end])
            .map_err(|_| invalid("the header is not text"))?;
        let mut fields = header.split(',');
        let key_len: usize = fields
            .next()
            .and_then(|len| len.parse().ok())
            .ok_or_else(|| invalid("the header does not start with the key's length"))?;
        let (mut fencing_token, mut fingerprint, mut unstorable) = (None, None, false);
        for field in fields {
            match field.split_at_checked(1) {
                Some(("f", fence)) if fencing_token.is_none() => {
                    fencing_token = Some(
                        fence
                            .parse()
                            .map_err(|_| invalid("the fencing token is not a number"))?,
                    );
                }
                Some(("p", hex)) if fingerprint.is_none() && is_hex(hex) => {
                    fingerprint = Some(hex.to_owned());
                }
                Some(("u", "")) if !unstorable => unstorable = true,
                _ => return Err(invalid(&format!("unknown header field `{field}`"))),
            }
        }
        let after_header = &rest[header_end + 1..];
        let (key, after_key) = after_header
            .split_at_checked(key_len)
            .ok_or_else(|| invalid("shorter than its key length says"))?;
        let key = std::str::from_utf8(key).map_err(|_| invalid("the key is not UTF-8"))?;
        let body = after_key
            .strip_prefix(b"|")
            .ok_or_else(|| invalid("no `|` after the key"))?;
        let body = std::str::from_utf8(body).map_err(|_| invalid("the result is not UTF-8"))?;
        let result = if unstorable {
            StoredResult::Unstorable(body.to_owned())
        } else {
            StoredResult::Json(
                RawValue::from_string(body.to_owned())
                    .map_err(|err| invalid(&format!("the result is not JSON: {err}")))?,
            )
        };
        Ok(Self {
            key: key.to_owned(),
            fencing_token,
            fingerprint,
            result,
        })
    }

    /// The caller key the work was done for.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The fencing token of the execution that stored this marker, if its task uses fencing.
    pub fn fencing_token(&self) -> Option<u64> {
        self.fencing_token
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

fn is_hex(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Stored bytes that are not a completion marker this build can read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct MarkerError(String);

#[cfg(test)]
mod tests {
    use super::*;

    fn null() -> Box<RawValue> {
        RawValue::from_string("null".to_owned()).unwrap()
    }

    #[test]
    fn round_trips_a_result_and_its_metadata() {
        let json = RawValue::from_string(r#"{"id":"ch_1","cents":1200}"#.to_owned()).unwrap();
        let fp = Fingerprint::of(&(1200_u64,)).unwrap();
        // A key with the separator and a newline in it reads back unchanged.
        let bytes = Marker::encode("order:|{42}\n", Some(17), Some(&fp), Ok(&json));
        let marker = Marker::decode(&bytes).unwrap();
        assert_eq!(marker.key(), "order:|{42}\n");
        assert_eq!(marker.fencing_token(), Some(17));
        assert_eq!(marker.fingerprint(), Some(fp.as_str()));
        match marker.result() {
            StoredResult::Json(stored) => assert_eq!(stored.get(), json.get()),
            StoredResult::Unstorable(why) => panic!("unexpected: {why}"),
        }
    }

    #[test]
    fn a_null_result_is_a_result() {
        let marker = Marker::decode(&Marker::encode("k", None, None, Ok(&null()))).unwrap();
        assert!(matches!(marker.result(), StoredResult::Json(json) if json.get() == "null"));
        assert_eq!(marker.fencing_token(), None);
    }

    #[test]
    fn keeps_the_reason_a_result_was_not_stored() {
        let bytes = Marker::encode("k", Some(1), None, Err("map key must be a string"));
        let marker = Marker::decode(&bytes).unwrap();
        assert!(
            matches!(marker.result(), StoredResult::Unstorable(why) if why == "map key must be a string")
        );
    }

    #[test]
    fn unit_result_marker_for_a_29_character_key_is_38_bytes() {
        let key = "order-charge-2026-11-30-00042";
        assert_eq!(key.len(), 29);
        let bytes = Marker::encode(key, None, None, Ok(&null()));
        assert_eq!(bytes, format!("D29|{key}|null").as_bytes());
    }

    #[test]
    fn rejects_foreign_and_damaged_bytes_without_panicking() {
        for bad in [
            &b""[..],
            b"\xff\xfe",
            b"OK",
            b"D",
            b"D|k|1",
            b"Dx|k|1",
            b"D5|k|1",
            b"D1|k1",
            b"D1|\xff|1",
            b"D1|k|",
            b"D1|k|{",
            b"D1,fx|k|1",
            b"D1,f-1|k|1",
            b"D1,q|k|1",
            b"D1,f1,f2|k|1",
            b"D1,pzz|k|1",
            b"Labcdef",
            b"T123",
            br#"{"v":1,"key":"k","fence":1,"at":1,"ok":null}"#,
        ] {
            assert!(
                Marker::decode(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
