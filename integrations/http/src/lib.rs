//! The `Idempotency-Key` header for [tower](https://docs.rs/tower) services (axum, hyper, and
//! anything tower-based): each request runs at most once per key, and its retries get the stored
//! response, on every idempotask store.
//!
//! Clients retry a `POST /payments` after a timeout; webhook senders deliver each event at least
//! once. [`Idempotency`] is a tower [`Layer`](tower_layer::Layer) that runs each request
//! carrying a key through an idempotask [`Task`]: a lock so that two concurrent duplicates
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
//! Every setting of the [`Task`] applies (lock TTL, result TTL: how long a retry gets the
//! stored response, key logging), but its retry policy, which the layer sets from
//! [`wait_for_result`](Idempotency::wait_for_result), and lock renewal, which the layer turns
//! on ([`renew_lock`](Idempotency::renew_lock)): the handler runs detached, so no client
//! timeout bounds it, and a lock that expired under a slow handler would let a retry run it a
//! second time.
//!
#![doc = include_str!("deployment.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod body;
mod fingerprint;
mod key;
pub mod problem;
mod service;
mod stored;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderName, Method, StatusCode};
use idempotask::store::{SharedStore, Store};
use idempotask::{RetryPolicy, Task};

pub use body::{RequestBody, ResponseBody};
pub use fingerprint::BodyFingerprint;
pub use service::IdempotencyService;

use fingerprint::{BodyPart, Fingerprinting};

/// The header that carries the key by default: `Idempotency-Key`.
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
/// The header a replayed response carries: `Idempotent-Replayed: true` (Stripe's name).
pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");
/// The longest key accepted by default, in bytes (Stripe's limit).
pub const DEFAULT_MAX_KEY_LEN: usize = 255;
/// The largest request body buffered by default: 1 MiB.
pub const DEFAULT_MAX_REQUEST_BODY: usize = 1024 * 1024;
/// The longest `Retry-After` a `409` carries by default: 2 s.
pub const DEFAULT_MAX_RETRY_AFTER: Duration = Duration::from_secs(2);
/// The largest response body stored by default: 256 KiB.
pub const DEFAULT_MAX_STORED_BODY: usize = 256 * 1024;

type KeyFn = dyn Fn(&Parts, &Bytes) -> Option<String> + Send + Sync;
type ScopeFn = dyn Fn(&Parts) -> String + Send + Sync;
type StatusRule = dyn Fn(StatusCode) -> bool + Send + Sync;

/// Where the key comes from.
#[derive(Clone)]
enum KeySource {
    Header(HeaderName),
    Function(Arc<KeyFn>),
}

/// The layer: requests with an idempotency key run at most once per key, and their retries get
/// the stored response. See the [crate docs](crate) for what each outcome becomes.
///
/// ```
/// use std::time::Duration;
/// use http::Method;
/// use idempotask::Task;
/// use idempotask_http::{BodyFingerprint, Idempotency};
///
/// static PAYMENTS: Task = Task::new("payments").lock_ttl(Duration::from_secs(60));
///
/// let layer = Idempotency::new(PAYMENTS.clone())
///     .methods([Method::POST])
///     .require_key(true)
///     .scope(|request| {
///         let tenant = request.headers.get("x-tenant").and_then(|v| v.to_str().ok());
///         tenant.unwrap_or("").to_owned()
///     })
///     .fingerprint_body(BodyFingerprint::Json)
///     .wait_for_result(Duration::from_secs(10));
/// assert_eq!(layer.task().name(), "payments");
/// ```
#[derive(Clone)]
pub struct Idempotency {
    task: Task,
    store: Option<SharedStore>,
    methods: Vec<Method>,
    key: KeySource,
    scope: Option<Arc<ScopeFn>>,
    require_key: bool,
    max_key_len: usize,
    max_request_body: usize,
    max_stored_body: usize,
    wait: Option<Duration>,
    stores_status: Arc<StatusRule>,
    fingerprinting: Fingerprinting,
    renew: bool,
    store_cookies: bool,
    max_retry_after: Duration,
}

/// Whether a response with `status` is stored by default: below 500, except those that
/// [refuse the request as sent](request_refused). See the [crate docs](crate#decisions) for
/// why.
///
/// ```
/// use http::StatusCode;
/// use idempotask_http::stored_by_default;
/// assert!(stored_by_default(StatusCode::CREATED));
/// assert!(stored_by_default(StatusCode::PAYMENT_REQUIRED));
/// assert!(stored_by_default(StatusCode::CONFLICT));
/// assert!(!stored_by_default(StatusCode::UNSUPPORTED_MEDIA_TYPE));
/// assert!(!stored_by_default(StatusCode::UNPROCESSABLE_ENTITY));
/// assert!(!stored_by_default(StatusCode::TOO_MANY_REQUESTS));
/// assert!(!stored_by_default(StatusCode::SERVICE_UNAVAILABLE));
/// ```
pub fn stored_by_default(status: StatusCode) -> bool {
    !status.is_server_error() && !request_refused(status)
}

/// Whether `status` says that the request, as sent, was refused before it was processed, so
/// that nothing happened and the client is expected to send it again, corrected or later:
///
/// | status | the request |
/// | --- | --- |
/// | `400` Bad Request, `422` Unprocessable Content | does not parse, or is not what the endpoint reads (axum's `Json`, `Query`, `Path` and `Form` rejections, a handler's validation) |
/// | `401` Unauthorized | has no valid credentials |
/// | `405` Method Not Allowed, `406` Not Acceptable, `415` Unsupported Media Type | has a method, `Accept` or `Content-Type` the endpoint does not take |
/// | `408` Request Timeout, `429` Too Many Requests | was not read in time, or not taken now |
/// | `411` Length Required, `413` Content Too Large, `414` URI Too Long, `431` Request Header Fields Too Large | is framed or sized in a way the server does not take |
/// | `412` Precondition Failed, `428` Precondition Required | failed, or lacks, a precondition, which is checked before the method runs (RFC 9110 §13.2.2) |
///
/// Other `4xx` (`402`, `403`, `404`, `409`, `410`, …) answer about the state of things (a
/// card declined, an account without the right, a resource gone) and are results.
/// [`stored_by_default`] stores none of these; `store_when(|status| !request_refused(status))`
/// is Stripe's rule (every result, `5xx` included, but no request that failed validation).
///
/// ```
/// use http::StatusCode;
/// use idempotask_http::request_refused;
/// assert!(request_refused(StatusCode::UNSUPPORTED_MEDIA_TYPE));
/// assert!(!request_refused(StatusCode::PAYMENT_REQUIRED));
/// assert!(!request_refused(StatusCode::INTERNAL_SERVER_ERROR));
/// ```
pub fn request_refused(status: StatusCode) -> bool {
    matches!(
        status.as_u16(),
        400 | 401 | 405 | 406 | 408 | 411 | 412 | 413 | 414 | 415 | 422 | 428 | 429 | 431
    )
}

/// A handler's own word on whether its response is stored, put in the response's
/// extensions; it overrides the layer's rule ([`store_when`](Idempotency::store_when),
/// [`stored_by_default`]) for that response.
///
/// [`Keep`](Self::Keep) stores a response the rule releases: a `422` for a transfer the bank
/// was asked for and refused, whose retry must not ask again. [`Release`](Self::Release)
/// releases one the rule stores: a `409` that says "not now" before anything was done.
///
/// ```
/// use axum::{Extension, Router, http::StatusCode, routing::post};
/// use idempotask::{MemoryStore, Task};
/// use idempotask_http::{IDEMPOTENT_REPLAYED, Idempotency, Retention};
/// use tower::ServiceExt;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let app = Router::new()
///     .route("/transfers", post(|| async {
///         // The bank was asked and said no: this answer is the key's result.
///         (StatusCode::UNPROCESSABLE_ENTITY, Extension(Retention::Keep), "insufficient funds")
///     }))
///     .layer(Idempotency::new(Task::new("transfers")).store(MemoryStore::new()));
/// for replayed in [false, true] {
///     let request = http::Request::post("/transfers")
///         .header("idempotency-key", "t-1")
///         .body(axum::body::Body::empty())
///         .unwrap();
///     let response = app.clone().oneshot(request).await.unwrap();
///     assert_eq!(response.status(), 422);
///     assert_eq!(response.headers().contains_key(IDEMPOTENT_REPLAYED), replayed);
/// }
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Retention {
    /// The response is stored and replayed to every retry of its key.
    Keep,
    /// Nothing is stored and the key is released: a retry runs the handler again.
    Release,
}

impl Idempotency {
    /// Requests run through `task` (its name is where their keys live in the store), on the
    /// installed store, with the defaults of each setting below.
    ///
    /// **Set a [`scope`](Self::scope) whenever more than one client reaches the layer.** An
    /// unscoped layer gives a stored response to whoever sends its key again: two tenants who
    /// both send `order-42` with the same body get each other's body and `Location`.
    pub fn new(task: Task) -> Self {
        Self {
            task,
            store: None,
            methods: vec![Method::POST, Method::PATCH],
            key: KeySource::Header(IDEMPOTENCY_KEY),
            scope: None,
            require_key: false,
            max_key_len: DEFAULT_MAX_KEY_LEN,
            max_request_body: DEFAULT_MAX_REQUEST_BODY,
            max_stored_body: DEFAULT_MAX_STORED_BODY,
            wait: None,
            stores_status: Arc::new(stored_by_default),
            fingerprinting: Fingerprinting::default(),
            renew: true,
            store_cookies: false,
            max_retry_after: DEFAULT_MAX_RETRY_AFTER,
        }
    }

    /// Uses `store` instead of the installed one.
    #[must_use]
    pub fn store(mut self, store: impl Store) -> Self {
        self.store = Some(SharedStore::new(store));
        self
    }

    /// The methods whose requests go through the layer (default `POST` and `PATCH`).
    #[must_use]
    pub fn methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.methods = methods.into_iter().collect();
        self
    }

    /// Takes the key from the header `name` instead of `Idempotency-Key` (a webhook's delivery
    /// id: `X-GitHub-Delivery`, `X-Shopify-Webhook-Id`), read the same way.
    #[must_use]
    pub fn key_header(mut self, name: HeaderName) -> Self {
        self.key = KeySource::Header(name);
        self
    }

    /// Takes the key from a function of the request's head and its buffered body (`None`: the
    /// request has no key), instead of a header: a Stripe event's `id` in its JSON body.
    ///
    /// ```
    /// use idempotask_http::Idempotency;
    /// let layer = Idempotency::new(idempotask::Task::new("stripe_events")).key_fn(|_, body| {
    ///     let event: serde_json::Value = serde_json::from_slice(body).ok()?;
    ///     Some(event.get("id")?.as_str()?.to_owned())
    /// });
    /// # let _ = layer;
    /// ```
    #[must_use]
    pub fn key_fn(
        mut self,
        key: impl Fn(&Parts, &Bytes) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.key = KeySource::Function(Arc::new(key));
        self
    }

    /// Puts `scope(request)` (the tenant, the API key, the principal an outer layer
    /// authenticated) into the stored key, so equal keys of two scopes are two operations. The
    /// scope is stored as its SHA-256, so its length does not count against the key's limit
    /// and it is not logged in clear.
    #[must_use]
    pub fn scope(mut self, scope: impl Fn(&Parts) -> String + Send + Sync + 'static) -> Self {
        self.scope = Some(Arc::new(scope));
        self
    }

    /// Whether a covered request without a key is refused with `400` (default: it passes
    /// through and runs unprotected).
    #[must_use]
    pub fn require_key(mut self, required: bool) -> Self {
        self.require_key = required;
        self
    }

    /// The longest key accepted, in bytes (default [`DEFAULT_MAX_KEY_LEN`]).
    #[must_use]
    pub fn max_key_len(mut self, len: usize) -> Self {
        self.max_key_len = len;
        self
    }

    /// The largest request body buffered (default [`DEFAULT_MAX_REQUEST_BODY`]); a larger one is
    /// `413` and does not run.
    #[must_use]
    pub fn max_request_body(mut self, bytes: usize) -> Self {
        self.max_request_body = bytes;
        self
    }

    /// The largest response body stored (default [`DEFAULT_MAX_STORED_BODY`]). A larger response
    /// is sent, and its retries get `410` instead of running again.
    #[must_use]
    pub fn max_stored_body(mut self, bytes: usize) -> Self {
        self.max_stored_body = bytes;
        self
    }

    /// Makes a duplicate that arrives while the first request runs wait up to `bound` for its
    /// response (instead of `409` at once); `409` after that.
    #[must_use]
    pub fn wait_for_result(mut self, bound: Duration) -> Self {
        self.wait = Some(bound);
        self
    }

    /// Which responses are stored, by status (default [`stored_by_default`]); the others
    /// release the key so that a retry runs again. A handler's [`Retention`] in its response
    /// overrides the rule.
    ///
    /// ```
    /// use idempotask_http::{Idempotency, request_refused};
    /// // Stripe's rule: every result, 5xx included, but no request refused as sent.
    /// let stripe = Idempotency::new(idempotask::Task::new("t"))
    ///     .store_when(|status| !request_refused(status));
    /// // The draft's letter: every response, a malformed request's too.
    /// let draft = Idempotency::new(idempotask::Task::new("t")).store_when(|_| true);
    /// # let _ = (stripe, draft);
    /// ```
    #[must_use]
    pub fn store_when(mut self, rule: impl Fn(StatusCode) -> bool + Send + Sync + 'static) -> Self {
        self.stores_status = Arc::new(rule);
        self
    }

    /// Adds the values of `headers` to the fingerprint (a `Content-Type`, an API version).
    #[must_use]
    pub fn fingerprint_headers(mut self, headers: impl IntoIterator<Item = HeaderName>) -> Self {
        self.fingerprinting.headers = headers.into_iter().collect();
        self
    }

    /// What of the body goes into the fingerprint (default [`BodyFingerprint::Bytes`]).
    #[must_use]
    pub fn fingerprint_body(mut self, body: BodyFingerprint) -> Self {
        self.fingerprinting.body = BodyPart::Fixed(body);
        self
    }

    /// Makes `read(request, body)` the body's part of the fingerprint, in place of
    /// [`fingerprint_body`](Self::fingerprint_body): the fields that make the operation what
    /// it is, whatever else a retry changes (a client's send time, a sender's attempt count).
    /// Method, path, query and the [chosen headers](Self::fingerprint_headers) still count.
    ///
    /// `None` (a body it cannot read) refuses the request with `400`
    /// [`BODY_INVALID`](problem::BODY_INVALID) before anything is stored, so such a request
    /// neither runs nor takes the key.
    ///
    /// Read the fields into their own types, as the handler does: a `serde_json::Value` holds
    /// a number beyond 64-bit integers as a float, and two amounts would be one.
    ///
    /// ```
    /// use idempotask::Fingerprint;
    /// use idempotask_http::Idempotency;
    ///
    /// // Only the amount and the currency make a payment; `sent_at` changes on every retry.
    /// #[derive(serde::Deserialize, serde::Serialize)]
    /// struct Payment {
    ///     amount: u128,
    ///     currency: String,
    /// }
    /// let layer = Idempotency::new(idempotask::Task::new("payments")).fingerprint_body_with(
    ///     |_, body| {
    ///         let payment: Payment = serde_json::from_slice(body).ok()?;
    ///         Fingerprint::of(&payment).ok()
    ///     },
    /// );
    /// # let _ = layer;
    /// ```
    #[must_use]
    pub fn fingerprint_body_with(
        mut self,
        read: impl Fn(&Parts, &Bytes) -> Option<idempotask::Fingerprint> + Send + Sync + 'static,
    ) -> Self {
        self.fingerprinting.body = BodyPart::Function(Arc::new(read));
        self
    }

    /// Whether the lock is renewed while the handler runs (default on, whatever the task's own
    /// [`Task::renew`] says).
    ///
    /// The handler runs detached to completion (a client timeout no longer bounds it), so a
    /// handler slower than the lock TTL (a gateway call that hangs) would otherwise let the
    /// lock expire and a retry run it a second time while the first still runs. Turn renewal
    /// off only for handlers you know finish well within the lock TTL.
    ///
    /// What it costs: each poll of a renewed handler is handed to another thread and back
    /// ([`Task::renew`] says why), so that a handler that blocks its thread does not stop the
    /// renewal. For a handler polled twice (one await), that was 31 µs of server CPU per fresh
    /// request, 55 µs against 24 µs without renewal, in `scripts/bench-http.sh` on a 2-core
    /// machine (see docs/performance-http.md); replays do not run the handler and cost the same
    /// either way.
    #[must_use]
    pub fn renew_lock(mut self, renew: bool) -> Self {
        self.renew = renew;
        self
    }

    /// The longest `Retry-After` of a `409` (default [`DEFAULT_MAX_RETRY_AFTER`], at least 1 s).
    /// It is the holder's remaining lock time, capped: that time bounds the wait, but a handler
    /// of milliseconds under a 30 s lock would otherwise make clients wait 30 s.
    #[must_use]
    pub fn max_retry_after(mut self, cap: Duration) -> Self {
        self.max_retry_after = cap;
        self
    }

    /// Whether `Set-Cookie` headers are stored and replayed (default off).
    ///
    /// A replay goes to whoever sends the key again: a cookie stored with it (a session) is
    /// handed to that client. Turn this on only with a [`scope`](Self::scope) that is the
    /// authenticated principal.
    #[must_use]
    pub fn store_cookies(mut self, store: bool) -> Self {
        self.store_cookies = store;
        self
    }

    /// The task requests run through.
    pub fn task(&self) -> &Task {
        &self.task
    }

    /// The task as the service runs it: with the retry policy that `wait` implies.
    fn running_task(&self) -> Task {
        let policy = match self.wait {
            None => RetryPolicy::no_wait(),
            Some(bound) => RetryPolicy::new()
                .max_attempts(u32::MAX)
                .max_backoff(Duration::from_millis(250))
                .max_wait(bound),
        };
        self.task.clone().retry(policy).renew(self.renew)
    }
}

impl fmt::Debug for Idempotency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Idempotency")
            .field("task", &self.task.name())
            .field("store", &self.store.as_ref().map(|_| "own store"))
            .field("methods", &self.methods)
            .field(
                "key",
                &match &self.key {
                    KeySource::Header(name) => name.as_str(),
                    KeySource::Function(_) => "a function",
                },
            )
            .field("require_key", &self.require_key)
            .field("wait", &self.wait)
            .field("renew", &self.renew)
            .finish_non_exhaustive()
    }
}

impl<S> tower_layer::Layer<S> for Idempotency {
    type Service = IdempotencyService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        let mut config = self.clone();
        config.task = self.running_task();
        IdempotencyService::new(inner, Arc::new(config))
    }
}
