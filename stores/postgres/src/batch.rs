//! [`Store::begin_batch`](idempotask::store::Store::begin_batch) and
//! [`finish_batch`](idempotask::store::Store::finish_batch) of [`PostgresStore`]: the units of
//! a batch in one statement, so in one round trip and one commit, where one statement per unit
//! waits for a WAL flush each.
//!
//! The batch statement takes what it can take in one statement (a unit with no row, a marker,
//! another's live lock, a lock of the caller's to replace with its marker); every other unit is
//! asked alone afterwards, with the single statements: an expired row, the caller's own lock, a
//! unit in doubt to take over, a row written by a concurrent transaction after the statement's
//! snapshot, and a second claim of a unit already in the batch. Distinct units are asked at
//! once, on connections of their own; the claims of one unit in the batch's order. So each
//! unit gets exactly the answer it would have had alone.
//!
//! A batch statement is one transaction: it applies to every unit or to none. Each of its
//! row-lock waits is bounded by a share of the single statement's bound, so that however many
//! rows it waits on, it ends in the server within that bound, before the client stops
//! listening. When the server refuses it for a reason of one unit's (a wait ran out, a
//! deadlock with another batch, a `statement_timeout`), nothing was applied, and every unit is
//! asked alone, with the whole bound, so that one unit's wait never fails another. Any other
//! failure (a lost connection, a timeout, no connection to be had) is every carried unit's
//! answer, ambiguous where the statement may have applied, as for a single call.

use std::collections::HashMap;
use std::time::Duration;

use futures_util::future::join_all;
use idempotask::store::{Begin, Claim, Completion, Fencing, Finish, UnitOfWork};
use idempotask::store::{StoreError, StoreErrorKind};
use sqlx::Row;
use sqlx::postgres::{PgArguments, PgRow};
use sqlx::query::Query;

use crate::builder::lock_timeout;
use crate::errors::{classify, store_error};
use crate::rows::{Found, fence_param, fresh_answer, memory_micros, millis};
use crate::store::PostgresStore;

/// SQLSTATEs of a batch statement that the server refused having applied nothing, for a
/// reason of one of its units: `lock_not_available` (a row-lock wait ran out),
/// `deadlock_detected`, and `query_canceled` (a `statement_timeout` of the application's
/// connection settings, or a cancel).
const ONE_UNITS_REFUSAL: [&str; 3] = ["55P03", "40P01", "57014"];

/// How a batch statement failed as a whole.
enum Whole {
    /// Nothing was applied, for a reason of one unit's: ask each alone.
    Alone,
    /// Every carried unit's answer.
    Each(Failure),
}

/// A failure that is every carried unit's answer: its kind, whether the statement may have
/// applied, and what it says.
struct Failure(StoreErrorKind, bool, String);

impl Failure {
    /// One unit's copy of the failure.
    fn error(&self, operation: &'static str) -> StoreError {
        StoreError::new(operation, self.0, self.2.clone()).ambiguous_if(self.1)
    }
}

/// Which claims a batch statement carries, and which are asked alone (and how).
struct Plan {
    /// The position of the first claim of each unit, in order.
    carried: Vec<usize>,
    /// The positions of each unit's other claims, a list per unit, each in order: units are
    /// asked at once, one unit's claims one after another.
    alone: Vec<Vec<usize>>,
}

impl Plan {
    /// Carries the first claim of each of `units` whose position `eligible` accepts.
    fn new<'u>(
        units: impl Iterator<Item = &'u UnitOfWork>,
        eligible: impl Fn(usize) -> bool,
    ) -> Self {
        let (mut carried, mut alone) = (Vec::new(), Vec::<Vec<usize>>::new());
        let mut lists: HashMap<&'u UnitOfWork, usize> = HashMap::new();
        for (at, unit) in units.enumerate() {
            if let Some(&list) = lists.get(unit) {
                alone[list].push(at);
                continue;
            }
            if eligible(at) {
                carried.push(at);
            }
            lists.insert(unit, alone.len());
            alone.push(vec![at]);
        }
        Self { carried, alone }
    }
}

/// The claim a row of a batch statement answers: `carried[n - 1]`; `None` for an `n` the
/// statement cannot have answered.
fn position(row: &PgRow, carried: &[usize]) -> Option<usize> {
    let n: i64 = row.try_get("n").ok()?;
    let index = usize::try_from(n.checked_sub(1)?).ok()?;
    carried.get(index).copied()
}

/// Asks every claim `answers` has no answer for yet, with `ask`: the lists of `alone` at once,
/// the claims of one list one after another.
async fn ask_alone<T, F>(
    mut answers: Vec<Option<Result<T, StoreError>>>,
    alone: &[Vec<usize>],
    ask: impl Fn(usize) -> F,
) -> Vec<Result<T, StoreError>>
where
    F: Future<Output = Result<T, StoreError>>,
{
    let ask = &ask;
    let asked = join_all(alone.iter().map(|claims| {
        let pending: Vec<usize> = claims
            .iter()
            .copied()
            .filter(|at| answers[*at].is_none())
            .collect();
        async move {
            let mut asked = Vec::with_capacity(pending.len());
            for at in pending {
                asked.push((at, ask(at).await));
            }
            asked
        }
    }))
    .await;
    for (at, answer) in asked.into_iter().flatten() {
        answers[at] = Some(answer);
    }
    answers
        .into_iter()
        .map(|answer| {
            // Every claim is in one list of `alone`, so none is left unanswered.
            answer.unwrap_or_else(|| {
                Err(StoreError::new(
                    "batch",
                    StoreErrorKind::Protocol,
                    "a unit of the batch was never asked",
                ))
            })
        })
        .collect()
}

/// `statement` with its first three arrays bound: the tasks, keys and tokens of the `carried`
/// units, `unit_of` giving each one's unit and token.
///
/// Sent as the unnamed statement (`persistent(false)`), so the server plans it for each batch
/// with the arrays it carries and the table as it is. A named statement gets a generic plan
/// after five executions, and keeps it: one made while the table was small joins the arrays to
/// a sequential scan of the whole table, which costs more with every row the table gains (a
/// batch `begin` went from 0.4 ms to 16 ms in three bench rounds of 10,000 units; the test
/// `batches_first_run_on_an_empty_table_read_only_their_rows_once_it_is_large` checks it).
/// Planning costs one parse and plan per batch, and the round trip of the statement's
/// description, where a batch carries tens of units.
fn with_units<'q>(
    statement: &sqlx::SqlStr,
    carried: &[usize],
    unit_of: impl Fn(usize) -> (&'q UnitOfWork, &'q idempotask::store::LockToken),
) -> Query<'q, sqlx::Postgres, PgArguments> {
    let units: Vec<_> = carried.iter().map(|at| unit_of(*at)).collect();
    sqlx::query(statement.clone())
        .persistent(false)
        .bind(
            units
                .iter()
                .map(|(unit, _)| unit.task())
                .collect::<Vec<_>>(),
        )
        .bind(
            units
                .iter()
                .map(|(unit, _)| unit.key().as_bytes())
                .collect::<Vec<_>>(),
        )
        .bind(
            units
                .iter()
                .map(|(_, token)| token.as_str())
                .collect::<Vec<_>>(),
        )
}

impl PostgresStore {
    /// The rows a batch statement of `operation` answered for the `carried` claims; none when
    /// it failed, having written that failure into `answers` for each carried claim when it is
    /// theirs, or left them to be asked alone.
    async fn carried_rows<T>(
        &self,
        operation: &'static str,
        statement: Query<'_, sqlx::Postgres, PgArguments>,
        carried: &[usize],
        answers: &mut [Option<Result<T, StoreError>>],
    ) -> Vec<PgRow> {
        match self.batch_rows(operation, statement).await {
            Ok(rows) => rows,
            Err(Whole::Alone) => Vec::new(),
            Err(Whole::Each(failure)) => {
                for &at in carried {
                    answers[at] = Some(Err(failure.error(operation)));
                }
                Vec::new()
            }
        }
    }

    /// The bound of each row-lock wait of a batch statement carrying `carried` units: a share
    /// of a single statement's, at least 1 ms, as `lock_timeout` text.
    fn wait_share(&self, carried: usize) -> String {
        let bound = lock_timeout(self.response_timeout);
        let share = bound / u32::try_from(carried).unwrap_or(u32::MAX).max(1);
        format!("{}ms", share.as_millis().max(1))
    }

    /// Runs a batch statement of `operation` on a connection of the store's pool, under the
    /// response timeout.
    async fn batch_rows(
        &self,
        operation: &'static str,
        statement: Query<'_, sqlx::Postgres, PgArguments>,
    ) -> Result<Vec<PgRow>, Whole> {
        let mut connection = self.acquire(operation).await.map_err(|err| {
            Whole::Each(Failure(
                err.kind(),
                err.is_ambiguous(),
                err.message().to_owned(),
            ))
        })?;
        match tokio::time::timeout(self.response_timeout, statement.fetch_all(&mut *connection))
            .await
        {
            Ok(Ok(rows)) => Ok(rows),
            Ok(Err(sqlx::Error::Database(db)))
                if db
                    .code()
                    .is_some_and(|code| ONE_UNITS_REFUSAL.contains(&&*code)) =>
            {
                Err(Whole::Alone)
            }
            Ok(Err(err)) => {
                let (kind, ambiguous, message) = classify(&self.table, &err);
                Err(Whole::Each(Failure(kind, ambiguous, message)))
            }
            Err(_) => Err(Whole::Each(Failure(
                StoreErrorKind::Timeout,
                true,
                format!("no answer within {} ms", self.response_timeout.as_millis()),
            ))),
        }
    }

    /// `begin_batch`: see the [module](self) docs.
    pub(crate) async fn begin_together(
        &self,
        claims: &[Claim<'_>],
        lock_ttl: Duration,
        fencing: Fencing,
    ) -> Vec<Result<Begin, StoreError>> {
        let mut answers: Vec<Option<Result<Begin, StoreError>>> =
            claims.iter().map(|_| None).collect();
        let plan = Plan::new(claims.iter().map(|claim| claim.unit), |_| true);
        let carried = &plan.carried;
        if carried.len() > 1 {
            let statement = match fencing {
                Fencing::On => &self.statements.begin_fresh_fenced_batch,
                _ => &self.statements.begin_fresh_batch,
            };
            let query = with_units(statement, carried, |at| (claims[at].unit, claims[at].token))
                .bind(
                    carried
                        .iter()
                        .map(|at| memory_micros(claims[*at].token))
                        .collect::<Vec<_>>(),
                )
                .bind(millis(lock_ttl))
                .bind(self.wait_share(carried.len()));
            for row in &self
                .carried_rows("begin", query, carried, &mut answers)
                .await
            {
                let Some(at) = position(row, carried) else {
                    continue;
                };
                answers[at] = match fresh_answer(row) {
                    Ok(Found::Answer(answer)) => Some(Ok(answer)),
                    Ok(Found::InDoubt(doubt)) if !claims[at].token.takes_over_doubt() => {
                        Some(Ok(Begin::InDoubt(doubt)))
                    }
                    Ok(_) => None,
                    Err(err) => Some(Err(store_error("begin", &self.table, err))),
                };
            }
        }
        ask_alone(answers, &plan.alone, |at| {
            let claim = &claims[at];
            self.begin_alone(claim.unit, claim.token, lock_ttl, fencing)
        })
        .await
    }

    /// `finish_batch`: see the [module](self) docs.
    pub(crate) async fn finish_together(
        &self,
        completions: &[Completion<'_>],
        result_ttl: Duration,
    ) -> Vec<Result<Finish, StoreError>> {
        let mut answers: Vec<Option<Result<Finish, StoreError>>> =
            completions.iter().map(|_| None).collect();
        // A token that was never granted a fencing token it could carry is answered as
        // `finish` answers it, without a statement.
        let fences: Vec<_> = completions
            .iter()
            .map(|completion| fence_param(completion.token))
            .collect();
        for (answer, fence) in answers.iter_mut().zip(&fences) {
            if fence.is_err() {
                *answer = Some(Ok(Finish::lost_nothing_written()));
            }
        }
        let plan = Plan::new(completions.iter().map(|done| done.unit), |at| {
            fences[at].is_ok()
        });
        let carried = &plan.carried;
        if carried.len() > 1 {
            let statement = &self.statements.finish_held_batch;
            let query = with_units(statement, carried, |at| {
                (completions[at].unit, completions[at].token)
            })
            .bind(
                carried
                    .iter()
                    .map(|at| fences[*at].as_ref().ok().copied().flatten())
                    .collect::<Vec<_>>(),
            )
            .bind(
                carried
                    .iter()
                    .map(|at| completions[*at].marker)
                    .collect::<Vec<_>>(),
            )
            .bind(millis(result_ttl))
            .bind(self.wait_share(carried.len()));
            for row in &self
                .carried_rows("finish", query, carried, &mut answers)
                .await
            {
                if let Some(at) = position(row, carried) {
                    answers[at] = Some(Ok(Finish::Completed));
                }
            }
        }
        ask_alone(answers, &plan.alone, |at| {
            let done = &completions[at];
            self.finish_alone(done.unit, done.token, done.marker, result_ttl)
        })
        .await
    }
}
