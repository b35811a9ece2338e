//! The consumer core that idempotask's queue integrations share (`idempotask-nats`,
//! `idempotask-lapin`, and the SQS, Redis Streams and Kafka crates to come): the settings every
//! queue consumer has, and what one message's call calls for from its queue.
//!
//! A queue integration keeps its own verbs and its own public types; what this crate holds is
//! the part that must not differ between queues:
//!
//! - [`ConsumerSettings`]: the task, the store, [`fingerprint_payload`](ConsumerSettings::fingerprint_payload),
//!   [`failure_backoff`](ConsumerSettings::failure_backoff),
//!   [`store_backoff`](ConsumerSettings::store_backoff) and
//!   [`max_failures`](ConsumerSettings::max_failures), which a queue's own builder hands on to
//!   through [`settings_setters!`], with its own docs;
//! - [`ConsumerSettings::run`]: one message's call, under its key, with its panics caught, and
//!   its end mapped onto a [`Verdict`]: ack, retry after a delay, or give up, and why;
//! - [`History`]: what the queue knows of a message's earlier deliveries, which the mapping
//!   counts by;
//! - [`retry_delay`] and [`MIN_DELAY`]: the delay of a redelivery, from a
//!   [`Backoff`](idempotask::Backoff) and a count.
//!
//! # Plugging a queue in
//!
//! 1. **Receive** a message and take its key (a message without one is given up with the
//!    queue's own missing-key error, never run: no redelivery can bring a key).
//! 2. **Count**: implement [`History`] for the message: the body failures before this delivery
//!    (a header the retry copy carries, a key-value bucket, the queue's delivery count when it
//!    has nothing better), and the store deferrals before it.
//! 3. **Run**: [`ConsumerSettings::run`] with the key, the payload (hashed only with
//!    [`fingerprint_payload`](ConsumerSettings::fingerprint_payload) on) and the body.
//! 4. **Settle** the [`Verdict`] with the queue's verbs: [`Ack`](Verdict::Ack) acks;
//!    [`Retry`](Verdict::Retry) and [`Defer`](Verdict::Defer) hand the message back for `delay`
//!    (a delayed nak, a retry queue, a visibility timeout); [`GiveUp`](Verdict::GiveUp),
//!    [`Refuse`](Verdict::Refuse) and [`Hold`](Verdict::Hold) end it on the dead-letter path,
//!    `Hold` with its reason. Record the failure count of a `Retry` where the next delivery's
//!    [`History::failures`] reads it.
//!
//! ```
//! use std::time::Duration;
//! use idempotask::{MemoryStore, Task};
//! use idempotask_consumer::{ConsumerSettings, History, Verdict};
//!
//! /// A message of a queue that counts its body failures in the message itself.
//! struct Message { id: &'static str, payload: Vec<u8>, failures: u32, deferrals: u32 }
//!
//! impl History for Message {
//!     async fn failures(&self) -> u32 { self.failures }
//!     async fn deferrals(&self) -> u32 { self.deferrals }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let settings = ConsumerSettings::new(Task::new("order_charge"))
//!     .store(MemoryStore::new())
//!     .max_failures(2);
//! let mut message = Message { id: "order-7", payload: b"{}".to_vec(), failures: 0, deferrals: 0 };
//! loop {
//!     let body = async { Err::<u32, _>("the gateway is down") };
//!     match settings.run(message.id, &message.payload, &message, body).await {
//!         Verdict::Ack(report) => println!("ack: {}", report.value),
//!         // A delayed nak; the count travels with the message.
//!         Verdict::Retry { failures, delay, .. } => {
//!             assert_eq!((failures, delay), (1, Duration::from_millis(100)));
//!             message.failures = failures;
//!             continue;
//!         }
//!         Verdict::Defer { delay, .. } => println!("nak, back in {delay:?}"),
//!         Verdict::GiveUp { failures, .. } => assert_eq!(failures, 2),
//!         other => println!("dead-letter: {other:?}"),
//!     }
//!     break;
//! }
//! # }
//! ```
//!
//! # The mapping
//!
//! | the call ends with | [`Verdict`] | counts as a failure |
//! | --- | --- | --- |
//! | the body's `Ok`, stored, or a stored value replayed; also a body that ran but lost its lock or could not write its marker (`LockLost`, `MarkerNotWritten`): the side effect happened | `Ack` | no |
//! | the body's `Err`, or a panic in it ([`BodyFailure`]) | `Retry` after [`failure_backoff`](ConsumerSettings::failure_backoff) for the failure count; `GiveUp` at [`max_failures`](ConsumerSettings::max_failures) | yes |
//! | the key is busy ([`Error::Contended`](idempotask::Error::Contended)) | `Defer` for the holder's remaining lock time (the lock TTL when the store did not say) | no |
//! | the store failed or none is installed; the task is misused (logged as an error) | `Defer` after [`store_backoff`](ConsumerSettings::store_backoff) for the deferral count | no |
//! | the key cannot be used ([`Redelivery::Never`](idempotask::Redelivery::Never)): `InvalidKey`, `KeyReuse`, `Codec`, `MarkerKeyMismatch` | `Refuse` | no |
//! | the unit is held in doubt ([`Error::InDoubt`](idempotask::Error::InDoubt)) | `Hold`: dead-letter it with its reason, for an operator | no |
//!
//! A store that is down never acks: the message waits for it. Every delay is at least
//! [`MIN_DELAY`], so that no verdict has a queue hand a message straight back to a spinning
//! worker.

#![cfg_attr(docsrs, feature(doc_cfg))]

mod delay;
mod history;
mod setters;
mod settings;
mod verdict;

pub use delay::{MIN_DELAY, retry_delay};
pub use history::History;
pub use settings::{
    ConsumerSettings, DEFAULT_FAILURE_BACKOFF, DEFAULT_MAX_FAILURES, DEFAULT_STORE_BACKOFF,
};
pub use verdict::{BodyFailure, Verdict};
