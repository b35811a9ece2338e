//! Consume [Amazon SQS](https://aws.amazon.com/sqs/) queues through an idempotask
//! [`Task`](idempotask::Task): each message's work at most once per key, its `Ok` value stored
//! and handed to every redelivery, the finished messages of a receive deleted with one
//! `DeleteMessageBatch`, the others handed back with their visibility timeout, and a FIFO
//! queue's message groups kept in order.
//!
//! SQS delivers at least once: a message whose consumer dies between its work and its delete
//! (a crash, a kill, a lost reply) comes back once its visibility timeout is over, and a
//! standard queue may hand out a message twice at any time. [`SqsConsumer::next_batch`] runs
//! each message under the task's lock and completion marker, so a redelivery whose work is
//! done is deleted with the stored value instead of doing the work again.
//!
//! ```no_run
//! use idempotask::store::BatchingStore;
//! use idempotask::{RetryPolicy, Task};
//! use idempotask_redis::RedisStore;
//! use idempotask_sqs::{Attribute, Handled, Idempotent};
//!
//! static CHARGE: Task = Task::new("order_charge").retry(RetryPolicy::no_wait());
//!
//! #[derive(serde::Deserialize)]
//! struct Order { amount: u64 }
//!
//! async fn charge(amount: u64) -> Result<String, std::io::Error> {
//!     Ok(format!("ch_{amount}"))
//! }
//!
//! # async fn run(client: aws_sdk_sqs::Client) -> Result<(), Box<dyn std::error::Error>> {
//! // The client: `aws_sdk_sqs::Client::new(&aws_config::load_from_env().await)`.
//! let store = BatchingStore::new(RedisStore::connect("redis://127.0.0.1:6379").await?);
//! let url = "https://sqs.eu-west-1.amazonaws.com/123456789012/orders";
//! let mut consumer = Idempotent::new(CHARGE.clone(), Attribute::new("order_id"))
//!     .store(store)
//!     .consume(client, url)
//!     .await?;
//! // aws sqs send-message --queue-url $URL --message-body '{"amount":500}' \
//! //   --message-attributes 'order_id={DataType=String,StringValue=7}'
//! loop {
//!     for processed in consumer
//!         .next_batch(|message| {
//!             let order: Order = message.json()?;
//!             Ok(charge(order.amount))
//!         })
//!         .await?
//!     {
//!         if let Handled::Deleted(report) = &processed.handled {
//!             println!("{}: {} ({:?})", processed.id, report.value, report.outcome);
//!         }
//!     }
//! }
//! # }
//! ```
//!
//! # Behaviour
//! Every setting of the [`Task`](idempotask::Task) applies (lock TTL, result TTL, lock
//! renewal, retry policy, key logging); the store is the installed one unless
//! [`Idempotent::store`] names another. The client is yours, with its own timeouts and
//! retries: the consumer makes one `ReceiveMessage` per batch, one `DeleteMessageBatch` and
//! one `ChangeMessageVisibilityBatch` to settle it, and one `ChangeMessageVisibilityBatch`
//! each time it extends a running batch's visibility timeout.
//!
//! | the call ends with | [`Handled`] | the queue gets |
//! | --- | --- | --- |
//! | the body's `Ok`, stored, or a stored value replayed (the body did not run) | `Deleted` | its entry of the batch's `DeleteMessageBatch` |
//! | the body's `Ok`, but its lock expired first or its marker could not be written (`LockLost`, `MarkerNotWritten`) | `Deleted` | the same: the side effect happened; running it again would not undo it |
//! | the body's `Err`, or a panic in it ([`BodyFailure`]): the lock is released, nothing is stored | `Failed` | `ChangeMessageVisibility` to the [`failure_backoff`](Idempotent::failure_backoff) for its failure count |
//! | the body's [`max_failures`](Idempotent::max_failures)-th failure | `Rejected(GaveUp)` | not deleted: visible again at once, for the redrive policy (below) |
//! | the key is busy ([`Error::Contended`](idempotask::Error::Contended)) | `Deferred` | `ChangeMessageVisibility` to the holder's remaining lock time |
//! | the store failed or none is installed; the task is misused (logged as an error) | `Deferred` | never deleted while the store is down: `ChangeMessageVisibility` to the [`store_backoff`](Idempotent::store_backoff) |
//! | the message has no key ([`MissingKey`]), or the body's closure refused it ([`BadMessage`]: a body that does not decode) | `Rejected` | not deleted, visible again at once; nothing ran |
//! | the key cannot be used (`InvalidKey`, `KeyReuse`, `Codec`, `MarkerKeyMismatch`) | `Rejected(Refused)` | the same; no delivery can succeed |
//! | the unit is in doubt and the task holds such units ([`Error::InDoubt`](idempotask::Error::InDoubt)) | `Rejected(InDoubt)` | the same: resolve the unit (`idempotask resolve`), then redrive the message from the dead-letter queue |
//! | FIFO: an earlier message of its group in this batch did not finish | `Behind` | not run; visible again at once, after that one |
//!
//! Every delay is rounded up to whole seconds (SQS's unit) and kept within 12 hours (SQS's
//! limit). A settling SQS refused (an entry of a batch call that failed, or the whole call) is
//! reported on its message, in [`Processed::settled`]: nothing is lost, the message comes back
//! after its visibility timeout, and a stored result is then replayed.
//!
//! # Giving up: the queue's redrive policy
//! SQS has no verb for "dead-letter this message": a message moves to the dead-letter queue
//! when it is received more than the redrive policy's `maxReceiveCount` times. A message that
//! no delivery can succeed with is therefore left to that policy: not deleted (deleting would
//! lose it), but made visible again at once, so that its next receives, which run nothing
//! (no key, a bad body, a refused key) or the body once more (a message given up), reach
//! `maxReceiveCount` and SQS moves it. [`Idempotent::consume`] refuses a queue without a
//! redrive policy ([`SqsError::NoRedrivePolicy`]), on which such a message would come back for
//! ever.
//! - **Failures are counted by receives**: SQS keeps no count of its own a consumer could
//!   write, so a message's failures before this receive are its receives before it
//!   (`ApproximateReceiveCount − 1`), deferrals and crashes included. A message ends early
//!   rather than late.
//! - Set `maxReceiveCount` to [`max_failures`](Idempotent::max_failures): the receive after
//!   the give-up then moves the message without running the body again.
//! - A store outage uses up receives too: keep the [`store_backoff`](Idempotent::store_backoff)'s
//!   bound times `maxReceiveCount` above the outage the queue must ride out.
//!
//! # The clocks: the visibility timeout against `lock_ttl`
//! - [`Idempotent::consume`] reads the queue's `VisibilityTimeout` (`GetQueueAttributes`) and
//!   refuses one shorter than the task's lock TTL ([`SqsError::VisibilityBelowLockTtl`]): a
//!   message whose consumer died would come back while its lock still holds the key. With
//!   the visibility timeout at least the lock TTL, the redelivery finds the lock gone and runs
//!   (or replays) at once.
//! - **A running batch keeps its messages**: every [`extend_at`](Idempotent::extend_at) of
//!   the visibility timeout (a half by default), the messages of a batch whose bodies still
//!   run get a fresh visibility timeout (`ChangeMessageVisibilityBatch`), so a slow body is not
//!   handed to a second consumer. Give a body that may outlast its lock TTL the task's lock
//!   renewal as well.
//! - Give queue tasks [`RetryPolicy::no_wait`](idempotask::RetryPolicy::no_wait): a busy key
//!   then goes back to the queue for the holder's remaining lock time instead of holding its
//!   batch.
//!
//! # Batches and FIFO queues
//! One receive asks for up to [`batch_size`](Idempotent::batch_size) messages (10, SQS's
//! most, by default); they run at the same time and are settled together. Over a
//! `RedisStore`, which the consumer wraps in a
//! [`BatchingStore`](idempotask::store::BatchingStore) itself (or one wrapped already, as
//! above), the batch's `begin`s reach the store as one pipeline, and so do its `finish`es. A slow body
//! holds its batch's deletes.
//!
//! On a FIFO queue the messages of one message group run one after the other, in the order
//! SQS gave them; the first that does not finish (failed, deferred, rejected) stops its
//! group: the group's later messages of the batch do not run ([`Handled::Behind`]) and are
//! handed back, to come after it. Other groups of the batch go on.
//!
//! # The key
//! [`Attribute`] (a message attribute the producer set, the key to use when a producer may
//! retry its `SendMessage`), [`MessageId`] (the message's id: every receive of one message is
//! one unit, but two sends of one job are two), or any `Fn(&Message) -> Option<String>`. A
//! message without a key is rejected with [`MissingKey`], never run unprotected.
//!
//! # The `sqs_worker` example
//! `cargo run --example sqs_worker --features sqs` (with `REDIS_URL`, `SQS_ENDPOINT` and
//! `QUEUE`): one worker charging each order at a stand-in gateway that counts charges in
//! Redis. `tests/example_queues.rs` runs three copies against `moto_server`, sends 12 orders,
//! kills with SIGKILL the copy that charged order 5 before its delete, and reads the charges
//! from Redis: every order is charged once; the bare consumer (`WITHOUT_IDEMPOTASK=1`)
//! charges order 5 twice.

#![cfg_attr(docsrs, feature(doc_cfg))]

mod batch;
mod calls;
mod consumer;
mod error;
mod handled;
mod key;
mod message;
mod queue;

pub use batch::Batch;
pub use consumer::{
    DEFAULT_BATCH_SIZE, DEFAULT_EXTEND_AT, DEFAULT_FAILURE_BACKOFF, DEFAULT_MAX_FAILURES,
    DEFAULT_STORE_BACKOFF, DEFAULT_WAIT_TIME, Idempotent,
};
pub use error::SqsError;
pub use handled::{Handled, Processed, Rejection, SettleFailure};
pub use idempotask_consumer::BodyFailure;
pub use key::{Attribute, MessageId, MessageKey, MissingKey};
pub use message::{BadMessage, Message};
pub use queue::SqsConsumer;
