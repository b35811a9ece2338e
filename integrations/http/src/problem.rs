//! The `application/problem+json` answers (RFC 9457) the layer gives instead of the handler's,
//! one stable `type` for each case.
//!
//! Each constant below is the `type` member of one kind of answer, the address of its own
//! documentation; match on it, not on the `title` or `detail`, which are for people and may
//! change.

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};

/// `400`: the request requires an idempotency key and has none.
pub const MISSING_KEY: &str =
    "https://docs.rs/idempotask-http/latest/idempotask_http/problem/constant.MISSING_KEY.html";
/// `400`: the idempotency key is malformed (not an sf-string or a bare token, empty, too long,
/// not visible ASCII, or the header appears twice).
pub const INVALID_KEY: &str =
    "https://docs.rs/idempotask-http/latest/idempotask_http/problem/constant.INVALID_KEY.html";
/// `413`: the request body is larger than the layer buffers.
pub const BODY_TOO_LARGE: &str =
    "https://docs.rs/idempotask-http/latest/idempotask_http/problem/constant.BODY_TOO_LARGE.html";
/// `400`: the request body could not be read (the client stopped sending it).
pub const BODY_UNREADABLE: &str =
    "https://docs.rs/idempotask-http/latest/idempotask_http/problem/constant.BODY_UNREADABLE.html";
/// `400`: the request body is not one the layer's
/// [body fingerprint function](crate::Idempotency::fingerprint_body_with) reads (it gave no
/// fingerprint, say for a body that does not parse); nothing ran.
pub const BODY_INVALID: &str =
    "https://docs.rs/idempotask-http/latest/idempotask_http/problem/constant.BODY_INVALID.html";
/// `422`: the key was used before for a request with another fingerprint (method, path, query,
/// body); nothing ran.
pub const KEY_REUSED: &str =
    "https://docs.rs/idempotask-http/latest/idempotask_http/problem/constant.KEY_REUSED.html";
/// `409` with `Retry-After`: a request with this key is being processed; nothing ran for this
/// one.
pub const IN_PROGRESS: &str =
    "https://docs.rs/idempotask-http/latest/idempotask_http/problem/constant.IN_PROGRESS.html";
/// `409` without `Retry-After`: an earlier request with this key stopped without a response
/// or a release (its lock ran out: a server killed or cut off mid-request), so whether it took
/// effect is unknown, and the layer's task holds such keys
/// ([`InDoubt::Hold`](idempotask::InDoubt::Hold)); nothing ran for this one. Every retry gets
/// the same answer until an operator resolves the key (`idempotask resolve`); after that a
/// retry gets the recorded response, or runs.
pub const IN_DOUBT: &str =
    "https://docs.rs/idempotask-http/latest/idempotask_http/problem/constant.IN_DOUBT.html";
/// `410`: the request with this key ran, but its response was larger than the layer stores, so
/// it cannot be replayed; it does not run again.
pub const RESPONSE_NOT_STORED: &str = "https://docs.rs/idempotask-http/latest/idempotask_http/problem/constant.RESPONSE_NOT_STORED.html";
/// `410`: the request with this key ran, but its stored response cannot be read back (written
/// by an incompatible version, or damaged); it does not run again. A `4xx`, so that clients
/// and webhook senders do not retry it for ever.
pub const STORED_RESPONSE_UNREADABLE: &str = "https://docs.rs/idempotask-http/latest/idempotask_http/problem/constant.STORED_RESPONSE_UNREADABLE.html";
/// `503` with `Retry-After`: the idempotency store could not confirm the lock; nothing ran.
pub const STORE_UNAVAILABLE: &str = "https://docs.rs/idempotask-http/latest/idempotask_http/problem/constant.STORE_UNAVAILABLE.html";
/// `503` with `Retry-After`: the server is shutting down (its runtime stopped the request's
/// task); retry with the same key, elsewhere or later.
pub const SHUTTING_DOWN: &str =
    "https://docs.rs/idempotask-http/latest/idempotask_http/problem/constant.SHUTTING_DOWN.html";
/// `500`: processing the request panicked. Its `title` says where: `Handler panicked` when the
/// panic came out of the handler (its service, its future or its response body), `Request
/// processing panicked` when it came from the layer or the store around it. Nothing was stored
/// and the key was released, so a retry with the same key runs the request again (or, after a
/// panic outside the handler that came once its response was stored, gets that response). The
/// panic's message never reaches the client; it is logged only when the task's `log_key` lets
/// keys into the log, since it may hold one.
pub const HANDLER_PANICKED: &str =
    "https://docs.rs/idempotask-http/latest/idempotask_http/problem/constant.HANDLER_PANICKED.html";
/// `500`: the layer is misconfigured (no store installed, a task name taken, a digest collision
/// of keys); nothing ran.
pub const MISCONFIGURED: &str =
    "https://docs.rs/idempotask-http/latest/idempotask_http/problem/constant.MISCONFIGURED.html";

/// The content type of every answer of this module.
pub const CONTENT_TYPE: &str = "application/problem+json";

/// One problem answer: its status, `type`, `title`, `detail` and an optional `Retry-After`.
pub(crate) struct Problem {
    pub(crate) status: StatusCode,
    pub(crate) kind: &'static str,
    pub(crate) title: &'static str,
    pub(crate) detail: String,
    pub(crate) retry_after_secs: Option<u64>,
}

impl Problem {
    pub(crate) fn new(
        status: StatusCode,
        kind: &'static str,
        title: &'static str,
        detail: impl Into<String>,
    ) -> Self {
        Self {
            status,
            kind,
            title,
            detail: detail.into(),
            retry_after_secs: None,
        }
    }

    pub(crate) fn retry_after(mut self, secs: u64) -> Self {
        self.retry_after_secs = Some(secs.max(1));
        self
    }

    /// The answer, its body the problem document.
    pub(crate) fn into_response(self) -> Response<Bytes> {
        let document = serde_json::json!({
            "type": self.kind,
            "title": self.title,
            "status": self.status.as_u16(),
            "detail": self.detail,
        });
        let mut response = Response::new(Bytes::from(document.to_string()));
        *response.status_mut() = self.status;
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE));
        if let Some(secs) = self.retry_after_secs {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}
