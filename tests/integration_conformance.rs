//! The integrations' conformance harness: one table of outcome classes, each driven through
//! NATS JetStream, RabbitMQ, Redis Streams, Amazon SQS, Kafka, apalis and HTTP on real servers
//! (`nats-server`, a RabbitMQ node, `moto_server` for SQS, tansu for Kafka, an axum server
//! called over TCP, and
//! a Redis for the store behind every one of them, which holds the Redis Streams case's stream
//! too), each checked against the action its crate's docs promise, and after each case that no
//! side effect ran twice and no message was left unsettled.
//!
//! | case | what the test does | NATS | RabbitMQ | Redis Streams | SQS | Kafka | apalis | HTTP |
//! | --- | --- | --- | --- | --- | --- | --- | --- | --- |
//! | `Ok` | the body succeeds | ran | ran | ran | ran | ran | ran | ran |
//! | `Duplicate` | a second copy after it | ran, replayed | ran, replayed | ran, replayed | ran, replayed | ran, replayed | ran, replayed | ran, replayed |
//! | `Err` | the body fails once, then succeeds | retry, ran | retry, ran | retry (pending), ran | retry (its visibility timeout), ran | retry (in the consumer, no commit), ran | retry, ran | retry (its `503`), ran |
//! | `Panic` | the body panics once, then succeeds | retry, ran | retry, ran | retry (pending), ran | retry, ran | retry, ran | retry, ran | retry (`500`), ran |
//! | `PoisonPanic` | the body panics on every delivery (`max_failures` 3) | retry, retry, dead letter | retry, retry, dead letter | retry, retry, dead letter | retry, retry, dead letter (the redrive policy) | retry, retry, dead letter (the dead-letter topic) | retry ×3 (apalis's own policy ends it) | retry ×3 |
//! | `Dropped` | the call is dropped inside the body (the consumer's task is gone; the HTTP client goes away) | no answer, ran | no answer (channel closed), ran | no answer (the consumer dropped), ran (claimed by the next) | no answer (the batch dropped), ran (after its visibility timeout) | no answer (the consumer dropped), ran (from the committed offset) | no answer, ran | no answer, replayed (the handler ran detached) |
//! | `StoreDownBeforeBegin` | the store refuses every operation, then is back | retry, ran | retry, ran | retry (pending, never acked), ran | retry (never deleted), ran | retry (no commit), ran | retry, ran | retry (`503`), ran |
//! | `AmbiguousFinish` | `finish` applies and its reply is lost; then a copy | ran, replayed | ran, replayed | ran, replayed | ran, replayed | ran, replayed | ran, replayed | ran, replayed |
//! | `Contended` | another holder has the key's lock, then finishes | retry, replayed | retry, replayed | retry (pending), replayed | retry, replayed | retry, replayed | retry, replayed | retry (`409`), replayed |
//! | `MissingKey` | a message without a key | dead letter | dead letter | dead letter | dead letter | dead letter | dead letter | dead letter (`400`) |
//! | `InvalidKey` | a key over the store's (or the header's) limit | dead letter | dead letter | dead letter | dead letter | dead letter | dead letter | dead letter (`400`) |
//! | `KeyReuse` | the key again with another payload, differing in its last byte | ran, dead letter | ran, dead letter | ran, dead letter | ran, dead letter | ran, dead letter | ran, replayed (apalis has no fingerprint: the key names the job) | ran, dead letter (`422`) |
//! | `Misuse` | the consumer calls the task from the task's own body (HTTP: a layer with no store) | retry, ran | retry, ran | retry, ran | retry, ran | retry (the body calls the task inside its own call), ran | retry, ran | retry (`500`), ran |
//! | `Unstorable` | the result has no JSON form (`NaN`; HTTP: a response over the stored cap); then a copy | ran, dead letter | ran, dead letter | ran, dead letter | ran, dead letter | ran, dead letter | ran, dead letter | ran, dead letter (`410`) |
//!
//! "retry" is the integration's way of delivering again later (NATS `-NAK` with a delay,
//! RabbitMQ the retry queue, Redis Streams the entry left pending in its consumer, SQS the
//! message's visibility timeout set to the delay, Kafka the record run again in its consumer
//! with its offset not committed, apalis a retryable error, HTTP a `5xx` or
//! `409` with nothing stored); "dead letter" its way of never again (`+TERM` and its advisory,
//! `basic.reject` to the dead-letter queue, an entry added to the dead-letter stream and acked,
//! a Kafka record copied to the dead-letter topic and committed past,
//! an SQS message left undeleted until the queue's redrive policy moves it to the dead-letter
//! queue, apalis `AbortError`, an HTTP `4xx`). "ran" and "replayed" are acks told apart by the
//! side-effect count, not by what the integration says of itself.
//!
//! What the broker saw decides, not only the returned value: a NATS ack moves the consumer's
//! ack floor, a `+TERM` publishes its advisory, a nak brings the message back well before
//! `AckWait`; a RabbitMQ retry comes back from the retry queue, a dead letter is counted in the
//! dead-letter queue, and after each case the consumer's channel is closed and every queue must
//! be empty (an unacked delivery would go back to its queue); a Redis Streams ack takes the
//! entry out of the group's pending entries (`XPENDING`), a retry leaves it there, a dead
//! letter adds an entry to the dead-letter stream, and after each case nothing is pending or
//! unread (a planted bug, an ack when the body starts, is caught by this table); an SQS delete
//! takes the message out of the queue, a retry or a rejection leaves it there, and after each
//! case the queue is empty and its dead-letter queue holds each rejected message (the same
//! planted bug, a delete when the body starts, is caught); a Kafka record's offset is committed
//! past it once it is done or its dead-letter copy is acknowledged, never past a try that runs
//! again, and after each case the group's offset is past the case's last record (a planted
//! bug, a commit when the body starts, is caught); an HTTP replay carries
//! `Idempotent-Replayed: true`, and after an acked case one more retry must be replayed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use idempotask::{Backoff, Task, catch_panic};
use idempotask_apalis::IdempotencyKey;
use idempotask_redis::RedisStore;
use idempotask_test_support::RedisServer;
use idempotask_test_support::faulty_store::FaultyStore;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

#[path = "integration_conformance/apalis_driver.rs"]
mod apalis_driver;
#[path = "integration_conformance/http_driver.rs"]
mod http_driver;
#[path = "integration_conformance/kafka_driver.rs"]
mod kafka_driver;
#[path = "integration_conformance/nats_driver.rs"]
mod nats_driver;
#[path = "integration_conformance/rabbitmq_driver.rs"]
mod rabbitmq_driver;
#[path = "integration_conformance/redis_streams_driver.rs"]
mod redis_streams_driver;
#[path = "integration_conformance/sqs_driver.rs"]
mod sqs_driver;
// The SQS crate's own test queues on moto_server: a client, a queue with its dead-letter queue.
#[path = "../integrations/sqs/tests/moto_queues/mod.rs"]
mod moto_queues;

use apalis_driver::{APALIS_TASK, Apalis, apalis_handler};
use http_driver::Http;
use kafka_driver::Kafka;
use nats_driver::Nats;
use rabbitmq_driver::Rabbit;
use redis_streams_driver::Streams;
use sqs_driver::Sqs;

/// Every task's lock TTL where the lock must not run out: seconds, so that a grant or a finish
/// that a loaded machine delays still lands within it (a grant with under 10 ms of its TTL left
/// does not run its body).
const LOCK_TTL: Duration = Duration::from_secs(10);
/// The lock TTL of the delivery that the `Dropped` case drops mid-body, as a killed consumer's:
/// it runs out before the message comes back, and is still long enough for its grant to reach a
/// loaded machine in time to run the body. Where the integration ties the redelivery to the
/// task's lock TTL (Redis Streams' `claim_idle`, SQS's visibility timeout) the whole case uses it.
const DROPPED_LOCK_TTL: Duration = Duration::from_secs(2);
/// The lock TTL of the other worker holding the key in the `Contended` case: renewed, so it
/// holds through the step; short, since what is left of it is how long the delivery it turns
/// away is deferred.
const HOLDER_LOCK_TTL: Duration = Duration::from_secs(2);
/// The body failures after which a message is dead-lettered (NATS and RabbitMQ).
const MAX_FAILURES: u32 = 3;
/// The redelivery delays after body failures and store errors (NATS and RabbitMQ).
const QUEUE_BACKOFF: Backoff = Backoff::new(Duration::from_millis(20), Duration::from_millis(100));
/// How long a test waits for what the broker must do; a failure, not a pause.
const WAIT: Duration = Duration::from_secs(5);
/// How long a call runs inside a hanging body, once the body has started, before the test
/// drops it.
const DROP_AFTER: Duration = Duration::from_millis(200);

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
    RedisStreams,
    Sqs,
    Kafka,
    Apalis,
    Http,
}

impl Integration {
    fn name(self) -> &'static str {
        match self {
            Self::Nats => "nats",
            Self::RabbitMq => "rabbitmq",
            Self::RedisStreams => "redis-streams",
            Self::Sqs => "sqs",
            Self::Kafka => "kafka",
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
        (Case::PoisonPanic, I::Nats | I::RabbitMq | I::RedisStreams | I::Sqs | I::Kafka) => {
            (vec![S::Retry, S::Retry, S::DeadLetter], 0)
        }
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

/// `body`, firing `started` as it starts.
fn signalling<F: Future>(
    started: &Arc<tokio::sync::Notify>,
    body: F,
) -> impl Future<Output = F::Output> + use<F> {
    let started = Arc::clone(started);
    async move {
        started.notify_one();
        body.await
    }
}

/// Drives `delivery`, whose body hangs, until the body has signalled `started` and run for
/// [`DROP_AFTER`], then drops it, as a consumer that dies mid-body would be; panics if the
/// delivery ends first, or its body never starts. Waits for the body rather than a fixed time,
/// so that a slow begin on a loaded machine does not get the call dropped before its body runs.
async fn drop_once_hung<T: std::fmt::Debug>(
    delivery: impl Future<Output = T>,
    started: &tokio::sync::Notify,
) {
    let hung = async {
        tokio::time::timeout(WAIT, started.notified())
            .await
            .expect("the hanging body never started");
        tokio::time::sleep(DROP_AFTER).await;
    };
    tokio::select! {
        ended = delivery => panic!("the delivery ended though its body hangs: {ended:?}"),
        () = hung => {}
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
    let task = task.clone().lock_ttl(HOLDER_LOCK_TTL).renew(true);
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
// The tests, one per integration (its driver in `integration_conformance/`)

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats() {
    Box::pin(conform(Nats::start().await)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq() {
    Box::pin(conform(Rabbit::start().await)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_streams() {
    Box::pin(conform(Streams::start(false).await)).await;
}

/// The planted bug: a consumer that acks each entry when its body starts, before the work is
/// done and its result stored. The table catches it: an entry to retry is no longer pending,
/// and the entry of a consumer killed mid-body never comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_streams_ack_before_the_work_is_caught() {
    let caught = catch_panic(Box::pin(conform(Streams::start(true).await)))
        .await
        .expect_err("the harness let an ack before the work pass");
    let report = caught.message();
    for case in ["Err:", "Panic:", "Dropped:", "PoisonPanic:"] {
        assert!(report.contains(case), "{case} not caught:\n{report}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqs() {
    Box::pin(conform(Sqs::start(false).await)).await;
}

/// The planted bug: a body that deletes its message when it starts, before the work is done
/// and its result stored. The table catches it: a message to run again is gone from the queue,
/// and the message of a batch dropped mid-body never comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqs_delete_before_the_work_is_caught() {
    let caught = catch_panic(Box::pin(conform(Sqs::start(true).await)))
        .await
        .expect_err("the harness let a delete before the work pass");
    let report = caught.message();
    for case in ["Err:", "Panic:", "Dropped:", "PoisonPanic:"] {
        assert!(report.contains(case), "{case} not caught:\n{report}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka() {
    Box::pin(conform(Kafka::start(false).await)).await;
}

/// The planted bug: a body that commits its record's offset when it starts, before the work is
/// done and its result stored. The table catches it: a record to run again is committed past,
/// and the record of a consumer dropped mid-body never comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_commit_before_the_work_is_caught() {
    let caught = catch_panic(Box::pin(conform(Kafka::start(true).await)))
        .await
        .expect_err("the harness let a commit before the work pass");
    let report = caught.message();
    for case in ["Err:", "Panic:", "Dropped:", "PoisonPanic:"] {
        assert!(report.contains(case), "{case} not caught:\n{report}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apalis() {
    let (redis, store) = faulty_store().await;
    let effects = Effects::default();
    let hung = Arc::new(tokio::sync::Notify::new());
    let service = |task: Task| {
        idempotask_apalis::Idempotent::new(task, IdempotencyKey)
            .store(store.clone())
            .handler(apalis_handler(effects.clone(), Arc::clone(&hung)))
    };
    let (service, dropped) = (
        service(APALIS_TASK.clone()),
        service(APALIS_TASK.clone().lock_ttl(DROPPED_LOCK_TTL)),
    );
    Box::pin(conform(Apalis {
        _redis: redis,
        store,
        effects,
        hung,
        service,
        dropped,
    }))
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http() {
    Box::pin(conform(Http::start().await)).await;
}
