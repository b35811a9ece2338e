//! Steps on the quorum: each record sent to every server, each entry of the journal counted
//! where a majority of all the servers hold it at its position.
//!
//! The rule, and why it holds:
//! - A record is confirmed when a majority of servers accepted it (`step.lua` on each checks
//!   the lock's value, fencing token included, and the position, as on one server). A majority
//!   refusing it is a refusal; anything in between is an ambiguous error, and the runner
//!   retries it, then reports the step as unrecorded and keeps the lock.
//! - An entry is in the journal when a majority hold it at its position. The journal ends at
//!   the first position where no entry can be on a majority even counting the servers that did
//!   not answer: what is there is a failed attempt's, held by a minority. A position where the
//!   servers that did not answer could make an entry's majority fails the read (retryable)
//!   rather than guess: a confirmed entry is never dropped, a minority's never replayed.
//! - Only the holder of a majority's lock records, only at the end of the journal it read, so
//!   at that position no entry is confirmed: another entry a server holds there (and all after
//!   it) is a failed attempt's, and the record replaces it. Never an entry that a majority
//!   could hold: that one is confirmed, and the record is refused as on one server.
//! - A server whose journal is shorter than a record's position missed earlier records; the
//!   lock there is the caller's (it is checked first), so it is not a refusal. When the record
//!   needs that server for its majority, the majority's journal (every entry of it confirmed,
//!   and ending right before the record, since the holder records only at the end) replaces
//!   that server's, then the record goes there. Otherwise it gets the journal once the record
//!   is confirmed, so that the journal does not live on a bare majority from then on.
//! - Every round that can confirm a record ends within the record's patience from its first
//!   send: half the lock's TTL, or one server timeout when that is longer (keep the TTL above
//!   two server timeouts). Acceptances further apart would not be one lock's majority; out of
//!   time, the record is ambiguous.
//! - A server that refuses a record (another lock there) answers what it holds at the
//!   position, and counts towards that entry's majority: an entry is replaced only where it
//!   cannot be a majority's counting every server that holds it or did not answer. A
//!   replacement happens only where the holder's servers alone, recorded and replaceable,
//!   make a majority; a server behind the journal never completes one.

use std::sync::LazyLock;
use std::time::{Duration, Instant};

use redis::aio::ConnectionManager;
use redis::{Script, Value};

use super::super::lock::lock_value;
use super::super::protocol::Protocol;
use super::super::reply::unexpected;
use super::super::steps::step_args;
use super::Inner;
use super::servers::Answer;

use idempotask::store::{
    Journal, LockToken, StepEntry, Store, StoreError, StoreErrorKind, UnitOfWork, ttl_millis,
};

static STEP: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("step.lua")));
static CATCH_UP: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("catch_up.lua")));

/// One record of a step: what every round of it sends.
#[derive(Clone, Copy)]
struct Record<'a> {
    unit: &'a UnitOfWork,
    token: &'a LockToken,
    entry: StepEntry<'a>,
    lock_ttl: Duration,
}

/// What one server answered to a record.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Placed {
    /// The entry is at its position there.
    Recorded,
    /// The server's lock is not the caller's (or not with its fencing token); what the server
    /// holds at the position, if anything.
    NotOurs(Option<Vec<u8>>),
    /// Another entry holds the position there.
    Taken(Vec<u8>),
    /// The server's journal is shorter than the position: it missed an earlier record.
    Behind,
}

impl Inner {
    /// The journal of `unit`: the entries a majority of the servers hold, position by
    /// position, up to the first that no majority can hold.
    pub(super) async fn read_journal(&self, unit: &UnitOfWork) -> Result<Journal, StoreError> {
        self.read_journal_within(unit, self.patience(None)).await
    }

    /// [`read_journal`](Self::read_journal), waiting for the servers at most `limit`.
    async fn read_journal_within(
        &self,
        unit: &UnitOfWork,
        limit: Duration,
    ) -> Result<Journal, StoreError> {
        let (servers, quorum) = (self.servers.len(), self.quorum());
        // A server still to answer is waited for while it could decide a position.
        let decided = |answers: &[Option<Answer<Journal>>]| {
            agreed(&answered(answers.iter().flatten()), servers, quorum).is_ok()
        };
        let answers = self
            .each("read_journal", limit, decided, |protocol| async move {
                protocol.read_journal(unit).await
            })
            .await;
        let lists = answered(answers.iter());
        if let Ok(entries) = agreed(&lists, servers, quorum) {
            return Ok(Journal::from_entries(entries));
        }
        // Undecided: a server that failed may hold a majority's entry. Never empty here, since
        // a decision needs no answer that every server gave.
        let errors = answers.into_iter().filter_map(Result::err).collect();
        Err(self.no_quorum("read_journal", errors))
    }

    /// Records `entry` on every server; see the module's rule.
    pub(super) async fn record_step(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        entry: StepEntry<'_>,
        lock_ttl: Duration,
    ) -> Result<bool, StoreError> {
        let record = Record {
            unit,
            token,
            entry,
            lock_ttl,
        };
        let quorum = self.quorum();
        // Every round that can confirm the record ends by then: acceptances further apart than
        // the lock's TTL would not be one majority of one lock.
        let patience = self.patience(Some(lock_ttl));
        let deadline = Instant::now() + patience;
        let decided = |answers: &[Option<Answer<Placed>>]| {
            let recorded = answers
                .iter()
                .filter(|answer| matches!(answer, Some(Ok(Placed::Recorded))))
                .count();
            // A server behind the journal holds our lock and may yet take the record.
            let possible = answers
                .iter()
                .filter(|answer| matches!(answer, None | Some(Ok(Placed::Behind))))
                .count();
            recorded >= quorum || recorded + possible < quorum
        };
        let answers = self
            .each("record_step", patience, decided, |protocol| async move {
                place(&protocol, record, false).await
            })
            .await;
        let mut recorded = 0;
        let mut refused = 0;
        let mut held_others = Vec::new();
        // What the servers that refused hold at the position: not replaceable there, but part
        // of the count that decides whether an entry may be a majority's.
        let mut held_by_refusers = Vec::new();
        let mut behind = Vec::new();
        let mut errors = Vec::new();
        for (index, answer) in answers.into_iter().enumerate() {
            match answer {
                Ok(Placed::Recorded) => recorded += 1,
                Ok(Placed::NotOurs(held)) => {
                    refused += 1;
                    held_by_refusers.extend(held);
                }
                // Our lock there: not a refusal.
                Ok(Placed::Behind) => behind.push(index),
                Ok(Placed::Taken(held)) => held_others.push((index, held)),
                Err(err) => errors.push(err),
            }
        }
        // An entry held where the servers that failed could make its majority, with those
        // that hold it (refusing or not), may be confirmed: never replaced.
        let unknown = errors.len();
        let (replaceable, kept): (Vec<_>, Vec<_>) = held_others.iter().partition(|(_, held)| {
            let holding = held_others
                .iter()
                .map(|(_, other)| other)
                .chain(&held_by_refusers)
                .filter(|other| *other == held)
                .count();
            holding + unknown < quorum
        });
        let replaceable: Vec<usize> = replaceable.iter().map(|(index, _)| *index).collect();
        if recorded < quorum && recorded + replaceable.len() >= quorum && !left(deadline).is_zero()
        {
            let answers = self
                .place_on(record, &replaceable, true, left(deadline))
                .await;
            tally(answers, &mut recorded, &mut refused, &mut errors);
        } else if recorded >= quorum && !replaceable.is_empty() {
            // Confirmed: whatever else those servers hold at the position is a failed
            // attempt's. Replacing it keeps the servers alike, so that a later read with a
            // server missing still finds a majority; a failure here changes nothing decided.
            for err in self
                .place_on(record, &replaceable, true, patience)
                .await
                .into_iter()
                .filter_map(Result::err)
            {
                tracing::debug!(error = %err, "could not replace a failed attempt's journal entry on a server");
            }
        }
        if recorded < quorum && recorded + behind.len() >= quorum {
            // The servers that missed earlier records hold our lock: once they carry the
            // journal before the entry, they take the record as the others did. Refusing it
            // would leave the step's effect done and unrecorded while the lock is ours.
            match self.place_behind(record, &behind, deadline).await {
                Ok(answers) => tally(answers, &mut recorded, &mut refused, &mut errors),
                Err(Confirmed) => return Ok(true),
            }
        } else if recorded >= quorum && !behind.is_empty() {
            self.catch_up_after(record, &behind).await;
        }
        if recorded >= quorum {
            return Ok(true);
        }
        if refused + kept.len() >= quorum {
            return Ok(false);
        }
        // The entry may be on some servers and may yet be on others: neither recorded nor
        // refused, which is what a lost reply is on one server.
        Err(self.no_quorum("record_step", errors).ambiguous_if(true))
    }

    /// Gives the servers at `indices`, which missed earlier records of `unit`'s journal, the
    /// journal a majority hold, once it ends with `entry`, just confirmed at its position.
    /// Without it such a server refuses every later record of the journal, and the journal
    /// lives on a bare majority: one more server down and it cannot be read. A failure here
    /// changes nothing decided.
    async fn catch_up_after(&self, record: Record<'_>, indices: &[usize]) {
        let limit = self.patience(None);
        let journal = match self.read_journal_within(record.unit, limit).await {
            // Another holder's journal by now, or a read that missed this record: leave it.
            Ok(journal) if ends_with(journal.entries(), record.entry) => journal.into_entries(),
            Ok(_) => return,
            Err(err) => {
                tracing::debug!(error = %err, "could not read the journal for a server that missed records");
                return;
            }
        };
        let (_, others) = self.catch_up(record, &journal, indices, limit).await;
        for err in others.into_iter().filter_map(Result::err) {
            tracing::debug!(error = %err, "could not give a server that missed records the journal");
        }
    }

    /// Sends `record` to the servers at `indices`, which hold its lock and missed earlier
    /// records of its unit's journal, by `deadline`: each is given the journal a majority hold
    /// before the entry's position, then the record. Their answers (or why they were not
    /// asked), or `Confirmed` when the majority's journal already holds the record.
    async fn place_behind(
        &self,
        record: Record<'_>,
        indices: &[usize],
        deadline: Instant,
    ) -> Result<Vec<Answer<Placed>>, Confirmed> {
        if left(deadline).is_zero() {
            return Ok(vec![Err(out_of_time())]);
        }
        let journal = match self.read_journal_within(record.unit, left(deadline)).await {
            Ok(journal) => journal.into_entries(),
            Err(err) => return Ok(vec![Err(err)]),
        };
        let at = usize::try_from(record.entry.position).unwrap_or(usize::MAX);
        if journal.len() != at {
            // A send of this record that came late may have confirmed it meanwhile.
            if journal
                .get(at)
                .is_some_and(|held| *held == record.entry.bytes)
            {
                return Err(Confirmed);
            }
            // Otherwise the record is past the journal's end: refused, as on one server.
            return Ok(indices.iter().map(|_| Ok(Placed::Behind)).collect());
        }
        if left(deadline).is_zero() {
            return Ok(vec![Err(out_of_time())]);
        }
        let (given, mut others) = self
            .catch_up(record, &journal, indices, left(deadline))
            .await;
        if !given.is_empty() {
            if left(deadline).is_zero() {
                others.push(Err(out_of_time()));
            } else {
                others.extend(self.place_on(record, &given, false, left(deadline)).await);
            }
        }
        Ok(others)
    }

    /// Writes `journal`, whose entries a majority hold, on the servers at `indices` where the
    /// lock is `token`'s, in place of what they hold, waiting at most `limit`. Every entry is
    /// confirmed, so nothing a server loses by it was. The indices of the servers that took it,
    /// and what the others answer to the record: refused where the lock is not `token`'s, an
    /// error where the server could not be reached or answered something else.
    async fn catch_up(
        &self,
        record: Record<'_>,
        journal: &[Vec<u8>],
        indices: &[usize],
        limit: Duration,
    ) -> (Vec<usize>, Vec<Answer<Placed>>) {
        let lock = lock_value(record.token);
        let answers = self
            .some(
                "record_step",
                indices,
                limit,
                |_| false,
                |_, protocol| {
                    let lock = &lock;
                    async move {
                        let key = protocol.key(record.unit);
                        let list = protocol.journal_key(&key);
                        let reply = protocol
                            .invoke_on("record_step", &CATCH_UP, &[&key, &list], |cmd| {
                                cmd.arg(lock).arg(ttl_millis(record.entry.kept_for));
                                for held in journal {
                                    cmd.arg(held);
                                }
                            })
                            .await?;
                        match reply {
                            Value::Int(1) => Ok(true),
                            Value::Int(0) => Ok(false),
                            other => Err(unexpected("record_step", &key, &other)),
                        }
                    }
                },
            )
            .await;
        let (mut given, mut others) = (Vec::new(), Vec::new());
        for (answer, &index) in answers.into_iter().zip(indices) {
            match answer {
                Ok(true) => given.push(index),
                Ok(false) => others.push(Ok(Placed::NotOurs(None))),
                Err(err) => others.push(Err(err)),
            }
        }
        (given, others)
    }

    /// Sends `record` to the servers at `indices`, replacing another entry at its position
    /// if `replace`, waiting at most `limit`.
    async fn place_on(
        &self,
        record: Record<'_>,
        indices: &[usize],
        replace: bool,
        limit: Duration,
    ) -> Vec<Answer<Placed>> {
        self.some(
            "record_step",
            indices,
            limit,
            |_| false,
            |_, protocol| async move { place(&protocol, record, replace).await },
        )
        .await
    }
}

/// The journal a majority hold already ends with the record: a send of it that came late
/// confirmed it.
struct Confirmed;

/// Why a record that needed the servers behind the journal is ambiguous: the lock's time for it
/// ran out first.
fn out_of_time() -> StoreError {
    StoreError::new(
        "record_step",
        StoreErrorKind::Timeout,
        "the lock's time for the record ran out before the servers that missed earlier records \
         were given the journal",
    )
    .ambiguous_if(true)
}

/// The time left until `deadline`.
fn left(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
}

/// Whether `journal` ends with `entry`, at its position.
fn ends_with(journal: &[Vec<u8>], entry: StepEntry<'_>) -> bool {
    usize::try_from(entry.position).is_ok_and(|at| journal.len() == at + 1)
        && journal.last().is_some_and(|last| last == entry.bytes)
}

/// Adds the answers of a second round of a record to its counts: any answer but `Recorded` is
/// a refusal there.
fn tally(
    answers: Vec<Answer<Placed>>,
    recorded: &mut usize,
    refused: &mut usize,
    errors: &mut Vec<StoreError>,
) {
    for answer in answers {
        match answer {
            Ok(Placed::Recorded) => *recorded += 1,
            Ok(_) => *refused += 1,
            Err(err) => errors.push(err),
        }
    }
}

/// `step.lua` of the quorum on one server.
async fn place(
    protocol: &Protocol<ConnectionManager>,
    record: Record<'_>,
    replace: bool,
) -> Result<Placed, StoreError> {
    let key = protocol.key(record.unit);
    let journal = protocol.journal_key(&key);
    let reply = protocol
        .invoke_on("record_step", &STEP, &[&key, &journal], |cmd| {
            step_args(cmd, record.token, record.entry, record.lock_ttl);
            cmd.arg(if replace { "1" } else { "0" });
        })
        .await?;
    match reply {
        Value::Int(1) => Ok(Placed::Recorded),
        Value::Int(0) => Ok(Placed::NotOurs(None)),
        Value::Int(3) => Ok(Placed::Behind),
        Value::Array(items) => match items.as_slice() {
            [Value::Int(2), Value::BulkString(held)] => Ok(Placed::Taken(held.clone())),
            [Value::Int(0), Value::BulkString(held)] => Ok(Placed::NotOurs(Some(held.clone()))),
            [Value::Int(0), Value::Nil] | [Value::Int(0)] => Ok(Placed::NotOurs(None)),
            _ => Err(unexpected("record_step", &key, &Value::Array(items))),
        },
        other => Err(unexpected("record_step", &key, &other)),
    }
}

/// The entries of the journals that servers answered.
fn answered<'a>(answers: impl Iterator<Item = &'a Answer<Journal>>) -> Vec<&'a [Vec<u8>]> {
    answers
        .filter_map(|answer| answer.as_ref().ok())
        .map(Journal::entries)
        .collect()
}

/// The journal that `lists` (the journals of the servers that answered, of `servers` in all)
/// agree on: each position's entry held by at least `quorum` of them, up to the first position
/// where no entry can have a majority even with every server that did not answer. `Err` with
/// the position that the servers which did not answer could decide, or 0 when fewer than a
/// majority answered.
fn agreed(lists: &[&[Vec<u8>]], servers: usize, quorum: usize) -> Result<Vec<Vec<u8>>, usize> {
    if lists.len() < quorum {
        return Err(0);
    }
    match majority_prefix(lists, servers, quorum) {
        (journal, None) => Ok(journal),
        (_, Some(position)) => Err(position),
    }
}

/// What an operator is shown of the journals `lists`: the entries [`agreed`] on, and where no
/// position is decided, those before it.
pub(super) fn inspected(lists: &[&[Vec<u8>]], servers: usize, quorum: usize) -> Journal {
    Journal::from_entries(majority_prefix(lists, servers, quorum).0)
}

/// The entries held by `quorum` of `lists` at each position, and the first position where
/// the servers that did not answer could make an entry's majority, if the journal is not
/// decided before it.
fn majority_prefix(
    lists: &[&[Vec<u8>]],
    servers: usize,
    quorum: usize,
) -> (Vec<Vec<u8>>, Option<usize>) {
    let missing = servers.saturating_sub(lists.len());
    let mut journal = Vec::new();
    loop {
        let position = journal.len();
        let mut counts: Vec<(&Vec<u8>, usize)> = Vec::new();
        for entry in lists.iter().filter_map(|list| list.get(position)) {
            match counts.iter_mut().find(|(held, _)| *held == entry) {
                Some((_, count)) => *count += 1,
                None => counts.push((entry, 1)),
            }
        }
        if let Some((entry, _)) = counts.iter().find(|(_, count)| *count >= quorum) {
            journal.push((*entry).clone());
        } else if counts.iter().all(|(_, count)| count + missing < quorum) {
            return (journal, None);
        } else {
            return (journal, Some(position));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::agreed;

    fn lists(lists: &[&[&str]]) -> Vec<Vec<Vec<u8>>> {
        lists
            .iter()
            .map(|list| list.iter().map(|entry| entry.as_bytes().to_vec()).collect())
            .collect()
    }

    fn agreed_on(answered: &[&[&str]], servers: usize) -> Result<Vec<String>, usize> {
        let owned = lists(answered);
        let borrowed: Vec<&[Vec<u8>]> = owned.iter().map(Vec::as_slice).collect();
        agreed(&borrowed, servers, servers / 2 + 1).map(|entries| {
            entries
                .into_iter()
                .map(|entry| String::from_utf8(entry).unwrap())
                .collect()
        })
    }

    #[test]
    fn an_entry_counts_where_a_majority_of_all_servers_hold_it() {
        assert_eq!(
            agreed_on(&[&["a", "b"], &["a", "b"], &["a"]], 3),
            Ok(vec!["a".into(), "b".into()])
        );
        // A failed attempt's entry on one server of three is not the journal's.
        assert_eq!(
            agreed_on(&[&["a"], &["a"], &["a", "x"]], 3),
            Ok(vec!["a".into()])
        );
        assert_eq!(agreed_on(&[&["y"], &["z"], &[]], 3), Ok(vec![]));
        // Nor on two of five, the three others answering without it.
        assert_eq!(agreed_on(&[&["x"], &["x"], &[], &[], &[]], 5), Ok(vec![]));
    }

    #[test]
    fn a_position_that_the_missing_servers_could_decide_is_not_guessed() {
        // "b" may be on the server that did not answer too: a majority's, confirmed.
        assert_eq!(agreed_on(&[&["a", "b"], &["a"]], 3), Err(1));
        assert_eq!(agreed_on(&[&["a", "b"], &["a", "c"]], 3), Err(1));
        // Two of five hold "x" and two lack it: with the fifth, "x" may be on three.
        assert_eq!(agreed_on(&[&["x"], &["x"], &[], &[]], 5), Err(0));
        assert_eq!(agreed_on(&[&["x"], &[], &[], &[]], 5), Ok(vec![]));
        // Fewer than a majority answered.
        assert_eq!(agreed_on(&[&["a"]], 3), Err(0));
        // The missing server cannot change a position a majority decided.
        assert_eq!(
            agreed_on(&[&["a", "b"], &["a", "b"]], 3),
            Ok(vec!["a".into(), "b".into()])
        );
    }
}
