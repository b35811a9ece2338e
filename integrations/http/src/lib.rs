//! The `Idempotency-Key` header for [tower](https://docs.rs/tower) services (axum, hyper, and
//! anything tower-based): each request runs at most once per key, and its retries get the stored
//! response, on every idempotask store.
//!
//! Clients retry a `POST /payments` after a timeout; webhook senders deliver each event at least
//! once. [`Idempotency`] is a tower [`Layer`](tower_layer::Layer) that runs each request
//! carrying a key through an idempotask [`Task`](idempotask::Task): a lock so that two concurrent duplicates
//! cannot both run the handler, and a completion marker holding the response that every retry
//! gets back, marked `Idempotent-Replayed: true`. It follows the IETF draft "The
//! Idempotency-Key HTTP Header Field" (draft-ietf-httpapi-idempotency-key-header-07) and, where
//! the draft is silent, Stripe's API.
//!
//! ```
//! use std::sync::Arc;
//! use std::sync::atomic::{AtomicU32, Ordering};
//! use axum::{Router, routing::post};
//! use idempotask::{MemoryStore, Task};
//! use idempotask_http::Idempotency;
//! use tower::ServiceExt;
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let charges = Arc::new(AtomicU32::new(0));
//! let counter = Arc::clone(&charges);
//! let app = Router::new()
//!     .route("/payments", post(move |body: String| async move {
//!         let charge = counter.fetch_add(1, Ordering::SeqCst) + 1;
//!         format!("charge {charge} for {body}")
//!     }))
//!     // A Redis or PostgreSQL store in production, or the installed one without `.store`.
//!     .layer(
//!         Idempotency::new(Task::new("payments"))
//!             .store(MemoryStore::new())
//!             // Two clients' equal keys never meet: scope by who is asking.
//!             .scope(|request| {
//!                 let client = request.headers.get("x-api-client");
//!                 client.and_then(|v| v.to_str().ok()).unwrap_or("").to_owned()
//!             }),
//!     );
//!
//! for _retry in 0..3 {
//!     let request = http::Request::post("/payments")
//!         .header("idempotency-key", "\"order-42\"")
//!         .body(axum::body::Body::from("42 EUR"))
//!         .unwrap();
//!     let response = app.clone().oneshot(request).await.unwrap();
//!     assert_eq!(response.status(), 200);
//! }
//! assert_eq!(charges.load(Ordering::SeqCst), 1);
//! # }
//! ```
//!
//! # Which requests, which key
//! Requests whose method is one of [`methods`](Idempotency::methods) (`POST` and `PATCH` by
//! default; `PUT` and `DELETE` are idempotent by definition) go through the layer; others pass
//! through untouched. The key is the `Idempotency-Key` header, in the draft's sf-string form
//! (`"8e03978e-40d5"`) or bare (`8e03978e-40d5`), or another header
//! ([`key_header`](Idempotency::key_header): `X-GitHub-Delivery`), or any function of the request
//! and its body ([`key_fn`](Idempotency::key_fn): a Stripe event's id). Keys hold visible ASCII
//! and spaces, up to [`max_key_len`](Idempotency::max_key_len) bytes. A [`scope`](Idempotency::scope)
//! (the tenant, the API key, the authenticated principal) goes into the stored key, so two
//! clients' equal keys never meet. A request without a key passes through, unless
//! [`require_key`](Idempotency::require_key) is set.
//!
//! The stored key is the scope's SHA-256 (bounded, and a secret scope is not stored or logged
//! in clear) and the key; the request's **fingerprint** is its method, path,
//! query, body digest (or the body read as JSON, [numbers by their exact
//! text](BodyFingerprint::Json), or [what you read of the body](Idempotency::fingerprint_body_with)) and
//! any [headers you name](Idempotency::fingerprint_headers). A retry
//! with the same key and another fingerprint is `422`, and nothing runs.
//!
//! # Outcomes
//! Every answer the layer gives instead of the handler's is `application/problem+json` (RFC
//! 9457) with a stable `type` from [`problem`].
//!
//! | the request | the answer | the handler |
//! | --- | --- | --- |
//! | method not covered, or no key (and none required) | the handler's | runs, unprotected |
//! | no key, [`require_key`](Idempotency::require_key) set | `400` [`MISSING_KEY`](problem::MISSING_KEY) | does not run |
//! | malformed key | `400` [`INVALID_KEY`](problem::INVALID_KEY) | does not run |
//! | body over [`max_request_body`](Idempotency::max_request_body) (refused before it is read when its `Content-Length` says so); with [`key_fn`](Idempotency::key_fn) this holds for requests without a key too, since the body is read to look for one | `413` [`BODY_TOO_LARGE`](problem::BODY_TOO_LARGE) | does not run |
//! | body not readable (the client stopped sending) | `400` [`BODY_UNREADABLE`](problem::BODY_UNREADABLE) | does not run |
//! | body refused by the [body fingerprint function](Idempotency::fingerprint_body_with) | `400` [`BODY_INVALID`](problem::BODY_INVALID) | does not run |
//! | fresh key | the handler's response; stored when its status is kept (below) | runs once, to completion even if the client goes away |
//! | fresh key, a `5xx`, or a refusal of the request as sent (by default: [`request_refused`], `400`, `415`, `422`, …, an axum extractor's rejection) | the handler's response; the key is released, so a retry, corrected or not, runs again | ran, or refused the request |
//! | fresh key, the response carries a [`Retention`] | stored ([`Keep`](Retention::Keep)) or released ([`Release`](Retention::Release)) as it says, whatever its status | ran |
//! | fresh key, response body over [`max_stored_body`](Idempotency::max_stored_body) | the handler's whole response; only "too large" is stored | ran |
//! | a retry of a stored response | that response, with `Idempotent-Replayed: true` | does not run |
//! | a retry of a too-large response | `410` [`RESPONSE_NOT_STORED`](problem::RESPONSE_NOT_STORED) | does not run again |
//! | the key is being processed by another request | `409` [`IN_PROGRESS`](problem::IN_PROGRESS) with `Retry-After`; or, with [`wait_for_result`](Idempotency::wait_for_result), the first request's response once stored | does not run |
//! | the key was used with another fingerprint | `422` [`KEY_REUSED`](problem::KEY_REUSED) | does not run |
//! | the key is in doubt and the layer's task holds such keys ([`InDoubt::Hold`](idempotask::InDoubt::Hold)): an earlier request's lock ran out without a response or a release | `409` [`IN_DOUBT`](problem::IN_DOUBT), no `Retry-After`; every retry gets it until an operator resolves the key | does not run |
//! | the store cannot confirm the lock | `503` [`STORE_UNAVAILABLE`](problem::STORE_UNAVAILABLE) with `Retry-After` | does not run |
//! | the handler's task is cancelled by its runtime's shutdown while the request is served from another runtime (within one runtime the request goes with it, unanswered) | `503` [`SHUTTING_DOWN`](problem::SHUTTING_DOWN) with `Retry-After` | cancelled: its key is released (or its lock expires), so a retry runs it again |
//! | the stored response cannot be read back (damaged, or of a later format version) | `410` [`STORED_RESPONSE_UNREADABLE`](problem::STORED_RESPONSE_UNREADABLE) | does not run again |
//! | no store installed, a task name taken, no tokio runtime around the service | `500` [`MISCONFIGURED`](problem::MISCONFIGURED), a fixed `detail`; the error itself goes to `tracing::error!` | does not run |
//! | fresh key, the store down at `finish`, or the lock lost under the handler | the handler's response (a `tracing::warn!` from the core and the layer); a retry after the lock TTL may run the handler again | ran |
//! | the handler's service fails (its `Err`) | that error, as without the layer; the key is released | ran |
//! | the handler panics, or the layer or the store while processing the request | `500` [`HANDLER_PANICKED`](problem::HANDLER_PANICKED), its `title` saying which (`Handler panicked`, `Request processing panicked`), a fixed `detail`; a `tracing::error!`, with the panic's message only when the task's `log_key` is `KeyLogging::Plain`; nothing is stored and the key is released, so a retry runs it again (a panic outside the handler after its response was stored: a retry gets that response) | ran, or not |
//!
//! # Decisions
//! - **Which responses are stored.** By default every status below 500 except those that
//!   refuse the request as it was sent ([`request_refused`]: `400`, `401`, `405`, `406`,
//!   `408`, `411`, `412`, `413`, `414`, `415`, `422`, `428`, `429`, `431`). A `2xx`, a `3xx`
//!   (a `303` after a `POST`) and the other `4xx` (`402` a card declined, `403`, `404`, `409`)
//!   are the result of the operation, and a retry gets the same one.
//!
//!   A refusal says the request was not processed: its body does not parse, a field has the
//!   wrong type, its `Content-Type` is missing, its credentials or precondition failed, or it
//!   came too fast. The client is expected to fix it and send it again, and with the same key,
//!   since nothing happened: storing the refusal would answer the corrected request with it
//!   for the result TTL (a `415` replayed to the request that now has its `Content-Type`), or,
//!   when the fix changed the body, with `422 KEY_REUSED`. So the key is released and the
//!   corrected request runs. This is Stripe's rule ("if incoming parameters fail validation
//!   … no idempotent result is saved … you can retry"); the draft asks a server to answer a
//!   retry "with the result of the previous operation", and a refused request had no
//!   operation. The status is what the layer can see of the difference, so the set is the
//!   statuses that say so by their definition; a handler that answers one of them *after*
//!   acting marks its response [`Retention::Keep`], and one that answers another `4xx`
//!   before acting can mark it [`Retention::Release`]. Putting `Content-Type` into the
//!   default fingerprint instead would make the 415's corrected request a `422`, not a
//!   success, and would turn a retry that only respells its `Content-Type`
//!   (`; charset=utf-8`) into a `422` too; [`fingerprint_headers`](Idempotency::fingerprint_headers)
//!   adds it where the content type selects the operation.
//!
//!   `5xx` say that the operation did not complete, so the key is released and a retry runs
//!   the handler again. The draft asks for "the result of the previous operation" whatever it
//!   was, and Stripe stores `500`s too; both assume a server error is final. For a handler
//!   that fails before its side effect (a database down, a timeout of a call it makes) a
//!   stored `500` turns one transient failure into a permanent one for that key, which is why
//!   releasing is the default here. A handler that may fail *after* its side effect should
//!   store: [`store_when`](Idempotency::store_when) sets the rule
//!   (`|status| !request_refused(status)` is Stripe's, `|_| true` the draft's letter), and a
//!   [`Retention`] in a response decides for that response.
//! - **A panicking handler** gets its client a `500` [`HANDLER_PANICKED`](problem::HANDLER_PANICKED)
//!   problem, not a connection closed without an answer: the core has released the key and
//!   stored nothing, so a retry runs the handler again, as after a `5xx`. A panic in the
//!   layer's or the store's code gets the same answer, titled `Request processing panicked`
//!   instead of `Handler panicked`: the layer tells them apart by whether the panic unwound
//!   out of a poll of the handler's future or body. The panic's message, which may hold
//!   anything the handler had (its key too), never goes to the client, and goes to the log only
//!   under `KeyLogging::Plain`; with `Task::log_key(KeyLogging::Hash)` the log says that the
//!   request panicked, not with what. The process's panic hook (Rust's default prints to
//!   stderr) sees the message before the layer does, whatever `log_key` says: install one
//!   with `std::panic::set_hook` where stderr must not carry keys.
//! - **Concurrent duplicates** get `409` with `Retry-After` (the holder's remaining lock time,
//!   at least one second, at most [`max_retry_after`](Idempotency::max_retry_after)), the draft's answer, at the cost of no extra store round trip.
//!   [`wait_for_result`](Idempotency::wait_for_result) makes them wait up to a bound and get the
//!   first request's response, which is what a webhook sender wants (it only sees `2xx` or a
//!   failure); waiting asks the store again with backoff.
//! - **A key in doubt** (under [`InDoubt::Hold`](idempotask::InDoubt::Hold): an earlier request
//!   whose server was killed or cut off mid-handler, so its lock ran out with neither a stored
//!   response nor a release) is `409` [`IN_DOUBT`](problem::IN_DOUBT) without `Retry-After`:
//!   no wait helps before an operator finds out whether the effect happened and resolves the
//!   key (`idempotask resolve`), after which a retry gets the recorded response, or runs. A
//!   `503` would have clients and webhook senders retry at once and for ever, as for any
//!   `5xx`, and a `410` would say the answer is final, which it is not. It differs from the
//!   other `409`, [`IN_PROGRESS`](problem::IN_PROGRESS), by its `type` and by having no
//!   `Retry-After`.
//! - **Responses over the cap** are sent whole to the first client and recorded as too large:
//!   a retry gets `410` rather than a truncated body, or a second execution. `410` is a `4xx`
//!   that clients do not retry; `409` would make them retry for ever.
//! - **Runs to completion.** The handler and the store's `finish` run on a task of their own
//!   (`tokio::spawn`): when the client disconnects, hyper drops the response future, and the
//!   handler still finishes its side effect and the response is stored for the retry.
//! - **Fail closed.** When the store cannot confirm the lock the handler does not run: `503`.
//! - **Cost.** A fresh request is one `begin` and one `finish` round trip to the store; a
//!   replay one `begin`. The request body is buffered (it is part of the fingerprint), up to
//!   [`max_request_body`](Idempotency::max_request_body).
//! - **Not stored:** `Set-Cookie` (unless [`store_cookies`](Idempotency::store_cookies)),
//!   trailers (the first response carries them, as far as the protocol does: HTTP/2, or an
//!   HTTP/1.1 chunked response to a client that sent `TE: trailers`; a replay has none),
//!   hop-by-hop headers (`Connection` and those it names,
//!   `Keep-Alive`, `Transfer-Encoding`, `TE`, `Trailer`, `Upgrade`, `Proxy-*`) and `Date`. The
//!   body is stored as text when it is UTF-8, else in base64.
//!
//! Every setting of the [`Task`](idempotask::Task) applies (lock TTL, result TTL: how long a retry gets the
//! stored response, key logging), but its retry policy, which the layer sets from
//! [`wait_for_result`](Idempotency::wait_for_result), and lock renewal, which the layer turns
//! on ([`lock_renewal`](Idempotency::lock_renewal)), in the handler's own task: the handler runs
//! detached, so no client timeout bounds it, and a lock that expired under a slow handler
//! would let a retry run it a second time.
//!
#![doc = include_str!("deployment.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod body;
mod fingerprint;
mod key;
mod layer;
pub mod problem;
mod responses;
mod service;
mod stored;

pub use body::{RequestBody, ResponseBody};
pub use fingerprint::BodyFingerprint;
pub use layer::{
    DEFAULT_MAX_KEY_LEN, DEFAULT_MAX_REQUEST_BODY, DEFAULT_MAX_RETRY_AFTER,
    DEFAULT_MAX_STORED_BODY, IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED, Idempotency, Retention,
    request_refused, stored_by_default,
};
pub use service::IdempotencyService;
