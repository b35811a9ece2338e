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
    let github =
        crate::layer::KeySource::Header(http::HeaderName::from_static("x-github-delivery"));
    assert!(crate::responses::missing_key_detail(&github).contains("x-github-delivery"));
    let by_body = crate::layer::KeySource::Function(Arc::new(|_, _| None));
    assert!(!crate::responses::missing_key_detail(&by_body).contains("header"));
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
    let answered = tokio::time::timeout(std::time::Duration::from_secs(30), app.oneshot(request));
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
    assert_eq!(document["detail"], crate::responses::MISCONFIGURED_DETAIL);
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
    assert_eq!(document["detail"], crate::responses::MISCONFIGURED_DETAIL);
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
