//! The completion marker: the compact record stored once a unit of work succeeded.

use std::io::Write as _;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::value::RawValue;

use crate::fingerprint::Fingerprint;
use crate::unit::{LockToken, UnitOfWork};

/// The first byte of every marker: it tells a marker from a lock in a store that keeps both
/// under one key.
pub(crate) const TAG: u8 = b'D';

/// What a completed unit of work left behind: its result and the key it was done for.
///
/// Stored as one line of text that an operator can read with `redis-cli GET`:
///
/// ```text
/// D<key length>,d<delivery>[,f<fencing token>][,p<fingerprint>][,u][,l]|<caller key>|<result>
/// ```
///
/// `<result>` is the task's `Ok` value as JSON, or with `,u` the reason it could not be
/// encoded. The key's length comes first, so a key that contains `|` reads back unchanged.
/// `<delivery>` is 24 bits of the lock token of the delivery that ran the body, in 4 base64url
/// characters:
/// two executions of one unit (a lock that expired while its holder ran) never write the same
/// bytes, even when their results are equal, so a store can tell a repeated `finish` of the
/// same delivery from another delivery's marker. `,l` says the marker was written after its
/// delivery's lock had expired (stores that keep it add it). A `()` result for a 29-character
/// key is 44 bytes, the most Redis keeps inside the key's own allocation. Duplicates get
/// [`result`](Self::result) back instead of running the task again.
///
/// ```
/// use idempotask::operator::{Marker, StoredResult};
/// let marker = Marker::decode(br#"D8,dH-3x,f7|order-42|{"id":"ch_1"}"#)?;
/// assert_eq!(marker.key(), "order-42");
/// assert_eq!(marker.delivery(), Some("H-3x"));
/// assert_eq!(marker.fencing_token(), Some(7));
/// assert!(matches!(marker.result(), StoredResult::Json(json) if json.get() == r#"{"id":"ch_1"}"#));
/// # Ok::<(), idempotask::operator::MarkerError>(())
/// ```
#[derive(Debug, Clone)]
pub struct Marker {
    key: String,
    delivery: Option<String>,
    lock_lost: bool,
    fencing_token: Option<u64>,
    fingerprint: Option<String>,
    result: StoredResult,
}

/// The result kept in a [`Marker`], or by one step of a unit
/// ([`StepRecord`](crate::operator::StepRecord)).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum StoredResult {
    /// The task's (or the step's) `Ok` value as JSON.
    Json(Box<RawValue>),
    /// The task (or the step) succeeded but its value could not be encoded; this is why.
    ///
    /// It is recorded anyway so that a duplicate (or a rerun) gets a clear error instead of
    /// running the side effect a second time.
    Unstorable(String),
}

impl Marker {
    /// The first byte of every stored marker: a store that keeps other values under a unit's
    /// key (a lock, a fencing counter) tells a marker by it.
    pub const TAG: u8 = TAG;

    /// Encodes the marker for a successful execution by the delivery holding `token`, whose
    /// value serialised to `result` (or failed to, with the reason).
    pub(crate) fn encode(
        key: &str,
        token: &LockToken,
        fencing_token: Option<u64>,
        fingerprint: Option<&Fingerprint>,
        result: Result<&RawValue, &str>,
    ) -> Vec<u8> {
        let body = match result {
            Ok(json) => json.get(),
            Err(reason) => reason,
        };
        let mut out = Self::header(
            key,
            token,
            fencing_token,
            fingerprint,
            result.is_err(),
            body.len(),
        );
        out.extend_from_slice(body.as_bytes());
        out
    }

    /// Encodes the marker of a successful execution whose value is `value`: its JSON is written
    /// straight after the marker's header, in the buffer that is the marker. A value that
    /// cannot be written, or whose JSON does not read back into `T` (JSON writes a `NaN` as
    /// `null`), is recorded as unstorable instead, and the reason answered beside the marker:
    /// found at the first execution, so that every duplicate gets the same clear error rather
    /// than a decoding error that reads like a changed return type.
    pub(crate) fn encode_value<T: Serialize + DeserializeOwned>(
        key: &str,
        token: &LockToken,
        fencing_token: Option<u64>,
        fingerprint: Option<&Fingerprint>,
        value: &T,
    ) -> (Vec<u8>, Result<(), String>) {
        let mut out = Self::header(
            key,
            token,
            fencing_token,
            fingerprint,
            false,
            USUAL_RESULT_LEN,
        );
        let start = out.len();
        let reason = match serde_json::to_writer(&mut out, value) {
            Err(err) => err.to_string(),
            Ok(()) => match serde_json::from_slice::<T>(&out[start..]) {
                Ok(_) => return (out, Ok(())),
                Err(err) => format!(
                    "its JSON form `{}` does not read back into the task's return type: {err}",
                    String::from_utf8_lossy(&out[start..])
                        .chars()
                        .take(80)
                        .collect::<String>()
                ),
            },
        };
        let marker = Self::encode(key, token, fencing_token, fingerprint, Err(&reason));
        (marker, Err(reason))
    }

    /// A marker's bytes up to its result, in a buffer with room for `body_len` more.
    fn header(
        key: &str,
        token: &LockToken,
        fencing_token: Option<u64>,
        fingerprint: Option<&Fingerprint>,
        unstorable: bool,
        body_len: usize,
    ) -> Vec<u8> {
        let fingerprint = fingerprint.map(Fingerprint::as_str);
        let mut out =
            Vec::with_capacity(key.len() + body_len + fingerprint.map_or(0, str::len) + 32);
        // Numbers are written in place: a `to_string` would allocate each.
        out.push(TAG);
        let _ = write!(out, "{}", key.len());
        out.extend_from_slice(b",d");
        out.extend_from_slice(&delivery_bytes(token));
        if let Some(fence) = fencing_token {
            let _ = write!(out, ",f{fence}");
        }
        if let Some(fingerprint) = fingerprint {
            out.extend_from_slice(b",p");
            out.extend_from_slice(fingerprint.as_bytes());
        }
        if unstorable {
            out.extend_from_slice(b",u");
        }
        out.push(b'|');
        out.extend_from_slice(key.as_bytes());
        out.push(b'|');
        out
    }

    /// The marker an operator records for `unit` when resolving it [in doubt](crate::store::Doubt)
    /// with the result its earlier delivery's side effect had: what that delivery's finish
    /// would have stored, so that every later delivery hands `result` back instead of running
    /// the work. Write it with a store's compare-and-set for units in doubt
    /// (`resolve_exact` in `idempotask_redis`), never over whatever a key holds.
    ///
    /// `result` is the task's `Ok` value as JSON: a duplicate decodes it into the task's type,
    /// and a value that does not decode fails that duplicate with [`Error::Codec`](crate::Error::Codec).
    /// `fencing_token` is the earlier delivery's ([`Doubt::fencing_token`](crate::store::Doubt::fencing_token)),
    /// so that a fenced unit's later tokens stay above it. The marker names a delivery of its
    /// own (random), so it is never taken for that earlier delivery's, and has no argument
    /// fingerprint: a task that declares one replays it with a warning.
    ///
    /// ```
    /// use idempotask::operator::{Marker, StoredResult};
    /// use idempotask::store::UnitOfWork;
    /// use serde_json::value::RawValue;
    ///
    /// let unit = UnitOfWork::new("charge", "order-42")?;
    /// let result = RawValue::from_string(r#"{"charge":"ch_1"}"#.to_owned())?;
    /// let bytes = Marker::encode_resolution(&unit, Some(1_764_460_000_123_456), &result);
    /// let marker = Marker::decode(&bytes)?;
    /// assert_eq!(marker.key(), "order-42");
    /// assert_eq!(marker.fencing_token(), Some(1_764_460_000_123_456));
    /// assert!(matches!(marker.result(), StoredResult::Json(json) if json.get() == r#"{"charge":"ch_1"}"#));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn encode_resolution(
        unit: &UnitOfWork,
        fencing_token: Option<u64>,
        result: &RawValue,
    ) -> Vec<u8> {
        Self::encode(
            unit.key(),
            &LockToken::generate(),
            fencing_token,
            None,
            Ok(result),
        )
    }

    /// Reads a stored marker.
    ///
    /// # Errors
    /// [`MarkerError`] when the bytes are not a marker this build understands. The bytes come
    /// from the store, so nothing here panics on them.
    pub fn decode(bytes: &[u8]) -> Result<Self, MarkerError> {
        let view = MarkerView::parse(bytes)?;
        let result = match view.result {
            Ok(json) => StoredResult::Json(
                RawValue::from_string(json.to_owned())
                    .map_err(|err| not_a_marker(&format!("the result is not JSON: {err}")))?,
            ),
            Err(reason) => StoredResult::Unstorable(reason.to_owned()),
        };
        Ok(Self {
            key: view.key.to_owned(),
            delivery: view.delivery.map(str::to_owned),
            lock_lost: view.lock_lost,
            fencing_token: view.fencing_token,
            fingerprint: view.fingerprint.map(str::to_owned),
            result,
        })
    }

    /// The caller key the work was done for.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The delivery that stored this marker: 24 bits of its lock token in base64url (`None`
    /// for a marker written without one).
    pub fn delivery(&self) -> Option<&str> {
        self.delivery.as_deref()
    }

    /// Whether the marker was written after its delivery's lock had expired: another delivery
    /// may have run the body too.
    pub fn written_after_lock_lost(&self) -> bool {
        self.lock_lost
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

/// A stored marker read in place, as a duplicate delivery reads it: nothing copied, and the
/// result's JSON left for the one parse that decodes it into the task's type.
#[derive(Debug, Clone, Copy)]
pub(crate) struct MarkerView<'a> {
    pub(crate) key: &'a str,
    pub(crate) delivery: Option<&'a str>,
    pub(crate) lock_lost: bool,
    pub(crate) fencing_token: Option<u64>,
    pub(crate) fingerprint: Option<&'a str>,
    /// The result's JSON text, not yet checked; or why the value could not be encoded.
    pub(crate) result: Result<&'a str, &'a str>,
}

impl<'a> MarkerView<'a> {
    /// Reads the marker's header and finds its key and result in `bytes`.
    ///
    /// # Errors
    /// [`MarkerError`] when the bytes are not a marker this build understands; the result's
    /// JSON is not checked here.
    pub(crate) fn parse(bytes: &'a [u8]) -> Result<Self, MarkerError> {
        let invalid = |why: &str| not_a_marker(why);
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
        let (mut delivery, mut lock_lost) = (None, false);
        for field in fields {
            match field.split_at_checked(1) {
                Some(("d", id)) if delivery.is_none() && is_delivery(id) => delivery = Some(id),
                Some(("l", "")) if !lock_lost => lock_lost = true,
                Some(("f", fence)) if fencing_token.is_none() => {
                    fencing_token = Some(
                        fence
                            .parse()
                            .map_err(|_| invalid("the fencing token is not a number"))?,
                    );
                }
                Some(("p", hex)) if fingerprint.is_none() && is_hex(hex) => fingerprint = Some(hex),
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
        Ok(Self {
            key,
            delivery,
            lock_lost,
            fencing_token,
            fingerprint,
            result: if unstorable { Err(body) } else { Ok(body) },
        })
    }
}

fn not_a_marker(why: &str) -> MarkerError {
    MarkerError(format!("not a completion marker: {why}"))
}

/// [`delivery_bytes`] as text, for the tests.
#[cfg(test)]
pub(crate) fn delivery_of(token: &LockToken) -> String {
    String::from_utf8_lossy(&delivery_bytes(token)).into_owned()
}

/// The delivery field of markers written by the holder of `token`: its first 24 bits in 4
/// base64url characters.
///
/// Two executions of one unit overlap only when a lock expired under its holder, and then their
/// markers differ but for a 1 in 16.7 million chance; 4 characters keep a `()` marker of a
/// 29-character key at 44 bytes, which Redis stores inside the key's allocation (one more byte
/// costs a second allocation, 16 bytes of memory per unit).
/// Room for a result in a new marker's buffer: most results are small, and a larger one grows
/// the buffer as it is written.
const USUAL_RESULT_LEN: usize = 128;

fn delivery_bytes(token: &LockToken) -> [u8; 4] {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let bits = token
        .as_str()
        .get(..6)
        .and_then(|hex| u32::from_str_radix(hex, 16).ok())
        .unwrap_or_default();
    [18, 12, 6, 0].map(|shift| ALPHABET[(bits >> shift & 0x3f) as usize])
}

fn is_delivery(text: &str) -> bool {
    !text.is_empty()
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// `marker` as a store keeps it when it writes it after the delivery's lock had expired: `,l`
/// added to its header, so that a repeated [`finish`](crate::store::Store::finish) (a re-send
/// after a lost reply) can still answer that the lock was lost. `None` for bytes that are not
/// a marker.
///
/// ```
/// use idempotask::store::lock_lost_marker;
/// assert_eq!(lock_lost_marker(b"D1|k|{}").as_deref(), Some(&b"D1,l|k|{}"[..]));
/// assert_eq!(lock_lost_marker(b"not a marker"), None);
/// ```
pub fn lock_lost_marker(marker: &[u8]) -> Option<Vec<u8>> {
    let header_end = marker.iter().position(|&b| b == b'|')?;
    let mut out = Vec::with_capacity(marker.len() + 2);
    out.extend_from_slice(&marker[..header_end]);
    out.extend_from_slice(b",l");
    out.extend_from_slice(&marker[header_end..]);
    Some(out)
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
        let token = LockToken::generate();
        let bytes = Marker::encode("order:|{42}\n", &token, Some(17), Some(&fp), Ok(&json));
        let marker = Marker::decode(&bytes).unwrap();
        assert_eq!(marker.key(), "order:|{42}\n");
        assert_eq!(marker.fencing_token(), Some(17));
        assert_eq!(marker.delivery(), Some(delivery_of(&token).as_str()));
        assert!(!marker.written_after_lock_lost());
        assert_eq!(marker.fingerprint(), Some(fp.as_str()));
        match marker.result() {
            StoredResult::Json(stored) => assert_eq!(stored.get(), json.get()),
            StoredResult::Unstorable(why) => panic!("unexpected: {why}"),
        }
    }

    #[test]
    fn a_null_result_is_a_result() {
        let marker = Marker::decode(&Marker::encode(
            "k",
            &LockToken::generate(),
            None,
            None,
            Ok(&null()),
        ))
        .unwrap();
        assert!(matches!(marker.result(), StoredResult::Json(json) if json.get() == "null"));
        assert_eq!(marker.fencing_token(), None);
    }

    #[test]
    fn keeps_the_reason_a_result_was_not_stored() {
        let token = LockToken::generate();
        let bytes = Marker::encode("k", &token, Some(1), None, Err("map key must be a string"));
        let marker = Marker::decode(&bytes).unwrap();
        assert!(
            matches!(marker.result(), StoredResult::Unstorable(why) if why == "map key must be a string")
        );
    }

    #[test]
    fn unit_result_marker_for_a_29_character_key_is_44_bytes() {
        let key = "order-charge-2026-11-30-00042";
        assert_eq!(key.len(), 29);
        let token = LockToken::generate();
        let bytes = Marker::encode(key, &token, None, None, Ok(&null()));
        let delivery = delivery_of(&token);
        assert_eq!(bytes, format!("D29,d{delivery}|{key}|null").as_bytes());
        assert_eq!(bytes.len(), 44);
    }

    #[test]
    fn the_delivery_is_24_bits_of_the_token_in_base64url() {
        let token = LockToken::generate();
        let bits = u32::from_str_radix(&token.as_str()[..6], 16).unwrap();
        let delivery = delivery_of(&token);
        assert_eq!(delivery.len(), 4);
        let alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
        let decoded = delivery.chars().fold(0, |acc, c| {
            acc << 6 | u32::try_from(alphabet.find(c).unwrap()).unwrap()
        });
        assert_eq!(decoded, bits);
    }

    // Two deliveries of one unit that both ran (the first one's lock expired) and returned
    // the same value must not write the same bytes: a store takes "my marker is already there"
    // for a repeated finish of its own and would report the double run as `Executed`.
    #[test]
    fn two_deliveries_with_equal_results_write_different_markers() {
        let (a, b) = (LockToken::generate(), LockToken::generate());
        let first = Marker::encode("k", &a, None, None, Ok(&null()));
        let second = Marker::encode("k", &b, None, None, Ok(&null()));
        assert_ne!(first, second);
        assert_eq!(first, Marker::encode("k", &a, None, None, Ok(&null())));
    }

    #[test]
    fn the_lock_lost_marker_reads_back_with_its_flag() {
        let marker = Marker::encode("a|b", &LockToken::generate(), Some(3), None, Ok(&null()));
        let lost = lock_lost_marker(&marker).unwrap();
        let decoded = Marker::decode(&lost).unwrap();
        assert!(decoded.written_after_lock_lost());
        assert_eq!((decoded.key(), decoded.fencing_token()), ("a|b", Some(3)));
        assert!(lock_lost_marker(b"no separator").is_none());
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
            b"D1,d|k|1",
            b"D1,d+/|k|1",
            b"D1,d1,d2|k|1",
            b"D1,l,l|k|1",
            b"D1,lx|k|1",
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
