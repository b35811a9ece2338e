//! The statements of the journals of steps, on the steps table (`<table>_steps`): one row per
//! finished step of a unit, `(task, key, position, entry, expires_at)`.
//!
//! A unit's journal is its rows that have not expired, in the order of `position`. They are
//! always the positions `0..n`, and all share one expiry: a record adds the row at position
//! `n` only while exactly the rows `0..n` are live, and sets every live row's expiry to the
//! same time (the entry's `kept_for` from the statement's timestamp). An expired row counts as
//! absent: the record at its position replaces it, and `purge_expired` deletes it.
//!
//! The units table's statements of `begin`, `finish` and `release` never name this table, so a
//! unit without steps costs what it did. `forget`, the operator's `forget_exact` and
//! `inspect` do (see [`forgotten_journal`] and [`inspect`]).

use std::sync::Arc;

use sqlx::{AssertSqlSafe, SqlSafeStr, SqlStr};

use super::fragments::{LEFT_MS, doubt_us, present};

/// `$1` task, `$2` key: the unit's journal, rows `(position, entry)` in order.
pub(super) fn read_journal(s: &str) -> String {
    format!(
        "SELECT s.position, s.entry FROM {s} s
         WHERE s.task = $1 AND s.key = $2 AND s.expires_at > statement_timestamp()
         ORDER BY s.position"
    )
}

/// Appends a finished step for the holder of a lock, and renews the lock as `renew` does:
/// `$1` task, `$2` key, `$3` token, `$4` fence, `$5` lock TTL in ms, `$6` doubt memory in µs
/// (`renew`'s parameters), `$7` the entry's position, `$8` the entry, `$9` how long the
/// journal is kept, in ms. One row, `recorded`: whether the entry is in the journal at its
/// position now, written by this statement or by an earlier one that sent the same entry
/// (whose reply was lost). Unless it is, nothing is written, the lock's expiry included.
///
/// `held` is `renew`'s condition on the unit's row `u` (the caller's token and fencing token,
/// a lock live or in doubt), `bound` [`lock_wait_bound`](super::lock_wait_bound).
///
/// Under `READ COMMITTED` every part of the statement reads the snapshot taken when it
/// started, possibly before a concurrent statement committed, so nothing here is decided from
/// the snapshot alone:
/// - `holder` locks the unit's row (`FOR NO KEY UPDATE`, as the `UPDATE` of `renew` would),
///   which checks `held` again on the row as it is once locked: a stale holder whose statement
///   waited behind a takeover finds the new holder's token and writes nothing. Every other
///   writer of the unit's journal (a record, a `forget`) holds that row's lock while it writes,
///   so records of one unit run one after another.
/// - `journal` locks the live entries the snapshot shows (`FOR UPDATE`, only once `holder` has
///   answered, so that the locks are always taken unit row first), which drops those that a
///   concurrent purge deleted meanwhile: a journal that ran out while the statement waited is
///   not extended past the gap.
/// - The entry is inserted only when the locked entries are exactly the positions before it.
///   An entry the snapshot does not show (the same record sent again, racing the first) is
///   found by the insert's conflict, which is decided on the row as it is: the same bytes are
///   recorded (and their expiry set again), others are not; an expired row there is replaced.
/// - The lock is renewed, and the journal's entries get the new entry's expiry, only when the
///   entry is recorded.
pub(super) fn record_step(t: &str, s: &str, held: &str, bound: &str) -> String {
    let append = appended_for_holder(s, ["$7", "$8", "$9"]);
    format!(
        "WITH holder AS (
            SELECT 1 FROM {t} u
            WHERE u.task = $1 AND u.key = $2 AND {held} AND {bound}
            FOR NO KEY UPDATE
        ), {append}, renewed AS (
            UPDATE {t} u SET expires_at = statement_timestamp() + $5::bigint * interval '1 millisecond',
                doubt_memory = NULLIF($6::bigint, 0) * interval '1 microsecond'
            WHERE u.task = $1 AND u.key = $2 AND {held} AND (SELECT recorded FROM recorded)
            RETURNING 1
        )
        SELECT recorded FROM recorded"
    )
}

/// The part of a record after its `holder` (a row when the caller holds the unit): the
/// `journal`, `appended`, `recorded` and `kept` parts of [`record_step`], with the entry's
/// position, the entry and how long the journal is kept (ms) in the parameters `at`.
fn appended_for_holder(s: &str, at: [&str; 3]) -> String {
    let [position, entry, kept_ms] = at;
    let kept = format!("statement_timestamp() + {kept_ms}::bigint * interval '1 millisecond'");
    format!(
        "journal AS (
            SELECT s.position, s.entry FROM {s} s
            WHERE s.task = $1 AND s.key = $2 AND s.expires_at > statement_timestamp()
              AND EXISTS (SELECT 1 FROM holder)
            FOR UPDATE
        ), appended AS (
            INSERT INTO {s} AS s (task, key, position, entry, expires_at)
            SELECT $1, $2, {position}::integer, {entry}, {kept}
            WHERE EXISTS (SELECT 1 FROM holder)
              AND (SELECT count(*) = {position}::integer
                          AND coalesce(max(j.position) + 1, 0) = {position}::integer
                   FROM journal j)
            ON CONFLICT (task, key, position) DO UPDATE SET
                entry = excluded.entry,
                expires_at = excluded.expires_at
            WHERE s.expires_at <= statement_timestamp() OR s.entry = excluded.entry
            RETURNING 1
        ), recorded AS (
            SELECT EXISTS (SELECT 1 FROM appended)
                OR EXISTS (SELECT 1 FROM journal j
                           WHERE j.position = {position}::integer AND j.entry = {entry})
                AS recorded
        ), kept AS (
            UPDATE {s} s SET expires_at = {kept}
            WHERE s.task = $1 AND s.key = $2 AND s.position IN (SELECT j.position FROM journal j)
              AND (SELECT recorded FROM recorded)
            RETURNING 1
        )"
    )
}

/// The statements of the steps of a holder whose lock is a caller's open transaction
/// (transactional completion), built once per store.
#[derive(Debug, Clone)]
pub(crate) struct InTransaction {
    /// Appends a step to the journal (see [`record_in_transaction`]).
    pub(crate) record: SqlStr,
    /// `$1` a transaction's id: one row, `held`, whether it still runs (see
    /// [`transaction_holds`]).
    pub(crate) holds: SqlStr,
    /// Opens the execution's attempt (see [`open_attempt`]).
    pub(crate) open_attempt: SqlStr,
    /// `$1` task, `$2` key, `$3` the transaction's id: deletes the attempt of that transaction,
    /// an execution that ended cleanly (sent inside the transaction at its commit, on the
    /// store's own connection after its rollback).
    pub(crate) close_attempt: SqlStr,
}

impl InTransaction {
    /// The statements on the steps table `s` and the attempts table `r`.
    pub(super) fn new(s: &str, r: &str, bound: &str) -> Self {
        let sql = |text: String| AssertSqlSafe(Arc::<str>::from(text)).into_sql_str();
        Self {
            record: sql(record_in_transaction(s, bound)),
            holds: sql(transaction_holds()),
            open_attempt: sql(open_attempt(r, bound)),
            close_attempt: sql(format!(
                "DELETE FROM {r} WHERE task = $1 AND key = $2 AND xid = $3"
            )),
        }
    }
}

/// Opens the attempt of a transactional execution at its body's first step, on a connection
/// of the store's own (outside the transaction, so that it outlives the transaction's worker):
/// `$1` task, `$2` key, `$3` the transaction's id, `$4` its fencing token (null: none), `$5`
/// the doubt memory in µs. One row `(opened, fence, doubt_us)`: whether the attempt is
/// the transaction's now (only while the transaction runs and so holds the unit), and, when
/// an earlier execution died unsettled, the fencing token of the first that did and how long
/// ago it started (else nulls).
///
/// The row of the unit's earlier attempt is there only if that execution did not end cleanly:
/// a clean end deletes it (inside the transaction that commits, or after a rollback). It died
/// when its transaction is neither in progress nor committed (`pg_xact_status`; an id too old
/// to tell counts as not committed: the safe side), unless its doubt memory ran out. The new
/// attempt then carries the doubt on (the earliest death's, when that one carried one
/// already), and its expiry, so that a doubt is remembered for the doubt memory from the
/// start of the first execution that died, however often it is delivered again; until an
/// execution settles the step in doubt and ends cleanly. A committed
/// earlier attempt left no doubt: its commit recorded the unit's result.
///
/// Two executions of one unit never send it at once: each holds the unit's row in its
/// transaction while its body runs, and the next waits on that row until it ends. The same
/// statement sent again by the same transaction (its reply lost) finds its own row and
/// answers the doubt that row carries.
fn open_attempt(r: &str, bound: &str) -> String {
    let holds = holds("$3");
    let died = "a.expires_at > statement_timestamp() AND (a.doubt_since IS NOT NULL
                OR pg_xact_status(a.xid::text::xid8) IS DISTINCT FROM 'committed')";
    format!(
        "WITH earlier AS (
            SELECT a.doubt_fence, a.doubt_since FROM {r} a
            WHERE a.task = $1 AND a.key = $2 AND a.xid = $3 AND {holds}
        ), opened AS (
            INSERT INTO {r} AS a (task, key, xid, fence, started_at, expires_at)
            SELECT $1, $2, $3, $4::bigint, statement_timestamp(),
                   statement_timestamp() + $5::bigint * interval '1 microsecond'
            WHERE {holds} AND {bound}
            ON CONFLICT (task, key) DO UPDATE SET
                xid = excluded.xid,
                fence = excluded.fence,
                started_at = excluded.started_at,
                expires_at = CASE WHEN {died} THEN least(a.expires_at, excluded.expires_at)
                    ELSE excluded.expires_at END,
                doubt_fence = CASE WHEN {died} THEN
                    CASE WHEN a.doubt_since IS NULL THEN a.fence ELSE a.doubt_fence END END,
                doubt_since = CASE WHEN {died} THEN coalesce(a.doubt_since, a.started_at) END
            WHERE a.xid <> excluded.xid
            RETURNING a.doubt_fence, a.doubt_since
        ), answer AS (
            SELECT o.doubt_fence, o.doubt_since FROM opened o
            UNION ALL SELECT e.doubt_fence, e.doubt_since FROM earlier e
        )
        SELECT EXISTS (SELECT 1 FROM answer) AS opened,
               (SELECT n.doubt_fence FROM answer n) AS fence,
               (SELECT (extract(epoch FROM statement_timestamp() - n.doubt_since)
                        * 1000000)::bigint FROM answer n) AS doubt_us"
    )
}

/// [`record_step`] for a holder whose lock is a caller's open transaction (transactional
/// completion), sent on a connection of the store's own: `$1` task, `$2` key, `$3` the
/// transaction's id (`pg_current_xact_id()` as a bigint), `$4` the entry's position, `$5` the
/// entry, `$6` how long the journal is kept, in ms. One row, `recorded`, as [`record_step`]
/// answers it.
///
/// It never names the units table. The transaction holds the unit's row until it ends (an
/// `INSERT` other connections do not see, or an `UPDATE` of a row that was there, whose row
/// lock it keeps), and it is waiting for this statement: a lock of that row from here would
/// wait on it until the lock timeout, a cycle that passes through the client and that
/// PostgreSQL therefore cannot see as a deadlock, and `record_step`'s `held`, read from the
/// committed row, never finds the transaction's token. `holder` asks instead whether the
/// transaction is still running (`pg_xact_status`): while it runs, it holds the unit, and no
/// other delivery can (each waits on the row or is told it is busy). The journal is then
/// written as `record_step` writes it, by position, so that a record of a holder whose
/// transaction ended while the statement ran cannot replace an entry of the next holder's,
/// nor extend a journal past a gap. No lock is renewed: the transaction's lasts until it ends.
fn record_in_transaction(s: &str, bound: &str) -> String {
    let (holds, append) = (holds("$3"), appended_for_holder(s, ["$4", "$5", "$6"]));
    format!(
        "WITH holder AS (
            SELECT 1 WHERE {holds} AND {bound}
        ), {append}
        SELECT recorded FROM recorded"
    )
}

/// Whether the transaction `$1` (its id, as for [`record_in_transaction`]) is still
/// running, and so still holds the unit it took: the fence of a transactional holder.
fn transaction_holds() -> String {
    format!("SELECT {} AS held", holds("$1"))
}

/// The transaction whose id is `xid` has neither committed nor rolled back.
fn holds(xid: &str) -> String {
    format!("pg_xact_status({xid}::bigint::text::xid8) = 'in progress'")
}

/// The part of `forget`, `forget_exact` and `resolve_free_discarding` that deletes the unit's
/// journal once its marker is forgotten or its lock in doubt freed (the rows `dropped` or
/// `freed` of the statement): a unit forgotten or discarded on purpose runs every step again. A marker is written after the journal's last record and kept for at
/// least as long, so the journal of a unit that keeps its marker runs out first on its own;
/// nothing else deletes it.
pub(super) fn forgotten_journal(s: &str) -> String {
    format!(
        ", journal_dropped AS (
            DELETE FROM {s} s WHERE s.task = $1 AND s.key = $2
              AND (EXISTS (SELECT 1 FROM dropped) OR EXISTS (SELECT 1 FROM freed))
        )"
    )
}

/// The part of the operator's `resolve_step` that appends a step's entry (`$4`) at the end of
/// the unit's journal once its lock in doubt is freed (the rows `dropped` or `freed`), and
/// keeps the whole journal for `$5` ms. The lock in doubt is the unit row's lock that the
/// statement takes, and every record of a step takes that row's lock first (see
/// [`record_step`]): one that committed before renewed the lock, so that this statement finds
/// it live again and frees nothing, and one that comes after finds the lock gone. The end of
/// the journal read from the snapshot is therefore its end. Rows past it are expired ones,
/// which the insert replaces.
pub(super) fn resolved_step(s: &str) -> String {
    let kept = "statement_timestamp() + $5::bigint * interval '1 millisecond'";
    format!(
        ", live AS (
            SELECT s.position FROM {s} s
            WHERE s.task = $1 AND s.key = $2 AND s.expires_at > statement_timestamp()
        ), appended AS (
            INSERT INTO {s} AS s (task, key, position, entry, expires_at)
            SELECT $1, $2, (SELECT count(*) FROM live)::integer, $4, {kept}
            WHERE EXISTS (SELECT 1 FROM dropped) OR EXISTS (SELECT 1 FROM freed)
            ON CONFLICT (task, key, position) DO UPDATE SET
                entry = excluded.entry,
                expires_at = excluded.expires_at
            WHERE s.expires_at <= statement_timestamp()
        ), kept AS (
            UPDATE {s} s SET expires_at = {kept}
            WHERE s.task = $1 AND s.key = $2 AND s.position IN (SELECT l.position FROM live l)
              AND (EXISTS (SELECT 1 FROM dropped) OR EXISTS (SELECT 1 FROM freed))
        )"
    )
}

/// `$1` task, `$2` key: one row `(state, fence, marker, left_ms, doubt_us, journal)`, the
/// unit's row if one counts as there (else nulls but `journal`), and the entries of its
/// journal in order (null when the unit is done: a finished unit's journal is only waiting to
/// run out).
pub(super) fn inspect(t: &str, s: &str) -> String {
    let (doubt_us, present_u) = (doubt_us("u"), present("u"));
    format!(
        "SELECT u.state, u.fence, u.marker, {LEFT_MS} AS left_ms, {doubt_us} AS doubt_us,
                CASE WHEN u.state IS DISTINCT FROM 'done' THEN (
                    SELECT array_agg(s.entry ORDER BY s.position) FROM {s} s
                    WHERE s.task = $1 AND s.key = $2 AND s.expires_at > statement_timestamp()
                ) END AS journal
         FROM (SELECT) one LEFT JOIN {t} u ON u.task = $1 AND u.key = $2 AND {present_u}"
    )
}

/// `$1`, `$2`: the first block and the block after the last of a range of the steps table:
/// deletes the expired entries stored there. An entry that a record holds is skipped rather
/// than waited for: that record is replacing it or keeping it longer.
pub(super) fn purge(s: &str) -> String {
    format!(
        "DELETE FROM {s} WHERE ctid IN (
            SELECT s.ctid FROM {s} s
            WHERE s.ctid >= format('(%s,0)', $1::bigint)::tid
              AND s.ctid < format('(%s,0)', $2::bigint)::tid
              AND s.expires_at <= statement_timestamp()
            FOR UPDATE SKIP LOCKED
         )"
    )
}
