//! Redis Streams: a stream and consumer group per case, on the Redis that also holds the
//! store; acks read back from the group's pending entries (`XPENDING`), dead letters from the
//! dead-letter stream's length.

use std::sync::Arc;

use idempotask::{RetryPolicy, Task};
use idempotask_redis::RedisStore;
use idempotask_redis_streams::{BadEntry, Entry, Handled, Idempotent, Processed, StreamConsumer};
use idempotask_test_support::RedisServer;
use idempotask_test_support::faulty_store::FaultyStore;
use redis::aio::MultiplexedConnection;
use tokio::time::Instant;

use super::{
    Body, Case, DROP_AFTER, DROPPED_LOCK_TTL, Declined, Driver, Effects, Fault, Integration,
    LOCK_TTL, MAX_FAILURES, QUEUE_BACKOFF, Seen, Step, WAIT, ack, fault_off, fault_on,
    faulty_store, hold, key_in, key_of, payload, reentered, run_body,
};

static STREAMS_TASK: Task = Task::new("conformance_redis_streams")
    .lock_ttl(LOCK_TTL)
    .retry(RetryPolicy::no_wait());

const GROUP: &str = "conformance";

type ByKey = fn(&Entry) -> Option<String>;
type BodyFuture = std::pin::Pin<Box<dyn Future<Output = Result<f64, Declined>> + Send>>;

pub(super) struct Streams {
    redis: RedisServer,
    conn: MultiplexedConnection,
    store: FaultyStore<RedisStore>,
    effects: Effects,
    /// The planted bug: the body acks its entry before it does its work, as a consumer that
    /// acks on receipt does.
    ack_early: bool,
    case: Option<StreamsCase>,
}

struct StreamsCase {
    stream: String,
    consumer: StreamConsumer<ByKey>,
    /// Consumers dropped mid-body, as if killed: the next one gets a new name.
    generation: u32,
    last: Option<String>,
    dead: usize,
}

impl Streams {
    pub(super) async fn start(ack_early: bool) -> Self {
        let (redis, store) = faulty_store().await;
        let conn = redis.connection().await;
        Self {
            redis,
            conn,
            store,
            effects: Effects::default(),
            ack_early,
            case: None,
        }
    }

    /// A consumer of `case`'s stream. How long an entry stays pending without a sign of its
    /// consumer before another claims it is the lock TTL, the least the consumer allows: for
    /// the `Dropped` case, whose heir claims the entry of the consumer dropped mid-body, one that
    /// runs out soon.
    async fn consumer(&self, case: Case, stream: &str, name: &str) -> StreamConsumer<ByKey> {
        let by_key: ByKey = |entry| key_in(entry.field("payload")?);
        let lock_ttl = if case == Case::Dropped {
            DROPPED_LOCK_TTL
        } else {
            LOCK_TTL
        };
        Idempotent::new(STREAMS_TASK.clone().lock_ttl(lock_ttl), by_key)
            .store(self.store.clone())
            .claim_idle(lock_ttl)
            .failure_backoff(QUEUE_BACKOFF)
            .store_backoff(QUEUE_BACKOFF)
            .max_failures(MAX_FAILURES)
            .fingerprint_payload(true)
            .block(std::time::Duration::from_millis(20))
            .consume(&self.redis.url(), stream, GROUP, name)
            .await
            .unwrap()
    }

    /// Whether `id` is pending in the case's group.
    async fn pending(&mut self, stream: &str, id: &str) -> bool {
        let reply: redis::Value = redis::cmd("XPENDING")
            .arg(stream)
            .arg(GROUP)
            .arg(id)
            .arg(id)
            .arg(1)
            .query_async(&mut self.conn)
            .await
            .unwrap();
        !matches!(reply, redis::Value::Array(ref rows) if rows.is_empty())
    }

    async fn pending_count(&mut self, stream: &str) -> i64 {
        let reply: (i64, redis::Value, redis::Value, redis::Value) = redis::cmd("XPENDING")
            .arg(stream)
            .arg(GROUP)
            .query_async(&mut self.conn)
            .await
            .unwrap();
        reply.0
    }

    async fn dead_letters(&mut self, stream: &str) -> usize {
        redis::cmd("XLEN")
            .arg(format!("{stream}:dead"))
            .query_async(&mut self.conn)
            .await
            .unwrap()
    }
    /// The body of a step: `kind`, after it signals `started` (and, with the planted bug, acks
    /// its entry).
    fn body(
        &self,
        stream: &str,
        key: &str,
        kind: Body,
        started: &Arc<tokio::sync::Notify>,
    ) -> impl FnMut(&Entry) -> Result<BodyFuture, BadEntry> + Clone + use<> {
        let (effects, key, started) = (self.effects.clone(), key.to_owned(), Arc::clone(started));
        let (conn, stream, ack_early) = (self.conn.clone(), stream.to_owned(), self.ack_early);
        move |entry: &Entry| -> Result<BodyFuture, BadEntry> {
            let (effects, key, started) = (effects.clone(), key.clone(), Arc::clone(&started));
            let (mut conn, stream, id) = (conn.clone(), stream.clone(), entry.id().to_owned());
            Ok(Box::pin(async move {
                started.notify_one();
                if ack_early {
                    let _: i64 = redis::cmd("XACK")
                        .arg(&stream)
                        .arg(GROUP)
                        .arg(&id)
                        .query_async(&mut conn)
                        .await
                        .unwrap();
                }
                run_body(effects, key, kind).await
            }))
        }
    }

    /// What the group saw of a processed entry: out of the pending entries for an ack or a
    /// dead letter (with an entry in the dead-letter stream), still pending for a retry.
    async fn seen(
        &mut self,
        stream: &str,
        key: &str,
        before: u32,
        processed: Processed<f64, Declined>,
    ) -> Seen {
        let id = processed.id;
        match processed.handled {
            Handled::Acked(_) => {
                assert!(
                    !self.pending(stream, &id).await,
                    "an acked entry is pending"
                );
                ack(self.effects.of(key) > before)
            }
            Handled::Failed { .. } | Handled::Deferred { .. } => {
                assert!(
                    self.pending(stream, &id).await,
                    "an entry to run again is no longer pending: it can be lost"
                );
                Seen::Retry
            }
            Handled::DeadLettered(_) => {
                let want = self.case.as_ref().unwrap().dead + 1;
                assert_eq!(
                    self.dead_letters(stream).await,
                    want,
                    "no dead-letter entry"
                );
                assert!(!self.pending(stream, &id).await, "a dead letter is pending");
                self.case.as_mut().unwrap().dead = want;
                Seen::DeadLetter
            }
        }
    }
}

impl Driver for Streams {
    const INTEGRATION: Integration = Integration::RedisStreams;

    fn effects(&self) -> &Effects {
        &self.effects
    }

    async fn start(&mut self, case: Case) {
        self.store.down(false);
        let stream = format!("conformance-{case:?}");
        let consumer = self.consumer(case, &stream, &format!("{case:?}-0")).await;
        self.case = Some(StreamsCase {
            stream,
            consumer,
            generation: 0,
            last: None,
            dead: 0,
        });
    }

    async fn step(&mut self, case: Case, step: Step) -> Seen {
        let key = key_of(Self::INTEGRATION, case);
        let stream = self.case.as_ref().unwrap().stream.clone();
        if !step.again {
            let _: String = redis::cmd("XADD")
                .arg(&stream)
                .arg("*")
                .arg("payload")
                .arg(payload(&key, step.message))
                .query_async(&mut self.conn)
                .await
                .unwrap();
        }
        let before = self.effects.of(&key);
        fault_on(&self.store, step.fault);
        let holder = if step.fault == Fault::Holder {
            Some(hold(&STREAMS_TASK, &self.store, &self.effects, &key).await)
        } else {
            None
        };
        let started = Arc::new(tokio::sync::Notify::new());
        let body = self.body(&stream, &key, step.body, &started);
        let state = self.case.as_mut().unwrap();
        let batch = async {
            let deadline = Instant::now() + WAIT;
            loop {
                let batch = state.consumer.next_batch(body.clone()).await.unwrap();
                if !batch.is_empty() {
                    return batch;
                }
                assert!(
                    Instant::now() < deadline,
                    "the entry never came back (it is lost, or acked)"
                );
            }
        };
        let batch = if step.body == Body::Hang {
            tokio::select! {
                _ = batch => panic!("the hanging body ended"),
                () = async { started.notified().await; tokio::time::sleep(DROP_AFTER).await } => None,
            }
        } else if step.fault == Fault::Reenter {
            Some(reentered(&STREAMS_TASK, &self.store, &key, batch).await)
        } else {
            Some(batch.await)
        };
        fault_off(&self.store, step.fault);
        if let Some((finish, holder)) = holder {
            finish.send(()).unwrap();
            holder.await.unwrap();
        }
        let Some(batch) = batch else {
            // The consumer is gone with its entry pending, as if killed: the next one claims
            // it once it has been idle for `claim_idle`.
            let pending: (i64, Option<String>, redis::Value, redis::Value) = redis::cmd("XPENDING")
                .arg(&stream)
                .arg(GROUP)
                .query_async(&mut self.conn)
                .await
                .unwrap();
            assert_eq!(
                pending.0, 1,
                "the entry of a consumer dropped mid-body is not pending: it is lost"
            );
            let state = self.case.as_mut().unwrap();
            state.last = pending.1;
            state.generation += 1;
            let name = format!("{case:?}-{}", state.generation);
            let heir = self.consumer(case, &stream, &name).await;
            self.case.as_mut().unwrap().consumer = heir;
            return Seen::NoAnswer;
        };
        assert_eq!(batch.len(), 1, "{batch:?}");
        let processed = batch.into_iter().next().unwrap();
        let state = self.case.as_mut().unwrap();
        if step.again {
            assert_eq!(
                state.last.as_deref(),
                Some(processed.id.as_str()),
                "another entry came instead of the one left pending"
            );
        }
        state.last = Some(processed.id.clone());
        self.seen(&stream, &key, before, processed).await
    }

    async fn end(&mut self, _case: Case, _seen: &[Seen]) {
        let state = self.case.take().unwrap();
        assert_eq!(
            state.consumer.waiting(),
            0,
            "the consumer still holds an entry"
        );
        let stream = state.stream;
        assert_eq!(
            self.pending_count(&stream).await,
            0,
            "an entry is left pending after the case"
        );
        assert_eq!(self.dead_letters(&stream).await, state.dead);
        let unread: redis::Value = redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg(GROUP)
            .arg("checker")
            .arg("STREAMS")
            .arg(&stream)
            .arg(">")
            .query_async(&mut self.conn)
            .await
            .unwrap();
        assert_eq!(unread, redis::Value::Nil, "an entry was never read");
    }
}
