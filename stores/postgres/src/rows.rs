//! What a row answers: the store's answers read from the rows its statements return.

use std::time::Duration;

use idempotask::store::LockToken;
use idempotask::store::StoreError;
use idempotask::store::{Begin, Doubt, ttl_millis};
use sqlx::Row;
use sqlx::postgres::PgRow;

use crate::errors::store_error;

/// What an operator's compare-and-set statement did with the value shown.
pub(crate) enum Exact {
    /// The row was still that value, and it is written.
    Written,
    /// A row is there, but not that value; nothing was written.
    Changed,
    /// No row counts as there; nothing was written.
    Gone,
}

/// What a row of `begin_fresh` or `begin` comes to.
pub(crate) enum Found {
    /// The answer.
    Answer(Begin),
    /// The unit is in doubt: take it over, or leave it.
    InDoubt(Doubt),
    /// From `begin_fresh`: a row that only `begin` may take (expired, or the caller's own
    /// lock). From `begin`: never.
    Expired,
}

/// Reads the row `begin_fresh` answered.
pub(crate) fn fresh_answer(row: &PgRow) -> Result<Found, sqlx::Error> {
    let state: &str = row.try_get("state")?;
    if state == "acquired" {
        // A new row: it took nothing over.
        let fence: Option<i64> = row.try_get("fence")?;
        return Ok(Found::Answer(Begin::acquired(fence.map(i64::unsigned_abs))));
    }
    let mine: Option<bool> = row.try_get("mine")?;
    // The caller's own lock, in doubt or not, is the caller's to take again.
    let mine = state == "locked" && mine == Some(true);
    if !mine && let Some(doubt) = doubt(row)? {
        return Ok(Found::InDoubt(doubt));
    }
    let left: Option<i64> = row.try_get("left_ms")?;
    // Milliseconds rounded up: a row is live while any time is left.
    let live = left.is_some_and(|left| left > 0);
    if !live || mine {
        return Ok(Found::Expired);
    }
    begin_answer(row)
}

/// Reads the row `begin` answered (or `begin_fresh`, when it is one `begin` would answer
/// other than `acquired`).
pub(crate) fn begin_answer(row: &PgRow) -> Result<Found, sqlx::Error> {
    let state: &str = row.try_get("state")?;
    if let Some(doubt) = doubt(row)? {
        return Ok(Found::InDoubt(doubt));
    }
    let answer = match state {
        // A repeated grant of a lock that took the unit over in doubt answers that doubt again.
        "acquired" => granted(row)?,
        "done" => {
            let marker: Option<Vec<u8>> = row.try_get("marker")?;
            marker
                .map(Begin::Done)
                .ok_or_else(|| sqlx::Error::Protocol("a done row without a marker".to_owned()))?
        }
        "locked" => {
            let left: Option<i64> = row.try_get("left_ms")?;
            Begin::busy(left.map(left_duration))
        }
        other => return Err(sqlx::Error::Protocol(format!("a row in state `{other}`"))),
    };
    Ok(Found::Answer(answer))
}

/// Input: a row with `fence` and `doubt_us`. Output: the doubt it describes, if its unit is in
/// doubt (`doubt_us` not null).
pub(crate) fn doubt(row: &PgRow) -> Result<Option<Doubt>, sqlx::Error> {
    let expired_us: Option<i64> = row.try_get("doubt_us")?;
    let Some(expired_us) = expired_us else {
        return Ok(None);
    };
    let fence: Option<i64> = row.try_get("fence")?;
    Ok(Some(Doubt::new(
        fence.map(i64::unsigned_abs),
        Duration::from_micros(expired_us.max(0).unsigned_abs()),
    )))
}

/// Reads the row `take_over` answered: the new lock, and the lock it replaced.
pub(crate) fn taken_over(row: &PgRow) -> Result<Begin, sqlx::Error> {
    match granted(row)? {
        taken @ Begin::Acquired {
            in_doubt: Some(_), ..
        } => Ok(taken),
        _ => Err(sqlx::Error::Protocol(
            "a takeover that answered no lapse".to_owned(),
        )),
    }
}

/// Input: a row with `fence`, `earlier_fence` and `earlier_us` (of `take_over`, or an
/// `acquired` one of `begin`). Output: the lock granted, taken over in doubt when `earlier_us`
/// (how long the lock it replaced had run out) is not null.
pub(crate) fn granted(row: &PgRow) -> Result<Begin, sqlx::Error> {
    // Sequence values are positive; a negative one cannot come from this table.
    let fence: Option<i64> = row.try_get("fence")?;
    let fence = fence.map(i64::unsigned_abs);
    let expired_us: Option<i64> = row.try_get("earlier_us")?;
    let Some(expired_us) = expired_us else {
        return Ok(Begin::acquired(fence));
    };
    let replaced: Option<i64> = row.try_get("earlier_fence")?;
    Ok(Begin::taken_over(
        fence,
        Doubt::new(
            replaced.map(i64::unsigned_abs),
            Duration::from_micros(expired_us.max(0).unsigned_abs()),
        ),
    ))
}

pub(crate) fn get<'r, T>(
    row: &'r PgRow,
    column: &str,
    operation: &'static str,
    table: &str,
) -> Result<T, StoreError>
where
    T: sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
{
    row.try_get(column)
        .map_err(|err| store_error(operation, table, err))
}

/// A TTL as the statements take it: whole milliseconds, at least 1, at most
/// [`MAX_TTL`](idempotask::MAX_TTL) (PostgreSQL's timestamps end in the year 294276, so
/// `Duration::MAX` must not reach the server as it is).
pub(crate) fn millis(ttl: Duration) -> i64 {
    i64::try_from(ttl_millis(ttl)).unwrap_or(i64::MAX)
}

/// The token's doubt memory as the statements take it: whole microseconds (0: none), at most
/// [`MAX_TTL`](idempotask::MAX_TTL).
pub(crate) fn memory_micros(token: &LockToken) -> i64 {
    i64::try_from(token.doubt_memory().min(idempotask::MAX_TTL).as_micros()).unwrap_or(i64::MAX)
}

pub(crate) fn left_duration(millis: i64) -> Duration {
    Duration::from_millis(millis.max(0).unsigned_abs())
}

/// A fencing token beyond `bigint`: the sequence never granted it, so it holds no lock here.
#[derive(Debug)]
pub(crate) struct NeverGranted;

/// The token's fencing token as the `bigint` column holds it.
pub(crate) fn fence_param(token: &LockToken) -> Result<Option<i64>, NeverGranted> {
    token
        .fencing_token()
        .map(|fence| i64::try_from(fence).map_err(|_| NeverGranted))
        .transpose()
}
