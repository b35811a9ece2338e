//! The statements of `begin_batch` and `finish_batch`: the common path of many units in one
//! statement, so in one round trip and one commit (one WAL flush for the batch, where one
//! statement per unit waits for a flush each).
//!
//! Each takes the units as parallel arrays, `unnest`ed `WITH ORDINALITY`, and answers rows
//! named by `n`, the unit's position in the arrays (from 1). A unit a batch statement does not
//! answer (a row it cannot take in one statement: expired, the caller's own, in doubt to take
//! over, or written by a concurrent transaction after the statement's snapshot) is asked again
//! alone, with the single statements.

use super::fragments::{LEFT_MS, doubt_us, present};

/// [`super::lock_wait_bound`] with the bound a parameter, `$param` (text, such as `'80ms'`):
/// `lock_timeout` bounds each wait, and a batch statement may wait on several rows one after
/// another, so the caller gives each wait its share of the single statement's bound, and the
/// whole statement ends in the server within that bound.
fn wait_bound(param: u8) -> String {
    format!("set_config('lock_timeout', ${param}::text, true) IS NOT NULL")
}

/// `begin_fresh` for many units: `$1` tasks, `$2` keys, `$3` tokens, `$4` the tokens' doubt
/// memories in µs (0: none), `$5` the lock TTL in ms, `$6` the bound of each row-lock wait
/// (see [`wait_bound`]). Its rows are `begin_fresh`'s, with `n` first, at most one per unit.
/// `fence` is as in [`super::begin_fresh`].
///
/// The rows are inserted in key order, so that two batches waiting on each other's inserts
/// of the same units wait in the same order (no deadlock between batches of one order).
pub(super) fn begin_fresh(t: &str, seq: Option<&str>) -> String {
    let bound = wait_bound(6);
    let fence = seq.map_or_else(
        || "NULL::bigint".to_owned(),
        |seq| format!("nextval('{seq}')"),
    );
    let doubt_us = doubt_us("u");
    format!(
        "WITH input AS (
            SELECT * FROM unnest($1::text[], $2::bytea[], $3::text[], $4::bigint[])
                WITH ORDINALITY AS i(task, key, token, memory_us, n)
        ), taken AS (
            INSERT INTO {t} AS u (task, key, state, token, fence, marker, expires_at, doubt_memory)
            SELECT i.task, i.key, 'locked', i.token, {fence}, NULL,
                   statement_timestamp() + $5::bigint * interval '1 millisecond',
                   NULLIF(i.memory_us, 0) * interval '1 microsecond'
            FROM input i
            WHERE NOT EXISTS (SELECT 1 FROM {t} e WHERE e.task = i.task AND e.key = i.key)
              AND {bound}
            ORDER BY i.task, i.key
            ON CONFLICT (task, key) DO NOTHING
            RETURNING u.task, u.key, u.token, u.fence
        )
        SELECT i.n, 'acquired' AS state, k.fence, NULL::bytea AS marker,
               NULL::bigint AS left_ms, NULL::boolean AS mine, NULL::bigint AS doubt_us
        FROM input i JOIN taken k ON k.task = i.task AND k.key = i.key AND k.token = i.token
        UNION ALL
        SELECT i.n, u.state, u.fence, u.marker, {LEFT_MS}, u.token = i.token, {doubt_us}
        FROM input i JOIN {t} u ON u.task = i.task AND u.key = i.key
        WHERE NOT EXISTS (SELECT 1 FROM taken k WHERE k.task = i.task AND k.key = i.key)"
    )
}

/// `finish_held` for many units: `$1` tasks, `$2` keys, `$3` tokens, `$4` fencing tokens
/// (null for none), `$5` markers, `$6` the result TTL in ms, `$7` the bound of each row-lock
/// wait (see [`wait_bound`]). One row `n` per unit whose caller's lock it replaced with the
/// marker; the others are for the single `finish`.
pub(super) fn finish_held(t: &str) -> String {
    let (present_u, bound) = (present("u"), wait_bound(7));
    format!(
        "UPDATE {t} u SET state = 'done', token = NULL, marker = i.marker, doubt_memory = NULL,
            doubt_earlier_fence = NULL, doubt_expired_for = NULL,
            expires_at = statement_timestamp() + $6::bigint * interval '1 millisecond'
         FROM unnest($1::text[], $2::bytea[], $3::text[], $4::bigint[], $5::bytea[])
             WITH ORDINALITY AS i(task, key, token, fence, marker, n)
         WHERE u.task = i.task AND u.key = i.key AND u.state = 'locked' AND u.token = i.token
           AND u.fence IS NOT DISTINCT FROM i.fence AND {present_u} AND {bound}
         RETURNING i.n"
    )
}
