//! The integrations' conformance harness: one table of outcome classes, each driven through
//! NATS JetStream, RabbitMQ, apalis and HTTP on real servers (`nats-server`, a RabbitMQ node,
//! an axum server called over TCP, and a Redis for the store behind every one of them), each
//! checked against the action its crate's docs promise, and after each case that no side
//! effect ran twice and no message was left unsettled.
//!
//! | case | what the test does | NATS | RabbitMQ | apalis | HTTP |
//! | --- | --- | --- | --- | --- | --- |
//! | `Ok` | the body succeeds | ran | ran | ran | ran |
//! | `Duplicate` | a second copy after it | ran, replayed | ran, replayed | ran, replayed | ran, replayed |
//! | `Err` | the body fails once, then succeeds | retry, ran | retry, ran | retry, ran | retry (its `503`), ran |
//! | `Panic` | the body panics once, then succeeds | retry, ran | retry, ran | retry, ran | retry (`500`), ran |
//! | `PoisonPanic` | the body panics on every delivery (`max_failures` 3) | retry, retry, dead letter | retry, retry, dead letter | retry ×3 (apalis's own policy ends it) | retry ×3 |
//! | `Dropped` | the call is dropped inside the body (the consumer's task is gone; the HTTP client goes away) | no answer, ran | no answer (channel closed), ran | no answer, ran | no answer, replayed (the handler ran detached) |
//! | `StoreDownBeforeBegin` | the store refuses every operation, then is back | retry, ran | retry, ran | retry, ran | retry (`503`), ran |
//! | `AmbiguousFinish` | `finish` applies and its reply is lost; then a copy | ran, replayed | ran, replayed | ran, replayed | ran, replayed |
//! | `Contended` | another holder has the key's lock, then finishes | retry, replayed | retry, replayed | retry, replayed | retry (`409`), replayed |
//! | `MissingKey` | a message without a key | dead letter | dead letter | dead letter | dead letter (`400`) |
//! | `InvalidKey` | a key over the store's (or the header's) limit | dead letter | dead letter | dead letter | dead letter (`400`) |
//! | `KeyReuse` | the key again with another payload, differing in its last byte | ran, dead letter | ran, dead letter | ran, replayed (apalis has no fingerprint: the key names the job) | ran, dead letter (`422`) |
//! | `Misuse` | the consumer calls the task from the task's own body (HTTP: a layer with no store) | retry, ran | retry, ran | retry, ran | retry (`500`), ran |
//! | `Unstorable` | the result has no JSON form (`NaN`; HTTP: a response over the stored cap); then a copy | ran, dead letter | ran, dead letter | ran, dead letter | ran, dead letter (`410`) |
//!
//! "retry" is the integration's way of delivering again later (NATS `-NAK` with a delay,
//! RabbitMQ the retry queue, apalis a retryable error, HTTP a `5xx` or `409` with nothing
//! stored); "dead letter" its way of never again (`+TERM` and its advisory, `basic.reject` to
//! the dead-letter queue, apalis `AbortError`, an HTTP `4xx`). "ran" and "replayed" are acks
//! told apart by the side-effect count, not by what the integration says of itself.
//!
//! What the broker saw decides, not only the returned value: a NATS ack moves the consumer's
//! ack floor, a `+TERM` publishes its advisory, a nak brings the message back well before
//! `AckWait`; a RabbitMQ retry comes back from the retry queue, a dead letter is counted in the
//! dead-letter queue, and after each case the consumer's channel is closed and every queue must
//! be empty (an unacked delivery would go back to its queue); an HTTP replay carries
//! `Idempotent-Replayed: true`, and after an acked case one more retry must be replayed.

use std::collections::HashMap;
use std::future::poll_fn;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use apalis::prelude::{AbortError, BoxDynError, Service, Task as Job, TaskBuilder};
use async_nats::jetstream::{self, AckKind, consumer::PullConsumer, consumer::pull};
use axum::Router;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use futures_util::StreamExt;
use http::{HeaderMap, StatusCode};
use idempotask::{Backoff, RetryPolicy, Task, catch_panic};
use idempotask_apalis::IdempotencyKey;
use idempotask_http::{IDEMPOTENT_REPLAYED, Idempotency};
use idempotask_lapin::{Settled, Topology};
use idempotask_redis::RedisStore;
use idempotask_test_support::RedisServer;
use idempotask_test_support::faulty_store::FaultyStore;
use idempotask_test_support::nats::NatsServer;
use idempotask_test_support::rabbitmq::RabbitServer;
use lapin::options::{
    BasicConsumeOptions, BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, Consumer};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

/// Every task's lock TTL: short, so that a dropped call's lock is soon gone.
const LOCK_TTL: Duration = Duration::from_millis(300);
/// The body failures after which a message is dead-lettered (NATS and RabbitMQ).
const MAX_FAILURES: u32 = 3;
/// The redelivery delays after body failures and store errors (NATS and RabbitMQ).
const QUEUE_BACKOFF: Backoff = Backoff::new(Duration::from_millis(20), Duration::from_millis(100));
/// The NATS consumers' `AckWait`, after which JetStream redelivers an unacked message.
const ACK_WAIT: Duration = Duration::from_secs(2);
/// A nak'd NATS message comes back before this, well before `AckWait`: every delay the
/// consumer is given is at most the lock TTL.
const NAK_BOUND: Duration = Duration::from_millis(1200);
/// How long a test waits for what the broker must do; a failure, not a pause.
const WAIT: Duration = Duration::from_secs(5);
/// How long a call runs inside a hanging body before the test drops it.
const DROP_AFTER: Duration = Duration::from_millis(200);

static NATS_TASK: Task = Task::new("conformance_nats")
    .lock_ttl(LOCK_TTL)
    .retry(RetryPolicy::no_wait());
static RABBIT_TASK: Task = Task::new("conformance_rabbitmq")
    .lock_ttl(LOCK_TTL)
    .retry(RetryPolicy::no_wait());
static APALIS_TASK: Task = Task::new("conformance_apalis")
    .lock_ttl(LOCK_TTL)
    .retry(RetryPolicy::no_wait());
static HTTP_TASK: Task = Task::new("conformance_http").lock_ttl(LOCK_TTL);

// ---------------------------------------------------------------------------------------------
// The table

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Case {
    Ok,
    Duplicate,
    Err,
    Panic,
    PoisonPanic,
    Dropped,
    StoreDownBeforeBegin,
    AmbiguousFinish,
    Contended,
    MissingKey,
    InvalidKey,
    KeyReuse,
    Misuse,
    Unstorable,
}

const CASES: [Case; 14] = [
    Case::Ok,
    Case::Duplicate,
    Case::Err,
    Case::Panic,
    Case::PoisonPanic,
    Case::Dropped,
    Case::StoreDownBeforeBegin,
    Case::AmbiguousFinish,
    Case::Contended,
    Case::MissingKey,
    Case::InvalidKey,
    Case::KeyReuse,
    Case::Misuse,
    Case::Unstorable,
];

/// What became of one delivery, normalised across the integrations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    /// Acked, and the side effect ran during the delivery.
    Ran,
    /// Acked, and no side effect ran: the stored result answered.
    Replayed,
    /// Delivered again later: nak with a delay, the retry queue, a retryable error, `5xx`/`409`.
    Retry,
    /// Never delivered again: `+TERM`, the dead-letter queue, `AbortError`, a `4xx`.
    DeadLetter,
    /// The call was dropped before it answered.
    NoAnswer,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Integration {
    Nats,
    RabbitMq,
    Apalis,
    Http,
}

impl Integration {
    fn name(self) -> &'static str {
        match self {
            Self::Nats => "nats",
            Self::RabbitMq => "rabbitmq",
            Self::Apalis => "apalis",
            Self::Http => "http",
        }
    }
}

/// What the body does on one delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
enum Body {
    /// The side effect, then `Ok(1.0)`.
    Ok,
    /// An error before the side effect.
    Err,
    /// A panic before the side effect.
    Panic,
    /// Waits for ever before the side effect (HTTP: a slow handler that then does it).
    Hang,
    /// The side effect, then a result with no JSON form (HTTP: a response over the stored cap).
    Unstorable,
}

impl Body {
    fn parse(text: &str) -> Self {
        match text {
            "Ok" => Self::Ok,
            "Err" => Self::Err,
            "Panic" => Self::Panic,
            "Hang" => Self::Hang,
            "Unstorable" => Self::Unstorable,
            other => panic!("no body {other}"),
        }
    }
}

/// Which message a step delivers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Message {
    /// The case's key, and the case's payload.
    Keyed,
    /// No key at all.
    Unkeyed,
    /// A key over every limit.
    LongKey,
    /// The case's key, and a payload that differs in its last byte.
    OtherPayload,
}

/// What the test does to the store or the consumer around a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    None,
    StoreDown,
    LoseFinishReply,
    /// Another worker holds the key's lock during the step, and finishes after it.
    Holder,
    /// The consumer runs the delivery from inside the task's own call of the same key.
    Reenter,
}

/// One delivery of a case.
#[derive(Debug, Clone, Copy)]
struct Step {
    /// The previous delivery coming back (rather than a new message).
    again: bool,
    message: Message,
    body: Body,
    fault: Fault,
}

const fn new(message: Message, body: Body, fault: Fault) -> Step {
    Step {
        again: false,
        message,
        body,
        fault,
    }
}

const fn again(body: Body) -> Step {
    Step {
        again: true,
        message: Message::Keyed,
        body,
        fault: Fault::None,
    }
}

fn steps(case: Case) -> Vec<Step> {
    use Body as B;
    use Fault as F;
    use Message as M;
    match case {
        Case::Ok => vec![new(M::Keyed, B::Ok, F::None)],
        Case::Duplicate => vec![new(M::Keyed, B::Ok, F::None), new(M::Keyed, B::Ok, F::None)],
        Case::Err => vec![new(M::Keyed, B::Err, F::None), again(B::Ok)],
        Case::Panic => vec![new(M::Keyed, B::Panic, F::None), again(B::Ok)],
        Case::PoisonPanic => vec![
            new(M::Keyed, B::Panic, F::None),
            again(B::Panic),
            again(B::Panic),
        ],
        Case::Dropped => vec![new(M::Keyed, B::Hang, F::None), again(B::Ok)],
        Case::StoreDownBeforeBegin => vec![new(M::Keyed, B::Ok, F::StoreDown), again(B::Ok)],
        Case::AmbiguousFinish => vec![
            new(M::Keyed, B::Ok, F::LoseFinishReply),
            new(M::Keyed, B::Ok, F::None),
        ],
        Case::Contended => vec![new(M::Keyed, B::Ok, F::Holder), again(B::Ok)],
        Case::MissingKey => vec![new(M::Unkeyed, B::Ok, F::None)],
        Case::InvalidKey => vec![new(M::LongKey, B::Ok, F::None)],
        Case::KeyReuse => vec![
            new(M::Keyed, B::Ok, F::None),
            new(M::OtherPayload, B::Ok, F::None),
        ],
        Case::Misuse => vec![new(M::Keyed, B::Ok, F::Reenter), again(B::Ok)],
        Case::Unstorable => vec![
            new(M::Keyed, B::Unstorable, F::None),
            new(M::Keyed, B::Unstorable, F::None),
        ],
    }
}

/// What each integration's docs promise for `case`: what each delivery becomes, and how many
/// times the side effect runs in all.
fn expected(integration: Integration, case: Case) -> (Vec<Seen>, u32) {
    use Integration as I;
    use Seen as S;
    match (case, integration) {
        (Case::Ok, _) => (vec![S::Ran], 1),
        (Case::Duplicate | Case::AmbiguousFinish, _) | (Case::KeyReuse, I::Apalis) => {
            (vec![S::Ran, S::Replayed], 1)
        }
        (Case::Err | Case::Panic | Case::StoreDownBeforeBegin | Case::Misuse, _) => {
            (vec![S::Retry, S::Ran], 1)
        }
        (Case::PoisonPanic, I::Nats | I::RabbitMq) => (vec![S::Retry, S::Retry, S::DeadLetter], 0),
        (Case::PoisonPanic, I::Apalis | I::Http) => (vec![S::Retry, S::Retry, S::Retry], 0),
        (Case::Dropped, I::Http) => (vec![S::NoAnswer, S::Replayed], 1),
        (Case::Dropped, _) => (vec![S::NoAnswer, S::Ran], 1),
        (Case::Contended, _) => (vec![S::Retry, S::Replayed], 1),
        (Case::MissingKey | Case::InvalidKey, _) => (vec![S::DeadLetter], 0),
        (Case::KeyReuse | Case::Unstorable, _) => (vec![S::Ran, S::DeadLetter], 1),
    }
}

// ---------------------------------------------------------------------------------------------
// The runner

/// Side effects by case key: the count that must never pass one.
#[derive(Debug, Clone, Default)]
struct Effects(Arc<Mutex<HashMap<String, u32>>>);

impl Effects {
    fn add(&self, key: &str) {
        *self
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(key.to_owned())
            .or_default() += 1;
    }

    fn of(&self, key: &str) -> u32 {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(key)
            .copied()
            .unwrap_or(0)
    }
}

/// The body's own error.
#[derive(Debug, thiserror::Error)]
#[error("the card was declined")]
struct Declined;

/// The error of a call that wraps a consumer in the task's own call (the misuse case): it
/// gives up after its inner delivery, so it stores nothing.
#[derive(Debug, thiserror::Error)]
enum Wrapper {
    #[error("the wrapper gives up after its inner delivery")]
    GivesUp,
    #[error(transparent)]
    Idempotask(#[from] idempotask::Error),
}

/// `body` as a queue consumer's body for `key`: what it does, and the side effect it counts.
async fn run_body(effects: Effects, key: String, body: Body) -> Result<f64, Declined> {
    match body {
        Body::Ok => {
            effects.add(&key);
            Ok(1.0)
        }
        Body::Unstorable => {
            effects.add(&key);
            Ok(f64::NAN)
        }
        Body::Err => Err(Declined),
        Body::Panic => panic!("the ledger client panicked"),
        Body::Hang => {
            std::future::pending::<()>().await;
            unreachable!("pending never ends")
        }
    }
}

/// The key of `case` on `integration`, and the payload `message` carries.
fn key_of(integration: Integration, case: Case) -> String {
    format!("{}-{case:?}", integration.name())
}

fn payload(key: &str, message: Message) -> String {
    match message {
        Message::Keyed => format!(r#"{{"key":"{key}","amount":5}}"#),
        Message::OtherPayload => format!(r#"{{"key":"{key}","amount":6}}"#),
        Message::Unkeyed => r#"{"amount":5}"#.to_owned(),
        Message::LongKey => format!(r#"{{"key":"{}","amount":5}}"#, "k".repeat(2000)),
    }
}

#[derive(Deserialize)]
struct Keyed {
    key: String,
}

fn key_in(payload: &[u8]) -> Option<String> {
    serde_json::from_slice::<Keyed>(payload)
        .ok()
        .map(|keyed| keyed.key)
}

/// Seen for an ack: whether the side effect ran during it.
fn ack(ran: bool) -> Seen {
    if ran { Seen::Ran } else { Seen::Replayed }
}

/// One integration on its real server.
trait Driver {
    const INTEGRATION: Integration;

    fn effects(&self) -> &Effects;

    /// Sets up what the case needs (its own queue, consumer or stream subject).
    async fn start(&mut self, case: Case);

    /// Delivers `step` and reads back what became of it.
    async fn step(&mut self, case: Case, step: Step) -> Seen;

    /// Checks that nothing of the case is left unsettled or lost.
    async fn end(&mut self, case: Case, seen: &[Seen]);
}

/// Runs every case through `driver`, then fails with the whole table if any case went wrong.
async fn conform<D: Driver>(mut driver: D) {
    let integration = D::INTEGRATION;
    let started = Instant::now();
    let mut failures = Vec::new();
    for case in CASES {
        let key = key_of(integration, case);
        let (want, want_effects) = expected(integration, case);
        // What was seen before a check failed stays for the report.
        let seen = Mutex::new(Vec::new());
        let run = catch_panic(async {
            driver.start(case).await;
            for step in steps(case) {
                let what = driver.step(case, step).await;
                seen.lock().unwrap().push(what);
            }
            let so_far = seen.lock().unwrap().clone();
            driver.end(case, &so_far).await;
        })
        .await;
        let seen = seen.into_inner().unwrap_or_else(PoisonError::into_inner);
        let effects = driver.effects().of(&key);
        let verdict = match run {
            Err(panic) => Err(format!(
                "after {seen:?} (the docs say {want:?}): {}",
                panic.message()
            )),
            Ok(()) if seen != want => Err(format!("saw {seen:?}, the docs say {want:?}")),
            Ok(()) if effects > 1 => Err(format!("the side effect ran {effects} times")),
            Ok(()) if effects != want_effects => Err(format!(
                "the side effect ran {effects} times, expected {want_effects}"
            )),
            Ok(()) => Ok(seen),
        };
        match verdict {
            Ok(seen) => println!(
                "{} {case:?}: ok {seen:?}, effects {effects}",
                integration.name()
            ),
            Err(why) => {
                println!("{} {case:?}: FAILED: {why}", integration.name());
                failures.push(format!("{case:?}: {why}"));
            }
        }
    }
    println!(
        "{}: {} cases, {} failed, in {:.1} s",
        integration.name(),
        CASES.len(),
        failures.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(
        failures.is_empty(),
        "{}: {} of {} cases failed:\n{}",
        integration.name(),
        failures.len(),
        CASES.len(),
        failures.join("\n")
    );
}

/// A Redis of the test's own behind fault switches.
async fn faulty_store() -> (RedisServer, FaultyStore<RedisStore>) {
    let redis = RedisServer::start();
    let store = RedisStore::builder(redis.url())
        .connection_timeout(Duration::from_millis(500))
        .response_timeout(Duration::from_millis(500))
        .connect()
        .await
        .unwrap();
    (redis, FaultyStore::new(store))
}

/// Polls `done` every 20 ms; panics with `what` after [`WAIT`].
async fn eventually<F: Future<Output = bool>>(what: &str, mut done: impl FnMut() -> F) {
    let deadline = Instant::now() + WAIT;
    while !done().await {
        assert!(Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A call of `task` holding `key`'s lock until `finish` fires, as another worker would; its
/// body is the side effect. Answers once the lock is held.
async fn hold(
    task: &'static Task,
    store: &FaultyStore<RedisStore>,
    effects: &Effects,
    key: &str,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    let (held, held_rx) = tokio::sync::oneshot::channel();
    let (finish, finish_rx) = tokio::sync::oneshot::channel::<()>();
    let (store, effects, key) = (store.clone(), effects.clone(), key.to_owned());
    // Renewed, so that the lock outlives a step slowed down by a busy machine.
    let task = task.clone().renew(true);
    let holder = tokio::spawn(async move {
        let done: Result<f64, idempotask::Error> = task
            .call(key.clone())
            .store(store)
            .run(async {
                held.send(()).unwrap();
                finish_rx.await.unwrap();
                effects.add(&key);
                Ok(2.0)
            })
            .await;
        done.unwrap();
    });
    held_rx.await.expect("the holder took the lock");
    (finish, holder)
}

/// Runs `inner` inside a call of `task` with `key`, which gives up afterwards: the consumer
/// that reenters its own task.
async fn reentered<T>(
    task: &'static Task,
    store: &FaultyStore<RedisStore>,
    key: &str,
    inner: impl Future<Output = T>,
) -> T {
    let slot = Mutex::new(None);
    let outer: Result<(), Wrapper> = task
        .call(key)
        .store(store.clone())
        .run(async {
            *slot.lock().unwrap() = Some(inner.await);
            Err(Wrapper::GivesUp)
        })
        .await;
    assert!(matches!(outer, Err(Wrapper::GivesUp)), "{outer:?}");
    slot.into_inner().unwrap().expect("the inner delivery ran")
}

/// Switches the step's store fault on; [`fault_off`] checks it fired and switches it off.
fn fault_on(store: &FaultyStore<RedisStore>, fault: Fault) {
    match fault {
        Fault::StoreDown => store.down(true),
        Fault::LoseFinishReply => store.lose_next_finish_reply(),
        _ => {}
    }
}

fn fault_off(store: &FaultyStore<RedisStore>, fault: Fault) {
    store.down(false);
    if fault == Fault::LoseFinishReply {
        assert!(
            !store.finish_reply_pending(),
            "the delivery never reached `finish`"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// NATS JetStream

const STREAM: &str = "CONFORMANCE";

struct Nats {
    _server: NatsServer,
    _redis: RedisServer,
    client: async_nats::Client,
    js: jetstream::Context,
    stream: jetstream::stream::Stream,
    store: FaultyStore<RedisStore>,
    effects: Effects,
    case: Option<NatsCase>,
}

struct NatsCase {
    consumer: PullConsumer,
    messages: pull::Stream,
    advisories: async_nats::Subscriber,
    last: Option<(u64, Instant, AckKind)>,
}

impl Nats {
    async fn start() -> Self {
        let nats = NatsServer::start();
        let (redis, store) = faulty_store().await;
        let client = async_nats::connect(nats.url()).await.unwrap();
        let js = jetstream::new(client.clone());
        let stream = js
            .create_stream(jetstream::stream::Config {
                name: STREAM.to_owned(),
                subjects: vec!["conformance.>".to_owned()],
                ..Default::default()
            })
            .await
            .unwrap();
        Self {
            _server: nats,
            _redis: redis,
            client,
            js,
            stream,
            store,
            effects: Effects::default(),
            case: None,
        }
    }

    fn consumer(&self) -> idempotask_nats::Idempotent<fn(&jetstream::Message) -> Option<String>> {
        let by_key: fn(&jetstream::Message) -> Option<String> = |message| key_in(&message.payload);
        idempotask_nats::Idempotent::new(NATS_TASK.clone(), by_key)
            .store(self.store.clone())
            .ack_wait(ACK_WAIT)
            .failure_backoff(QUEUE_BACKOFF)
            .store_backoff(QUEUE_BACKOFF)
            .max_failures(MAX_FAILURES)
            .fingerprint_payload(true)
    }
}

impl Driver for Nats {
    const INTEGRATION: Integration = Integration::Nats;

    fn effects(&self) -> &Effects {
        &self.effects
    }

    async fn start(&mut self, case: Case) {
        self.store.down(false);
        let name = format!("{case:?}");
        let consumer = self
            .stream
            .create_consumer(pull::Config {
                durable_name: Some(name.clone()),
                filter_subject: format!("conformance.{name}"),
                ack_wait: ACK_WAIT,
                ..Default::default()
            })
            .await
            .unwrap();
        let messages = consumer.messages().await.unwrap();
        let advisories = self
            .client
            .subscribe(format!(
                "$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED.{STREAM}.{name}"
            ))
            .await
            .unwrap();
        self.client.flush().await.unwrap();
        self.case = Some(NatsCase {
            consumer,
            messages,
            advisories,
            last: None,
        });
    }

    async fn step(&mut self, case: Case, step: Step) -> Seen {
        let key = key_of(Self::INTEGRATION, case);
        let idempotent = self.consumer();
        let state = self.case.as_mut().unwrap();
        if !step.again {
            self.js
                .publish(
                    format!("conformance.{case:?}"),
                    payload(&key, step.message).into(),
                )
                .await
                .unwrap()
                .await
                .unwrap();
        }
        let message = tokio::time::timeout(ACK_WAIT + WAIT, state.messages.next())
            .await
            .expect("JetStream delivers the message (none came: it is lost)")
            .unwrap()
            .unwrap();
        let sequence = message.info().unwrap().stream_sequence;
        if step.again {
            let (last, at, kind) = state.last.expect("a delivery to come back");
            assert_eq!(
                sequence, last,
                "another message came instead of the one nak'd"
            );
            if matches!(kind, AckKind::Nak(_)) {
                let after = at.elapsed();
                assert!(
                    after < NAK_BOUND,
                    "the nak'd message came back after {after:?}, as if never nak'd (AckWait {ACK_WAIT:?})"
                );
            }
        }
        let before = self.effects.of(&key);
        let body = run_body(self.effects.clone(), key.clone(), step.body);
        fault_on(&self.store, step.fault);
        let holder = if step.fault == Fault::Holder {
            Some(hold(&NATS_TASK, &self.store, &self.effects, &key).await)
        } else {
            None
        };
        let handled = if step.body == Body::Hang {
            let dropped = tokio::time::timeout(DROP_AFTER, idempotent.handle(&message, body)).await;
            assert!(dropped.is_err(), "the hanging body ended");
            None
        } else if step.fault == Fault::Reenter {
            Some(
                reentered(
                    &NATS_TASK,
                    &self.store,
                    &key,
                    idempotent.handle(&message, body),
                )
                .await,
            )
        } else {
            Some(idempotent.handle(&message, body).await)
        };
        fault_off(&self.store, step.fault);
        if let Some((finish, holder)) = holder {
            finish.send(()).unwrap();
            holder.await.unwrap();
        }
        let Some(handled) = handled else {
            state.last = Some((sequence, Instant::now(), AckKind::Progress));
            return Seen::NoAnswer;
        };
        let handled = handled.unwrap_or_else(|err| panic!("the ack was not sent: {err}"));
        let kind = handled.ack_kind();
        state.last = Some((sequence, Instant::now(), kind));
        match kind {
            AckKind::Ack => {
                consumer_until(&mut state.consumer, "JetStream never saw the ack", |info| {
                    info.ack_floor.stream_sequence >= sequence
                })
                .await;
                ack(self.effects.of(&key) > before)
            }
            AckKind::Nak(_) => Seen::Retry,
            AckKind::Term => {
                let advisory = tokio::time::timeout(WAIT, state.advisories.next())
                    .await
                    .expect("a MSG_TERMINATED advisory for the terminated message")
                    .unwrap();
                let advisory: serde_json::Value =
                    serde_json::from_slice(&advisory.payload).unwrap();
                assert_eq!(advisory["stream_seq"].as_u64(), Some(sequence));
                Seen::DeadLetter
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    async fn end(&mut self, _case: Case, _seen: &[Seen]) {
        let state = self.case.as_mut().unwrap();
        consumer_until(
            &mut state.consumer,
            "a message is left pending or unacked after the case",
            |info| info.num_pending == 0 && info.num_ack_pending == 0,
        )
        .await;
        self.case = None;
    }
}

/// Polls the consumer's info until `done` holds; panics with `what` and the info after
/// [`WAIT`]. Acks are sent without waiting for a reply, so the server applies them a moment
/// after `handle` returns.
async fn consumer_until(
    consumer: &mut PullConsumer,
    what: &str,
    done: impl Fn(&jetstream::consumer::Info) -> bool,
) {
    let deadline = Instant::now() + WAIT;
    loop {
        let info = consumer.info().await.unwrap();
        if done(info) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: {} pending, {} unacked, ack floor {}, {} delivered",
            info.num_pending,
            info.num_ack_pending,
            info.ack_floor.stream_sequence,
            info.delivered.consumer_sequence,
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats() {
    Box::pin(conform(Nats::start().await)).await;
}

// ---------------------------------------------------------------------------------------------
// RabbitMQ

struct Rabbit {
    _redis: RedisServer,
    connection: Connection,
    /// Publishes the test's messages and the retry queues' copies; stays open.
    publisher: Channel,
    store: FaultyStore<RedisStore>,
    effects: Effects,
    case: Option<RabbitCase>,
}

struct RabbitCase {
    topology: Topology,
    consumer: idempotask_lapin::Idempotent<fn(&lapin::message::Delivery) -> Option<String>>,
    /// The consuming channel, closed when the consumer "crashes" and at the end of the case.
    channel: Channel,
    deliveries: Consumer,
    dead: u32,
}

impl Rabbit {
    async fn start() -> Self {
        let (redis, store) = faulty_store().await;
        let url = tokio::task::spawn_blocking(|| RabbitServer::shared().url())
            .await
            .unwrap();
        let connection = Connection::connect(&url, ConnectionProperties::default())
            .await
            .unwrap();
        let publisher = connection.create_channel().await.unwrap();
        publisher
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .unwrap();
        Self {
            _redis: redis,
            connection,
            publisher,
            store,
            effects: Effects::default(),
            case: None,
        }
    }

    async fn consume(&self, queue: &str) -> (Channel, Consumer) {
        let channel = self.connection.create_channel().await.unwrap();
        let deliveries = channel
            .basic_consume(
                queue.into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        (channel, deliveries)
    }

    async fn depth(&self, queue: &str) -> u32 {
        self.publisher
            .queue_declare(
                queue.into(),
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .unwrap()
            .message_count()
    }
}

impl Driver for Rabbit {
    const INTEGRATION: Integration = Integration::RabbitMq;

    fn effects(&self) -> &Effects {
        &self.effects
    }

    async fn start(&mut self, case: Case) {
        self.store.down(false);
        let topology = Topology::new(format!("conformance-{case:?}"));
        let retries = topology.declare(&self.publisher).await.unwrap();
        let by_key: fn(&lapin::message::Delivery) -> Option<String> =
            |delivery| key_in(&delivery.data);
        let consumer = idempotask_lapin::Idempotent::new(RABBIT_TASK.clone(), by_key, retries)
            .store(self.store.clone())
            .failure_backoff(QUEUE_BACKOFF)
            .store_backoff(QUEUE_BACKOFF)
            .max_failures(MAX_FAILURES)
            .fingerprint_payload(true);
        let (channel, deliveries) = self.consume(topology.queue()).await;
        self.case = Some(RabbitCase {
            topology,
            consumer,
            channel,
            deliveries,
            dead: 0,
        });
    }

    async fn step(&mut self, case: Case, step: Step) -> Seen {
        let key = key_of(Self::INTEGRATION, case);
        let queue = self.case.as_ref().unwrap().topology.queue().to_owned();
        if !step.again {
            let confirm = self
                .publisher
                .basic_publish(
                    "".into(),
                    queue.as_str().into(),
                    BasicPublishOptions::default(),
                    payload(&key, step.message).as_bytes(),
                    BasicProperties::default(),
                )
                .await
                .unwrap()
                .await
                .unwrap();
            assert!(confirm.is_ack(), "{confirm:?}");
        }
        let state = self.case.as_mut().unwrap();
        let delivery = tokio::time::timeout(WAIT, state.deliveries.next())
            .await
            .expect("the broker delivers the message (none came: it is lost)")
            .expect("the consumer is open")
            .unwrap();
        if step.again {
            assert_eq!(key_in(&delivery.data).as_deref(), Some(key.as_str()));
        }
        let before = self.effects.of(&key);
        let (effects, body_key, body) = (self.effects.clone(), key.clone(), step.body);
        let body = move |_: &lapin::message::Delivery| run_body(effects, body_key, body);
        fault_on(&self.store, step.fault);
        let holder = if step.fault == Fault::Holder {
            Some(hold(&RABBIT_TASK, &self.store, &self.effects, &key).await)
        } else {
            None
        };
        let consumer = state.consumer.clone();
        let settled = if step.body == Body::Hang {
            let dropped = tokio::time::timeout(DROP_AFTER, consumer.process(delivery, body)).await;
            assert!(dropped.is_err(), "the hanging body ended");
            None
        } else if step.fault == Fault::Reenter {
            Some(
                reentered(
                    &RABBIT_TASK,
                    &self.store,
                    &key,
                    consumer.process(delivery, body),
                )
                .await,
            )
        } else {
            Some(consumer.process(delivery, body).await)
        };
        fault_off(&self.store, step.fault);
        if let Some((finish, holder)) = holder {
            finish.send(()).unwrap();
            holder.await.unwrap();
        }
        let Some(settled) = settled else {
            // The consumer is gone with its delivery unacked: its channel closes, and the
            // broker requeues the delivery for the next consumer, once the lock has lapsed.
            let state = self.case.as_mut().unwrap();
            state
                .channel
                .close(200, "the consumer crashed".into())
                .await
                .unwrap();
            tokio::time::sleep(2 * LOCK_TTL).await;
            let (channel, deliveries) = self.consume(&queue).await;
            let state = self.case.as_mut().unwrap();
            (state.channel, state.deliveries) = (channel, deliveries);
            return Seen::NoAnswer;
        };
        let settled = settled.unwrap_or_else(|err| panic!("not settled: {err:?}"));
        match settled {
            Settled::Acked(_) => ack(self.effects.of(&key) > before),
            Settled::Retrying { .. } => Seen::Retry,
            Settled::DeadLettered(_) => {
                let dead_letters = self
                    .case
                    .as_ref()
                    .unwrap()
                    .topology
                    .dead_letter_queue()
                    .to_owned();
                let want = self.case.as_ref().unwrap().dead + 1;
                eventually("the dead-letter queue never got the message", || {
                    let dead_letters = dead_letters.clone();
                    let this = &*self;
                    async move { this.depth(&dead_letters).await == want }
                })
                .await;
                self.case.as_mut().unwrap().dead = want;
                Seen::DeadLetter
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    async fn end(&mut self, _case: Case, _seen: &[Seen]) {
        let state = self.case.take().unwrap();
        // An unacked delivery goes back to its queue when the channel closes.
        state
            .channel
            .close(200, "the case is over".into())
            .await
            .unwrap();
        let topology = &state.topology;
        for (queue, want) in [
            (topology.queue(), 0),
            (topology.retry_queue(), 0),
            (topology.dead_letter_queue(), state.dead),
        ] {
            let depth = self.depth(queue).await;
            assert_eq!(
                depth, want,
                "{depth} messages in {queue} after the case, expected {want}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq() {
    Box::pin(conform(Rabbit::start().await)).await;
}

// ---------------------------------------------------------------------------------------------
// apalis

/// An apalis job: its case key (for counting side effects) and what its handler does.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Work {
    case_key: String,
    amount: u32,
    body: Body,
}

struct Apalis<S> {
    _redis: RedisServer,
    store: FaultyStore<RedisStore>,
    effects: Effects,
    service: S,
}

fn apalis_handler(
    effects: Effects,
) -> impl FnMut(Work) -> std::pin::Pin<Box<dyn Future<Output = Result<f64, BoxDynError>> + Send>>
+ Clone
+ Send
+ 'static {
    move |work: Work| {
        let effects = effects.clone();
        Box::pin(async move {
            run_body(effects, work.case_key, work.body)
                .await
                .map_err(BoxDynError::from)
        })
    }
}

impl<S> Driver for Apalis<S>
where
    S: Service<Job<Work>, Response = f64, Error = BoxDynError> + Send,
    S::Future: Send,
{
    const INTEGRATION: Integration = Integration::Apalis;

    fn effects(&self) -> &Effects {
        &self.effects
    }

    async fn start(&mut self, _case: Case) {
        self.store.down(false);
    }

    async fn step(&mut self, case: Case, step: Step) -> Seen {
        let key = key_of(Self::INTEGRATION, case);
        let work = Work {
            case_key: key.clone(),
            amount: if step.message == Message::OtherPayload {
                6
            } else {
                5
            },
            body: step.body,
        };
        let job = match step.message {
            Message::Keyed | Message::OtherPayload => {
                TaskBuilder::new(work).idempotency_key(key.clone()).build()
            }
            Message::Unkeyed => Job::new(work),
            Message::LongKey => TaskBuilder::new(work)
                .idempotency_key("k".repeat(2000))
                .build(),
        };
        let before = self.effects.of(&key);
        fault_on(&self.store, step.fault);
        let holder = if step.fault == Fault::Holder {
            Some(hold(&APALIS_TASK, &self.store, &self.effects, &key).await)
        } else {
            None
        };
        let service = &mut self.service;
        let deliver = async move {
            poll_fn(|cx| service.poll_ready(cx)).await?;
            service.call(job).await
        };
        let answered = if step.body == Body::Hang {
            let dropped = tokio::time::timeout(DROP_AFTER, deliver).await;
            assert!(dropped.is_err(), "the hanging body ended");
            None
        } else if step.fault == Fault::Reenter {
            Some(reentered(&APALIS_TASK, &self.store, &key, deliver).await)
        } else {
            Some(deliver.await)
        };
        fault_off(&self.store, step.fault);
        if let Some((finish, holder)) = holder {
            finish.send(()).unwrap();
            holder.await.unwrap();
        }
        let Some(answered) = answered else {
            // The worker is gone mid-job; its backend puts the job back once orphaned, by
            // when the lock has lapsed.
            tokio::time::sleep(2 * LOCK_TTL).await;
            return Seen::NoAnswer;
        };
        // What apalis decides by: an `AbortError` kills the job, any other error retries it.
        match answered {
            Ok(_) => ack(self.effects.of(&key) > before),
            Err(err) if err.downcast_ref::<AbortError>().is_some() => Seen::DeadLetter,
            Err(_) => Seen::Retry,
        }
    }

    async fn end(&mut self, _case: Case, _seen: &[Seen]) {}
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apalis() {
    let (redis, store) = faulty_store().await;
    let effects = Effects::default();
    let service = idempotask_apalis::Idempotent::new(APALIS_TASK.clone(), IdempotencyKey)
        .store(store.clone())
        .handler(apalis_handler(effects.clone()));
    Box::pin(conform(Apalis {
        _redis: redis,
        store,
        effects,
        service,
    }))
    .await;
}

// ---------------------------------------------------------------------------------------------
// HTTP

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

struct Http {
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
    async fn start() -> Self {
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
            let handlers = self.handlers.clone();
            eventually("the holder's handler never started", || {
                let handlers = handlers.clone();
                async move { handlers.started.load(Ordering::SeqCst) > started }
            })
            .await;
            Some(holder)
        } else {
            None
        };
        let mut request = self.request(base, &key, step.message, step.body);
        if step.body == Body::Hang {
            request = request.timeout(DROP_AFTER);
        }
        let answer = Self::send(request).await;
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
            tokio::time::sleep(Duration::from_millis(200)).await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http() {
    Box::pin(conform(Http::start().await)).await;
}
