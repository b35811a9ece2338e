//! The service that runs each keyed request through the task, and what each outcome answers.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, Request, Response, StatusCode};
use http_body::Body;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use idempotask::{Error, Fingerprint, KeyLogging, Outcome};
use tower_service::Service;

use crate::body::{RequestBody, ResponseBody};
use crate::fingerprint::BodyRefused;
use crate::key;
use crate::layer::{Idempotency, KeySource, Retention};
use crate::problem::{self, Problem};
use crate::responses::{
    body_too_large, invalid_key, misconfigured, missing_key, problem, refused, replay,
};
use crate::stored::{Marker, Stored, StoredResponse};

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

impl<S> tower_layer::Layer<S> for Idempotency {
    type Service = IdempotencyService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        let mut config = self.clone();
        config.task = self.running_task();
        IdempotencyService::new(inner, Arc::new(config))
    }
}

#[cfg(test)]
mod tests;
