//! The SQL of the PostgreSQL store: the table, and one statement per store operation.
//!
//! Every operation is a single statement in the common case (two for a `finish` whose plain
//! `UPDATE` found no lock of the caller's, for a `begin` that finds an expired row or its own
//! lock, and for a `begin` that takes over a unit in doubt), each atomic on its own. Each
//! statement that can wait on a row lock bounds that wait itself (see [`lock_wait_bound`]).
//! Times are the server's `statement_timestamp()`: one clock for every worker, and inside a
//! long transaction it is still the time of the statement, not of `BEGIN`.
//!
//! # Units in doubt
//! A lock row keeps its holder's doubt memory (`doubt_memory`, an interval; `NULL` for none,
//! as in rows written before the column existed). Once `expires_at` has passed, the lock is
//! no longer held, but until `expires_at + doubt_memory` it is remembered: the unit is in
//! doubt ([`in_doubt`]). Such a row still counts as there: its holder may finish, renew or
//! release it, `inspect`, `read` and `list` show it, `purge` leaves it, and an operator's
//! `resolve_free` or `resolve_record` settles it. A `begin` by
//! another token learns of it from `begin_fresh` (or `begin`, after a race), and then either
//! answers `InDoubt` having written nothing, or takes it over with `take_over`: one more
//! statement, which replaces exactly the row it locks and answers that row's fencing token
//! and expiry, and keeps them on the new lock (`doubt_earlier_fence`, `doubt_expired_for`;
//! both `NULL` on a lock that took nothing over in doubt). That lock carries the doubt it
//! found: its holder's repeated `begin` (a retry whose first reply was lost) answers it again,
//! and its holder's release makes it run out now instead of deleting it, so that the unit
//! stays in doubt, for its own doubt memory, until a result is recorded. Other released units
//! and finished units keep no memory (`doubt_memory` and the doubt taken over are cleared).

use std::sync::Arc;
use std::time::Duration;

use sqlx::{AssertSqlSafe, SqlSafeStr, SqlStr};

use crate::table::TableName;

mod attempts;
mod batch;
pub(crate) use attempts::TOKEN_PREFIX;
mod fragments;
mod steps;

use fragments::{LEFT_MS, LOCK_EXPIRY, MEMORY, doubt_us, forgotten_us, in_doubt, micros, present};

/// One statement per store operation, with the table's name in place, built once per store.
///
/// The statements of `begin` take the same first five parameters: `$1` task, `$2` key, `$3`
/// token, `$4` lock TTL in ms, `$5` the token's doubt memory in µs (0: none); those that may
/// take a fencing token also `$6`, whether the task uses fencing. Their answer rows have the
/// columns `(state, fence, marker, left_ms, doubt_us)`: state `acquired` means the lock is
/// the caller's, with `fence`; otherwise they describe the row that is there, live when
/// `left_ms > 0`, and in doubt when `doubt_us` (how long ago its lock ran out, in µs) is not
/// null, with `fence` the fencing token that lock was granted with.
#[derive(Debug, Clone)]
pub(super) struct Statements {
    /// The common cases of `begin` (no row yet, or another's live lock or marker, or a unit
    /// in doubt), one row with the columns above and `mine`, whether the row's token is the
    /// caller's. For an expired row or the caller's own lock, run [`Self::begin`]; for a unit
    /// in doubt, [`Self::take_over`] (or nothing, for a token that leaves it in doubt). No
    /// row: a concurrent writer committed after this statement's snapshot; ask again.
    pub(super) begin_fresh: SqlStr,
    /// `begin_fresh` for a task with fencing: the same answers.
    pub(super) begin_fresh_fenced: SqlStr,
    /// `begin_fresh` for many units at once (see [`batch::begin_fresh`]).
    pub(super) begin_fresh_batch: SqlStr,
    /// `begin_fresh_batch` for a task with fencing.
    pub(super) begin_fresh_fenced_batch: SqlStr,
    /// `begin_fresh` inside a caller's transaction: the same, except that it waits on another
    /// transaction's row for as long as that transaction lasts, and leaves the transaction's
    /// `lock_timeout` as it was.
    pub(super) begin_fresh_in_transaction: SqlStr,
    /// `begin_fresh_fenced` inside a caller's transaction, as `begin_fresh_in_transaction` is.
    pub(super) begin_fresh_fenced_in_transaction: SqlStr,
    /// Takes an absent or expired unit, or repeats the holder's grant: one row, `acquired`,
    /// or the live row that is there, or a unit in doubt (then take it over with
    /// [`Self::take_over`]), which it never writes. Its rows have two more columns,
    /// `(earlier_fence, earlier_us)`: on a repeated grant of a lock that took the unit over in
    /// doubt, the doubt it took over (as [`Self::take_over`] answered it); otherwise null. No
    /// row: a concurrent writer committed after this statement's snapshot (or the caller's
    /// own lock row lapsed in between); ask again.
    pub(super) begin: SqlStr,
    /// `begin` inside a caller's transaction, as `begin_fresh_in_transaction` is.
    pub(super) begin_in_transaction: SqlStr,
    /// Takes over a unit in doubt: at most one row `(fence, earlier_fence, earlier_us)`, the
    /// new fencing token and the fencing token and lapse of the lock it replaced, which the
    /// new lock keeps. No row: the unit is no longer in doubt (another delivery took it over,
    /// or its holder came back); ask again.
    pub(super) take_over: SqlStr,
    /// `take_over` inside a caller's transaction, as `begin_fresh_in_transaction` is.
    pub(super) take_over_in_transaction: SqlStr,
    /// `$1` task, `$2` key, `$3` token, `$4` fence, `$5` marker, `$6` result TTL in ms: the
    /// marker over the caller's lock, as a plain `UPDATE` (the common case).
    pub(super) finish_held: SqlStr,
    /// `finish_held` for many units at once (see [`batch::finish_held`]).
    pub(super) finish_held_batch: SqlStr,
    /// The same parameters, for when `finish_held` found no lock of the caller's: one row
    /// `(written, held, repeated)`.
    pub(super) finish: SqlStr,
    /// `$1` task, `$2` key, `$3` token, `$4` fence, `$5` marker, `$6` result TTL in ms: the
    /// marker of a transactional execution, over its own uncommitted lock.
    pub(super) complete_in_transaction: SqlStr,
    /// `$1` task, `$2` key, `$3` token: one row, how many locks were released. A lock that
    /// took the unit over in doubt runs out instead (see [`release`]).
    pub(super) release: SqlStr,
    /// `$1` task, `$2` key, `$3` token, `$4` fence, `$5` lock TTL in ms, `$6` doubt memory
    /// in µs.
    pub(super) renew: SqlStr,
    /// `$1` task, `$2` key: one row `(state, fence, marker, left_ms, doubt_us, journal)`, the
    /// first five null when no row counts as there (see [`steps::inspect`]).
    pub(super) inspect: SqlStr,
    /// `$1` task, `$2` key: one row, how many markers were forgotten. A forgotten marker takes
    /// the unit's journal with it.
    pub(super) forget: SqlStr,
    /// `$1` task, `$2` key: at most one row that is there `(key, state, fence, marker,
    /// left_ms, doubt_us, token, forgotten_us)`.
    pub(super) read: SqlStr,
    /// `$1` task, `$2` the key a page starts after (empty for the first page: no caller key is
    /// empty), `$3` how many: the task's rows that are there, as `read` answers them, in key
    /// order.
    pub(super) list: SqlStr,
    /// `$1` task, `$2` key, `$3` the marker an operator was shown: one row `(forgotten,
    /// present)`, how many markers were forgotten and whether a row was there before. A
    /// forgotten marker takes the unit's journal with it.
    pub(super) forget_exact: SqlStr,
    /// `$1` task, `$2` key, `$3` the token of the lock in doubt an operator was shown: frees
    /// the unit while its row is still that lock, run out and remembered; one row
    /// `(resolved, present)`, as `forget_exact` answers.
    pub(super) resolve_free: SqlStr,
    /// `resolve_free` that also deletes the unit's journal, as `forget_exact` does.
    pub(super) resolve_free_discarding: SqlStr,
    /// The same, with `$4` the marker and `$5` the result TTL in ms: the marker in place of
    /// that lock.
    pub(super) resolve_record: SqlStr,
    /// `resolve_free`, with `$4` a step's journal entry and `$5` how long the journal is kept
    /// in ms: the entry appended to the journal as the lock is freed (see
    /// [`steps::resolved_step`]).
    pub(super) resolve_step: SqlStr,
    /// `$1`, `$2`: the first block and the block after the last of a range: deletes the rows
    /// stored there that are expired and not in doubt.
    pub(super) purge: SqlStr,
    /// How many blocks the table has now.
    pub(super) blocks: SqlStr,
    /// `$1` task, `$2` key: the unit's journal of steps (see [`steps::read_journal`]).
    pub(super) read_journal: SqlStr,
    /// Appends a step to the journal for the lock's holder (see [`steps::record_step`]).
    pub(super) record_step: SqlStr,
    /// The statements of the steps of a holder whose lock is a caller's open transaction
    /// (see [`steps::InTransaction`]).
    pub(super) in_transaction: steps::InTransaction,
    /// The statements on the attempts table (see [`attempts::Attempts`]).
    pub(super) attempts: attempts::Attempts,
    /// `purge` on the steps table: its expired entries in a range of blocks.
    pub(super) purge_steps: SqlStr,
    /// How many blocks the steps table has now.
    pub(super) steps_blocks: SqlStr,
    /// Reads the fencing sequence, and names the columns of this version that `inspect` does
    /// not: fails when the migration has not created them.
    pub(super) schema_probe: SqlStr,
}

/// The condition that bounds a statement's row-lock waits by `lock_timeout` (at least 1 ms, at
/// most PostgreSQL's limit of `i32::MAX` ms), for the `WHERE` of the rows it writes.
///
/// It sets `lock_timeout` for the statement's own implicit transaction: the next statement on
/// the connection has its old setting back. It is one of the `AND`ed conditions on the rows
/// the statement writes, and a row lock is only ever waited for on a row that has passed all
/// of them, so the setting is in place before any wait: in an `INSERT … SELECT` without
/// `FROM` it is a one-time filter, evaluated before the source yields its row; in an `UPDATE`
/// or `DELETE` (or a `SELECT … FOR UPDATE`) it is a filter of the scan, evaluated before the
/// row reaches the update or the lock. Table locks are taken before any expression runs and
/// are not covered; only DDL and maintenance that locks the whole table (`VACUUM FULL`,
/// `CLUSTER`, `ALTER TABLE`) takes them against these statements.
pub(super) fn lock_wait_bound(lock_timeout: Duration) -> String {
    // The response timeout ends the wait on the client only: a statement the client gave up
    // on goes on waiting behind a transaction's row and, once that transaction rolls back,
    // takes the lock for a token nobody holds (the caller's release ran before it and found
    // nothing), so the unit is `Contended` for a whole lock TTL. The statement therefore bounds
    // its own wait, whatever the pool's connections say. `set_config` inside the statement
    // costs no round trip and next to no server time (pgbench, 20,000 statements each: a
    // duplicate `begin` 5.6 µs either way, a fresh one 51 µs against 46 µs, a hundredth of its
    // 0.4-0.5 ms on loopback), where `BEGIN; SET LOCAL lock_timeout …; COMMIT` around each
    // statement adds three round trips (a duplicate `begin` went from 0.11-0.21 ms to
    // 0.55 ms), and a setting made once per connection (a startup option or `SET`) is refused
    // or lost behind a transaction-pooling proxy such as PgBouncer.
    let millis = lock_timeout
        .as_millis()
        .clamp(1, u128::from(i32::MAX.unsigned_abs()));
    format!("set_config('lock_timeout', '{millis}ms', true) IS NOT NULL")
}

impl Statements {
    /// The statements on table `name`, their row-lock waits bounded by `lock_timeout`.
    pub(super) fn new(name: &TableName, lock_timeout: Duration) -> Self {
        let t = name.table();
        let seq = name.sequence();
        let steps_table = name.steps();
        let bound = lock_wait_bound(lock_timeout);
        let present_u = present("u");
        // Shared, so that handing a statement to sqlx for each call copies no text.
        let sql = |text: String| AssertSqlSafe(Arc::<str>::from(text)).into_sql_str();
        // A fenced forget or resolution keeps the row for its `fence`, so that the next grant
        // goes on counting even for a task without fencing; other rows are deleted. The kept
        // row expires at the epoch, not now, so that no clock step can make it live again, and
        // remembers nothing.
        // `also`: more of the statement, after the row's own parts.
        let free_or_drop = |condition: &str, ours: &str, extra: &str, also: &str| {
            sql(format!(
                "WITH dropped AS (
                    DELETE FROM {t} u WHERE u.task = $1 AND u.key = $2 AND {condition} AND u.fence IS NULL
                      AND {bound}
                    RETURNING 1
                ), freed AS (
                    UPDATE {t} u SET token = NULL, marker = NULL, expires_at = 'epoch',
                        doubt_memory = NULL, doubt_earlier_fence = NULL, doubt_expired_for = NULL
                    WHERE u.task = $1 AND u.key = $2 AND {condition} AND u.fence IS NOT NULL
                      AND {bound}
                    RETURNING 1
                ){also}
                SELECT (SELECT count(*) FROM dropped) + (SELECT count(*) FROM freed) AS {ours}{extra}"
            ))
        };
        // The caller's lock, live or in doubt: nobody else ran, so it is still the holder's.
        let held = format!(
            "u.state = 'locked' AND u.token = $3 AND u.fence IS NOT DISTINCT FROM $4 \
             AND {present_u}"
        );
        let [read, list] = reads(&t);
        let forgotten_journal = steps::forgotten_journal(&steps_table);
        // For the operator's compare-and-set statements: whether a row was there, read from
        // the snapshot from before the statement's own changes (a data-modifying `WITH` is not
        // visible to the rest of its statement), so that with nothing written it tells a row
        // that changed from one that is gone.
        let present_before = format!(
            ", EXISTS (SELECT 1 FROM {t} u WHERE u.task = $1 AND u.key = $2
                       AND {present_u}) AS present"
        );
        let shown_in_doubt = format!("u.state = 'locked' AND u.token = $3 AND {}", in_doubt("u"));
        let resolve_free =
            |also: &str| free_or_drop(&shown_in_doubt, "resolved", &present_before, also);
        Self {
            begin_fresh: sql(begin_fresh(&t, None, &bound, "")),
            begin_fresh_fenced: sql(begin_fresh(&t, Some(&seq), &bound, "")),
            begin_fresh_batch: sql(batch::begin_fresh(&t, None)),
            begin_fresh_fenced_batch: sql(batch::begin_fresh(&t, Some(&seq))),
            begin_fresh_in_transaction: sql(begin_fresh(&t, None, "TRUE", XID)),
            begin_fresh_fenced_in_transaction: sql(begin_fresh(&t, Some(&seq), "TRUE", XID)),
            begin: sql(begin(&t, &seq, &format!("{bound} AND"), "")),
            begin_in_transaction: sql(begin(&t, &seq, "", XID)),
            take_over: sql(take_over(&t, &seq, &bound, "")),
            take_over_in_transaction: sql(take_over(&t, &seq, "TRUE", XID)),
            finish: sql(finish(&t, &bound)),
            finish_held_batch: sql(batch::finish_held(&t)),
            finish_held: sql(format!(
                "UPDATE {t} u SET state = 'done', token = NULL, marker = $5, doubt_memory = NULL,
                    doubt_earlier_fence = NULL, doubt_expired_for = NULL,
                    expires_at = statement_timestamp() + $6::bigint * interval '1 millisecond'
                 WHERE u.task = $1 AND u.key = $2 AND {held} AND {bound}"
            )),
            // The transaction's own row cannot have been taken, so its expiry does not matter;
            // nothing else can hold it, so there is no wait to bound.
            complete_in_transaction: sql(format!(
                "UPDATE {t} u SET state = 'done', token = NULL, marker = $5, doubt_memory = NULL,
                    doubt_earlier_fence = NULL, doubt_expired_for = NULL,
                    expires_at = statement_timestamp() + $6::bigint * interval '1 millisecond'
                 WHERE u.task = $1 AND u.key = $2 AND u.state = 'locked' AND u.token = $3
                   AND u.fence IS NOT DISTINCT FROM $4"
            )),
            release: sql(release(&t, &bound)),
            renew: sql(format!(
                "UPDATE {t} u SET expires_at = statement_timestamp() + $5::bigint * interval '1 millisecond',
                    doubt_memory = NULLIF($6::bigint, 0) * interval '1 microsecond'
                 WHERE u.task = $1 AND u.key = $2 AND {held} AND {bound}"
            )),
            inspect: sql(steps::inspect(&t, &steps_table)),
            forget: free_or_drop(
                "u.state = 'done' AND u.expires_at > statement_timestamp()",
                "forgotten",
                "",
                &forgotten_journal,
            ),
            read: sql(read),
            list: sql(list),
            forget_exact: free_or_drop(
                "u.state = 'done' AND u.marker = $3 AND u.expires_at > statement_timestamp()",
                "forgotten",
                &present_before,
                &forgotten_journal,
            ),
            // The lock shown is the row's token while the row is a lock in doubt: a holder that
            // came back and renewed it has a live lock, and a delivery that took it over has a
            // token of its own. Freed as a release frees it: a fenced row keeps its counter.
            resolve_free: resolve_free(""),
            resolve_free_discarding: resolve_free(&forgotten_journal),
            resolve_record: sql(resolve_record(&t, &shown_in_doubt, &bound, &present_before)),
            resolve_step: resolve_free(&steps::resolved_step(&steps_table)),
            purge: sql(purge(&t)),
            schema_probe: sql(format!(
                "SELECT last_value, EXISTS (
                    SELECT doubt_earlier_fence, doubt_expired_for FROM {t} WHERE FALSE
                 ) FROM {seq}"
            )),
            blocks: sql(blocks(&t)),
            read_journal: sql(steps::read_journal(&steps_table)),
            record_step: sql(steps::record_step(&t, &steps_table, &held, &bound)),
            in_transaction: steps::InTransaction::new(&steps_table, &name.runs(), &bound),
            attempts: attempts::Attempts::new(&name.runs(), &steps_table, &bound, blocks(&name.runs())),
            purge_steps: sql(steps::purge(&steps_table)),
            steps_blocks: sql(blocks(&steps_table)),
        }
    }
}

/// Deletes the rows of a range of blocks that are expired and not in doubt.
///
/// A TID range scan (PostgreSQL 14+) reads only the blocks of the range; rows that another
/// transaction holds (taking an expired unit over, say) are skipped rather than waited for, so
/// the purge never queues behind a long transaction. A unit in doubt is kept until its memory
/// ends.
fn purge(t: &str) -> String {
    let present_u = present("u");
    format!(
        "DELETE FROM {t} WHERE ctid IN (
            SELECT u.ctid FROM {t} u
            WHERE u.ctid >= format('(%s,0)', $1::bigint)::tid
              AND u.ctid < format('(%s,0)', $2::bigint)::tid
              AND NOT {present_u}
            FOR UPDATE SKIP LOCKED
         )"
    )
}

/// How many blocks table `t` has now.
fn blocks(t: &str) -> String {
    format!(
        "SELECT (pg_relation_size('{}') / current_setting('block_size')::bigint)::bigint",
        t.replace('\'', "''")
    )
}

/// The statements that read rows for the operator's `read` and `list`: the rows that count, a
/// unit in doubt included, with what resolving a unit in doubt needs: the token of its lock,
/// and how long it is still remembered. (`inspect` reads the same row and the journal.)
fn reads(t: &str) -> [String; 2] {
    let row = format!(
        "u.state, u.fence, u.marker, {LEFT_MS} AS left_ms, {} AS doubt_us",
        doubt_us("u")
    );
    let operator_row = format!(
        "u.key, {row}, u.token, {} AS forgotten_us",
        forgotten_us("u")
    );
    let present_u = present("u");
    [
        format!(
            "SELECT {operator_row} FROM {t} u WHERE u.task = $1 AND u.key = $2 AND {present_u}"
        ),
        // The primary key's order: one index range scan per page, from where the last page
        // ended (a plain `key > $2`, so that a generic plan keeps the range too).
        format!(
            "SELECT {operator_row} FROM {t} u
             WHERE u.task = $1 AND u.key > $2 AND {present_u}
             ORDER BY u.key LIMIT $3"
        ),
    ]
}

/// The column the statements of `begin` inside a caller's transaction add to their answers:
/// `xid`, the transaction's id once it has one (always, once the statement wrote the unit's
/// row), for the records of the body's steps, which check on a connection of their own that
/// this transaction still runs. Read by the same statement, it costs no round trip; and only
/// if assigned, so that an answer that wrote nothing does not give the transaction an id.
const XID: &str = ", pg_current_xact_id_if_assigned()::text::bigint AS xid";

/// Takes a unit that has no row, or answers the row that is there; [`begin`] and
/// [`take_over`] handle the rest.
///
/// This is the common path of every task, so it is kept to the least work PostgreSQL can do
/// for it, each execution setting up as few plan nodes and expressions as it can: an `INSERT
/// … ON CONFLICT DO NOTHING` (no conflict action to set up) when no row is there, and that
/// row, read from the statement's snapshot, when nothing was taken. A row that is there
/// writes nothing, locks nothing, takes no sequence value and commits without a WAL flush.
/// The insert waits on a row that another transaction is inserting (a transactional
/// delivery), which `bound` ([`lock_wait_bound`], or `TRUE` inside a caller's transaction)
/// limits, being evaluated before it.
///
/// With fencing (`seq`, the sequence) the fencing token is taken in the insert; without, no
/// sequence is named at all. `xid` is empty or [`XID`].
fn begin_fresh(t: &str, seq: Option<&str>, bound: &str, xid: &str) -> String {
    let fence = seq.map_or_else(
        || "NULL::bigint".to_owned(),
        |seq| format!("nextval('{seq}')"),
    );
    let doubt_us = doubt_us("u");
    format!(
        "WITH taken AS (
            INSERT INTO {t} AS u (task, key, state, token, fence, marker, expires_at, doubt_memory)
            SELECT $1, $2, 'locked', $3, {fence}, NULL, {LOCK_EXPIRY}, {MEMORY}
            WHERE NOT EXISTS (SELECT 1 FROM {t} e WHERE e.task = $1 AND e.key = $2)
              AND {bound}
            ON CONFLICT (task, key) DO NOTHING
            RETURNING u.fence
        )
        SELECT 'acquired' AS state, fence, NULL::bytea AS marker, NULL::bigint AS left_ms,
               NULL::boolean AS mine, NULL::bigint AS doubt_us{xid}
        FROM taken
        UNION ALL
        SELECT u.state, u.fence, u.marker, {LEFT_MS}, u.token = $3, {doubt_us}{xid}
        FROM {t} u
        WHERE u.task = $1 AND u.key = $2 AND NOT EXISTS (SELECT 1 FROM taken)"
    )
}

/// Takes an absent or expired unit, or repeats the holder's grant; otherwise answers what is
/// there, a unit in doubt included (never taken here: [`take_over`] does that, and answers
/// what it replaced).
///
/// A repeated grant keeps the lock's fencing token and the doubt it took over, and answers
/// them both, as the grant did; any other grant clears that doubt.
///
/// The unit's row is read first, and the `INSERT` is tried only when nothing that is there
/// (other than the caller's own lock) is: a duplicate or a busy answer then writes nothing,
/// locks nothing and commits without a WAL flush, as a plain `SELECT` would. (An `ON CONFLICT
/// DO UPDATE` that skips the row still locks it, which costs a transaction id and a flush.)
/// The conflict's condition is checked again on the row as it is when locked, so a row that
/// came into doubt since the read is left alone too. `bound` is empty or [`lock_wait_bound`]
/// followed by `AND`; `xid` is empty or [`XID`].
fn begin(t: &str, seq: &str, bound: &str, xid: &str) -> String {
    let (doubt_us, present_u) = (doubt_us("u"), present("u"));
    let mine = "(u.state = 'locked' AND u.token = excluded.token)";
    let earlier_us = micros("doubt_expired_for");
    format!(
        "WITH existing AS (
            SELECT u.state, u.fence, u.marker, u.expires_at > statement_timestamp() AS live,
                   {LEFT_MS} AS left_ms, COALESCE(u.token = $3, FALSE) AS mine,
                   {doubt_us} AS doubt_us
            FROM {t} u WHERE u.task = $1 AND u.key = $2
        ), taken AS (
            INSERT INTO {t} AS u (task, key, state, token, fence, marker, expires_at, doubt_memory)
            SELECT $1, $2, 'locked', $3, CASE WHEN $6 THEN nextval('{seq}') END, NULL,
                   {LOCK_EXPIRY}, {MEMORY}
            WHERE {bound} NOT EXISTS (
                SELECT 1 FROM existing e
                WHERE (e.live OR e.doubt_us IS NOT NULL) AND NOT (e.state = 'locked' AND e.mine)
            )
            ON CONFLICT (task, key) DO UPDATE SET
                state = 'locked',
                token = excluded.token,
                marker = NULL,
                expires_at = excluded.expires_at,
                doubt_memory = excluded.doubt_memory,
                fence = CASE
                    WHEN {mine} THEN u.fence
                    WHEN $6 OR u.fence IS NOT NULL THEN nextval('{seq}')
                END,
                doubt_earlier_fence = CASE WHEN {mine} THEN u.doubt_earlier_fence END,
                doubt_expired_for = CASE WHEN {mine} THEN u.doubt_expired_for END
            WHERE NOT {present_u} OR {mine}
            RETURNING u.fence, u.doubt_earlier_fence, u.doubt_expired_for
        )
        SELECT 'acquired' AS state, fence, NULL::bytea AS marker, NULL::bigint AS left_ms,
               NULL::bigint AS doubt_us, doubt_earlier_fence AS earlier_fence,
               {earlier_us} AS earlier_us{xid}
        FROM taken
        UNION ALL
        SELECT e.state, e.fence, e.marker, e.left_ms, e.doubt_us, NULL, NULL{xid}
        FROM existing e
        WHERE (e.live OR (e.doubt_us IS NOT NULL AND NOT e.mine))
          AND NOT EXISTS (SELECT 1 FROM taken)"
    )
}

/// Takes over a unit in doubt from another holder, answering the lock it replaced: its
/// fencing token and how long ago it ran out, which the new lock keeps (a repeated `begin`
/// answers them again, and a release leaves the unit in doubt).
///
/// The row is locked first (`FOR UPDATE`, in a subquery of the `FROM`, which is how an
/// `UPDATE` answers a row's values from before it), and its condition checked again on the
/// row as it is once locked: of deliveries racing for the unit, the first takes it over and
/// the others, having waited for it, find a live lock and take nothing. The fencing token is
/// new when the task uses fencing or the unit already had one. `bound` is [`lock_wait_bound`],
/// or `TRUE` inside a caller's transaction; `xid` is empty or [`XID`].
fn take_over(t: &str, seq: &str, bound: &str, xid: &str) -> String {
    let in_doubt = in_doubt("o");
    let earlier_us = micros("u.doubt_expired_for");
    format!(
        "UPDATE {t} u SET
            token = $3,
            expires_at = {LOCK_EXPIRY},
            doubt_memory = {MEMORY},
            fence = CASE WHEN $6 OR u.fence IS NOT NULL THEN nextval('{seq}') END,
            doubt_earlier_fence = old.fence,
            doubt_expired_for = statement_timestamp() - old.expires_at
        FROM (
            SELECT o.fence, o.expires_at FROM {t} o
            WHERE o.task = $1 AND o.key = $2 AND o.token <> $3 AND {in_doubt} AND {bound}
            FOR UPDATE
        ) old
        WHERE u.task = $1 AND u.key = $2
        RETURNING u.fence, u.doubt_earlier_fence AS earlier_fence, {earlier_us} AS earlier_us{xid}"
    )
}

/// Releases the lock of the holder of token `$3`, live or in doubt: whatever fencing token it
/// was granted with (a caller whose grant's reply was lost never learned it). One row, how
/// many locks were released.
///
/// A plain lock leaves no doubt: it is deleted, or, when fenced, kept for its `fence` alone as
/// a forget keeps it (expiring at the epoch, remembering nothing). A lock that took the unit
/// over in doubt (`doubt_expired_for` set) carries that doubt, which only a result recorded
/// ends: it runs out now (or stays as it ran out, if it had), keeping its token, fencing
/// token and doubt memory, so that the unit is in doubt, with this holder's fencing token as
/// the earlier one, until the next delivery takes it over. Both cases are the same two
/// statements on the primary key as before, so a plain release costs no more. `bound` is
/// [`lock_wait_bound`].
fn release(t: &str, bound: &str) -> String {
    let present_u = present("u");
    let holder = format!(
        "u.task = $1 AND u.key = $2 AND u.state = 'locked' AND u.token = $3 AND {present_u}"
    );
    let carries = "u.doubt_expired_for IS NOT NULL";
    format!(
        "WITH dropped AS (
            DELETE FROM {t} u
            WHERE {holder} AND u.fence IS NULL AND u.doubt_expired_for IS NULL AND {bound}
            RETURNING 1
        ), kept AS (
            UPDATE {t} u SET
                token = CASE WHEN {carries} THEN u.token END,
                expires_at = CASE WHEN {carries}
                    THEN least(u.expires_at, statement_timestamp()) ELSE 'epoch' END,
                doubt_memory = CASE WHEN {carries} THEN u.doubt_memory END
            WHERE {holder} AND (u.fence IS NOT NULL OR {carries}) AND {bound}
            RETURNING 1
        )
        SELECT (SELECT count(*) FROM dropped) + (SELECT count(*) FROM kept) AS released"
    )
}

/// Stores the marker `$4` for `$5` ms in place of the lock in doubt an operator was shown
/// (`shown`, a condition on row `u`), as a finish of that lock would have: the row keeps its
/// fencing counter. Answers one row `(resolved, present)`, the second column being `present`
/// (`, EXISTS (…) AS present`). `bound` is [`lock_wait_bound`].
fn resolve_record(t: &str, shown: &str, bound: &str, present: &str) -> String {
    format!(
        "WITH recorded AS (
            UPDATE {t} u SET state = 'done', token = NULL, marker = $4, doubt_memory = NULL,
                doubt_earlier_fence = NULL, doubt_expired_for = NULL,
                expires_at = statement_timestamp() + $5::bigint * interval '1 millisecond'
            WHERE u.task = $1 AND u.key = $2 AND {shown} AND {bound}
            RETURNING 1
        )
        SELECT (SELECT count(*) FROM recorded) AS resolved{present}"
    )
}

/// Stores the marker where the caller's lock is (`$5`), or where nothing is (`$7`, the
/// marker flagged as written after its lock expired); says which, and whether this delivery's
/// marker was already there (a repeated finish, answered as the first one was). Another
/// holder's lock in doubt is there: nothing is written over it. `bound` is
/// [`lock_wait_bound`].
fn finish(t: &str, bound: &str) -> String {
    let present_u = present("u");
    format!(
        "WITH old AS (
            SELECT u.state, u.token, u.fence, u.marker FROM {t} u
            WHERE u.task = $1 AND u.key = $2 AND {present_u}
        ), written AS (
            INSERT INTO {t} AS u (task, key, state, token, fence, marker, expires_at)
            SELECT $1, $2, 'done', NULL, $4,
                   CASE WHEN EXISTS (SELECT 1 FROM old WHERE old.state = 'locked'
                                     AND old.token = $3 AND old.fence IS NOT DISTINCT FROM $4)
                        THEN $5 ELSE $7 END,
                   statement_timestamp() + $6::bigint * interval '1 millisecond'
            WHERE {bound}
            ON CONFLICT (task, key) DO UPDATE SET
                state = 'done',
                token = NULL,
                fence = COALESCE(excluded.fence, u.fence),
                marker = excluded.marker,
                expires_at = excluded.expires_at,
                doubt_memory = NULL,
                doubt_earlier_fence = NULL,
                doubt_expired_for = NULL
            WHERE (u.state = 'locked' AND u.token = $3 AND u.fence IS NOT DISTINCT FROM $4)
               OR NOT {present_u}
            RETURNING 1
        )
        SELECT EXISTS (SELECT 1 FROM written) AS written,
               EXISTS (SELECT 1 FROM old WHERE old.state = 'locked' AND old.token = $3
                       AND old.fence IS NOT DISTINCT FROM $4) AS held,
               EXISTS (SELECT 1 FROM old WHERE old.state = 'done' AND old.marker = $5)
                   AS repeated,
               EXISTS (SELECT 1 FROM old WHERE old.state = 'done' AND old.marker = $7)
                   AS repeated_late"
    )
}

#[cfg(test)]
mod tests;
