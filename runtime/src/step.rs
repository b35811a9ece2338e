//! Steps: a body's side effects recorded one at a time in its unit's journal, so that a rerun
//! replays the finished ones and resumes at the first that did not finish.

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::call::reconcile::Reconciled;
use crate::context::TaskContext;
use crate::error::Error;

pub(crate) mod cursor;
mod entry;
pub(crate) mod kind;
mod name;
mod run;

pub use cursor::{DEFAULT_MAX_STEP_BYTES, DEFAULT_MAX_STEPS};
pub use kind::StepErrorKind;
pub use name::StepName;

pub(crate) use entry::encode_named;
use run::{WhenInDoubt, no_reconcile};

impl TaskContext {
    /// Runs `effect` as the step `name` of this body, once: its value is recorded in the
    /// unit's journal when it succeeds, and a rerun of the body (after a crash, an error, a
    /// lost lock) gets the recorded value back without running `effect` again, then goes on
    /// at the first step that did not finish.
    ///
    /// Before the effect starts, the step checks that this holder's lock is still valid by its
    /// own clock (no store command), and asks the store as [`fence`](Self::fence) does when it
    /// is not; the record is written only under the lock, by its token
    /// and fencing token, at the journal's next place (one store command, which also renews
    /// the lock). A holder whose lock was taken over gets [`Error::LockNotHeld`] at its next
    /// step, which then does not run, and the call answers `LockNotHeld` whatever the body
    /// returns. A step whose effect fails (`Err`) records nothing and is run again by a rerun.
    ///
    /// Steps run one at a time, in the same order on every run: name a step that runs once
    /// per item with a key part, `("mail", recipient)`.
    ///
    /// # Errors
    /// The effect's own error; [`Error::Step`] when the step cannot run or be replayed (see
    /// [`StepErrorKind`]); [`Error::LockNotHeld`] for a holder that lost its lock;
    /// [`Error::Codec`] for a recorded value that does not decode into `T`.
    ///
    /// ```
    /// use std::sync::atomic::{AtomicU32, Ordering};
    /// use idempotask::{MemoryStore, Task};
    ///
    /// static CHARGES: AtomicU32 = AtomicU32::new(0);
    /// static CHECKOUT: Task = Task::new("checkout");
    ///
    /// async fn checkout(store: &MemoryStore, mail_works: bool) -> Result<String, idempotask::Error> {
    ///     CHECKOUT.call("order-7").store(store.clone()).run(async {
    ///         let ctx = idempotask::context().expect("inside a task");
    ///         let charge: u32 = ctx.step("charge", async {
    ///             Ok::<_, idempotask::Error>(CHARGES.fetch_add(1, Ordering::SeqCst) + 1)
    ///         }).await?;
    ///         let receipt: String = ctx.step("mail", async {
    ///             if mail_works { Ok(format!("receipt for charge {charge}")) }
    ///             else { Err(idempotask::Error::NotConfigured) }
    ///         }).await?;
    ///         Ok(receipt)
    ///     }).await
    /// }
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let store = MemoryStore::new();
    /// assert!(checkout(&store, false).await.is_err(), "the mail step failed");
    /// // The rerun replays the charge and runs the mail step.
    /// assert_eq!(checkout(&store, true).await.unwrap(), "receipt for charge 1");
    /// assert_eq!(CHARGES.load(Ordering::SeqCst), 1, "charged once");
    /// # }
    /// ```
    pub async fn step<T, E, F>(&self, name: impl Into<StepName>, effect: F) -> Result<T, E>
    where
        T: Serialize + DeserializeOwned,
        E: From<Error>,
        F: Future<Output = Result<T, E>>,
    {
        self.run_step(name.into(), WhenInDoubt::Rerun, no_reconcile(), effect)
            .await
    }

    /// [`step`](Self::step) for an effect that must never run twice: when this step is the one
    /// in doubt (the unit was taken over from a holder that died, and this is the first step
    /// its journal lacks, so the dead holder may have started it), the step does not run and
    /// answers [`Error::InDoubt`]; the unit stays in doubt, held for an operator, whatever
    /// the unit's own policy. Otherwise it runs as [`step`](Self::step) does.
    ///
    /// # Errors
    /// As [`step`](Self::step), and [`Error::InDoubt`] for the step in doubt.
    ///
    /// ```
    /// use idempotask::{MemoryStore, Task};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idempotask::Error> {
    /// let sent = Task::new("notify")
    ///     .call("order-7")
    ///     .store(MemoryStore::new())
    ///     .run(async {
    ///         let ctx = idempotask::context().expect("inside a task");
    ///         ctx.step_or_hold("mail", async { Ok::<_, idempotask::Error>("sent".to_owned()) })
    ///             .await
    ///     })
    ///     .await?;
    /// assert_eq!(sent, "sent", "a first delivery is never in doubt");
    /// # Ok(()) }
    /// ```
    pub async fn step_or_hold<T, E, F>(&self, name: impl Into<StepName>, effect: F) -> Result<T, E>
    where
        T: Serialize + DeserializeOwned,
        E: From<Error>,
        F: Future<Output = Result<T, E>>,
    {
        self.run_step(name.into(), WhenInDoubt::Hold, no_reconcile(), effect)
            .await
    }

    /// [`step`](Self::step) with a way to ask the downstream system first: when this step is
    /// the one in doubt (see [`step_or_hold`](Self::step_or_hold)), `reconcile` runs before
    /// the effect, with whatever the step's input is (the closure captures it): a payment
    /// provider's lookup by idempotency key, say. [`Reconciled::Done`] records its value as
    /// the step's, without running the effect; [`Reconciled::NotDone`] runs the effect. A step
    /// that is not in doubt never calls `reconcile`.
    ///
    /// # Errors
    /// As [`step`](Self::step), and `reconcile`'s own error (nothing is recorded then).
    ///
    /// ```
    /// use idempotask::{MemoryStore, Reconciled, Task};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idempotask::Error> {
    /// let order = "order-7";
    /// let charge = Task::new("charge")
    ///     .call(order)
    ///     .store(MemoryStore::new())
    ///     .run(async {
    ///         let ctx = idempotask::context().expect("inside a task");
    ///         ctx.step_or_reconcile(
    ///             "charge",
    ///             || async move {
    ///                 // The provider's lookup of `order`: nothing found here.
    ///                 Ok::<_, idempotask::Error>(Reconciled::NotDone)
    ///             },
    ///             async move { Ok(format!("ch_{order}")) },
    ///         )
    ///         .await
    ///     })
    ///     .await?;
    /// assert_eq!(charge, "ch_order-7");
    /// # Ok(()) }
    /// ```
    pub async fn step_or_reconcile<T, E, F, R, RF>(
        &self,
        name: impl Into<StepName>,
        reconcile: R,
        effect: F,
    ) -> Result<T, E>
    where
        T: Serialize + DeserializeOwned,
        E: From<Error>,
        F: Future<Output = Result<T, E>>,
        R: FnOnce() -> RF,
        RF: Future<Output = Result<Reconciled<T>, E>>,
    {
        self.run_step(name.into(), WhenInDoubt::Reconcile, Some(reconcile), effect)
            .await
    }
}
