//! [`Store`] for [`RedlockStore`]: each operation on every server, decided by a majority.

use std::time::Duration;

use tokio::time::Instant;

use super::RedlockStore;
use super::servers::{Answer, busy_until};
use super::steps::inspected;
use idempotask::store::{Begin, Doubt, Fencing, Finish, Inspection, Journal, StepEntry, Store};
use idempotask::store::{LockToken, UnitOfWork};
use idempotask::store::{StoreError, StoreErrorKind};

impl Store for RedlockStore {
    fn max_key_len(&self) -> usize {
        self.inner.max_key_len
    }

    async fn begin(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        lock_ttl: Duration,
        fencing: Fencing,
    ) -> Result<Begin, StoreError> {
        let inner = &*self.inner;
        inner.note_lock_ttl(unit.task(), lock_ttl);
        let started = Instant::now();
        let quorum = inner.quorum();
        // A server still to answer may yet grant: the round waits for it as long as its grant
        // could make the majority, so that a slow server is not taken for a refusal; and until
        // a majority answered, since fewer answers decide nothing.
        let decided = |answers: &[Option<Answer<Begin>>]| {
            let granted = answers
                .iter()
                .filter(|answer| matches!(answer, Some(Ok(Begin::Acquired { .. }))))
                .count();
            let answered = answers.iter().filter(|a| matches!(a, Some(Ok(_)))).count();
            let pending = answers.iter().filter(|answer| answer.is_none()).count();
            granted >= quorum
                || (granted + pending < quorum && answered >= quorum)
                || answered + pending < quorum
        };
        let answers = inner
            .each(
                "begin",
                inner.patience(Some(lock_ttl)),
                decided,
                |protocol| async move { protocol.begin(unit, token, lock_ttl, fencing).await },
            )
            .await;
        let Round {
            mut grants,
            mut unknown,
            markers,
            busy,
            errors,
            doubts,
            doubted,
            left_alone,
        } = Round::of(answers, token);
        // A marker on any server counts as done (a server that restarted may have lost its
        // copy), unless a majority is locked by another delivery: then the marker is a stale
        // holder's that no majority stored, and replaying it would answer for work that is
        // still running.
        // Servers that did not answer may be among that majority.
        if !markers.is_empty() && busy.len() + errors.len() < quorum {
            grants.append(&mut unknown);
            inner.release_grants(unit, &grants).await;
            return Ok(Begin::Done(most_common(markers)));
        }
        // One server that remembers an earlier holder's lock running out is enough: that holder
        // may have held a majority, and the other servers of it may have restarted without
        // persistence or not answered this round. (A holder that died during its own round
        // leaves a doubt too, though its body never ran: the safe side for a task that holds.)
        if let (true, Some(doubt)) = (left_alone, merged(&doubts)) {
            grants.append(&mut unknown);
            inner.release_grants(unit, &grants).await;
            return Ok(Begin::InDoubt(doubt));
        }
        // A server that held a released fenced lock continues its counter even for a task
        // without fencing, so the grants of one round may carry counters or not.
        let fence = grants
            .iter()
            .filter_map(|(_, token)| token.fencing_token())
            .max();
        let doubt = merged(&doubts);
        let mut granted = token.clone().granted(fence);
        if let Some(doubt) = doubt {
            granted = granted.taking_over(doubt);
        }
        let mut left = Vec::new();
        if (fence.is_some() || doubt.is_some()) && grants.len() >= quorum {
            (grants, left) = inner.raise(unit, grants, &granted).await;
        }
        let validity = lock_ttl
            .saturating_sub(started.elapsed())
            .saturating_sub(inner.drift(lock_ttl));
        if grants.len() >= quorum && validity >= inner.min_validity {
            if !left.is_empty() {
                inner.release_grants(unit, &left).await;
            }
            return Ok(match doubt {
                Some(doubt) => Begin::taken_over(fence, doubt),
                None => Begin::acquired(fence),
            });
        }
        grants.append(&mut left);
        let granted_count = grants.len();
        grants.append(&mut unknown);
        // Where this round took over a unit in doubt, the server must go on remembering it.
        let (lapsing, releasing): (Vec<_>, Vec<_>) = grants
            .into_iter()
            .partition(|(index, _)| doubted.contains(index));
        inner.lapse_grants(unit, &lapsing).await;
        inner.release_grants(unit, &releasing).await;
        if granted_count >= quorum {
            return Err(StoreError::new(
                "begin",
                StoreErrorKind::Timeout,
                format!(
                    "a majority granted the lock, but the round took {} ms and left {} ms of its {} ms TTL, less than the {} ms floor; the grants were released",
                    started.elapsed().as_millis(),
                    validity.as_millis(),
                    lock_ttl.as_millis(),
                    inner.min_validity.as_millis()
                ),
            ));
        }
        if granted_count + busy.len() + markers.len() < quorum {
            // Too few servers answered for their answers to decide: that is the failure. (The
            // round has waited for the slow ones as long as their grant could count.)
            return Err(inner.no_quorum("begin", errors));
        }
        Ok(waiting(granted_count, markers.len(), busy, &errors, quorum))
    }

    async fn finish(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        marker: &[u8],
        result_ttl: Duration,
    ) -> Result<Finish, StoreError> {
        let inner = &*self.inner;
        let quorum = inner.quorum();
        // A server still to answer may yet store the marker: the round waits for it while that
        // could change the answer, rather than fail a `finish` that slow servers would complete.
        let decided = |answers: &[Option<Answer<Finish>>]| {
            let count = |f: fn(&Finish) -> bool| {
                answers
                    .iter()
                    .filter(|answer| matches!(answer, Some(Ok(finish)) if f(finish)))
                    .count()
            };
            let completed = count(|finish| matches!(finish, Finish::Completed));
            let stored = count(|finish| {
                matches!(
                    finish,
                    Finish::Completed
                        | Finish::LockLost {
                            marker_written: true,
                            ..
                        }
                )
            });
            let pending = answers.iter().filter(|answer| answer.is_none()).count();
            completed >= quorum
                || (stored >= quorum && completed + pending < quorum)
                || stored + pending < quorum
        };
        let answers = inner
            .each(
                "finish",
                inner.patience(None),
                decided,
                |protocol| async move { protocol.finish(unit, token, marker, result_ttl).await },
            )
            .await;
        let (mut completed, mut stored) = (0, 0);
        let mut stored_on = Vec::new();
        let mut unknown = Vec::new();
        let mut errors = Vec::new();
        for (index, answer) in answers.into_iter().enumerate() {
            match answer {
                Ok(Finish::Completed) => {
                    completed += 1;
                    stored += 1;
                    stored_on.push(index);
                }
                Ok(Finish::LockLost {
                    marker_written: true,
                    ..
                }) => {
                    stored += 1;
                    stored_on.push(index);
                }
                Ok(Finish::LockLost { .. }) => {}
                // An answer this build does not know stores nothing it can count on.
                Ok(_) => errors.push(unknown_answer("finish")),
                Err(err) => {
                    // The marker may have been stored there, or may be stored later.
                    if err.is_ambiguous() {
                        unknown.push(index);
                    }
                    errors.push(err);
                }
            }
        }
        if completed >= quorum {
            return Ok(Finish::Completed);
        }
        if stored >= quorum {
            return Ok(Finish::lost_marker_written());
        }
        if stored + errors.len() >= quorum {
            // A repeat may still reach a majority; the runner repeats while its lock lasts.
            return Err(inner.no_quorum("finish", errors));
        }
        // Another delivery holds or finished the unit on a majority: a marker of ours on a
        // minority would answer duplicates with a result the quorum never agreed on. That
        // includes the servers whose answer never came, where the marker may land late: the
        // retraction follows it on the same connection.
        stored_on.append(&mut unknown);
        inner.retract(unit, &stored_on, marker).await;
        Ok(Finish::lost_nothing_written())
    }

    async fn release(&self, unit: &UnitOfWork, token: &LockToken) -> Result<bool, StoreError> {
        let inner = &*self.inner;
        let quorum = inner.quorum();
        let answers = inner
            .each(
                "release",
                inner.patience(None),
                inner.majority_answered(),
                |protocol| async move { protocol.release(unit, token).await },
            )
            .await;
        let (mut released, mut not_ours) = (0, 0);
        let mut errors = Vec::new();
        for answer in answers {
            match answer {
                Ok(true) => released += 1,
                Ok(false) => not_ours += 1,
                Err(err) => errors.push(err),
            }
        }
        if released > 0 {
            return Ok(true);
        }
        if not_ours >= quorum {
            return Ok(false);
        }
        Err(inner.no_quorum("release", errors))
    }

    async fn renew(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        lock_ttl: Duration,
    ) -> Result<bool, StoreError> {
        let inner = &*self.inner;
        let quorum = inner.quorum();
        let answers = inner
            .each(
                "renew",
                // A renewal that waits longer than half the lock is of no use to its holder.
                inner.patience(Some(lock_ttl)),
                inner.majority_answered(),
                |protocol| async move { protocol.renew(unit, token, lock_ttl).await },
            )
            .await;
        let (mut renewed, mut lost) = (0, 0);
        let mut errors = Vec::new();
        for answer in answers {
            match answer {
                Ok(true) => renewed += 1,
                Ok(false) => lost += 1,
                Err(err) => errors.push(err),
            }
        }
        if renewed >= quorum {
            return Ok(true);
        }
        if lost > inner.servers.len() - quorum {
            return Ok(false);
        }
        Err(inner.no_quorum("renew", errors))
    }

    /// What the servers hold for `unit`: the marker of any server that has one, a lock when a
    /// majority of servers hold one (its time left is when fewer than a majority will), and,
    /// with no marker, the journal's entries that a majority hold (up to a position the
    /// servers that failed could decide).
    async fn inspect(&self, unit: &UnitOfWork) -> Result<Inspection, StoreError> {
        let inner = &*self.inner;
        let answers = inner
            .each(
                "inspect",
                inner.patience(None),
                inner.majority_answered(),
                |protocol| async move { protocol.inspect(unit).await },
            )
            .await;
        let mut seen = Inspection::default();
        let mut markers = Vec::new();
        let mut locks = Vec::new();
        let mut doubts = Vec::new();
        let mut journals = Vec::new();
        let mut errors = Vec::new();
        for answer in answers {
            match answer {
                Ok(inspection) => {
                    journals.push(inspection.journal);
                    if let Some(marker) = inspection.marker {
                        markers.push((marker, inspection.marker_ttl));
                    }
                    locks.extend(inspection.lock_ttl);
                    doubts.extend(inspection.in_doubt);
                }
                Err(err) => errors.push(err),
            }
        }
        if !markers.is_empty() {
            let chosen = most_common(markers.iter().map(|(marker, _)| marker.clone()).collect());
            // The shortest time any copy of it has left: a reader that keeps the answer (a
            // `LocalResultCache`) must not keep it past the first copy's expiry.
            seen.marker_ttl = markers
                .iter()
                .filter(|(marker, _)| same_delivery(marker, &chosen))
                .filter_map(|(_, ttl)| *ttl)
                .min();
            seen.marker = Some(chosen);
        }
        if inner.servers.len() - errors.len() < inner.quorum() {
            return Err(inner.no_quorum("inspect", errors));
        }
        if locks.len() >= inner.quorum() {
            locks.sort_unstable_by(|a, b| b.cmp(a));
            seen.lock_ttl = locks.get(inner.quorum() - 1).copied();
        } else if seen.marker.is_none() {
            // As `begin` judges it: one server that remembers is enough.
            seen.in_doubt = merged(&doubts);
        }
        if seen.marker.is_none() {
            let lists: Vec<&[Vec<u8>]> = journals.iter().map(Journal::entries).collect();
            seen.journal = inspected(&lists, inner.servers.len(), inner.quorum());
        }
        Ok(seen)
    }

    /// Deletes the marker on every server; an error unless every server answered, since a
    /// marker left on one would still answer later deliveries as duplicates.
    async fn forget(&self, unit: &UnitOfWork) -> Result<bool, StoreError> {
        let inner = &*self.inner;
        let answers = inner
            // Every server must answer: a marker left on one still answers deliveries.
            .each(
                "forget",
                inner.patience(None),
                |_| false,
                |protocol| async move { protocol.forget(unit).await },
            )
            .await;
        let mut deleted = false;
        let mut errors = Vec::new();
        for answer in answers {
            match answer {
                Ok(flag) => deleted |= flag,
                Err(err) => errors.push(err),
            }
        }
        if errors.is_empty() {
            Ok(deleted)
        } else {
            Err(inner.no_quorum("forget", errors))
        }
    }

    fn records_steps(&self) -> bool {
        true
    }

    /// The entries a majority of the servers hold, position by position (see
    /// [`RedlockStore`]'s section on steps).
    async fn read_journal(&self, unit: &UnitOfWork) -> Result<Journal, StoreError> {
        self.inner.read_journal(unit).await
    }

    /// The entry on every server; recorded when a majority accepted it.
    async fn record_step(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        entry: StepEntry<'_>,
        lock_ttl: Duration,
    ) -> Result<bool, StoreError> {
        self.inner.record_step(unit, token, entry, lock_ttl).await
    }
}

/// The marker stored by the most servers (the first one seen among equals), counting a marker
/// written after its lock expired (`,l`) as the same delivery's.
///
/// Two deliveries can each have stored a marker on some servers (a stale holder on a minority
/// it could not take back, its successor on a majority); the majority's is the agreed result.
///
/// Among equals, a marker written while its lock was held wins over one written after the lock
/// expired (`,l`, whose caller may have been told nothing was stored), whatever order the
/// servers answered in.
fn most_common(markers: Vec<Vec<u8>>) -> Vec<u8> {
    let rank = |marker: &Vec<u8>| {
        let count = markers
            .iter()
            .filter(|other| same_delivery(marker, other))
            .count();
        let in_time = idempotask::operator::Marker::decode(marker)
            .is_ok_and(|decoded| !decoded.written_after_lock_lost());
        (count, in_time)
    };
    let best = (0..markers.len())
        .max_by_key(|&index| (rank(&markers[index]), std::cmp::Reverse(index)))
        .unwrap_or(0);
    markers.into_iter().nth(best).unwrap_or_default()
}

/// Whether two stored markers are one delivery's, with or without the `,l` flag.
fn same_delivery(a: &[u8], b: &[u8]) -> bool {
    a == b
        || idempotask::store::lock_lost_marker(a).as_deref() == Some(b)
        || idempotask::store::lock_lost_marker(b).as_deref() == Some(a)
}

/// A server's answer that this build of the quorum store has no rule for (a variant the core
/// added later): counted as a failed server, never as agreement.
/// The answers of one `begin` round, sorted.
struct Round {
    grants: Vec<(usize, LockToken)>,
    /// Servers whose answer never came (or was cut off): the `SET` may have run there, or may
    /// still run, and leave a lock of ours that nobody would release.
    unknown: Vec<(usize, LockToken)>,
    markers: Vec<Vec<u8>>,
    busy: Vec<Option<Duration>>,
    errors: Vec<StoreError>,
    /// What the servers remember of an earlier holder whose lock ran out: from those that
    /// were taken over (their indices in `doubted`), and from those left alone (a token that
    /// leaves doubt alone: `left_alone`).
    doubts: Vec<Doubt>,
    doubted: Vec<usize>,
    left_alone: bool,
}

impl Round {
    fn of(answers: Vec<Result<Begin, StoreError>>, token: &LockToken) -> Self {
        let mut round = Self {
            grants: Vec::new(),
            unknown: Vec::new(),
            markers: Vec::new(),
            busy: Vec::new(),
            errors: Vec::new(),
            doubts: Vec::new(),
            doubted: Vec::new(),
            left_alone: false,
        };
        for (index, answer) in answers.into_iter().enumerate() {
            match answer {
                Ok(Begin::Acquired {
                    fencing_token,
                    in_doubt,
                    ..
                }) => {
                    let mut granted = token.clone().granted(fencing_token);
                    if let Some(doubt) = in_doubt {
                        granted = granted.taking_over(*doubt);
                        round.doubts.push(*doubt);
                        round.doubted.push(index);
                    }
                    round.grants.push((index, granted));
                }
                Ok(Begin::InDoubt(doubt)) => {
                    round.left_alone = true;
                    round.doubts.push(doubt);
                }
                Ok(Begin::Done(marker)) => round.markers.push(marker),
                Ok(Begin::Busy {
                    lock_ttl_remaining, ..
                }) => round.busy.push(lock_ttl_remaining),
                Ok(_) => round.errors.push(unknown_answer("begin")),
                Err(err) => {
                    if err.is_ambiguous() {
                        round.unknown.push((index, token.clone()));
                    }
                    round.errors.push(err);
                }
            }
        }
        round
    }
}

/// The doubts of several servers about one earlier holder as one: its highest fencing token,
/// and the shortest time since its lock ran out (each server's clock counts its own).
fn merged(doubts: &[Doubt]) -> Option<Doubt> {
    let expired_for = doubts.iter().map(|doubt| doubt.expired_for).min()?;
    let fencing_token = doubts.iter().filter_map(|doubt| doubt.fencing_token).max();
    Some(Doubt::new(fencing_token, expired_for))
}

fn unknown_answer(operation: &'static str) -> StoreError {
    StoreError::new(
        operation,
        StoreErrorKind::Protocol,
        "a server answered in a way this version of the quorum store does not know",
    )
}

/// The answer of a `begin` that a majority answered and that did not get a majority: another
/// delivery holds the unit on enough servers (or on servers that are down) to keep a majority
/// from this one. The runner waits for it, as a queue's waiter does on one server, rather than
/// fail while it works; `granted` servers granted, `marked` hold a marker, `busy` hold another
/// lock (with its time left), and `errors` failed.
fn waiting(
    granted: usize,
    marked: usize,
    busy: Vec<Option<Duration>>,
    errors: &[StoreError],
    quorum: usize,
) -> Begin {
    // Servers that timed out may be free or busy: when they could have made the majority,
    // when a majority frees up is not known, and the runner backs off by its policy.
    let timed_out = errors
        .iter()
        .filter(|err| err.kind() == StoreErrorKind::Timeout)
        .count();
    if granted + timed_out >= quorum {
        return Begin::busy(None);
    }
    Begin::busy(busy_until(busy, granted + marked, quorum))
}
