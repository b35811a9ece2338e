//! What is stored and what is released: server errors, throttled and timed-out answers,
//! requests refused as malformed, panics, a damaged stored response, a key in doubt, and the store
//! operations one request costs.

#[allow(clippy::wildcard_imports)]
use super::*;

pub(super) async fn a_server_error_releases_the_key_and_the_retry_runs(backend: Backend) {
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

pub(super) async fn throttled_and_timed_out_answers_release_the_key(backend: Backend) {
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

// axum's `Json` refused a request without `Content-Type` with `415`, the layer stored it, and
// the corrected request (same key and body, `Content-Type: application/json`) got that `415`
// replayed for the result TTL, its handler never run.
pub(super) async fn a_request_refused_as_malformed_is_not_stored_and_the_corrected_one_runs(
    backend: Backend,
) {
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
pub(super) async fn a_panicking_handler_is_500_and_its_retry_runs(backend: Backend) {
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

pub(super) async fn a_damaged_stored_response_is_410_and_runs_nothing(backend: Backend) {
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

pub(super) async fn a_key_in_doubt_is_409_without_retry_after_and_runs_nothing(backend: Backend) {
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

/// A store that counts the operations the layer asks of it, in front of the backend's, and
/// panics once on `panic_once_on` when it is set.
#[derive(Debug)]
pub(super) struct Counted {
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

pub(super) async fn a_request_costs_one_begin_and_one_finish(backend: Backend) {
    let calls = Arc::new(std::sync::Mutex::new(Vec::new()));
    let counted = Counted::new(backend.store.clone(), Arc::clone(&calls));
    // No renewal: a request slowed past a third of the lock TTL would add a `renew`.
    let layer = Idempotency::new(Task::new("http_round_trips"))
        .store(counted)
        .lock_renewal(LockRenewal::Off);
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

// A panic outside the handler (here the store's, before the handler ran) was answered "Handler
// panicked", blaming a handler that never ran.
pub(super) async fn a_panic_outside_the_handler_is_500_and_does_not_blame_the_handler(
    backend: Backend,
) {
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
