//! The command line, as clap reads it.

use clap::{Args, Parser, Subcommand};

/// Inspect and repair idempotask's units of work in Redis.
///
/// Exit codes: 0 done (or the command succeeded), 1 error (Redis unreachable, credentials
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
    /// Every done and locked key of a task, found with SCAN, with counts; odd keys are flagged.
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
