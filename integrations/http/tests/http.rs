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
use idempotask::{InDoubt, LockRenewal, Task};
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

#[path = "http/once.rs"]
mod once;
use once::{
    a_client_that_goes_away_mid_handler_gets_the_stored_response_on_retry,
    a_handler_slower_than_the_lock_ttl_keeps_its_lock,
    a_key_reused_with_another_body_is_422_and_runs_nothing,
    concurrent_duplicates_run_the_handler_once, waiting_duplicates_all_get_the_first_response,
};
#[path = "http/keys.rs"]
mod keys;
use keys::{
    a_chunked_body_over_the_cap_is_413_and_runs_nothing,
    a_key_from_the_body_and_the_stored_headers, json_numbers_count_by_their_exact_text,
    missing_and_malformed_keys, scopes_keep_equal_keys_apart, the_size_caps,
    what_counts_in_the_fingerprint,
};
#[path = "http/released.rs"]
mod released;
use released::{
    a_damaged_stored_response_is_410_and_runs_nothing,
    a_key_in_doubt_is_409_without_retry_after_and_runs_nothing,
    a_panic_outside_the_handler_is_500_and_does_not_blame_the_handler,
    a_panicking_handler_is_500_and_its_retry_runs, a_request_costs_one_begin_and_one_finish,
    a_request_refused_as_malformed_is_not_stored_and_the_corrected_one_runs,
    a_server_error_releases_the_key_and_the_retry_runs,
    throttled_and_timed_out_answers_release_the_key,
};

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
