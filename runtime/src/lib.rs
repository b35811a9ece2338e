#![doc = include_str!("lib.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod backoff;
mod call;
mod context;
mod doubt;
mod error;
mod fingerprint;
mod held_lock;
mod install;
mod lock_renewal;
mod marker;
mod outcome;
mod panicked;
mod redelivery;
/// Guides: the guarantees and their limits, testing your own tasks, the attribute next to others.
pub mod guide {
    #[doc = include_str!("guide/guarantees.md")]
    pub mod guarantees {}
    #[doc = include_str!("guide/testing.md")]
    pub mod testing {}
    #[doc = include_str!("guide/composing.md")]
    pub mod composing {}
}
pub mod observe;
pub mod operator;
mod retry;
mod status;
mod step;
pub mod store;
mod task;
mod task_names;
pub mod testing;
mod ttl;
mod unit;

pub use backoff::Backoff;
pub use call::Call;
pub use call::reconcile::{Reconciled, Reconciling};
pub use context::{TaskContext, context};
pub use doubt::{DEFAULT_DOUBT_MEMORY, InDoubt};
pub use error::{CallerKey, CodecErrorKind, Error};
pub use fingerprint::Fingerprint;
pub use install::{install, installed, with_store};
pub use lock_renewal::LockRenewal;
pub use observe::KeyLogging;
pub use outcome::{Outcome, Report};
pub use panicked::{Panicked, catch_panic};
pub use redelivery::Redelivery;
pub use retry::{DEFAULT_MAX_ATTEMPTS, DEFAULT_RETRY_BACKOFF, RetryPolicy};
pub use step::{DEFAULT_MAX_STEP_BYTES, DEFAULT_MAX_STEPS, StepErrorKind, StepName};
pub use store::memory::MemoryStore;
pub use task::{DEFAULT_LOCK_TTL, DEFAULT_RESULT_TTL, Settings, Task};
pub use ttl::{MAX_TTL, MIN_TTL};
pub use unit::InvalidKey;

#[doc = include_str!("attribute.md")]
#[doc(inline)]
pub use idempotask_macros::idempotent_task;

#[doc(hidden)]
pub mod __private;
