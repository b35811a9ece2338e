//! Where a request's idempotency key comes from, and which keys are acceptable.

use http::HeaderValue;
use http::header::GetAll;

/// Why a key cannot be used; the text goes into the `detail` of the `400` answer.
pub(crate) type Refusal = &'static str;

/// Input: every value of the key header. Output: the key, `None` when the header is absent, or
/// why it is malformed.
///
/// The draft makes the header an sf-string (`Idempotency-Key: "8e03978e-40d5"`, RFC 8941
/// §3.3.3); many clients send the bare value, so a bare value of visible characters is taken
/// too. A header that appears twice is refused: it would be two keys for one request.
pub(crate) fn from_header(
    values: &GetAll<'_, HeaderValue>,
    max_len: usize,
) -> Result<Option<String>, Refusal> {
    let mut values = values.iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err("the header that carries the idempotency key appears more than once");
    }
    let raw = value.as_bytes().trim_ascii();
    let key = match raw.strip_prefix(b"\"") {
        Some(quoted) => sf_string(quoted)?,
        None => bare(raw)?,
    };
    checked(key, max_len).map(Some)
}

/// Input: the bytes after an sf-string's opening quote. Output: the string it holds.
fn sf_string(quoted: &[u8]) -> Result<String, Refusal> {
    let mut key = String::with_capacity(quoted.len());
    let mut bytes = quoted.iter();
    while let Some(&byte) = bytes.next() {
        match byte {
            b'\\' => match bytes.next() {
                Some(&escaped @ (b'"' | b'\\')) => key.push(char::from(escaped)),
                _ => return Err("a quoted key may only escape `\"` and `\\`"),
            },
            b'"' => {
                if bytes.next().is_some() {
                    return Err("nothing may follow the closing quote of the key");
                }
                return Ok(key);
            }
            0x20..=0x7e => key.push(char::from(byte)),
            _ => return Err("a key may hold only visible ASCII characters and spaces"),
        }
    }
    Err("the quoted key has no closing quote")
}

/// Input: a header value that does not start with a quote. Output: the key it is.
fn bare(raw: &[u8]) -> Result<String, Refusal> {
    if raw
        .iter()
        .all(|byte| matches!(byte, 0x21..=0x7e) && !matches!(byte, b'"' | b'\\' | b',' | b';'))
    {
        // All ASCII, checked just above: one allocation of the exact size.
        Ok(String::from_utf8_lossy(raw).into_owned())
    } else {
        Err(
            "an unquoted key may hold only visible ASCII characters other than `\"`, `\\`, `,` and `;`; quote it as the draft says",
        )
    }
}

/// `key`, once known to be neither empty, longer than `max_len`, nor holding a character other
/// than visible ASCII and spaces: for keys from the header and from a key function alike.
pub(crate) fn checked(key: String, max_len: usize) -> Result<String, Refusal> {
    if key.is_empty() {
        return Err("the idempotency key is empty");
    }
    if key.len() > max_len {
        return Err("the idempotency key is longer than this service accepts");
    }
    if !key.bytes().all(|byte| matches!(byte, 0x20..=0x7e)) {
        return Err("a key may hold only visible ASCII characters and spaces");
    }
    Ok(key)
}

/// The key the store sees: the SHA-256 of the scope (64 hex digits), then the caller's key.
///
/// Hashed so that the stored key stays bounded (a long scope cannot push a valid key over the
/// store's limit) and a scope that is a secret (an API key) is not logged or stored in clear;
/// fixed-length, so that no scope and key pair can spell another pair's stored key.
pub(crate) fn scoped(scope: Option<&str>, key: String) -> String {
    match scope {
        Some(scope) => format!("{}:{key}", crate::fingerprint::digest(scope.as_bytes())),
        None => key,
    }
}

#[cfg(test)]
mod tests {
    use http::HeaderMap;

    use super::*;

    fn parse(values: &[&[u8]]) -> Result<Option<String>, Refusal> {
        let mut headers = HeaderMap::new();
        for value in values {
            headers.append("idempotency-key", HeaderValue::from_bytes(value).unwrap());
        }
        from_header(&headers.get_all("idempotency-key"), 255)
    }

    #[test]
    fn quoted_and_bare_keys_are_read() {
        assert_eq!(
            parse(&[b"\"8e03978e-40d5\""]).unwrap().unwrap(),
            "8e03978e-40d5"
        );
        assert_eq!(
            parse(&[b"8e03978e-40d5"]).unwrap().unwrap(),
            "8e03978e-40d5"
        );
        assert_eq!(
            parse(&[br#""a \"b\" \\c""#]).unwrap().unwrap(),
            r#"a "b" \c"#
        );
        assert_eq!(
            parse(&[b"  \"spaced key\" "]).unwrap().unwrap(),
            "spaced key"
        );
        assert_eq!(parse(&[]).unwrap(), None);
    }

    #[test]
    fn malformed_keys_are_refused() {
        for bad in [
            &b"\"unterminated"[..],
            b"\"\"",
            b"\"a\";param=1",
            b"\"bad \\n escape\"",
            b"two words",
            b"a,b",
            b"caf\xc3\xa9",
            b"",
        ] {
            assert!(parse(&[bad]).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
        assert!(parse(&[b"a", b"b"]).is_err());
        assert!(parse(&["k".repeat(256).as_bytes()]).is_err());
        assert!(parse(&["k".repeat(255).as_bytes()]).is_ok());
    }

    #[test]
    fn scopes_cannot_spell_each_others_keys() {
        assert_ne!(
            scoped(Some("a:b"), "c".to_owned()),
            scoped(Some("a"), "b:c".to_owned())
        );
        assert_eq!(scoped(None, "k".to_owned()), "k");
    }

    #[test]
    fn scopes_are_hashed_and_bounded() {
        let secret = "sk_live_".repeat(1000);
        let stored = scoped(Some(&secret), "k".to_owned());
        assert_eq!(stored.len(), 64 + 2, "{stored}");
        assert!(!stored.contains("sk_live"), "{stored}");
        assert!(stored.ends_with(":k"));
    }
}
