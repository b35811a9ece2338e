//! Who may use the dashboard: every request carries the token, either as
//! `Authorization: Bearer <token>` (scripts) or as the session cookie a browser gets by opening
//! `/?token=<token>` once. A browser's posts also carry the session's CSRF token in a form field
//! and an `Origin` of this very host; a bearer request needs neither, as no browser attaches
//! that header by itself.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Mutex;

use axum::http::{HeaderMap, header};

use crate::audit::{fingerprint, hex};
use crate::exit::{Exit, Failure};

/// The session cookie's name.
pub(crate) const COOKIE: &str = "idempotask_session";

/// How many browser sessions are kept; past it, the oldest are dropped (their browsers log in
/// again with the token).
const MAX_SESSIONS: usize = 256;

/// The token, and the sessions logged in with it.
pub(crate) struct Access {
    token: String,
    /// Whether the token was made here (then it is printed, as nobody else knows it).
    generated: bool,
    /// Session id → its CSRF token, in login order.
    sessions: Mutex<Vec<(String, String)>>,
}

/// Who made a request, as far as the dashboard knows.
pub(crate) enum Caller {
    /// `Authorization: Bearer`.
    Bearer,
    /// A browser session, with its CSRF token.
    Session { csrf: String },
}

impl Access {
    /// Input: the token file, if any, and the address to listen on. Output: the access, with
    /// the token of `IDEMPOTASK_DASHBOARD_TOKEN` or the file's first line; on a loopback
    /// address without either, a fresh random one. A non-loopback address without a token is
    /// refused, as is a token shorter than 16 characters.
    pub(crate) fn from_env_or_file(
        file: Option<&Path>,
        listen: SocketAddr,
    ) -> Result<Self, Failure> {
        let given = match file {
            Some(path) => Some(
                std::fs::read_to_string(path)
                    .map_err(|err| {
                        Failure::usage(format!(
                            "cannot read the token file {}: {err}",
                            path.display()
                        ))
                    })?
                    .lines()
                    .next()
                    .unwrap_or_default()
                    .trim()
                    .to_owned(),
            ),
            None => std::env::var("IDEMPOTASK_DASHBOARD_TOKEN")
                .ok()
                .filter(|token| !token.is_empty()),
        };
        let (token, generated) = match given {
            Some(token) if token.chars().count() < 16 => {
                return Err(Failure::usage(
                    "the dashboard token is shorter than 16 characters; make a long random one, e.g. `openssl rand -hex 24`",
                ));
            }
            Some(token) => (token, false),
            None if listen.ip().is_loopback() => (random_hex(), true),
            None => {
                return Err(Failure::new(
                    Exit::Usage,
                    "no_token",
                    format!(
                        "refusing to serve the dashboard on {listen}, which is not a loopback address, without a token: set IDEMPOTASK_DASHBOARD_TOKEN or pass --token-file"
                    ),
                ));
            }
        };
        Ok(Self {
            token,
            generated,
            sessions: Mutex::new(Vec::new()),
        })
    }

    /// What to open: the login address with the token when it was made here, a placeholder
    /// otherwise (the token stays out of logs).
    pub(crate) fn login_hint(&self, bound: SocketAddr) -> String {
        if self.generated {
            format!("http://{bound}/?token={}", self.token)
        } else {
            format!("http://{bound}/?token=<the token>")
        }
    }

    /// Who the audit trail names: the token's fingerprint.
    pub(crate) fn who(&self) -> String {
        format!("dashboard:{}", fingerprint(&self.token))
    }

    /// Whether `given` is the token, compared in constant time.
    pub(crate) fn is_token(&self, given: &str) -> bool {
        same(given.as_bytes(), self.token.as_bytes())
    }

    /// Input: a request's headers. Output: who sent it, `None` when it carries neither the
    /// token nor a live session.
    pub(crate) fn caller(&self, headers: &HeaderMap) -> Option<Caller> {
        let bearer = headers
            .get(header::AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.strip_prefix("Bearer "));
        if bearer.is_some_and(|token| self.is_token(token.trim())) {
            return Some(Caller::Bearer);
        }
        let session = cookie(headers, COOKIE)?;
        let sessions = self.sessions.lock().ok()?;
        sessions
            .iter()
            .find(|(id, _)| same(id.as_bytes(), session.as_bytes()))
            .map(|(_, csrf)| Caller::Session { csrf: csrf.clone() })
    }

    /// A new browser session: its id, for the cookie.
    pub(crate) fn open_session(&self) -> String {
        let id = random_hex();
        if let Ok(mut sessions) = self.sessions.lock() {
            if sessions.len() >= MAX_SESSIONS {
                sessions.remove(0);
            }
            sessions.push((id.clone(), random_hex()));
        }
        id
    }
}

/// Input: a post's headers. Output: whether its `Origin` is this very host (what a browser
/// sends on a post from the dashboard's own page, and cannot be made to send from another).
pub(crate) fn same_origin(headers: &HeaderMap) -> bool {
    let value = |name| headers.get(name).and_then(|value| value.to_str().ok());
    match (value(header::ORIGIN), value(header::HOST)) {
        // `https://` too: behind a TLS proxy that passes the `Host` header on.
        (Some(origin), Some(host)) => origin
            .strip_prefix("http://")
            .or_else(|| origin.strip_prefix("https://"))
            .is_some_and(|origin_host| origin_host == host),
        _ => false,
    }
}

/// Whether `a` and `b` are equal, in a time that does not depend on where they differ.
pub(crate) fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The value of cookie `name`, if the request has it.
fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value.to_owned())
}

/// 128 random bits, as 32 hex digits.
fn random_hex() -> String {
    hex(&rand::random::<[u8; 16]>())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(origin: Option<&'static str>, host: &'static str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, host.parse().unwrap());
        if let Some(origin) = origin {
            headers.insert(header::ORIGIN, origin.parse().unwrap());
        }
        headers
    }

    #[test]
    fn a_post_must_come_from_this_very_host() {
        assert!(same_origin(&headers(
            Some("http://127.0.0.1:8787"),
            "127.0.0.1:8787"
        )));
        assert!(same_origin(&headers(
            Some("https://ops.example"),
            "ops.example"
        )));
        assert!(!same_origin(&headers(
            Some("http://evil.example"),
            "127.0.0.1:8787"
        )));
        assert!(!same_origin(&headers(
            Some("http://127.0.0.1:8788"),
            "127.0.0.1:8787"
        )));
        assert!(!same_origin(&headers(Some("null"), "127.0.0.1:8787")));
        assert!(!same_origin(&headers(None, "127.0.0.1:8787")));
    }

    #[test]
    fn tokens_compare_whole() {
        assert!(same(b"abc", b"abc"));
        assert!(!same(b"abc", b"abd"));
        assert!(!same(b"abc", b"abcd"));
        assert!(!same(b"", b"a"));
    }
}
