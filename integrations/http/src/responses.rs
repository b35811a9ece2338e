//! The answers the layer gives itself, without calling the service: a replay of a stored
//! response, and the problem documents for a refused, unkeyed, unreadable or misconfigured
//! request.

use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode};
use http_body::Body;
use idempotask::{CodecErrorKind, Error};

use crate::body::ResponseBody;
use crate::key::Refusal;
use crate::layer::{IDEMPOTENT_REPLAYED, KeySource};
use crate::problem::{self, Problem};
use crate::stored::{Marker, Stored};

/// The answer to a retry of a request whose response was stored.
pub(crate) fn replay<R: Body<Data = Bytes>>(marker: Marker) -> Response<ResponseBody<R>> {
    let stored = match marker.into_stored() {
        Ok(stored) => stored,
        Err(reason) => return unreadable(reason),
    };
    match stored {
        Stored::Response(response) => match response.into_response() {
            Ok(mut response) => {
                response
                    .headers_mut()
                    .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
                response.map(ResponseBody::full)
            }
            Err(reason) => unreadable(reason),
        },
        Stored::TooLarge { status, limit } => problem(Problem::new(
            StatusCode::GONE,
            problem::RESPONSE_NOT_STORED,
            "Response not stored",
            format!(
                "the request with this key ran and was answered {status}, but its response was over the {limit} bytes this service stores, so it cannot be replayed; it will not run again"
            ),
        )),
    }
}

/// Input: an error of idempotask's. Output: the problem answer for it.
pub(crate) fn refused<R: Body<Data = Bytes>>(
    err: &Error,
    cap: Duration,
) -> Response<ResponseBody<R>> {
    match err {
        Error::Contended {
            lock_ttl_remaining, ..
        } => {
            // The holder's remaining lock time is an upper bound, often far off: a handler of
            // milliseconds under a 30 s lock would make clients wait 30 s.
            let secs = lock_ttl_remaining
                .map_or(1, |left| left.as_secs() + 1)
                .min(cap.as_secs().max(1));
            problem(
                Problem::new(
                    StatusCode::CONFLICT,
                    problem::IN_PROGRESS,
                    "Request in progress",
                    "a request with this idempotency key is being processed; retry it later",
                )
                .retry_after(secs),
            )
        }
        // A 4xx, so that clients and webhook senders do not retry it at once and for ever as
        // they do a 5xx; 409, as the key's state conflicts with running it; no `Retry-After`,
        // since no wait helps before an operator resolves the key. Not 410: it is not final.
        Error::InDoubt { .. } => problem(Problem::new(
            StatusCode::CONFLICT,
            problem::IN_DOUBT,
            "Request in doubt",
            "an earlier request with this idempotency key stopped before it was answered, so whether it took effect is unknown; nothing ran, and retries get this answer until an operator resolves the key",
        )),
        Error::KeyReuse { .. } => problem(Problem::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            problem::KEY_REUSED,
            "Idempotency key reused",
            "this idempotency key was used for a request with another method, path, query or body; nothing ran",
        )),
        Error::Store(store) => problem(
            Problem::new(
                StatusCode::SERVICE_UNAVAILABLE,
                problem::STORE_UNAVAILABLE,
                "Idempotency store unavailable",
                format!("nothing ran; retry with the same key ({})", store.kind()),
            )
            .retry_after(1),
        ),
        Error::InvalidKey(invalid) => {
            // Its text holds the scoped key, and with it the scope: for the operator only.
            tracing::warn!(error = %invalid, "idempotask-http: the store refused the key");
            invalid_key(
                "the idempotency key, with its scope, is not one the idempotency store accepts",
            )
        }
        Error::Codec {
            kind:
                CodecErrorKind::Undecodable | CodecErrorKind::Unreadable | CodecErrorKind::Unstorable,
            ..
        } => unreadable("it does not decode"),
        other => misconfigured(other),
    }
}

pub(crate) fn problem<R: Body<Data = Bytes>>(problem: Problem) -> Response<ResponseBody<R>> {
    problem.into_response().map(ResponseBody::full)
}

pub(crate) fn body_too_large<R: Body<Data = Bytes>>(limit: usize) -> Response<ResponseBody<R>> {
    problem(Problem::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        problem::BODY_TOO_LARGE,
        "Request body too large",
        format!("requests with an idempotency key are buffered up to {limit} bytes"),
    ))
}

pub(crate) fn missing_key<R: Body<Data = Bytes>>(source: &KeySource) -> Response<ResponseBody<R>> {
    problem(Problem::new(
        StatusCode::BAD_REQUEST,
        problem::MISSING_KEY,
        "Idempotency key missing",
        missing_key_detail(source),
    ))
}

/// What a request without a key lacks, in the terms of where this layer takes its key from.
pub(crate) fn missing_key_detail(source: &KeySource) -> String {
    match source {
        KeySource::Header(name) => {
            format!("this request requires an idempotency key in its {name} header")
        }
        KeySource::Function(_) => {
            "this request requires an idempotency key, and none was found in it".to_owned()
        }
    }
}

pub(crate) fn invalid_key<R: Body<Data = Bytes>>(detail: Refusal) -> Response<ResponseBody<R>> {
    problem(Problem::new(
        StatusCode::BAD_REQUEST,
        problem::INVALID_KEY,
        "Idempotency key invalid",
        detail,
    ))
}

// 410, not 500: clients and webhook senders retry a 5xx for ever, and this one is final for
// the key's result TTL.
pub(crate) fn unreadable<R: Body<Data = Bytes>>(reason: &str) -> Response<ResponseBody<R>> {
    problem(Problem::new(
        StatusCode::GONE,
        problem::STORED_RESPONSE_UNREADABLE,
        "Stored response unreadable",
        format!(
            "the request with this key ran, but its stored response cannot be read back ({reason}); it will not run again"
        ),
    ))
}

/// The answer when the layer cannot run the request as configured. The client gets a fixed
/// text (the error can name source locations, keys and scopes); the error goes to tracing.
pub(crate) fn misconfigured<R: Body<Data = Bytes>>(
    error: &(dyn fmt::Display + Sync),
) -> Response<ResponseBody<R>> {
    tracing::error!(error = %error, "idempotask-http: the request could not run as configured");
    problem(Problem::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        problem::MISCONFIGURED,
        "Idempotency misconfigured",
        MISCONFIGURED_DETAIL,
    ))
}

/// The `detail` of every [`problem::MISCONFIGURED`] answer.
pub(crate) const MISCONFIGURED_DETAIL: &str =
    "nothing ran: the idempotency layer is misconfigured; the server's log says how";
