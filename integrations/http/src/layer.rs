//! The layer and its settings: [`Idempotency`], the headers and defaults it starts from, and
//! the rules that decide which responses are stored.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderName, Method, StatusCode};
use idempotask::store::{SharedStore, Store};
use idempotask::{LockRenewal, RetryPolicy, Task};

use crate::fingerprint::{BodyFingerprint, BodyPart, Fingerprinting};

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
pub(crate) enum KeySource {
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
    pub(crate) task: Task,
    pub(crate) store: Option<SharedStore>,
    pub(crate) methods: Vec<Method>,
    pub(crate) key: KeySource,
    pub(crate) scope: Option<Arc<ScopeFn>>,
    pub(crate) require_key: bool,
    pub(crate) max_key_len: usize,
    pub(crate) max_request_body: usize,
    pub(crate) max_stored_body: usize,
    pub(crate) wait: Option<Duration>,
    pub(crate) stores_status: Arc<StatusRule>,
    pub(crate) fingerprinting: Fingerprinting,
    pub(crate) renewal: LockRenewal,
    pub(crate) store_cookies: bool,
    pub(crate) max_retry_after: Duration,
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
            renewal: LockRenewal::InTask,
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
    /// [`BODY_INVALID`](crate::problem::BODY_INVALID) before anything is stored, so such a request
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

    /// Whether and how the lock is renewed while the handler runs (default
    /// [`LockRenewal::InTask`], whatever the task's own [`Task::lock_renewal`] says).
    ///
    /// The handler runs detached to completion (a client timeout no longer bounds it), so a
    /// handler slower than the lock TTL (a gateway call that hangs) would otherwise let the
    /// lock expire and a retry run it a second time while the first still runs.
    /// Choose [`LockRenewal::Off`] only for handlers you know finish well within the lock TTL.
    ///
    /// By default the renewals run in the handler's own task, next to it: no task of their own
    /// and no hand-off per poll, so a renewed request costs about what an unrenewed one does.
    /// A handler that blocks its thread (a synchronous call) stops them while it blocks, as it
    /// stalls every other request of its worker. [`LockRenewal::Watchdog`] holds the lock
    /// through such a handler: a watchdog task of its own renews it, and each poll of the
    /// handler is handed to another thread and back so that the blocking cannot stop it.
    ///
    /// What the watchdog costs: for a handler polled twice (one await), 129 µs of server CPU
    /// per fresh request against 77 µs with renewal in the handler's task and 69 µs without
    /// renewal, in one run of `scripts/bench-http.sh` on a 2-core machine (see
    /// docs/performance-http.md); replays do not run the handler and cost the same either way.
    /// Better: move the blocking work to `tokio::task::spawn_blocking` and keep the default.
    ///
    /// ```
    /// use idempotask::{LockRenewal, Task};
    /// use idempotask_http::Idempotency;
    ///
    /// let layer = Idempotency::new(Task::new("import")).lock_renewal(LockRenewal::Watchdog);
    /// assert_eq!(layer.renewal(), LockRenewal::Watchdog);
    /// ```
    #[must_use]
    pub fn lock_renewal(mut self, renewal: LockRenewal) -> Self {
        self.renewal = renewal;
        self
    }

    /// How the lock of a running handler is renewed: what
    /// [`lock_renewal`](Self::lock_renewal) set.
    pub fn renewal(&self) -> LockRenewal {
        self.renewal
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
    pub(crate) fn running_task(&self) -> Task {
        let policy = match self.wait {
            None => RetryPolicy::no_wait(),
            Some(bound) => RetryPolicy::new()
                .max_attempts(u32::MAX)
                .max_backoff(Duration::from_millis(250))
                .max_wait(bound),
        };
        self.task.clone().retry(policy).lock_renewal(self.renewal)
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
            .field("renewal", &self.renewal)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use idempotask::{LockRenewal, Task};

    use super::Idempotency;

    #[test]
    fn the_task_the_layer_runs_renews_as_the_layer_says_whatever_the_task_said() {
        let layer = |task: Task| Idempotency::new(task);
        let renewal = |layer: Idempotency| layer.running_task().settings().renewal;
        assert_eq!(renewal(layer(Task::new("pay"))), LockRenewal::InTask);
        assert_eq!(
            renewal(layer(Task::new("pay").renew(true))),
            LockRenewal::InTask
        );
        for how in [LockRenewal::Off, LockRenewal::Watchdog, LockRenewal::InTask] {
            assert_eq!(renewal(layer(Task::new("pay")).lock_renewal(how)), how);
        }
    }
}
