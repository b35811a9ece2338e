//! Amazon SQS: a queue and its dead-letter queue per case on `moto_server`, the store on the
//! harness's Redis; deletes, hand-backs and rejections read back from what the queues hold.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_sqs::Client;
use idempotask::{RetryPolicy, Task};
use idempotask_redis::RedisStore;
use idempotask_sqs::{BadMessage, Handled, Idempotent, Message, Processed, SqsConsumer};
use idempotask_test_support::RedisServer;
use idempotask_test_support::faulty_store::FaultyStore;
use tokio::time::Instant;

use super::moto_queues::{Queue, Shape};
use super::{
    Body, Case, DROP_AFTER, DROPPED_LOCK_TTL, Declined, Driver, Effects, Fault, Integration,
    LOCK_TTL, MAX_FAILURES, QUEUE_BACKOFF, Seen, Step, WAIT, ack, fault_off, fault_on,
    faulty_store, hold, key_in, key_of, payload, reentered, run_body,
};

static SQS_TASK: Task = Task::new("conformance_sqs")
    .lock_ttl(LOCK_TTL)
    .retry(RetryPolicy::no_wait());

type ByKey = fn(&Message) -> Option<String>;
type BodyFuture = std::pin::Pin<Box<dyn Future<Output = Result<f64, Declined>> + Send>>;

pub(super) struct Sqs {
    _redis: RedisServer,
    store: FaultyStore<RedisStore>,
    effects: Effects,
    /// The planted bug: the body deletes its message before it does its work, as a consumer
    /// that deletes on receipt does.
    delete_early: bool,
    case: Option<SqsCase>,
}

struct SqsCase {
    queue: Queue,
    consumer: SqsConsumer<ByKey>,
    last: Option<String>,
    dead: u32,
}

impl Sqs {
    pub(super) async fn start(delete_early: bool) -> Self {
        let (redis, store) = faulty_store().await;
        Self {
            _redis: redis,
            store,
            effects: Effects::default(),
            delete_early,
            case: None,
        }
    }

    async fn consumer(&self, queue: &Queue, lock_ttl: Duration) -> SqsConsumer<ByKey> {
        let by_key: ByKey = |message| key_in(message.body().as_bytes());
        Idempotent::new(SQS_TASK.clone().lock_ttl(lock_ttl), by_key)
            .store(self.store.clone())
            .failure_backoff(QUEUE_BACKOFF)
            .store_backoff(QUEUE_BACKOFF)
            .max_failures(MAX_FAILURES)
            .fingerprint_payload(true)
            .wait_time(Duration::from_secs(1))
            .consume(queue.client.clone(), &queue.url)
            .await
            .unwrap()
    }

    /// The body of a step: `kind`, after it signals `started` (and, with the planted bug,
    /// deletes its message); the id of the message it was made for goes to `received`.
    fn body(
        &self,
        client: &Client,
        url: &str,
        key: &str,
        kind: Body,
        started: &Arc<tokio::sync::Notify>,
        received: &Arc<Mutex<Option<String>>>,
    ) -> impl FnMut(&Message) -> Result<BodyFuture, BadMessage> + Clone + use<> {
        let (effects, key, started) = (self.effects.clone(), key.to_owned(), Arc::clone(started));
        let (client, url, delete_early) = (client.clone(), url.to_owned(), self.delete_early);
        let received = Arc::clone(received);
        move |message: &Message| -> Result<BodyFuture, BadMessage> {
            *received.lock().unwrap() = Some(message.id().to_owned());
            let (effects, key, started) = (effects.clone(), key.clone(), Arc::clone(&started));
            let (client, url) = (client.clone(), url.clone());
            let receipt = message.receipt_handle().to_owned();
            Ok(Box::pin(async move {
                started.notify_one();
                if delete_early {
                    client
                        .delete_message()
                        .queue_url(url)
                        .receipt_handle(receipt)
                        .send()
                        .await
                        .unwrap();
                }
                run_body(effects, key, kind).await
            }))
        }
    }

    /// What the queues saw of a processed message: gone for a delete, still there for a
    /// hand-back or a rejection (which the redrive policy moves later).
    async fn seen(&mut self, key: &str, before: u32, processed: Processed<f64, Declined>) -> Seen {
        let state = self.case.as_mut().unwrap();
        let holds = state.queue.holds(&state.queue.url).await;
        if let Err(failure) = &processed.settled {
            panic!("SQS refused the settling: {failure}");
        }
        match processed.handled {
            Handled::Deleted(_) => {
                assert_eq!(holds, 0, "a deleted message is still in the queue");
                ack(self.effects.of(key) > before)
            }
            Handled::Failed { .. } | Handled::Deferred { .. } => {
                assert_eq!(
                    holds, 1,
                    "a message to run again is gone from the queue: it can be lost"
                );
                Seen::Retry
            }
            Handled::Rejected(_) => {
                assert_eq!(holds, 1, "a rejected message was deleted");
                state.dead += 1;
                Seen::DeadLetter
            }
            other @ Handled::Behind { .. } => panic!("unexpected on a standard queue: {other:?}"),
        }
    }
}

impl Driver for Sqs {
    const INTEGRATION: Integration = Integration::Sqs;

    fn effects(&self) -> &Effects {
        &self.effects
    }

    async fn start(&mut self, case: Case) {
        self.store.down(false);
        // The queue's visibility timeout is the lock TTL, the least the consumer allows (SQS
        // counts it in whole seconds): for the `Dropped` case, whose message comes back once
        // the batch dropped mid-body has let it go, one that runs out soon.
        let lock_ttl = if case == Case::Dropped {
            DROPPED_LOCK_TTL
        } else {
            LOCK_TTL
        };
        let shape = Shape {
            visibility: u32::try_from(lock_ttl.as_secs()).unwrap(),
            max_receive_count: Some(MAX_FAILURES),
            fifo: false,
        };
        let queue = Queue::create(&format!("conformance-{case:?}"), shape).await;
        let consumer = self.consumer(&queue, lock_ttl).await;
        self.case = Some(SqsCase {
            queue,
            consumer,
            last: None,
            dead: 0,
        });
    }

    async fn step(&mut self, case: Case, step: Step) -> Seen {
        let key = key_of(Self::INTEGRATION, case);
        let state = self.case.as_ref().unwrap();
        let (client, url) = (state.queue.client.clone(), state.queue.url.clone());
        if !step.again {
            state
                .queue
                .send(&payload(&key, step.message), None, None)
                .await;
        }
        let before = self.effects.of(&key);
        fault_on(&self.store, step.fault);
        let holder = if step.fault == Fault::Holder {
            Some(hold(&SQS_TASK, &self.store, &self.effects, &key).await)
        } else {
            None
        };
        let started = Arc::new(tokio::sync::Notify::new());
        let received = Arc::new(Mutex::new(None));
        let body = self.body(&client, &url, &key, step.body, &started, &received);
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
                    "the message never came back (it is lost, or deleted)"
                );
            }
        };
        let batch = if step.body == Body::Hang {
            tokio::select! {
                _ = batch => panic!("the hanging body ended"),
                () = async { started.notified().await; tokio::time::sleep(DROP_AFTER).await } => None,
            }
        } else if step.fault == Fault::Reenter {
            Some(reentered(&SQS_TASK, &self.store, &key, batch).await)
        } else {
            Some(batch.await)
        };
        fault_off(&self.store, step.fault);
        if let Some((finish, holder)) = holder {
            finish.send(()).unwrap();
            holder.await.unwrap();
        }
        let Some(batch) = batch else {
            // The consumer's batch is gone mid-body, as if killed: its message must come back
            // once its visibility timeout is over.
            let state = self.case.as_mut().unwrap();
            assert_eq!(
                state.queue.holds(&url).await,
                1,
                "the message of a batch dropped mid-body is gone: it is lost"
            );
            state.last = received.lock().unwrap().take();
            return Seen::NoAnswer;
        };
        assert_eq!(batch.len(), 1, "{batch:?}");
        let processed = batch.into_iter().next().unwrap();
        let state = self.case.as_mut().unwrap();
        if step.again {
            assert_eq!(
                state.last.as_deref(),
                Some(processed.id.as_str()),
                "another message came instead of the one handed back"
            );
        }
        state.last = Some(processed.id.clone());
        self.seen(&key, before, processed).await
    }

    async fn end(&mut self, case: Case, _seen: &[Seen]) {
        let key = key_of(Self::INTEGRATION, case);
        let state = self.case.as_mut().unwrap();
        // The rejected messages come back at once, until the redrive policy moves them; a body
        // that runs again here counts as a side effect the case did not expect.
        let deadline = Instant::now() + WAIT;
        while state.queue.holds(&state.queue.url).await > 0 {
            assert!(
                Instant::now() < deadline,
                "a message is left in the queue after the case"
            );
            let body = {
                let effects = self.effects.clone();
                let key = key.clone();
                move |_: &Message| -> Result<BodyFuture, BadMessage> {
                    Ok(Box::pin(run_body(effects.clone(), key.clone(), Body::Ok)))
                }
            };
            let _ = state.consumer.next_batch(body).await.unwrap();
        }
        assert_eq!(
            state.queue.holds(&state.queue.dead_url).await,
            state.dead,
            "the dead-letter queue does not hold each rejected message"
        );
        self.case = None;
    }
}
