//! The service that runs each keyed request through the task, and what each outcome answers.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body::Body;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use idempotask::{CodecErrorKind, Error, Fingerprint, KeyLogging, Outcome};
use tower_service::Service;

use crate::body::{RequestBody, ResponseBody};
use crate::fingerprint::BodyRefused;
use crate::key::{self, Refusal};
use crate::problem::{self, Problem};
use crate::stored::{Marker, Stored, StoredResponse};
use crate::{IDEMPOTENT_REPLAYED, Idempotency, KeySource, Retention};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A service whose keyed requests run at most once per key; made by [`Idempotency`].
///
/// It takes any `http::Request<B>` whose body yields [`Bytes`], and hands the wrapped
/// service a [`RequestBody<B>`]; its responses carry a [`ResponseBody`] around the wrapped
/// service's body. Its error is the wrapped service's (`Infallible` for axum).
pub struct IdempotencyService<S> {
    inner: S,
    config: Arc<Idempotency>,
}

impl<S> IdempotencyService<S> {
    pub(crate) fn new(inner: S, config: Arc<Idempotency>) -> Self {
        Self { inner, config }
    }
}

impl<S: Clone> Clone for IdempotencyService<S> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            config: Arc::clone(&self.config),
        }
    }
}

impl<S> fmt::Debug for IdempotencyService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyService")
            .field("config", &self.config)
            .field("inner", &std::any::type_name::<S>())
            .finish()
    }
}

type Answer<R, E> = Result<Response<ResponseBody<R>>, E>;

impl<S, B, R> Service<Request<B>> for IdempotencyService<S>
where
    S: Service<Request<RequestBody<B>>, Response = Response<R>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Send + 'static,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
    R: Body<Data = Bytes> + Send + 'static,
    R::Error: Send,
{
    type Response = Response<ResponseBody<R>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Answer<R, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        // The instance that `poll_ready` prepared is the one that serves, as tower requires.
        let ready = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, ready);
        Box::pin(handle(Arc::clone(&self.config), inner, request))
    }
}

/// Input: a request. Output: the wrapped service's answer, the stored one, or a problem.
async fn handle<S, B, R>(
    config: Arc<Idempotency>,
    inner: S,
    request: Request<B>,
) -> Answer<R, S::Error>
where
    S: Service<Request<RequestBody<B>>, Response = Response<R>> + Send + 'static,
    S::Future: Send,
    S::Error: Send + 'static,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
    R: Body<Data = Bytes> + Send + 'static,
    R::Error: Send,
{
    if !config.methods.contains(request.method()) {
        return pass(inner, request.map(RequestBody::streaming)).await;
    }
    let mut header_key = None;
    if let KeySource::Header(name) = &config.key {
        match key::from_header(&request.headers().get_all(name), config.max_key_len) {
            Ok(Some(key)) => header_key = Some(key),
            Ok(None) if config.require_key => return Ok(missing_key(&config.key)),
            Ok(None) => return pass(inner, request.map(RequestBody::streaming)).await,
            Err(refusal) => return Ok(invalid_key(refusal)),
        }
    }
    let (parts, body) = request.into_parts();
    // A body that declares itself over the limit (its Content-Length) is refused before a byte
    // of it is read; `Limited` catches the ones that do not say.
    if body.size_hint().lower() > config.max_request_body as u64 {
        return Ok(body_too_large(config.max_request_body));
    }
    let body = match Limited::new(body, config.max_request_body).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(err) if err.downcast_ref::<LengthLimitError>().is_some() => {
            return Ok(body_too_large(config.max_request_body));
        }
        Err(err) => {
            return Ok(problem(Problem::new(
                StatusCode::BAD_REQUEST,
                problem::BODY_UNREADABLE,
                "Request body unreadable",
                format!("the request body could not be read: {err}"),
            )));
        }
    };
    let key = match (header_key, &config.key) {
        (Some(key), _) => key,
        (None, KeySource::Function(key_of)) => match key_of(&parts, &body) {
            Some(key) => match key::checked(key, config.max_key_len) {
                Ok(key) => key,
                Err(refusal) => return Ok(invalid_key(refusal)),
            },
            None if config.require_key => return Ok(missing_key(&config.key)),
            None => {
                let request = Request::from_parts(parts, RequestBody::buffered(body));
                return pass(inner, request).await;
            }
        },
        (None, KeySource::Header(_)) => unreachable!("a missing header key returned above"),
    };
    let scope = config.scope.as_ref().map(|scope| scope(&parts));
    let stored_key = key::scoped(scope.as_deref(), key);
    let fingerprint = match config.fingerprinting.of(&parts, &body) {
        Ok(fingerprint) => fingerprint,
        Err(BodyRefused) => {
            return Ok(problem(Problem::new(
                StatusCode::BAD_REQUEST,
                problem::BODY_INVALID,
                "Request body invalid",
                "the request body is not one this endpoint reads",
            )));
        }
    };
    let request = Request::from_parts(parts, RequestBody::buffered(body));
    // On a task of its own, so that a client that goes away (hyper then drops this future)
    // does not stop the handler halfway through its side effect, nor keep its response from
    // being stored for the retry.
    let runtime = match tokio::runtime::Handle::try_current() {
        Ok(runtime) => runtime,
        Err(err) => return Ok(misconfigured(&err)),
    };
    let handler_panicked = HandlerPanics::default();
    let running = runtime.spawn(execute(
        Arc::clone(&config),
        inner,
        stored_key,
        fingerprint,
        request,
        handler_panicked.clone(),
    ));
    match running.await {
        Ok(answer) => answer,
        Err(err) if err.is_panic() => Ok(panicked(
            &config.task,
            handler_panicked.seen(),
            &*err.into_panic(),
        )),
        Err(_) => Ok(problem(
            Problem::new(
                StatusCode::SERVICE_UNAVAILABLE,
                problem::SHUTTING_DOWN,
                "Shutting down",
                "the server is shutting down; retry with the same key",
            )
            .retry_after(1),
        )),
    }
}

/// Whether a panic unwound out of the handler's code (its service's `call`, its future, its
/// response body), as opposed to the layer's or the core's code around it.
#[derive(Clone, Default)]
struct HandlerPanics(Arc<AtomicBool>);

impl HandlerPanics {
    /// Runs `handler_code`, noting a panic that unwinds out of it. Only a panic raised inside it
    /// passes through this frame: one raised by the code around it while the handler's future
    /// is merely alive does not.
    fn watch<T>(&self, handler_code: impl FnOnce() -> T) -> T {
        struct Spy<'a>(&'a AtomicBool);
        impl Drop for Spy<'_> {
            fn drop(&mut self) {
                if std::thread::panicking() {
                    self.0.store(true, Ordering::Relaxed);
                }
            }
        }
        let _spy = Spy(&self.0);
        handler_code()
    }

    /// `future`, each of its polls watched.
    async fn watched<F: Future>(&self, future: F) -> F::Output {
        let mut future = std::pin::pin!(future);
        std::future::poll_fn(|cx| self.watch(|| future.as_mut().poll(cx))).await
    }

    fn seen(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// The answer when processing the request panicked: in the handler, or in the layer's or the
/// core's code around it (`in_handler` says which). The core releases the key of a body that
/// panics and stores nothing. The client gets an answer rather than a connection closed under
/// it (what resuming the panic would do), and not the panic's message, which may hold anything
/// the handler had. The log gets the message only when the task's
/// [`KeyLogging`] lets keys be logged: the message may hold the key, which
/// [`KeyLogging::Hash`] keeps out of every log.
fn panicked<R: Body<Data = Bytes>>(
    task: &idempotask::Task,
    in_handler: bool,
    panic: &(dyn std::any::Any + Send),
) -> Response<ResponseBody<R>> {
    let message = panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a panic without a message");
    let what = if in_handler {
        "idempotask-http: the handler panicked; nothing is stored and the key is released"
    } else {
        "idempotask-http: processing the request panicked outside the handler; a retry runs it again unless its response was stored"
    };
    // Only `Plain` lets keys into the log; `Hash`, or a later setting, keeps the message out,
    // since it may hold the key.
    if task.settings().log_key == KeyLogging::Plain {
        tracing::error!(task = task.name(), panic = message, "{what}");
    } else {
        tracing::error!(
            task = task.name(),
            panic = "not logged: the task's log_key keeps keys out of the log, and the panic's message may hold one",
            "{what}"
        );
    }
    let (title, detail) = if in_handler {
        (
            "Handler panicked",
            "the request's handler panicked on the server; nothing was stored for its key, so a retry with the same key runs it again",
        )
    } else {
        (
            "Request processing panicked",
            "processing the request panicked on the server; a retry with the same key runs it again, or gets its stored response if it was stored",
        )
    };
    problem(Problem::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        problem::HANDLER_PANICKED,
        title,
        detail,
    ))
}

/// The request as it came, to the wrapped service, outside the layer's protection.
async fn pass<S, B, R>(mut inner: S, request: Request<RequestBody<B>>) -> Answer<R, S::Error>
where
    S: Service<Request<RequestBody<B>>, Response = Response<R>>,
    R: Body<Data = Bytes>,
{
    Ok(inner.call(request).await?.map(ResponseBody::inner))
}

/// What the handler produced, kept aside while the task stores what it stores.
enum Produced<R: Body> {
    Whole(http::response::Parts, Bytes, Option<HeaderMap>),
    Resumed(http::response::Parts, Bytes, Pin<Box<R>>),
    Failed(http::response::Parts, Bytes, R::Error),
}

impl<R: Body<Data = Bytes>> Produced<R> {
    fn into_response(self) -> Response<ResponseBody<R>> {
        match self {
            Self::Whole(parts, bytes, trailers) => {
                Response::from_parts(parts, ResponseBody::full_with(bytes, trailers))
            }
            Self::Resumed(parts, prefix, rest) => {
                Response::from_parts(parts, ResponseBody::resumed(prefix, rest))
            }
            Self::Failed(parts, prefix, error) => {
                Response::from_parts(parts, ResponseBody::failed(prefix, error))
            }
        }
    }
}

/// Why the task's body stored nothing.
enum Failure<E> {
    /// The wrapped service failed; its error goes back as it is.
    Service(E),
    /// The response is not one to store (a `5xx`, a body that failed): the key is released.
    NotStored,
    Idempotask(Error),
}

impl<E> From<Error> for Failure<E> {
    fn from(err: Error) -> Self {
        Self::Idempotask(err)
    }
}

/// Input: a keyed request. Output: the answer, once the handler's response is stored (or the
/// stored one read back).
async fn execute<S, B, R>(
    config: Arc<Idempotency>,
    mut inner: S,
    key: String,
    fingerprint: Fingerprint,
    request: Request<RequestBody<B>>,
    handler_panics: HandlerPanics,
) -> Answer<R, S::Error>
where
    S: Service<Request<RequestBody<B>>, Response = Response<R>>,
    R: Body<Data = Bytes>,
{
    let mut call = config.task.call(key).fingerprint(fingerprint);
    if let Some(store) = &config.store {
        call = call.store(store.clone());
    }
    let mut produced: Option<Produced<R>> = None;
    let body = async {
        let called = handler_panics.watch(|| inner.call(request));
        let response = handler_panics
            .watched(called)
            .await
            .map_err(Failure::Service)?;
        let (parts, body) = response.into_parts();
        // The handler's own word first, then the layer's rule.
        let stores = match parts.extensions.get::<Retention>() {
            Some(Retention::Keep) => true,
            Some(Retention::Release) => false,
            None => (config.stores_status)(parts.status),
        };
        let (value, kept) = match collect(body, config.max_stored_body, &handler_panics).await {
            Collected::Whole(bytes, trailers) => (
                Stored::Response(StoredResponse::of(
                    parts.status,
                    &parts.headers,
                    &bytes,
                    config.store_cookies,
                )),
                Produced::Whole(parts, bytes, trailers),
            ),
            Collected::Over(prefix, rest) => (
                Stored::TooLarge {
                    status: parts.status.as_u16(),
                    limit: config.max_stored_body,
                },
                Produced::Resumed(parts, prefix, rest),
            ),
            Collected::Failed(prefix, error) => {
                produced = Some(Produced::Failed(parts, prefix, error));
                return Err(Failure::NotStored);
            }
        };
        produced = Some(kept);
        if stores {
            Ok(Marker::new(value))
        } else {
            Err(Failure::NotStored)
        }
    };
    let result = call.run_reported(body).await;
    match result {
        Ok(report) if report.outcome == Outcome::Replayed => Ok(replay(report.value)),
        Ok(report) if report.outcome != Outcome::Executed => {
            // The response is still the answer (the side effect happened), but a retry after
            // the lock TTL may run the handler again: the operator should know.
            tracing::warn!(
                task = config.task.name(),
                outcome = ?report.outcome,
                "idempotask-http: the response was sent but may not be replayed; a retry after the lock TTL may run the handler again"
            );
            Ok(produced.map_or_else(
                || misconfigured(&"the handler's response went missing"),
                Produced::into_response,
            ))
        }
        Ok(_) | Err(Failure::NotStored) => Ok(produced.map_or_else(
            || misconfigured(&"the handler's response went missing"),
            Produced::into_response,
        )),
        Err(Failure::Service(err)) => Err(err),
        Err(Failure::Idempotask(err)) => Ok(refused(&err, config.max_retry_after)),
    }
}

/// A response body, read up to the storage cap.
enum Collected<R: Body> {
    /// The whole body, and its trailers if it had any (sent on, not stored).
    Whole(Bytes, Option<HeaderMap>),
    /// Over the cap: the part read, and the rest still to stream.
    Over(Bytes, Pin<Box<R>>),
    /// The body failed after the part read.
    Failed(Bytes, R::Error),
}

/// Reads `body`, the handler's, watching its polls for panics.
async fn collect<R: Body<Data = Bytes>>(
    body: R,
    cap: usize,
    handler_panics: &HandlerPanics,
) -> Collected<R> {
    let mut rest = Box::pin(body);
    let mut read = Gathered::default();
    if rest.size_hint().lower() > cap as u64 {
        return Collected::Over(read.into_bytes(), rest);
    }
    let mut trailers: Option<HeaderMap> = None;
    loop {
        match handler_panics.watched(rest.frame()).await {
            None => return Collected::Whole(read.into_bytes(), trailers),
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => {
                    read.push(data);
                    if read.len() > cap {
                        return Collected::Over(read.into_bytes(), rest);
                    }
                }
                // Trailers go on with the first response, and are not stored (see the crate
                // docs).
                Err(frame) => {
                    if let Ok(more) = frame.into_trailers() {
                        let kept = trailers.get_or_insert_with(HeaderMap::new);
                        // Appended, not `extend`ed: a later frame must not replace a value.
                        for (name, value) in &more {
                            kept.append(name, value.clone());
                        }
                    }
                }
            },
            Some(Err(error)) => return Collected::Failed(read.into_bytes(), error),
        }
    }
}

/// A body's data frames, read one after the other: a body of one frame (the usual answer of a
/// handler) is kept as it came, without a copy.
#[derive(Default)]
struct Gathered {
    first: Bytes,
    more: Option<BytesMut>,
}

impl Gathered {
    fn push(&mut self, data: Bytes) {
        match &mut self.more {
            Some(more) => more.extend_from_slice(&data),
            None if self.first.is_empty() => self.first = data,
            None => {
                let mut more = BytesMut::with_capacity(self.first.len() + data.len());
                more.extend_from_slice(&self.first);
                more.extend_from_slice(&data);
                self.more = Some(more);
            }
        }
    }

    fn len(&self) -> usize {
        self.more.as_ref().map_or(self.first.len(), BytesMut::len)
    }

    fn into_bytes(self) -> Bytes {
        self.more.map_or(self.first, BytesMut::freeze)
    }
}

/// The answer to a retry of a request whose response was stored.
fn replay<R: Body<Data = Bytes>>(marker: Marker) -> Response<ResponseBody<R>> {
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
fn refused<R: Body<Data = Bytes>>(err: &Error, cap: Duration) -> Response<ResponseBody<R>> {
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

fn problem<R: Body<Data = Bytes>>(problem: Problem) -> Response<ResponseBody<R>> {
    problem.into_response().map(ResponseBody::full)
}

fn body_too_large<R: Body<Data = Bytes>>(limit: usize) -> Response<ResponseBody<R>> {
    problem(Problem::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        problem::BODY_TOO_LARGE,
        "Request body too large",
        format!("requests with an idempotency key are buffered up to {limit} bytes"),
    ))
}

fn missing_key<R: Body<Data = Bytes>>(source: &KeySource) -> Response<ResponseBody<R>> {
    problem(Problem::new(
        StatusCode::BAD_REQUEST,
        problem::MISSING_KEY,
        "Idempotency key missing",
        missing_key_detail(source),
    ))
}

/// What a request without a key lacks, in the terms of where this layer takes its key from.
fn missing_key_detail(source: &KeySource) -> String {
    match source {
        KeySource::Header(name) => {
            format!("this request requires an idempotency key in its {name} header")
        }
        KeySource::Function(_) => {
            "this request requires an idempotency key, and none was found in it".to_owned()
        }
    }
}

fn invalid_key<R: Body<Data = Bytes>>(detail: Refusal) -> Response<ResponseBody<R>> {
    problem(Problem::new(
        StatusCode::BAD_REQUEST,
        problem::INVALID_KEY,
        "Idempotency key invalid",
        detail,
    ))
}

// 410, not 500: clients and webhook senders retry a 5xx for ever, and this one is final for
// the key's result TTL.
fn unreadable<R: Body<Data = Bytes>>(reason: &str) -> Response<ResponseBody<R>> {
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
fn misconfigured<R: Body<Data = Bytes>>(
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
const MISCONFIGURED_DETAIL: &str =
    "nothing ran: the idempotency layer is misconfigured; the server's log says how";

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::task::{Context, Poll, Wake, Waker};

    use axum::Router;
    use axum::routing::post;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    use crate::{Idempotency, problem};

    use super::{Bytes, Gathered};

    #[test]
    fn a_body_of_one_frame_is_kept_as_it_came_and_of_several_joined() {
        let frame = Bytes::from(vec![b'a'; 100]);
        let mut one = Gathered::default();
        one.push(frame.clone());
        assert_eq!(one.len(), 100);
        // The same buffer: no copy of a whole body.
        assert_eq!(one.into_bytes().as_ptr(), frame.as_ptr());
        let mut several = Gathered::default();
        for part in ["{\"id\":", "\"ch_1\"", "", "}"] {
            several.push(Bytes::from_static(part.as_bytes()));
        }
        assert_eq!(several.len(), 13);
        assert_eq!(
            several.into_bytes(),
            Bytes::from_static(b"{\"id\":\"ch_1\"}")
        );
        let mut empty_first = Gathered::default();
        empty_first.push(Bytes::new());
        empty_first.push(Bytes::from_static(b"x"));
        assert_eq!(empty_first.into_bytes(), Bytes::from_static(b"x"));
    }

    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }

    /// Polls `future` to its end on this thread, with no tokio runtime around it.
    fn block_on<F: std::future::Future>(future: F) -> F::Output {
        let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
        let mut context = Context::from_waker(&waker);
        let mut future = std::pin::pin!(future);
        loop {
            match future.as_mut().poll(&mut context) {
                Poll::Ready(output) => return output,
                Poll::Pending => std::thread::park(),
            }
        }
    }

    fn keyed(key: &str) -> http::Request<axum::body::Body> {
        http::Request::post("/p")
            .header("idempotency-key", key)
            .body(axum::body::Body::from("1 EUR"))
            .unwrap()
    }

    #[test]
    fn a_missing_key_names_where_the_key_is_taken_from() {
        let github = crate::KeySource::Header(http::HeaderName::from_static("x-github-delivery"));
        assert!(super::missing_key_detail(&github).contains("x-github-delivery"));
        let by_body = crate::KeySource::Function(Arc::new(|_, _| None));
        assert!(!super::missing_key_detail(&by_body).contains("header"));
    }

    /// A body that says it is a gigabyte long and never sends a byte.
    struct Declared;
    impl http_body::Body for Declared {
        type Data = bytes::Bytes;
        type Error = std::convert::Infallible;
        fn poll_frame(
            self: std::pin::Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
            Poll::Pending
        }
        fn size_hint(&self) -> http_body::SizeHint {
            http_body::SizeHint::with_exact(1 << 30)
        }
    }

    #[tokio::test]
    async fn a_body_declared_over_the_limit_is_refused_before_it_is_read() {
        let app = Router::new()
            .route("/p", post(|| async { "ran" }))
            .layer(Idempotency::new(idempotask::Task::new("declared")).max_request_body(64));
        let request = http::Request::post("/p")
            .header("idempotency-key", "k")
            .body(axum::body::Body::new(Declared))
            .unwrap();
        let answered =
            tokio::time::timeout(std::time::Duration::from_secs(30), app.oneshot(request));
        let response = answered.await.expect("refused without reading").unwrap();
        assert_eq!(response.status(), 413);
    }

    #[test]
    fn outside_a_tokio_runtime_is_misconfigured_not_a_panic() {
        let app = Router::new()
            .route("/p", post(|| async { "ran" }))
            .layer(Idempotency::new(idempotask::Task::new("no_runtime")));
        let response = block_on(app.oneshot(keyed("k"))).unwrap();
        assert_eq!(response.status(), 500);
        let body = block_on(response.into_body().collect()).unwrap().to_bytes();
        let document: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(document["type"], problem::MISCONFIGURED);
        assert_eq!(document["detail"], super::MISCONFIGURED_DETAIL);
    }

    #[tokio::test]
    async fn a_misconfiguration_is_told_in_fixed_text() {
        // No store given and none installed: the core's error names the task; the client
        // gets the fixed text only.
        let app = Router::new()
            .route("/p", post(|| async { "ran" }))
            .layer(Idempotency::new(idempotask::Task::new("secret_task_name")));
        let response = app.oneshot(keyed("k")).await.unwrap();
        assert_eq!(response.status(), 500);
        let body = response.into_body().collect().await.unwrap().to_bytes();
        let document: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(document["type"], problem::MISCONFIGURED);
        assert_eq!(document["detail"], super::MISCONFIGURED_DETAIL);
    }

    /// Every event's and span's fields as text, for the thread that sets it as its default.
    #[derive(Clone, Default)]
    struct Logged(Arc<std::sync::Mutex<String>>);

    impl Logged {
        fn text(&self) -> String {
            self.0.lock().unwrap().clone()
        }
    }

    struct Fields<'a>(&'a mut String);

    impl tracing::field::Visit for Fields<'_> {
        fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
            use std::fmt::Write as _;
            let _ = write!(self.0, "{}={value:?} ", field.name());
        }
    }

    impl tracing::Subscriber for Logged {
        fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, span: &tracing::span::Attributes<'_>) -> tracing::span::Id {
            span.record(&mut Fields(&mut self.0.lock().unwrap()));
            tracing::span::Id::from_u64(1)
        }
        fn record(&self, _: &tracing::span::Id, values: &tracing::span::Record<'_>) {
            values.record(&mut Fields(&mut self.0.lock().unwrap()));
        }
        fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
        fn event(&self, event: &tracing::Event<'_>) {
            let mut logged = self.0.lock().unwrap();
            event.record(&mut Fields(&mut logged));
            logged.push('\n');
        }
        fn enter(&self, _: &tracing::span::Id) {}
        fn exit(&self, _: &tracing::span::Id) {}
    }

    /// A handler whose panic names the request's key, as one that formats its input does.
    async fn panics_with_the_key() -> &'static str {
        panic!("the card of jane@example.com was declined")
    }

    /// The problem document and everything logged when the handler of a task logging keys as
    /// `log_key` says panics.
    async fn a_panic_logged_with(log_key: idempotask::KeyLogging) -> (serde_json::Value, String) {
        let logged = Logged::default();
        // The test's runtime has one thread, which the request's task runs on too.
        let _default = tracing::subscriber::set_default(logged.clone());
        let app = Router::new().route("/p", post(panics_with_the_key)).layer(
            Idempotency::new(idempotask::Task::new("panicky_logged").log_key(log_key))
                .store(idempotask::MemoryStore::new()),
        );
        let response = app.oneshot(keyed("jane@example.com")).await.unwrap();
        assert_eq!(response.status(), 500);
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (serde_json::from_slice(&body).unwrap(), logged.text())
    }

    // The panic's message was logged whatever the task's log_key, though it may hold the key
    // that `KeyLogging::Hash` promises to keep out of every log.
    #[tokio::test]
    async fn a_panic_message_is_logged_only_where_keys_may_be() {
        let (document, hidden) = a_panic_logged_with(idempotask::KeyLogging::Hash).await;
        assert_eq!(document["type"], problem::HANDLER_PANICKED);
        assert_eq!(document["title"], "Handler panicked");
        assert!(hidden.contains("the handler panicked"), "{hidden}");
        assert!(
            !hidden.contains("jane"),
            "the key reached the log: {hidden}"
        );
        let (_, plain) = a_panic_logged_with(idempotask::KeyLogging::Plain).await;
        assert!(
            plain.contains("the card of jane@example.com was declined"),
            "{plain}"
        );
    }

    /// `paid`, then the trailer `grpc-status: 0`.
    fn paid_with_trailers() -> axum::body::Body {
        let trailers = async {
            let mut trailers = http::HeaderMap::new();
            trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
            Some(Ok::<_, std::convert::Infallible>(trailers))
        };
        axum::body::Body::new(
            http_body_util::Full::new(bytes::Bytes::from("paid")).with_trailers(trailers),
        )
    }

    #[tokio::test]
    async fn trailers_reach_the_first_client_and_are_not_replayed() {
        let app = Router::new()
            .route("/p", post(|| async { paid_with_trailers() }))
            .layer(
                Idempotency::new(idempotask::Task::new("trailers"))
                    .store(idempotask::MemoryStore::new()),
            );
        let mut trailers_seen = Vec::new();
        for _ in 0..2 {
            let response = app.clone().oneshot(keyed("k")).await.unwrap();
            let collected = response.into_body().collect().await.unwrap();
            trailers_seen.push(collected.trailers().cloned());
            assert_eq!(collected.to_bytes(), "paid");
        }
        let first = trailers_seen[0]
            .as_ref()
            .expect("the first response's trailers");
        assert_eq!(first.get("grpc-status").unwrap(), "0");
        assert!(trailers_seen[1].is_none(), "trailers are not stored");
    }

    #[tokio::test]
    async fn trailers_reach_an_http1_client_that_asks_for_them() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};

        let app = Router::new()
            .route(
                "/p",
                post(|| async { ([("trailer", "grpc-status")], paid_with_trailers()) }),
            )
            .layer(
                Idempotency::new(idempotask::Task::new("trailers_h1"))
                    .store(idempotask::MemoryStore::new()),
            );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
        let request = format!(
            "POST /p HTTP/1.1\r\nhost: {address}\r\nidempotency-key: k\r\nte: trailers\r\n\
             content-length: 5\r\nconnection: close\r\n\r\n1 EUR"
        );
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut answer = Vec::new();
        // The server may reset the connection once it has answered: what arrived counts.
        let _ = stream.read_to_end(&mut answer).await;
        let answer = String::from_utf8_lossy(&answer).to_lowercase();
        assert!(answer.starts_with("http/1.1 200"), "{answer}");
        assert!(answer.contains("transfer-encoding: chunked"), "{answer}");
        let (_, after_body) = answer.split_once("\r\n0\r\n").expect("a chunked body");
        assert!(after_body.contains("grpc-status: 0"), "{answer}");
    }
}
