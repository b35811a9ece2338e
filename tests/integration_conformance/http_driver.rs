//! HTTP: the layer in front of an axum server, called over TCP by a real client.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use http::{HeaderMap, StatusCode};
use idempotask::Task;
use idempotask::store::{Store, UnitOfWork};
use idempotask_http::{IDEMPOTENT_REPLAYED, Idempotency};
use idempotask_redis::RedisStore;
use idempotask_test_support::RedisServer;
use idempotask_test_support::faulty_store::FaultyStore;

use super::{
    Body, Case, Driver, Effects, Fault, Integration, LOCK_TTL, Message, Seen, Step, ack,
    eventually, fault_off, fault_on, faulty_store, key_of, payload, steps,
};

static HTTP_TASK: Task = Task::new("conformance_http").lock_ttl(LOCK_TTL);

/// How long the slow handler takes: the held lock of the contended case, and the handler that
/// outlives its dropped client.
const SLOW_HANDLER: Duration = Duration::from_secs(1);

/// The stored response cap of the HTTP layer, under the unstorable response's size.
const MAX_STORED_BODY: usize = 64;

#[derive(Clone)]
struct Handlers {
    effects: Effects,
    started: Arc<AtomicU32>,
}

/// `POST /pay`: the body named by `X-Body` (not part of the fingerprint), counted under the
/// case key in `X-Case`.
async fn pay(State(handlers): State<Handlers>, headers: HeaderMap) -> Response {
    let header = |name: &str| headers.get(name).unwrap().to_str().unwrap().to_owned();
    let (key, body) = (header("x-case"), Body::parse(&header("x-body")));
    handlers.started.fetch_add(1, Ordering::SeqCst);
    match body {
        Body::Ok => {
            handlers.effects.add(&key);
            (StatusCode::CREATED, "charged").into_response()
        }
        Body::Err => (StatusCode::SERVICE_UNAVAILABLE, "the ledger is down").into_response(),
        Body::Panic => panic!("the ledger client panicked"),
        Body::Hang => {
            tokio::time::sleep(SLOW_HANDLER).await;
            handlers.effects.add(&key);
            (StatusCode::CREATED, "charged, slowly").into_response()
        }
        Body::Unstorable => {
            handlers.effects.add(&key);
            (StatusCode::CREATED, "x".repeat(4 * MAX_STORED_BODY)).into_response()
        }
    }
}

async fn serve(layer: Idempotency, handlers: Handlers) -> String {
    let app = Router::new()
        .route("/pay", post(pay))
        .layer(layer)
        .with_state(handlers);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    base
}

pub(super) struct Http {
    _redis: RedisServer,
    store: FaultyStore<RedisStore>,
    handlers: Handlers,
    /// The layer on the store.
    base: String,
    /// The same task's layer with no store, and none installed: misconfigured.
    misconfigured: String,
    client: reqwest::Client,
}

impl Http {
    pub(super) async fn start() -> Self {
        let (redis, store) = faulty_store().await;
        let handlers = Handlers {
            effects: Effects::default(),
            started: Arc::default(),
        };
        let layer = |store: Option<&FaultyStore<RedisStore>>| {
            let layer = Idempotency::new(HTTP_TASK.clone())
                .require_key(true)
                .max_stored_body(MAX_STORED_BODY);
            match store {
                Some(store) => layer.store(store.clone()),
                None => layer,
            }
        };
        let base = serve(layer(Some(&store)), handlers.clone()).await;
        let misconfigured = serve(layer(None), handlers.clone()).await;
        Self {
            _redis: redis,
            store,
            handlers,
            base,
            misconfigured,
            client: reqwest::Client::new(),
        }
    }

    fn request(
        &self,
        base: &str,
        key: &str,
        message: Message,
        body: Body,
    ) -> reqwest::RequestBuilder {
        let request = self
            .client
            .post(format!("{base}/pay"))
            .header("x-case", key)
            .header("x-body", format!("{body:?}"))
            .body(payload(key, message));
        match message {
            Message::Keyed | Message::OtherPayload => request.header("idempotency-key", key),
            Message::LongKey => request.header("idempotency-key", "k".repeat(300)),
            Message::Unkeyed => request,
        }
    }

    /// What the client saw of one request: its status and whether it says it was replayed.
    async fn send(request: reqwest::RequestBuilder) -> Option<(u16, bool)> {
        let response = request.send().await.ok()?;
        let replayed = response.headers().get(IDEMPOTENT_REPLAYED).is_some();
        let status = response.status().as_u16();
        response.bytes().await.ok()?;
        Some((status, replayed))
    }

    /// Waits until a handler has started since the count was `since`.
    async fn handler_started(&self, since: u32) {
        let handlers = self.handlers.clone();
        eventually("the slow handler never started", || {
            let handlers = handlers.clone();
            async move { handlers.started.load(Ordering::SeqCst) > since }
        })
        .await;
    }
}

impl Driver for Http {
    const INTEGRATION: Integration = Integration::Http;

    fn effects(&self) -> &Effects {
        &self.handlers.effects
    }

    async fn start(&mut self, _case: Case) {
        self.store.down(false);
    }

    async fn step(&mut self, case: Case, step: Step) -> Seen {
        let key = key_of(Self::INTEGRATION, case);
        let base = if step.fault == Fault::Reenter {
            &self.misconfigured
        } else {
            &self.base
        };
        let before = self.effects().of(&key);
        fault_on(&self.store, step.fault);
        // Another client's request with the same key and payload, slow, holds the lock.
        let holder = if step.fault == Fault::Holder {
            let started = self.handlers.started.load(Ordering::SeqCst);
            let slow = self.request(base, &key, step.message, Body::Hang);
            let holder = tokio::spawn(Self::send(slow));
            self.handler_started(started).await;
            Some(holder)
        } else {
            None
        };
        let request = self.request(base, &key, step.message, step.body);
        let answer = if step.body == Body::Hang {
            // The client goes away once the slow handler runs, however long the request took
            // to reach it; the handler cannot answer before its client is gone, being slow.
            let started = self.handlers.started.load(Ordering::SeqCst);
            tokio::select! {
                biased;
                () = self.handler_started(started) => None,
                answer = Self::send(request) => panic!("the slow handler answered: {answer:?}"),
            }
        } else {
            Self::send(request).await
        };
        fault_off(&self.store, step.fault);
        if let Some(holder) = holder {
            let (status, _) = holder.await.unwrap().expect("the holder got an answer");
            assert_eq!(status, 201, "the holder's request");
        }
        let Some((status, replayed)) = answer else {
            assert_eq!(
                step.body,
                Body::Hang,
                "no answer to a request that was not dropped"
            );
            // The handler runs on without its client; its response is stored for the retry.
            let effects = self.effects().clone();
            eventually("the detached handler never finished", || {
                let effects = effects.clone();
                let key = key.clone();
                async move { effects.of(&key) > before }
            })
            .await;
            let unit = UnitOfWork::new(HTTP_TASK.name(), key.as_str()).unwrap();
            eventually("the detached handler's response was never stored", || {
                let (store, unit) = (self.store.clone(), unit.clone());
                async move { store.inspect(&unit).await.unwrap().is_done() }
            })
            .await;
            return Seen::NoAnswer;
        };
        let ran = self.effects().of(&key) > before;
        match status {
            200..=299 => {
                assert_eq!(
                    replayed, !ran,
                    "Idempotent-Replayed: {replayed}, but ran: {ran}"
                );
                ack(ran)
            }
            409 | 500..=599 => Seen::Retry,
            400..=499 => Seen::DeadLetter,
            other => panic!("status {other}"),
        }
    }

    async fn end(&mut self, case: Case, seen: &[Seen]) {
        // A stored response is still there: one more retry replays it, and runs nothing.
        if matches!(seen.last(), Some(Seen::Ran | Seen::Replayed)) {
            let key = key_of(Self::INTEGRATION, case);
            let before = self.effects().of(&key);
            let last = steps(case).last().copied().unwrap();
            let retry = self.request(&self.base, &key, last.message, Body::Ok);
            let answer = Self::send(retry).await;
            assert_eq!(answer, Some((201, true)), "the retry after the case");
            assert_eq!(
                self.effects().of(&key),
                before,
                "the retry after the case ran"
            );
        }
    }
}
