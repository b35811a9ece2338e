//! A call whose body, lock and marker share one database transaction.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::time::Instant;
use tracing::Instrument;

use super::{Call, concluded};
use crate::context::{Fence, Lease, TaskContext};
use crate::error::{Error, contended, held_in_doubt};
use crate::observe::{self, Ending, Observation};
use crate::outcome::{Outcome, Report};
use crate::store::{Begin, Store, StoreError, TransactionScope};
use crate::unit::LockToken;

/// The validity a transactional execution's context reports: its lock is the transaction's,
/// held until the transaction ends, whatever the task's lock TTL.
const HELD_UNTIL_THE_TRANSACTION_ENDS: Duration = crate::ttl::MAX_TTL;

impl Call<'_> {
    /// Runs `body` inside `transaction` at most once for this key, and commits the body's
    /// writes together with the unit's completion marker: exactly once for work that is a
    /// write to the database the transaction belongs to.
    ///
    /// `transaction` is a [`TransactionScope`]; `idempotask-postgres` makes one of a
    /// PostgreSQL transaction (`PostgresStore::transaction`). The call owns it: it commits
    /// when the body succeeds and rolls back otherwise, so start a fresh one for each call.
    /// The store set with [`store`](Self::store) or installed is not used.
    ///
    /// # Behaviour
    /// - The unit's lock is taken first, inside the transaction. Another transactional
    ///   delivery of the same key waits on it until this transaction ends, then replays the
    ///   stored result if it committed, or runs if it rolled back. Keep the body to database
    ///   work: an outbound call inside an open transaction holds its locks as long as it takes.
    /// - Done already: the stored value, decoded; the transaction is rolled back and the body
    ///   does not run.
    /// - Locked by a plain ([`run`](Self::run)) call of the same task: [`Error::Contended`] at
    ///   once, and the transaction is rolled back. Redeliver later; better, do not mix the two
    ///   paths for one task.
    /// - `Ok`: the marker is written and the transaction committed; the value is returned only
    ///   once the commit succeeded.
    /// - `Err`, a panic, or this future dropped: the transaction is rolled back, nothing is
    ///   stored, and the next delivery runs. A crash before the commit has the same effect.
    /// - Steps ([`TaskContext::step`]) record outside the transaction, on a connection of the
    ///   store's own (see [`TransactionScope::step_store`]): their effects are outside it too,
    ///   so a rollback keeps their records, and the next delivery replays them instead of
    ///   running their effects again. The marker alone commits with the body's writes. A step
    ///   whose record cannot be written answers [`Error::Step`] with
    ///   [`StepErrorKind::Unrecorded`](crate::StepErrorKind::Unrecorded); a body that
    ///   returns it rolls back. A transaction leaves no lock behind to lapse into doubt, so a
    ///   step store that keeps a trace of its own answers the next delivery's journal in
    ///   doubt (`idempotask-postgres` keeps an attempt): that step then gets its policy, as
    ///   after a plain holder's crash, and so does a step whose worker died mid-effect.
    ///   Without one, the next delivery runs that step again. A body that returns an error
    ///   cleanly leaves no doubt: once the transaction rolled back, the step store is told
    ///   (its `release`).
    ///
    /// # Errors
    /// The body's own error, or an [`Error`] converted into `E`: [`Error::Store`] when the
    /// lock, the marker or the commit fails (after a failed commit nothing was stored, unless
    /// the error is ambiguous), [`Error::Contended`], [`Error::KeyReuse`] and the decoding
    /// errors of [`run`](Self::run).
    ///
    /// See [`TransactionScope`] for an example with a transaction of one's own.
    pub async fn run_in_transaction<X, T, E, F>(self, transaction: X, body: F) -> Result<T, E>
    where
        X: TransactionScope,
        T: Serialize + DeserializeOwned,
        E: From<Error>,
        F: AsyncFnOnce(&mut X::Handle) -> Result<T, E>,
    {
        let observation = Observation::start(&self.task.name);
        let span = observation.span().clone();
        let result = self
            .run_transaction(transaction, body, &observation)
            .instrument(span)
            .await;
        concluded(&observation, result).map(|report| report.value)
    }

    async fn run_transaction<X, T, E, F>(
        self,
        mut transaction: X,
        body: F,
        observation: &Observation<'_>,
    ) -> Result<Report<T>, (E, Ending)>
    where
        X: TransactionScope,
        T: Serialize + DeserializeOwned,
        E: From<Error>,
        F: AsyncFnOnce(&mut X::Handle) -> Result<T, E>,
    {
        let unit = self
            .unit(transaction.max_key_len(), observation)
            .map_err(|err| self.failed(err))?;
        let token = self.task.lock_token();
        let attempts = 1;
        let waiting = Instant::now();
        let begun = transaction
            .begin(&unit, &token, self.task.lock_ttl, self.task.fencing)
            .await;
        observation.waited(attempts, waiting.elapsed());
        let (fencing_token, in_doubt) = match begun {
            Ok(Begin::Acquired {
                fencing_token,
                in_doubt,
            }) => {
                if let Some(doubt) = &in_doubt {
                    observe::in_doubt(
                        &unit,
                        self.task.log_key,
                        self.task.in_doubt,
                        self.task.hold_alert_after,
                        doubt,
                    );
                }
                (fencing_token, in_doubt)
            }
            Ok(Begin::InDoubt(doubt)) => {
                transaction.abort().await;
                observe::in_doubt(
                    &unit,
                    self.task.log_key,
                    self.task.in_doubt,
                    self.task.hold_alert_after,
                    &doubt,
                );
                return Err(self.failed(held_in_doubt(&unit, doubt)));
            }
            Ok(Begin::Done(marker)) => {
                // Nothing of this delivery's may commit; the body does not run.
                transaction.abort().await;
                return self.replayed(&unit, &marker, attempts, observation);
            }
            Ok(Begin::Busy { lock_ttl_remaining }) => {
                transaction.abort().await;
                return Err(self.failed(contended(&unit, lock_ttl_remaining, attempts)));
            }
            Err(err) => {
                // Whatever the statement locked goes now, not when the connection is recycled.
                transaction.abort().await;
                return Err(self.failed(err.into()));
            }
        };
        observation.fencing_token(fencing_token);
        let mut token = token.granted(fencing_token);
        if let Some(doubt) = &in_doubt {
            token = token.taking_over(**doubt);
        }
        let lease = Arc::new(Lease::new(
            Instant::now(),
            HELD_UNTIL_THE_TRANSACTION_ENDS,
            self.task.log_key,
        ));
        if let Err(err) = self.arm_steps(&mut transaction, &token, &lease).await {
            transaction.abort().await;
            return Err(self.failed(err.into()));
        }
        let context = TaskContext::new(unit.clone(), fencing_token, attempts, Arc::clone(&lease))
            .with_doubt(in_doubt.clone());
        let running = Instant::now();
        // Boxed, as in `Call::drive`: held inline, the body's future would be stored again
        // in every layer that awaits it.
        let result = context.scope(Box::pin(body(transaction.handle()))).await;
        observation.body_ran(running.elapsed());
        let value = match result {
            // A step found the transaction no longer holding the unit, or held it after a
            // refusal the body went on past: nothing of the body's may commit.
            Ok(_) if lease.was_fenced_out() || lease.holds() => {
                transaction.abort().await;
                return Err(self.failed(lease.refusal(&unit, self.task.log_key)));
            }
            Ok(value) => value,
            Err(err) => {
                transaction.abort().await;
                Self::close_steps(&unit, &lease).await;
                return Err(self.body_failed(err, &unit, &lease));
            }
        };
        let marker = self.marker_for(&unit, &token, &value);
        transaction
            .commit(&unit, &token, &marker, self.task.kept_for())
            .await
            .map_err(|err| self.failed(err.into()))?;
        Ok(Report {
            value,
            outcome: Outcome::Executed,
            fencing_token,
            attempts,
            in_doubt: in_doubt.map(|doubt| *doubt),
        })
    }

    /// Tells the step store that this execution ended cleanly, its transaction rolled back:
    /// no step's effect is half done, so a later execution need not find one in doubt (see
    /// [`TransactionScope::step_store`]). Not when a step held the unit, nor when the doubt
    /// the journal came with is not settled: the next execution must find it. A close that
    /// fails leaves the step in doubt, the safe side: it is logged.
    async fn close_steps(unit: &crate::unit::UnitOfWork, lease: &Lease) {
        let Some(fence) = lease.fence() else {
            return;
        };
        let settled = !lease.holds()
            && !lease
                .steps
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .leaves_doubt();
        if !settled {
            return;
        }
        if let Err(err) = fence.store().release(unit, fence.token()).await {
            tracing::warn!(
                task = unit.task(),
                error = %err,
                "a transactional execution ended cleanly but its step store was not told: its next delivery finds its next step in doubt"
            );
        }
    }

    /// Lets the body's steps run when the scope records them: outside the transaction, so
    /// that a rollback keeps them as it keeps their effects, under `token` as granted (the
    /// store checks the transaction's hold on the unit instead of a lock's expiry).
    async fn arm_steps<X: TransactionScope>(
        &self,
        transaction: &mut X,
        token: &LockToken,
        lease: &Lease,
    ) -> Result<(), StoreError> {
        if let Some(steps) = transaction.step_store().await? {
            lease.arm_fence(Fence::new(
                &steps,
                token,
                self.task.lock_ttl,
                self.task.step_limits(),
            ));
        }
        Ok(())
    }
}
