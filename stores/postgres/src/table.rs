//! The table: its name, checked to be a plain identifier, and the migration that creates it or
//! brings a table of an earlier version up to date.

use idempotask::store::{StoreError, StoreErrorKind};

/// The table's name when none is given.
pub(super) const DEFAULT_TABLE: &str = "idempotask_units";

/// The longest name part: the sequence adds `_fence` to it, the journal table `_steps` and the
/// attempts table `_runs`, and PostgreSQL identifiers end at 63 bytes.
const MAX_NAME_PART: usize = 56;

/// A validated `table` or `schema.table` name, and the names derived from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct TableName {
    schema: Option<String>,
    table: String,
}

impl TableName {
    /// Accepts lower-case identifiers only (`[a-z_][a-z0-9_]*`, at most 56 bytes each), so the
    /// name reads the same quoted and unquoted and can never carry SQL.
    pub(super) fn parse(name: &str) -> Result<Self, StoreError> {
        let valid = |part: &str| {
            !part.is_empty()
                && part.len() <= MAX_NAME_PART
                && part.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
                && part
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        };
        let (schema, table) = match name.split_once('.') {
            Some((schema, table)) => (Some(schema), table),
            None => (None, name),
        };
        if !valid(table) || schema.is_some_and(|schema| !valid(schema)) {
            return Err(StoreError::new(
                "configure",
                StoreErrorKind::Configuration,
                format!(
                    "`{name}` is not a usable table name: give `table` or `schema.table`, each part 1 to {MAX_NAME_PART} characters of `a-z 0-9 _`, not starting with a digit"
                ),
            ));
        }
        Ok(Self {
            schema: schema.map(str::to_owned),
            table: table.to_owned(),
        })
    }

    /// `"schema"."prefix_suffix"` or `"prefix_suffix"`: an object of this table's, quoted.
    fn qualified(&self, suffix: &str) -> String {
        match &self.schema {
            Some(schema) => format!(r#""{schema}"."{}{suffix}""#, self.table),
            None => format!(r#""{}{suffix}""#, self.table),
        }
    }

    /// The table, quoted.
    pub(super) fn table(&self) -> String {
        self.qualified("")
    }

    /// The sequence fencing tokens come from, quoted.
    pub(super) fn sequence(&self) -> String {
        self.qualified("_fence")
    }

    /// The table of the units' journals of steps, quoted.
    pub(super) fn steps(&self) -> String {
        self.qualified("_steps")
    }

    /// The table of the attempts of transactional executions with steps, quoted.
    pub(super) fn runs(&self) -> String {
        self.qualified("_runs")
    }

    /// The table's name as given, for messages.
    pub(super) fn display(&self) -> String {
        match &self.schema {
            Some(schema) => format!("{schema}.{}", self.table),
            None => self.table.clone(),
        }
    }

    /// The migration: the table, the table of journals of steps and the fencing sequence, which
    /// starts at the clock in microseconds. Safe to run again, and by several processes at once: a transaction-scoped
    /// advisory lock, per table, makes concurrent runs wait for each other (`CREATE … IF NOT
    /// EXISTS` alone is not safe under concurrency in PostgreSQL).
    ///
    /// There is no index on `expires_at`: it would be updated by every `begin` and `finish` and
    /// keep PostgreSQL from updating rows in place (HOT), while only the occasional purge
    /// needs it, and that walks the table in block ranges instead.
    ///
    /// A table created before the columns of units in doubt existed (`doubt_memory`, then
    /// `doubt_earlier_fence` and `doubt_expired_for`) gets them here, nullable and without a
    /// default, in one `ALTER TABLE`: only the catalog changes, no row is rewritten, and the
    /// rows already there read as remembering nothing and as having taken nothing over.
    /// `ALTER TABLE` takes the table's `ACCESS EXCLUSIVE` lock even when the columns are there
    /// already, and waits behind every open transaction that touched the table while every
    /// statement of the store queues behind it; so it runs only when the catalog says a column
    /// is missing, and a migration of an up-to-date table, run by every replica at each
    /// deploy, takes no lock on the table at all.
    ///
    /// The journals of steps are a table of their own, created here for tables of earlier
    /// versions too (a new table locks nothing that exists): a unit without steps has no row
    /// there, and the units table and its statements stay as they were. So are the attempts
    /// of transactional executions with steps (`<table>_runs`): only such an execution writes
    /// there.
    pub(super) fn migration(&self) -> String {
        let table = self.table();
        let steps = self.steps();
        let runs = runs_table(&self.runs());
        let table_literal = table.replace('\'', "''");
        let sequence = self.sequence();
        let sequence_literal = sequence.replace('\'', "''");
        let schema = self
            .schema
            .as_ref()
            .map(|schema| format!("CREATE SCHEMA IF NOT EXISTS \"{schema}\";\n"))
            .unwrap_or_default();
        let lock_name = format!("idempotask migration {table}").replace('\'', "''");
        format!(
            "-- Replicas that deploy together run this at once: one at a time, until the commit.
SELECT pg_advisory_xact_lock(hashtextextended('{lock_name}', 0));
{schema}\
CREATE TABLE IF NOT EXISTS {table} (
    -- The unit of work: the task's name and the caller's key (bytes: a key may hold any text,
    -- NUL included).
    task       text        NOT NULL,
    key        bytea       NOT NULL,
    -- `locked`: `token` holds the lock until `expires_at`.
    -- `done`: `marker` is the completion marker, kept until `expires_at`.
    -- A row whose `expires_at` has passed counts as absent, unless it is a lock still
    -- remembered (below); `purge_expired` deletes it.
    state      text        NOT NULL CHECK (state IN ('locked', 'done')),
    token      text,
    -- The last fencing token granted for the unit, when it uses fencing.
    fence      bigint,
    marker     bytea,
    expires_at timestamptz NOT NULL,
    -- How long after `expires_at` a lock that ran out is remembered, so that the delivery
    -- that takes it over learns that the unit is in doubt (NULL: not at all).
    doubt_memory interval,
    -- A lock that took the unit over in doubt: the fencing token of the lock it replaced, and
    -- how long that lock had run out (NULL: it took nothing over). Its holder's repeated
    -- begin answers them, and its release leaves the unit in doubt.
    doubt_earlier_fence bigint,
    doubt_expired_for interval,
    PRIMARY KEY (task, key)
);
-- Tables of earlier versions: the columns they lack, added only when one is missing.
DO $migration$
BEGIN
    IF (
        SELECT count(*) FROM pg_attribute
        WHERE attrelid = '{table_literal}'::regclass AND NOT attisdropped
          AND attname IN ('doubt_memory', 'doubt_earlier_fence', 'doubt_expired_for')
    ) < 3 THEN
        ALTER TABLE {table}
            ADD COLUMN IF NOT EXISTS doubt_memory interval,
            ADD COLUMN IF NOT EXISTS doubt_earlier_fence bigint,
            ADD COLUMN IF NOT EXISTS doubt_expired_for interval;
    END IF;
END
$migration$;
-- The journals of units with steps: one row per finished step, kept apart from the unit's
-- row, which a release deletes while the journal stays for the next holder.
CREATE TABLE IF NOT EXISTS {steps} (
    task       text        NOT NULL,
    key        bytea       NOT NULL,
    -- The step's place in the body, from 0: a journal is the entries at 0, 1, … that have
    -- not expired. All of a unit's live entries share one expiry, set again at each record.
    position   integer     NOT NULL,
    -- The step's encoded result, opaque to the store.
    entry      bytea       NOT NULL,
    -- Past it, the entry counts as absent; `purge_expired` deletes it.
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (task, key, position)
);
{runs}
CREATE SEQUENCE IF NOT EXISTS {sequence};
-- Fencing tokens start at the clock in microseconds, like those of the Redis stores, so a
-- database that remembers the highest token it saw keeps accepting writers after a move from
-- Redis; running this again (after a logical-replication cut-over, which does not copy
-- sequences) never moves the sequence back.
SELECT setval('{sequence_literal}', greatest(
    (SELECT last_value FROM {sequence}),
    (extract(epoch FROM clock_timestamp()) * 1000000)::bigint
));
"
        )
    }
}

/// The table of the attempts of transactional executions with steps, `runs` (see the
/// statements' `open_attempt`).
fn runs_table(runs: &str) -> String {
    format!(
        "-- The attempts of transactional executions with steps: one row per unit whose last such
-- execution has not ended cleanly (it runs, or it died), written outside the caller's transaction at the body's first step, so that the next
-- execution learns that one died in its steps (its transaction no longer in progress and
-- not committed) and puts the step after the journal's last entry in doubt.
CREATE TABLE IF NOT EXISTS {runs} (
    task        text        NOT NULL,
    key         bytea       NOT NULL,
    -- The attempt's transaction (`pg_current_xact_id()` as a bigint) and fencing token.
    xid         bigint      NOT NULL,
    fence       bigint,
    started_at  timestamptz NOT NULL,
    -- The doubt memory: past it, the row counts as absent.
    expires_at  timestamptz NOT NULL,
    -- The earliest execution that died unsettled (its fencing token and start), carried by
    -- every execution after it until one settles the step in doubt (NULL: none died).
    doubt_fence bigint,
    doubt_since timestamptz,
    PRIMARY KEY (task, key)
);
"
    )
}
