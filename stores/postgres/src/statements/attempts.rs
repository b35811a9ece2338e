//! The operator's statements on the attempts table (`<table>_runs`, see [`open_attempt`]): a
//! transactional execution that died in its steps leaves no lock in the units table, only its
//! attempt, and the next execution finds the step after the journal's last entry in doubt, and
//! holds the unit when that step's policy says so. These statements show such a unit as a
//! unit in doubt, to the operator's reads and listings, and end its doubt as the operator
//! resolves it, so that the tools that serve a lock in doubt serve it too.
//!
//! A unit's attempt counts as in doubt while it is remembered (its `expires_at`), its
//! transaction no longer runs, and either that transaction did not commit or it carried a
//! doubt already (`doubt_since`). Its token, for the operator, is [`TOKEN_PREFIX`] and the
//! transaction's id: a resolution applies only while the attempt is still that transaction's,
//! so one that a new delivery opened meanwhile is left alone.
//!
//! None of them names the units table: a transaction that holds the unit's row may be waiting
//! for a statement of its own on the attempts table (see the module of transactional steps),
//! and a statement that held the attempt while waiting for that row would wait on it forever.
//!
//! [`open_attempt`]: super::steps

use std::sync::Arc;

use sqlx::{AssertSqlSafe, SqlSafeStr, SqlStr};

/// How the token of a unit in doubt at a step inside a transaction begins (the transaction's
/// id follows): a lock's token begins with hexadecimal digits.
pub(crate) const TOKEN_PREFIX: &str = "attempt:";

/// The statements, built once per store.
#[derive(Debug, Clone)]
pub(crate) struct Attempts {
    /// `purge` on the attempts table: the attempts in a range of blocks whose doubt memory
    /// ran out (they count as absent already).
    pub(crate) purge: SqlStr,
    /// How many blocks the attempts table has now.
    pub(crate) blocks: SqlStr,
    /// One row `(readable, writable)`: fails when the attempts table or one of its columns is
    /// missing or cannot be read; `writable` says whether the store's user may write it.
    pub(crate) probe: SqlStr,
    /// `$1` task, `$2` key: the unit's attempt in doubt, as a row of the operator's `read`
    /// (`key, state, fence, marker, left_ms, doubt_us, token, forgotten_us`), if it has one.
    pub(crate) read: SqlStr,
    /// `$1` task, `$2` the key after which to start, `$3` how many: the task's attempts in
    /// doubt, as rows of the operator's `list`, in key order.
    pub(crate) list: SqlStr,
    /// `$1` task, `$2` key, `$3` the transaction's id shown: deletes that attempt while it is
    /// still in doubt, so that the next execution finds no doubt (it runs the step after the
    /// journal's last entry). One row `(resolved, present)`, as the operator's other
    /// resolutions answer.
    pub(crate) free: SqlStr,
    /// `free`, and the unit's journal deleted with it.
    pub(crate) free_discarding: SqlStr,
    /// `free`, with `$4` a step's entry appended to the journal and `$5` how long the journal
    /// is kept in ms: the next execution replays that step.
    pub(crate) step: SqlStr,
}

impl Attempts {
    /// The statements on the attempts table `r` and the steps table `s`; `blocks`, the
    /// statement that measures `r`.
    pub(super) fn new(r: &str, s: &str, bound: &str, blocks: String) -> Self {
        let sql = |text: String| AssertSqlSafe(Arc::<str>::from(text)).into_sql_str();
        let row = held_row();
        let doubt = in_doubt();
        Self {
            purge: sql(super::steps::purge(r)),
            blocks: sql(blocks),
            probe: sql(attempts_probe(r)),
            read: sql(format!(
                "SELECT {row} FROM {r} a WHERE a.task = $1 AND a.key = $2 AND {doubt}"
            )),
            list: sql(format!(
                "SELECT {row} FROM {r} a WHERE a.task = $1 AND a.key > $2 AND {doubt}
                 ORDER BY a.key LIMIT $3"
            )),
            free: sql(resolve(r, bound, "")),
            free_discarding: sql(resolve(r, bound, &super::steps::forgotten_journal(s))),
            step: sql(resolve(r, bound, &super::steps::resolved_step(s))),
        }
    }
}

/// Reads the attempts table's columns (failing when one is missing or the table cannot be
/// read) and whether the store's user holds each right its statements need on it: a
/// transactional call's first step must not be the first to find out.
fn attempts_probe(r: &str) -> String {
    let literal = r.replace('\'', "''");
    let rights = ["SELECT", "INSERT", "UPDATE", "DELETE"]
        .map(|right| format!("has_table_privilege('{literal}', '{right}')"))
        .join(" AND ");
    format!(
        "SELECT EXISTS (
            SELECT task, key, xid, fence, started_at, expires_at, doubt_fence, doubt_since
            FROM {r} WHERE FALSE
         ) AS readable, {rights} AS writable"
    )
}

/// The condition on attempt `a` that it is in doubt (see the module's documentation).
fn in_doubt() -> String {
    let status = "pg_xact_status(a.xid::text::xid8)";
    format!(
        "a.expires_at > statement_timestamp()
         AND {status} IS DISTINCT FROM 'in progress'
         AND (a.doubt_since IS NOT NULL OR {status} IS DISTINCT FROM 'committed')"
    )
}

/// The columns of a row of the operator's reads for attempt `a`: a lock in doubt since the
/// first execution that died unsettled started (its fencing token), forgotten when the
/// attempt's memory ends.
fn held_row() -> String {
    let us = |interval: &str| format!("(extract(epoch FROM {interval}) * 1000000)::bigint");
    format!(
        "a.key, 'locked'::text AS state,
         CASE WHEN a.doubt_since IS NULL THEN a.fence ELSE a.doubt_fence END AS fence,
         NULL::bytea AS marker, NULL::bigint AS left_ms,
         {} AS doubt_us, '{TOKEN_PREFIX}' || a.xid::text AS token, {} AS forgotten_us",
        us("statement_timestamp() - coalesce(a.doubt_since, a.started_at)"),
        us("a.expires_at - statement_timestamp()"),
    )
}

/// A resolution of the attempt in doubt of `$1`, `$2` whose transaction is `$3`: it deletes
/// the attempt (the rows `freed`), and `also` (a part that acts on `dropped` or `freed`) does
/// the rest, in the same statement.
fn resolve(r: &str, bound: &str, also: &str) -> String {
    let doubt = in_doubt();
    format!(
        "WITH dropped AS (SELECT 1 WHERE FALSE), freed AS (
            DELETE FROM {r} a
            WHERE a.task = $1 AND a.key = $2 AND a.xid = $3 AND {doubt} AND {bound}
            RETURNING a.task
        ){also}
        SELECT (SELECT count(*) FROM freed) AS resolved,
               EXISTS (SELECT 1 FROM {r} a WHERE a.task = $1 AND a.key = $2
                       AND a.expires_at > statement_timestamp()) AS present"
    )
}
