//! The command line, as clap reads it.

use clap::parser::ValueSource;
use clap::{ArgMatches, Args, Parser, Subcommand};

/// Inspect and repair idempotask's units of work in Redis, Redis Cluster or PostgreSQL.
///
/// Exit codes: 0 done (or the command succeeded), 1 error (the store unreachable, credentials
/// refused, unreadable data), 2 usage (bad arguments, `forget` without `--yes` and no
/// terminal), 3 locked (a delivery is running the work now), 4 unknown (no such key, or no
/// such task).
#[derive(Debug, Parser)]
#[command(name = "idempotask", version, max_term_width = 100)]
pub(crate) struct Cli {
    /// The Redis server, e.g. `redis://user:password@host:6379/0`.
    #[arg(
        long,
        env = "REDIS_URL",
        default_value = "redis://127.0.0.1:6379",
        global = true,
        hide_env_values = true
    )]
    pub(crate) redis_url: String,

    /// PostgreSQL instead of Redis: the database the workers' `PostgresStore` uses, e.g.
    /// `postgres://user:password@host:5432/app`. A flag on the command line wins over the
    /// environment; `--redis-url` and `--database-url` together, or `REDIS_URL` and
    /// `DATABASE_URL` both set with neither flag, are a usage error.
    #[arg(long, env = "DATABASE_URL", global = true, hide_env_values = true)]
    pub(crate) database_url: Option<String>,

    /// The table the workers' `PostgresStore` uses (with --database-url).
    #[arg(long, default_value = idempotask_postgres::PostgresStore::DEFAULT_TABLE, global = true)]
    pub(crate) table: String,

    /// The namespace the workers' `RedisStore` uses.
    #[arg(long, default_value = "default", global = true)]
    pub(crate) namespace: String,

    /// Print one JSON document on stdout instead of text (errors too).
    #[arg(long, global = true)]
    pub(crate) json: bool,

    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Whether one key is done (with its result), locked, or unknown; the exit code says which.
    Status(Unit),
    /// Delete a done key's marker on purpose, so that the next delivery runs the work again.
    Forget {
        #[command(flatten)]
        unit: Unit,
        /// Do not ask for confirmation.
        #[arg(long, short = 'y')]
        yes: bool,
        /// Also delete a marker that cannot be read or was written for another key (the remedy
        /// for `Error::Codec` and `Error::MarkerKeyMismatch`); never a lock.
        #[arg(long)]
        force: bool,
    },
    /// Every done and locked key of a task (Redis: found with SCAN; PostgreSQL: one query per
    /// page), with counts; odd keys are flagged.
    List {
        /// The task's stable name.
        #[arg(long)]
        task: String,
        /// Only keys that are locked now.
        #[arg(long, conflicts_with = "done")]
        locked: bool,
        /// Only keys that are done.
        #[arg(long)]
        done: bool,
    },
}

/// One unit of work: a task and a caller key.
#[derive(Debug, Args)]
pub(crate) struct Unit {
    /// The task's stable name (the function's name, or its `name = "…"`).
    #[arg(long)]
    pub(crate) task: String,
    /// The caller's idempotency key, as the task computed it (e.g. `order-charge-42`).
    #[arg(long)]
    pub(crate) key: String,
}

/// The store a command line selects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Selected {
    Redis,
    Postgres,
}

/// Input: the parsed command line and clap's matches (which say where each value came from).
/// Output: the store to use, or why the line does not say.
///
/// A service's environment often has both `REDIS_URL` and `DATABASE_URL` (its own database):
/// a flag given on the command line then decides, and without one the command refuses to
/// guess.
pub(crate) fn select(cli: &Cli, matches: &ArgMatches) -> Result<Selected, String> {
    if cli.database_url.is_none() {
        return Ok(Selected::Redis);
    }
    let source = |id: &str| matches.value_source(id);
    let typed = |id: &str| source(id) == Some(ValueSource::CommandLine);
    let redis_from_env = source("redis_url") == Some(ValueSource::EnvVariable);
    match (typed("redis_url"), typed("database_url")) {
        (true, true) => Err(
            "give one of --redis-url and --database-url: they select different stores".to_owned(),
        ),
        (true, false) => Ok(Selected::Redis),
        (false, false) if redis_from_env => Err(
            "both REDIS_URL and DATABASE_URL are set: pass --redis-url or --database-url to say which store to inspect".to_owned(),
        ),
        // `--database-url` typed, or `DATABASE_URL` set and `REDIS_URL` not.
        (false, _) => Ok(Selected::Postgres),
    }
}
