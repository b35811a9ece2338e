//! The HTTP layer behind a real axum server on a free port, called by a real HTTP client
//! (reqwest), on the in-memory store and on a Redis server of the test's own: concurrent
//! duplicates run the handler once, retries get the stored response, a reused key with another
//! body runs nothing, a `5xx` is released, the size caps, a client that goes away mid-handler,
//! a key held in doubt, and a Redis that is down. The kill -9 of a server process is `tests/examples.rs`, on the
//! `http_payments` example.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Extension, Json};
use http::StatusCode;
use idempotask::store::SharedStore;
use idempotask::{InDoubt, Task};
use idempotask_http::{IDEMPOTENT_REPLAYED, Idempotency, Retention, problem};
use idempotask_test_support::RedisServer;
use idempotask_test_support::cluster::RedisCluster;
use idempotask_test_support::doubt::leave_in_doubt;
use idempotask_test_support::postgres::PostgresServer;
use idempotask_test_support::quorum::Quorum;
use tokio::sync::{Semaphore, mpsc};

/// A store for one test, and the servers behind it if any (stopped on drop).
struct Backend {
    store: SharedStore,
    redis: Option<RedisServer>,
    _servers: Option<Box<dyn std::any::Any + Send + Sync>>,
}

impl Backend {
    fn memory() -> Self {
        Self {
            store: SharedStore::new(idempotask::MemoryStore::new()),
            redis: None,
            _servers: None,
        }
    }

    /// `store`, with the servers behind it kept running until the test ends.
    fn on(store: impl idempotask::store::Store, servers: impl std::any::Any + Send + Sync) -> Self {
        Self {
            store: SharedStore::new(store),
            redis: None,
            _servers: Some(Box::new(servers)),
        }
    }

    async fn cluster() -> Self {
        let cluster = RedisCluster::shared();
        Self::on(cluster.fresh_store().await, cluster)
    }

    async fn quorum() -> Self {
        let quorum = Quorum::start(3);
        Self::on(quorum.store().await, quorum)
    }

    async fn postgres() -> Self {
        let server = PostgresServer::shared();
        Self::on(server.store().await, server)
    }

    async fn redis() -> Self {
        let server = RedisServer::start();
        let store = idempotask_redis::RedisStore::builder(server.url())
            .connection_timeout(Duration::from_millis(500))
            .response_timeout(Duration::from_millis(500))
            .connect()
            .await
            .expect("the test's Redis server accepts a store");
        Self {
            store: SharedStore::new(store),
            redis: Some(server),
            _servers: None,
        }
    }
}

/// Runs `scenario` once on each store, as a test of its own.
macro_rules! on_every_store {
    ($($scenario:ident),* $(,)?) => {$(
        mod $scenario {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn memory() {
                super::$scenario(super::Backend::memory()).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn redis() {
                super::$scenario(super::Backend::redis().await).await;
            }
        }
    )*};
}

/// Runs `scenario` on a cluster, a quorum and PostgreSQL, as tests of their own.
macro_rules! on_the_other_stores {
    ($($scenario:ident),* $(,)?) => {$(
        mod $scenario {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn cluster() {
                super::super::$scenario(super::super::Backend::cluster().await).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn quorum() {
                super::super::$scenario(super::super::Backend::quorum().await).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                super::super::$scenario(super::super::Backend::postgres().await).await;
            }
        }
    )*};
}

/// The scenarios that exercise each store operation the layer uses (begin, a busy unit,
/// finish with a stored response, release, a mismatched fingerprint, a replay), on the
/// stores that `on_every_store` leaves out.
mod other_stores {
    on_the_other_stores!(
        concurrent_duplicates_run_the_handler_once,
        waiting_duplicates_all_get_the_first_response,
        a_key_reused_with_another_body_is_422_and_runs_nothing,
        a_server_error_releases_the_key_and_the_retry_runs,
        a_client_that_goes_away_mid_handler_gets_the_stored_response_on_retry,
        the_size_caps,
    );
}

on_every_store!(
    concurrent_duplicates_run_the_handler_once,
    waiting_duplicates_all_get_the_first_response,
    a_key_reused_with_another_body_is_422_and_runs_nothing,
    missing_and_malformed_keys,
    a_server_error_releases_the_key_and_the_retry_runs,
    the_size_caps,
    a_client_that_goes_away_mid_handler_gets_the_stored_response_on_retry,
    scopes_keep_equal_keys_apart,
    a_key_from_the_body_and_the_stored_headers,
    a_handler_slower_than_the_lock_ttl_keeps_its_lock,
    a_damaged_stored_response_is_410_and_runs_nothing,
    a_key_in_doubt_is_409_without_retry_after_and_runs_nothing,
    what_counts_in_the_fingerprint,
    throttled_and_timed_out_answers_release_the_key,
    a_chunked_body_over_the_cap_is_413_and_runs_nothing,
    a_request_costs_one_begin_and_one_finish,
    json_numbers_count_by_their_exact_text,
    a_request_refused_as_malformed_is_not_stored_and_the_corrected_one_runs,
    a_panicking_handler_is_500_and_its_retry_runs,
    a_panic_outside_the_handler_is_500_and_does_not_blame_the_handler,
);

/// Awaits the next signal on `channel`, failing the test (not hanging the suite) when `what`
/// does not happen within a minute.
async fn next(channel: &mut mpsc::UnboundedReceiver<()>, what: &str) {
    tokio::time::timeout(Duration::from_secs(60), channel.recv())
        .await
        .unwrap_or_else(|_| panic!("{what} did not happen within 60 s"))
        .expect("the server keeps its probe");
}

/// What the handlers did, as the test sees it.
#[derive(Clone)]
struct Probe {
    /// How many times a handler started.
    executions: Arc<AtomicU32>,
    /// One message each time a handler starts.
    started: mpsc::UnboundedSender<()>,
    /// Permits for gated handlers to finish.
    gate: Arc<Semaphore>,
    /// One message each time the server drops a response future before it finished.
    dropped: mpsc::UnboundedSender<()>,
}

/// The signals the test awaits.
struct Signals {
    started: mpsc::UnboundedReceiver<()>,
    dropped: mpsc::UnboundedReceiver<()>,
}

/// An axum server on a free loopback port, its routes behind `layer`.
struct Server {
    base: String,
    probe: Probe,
    signals: Signals,
    client: reqwest::Client,
}

impl Server {
    async fn start(layer: Idempotency, gated: bool) -> Self {
        let (started, started_rx) = mpsc::unbounded_channel();
        let (dropped, dropped_rx) = mpsc::unbounded_channel();
        let probe = Probe {
            executions: Arc::new(AtomicU32::new(0)),
            started,
            gate: Arc::new(Semaphore::new(if gated {
                0
            } else {
                Semaphore::MAX_PERMITS
            })),
            dropped,
        };
        let app = Router::new()
            .route("/payments", post(pay))
            .route("/flaky", post(flaky))
            .route("/large", post(large))
            .route("/throttled", post(throttled))
            .route("/typed", post(typed))
            .route("/panicky", post(panicky))
            .route("/declined", post(declined))
            .layer(layer)
            .layer(middleware::from_fn_with_state(probe.clone(), watch_drops))
            .with_state(probe.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Self {
            base,
            probe,
            signals: Signals {
                started: started_rx,
                dropped: dropped_rx,
            },
            client: reqwest::Client::new(),
        }
    }

    fn executions(&self) -> u32 {
        self.probe.executions.load(Ordering::SeqCst)
    }

    fn post(&self, path: &str, key: Option<&str>, body: &str) -> reqwest::RequestBuilder {
        let request = self
            .client
            .post(format!("{}{path}", self.base))
            .body(body.to_owned());
        match key {
            Some(key) => request.header("idempotency-key", key),
            None => request,
        }
    }
}

/// A status, the replay header and the body of one answer.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Answer {
    status: u16,
    replayed: bool,
    retry_after: Option<String>,
    content_type: Option<String>,
    body: String,
}

impl Answer {
    async fn of(response: reqwest::Response) -> Self {
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .map(|value| value.to_str().unwrap().to_owned())
        };
        let replayed = match header(IDEMPOTENT_REPLAYED.as_str()).as_deref() {
            None => false,
            Some("true") => true,
            Some(other) => panic!("Idempotent-Replayed: {other}"),
        };
        let (retry_after, content_type) = (header("retry-after"), header("content-type"));
        Self {
            status: response.status().as_u16(),
            replayed,
            retry_after,
            content_type,
            body: response.text().await.unwrap(),
        }
    }

    /// The problem `type` of a problem answer.
    fn problem_type(&self) -> String {
        assert_eq!(
            self.content_type.as_deref(),
            Some(problem::CONTENT_TYPE),
            "{self:?}"
        );
        let document: serde_json::Value = serde_json::from_str(&self.body).unwrap();
        assert_eq!(document["status"], self.status, "{self:?}");
        document["type"].as_str().unwrap().to_owned()
    }

    /// The problem `title` and `detail` of a problem answer.
    fn problem_text(&self) -> (String, String) {
        let document: serde_json::Value = serde_json::from_str(&self.body).unwrap();
        let text = |member: &str| document[member].as_str().unwrap().to_owned();
        (text("title"), text("detail"))
    }
}

async fn send(request: reqwest::RequestBuilder) -> Answer {
    Answer::of(request.send().await.unwrap()).await
}

/// The `Date` the handler sets, which a replay must not repeat.
const SENTINEL_DATE: &str = "Mon, 01 Jan 2001 00:00:00 GMT";

/// `POST /payments`: charges once per execution (gated when the server is), answers `201`
/// with the charge's number.
async fn pay(State(probe): State<Probe>, body: String) -> Response {
    let charge = probe.executions.fetch_add(1, Ordering::SeqCst) + 1;
    let _ = probe.started.send(());
    probe.gate.acquire().await.unwrap().forget();
    (
        StatusCode::CREATED,
        [
            ("location", format!("/payments/{charge}")),
            ("date", SENTINEL_DATE.to_owned()),
            ("set-cookie", format!("session=charge-{charge}")),
        ],
        format!("{{\"charge\":{charge},\"amount\":\"{body}\"}}"),
    )
        .into_response()
}

/// `POST /flaky`: `503` on its first execution, `201` after.
async fn flaky(State(probe): State<Probe>) -> Response {
    let run = probe.executions.fetch_add(1, Ordering::SeqCst) + 1;
    if run == 1 {
        (StatusCode::SERVICE_UNAVAILABLE, "the ledger is down").into_response()
    } else {
        (StatusCode::CREATED, format!("paid on run {run}")).into_response()
    }
}

/// `POST /throttled`: `429` on its first execution, `408` on its second, `201` after.
async fn throttled(State(probe): State<Probe>) -> Response {
    match probe.executions.fetch_add(1, Ordering::SeqCst) + 1 {
        1 => (StatusCode::TOO_MANY_REQUESTS, "slow down").into_response(),
        2 => (StatusCode::REQUEST_TIMEOUT, "too slow").into_response(),
        run => (StatusCode::CREATED, format!("paid on run {run}")).into_response(),
    }
}

/// A payment as axum's `Json` extractor reads it (axum's `json` feature comes with the
/// examples package, a dependency of this one).
#[derive(serde::Deserialize)]
struct Payment {
    amount: u64,
}

/// `POST /typed`: a handler taking axum's `Json<Payment>`, which refuses a request without a
/// JSON `Content-Type` (`415`) or with a body that is no payment (`400`, `422`) before it runs.
async fn typed(State(probe): State<Probe>, Json(payment): Json<Payment>) -> Response {
    let run = probe.executions.fetch_add(1, Ordering::SeqCst) + 1;
    let amount = payment.amount;
    (
        StatusCode::CREATED,
        format!("charged {amount} on run {run}"),
    )
        .into_response()
}

/// `POST /declined`: a refusal after acting (the bank was asked), marked as the key's result.
async fn declined(State(probe): State<Probe>) -> Response {
    let run = probe.executions.fetch_add(1, Ordering::SeqCst) + 1;
    (
        StatusCode::UNPROCESSABLE_ENTITY,
        Extension(Retention::Keep),
        format!("declined on run {run}"),
    )
        .into_response()
}

/// `POST /panicky`: panics on its first execution, `201` after.
async fn panicky(State(probe): State<Probe>) -> Response {
    let run = probe.executions.fetch_add(1, Ordering::SeqCst) + 1;
    assert!(run != 1, "the ledger client panicked on run {run}");
    (StatusCode::CREATED, format!("paid on run {run}")).into_response()
}

/// `POST /large`: a body of as many bytes as the request body says.
async fn large(State(probe): State<Probe>, body: String) -> Response {
    let run = probe.executions.fetch_add(1, Ordering::SeqCst) + 1;
    let size: usize = body.parse().unwrap();
    (StatusCode::OK, format!("{run}").repeat(size)).into_response()
}

/// The outermost middleware: reports when the server drops a response future unfinished (the
/// client went away).
async fn watch_drops(State(probe): State<Probe>, request: Request, next: Next) -> Response {
    struct Unfinished(Option<mpsc::UnboundedSender<()>>);
    impl Drop for Unfinished {
        fn drop(&mut self) {
            if let Some(dropped) = self.0.take() {
                let _ = dropped.send(());
            }
        }
    }
    let mut unfinished = Unfinished(Some(probe.dropped.clone()));
    let response = next.run(request).await;
    unfinished.0 = None;
    response
}

fn layer(backend: &Backend, task: &'static str) -> Idempotency {
    Idempotency::new(Task::new(task)).store(backend.store.clone())
}

async fn concurrent_duplicates_run_the_handler_once(backend: Backend) {
    let mut server = Server::start(layer(&backend, "http_concurrent"), true).await;
    let mut running = Vec::new();
    for _ in 0..64 {
        let request = server.post("/payments", Some("\"pay-1\""), "42 EUR");
        running.push(tokio::spawn(send(request)));
    }
    // The first request holds the key; let it finish once it has started.
    next(&mut server.signals.started, "the first handler start").await;
    // The gate is closed, so this one meets the held key for certain.
    let held = send(server.post("/payments", Some("\"pay-1\""), "42 EUR")).await;
    assert_eq!(held.status, 409, "{held:?}");
    assert_eq!(held.problem_type(), problem::IN_PROGRESS);
    // The holder's lock has about 30 s left; the wait it advertises is capped.
    assert_eq!(held.retry_after.as_deref(), Some("2"), "{held:?}");
    server.probe.gate.add_permits(Semaphore::MAX_PERMITS);
    let mut answers = Vec::new();
    for answer in running {
        answers.push(answer.await.unwrap());
    }

    let fresh: Vec<&Answer> = answers
        .iter()
        .filter(|a| a.status == 201 && !a.replayed)
        .collect();
    assert_eq!(fresh.len(), 1, "{answers:#?}");
    let stored = fresh[0].body.clone();
    assert_eq!(stored, r#"{"charge":1,"amount":"42 EUR"}"#);
    for answer in &answers {
        match answer.status {
            201 => assert_eq!(answer.body, stored, "{answer:?}"),
            409 => {
                assert_eq!(answer.problem_type(), problem::IN_PROGRESS);
                let secs: u64 = answer.retry_after.as_deref().unwrap().parse().unwrap();
                assert!(secs >= 1, "{answer:?}");
            }
            _ => panic!("unexpected answer {answer:?}"),
        }
    }
    // Then every retry is the stored response, replayed.
    let retry = send(server.post("/payments", Some("\"pay-1\""), "42 EUR")).await;
    assert_eq!((retry.status, retry.replayed), (201, true), "{retry:?}");
    assert_eq!(retry.body, stored);
    assert_eq!(server.executions(), 1);
    drop(backend);
}

async fn waiting_duplicates_all_get_the_first_response(backend: Backend) {
    let layer = layer(&backend, "http_waiting").wait_for_result(Duration::from_secs(30));
    let mut server = Server::start(layer, true).await;
    let mut running = Vec::new();
    for _ in 0..64 {
        let request = server.post("/payments", Some("pay-2"), "7 EUR");
        running.push(tokio::spawn(send(request)));
    }
    next(&mut server.signals.started, "the first handler start").await;
    server.probe.gate.add_permits(Semaphore::MAX_PERMITS);
    let mut answers = Vec::new();
    for answer in running {
        answers.push(answer.await.unwrap());
    }
    let replayed = answers.iter().filter(|a| a.replayed).count();
    assert_eq!(replayed, 63, "{answers:#?}");
    for answer in &answers {
        assert_eq!(answer.status, 201, "{answer:?}");
        assert_eq!(answer.body, r#"{"charge":1,"amount":"7 EUR"}"#);
    }
    assert_eq!(server.executions(), 1);
    drop(backend);
}

async fn a_key_reused_with_another_body_is_422_and_runs_nothing(backend: Backend) {
    let server = Server::start(layer(&backend, "http_reuse"), false).await;
    let first = send(server.post("/payments", Some("pay-3"), "10 EUR")).await;
    assert_eq!(first.status, 201);
    for (path, body) in [
        ("/payments", "11 EUR"),
        ("/payments?currency=USD", "10 EUR"),
    ] {
        let other = send(server.post(path, Some("pay-3"), body)).await;
        assert_eq!(other.status, 422, "{other:?}");
        assert_eq!(other.problem_type(), problem::KEY_REUSED);
    }
    assert_eq!(server.executions(), 1);
    let same = send(server.post("/payments", Some("pay-3"), "10 EUR")).await;
    assert_eq!(
        (same.status, same.replayed, &same.body),
        (201, true, &first.body)
    );
    drop(backend);
}

async fn missing_and_malformed_keys(backend: Backend) {
    let server = Server::start(layer(&backend, "http_keys"), false).await;
    // No key: the request passes through, unprotected, every time.
    for _ in 0..2 {
        let answer = send(server.post("/payments", None, "1 EUR")).await;
        assert_eq!((answer.status, answer.replayed), (201, false));
    }
    assert_eq!(server.executions(), 2);
    for malformed in [
        "\"unterminated",
        "\"\"",
        "two words",
        "a,b",
        "\"bad \\n escape\"",
        &"k".repeat(256),
    ] {
        let answer = send(server.post("/payments", Some(malformed), "1 EUR")).await;
        assert_eq!(answer.status, 400, "{malformed}: {answer:?}");
        assert_eq!(answer.problem_type(), problem::INVALID_KEY);
    }
    assert_eq!(server.executions(), 2);

    let required = Server::start(
        layer(&backend, "http_keys_required").require_key(true),
        false,
    )
    .await;
    let answer = send(required.post("/payments", None, "1 EUR")).await;
    assert_eq!(answer.status, 400);
    assert_eq!(answer.problem_type(), problem::MISSING_KEY);
    assert_eq!(required.executions(), 0);
    // A method the layer does not cover passes through even when keys are required.
    let get = required
        .client
        .get(format!("{}/payments", required.base))
        .send()
        .await
        .unwrap();
    assert_eq!(get.status(), 405);
    drop(backend);
}

async fn a_server_error_releases_the_key_and_the_retry_runs(backend: Backend) {
    let server = Server::start(layer(&backend, "http_flaky"), false).await;
    let first = send(server.post("/flaky", Some("pay-4"), "")).await;
    assert_eq!((first.status, first.replayed), (503, false), "{first:?}");
    assert_eq!(first.body, "the ledger is down");
    let retry = send(server.post("/flaky", Some("pay-4"), "")).await;
    assert_eq!((retry.status, retry.replayed), (201, false), "{retry:?}");
    assert_eq!(retry.body, "paid on run 2");
    let again = send(server.post("/flaky", Some("pay-4"), "")).await;
    assert_eq!((again.status, again.replayed), (201, true), "{again:?}");
    assert_eq!(again.body, "paid on run 2");
    assert_eq!(server.executions(), 2);

    // Stored as the draft and Stripe do: the 503 is the answer to every retry.
    let storing = Server::start(
        layer(&backend, "http_flaky_stored").store_when(|_| true),
        false,
    )
    .await;
    for replayed in [false, true] {
        let answer = send(storing.post("/flaky", Some("pay-4"), "")).await;
        assert_eq!(
            (answer.status, answer.replayed),
            (503, replayed),
            "{answer:?}"
        );
    }
    assert_eq!(storing.executions(), 1);
    drop(backend);
}

async fn the_size_caps(backend: Backend) {
    let capped = layer(&backend, "http_caps")
        .max_request_body(64)
        .max_stored_body(1000);
    let server = Server::start(capped, false).await;
    // A request body over the buffer limit: 413, nothing ran.
    let big = send(server.post("/payments", Some("pay-5"), &"x".repeat(65))).await;
    assert_eq!(big.status, 413, "{big:?}");
    assert_eq!(big.problem_type(), problem::BODY_TOO_LARGE);
    assert_eq!(server.executions(), 0);

    // A response at the cap is stored; one over it is sent whole, and its retry is told so.
    let at_cap = send(server.post("/large", Some("large-1"), "1000")).await;
    assert_eq!((at_cap.status, at_cap.body.len()), (200, 1000));
    let replay = send(server.post("/large", Some("large-1"), "1000")).await;
    assert_eq!((replay.replayed, &replay.body), (true, &at_cap.body));

    let over = send(server.post("/large", Some("large-2"), "1001")).await;
    assert_eq!((over.status, over.replayed), (200, false));
    assert_eq!(over.body, "2".repeat(1001));
    let retry = send(server.post("/large", Some("large-2"), "1001")).await;
    assert_eq!(retry.status, 410, "{retry:?}");
    assert_eq!(retry.problem_type(), problem::RESPONSE_NOT_STORED);
    assert_eq!(
        server.executions(),
        2,
        "the over-cap request never runs again"
    );
    drop(backend);
}

async fn a_client_that_goes_away_mid_handler_gets_the_stored_response_on_retry(backend: Backend) {
    // The retry waits for the first request's response, whose client went away.
    let layer = layer(&backend, "http_disconnect").wait_for_result(Duration::from_secs(30));
    let mut server = Server::start(layer, true).await;
    let request = server.post("/payments", Some("pay-6"), "99 EUR");
    let client = tokio::spawn(request.send());
    next(&mut server.signals.started, "the handler start").await;
    // The client goes away while the handler is halfway through; the server notices.
    client.abort();
    next(
        &mut server.signals.dropped,
        "the server dropping the abandoned request",
    )
    .await;
    server.probe.gate.add_permits(Semaphore::MAX_PERMITS);

    let retry = send(server.post("/payments", Some("pay-6"), "99 EUR")).await;
    assert_eq!((retry.status, retry.replayed), (201, true), "{retry:?}");
    assert_eq!(retry.body, r#"{"charge":1,"amount":"99 EUR"}"#);
    assert_eq!(server.executions(), 1);
    drop(backend);
}

async fn scopes_keep_equal_keys_apart(backend: Backend) {
    let scoped = layer(&backend, "http_scopes").scope(|request| {
        let tenant = request.headers.get("x-tenant");
        String::from_utf8_lossy(tenant.map_or(&b""[..], |v| v.as_bytes())).into_owned()
    });
    let server = Server::start(scoped, false).await;
    let mut bodies = Vec::new();
    for tenant in ["acme", "globex", "acme"] {
        let answer = send(
            server
                .post("/payments", Some("pay-7"), "5 EUR")
                .header("x-tenant", tenant),
        )
        .await;
        assert_eq!(answer.status, 201, "{answer:?}");
        bodies.push((answer.replayed, answer.body));
    }
    assert_eq!(server.executions(), 2);
    assert_eq!(bodies[0].1, bodies[2].1);
    assert_ne!(bodies[0].1, bodies[1].1);
    assert!(bodies[2].0, "the second request of a tenant is a replay");
    // A scope far longer than a key is hashed into the stored key: the key stays valid.
    let long = "t".repeat(4000);
    let answer = send(
        server
            .post("/payments", Some("pay-7"), "5 EUR")
            .header("x-tenant", &long),
    )
    .await;
    assert_eq!((answer.status, answer.replayed), (201, false), "{answer:?}");
    assert_eq!(server.executions(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_is_down_is_503_and_nothing_runs() {
    let mut backend = Backend::redis().await;
    let server = Server::start(layer(&backend, "http_redis_down"), false).await;
    let up = send(server.post("/payments", Some("pay-8"), "1 EUR")).await;
    assert_eq!(up.status, 201);
    drop(backend.redis.take());

    for key in ["pay-8", "pay-9"] {
        let answer = send(server.post("/payments", Some(key), "1 EUR")).await;
        assert_eq!(answer.status, 503, "{answer:?}");
        assert_eq!(answer.problem_type(), problem::STORE_UNAVAILABLE);
        assert_eq!(answer.retry_after.as_deref(), Some("1"));
    }
    assert_eq!(
        server.executions(),
        1,
        "no execution without the store's lock"
    );
}

async fn a_key_from_the_body_and_the_stored_headers(backend: Backend) {
    // A webhook whose event id is in its JSON body, as Stripe's are.
    let by_event = layer(&backend, "http_key_fn").key_fn(|_, body| {
        let event: serde_json::Value = serde_json::from_slice(body).ok()?;
        Some(event.get("id")?.as_str()?.to_owned())
    });
    let server = Server::start(by_event, false).await;
    let event = r#"{"id":"evt_1","type":"charge.succeeded"}"#;
    let first = server.post("/payments", None, event).send().await.unwrap();
    let location = first.headers().get("location").cloned();
    assert_eq!(first.headers().get("date").unwrap(), SENTINEL_DATE);
    assert_eq!(
        first.headers().get("set-cookie").unwrap(),
        "session=charge-1"
    );
    assert_eq!(first.status(), 201);
    let replay = server.post("/payments", None, event).send().await.unwrap();
    assert_eq!(
        replay.headers().get(IDEMPOTENT_REPLAYED.as_str()).unwrap(),
        "true"
    );
    // End-to-end headers come back as stored; `Date` is the replay's own.
    assert_eq!(replay.headers().get("location").cloned(), location);
    assert!(location.is_some());
    let date = replay
        .headers()
        .get("date")
        .expect("the server dates the replay");
    assert_ne!(date, SENTINEL_DATE, "the stored Date was replayed");
    assert!(
        replay.headers().get("set-cookie").is_none(),
        "a session cookie was handed to whoever retried the key"
    );
    // A body without an id has no key: it passes through and runs.
    let unkeyed = send(server.post("/payments", None, r#"{"type":"ping"}"#)).await;
    assert_eq!((unkeyed.status, unkeyed.replayed), (201, false));
    assert_eq!(server.executions(), 2);
    drop(backend);
}

async fn a_handler_slower_than_the_lock_ttl_keeps_its_lock(backend: Backend) {
    let ttl = Duration::from_millis(600);
    let task = Task::new("http_long_handler").lock_ttl(ttl);
    let layer = Idempotency::new(task).store(backend.store.clone());
    let mut server = Server::start(layer, true).await;
    let first = tokio::spawn(send(server.post("/payments", Some("pay-long"), "3 EUR")));
    next(&mut server.signals.started, "the handler start").await;
    // Time passing is what is under test: the handler is held three lock TTLs long.
    tokio::time::sleep(ttl * 3).await;
    let retry = tokio::spawn(send(server.post("/payments", Some("pay-long"), "3 EUR")));
    // Were the lock gone, the retry would start a second run, held at the gate for ever.
    let retry = tokio::select! {
        retry = retry => retry.unwrap(),
        _ = server.signals.started.recv() => {
            panic!("the lock expired under the handler: the retry started a second run")
        }
    };
    assert_eq!(
        retry.status, 409,
        "the lock expired under the handler: {retry:?}"
    );
    assert_eq!(retry.problem_type(), problem::IN_PROGRESS);
    server.probe.gate.add_permits(Semaphore::MAX_PERMITS);
    let first = first.await.unwrap();
    assert_eq!((first.status, first.replayed), (201, false), "{first:?}");
    let replay = send(server.post("/payments", Some("pay-long"), "3 EUR")).await;
    assert_eq!((replay.status, replay.replayed), (201, true), "{replay:?}");
    assert_eq!(
        server.executions(),
        1,
        "a second run while the first still ran"
    );
    drop(backend);
}

async fn a_damaged_stored_response_is_410_and_runs_nothing(backend: Backend) {
    // A marker under the layer's task and key whose value is no stored response, written
    // through the core's public API.
    let damaged: String = Task::new("http_damaged")
        .call("pay-damaged")
        .store(backend.store.clone())
        .run(async { Ok::<_, idempotask::Error>("not a stored response".to_owned()) })
        .await
        .unwrap();
    assert_eq!(damaged, "not a stored response");
    let server = Server::start(layer(&backend, "http_damaged"), false).await;
    let answer = send(server.post("/payments", Some("pay-damaged"), "1 EUR")).await;
    assert_eq!(answer.status, 410, "{answer:?}");
    assert_eq!(answer.problem_type(), problem::STORED_RESPONSE_UNREADABLE);
    assert_eq!(server.executions(), 0);
    drop(backend);
}

async fn a_key_in_doubt_is_409_without_retry_after_and_runs_nothing(backend: Backend) {
    // A request with this key took the lock, and its server was killed mid-handler.
    leave_in_doubt(&backend.store, "http_in_doubt", "pay-in-doubt").await;
    let hold = Idempotency::new(Task::new("http_in_doubt").in_doubt(InDoubt::Hold))
        .store(backend.store.clone());
    let server = Server::start(hold, false).await;
    for _retry in 0..2 {
        let answer = send(server.post("/payments", Some("pay-in-doubt"), "1 EUR")).await;
        assert_eq!(answer.status, 409, "{answer:?}");
        assert_eq!(answer.problem_type(), problem::IN_DOUBT);
        assert_eq!(answer.retry_after, None, "no wait helps: {answer:?}");
        assert!(!answer.replayed);
    }
    assert_eq!(server.executions(), 0, "the held handler did not run");
    // Other keys run as ever.
    let answer = send(server.post("/payments", Some("pay-other"), "2 EUR")).await;
    assert_eq!(answer.status, 201, "{answer:?}");
    assert_eq!(server.executions(), 1);
    drop(backend);
}

async fn what_counts_in_the_fingerprint(backend: Backend) {
    // Only the amount makes a payment: a retry that changes `sent_at` is the same request.
    let by_amount = layer(&backend, "http_fingerprint_fn")
        .fingerprint_headers([http::HeaderName::from_static("x-api-version")])
        .fingerprint_body_with(|_, body| {
            let payment: serde_json::Value = serde_json::from_slice(body).ok()?;
            idempotask::Fingerprint::of(payment.get("amount")?).ok()
        });
    let server = Server::start(by_amount, false).await;
    let versioned = |key: &str, body: &str, version: &str| {
        server
            .post("/payments", Some(key), body)
            .header("x-api-version", version)
    };
    // A body the function refuses: 400, nothing ran, and the key is not taken.
    let refused = send(versioned("fp-1", "not json", "1")).await;
    assert_eq!(refused.status, 400, "{refused:?}");
    assert_eq!(refused.problem_type(), problem::BODY_INVALID);
    assert_eq!(server.executions(), 0);

    let first = send(versioned("fp-1", r#"{"amount":5,"sent_at":1}"#, "1")).await;
    assert_eq!((first.status, first.replayed), (201, false), "{first:?}");
    let retry = send(versioned("fp-1", r#"{"amount":5,"sent_at":2}"#, "1")).await;
    assert_eq!((retry.status, retry.replayed), (201, true), "{retry:?}");
    assert_eq!(retry.body, first.body);
    for (body, version) in [
        (r#"{"amount":6,"sent_at":1}"#, "1"),
        (r#"{"amount":5,"sent_at":1}"#, "2"),
    ] {
        let other = send(versioned("fp-1", body, version)).await;
        assert_eq!(other.status, 422, "{body} {version}: {other:?}");
        assert_eq!(other.problem_type(), problem::KEY_REUSED);
    }
    assert_eq!(server.executions(), 1);

    // JSON bodies count by value: spacing and member order are the same request.
    let json = layer(&backend, "http_fingerprint_json")
        .fingerprint_body(idempotask_http::BodyFingerprint::Json);
    let server = Server::start(json, false).await;
    let first = send(server.post("/payments", Some("fp-2"), r#"{"a":1,"b":2}"#)).await;
    let retry = send(server.post("/payments", Some("fp-2"), r#"{ "b": 2, "a": 1 }"#)).await;
    assert_eq!((retry.status, retry.replayed), (201, true), "{retry:?}");
    assert_eq!(retry.body, first.body);
    let other = send(server.post("/payments", Some("fp-2"), r#"{"a":1,"b":3}"#)).await;
    assert_eq!(other.status, 422, "{other:?}");
    assert_eq!(server.executions(), 1);
    drop(backend);
}

async fn throttled_and_timed_out_answers_release_the_key(backend: Backend) {
    let server = Server::start(layer(&backend, "http_throttled"), false).await;
    for (status, replayed) in [(429, false), (408, false), (201, false), (201, true)] {
        let answer = send(server.post("/throttled", Some("pay-7"), "")).await;
        assert_eq!(
            (answer.status, answer.replayed),
            (status, replayed),
            "{answer:?}"
        );
    }
    assert_eq!(server.executions(), 3);
    drop(backend);
}

async fn a_chunked_body_over_the_cap_is_413_and_runs_nothing(backend: Backend) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let server = Server::start(layer(&backend, "http_chunked").max_request_body(64), false).await;
    let address = server.base.trim_start_matches("http://").to_owned();
    // No Content-Length: the layer learns the size only by reading, and stops at the cap.
    let mut stream = tokio::net::TcpStream::connect(&address).await.unwrap();
    let chunk = "x".repeat(40);
    let request = format!(
        "POST /payments HTTP/1.1\r\nhost: {address}\r\nidempotency-key: pay-8\r\n\
         transfer-encoding: chunked\r\nconnection: close\r\n\r\n\
         28\r\n{chunk}\r\n28\r\n{chunk}\r\n0\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    // The server may reset the connection once it has answered, with the rest of the body
    // unread: what arrived counts.
    let _ = stream.read_to_end(&mut answer).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains(problem::BODY_TOO_LARGE), "{answer}");
    assert_eq!(server.executions(), 0);
    // Nothing was stored for the key: a request within the cap runs.
    let within = send(server.post("/payments", Some("pay-8"), "1 EUR")).await;
    assert_eq!((within.status, within.replayed), (201, false), "{within:?}");
    drop(backend);
}

/// A store that counts the operations the layer asks of it, in front of the backend's, and
/// panics once on `panic_once_on` when it is set.
#[derive(Debug)]
struct Counted {
    inner: SharedStore,
    calls: Arc<std::sync::Mutex<Vec<&'static str>>>,
    panic_once_on: std::sync::Mutex<Option<&'static str>>,
}

impl Counted {
    fn new(inner: SharedStore, calls: Arc<std::sync::Mutex<Vec<&'static str>>>) -> Self {
        Self {
            inner,
            calls,
            panic_once_on: std::sync::Mutex::new(None),
        }
    }

    fn note(&self, operation: &'static str) {
        self.calls.lock().unwrap().push(operation);
        let mut panic_on = self.panic_once_on.lock().unwrap();
        if *panic_on == Some(operation) {
            *panic_on = None;
            drop(panic_on);
            panic!("the store's {operation} panicked");
        }
    }
}

impl idempotask::store::Store for Counted {
    fn max_key_len(&self) -> usize {
        self.inner.max_key_len()
    }

    async fn begin(
        &self,
        unit: &idempotask::store::UnitOfWork,
        token: &idempotask::store::LockToken,
        lock_ttl: Duration,
        fencing: idempotask::store::Fencing,
    ) -> Result<idempotask::store::Begin, idempotask::store::StoreError> {
        self.note("begin");
        self.inner.begin(unit, token, lock_ttl, fencing).await
    }

    async fn finish(
        &self,
        unit: &idempotask::store::UnitOfWork,
        token: &idempotask::store::LockToken,
        marker: &[u8],
        result_ttl: Duration,
    ) -> Result<idempotask::store::Finish, idempotask::store::StoreError> {
        self.note("finish");
        self.inner.finish(unit, token, marker, result_ttl).await
    }

    async fn release(
        &self,
        unit: &idempotask::store::UnitOfWork,
        token: &idempotask::store::LockToken,
    ) -> Result<bool, idempotask::store::StoreError> {
        self.note("release");
        self.inner.release(unit, token).await
    }

    async fn renew(
        &self,
        unit: &idempotask::store::UnitOfWork,
        token: &idempotask::store::LockToken,
        lock_ttl: Duration,
    ) -> Result<bool, idempotask::store::StoreError> {
        self.note("renew");
        self.inner.renew(unit, token, lock_ttl).await
    }

    async fn inspect(
        &self,
        unit: &idempotask::store::UnitOfWork,
    ) -> Result<idempotask::store::Inspection, idempotask::store::StoreError> {
        self.note("inspect");
        self.inner.inspect(unit).await
    }

    async fn forget(
        &self,
        unit: &idempotask::store::UnitOfWork,
    ) -> Result<bool, idempotask::store::StoreError> {
        self.note("forget");
        self.inner.forget(unit).await
    }
}

async fn a_request_costs_one_begin_and_one_finish(backend: Backend) {
    let calls = Arc::new(std::sync::Mutex::new(Vec::new()));
    let counted = Counted::new(backend.store.clone(), Arc::clone(&calls));
    // No renewal: a request slowed past a third of the lock TTL would add a `renew`.
    let layer = Idempotency::new(Task::new("http_round_trips"))
        .store(counted)
        .renew_lock(false);
    let server = Server::start(layer, false).await;
    let taken = || std::mem::take(&mut *calls.lock().unwrap());
    // First, while `/flaky` still fails on its first run.
    let released = send(server.post("/flaky", Some("pay-10"), "")).await;
    assert_eq!(released.status, 503, "{released:?}");
    assert_eq!(taken(), ["begin", "release"], "a released 5xx");
    let fresh = send(server.post("/payments", Some("pay-9"), "2 EUR")).await;
    assert_eq!((fresh.status, fresh.replayed), (201, false), "{fresh:?}");
    assert_eq!(taken(), ["begin", "finish"], "a fresh request");
    let replay = send(server.post("/payments", Some("pay-9"), "2 EUR")).await;
    assert_eq!((replay.status, replay.replayed), (201, true), "{replay:?}");
    assert_eq!(taken(), ["begin"], "a replay");
    let unkeyed = send(server.post("/payments", None, "2 EUR")).await;
    assert_eq!(unkeyed.status, 201, "{unkeyed:?}");
    assert!(
        taken().is_empty(),
        "a request without a key reached the store"
    );
    drop(backend);
}

// A float round trip made 2^64 and 2^64 + 1 one payload under `BodyFingerprint::Json`: the
// second request got the first one's `201`, replayed, and never ran.
async fn json_numbers_count_by_their_exact_text(backend: Backend) {
    let json = layer(&backend, "http_json_numbers")
        .fingerprint_body(idempotask_http::BodyFingerprint::Json);
    let server = Server::start(json, false).await;
    // (first body, second body, whether they are one payload)
    let cases = [
        (
            r#"{"account":18446744073709551616,"amount":5}"#,
            r#"{"account":18446744073709551617,"amount":5}"#,
            false,
        ),
        (
            r#"{"amount":-170141183460469231731687303715884105729}"#,
            r#"{"amount":-170141183460469231731687303715884105730}"#,
            false,
        ),
        (
            r#"{"amount":0.12345678901234567890123}"#,
            r#"{"amount":0.12345678901234567890124}"#,
            false,
        ),
        (r#"{"amount":1.0}"#, r#"{"amount":1}"#, false),
        (r#"{"amount":-0}"#, r#"{"amount":0}"#, false),
        (r#"{"amount":1e2}"#, r#"{"amount":100}"#, false),
        (
            r#"{"account":18446744073709551616,"amount":5}"#,
            r#"{ "amount": 5, "account": 18446744073709551616 }"#,
            true,
        ),
        (r#"{"amount":1E+02}"#, r#"{"amount":1e2}"#, true),
    ];
    for (index, (first, second, same)) in cases.into_iter().enumerate() {
        let key = format!("numbers-{index}");
        let ran = send(server.post("/payments", Some(&key), first)).await;
        assert_eq!((ran.status, ran.replayed), (201, false), "{first}: {ran:?}");
        let retry = send(server.post("/payments", Some(&key), second)).await;
        if same {
            assert_eq!(
                (retry.status, retry.replayed, &retry.body),
                (201, true, &ran.body),
                "{first} then {second}"
            );
        } else {
            assert_eq!(retry.status, 422, "{first} then {second}: {retry:?}");
            assert_eq!(retry.problem_type(), problem::KEY_REUSED);
        }
    }
    assert_eq!(server.executions(), 8);
    drop(backend);
}

// axum's `Json` refused a request without `Content-Type` with `415`, the layer stored it, and
// the corrected request (same key and body, `Content-Type: application/json`) got that `415`
// replayed for the result TTL, its handler never run.
async fn a_request_refused_as_malformed_is_not_stored_and_the_corrected_one_runs(backend: Backend) {
    let server = Server::start(layer(&backend, "http_refused"), false).await;
    let typed = |key: &str, body: &str| {
        server
            .post("/typed", Some(key), body)
            .header("content-type", "application/json")
    };
    let bare = send(server.post("/typed", Some("pay-1"), r#"{"amount":42}"#)).await;
    assert_eq!((bare.status, bare.replayed), (415, false), "{bare:?}");
    let fixed = send(typed("pay-1", r#"{"amount":42}"#)).await;
    assert_eq!((fixed.status, fixed.replayed), (201, false), "{fixed:?}");
    assert_eq!(fixed.body, "charged 42 on run 1");
    let retry = send(typed("pay-1", r#"{"amount":42}"#)).await;
    assert_eq!((retry.status, retry.replayed), (201, true), "{retry:?}");
    assert_eq!(retry.body, fixed.body);

    // A body that is no payment (`422`), then the corrected body under the same key: it runs,
    // rather than meeting the refused body's fingerprint (`422 KEY_REUSED`).
    let wrong = send(typed("pay-2", r#"{"amount":"42"}"#)).await;
    assert_eq!((wrong.status, wrong.replayed), (422, false), "{wrong:?}");
    let syntax = send(typed("pay-2", r#"{"amount":42"#)).await;
    assert_eq!((syntax.status, syntax.replayed), (400, false), "{syntax:?}");
    let fixed = send(typed("pay-2", r#"{"amount":43}"#)).await;
    assert_eq!((fixed.status, fixed.replayed), (201, false), "{fixed:?}");
    assert_eq!(fixed.body, "charged 43 on run 2");
    assert_eq!(server.executions(), 2);

    // A handler's own `422`, marked as the key's result, is stored.
    for replayed in [false, true] {
        let answer = send(server.post("/declined", Some("pay-3"), "")).await;
        let got = (answer.status, answer.replayed, answer.body.as_str());
        assert_eq!(got, (422, replayed, "declined on run 3"), "{answer:?}");
    }
    assert_eq!(server.executions(), 3);
    drop(backend);
}

// A handler that panicked took the connection with it: the client saw no answer at all.
async fn a_panicking_handler_is_500_and_its_retry_runs(backend: Backend) {
    let server = Server::start(layer(&backend, "http_panicky"), false).await;
    let panicked = send(server.post("/panicky", Some("pay-12"), "")).await;
    assert_eq!(
        (panicked.status, panicked.replayed),
        (500, false),
        "{panicked:?}"
    );
    assert_eq!(panicked.problem_type(), problem::HANDLER_PANICKED);
    assert_eq!(
        panicked.problem_text().0,
        "Handler panicked",
        "{panicked:?}"
    );
    assert!(
        !panicked.body.contains("ledger client"),
        "the panic's message reached the client: {panicked:?}"
    );
    // Nothing was stored and the key was released: the retry runs.
    let retry = send(server.post("/panicky", Some("pay-12"), "")).await;
    assert_eq!((retry.status, retry.replayed), (201, false), "{retry:?}");
    assert_eq!(retry.body, "paid on run 2");
    let again = send(server.post("/panicky", Some("pay-12"), "")).await;
    assert_eq!((again.status, again.replayed), (201, true), "{again:?}");
    assert_eq!(server.executions(), 2);
    drop(backend);
}

// A panic outside the handler (here the store's, before the handler ran) was answered "Handler
// panicked", blaming a handler that never ran.
async fn a_panic_outside_the_handler_is_500_and_does_not_blame_the_handler(backend: Backend) {
    let calls = Arc::new(std::sync::Mutex::new(Vec::new()));
    let store = Counted::new(backend.store.clone(), Arc::clone(&calls));
    *store.panic_once_on.lock().unwrap() = Some("begin");
    let layer = Idempotency::new(Task::new("http_store_panicky")).store(store);
    let server = Server::start(layer, false).await;
    let panicked = send(server.post("/payments", Some("pay-13"), "3 EUR")).await;
    assert_eq!(
        (panicked.status, panicked.replayed),
        (500, false),
        "{panicked:?}"
    );
    assert_eq!(panicked.problem_type(), problem::HANDLER_PANICKED);
    let (title, detail) = panicked.problem_text();
    assert_eq!(title, "Request processing panicked", "{panicked:?}");
    assert!(!detail.contains("handler"), "{detail}");
    assert_eq!(server.executions(), 0, "the handler ran");
    assert!(
        !panicked.body.contains("store's begin"),
        "the panic's message reached the client: {panicked:?}"
    );
    // The retry runs, once.
    let retry = send(server.post("/payments", Some("pay-13"), "3 EUR")).await;
    assert_eq!((retry.status, retry.replayed), (201, false), "{retry:?}");
    let again = send(server.post("/payments", Some("pay-13"), "3 EUR")).await;
    assert_eq!((again.status, again.replayed), (201, true), "{again:?}");
    assert_eq!(server.executions(), 1);
    drop(backend);
}
