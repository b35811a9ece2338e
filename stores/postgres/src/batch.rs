//! [`Store::begin_batch`](idempotask::store::Store::begin_batch) and
//! [`finish_batch`](idempotask::store::Store::finish_batch) of [`PostgresStore`]: the units of
//! a batch in one statement, so in one round trip and one commit, where one statement per unit
//! waits for a WAL flush each.
//!
//! The batch statement takes what it can take in one statement (a unit with no row, a marker,
//! another's live lock, a lock of the caller's to replace with its marker); every other unit is
//! asked alone afterwards, with the single statements, in the batch's order: an expired row,
//! the caller's own lock, a unit in doubt to take over, a row written by a concurrent
//! transaction after the statement's snapshot, and a second claim of a unit already in the
//! batch. So each unit gets exactly the answer it would have had alone.
//!
//! A batch statement is one transaction: it applies to every unit or to none. When the server
//! refuses it for a reason of one unit's (its row-lock wait ran out, or a deadlock with
//! another batch), nothing was applied, and every unit is asked alone, so that one unit's wait
//! never fails another. Any other failure (a lost connection, a timeout, no connection to be
//! had) is every unit's answer, ambiguous where the statement may have applied, as for a
//! single call.

use std::collections::HashSet;
use std::time::Duration;

use idempotask::store::{Begin, Claim, Completion, Fencing, Finish, Store, UnitOfWork};
use idempotask::store::{StoreError, StoreErrorKind};
use sqlx::Row;
use sqlx::postgres::{PgArguments, PgRow};
use sqlx::query::Query;

use crate::errors::{classify, store_error};
use crate::rows::{Found, fence_param, fresh_answer, memory_micros, millis};
use crate::store::PostgresStore;

/// SQLSTATEs of a batch statement the server refused because of one of its units, having
/// applied nothing: `lock_not_available` (the statement's bounded row-lock wait ran out) and
/// `deadlock_detected`.
const ONE_UNITS_REFUSAL: [&str; 2] = ["55P03", "40P01"];

/// How a batch statement failed as a whole.
enum Whole {
    /// Nothing was applied, for a reason of one unit's: ask each alone.
    Alone,
    /// Every unit's answer.
    Each(Failure),
}

/// A failure that is every unit's answer: its kind, whether the statement may have applied,
/// and what it says.
struct Failure(StoreErrorKind, bool, String);

impl Failure {
    /// One unit's copy of the failure.
    fn error(&self, operation: &'static str) -> StoreError {
        StoreError::new(operation, self.0, self.2.clone()).ambiguous_if(self.1)
    }
}

/// The position of the first claim of each unit: the ones a batch statement carries.
fn first_of_each<'u>(units: impl Iterator<Item = &'u UnitOfWork>) -> Vec<usize> {
    let mut seen = HashSet::new();
    units
        .enumerate()
        .filter(|(_, unit)| seen.insert((unit.task(), unit.key().as_bytes())))
        .map(|(at, _)| at)
        .collect()
}

/// The claim a row of a batch statement answers: `carried[n - 1]`; `None` for an `n` the
/// statement cannot have answered.
fn position(row: &PgRow, carried: &[usize]) -> Option<usize> {
    let n: i64 = row.try_get("n").ok()?;
    let index = usize::try_from(n.checked_sub(1)?).ok()?;
    carried.get(index).copied()
}

impl PostgresStore {
    /// Runs a batch statement of `operation` on a connection of the store's pool, under the
    /// response timeout.
    async fn batch_rows(
        &self,
        operation: &'static str,
        statement: Query<'_, sqlx::Postgres, PgArguments>,
    ) -> Result<Vec<PgRow>, Whole> {
        let mut connection = self
            .acquire(operation)
            .await
            .map_err(|err| Whole::Each(Failure(err.kind(), err.is_ambiguous(), err.to_string())))?;
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
        let carried = first_of_each(claims.iter().map(|claim| claim.unit));
        if carried.len() > 1 {
            let statement = match fencing {
                Fencing::On => &self.statements.begin_fresh_fenced_batch,
                _ => &self.statements.begin_fresh_batch,
            };
            let of = |at: &usize| &claims[*at];
            let query = sqlx::query(statement.clone())
                .bind(
                    carried
                        .iter()
                        .map(|at| of(at).unit.task())
                        .collect::<Vec<_>>(),
                )
                .bind(
                    carried
                        .iter()
                        .map(|at| of(at).unit.key().as_bytes())
                        .collect::<Vec<_>>(),
                )
                .bind(
                    carried
                        .iter()
                        .map(|at| of(at).token.as_str())
                        .collect::<Vec<_>>(),
                )
                .bind(
                    carried
                        .iter()
                        .map(|at| memory_micros(of(at).token))
                        .collect::<Vec<_>>(),
                )
                .bind(millis(lock_ttl));
            match self.batch_rows("begin", query).await {
                Ok(rows) => {
                    for row in &rows {
                        let Some(at) = position(row, &carried) else {
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
                Err(Whole::Alone) => {}
                Err(Whole::Each(failure)) => {
                    for at in carried {
                        answers[at] = Some(Err(failure.error("begin")));
                    }
                }
            }
        }
        let mut all = Vec::with_capacity(claims.len());
        for (claim, answer) in claims.iter().zip(answers) {
            all.push(match answer {
                Some(answer) => answer,
                None => self.begin(claim.unit, claim.token, lock_ttl, fencing).await,
            });
        }
        all
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
        let mut fences = Vec::with_capacity(completions.len());
        for (at, completion) in completions.iter().enumerate() {
            let fence = fence_param(completion.token);
            if fence.is_err() {
                answers[at] = Some(Ok(Finish::lost_nothing_written()));
            }
            fences.push(fence.unwrap_or_default());
        }
        let carried: Vec<usize> = first_of_each(completions.iter().map(|done| done.unit))
            .into_iter()
            .filter(|at| answers[*at].is_none())
            .collect();
        if carried.len() > 1 {
            let of = |at: &usize| &completions[*at];
            let query = sqlx::query(self.statements.finish_held_batch.clone())
                .bind(
                    carried
                        .iter()
                        .map(|at| of(at).unit.task())
                        .collect::<Vec<_>>(),
                )
                .bind(
                    carried
                        .iter()
                        .map(|at| of(at).unit.key().as_bytes())
                        .collect::<Vec<_>>(),
                )
                .bind(
                    carried
                        .iter()
                        .map(|at| of(at).token.as_str())
                        .collect::<Vec<_>>(),
                )
                .bind(carried.iter().map(|at| fences[*at]).collect::<Vec<_>>())
                .bind(carried.iter().map(|at| of(at).marker).collect::<Vec<_>>())
                .bind(millis(result_ttl));
            match self.batch_rows("finish", query).await {
                Ok(rows) => {
                    for row in &rows {
                        if let Some(at) = position(row, &carried) {
                            answers[at] = Some(Ok(Finish::Completed));
                        }
                    }
                }
                Err(Whole::Alone) => {}
                Err(Whole::Each(failure)) => {
                    for at in carried {
                        answers[at] = Some(Err(failure.error("finish")));
                    }
                }
            }
        }
        let mut all = Vec::with_capacity(completions.len());
        for (done, answer) in completions.iter().zip(answers) {
            all.push(match answer {
                Some(answer) => answer,
                None => {
                    self.finish(done.unit, done.token, done.marker, result_ttl)
                        .await
                }
            });
        }
        all
    }
}
