//! The command line, as clap reads it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::parser::ValueSource;
use clap::{ArgMatches, Args, Parser, Subcommand};
use serde_json::value::RawValue;

use crate::time::{parse_age, parse_ttl};

/// Inspect and repair idempotask's units of work in Redis, Redis Cluster or PostgreSQL.
///
/// Exit codes: 0 done (or the command succeeded), 1 error (the store unreachable, credentials
/// refused, unreadable data, a unit that changed meanwhile), 2 usage (bad arguments, `forget`
/// or `resolve` without `--yes` and no terminal), 3 locked (a delivery is running the work
/// now), 4 unknown (no such key, or no such task), 5 in doubt (a delivery's lock ran out
/// without a release or a result: find out downstream whether its side effect happened, then
/// `resolve` it).
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

    /// Append a JSON line for every change `resolve`, `forget` and the dashboard's actions make
    /// (who, when, what, which unit, the outcome) to this file.
    #[arg(long, value_name = "PATH", global = true)]
    pub(crate) audit_log: Option<PathBuf>,

    /// Print one JSON document on stdout instead of text (errors too).
    #[arg(long, global = true)]
    pub(crate) json: bool,

    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Whether one key is done (with its result), locked, in doubt or unknown; the exit code
    /// says which. A unit that has not finished shows the steps it recorded (each with its
    /// value, cut short; `--json` has it whole), and which step runs next.
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
    /// Every done, locked and in-doubt key of a task (Redis: found with SCAN; PostgreSQL: one
    /// query per page), with counts; odd keys are flagged.
    List {
        /// The task's stable name.
        #[arg(long)]
        task: String,
        /// Only keys that are locked now.
        #[arg(long, conflicts_with_all = ["done", "in_doubt"])]
        locked: bool,
        /// Only keys that are done.
        #[arg(long, conflicts_with = "in_doubt")]
        done: bool,
        /// Only keys in doubt: a delivery's lock ran out without a release or a result, and
        /// the store still remembers it (resolve each with `resolve`). `--held` says the
        /// same: a task with `in_doubt = "hold"` holds each of them until it is resolved.
        #[arg(long, visible_alias = "held")]
        in_doubt: bool,
        /// With `--in-doubt`: only the units whose lock ran out at least this long ago (e.g.
        /// `30m`, `4h`, `7d`), on the store's clock: the held units nobody resolved, as a
        /// task's `hold_alert_after` counts them.
        #[arg(long, value_name = "DURATION", value_parser = parse_age, requires = "in_doubt")]
        older_than: Option<Duration>,
    },
    /// Settle a key in doubt: record the result its side effect had, or free it.
    ///
    /// First ask the downstream system whether the earlier delivery's side effect happened
    /// (`status` shows its fencing token); then `--result` if it did, `--free` if it did not.
    /// A unit held at a step (`status` shows its journal) is settled step by step instead:
    /// `--step NAME --step-result JSON` if that step's effect happened.
    /// Either writes only while the key (or row) still holds the lock that was read and shown,
    /// still run out: a key that changed meanwhile (taken over, finished or renewed by its
    /// holder, resolved by someone else) is left alone. Exit codes: 0 resolved, 1 done (not in
    /// doubt) or changed meanwhile, 2 usage, 3 locked, 4 unknown or free meanwhile.
    Resolve {
        #[command(flatten)]
        unit: Unit,
        /// The effect happened: store this result, the task's `Ok` value as JSON (e.g.
        /// `'{"charge":"ch_1"}'`), as its completion marker, so that every later delivery gets it
        /// back instead of running the work.
        #[arg(
            long,
            value_name = "JSON",
            value_parser = parse_json,
            conflicts_with_all = ["free", "step_result"],
            required_unless_present_any = ["free", "step_result"]
        )]
        result: Option<Box<RawValue>>,
        /// The unit is held at its step in doubt (`step_or_hold`), and that step's effect
        /// happened: record this value, the step's value as JSON, as the step `--step` at the
        /// end of the unit's journal, and free the unit, so that the next delivery replays it
        /// and goes on with the step after it.
        #[arg(
            long,
            value_name = "JSON",
            value_parser = parse_json,
            conflicts_with = "free",
            requires = "step"
        )]
        step_result: Option<Box<RawValue>>,
        /// With `--step-result`: the name of the step held in doubt, as the body gives it.
        #[arg(long, value_name = "NAME", requires = "step_result")]
        step: Option<String>,
        /// With `--step`: the step's key part, for a step named with one (`("mail", to)`).
        #[arg(long, value_name = "PART", requires = "step")]
        part: Option<String>,
        /// How long the recorded result is kept: the task's `result_ttl` (e.g. `90s`, `30m`,
        /// `24h`, `7d`); with `--step-result`, how long the journal is kept.
        #[arg(long, value_name = "DURATION", default_value = "24h", value_parser = parse_ttl)]
        result_ttl: Duration,
        /// The effect did not happen: delete the lock that ran out, so that the next delivery
        /// runs the work as new, with no doubt. A unit with steps keeps its journal: the next
        /// delivery replays the recorded steps and runs the one in doubt again.
        #[arg(long)]
        free: bool,
        /// With `--free`: delete the unit's journal of steps too, so that the next delivery
        /// runs the whole body as new, the recorded steps' effects again included. The way out
        /// for a unit held because its body changed its step order (`order_changed`), which a
        /// plain `--free` leaves held at the next delivery.
        // `requires = "free"` alone lets `--result` through: a flag's default counts as given.
        #[arg(long, requires = "free", conflicts_with_all = ["result", "step_result"])]
        discard_steps: bool,
        /// Do not ask for confirmation.
        #[arg(long, short = 'y')]
        yes: bool,
    },
    /// Serve a web page for operators: each task's locked units against their lock TTL, its
    /// units in doubt (held), its done units page by page, and buttons that resolve, free or
    /// forget one (as `resolve` and `forget` do).
    ///
    /// Every request needs the token from `IDEMPOTASK_DASHBOARD_TOKEN` or `--token-file`; on a
    /// loopback address without one, a fresh token is made and the address to open is printed.
    Dashboard {
        /// A task to show; repeat it for several (the store keeps no list of tasks). With
        /// `--metrics`, the tasks the metrics name are shown too, and `--task` may be left out.
        #[arg(
            long = "task",
            value_name = "TASK",
            required_unless_present = "metrics"
        )]
        tasks: Vec<String>,
        /// Where to listen: loopback unless told otherwise (another address needs a token).
        #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8787")]
        listen: SocketAddr,
        /// A file whose first line is the token (instead of `IDEMPOTASK_DASHBOARD_TOKEN`).
        #[arg(long, value_name = "PATH")]
        token_file: Option<PathBuf>,
        /// Show units by the digest of their caller key only, never the key itself nor a stored
        /// result (for tasks whose keys hold personal data: their `log_key = "hash"`).
        #[arg(long)]
        hash_keys: bool,
        /// A page of the workers' metrics in Prometheus' text format (`http://host:port/metrics`
        /// of a worker's exporter, or a Prometheus server's `/federate`); repeat it for several.
        /// Each task then shows the counts of its calls, summed over the pages: fresh,
        /// duplicate, waited, gave up (and in the last 5 minutes), failed, lost, held.
        #[arg(long = "metrics", value_name = "URL")]
        metrics: Vec<String>,
    },
}

/// Input: `--result`'s text. Output: it as JSON, or why it is not.
fn parse_json(text: &str) -> Result<Box<RawValue>, String> {
    RawValue::from_string(text.to_owned())
        .map_err(|err| format!("not JSON ({err}); quote it for the shell, e.g. '{{\"id\":1}}'"))
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
