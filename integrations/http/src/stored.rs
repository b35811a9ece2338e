//! What is kept of a response for the retries of its request, and how it is read back.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use bytes::Bytes;
use http::header::{self, HeaderName};
use http::{HeaderMap, HeaderValue, Response, StatusCode};
use serde::{Deserialize, Serialize};

/// The version of the stored format this release writes. A marker of a later version (a
/// rolling deploy rolled back) is answered as unreadable rather than misread.
pub(crate) const FORMAT: u32 = 1;

/// The value stored in the completion marker of one request, with the format's version.
///
/// Fields added later carry `#[serde(default)]`, so markers of an earlier release stay
/// readable during a rolling deploy.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Marker {
    /// The format's version: [`FORMAT`] when written by this release.
    pub(crate) v: u32,
    /// What was stored.
    pub(crate) stored: Stored,
}

impl Marker {
    pub(crate) fn new(stored: Stored) -> Self {
        Self { v: FORMAT, stored }
    }

    /// What was stored, when this release can read its version.
    pub(crate) fn into_stored(self) -> Result<Stored, Unreadable> {
        if self.v == FORMAT {
            Ok(self.stored)
        } else {
            Err("it was written in a format version this release does not read")
        }
    }
}

/// What is kept of one response.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum Stored {
    /// The whole response.
    Response(StoredResponse),
    /// The response was sent but its body was over the cap: only its status is kept, so a
    /// retry is told so instead of getting a part of it, or running again.
    TooLarge {
        /// The status the first request was answered with.
        status: u16,
        /// The cap the body went over.
        limit: usize,
    },
}

/// A response as stored: status, end-to-end headers, body.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct StoredResponse {
    status: u16,
    #[serde(default)]
    headers: Vec<(StoredName, Octets)>,
    body: Octets,
}

/// A header's name as stored: the response's own when written (a standard name is shared, not
/// copied), its text when read back, checked when the response is made again.
#[derive(Debug, Deserialize)]
#[serde(from = "String")]
enum StoredName {
    Name(HeaderName),
    Read(String),
}

impl From<String> for StoredName {
    fn from(text: String) -> Self {
        Self::Read(text)
    }
}

impl Serialize for StoredName {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(match self {
            Self::Name(name) => name.as_str(),
            Self::Read(text) => text,
        })
    }
}

/// Bytes in JSON: as text when they are UTF-8 (the usual body), else in base64 (the standard
/// alphabet with padding, RFC 4648 §4).
#[derive(Debug, Deserialize)]
#[serde(from = "OctetsRead")]
enum Octets {
    /// UTF-8, checked when made. `Bytes`, so that a body is stored without a copy of it.
    Text(Bytes),
    Base64(String),
}

/// [`Octets`] as read from JSON.
#[derive(Deserialize)]
enum OctetsRead {
    #[serde(rename = "text")]
    Text(String),
    #[serde(rename = "base64")]
    Base64(String),
}

impl From<OctetsRead> for Octets {
    fn from(read: OctetsRead) -> Self {
        match read {
            OctetsRead::Text(text) => Self::Text(Bytes::from(text)),
            OctetsRead::Base64(encoded) => Self::Base64(encoded),
        }
    }
}

impl Serialize for Octets {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Text(bytes) => match std::str::from_utf8(bytes) {
                Ok(text) => serializer.serialize_newtype_variant("Octets", 0, "text", text),
                // Made only of UTF-8; base64 keeps the bytes whatever happens.
                Err(_) => serializer.serialize_newtype_variant(
                    "Octets",
                    1,
                    "base64",
                    &BASE64.encode(bytes),
                ),
            },
            Self::Base64(encoded) => {
                serializer.serialize_newtype_variant("Octets", 1, "base64", encoded)
            }
        }
    }
}

/// Why a stored response cannot be turned back into one.
pub(crate) type Unreadable = &'static str;

impl Octets {
    /// `bytes`, shared rather than copied.
    fn of(bytes: &Bytes) -> Self {
        if std::str::from_utf8(bytes).is_ok() {
            Self::Text(bytes.clone())
        } else {
            Self::Base64(BASE64.encode(bytes))
        }
    }

    /// A copy of `bytes` (a header value's, which cannot be shared).
    fn copied(bytes: &[u8]) -> Self {
        if std::str::from_utf8(bytes).is_ok() {
            Self::Text(Bytes::copy_from_slice(bytes))
        } else {
            Self::Base64(BASE64.encode(bytes))
        }
    }

    fn into_bytes(self) -> Result<Bytes, Unreadable> {
        match self {
            Self::Text(bytes) => Ok(bytes),
            Self::Base64(encoded) => BASE64
                .decode(encoded)
                .map(Bytes::from)
                .map_err(|_| "it holds base64 that is not valid"),
        }
    }
}

/// Whether a header is dropped from what is stored: the hop-by-hop ones (RFC 9110 §7.6.1),
/// those the response's `Connection` names, `Date`, which a replay should not repeat, and
/// `Set-Cookie` unless `cookies`: a session handed to whoever retries the key.
fn is_dropped(name: &HeaderName, connection: &[HeaderName], cookies: bool) -> bool {
    (name == header::SET_COOKIE && !cookies)
        || name == header::CONNECTION
        || name == header::TRANSFER_ENCODING
        || name == header::TE
        || name == header::TRAILER
        || name == header::UPGRADE
        || name == header::PROXY_AUTHENTICATE
        || name == header::PROXY_AUTHORIZATION
        || name == header::DATE
        || name.as_str() == "keep-alive"
        || name.as_str() == "proxy-connection"
        || connection.contains(name)
}

impl StoredResponse {
    /// What is kept of a response with `status`, `headers` and `body`; its `Set-Cookie`
    /// headers only when `cookies`.
    pub(crate) fn of(status: StatusCode, headers: &HeaderMap, body: &Bytes, cookies: bool) -> Self {
        let connection: Vec<HeaderName> = headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|value| value.to_str().ok())
            .flat_map(|value| value.split(','))
            .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
            .collect();
        Self {
            status: status.as_u16(),
            headers: headers
                .iter()
                .filter(|(name, _)| !is_dropped(name, &connection, cookies))
                .map(|(name, value)| {
                    (
                        StoredName::Name(name.clone()),
                        Octets::copied(value.as_bytes()),
                    )
                })
                .collect(),
            body: Octets::of(body),
        }
    }

    /// The response again, for a retry. Data read back from a store is checked, not trusted.
    pub(crate) fn into_response(self) -> Result<Response<Bytes>, Unreadable> {
        let status =
            StatusCode::from_u16(self.status).map_err(|_| "its status code is not valid")?;
        let mut headers = HeaderMap::with_capacity(self.headers.len());
        for (name, value) in self.headers {
            let name = match name {
                StoredName::Name(name) => name,
                StoredName::Read(text) => HeaderName::from_bytes(text.as_bytes())
                    .map_err(|_| "it holds a header name that is not valid")?,
            };
            let value = HeaderValue::from_bytes(&value.into_bytes()?)
                .map_err(|_| "it holds a header value that is not valid")?;
            headers.append(name, value);
        }
        let mut response = Response::new(self.body.into_bytes()?);
        *response.status_mut() = status;
        *response.headers_mut() = headers;
        Ok(response)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_that_are_not_utf8_round_trip_in_base64() {
        for len in 0..40_u8 {
            let bytes: Vec<u8> = (0..len).map(|i| i.wrapping_mul(37) ^ 0xa5).collect();
            assert_eq!(Octets::copied(&bytes).into_bytes().unwrap(), bytes);
        }
        assert!(matches!(Octets::copied(b"\xff"), Octets::Base64(ref text) if text == "/w=="));
        assert!(Octets::Base64("Zm8".to_owned()).into_bytes().is_err());
        assert!(Octets::Base64("Zm*=".to_owned()).into_bytes().is_err());
    }

    #[test]
    fn hop_by_hop_headers_and_date_are_not_stored() {
        let mut headers = HeaderMap::new();
        headers.insert("connection", HeaderValue::from_static("close, x-hop"));
        headers.insert("x-hop", HeaderValue::from_static("1"));
        headers.insert("transfer-encoding", HeaderValue::from_static("chunked"));
        headers.insert(
            "date",
            HeaderValue::from_static("Tue, 01 Dec 2026 10:00:00 GMT"),
        );
        headers.insert("location", HeaderValue::from_static("/payments/1"));
        headers.append("set-cookie", HeaderValue::from_static("a=1"));
        headers.append("set-cookie", HeaderValue::from_bytes(b"b=\xff").unwrap());
        let unscoped = StoredResponse::of(StatusCode::CREATED, &headers, &Bytes::new(), false);
        let names: Vec<String> = unscoped
            .headers
            .iter()
            .map(|(name, _)| serde_json::to_value(name).unwrap().to_string())
            .collect();
        assert_eq!(
            names,
            ["\"location\""],
            "Set-Cookie is stored only when asked"
        );
        let stored = StoredResponse::of(
            StatusCode::CREATED,
            &headers,
            &Bytes::from_static(b"\x00\xff"),
            true,
        );
        let json = serde_json::to_string(&stored).unwrap();
        let back: StoredResponse = serde_json::from_str(&json).unwrap();
        let response = back.into_response().unwrap();
        assert_eq!(response.status(), StatusCode::CREATED);
        let names: Vec<&str> = response.headers().keys().map(HeaderName::as_str).collect();
        assert_eq!(names, ["location", "set-cookie"]);
        let cookies: Vec<&[u8]> = response
            .headers()
            .get_all("set-cookie")
            .iter()
            .map(HeaderValue::as_bytes)
            .collect();
        assert_eq!(cookies, [&b"a=1"[..], b"b=\xff"]);
        assert_eq!(&response.body()[..], b"\x00\xff");
    }

    #[test]
    fn markers_carry_their_version_and_old_fields_default() {
        let marker = Marker::new(Stored::TooLarge {
            status: 200,
            limit: 1,
        });
        let json = serde_json::to_value(&marker).unwrap();
        assert_eq!(json["v"], FORMAT);
        let later = r#"{"v":2,"stored":{"TooLarge":{"status":200,"limit":1}}}"#;
        let later: Marker = serde_json::from_str(later).unwrap();
        assert!(later.into_stored().is_err());
        let bare = r#"{"v":1,"stored":{"Response":{"status":204,"body":{"text":""}}}}"#;
        let bare: Marker = serde_json::from_str(bare).unwrap();
        let Stored::Response(response) = bare.into_stored().unwrap() else {
            panic!("a response")
        };
        assert_eq!(response.into_response().unwrap().status(), 204);
    }

    #[test]
    fn damaged_stored_responses_are_errors() {
        for json in [
            r#"{"status":1000,"headers":[],"body":{"text":""}}"#,
            r#"{"status":200,"headers":[["bad name",{"text":"x"}]],"body":{"text":""}}"#,
            r#"{"status":200,"headers":[["x",{"text":"a\nb"}]],"body":{"text":""}}"#,
            r#"{"status":200,"headers":[],"body":{"base64":"!!!!"}}"#,
        ] {
            let stored: StoredResponse = serde_json::from_str(json).unwrap();
            assert!(stored.into_response().is_err(), "{json}");
        }
    }
}
