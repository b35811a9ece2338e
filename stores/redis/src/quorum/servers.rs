//! Asking the quorum's servers: one at a time with its timeout, all at once, or until a
//! majority answered; and what a round's answers add up to.

use std::future::Future;
use std::sync::PoisonError;
use std::sync::atomic::Ordering;
use std::time::Duration;

use redis::Value;
use redis::aio::ConnectionManager;
use tokio::time::Instant;

use super::super::lock::lock_value;
use super::super::protocol::Protocol;
use super::gather::gather;
use super::{DOWN_PAUSE, EXPIRY_PRECISION, Inner, PATIENCE, RAISE_FENCE, RETRACT, Server};
use idempotask::store::Store;
use idempotask::store::{LockToken, UnitOfWork};
use idempotask::store::{StoreError, StoreErrorKind};

impl Server {
    /// The server's protocol, connecting first if it has not been reached yet; fails at once
    /// while the server is left out after a failure.
    pub(super) async fn connected(
        &self,
        operation: &'static str,
    ) -> Result<&Protocol<ConnectionManager>, StoreError> {
        if let Some(protocol) = self.protocol.get() {
            return Ok(protocol);
        }
        self.check_up(operation)?;
        let protocol = self
            .protocol
            .get_or_try_init(|| async {
                self.builder
                    .clone()
                    .connect()
                    .await
                    .map(|store| store.protocol)
            })
            .await;
        protocol.map_err(|err| {
            if err.kind() != StoreErrorKind::Configuration {
                self.left_out();
            }
            self.named(operation, &err)
        })
    }

    pub(super) fn check_up(&self, operation: &'static str) -> Result<(), StoreError> {
        let down_until = *self
            .down_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match down_until {
            Some(until) if Instant::now() < until => Err(StoreError::new(
                operation,
                StoreErrorKind::Unreachable,
                format!(
                    "{} could not be reached less than {} ms ago and is left out until then",
                    self.name,
                    DOWN_PAUSE.as_millis()
                ),
            )),
            _ => Ok(()),
        }
    }

    pub(super) fn left_out(&self) {
        *self
            .down_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(Instant::now() + DOWN_PAUSE);
    }

    pub(super) fn named(&self, operation: &'static str, err: &StoreError) -> StoreError {
        StoreError::new(operation, err.kind(), format!("{}: {err}", self.name))
            .ambiguous_if(err.is_ambiguous())
    }

    pub(super) fn timed_out(
        &self,
        operation: &'static str,
        timeout: Duration,
        sent: bool,
    ) -> StoreError {
        StoreError::new(
            operation,
            StoreErrorKind::Timeout,
            format!(
                "{} did not answer within {} ms",
                self.name,
                timeout.as_millis()
            ),
        )
        .ambiguous_if(sent)
    }

    /// Runs `operation` on this server, waiting for its answer at most `limit`.
    ///
    /// Only a server that cannot be reached (a refused or dropped connection) is left out for a
    /// while. A slow answer is no sign that a server is down: on a busy machine every server is
    /// late now and then, and leaving them out at once left no majority to answer anything.
    pub(super) async fn run<T, F, Fut>(
        &self,
        operation: &'static str,
        limit: Duration,
        f: F,
    ) -> Answer<T>
    where
        F: FnOnce(Protocol<ConnectionManager>) -> Fut,
        Fut: Future<Output = Result<T, StoreError>>,
    {
        if self.protocol.get().is_some() {
            self.check_up(operation)?;
        }
        let attempt = async {
            let protocol = self.connected(operation).await?.clone();
            f(protocol).await.map_err(|err| self.named(operation, &err))
        };
        let answer = tokio::time::timeout(limit, attempt)
            .await
            .unwrap_or_else(|_| Err(self.timed_out(operation, limit, true)));
        if let Err(err) = &answer
            && err.kind() == StoreErrorKind::Unreachable
        {
            self.left_out();
        }
        answer
    }
}

pub(super) type Answer<T> = Result<T, StoreError>;

impl Inner {
    pub(super) fn quorum(&self) -> usize {
        self.servers.len() / 2 + 1
    }

    /// How long a round waits at most for a server whose answer can still change what the
    /// round decides: [`PATIENCE`] per-server timeouts, and for a `begin` or a `renew` of
    /// `lock_ttl` at most half of it (the rest is the grant's validity), though never less
    /// than one per-server timeout.
    pub(super) fn patience(&self, lock_ttl: Option<Duration>) -> Duration {
        let patience = self.server_timeout.saturating_mul(PATIENCE);
        match lock_ttl {
            Some(ttl) => patience.min((ttl / 2).max(self.server_timeout)),
            None => patience,
        }
    }

    /// Logs, once per store, a lock TTL too short for the patience of a step record: under two
    /// server timeouts, a record's rounds may outlast half the TTL. `task` is the first task
    /// seen with one.
    pub(super) fn note_lock_ttl(&self, task: &str, lock_ttl: Duration) {
        if lock_ttl < self.server_timeout.saturating_mul(2)
            && !self.short_ttl_logged.swap(true, Ordering::Relaxed)
        {
            tracing::warn!(
                task,
                lock_ttl_ms = lock_ttl.as_millis(),
                server_timeout_ms = self.server_timeout.as_millis(),
                "a lock TTL under two server timeouts (logged once per store): a step record of this task may take longer than half the lock's TTL, so its acceptances may not be the majority of one lock; tasks without steps are not affected; raise the task's lock_ttl or lower the quorum's server_timeout"
            );
        }
    }

    /// Runs `operation` on every server at once; the answers in the servers' order.
    ///
    /// A round waits for every server up to the per-server timeout. A server that has not
    /// answered by then is waited for only while `decided` (given the answers so far, `None`
    /// for a server still to answer) says they do not settle the operation, and at most
    /// `limit`; then it counts as timed out, which is ambiguous: the command may still run.
    pub(super) async fn each<T, F, Fut>(
        &self,
        operation: &'static str,
        limit: Duration,
        decided: impl Fn(&[Option<Answer<T>>]) -> bool,
        f: F,
    ) -> Vec<Answer<T>>
    where
        F: Fn(Protocol<ConnectionManager>) -> Fut,
        Fut: Future<Output = Result<T, StoreError>>,
    {
        let indices: Vec<usize> = (0..self.servers.len()).collect();
        self.some(operation, &indices, limit, decided, |_, protocol| {
            f(protocol)
        })
        .await
    }

    /// [`each`](Self::each) on the servers at `indices`; the answers in that order.
    pub(super) async fn some<T, F, Fut>(
        &self,
        operation: &'static str,
        indices: &[usize],
        limit: Duration,
        decided: impl Fn(&[Option<Answer<T>>]) -> bool,
        f: F,
    ) -> Vec<Answer<T>>
    where
        F: Fn(usize, Protocol<ConnectionManager>) -> Fut,
        Fut: Future<Output = Result<T, StoreError>>,
    {
        let started = Instant::now();
        let answers = gather(
            indices.iter().map(|&index| {
                let f = &f;
                self.servers[index].run(operation, limit, move |protocol| f(index, protocol))
            }),
            self.server_timeout.min(limit),
            decided,
        )
        .await;
        answers
            .into_iter()
            .zip(indices)
            .map(|(answer, &index)| {
                answer.unwrap_or_else(|| {
                    Err(self.servers[index].timed_out(operation, started.elapsed(), true))
                })
            })
            .collect()
    }

    /// `each` for operations that need a majority of answers and nothing more: decided once a
    /// majority answered.
    pub(super) fn majority_answered<T>(&self) -> impl Fn(&[Option<Answer<T>>]) -> bool + use<T> {
        let quorum = self.quorum();
        move |answers| answers.iter().filter(|a| matches!(a, Some(Ok(_)))).count() >= quorum
    }

    /// The error of an operation that too few servers answered.
    pub(super) fn no_quorum(&self, operation: &'static str, errors: Vec<StoreError>) -> StoreError {
        let kind = match errors.first().map(StoreError::kind) {
            Some(first) if errors.iter().all(|err| err.kind() == first) => first,
            _ => StoreErrorKind::Unreachable,
        };
        let ambiguous = errors.iter().any(StoreError::is_ambiguous);
        let failed: Vec<String> = errors.iter().map(ToString::to_string).collect();
        let mut err = StoreError::new(
            operation,
            kind,
            format!(
                "no majority: {} of {} servers failed, {} needed to agree ({})",
                errors.len(),
                self.servers.len(),
                self.quorum(),
                failed.join("; ")
            ),
        )
        .ambiguous_if(ambiguous);
        if let Some(first) = errors.into_iter().next() {
            err = err.with_source(first);
        }
        err
    }

    /// Takes this delivery's marker back from the servers at `indices`, where it was stored
    /// without a majority; a server that cannot be reached keeps it until its TTL (a `begin`
    /// that finds a marker on a minority next to a majority's lock waits rather than replays).
    pub(super) async fn retract(&self, unit: &UnitOfWork, indices: &[usize], marker: &[u8]) {
        let Some(lost_marker) = idempotask::store::lock_lost_marker(marker) else {
            return;
        };
        let lost_marker = &lost_marker;
        let answers = self
            .some(
                "finish",
                indices,
                self.patience(None),
                |_| false,
                |_, protocol| async move {
                    let key = protocol.key(unit);
                    protocol
                        .invoke("finish", &RETRACT, &key, |cmd| {
                            cmd.arg(marker).arg(lost_marker);
                        })
                        .await
                },
            )
            .await;
        for err in answers.into_iter().filter_map(Result::err) {
            tracing::warn!(error = %err, "could not take back a marker that no majority stored; duplicates that meet it wait for its TTL or for the unit's majority");
        }
    }

    /// Gives up the grants of one `begin` (server index and the lock value's token there),
    /// answering nothing: a release that fails leaves the lock to expire. The grants include
    /// the servers whose answer never came, where the `SET` may have run late.
    ///
    /// It waits at most the per-server timeout: each server's connection runs its commands in
    /// the order they were sent, so a release sent before this call's next request on that
    /// server runs before it, whenever its answer comes. (Sent, because the connection's queue
    /// has room for every command a burst of calls makes: see `PIPELINE_BUFFER`.)
    pub(super) async fn release_grants(&self, unit: &UnitOfWork, grants: &[(usize, LockToken)]) {
        self.give_back(unit, grants, false).await;
    }

    /// Gives back grants that took over a unit in doubt on their servers, so that it stays in
    /// doubt there: each lock is left to run out at once (kept for its doubt memory) instead
    /// of deleted, which would make those servers forget the earlier holder.
    pub(super) async fn lapse_grants(&self, unit: &UnitOfWork, grants: &[(usize, LockToken)]) {
        self.give_back(unit, grants, true).await;
    }

    async fn give_back(&self, unit: &UnitOfWork, grants: &[(usize, LockToken)], lapse: bool) {
        if grants.is_empty() {
            return;
        }
        let indices: Vec<usize> = grants.iter().map(|(index, _)| *index).collect();
        let answers = self
            .some(
                "release",
                &indices,
                self.patience(None),
                |_| true,
                |index, protocol| {
                    let token = token_at(grants, index).cloned();
                    async move {
                        match token {
                            Some(token) if lapse => {
                                protocol.renew(unit, &token, Duration::ZERO).await
                            }
                            Some(token) => protocol.release(unit, &token).await,
                            None => Ok(false),
                        }
                    }
                },
            )
            .await;
        for err in answers.into_iter().filter_map(Result::err) {
            tracing::debug!(error = %err, "could not release a grant of a quorum begin; it expires with its TTL");
        }
    }

    /// Makes the locks of one round's grants hold one value, the quorum's `raised`: its
    /// fencing token (the highest that the granting servers gave), and the doubt the round
    /// took over (each server counts its own; the holder's later `renew` and `finish` compare
    /// the whole value). `grants` holds each granting server and the token its lock holds;
    /// answers the grants that now hold `raised`, and those left as they were.
    pub(super) async fn raise(
        &self,
        unit: &UnitOfWork,
        grants: Vec<(usize, LockToken)>,
        raised: &LockToken,
    ) -> (Vec<(usize, LockToken)>, Vec<(usize, LockToken)>) {
        let (done, lower): (Vec<_>, Vec<_>) = grants.into_iter().partition(|(_, token)| {
            token.fencing_token() == raised.fencing_token()
                && token.doubt_taken_over() == raised.doubt_taken_over()
        });
        if lower.is_empty() {
            return (done, Vec::new());
        }
        let indices: Vec<usize> = lower.iter().map(|(index, _)| *index).collect();
        let target = lock_value(raised);
        let answers = self
            .some(
                "begin",
                &indices,
                self.patience(None),
                |_| false,
                |index, protocol| {
                    let from = token_at(&lower, index).map(lock_value).unwrap_or_default();
                    let target = &target;
                    async move {
                        let key = protocol.key(unit);
                        let reply = protocol
                            .invoke("begin", &RAISE_FENCE, &key, |cmd| {
                                cmd.arg(from).arg(target);
                            })
                            .await?;
                        Ok(matches!(reply, Value::Int(1)))
                    }
                },
            )
            .await;
        let mut kept = done;
        let mut left = Vec::new();
        for ((index, token), answer) in lower.into_iter().zip(answers) {
            match answer {
                Ok(true) => kept.push((index, raised.clone())),
                // Not raised: release it as granted (a failed raise may still have raised it,
                // and then the lock expires with its TTL).
                _ => left.push((index, token)),
            }
        }
        (kept, left)
    }

    /// The drift allowance for a lock of `lock_ttl`.
    pub(super) fn drift(&self, lock_ttl: Duration) -> Duration {
        lock_ttl.mul_f64(self.clock_drift) + EXPIRY_PRECISION
    }
}

/// The token that `grants` (server index and token) hold for the server at `index`.
fn token_at(grants: &[(usize, LockToken)], index: usize) -> Option<&LockToken> {
    grants
        .iter()
        .find(|(at, _)| *at == index)
        .map(|(_, token)| token)
}

/// How long until enough of the busy servers' locks (`remaining`, one per busy server) expire
/// for a majority to be free, when `free` servers answered free (granted, or holding a marker);
/// `None` when that is not known: one of them did not say, or too few servers answered for
/// their expiry to free a majority.
///
/// A server that did not answer counts as neither free nor busy: counting it free made a
/// `begin` that found two servers down and the holder on two others answer "free now", and its
/// waiters asked again at once until their attempts ran out while the holder worked.
pub(super) fn busy_until(
    mut remaining: Vec<Option<Duration>>,
    free: usize,
    quorum: usize,
) -> Option<Duration> {
    let must_expire = quorum.saturating_sub(free);
    if must_expire == 0 {
        return Some(Duration::ZERO);
    }
    if must_expire > remaining.len() || remaining.iter().any(Option::is_none) {
        return None;
    }
    remaining.sort_unstable();
    remaining.get(must_expire - 1).copied().flatten()
}
