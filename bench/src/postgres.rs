//! The PostgreSQL modes: `PostgresStore` and transactional completion against the hand-written
//! pattern they replace (`INSERT … ON CONFLICT DO NOTHING`, then a `SELECT` for a duplicate or
//! an `UPDATE` with the result), on one pool. `pg-fresh`, `pg-duplicate` and `pg-transactional`
//! use the store as users deploy it (`PostgresStore::builder(pool).connect()`: its group
//! commit on, the calls in flight together sent as batch statements; `run_in_transaction`'s
//! statements, in the caller's transaction, never go through it); `pg-fresh-ungrouped` turns
//! the group commit off, each call's statements sent alone.
//!
//! Statements per task come from `pg_stat_statements` when the server preloads it
//! (`shared_preload_libraries = pg_stat_statements`); they are left out otherwise.

use std::fmt::Write as _;
use std::sync::Arc;

use idempotask::Task;
use idempotask::store::SharedStore;
use idempotask_postgres::PostgresStore;
use serde::Serialize;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

use super::BenchError;
use super::cpu::CpuClocks;
use super::driver::{Timings, drive, percentile_us};

mod patterns;

use patterns::{FloorSql, effect, handwritten, handwritten_transactional, table_floor};

static FRESH: Task = Task::new("bench_pg");
static TRANSFER: Task = Task::new("bench_pg_transactional");

/// The PostgreSQL modes, in the order each round runs them: each idempotask mode right after
/// its hand-written counterpart, so the two see the same machine.
///
/// The last pair measures a floor for `pg-transactional`: the hand-written transactional
/// pattern's two statements written against the store's own table (its key of a task name and
/// a `bytea`, its columns and `CHECK`), which no statement the store could send on that table
/// beats by much. What `pg-transactional` loses beyond it is the store's statements; what the
/// floor loses against the hand-written pattern is the table.
pub const MODES: [&str; 10] = [
    "pg-handwritten-fresh",
    "pg-fresh",
    "pg-handwritten-fresh",
    "pg-fresh-ungrouped",
    "pg-handwritten-duplicate",
    "pg-duplicate",
    "pg-handwritten-transactional",
    "pg-transactional",
    "pg-handwritten-transactional",
    "pg-transactional-table-floor",
];

/// One PostgreSQL benchmark run's settings.
#[derive(Debug, Clone)]
pub struct PgConfig {
    /// The server, e.g. `postgres://postgres@127.0.0.1:5432/postgres`.
    pub database_url: String,
    /// N: keys per measurement.
    pub tasks: usize,
    /// C: task calls in flight at once (the pool holds C connections).
    pub concurrency: usize,
    /// How many times every mode runs.
    pub rounds: usize,
}

/// One measurement: one JSON line of the bench's output.
#[derive(Debug, Clone, Serialize)]
pub struct PgMeasurement {
    /// One of [`MODES`].
    pub mode: &'static str,
    /// Which round this is, from 1.
    pub round: usize,
    /// Distinct keys, one call each.
    pub tasks: usize,
    /// Task calls in flight at once.
    pub concurrency: usize,
    /// Task calls completed per second of wall time.
    pub tasks_per_sec: f64,
    /// Statements the server ran per task call (`BEGIN` and `COMMIT` included), from
    /// `pg_stat_statements`; `None` when the server does not preload it.
    pub statements_per_task: Option<f64>,
    /// Median time of one task call, in microseconds.
    pub p50_us: u64,
    /// 99th percentile time of one task call, in microseconds.
    pub p99_us: u64,
    /// Rows the transactional modes wrote (one per key); 0 for the others.
    pub rows_written: i64,
    /// WAL the server wrote per task call, in bytes (`pg_current_wal_lsn()` before and after).
    pub wal_bytes_per_task: f64,
    /// CPU time of the bench process (the client: idempotask, sqlx, tokio) per task call, in
    /// microseconds, from `/proc/self/stat`; `None` where that cannot be read.
    pub client_cpu_us_per_task: Option<f64>,
    /// CPU time of the server per task call, in microseconds: every process named `postgres`
    /// on this machine (the bench script starts one server), from `/proc/<pid>/stat`; `None`
    /// when none is found there, as for a remote server.
    pub server_cpu_us_per_task: Option<f64>,
    /// The statements the server ran for this mode, from `pg_stat_statements` (empty when the
    /// server does not preload it), the most total time first.
    pub profile: Vec<StatementProfile>,
}

/// One statement of a mode as `pg_stat_statements` saw it.
#[derive(Debug, Clone, Serialize)]
pub struct StatementProfile {
    /// The statement's text, whitespace folded, cut at 60 characters.
    pub query: String,
    /// How many times it ran per task call.
    pub calls_per_task: f64,
    /// Its mean execution time in the server, in microseconds.
    pub mean_us: f64,
}

/// Runs every PostgreSQL mode `rounds` times and hands each measurement to `emit`.
///
/// # Errors
/// [`BenchError`] when the server cannot be reached or a task call fails.
pub async fn run(
    config: &PgConfig,
    mut emit: impl FnMut(&PgMeasurement),
) -> Result<Vec<PgMeasurement>, BenchError> {
    // No ping before each statement, for idempotask and the hand-written pattern alike.
    let pool = PgPoolOptions::new()
        .test_before_acquire(false)
        .max_connections(u32::try_from(config.concurrency.max(1)).unwrap_or(u32::MAX))
        .connect(&config.database_url)
        .await?;
    let builder = PostgresStore::builder(pool.clone());
    builder.migrate().await?;
    // The store as users deploy it (its group commit on), and one that sends each call alone,
    // for comparison.
    let store = builder.connect().await?;
    let ungrouped = PostgresStore::builder(pool.clone())
        .group_commit(false)
        .connect()
        .await?;
    prepare(&pool).await?;
    let statements = Statements::new(&pool).await;
    let mut measurements = Vec::new();
    for round in 1..=config.rounds.max(1) {
        for (position, mode) in MODES.into_iter().enumerate() {
            if !selected(mode) {
                continue;
            }
            // Keys of their own for each measurement, a mode measured twice in a round too.
            let run = format!("{}-{round}-{position}", std::process::id());
            let store = if mode == "pg-fresh-ungrouped" {
                &ungrouped
            } else {
                &store
            };
            if mode.ends_with("duplicate") {
                // The same keys, done before the clock starts.
                measure(mode, &pool, store, &run, config, None).await?;
            }
            let m = measure(mode, &pool, store, &run, config, Some(&statements)).await?;
            let m = PgMeasurement { round, ..m };
            emit(&m);
            measurements.push(m);
        }
    }
    Ok(measurements)
}

/// Whether `mode` is among those `BENCH_PG_MODES` names (a comma-separated list, to look at a
/// few modes closely); every mode when it is unset.
fn selected(mode: &str) -> bool {
    std::env::var("BENCH_PG_MODES").map_or(true, |modes| {
        modes.split(',').any(|name| name.trim() == mode)
    })
}

/// The hand-written pattern's table and the transactional modes' side effects.
async fn prepare(pool: &PgPool) -> Result<(), BenchError> {
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS bench_handwritten (
             key text PRIMARY KEY, token text, done boolean NOT NULL, result text,
             expires_at timestamptz NOT NULL);
         CREATE TABLE IF NOT EXISTS bench_effects (key text NOT NULL);",
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// `pg_stat_statements`, when the server has it loaded.
struct Statements {
    available: bool,
}

impl Statements {
    async fn new(pool: &PgPool) -> Self {
        let created = sqlx::raw_sql("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            .execute(pool)
            .await
            .is_ok();
        let readable = created
            && sqlx::query("SELECT pg_stat_statements_reset()")
                .execute(pool)
                .await
                .is_ok();
        Self {
            available: readable,
        }
    }

    async fn reset(&self, pool: &PgPool) -> Result<(), BenchError> {
        if self.available {
            sqlx::query("SELECT pg_stat_statements_reset()")
                .execute(pool)
                .await?;
        }
        Ok(())
    }

    /// Statements since the last reset, leaving out the measuring ones.
    async fn count(&self, pool: &PgPool) -> Result<Option<i64>, BenchError> {
        if !self.available {
            return Ok(None);
        }
        let calls: i64 = sqlx::query_scalar(
            "SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements
             WHERE query NOT LIKE '%pg_stat_statements%' AND query NOT LIKE '%pg_current_wal_lsn%'",
        )
        .fetch_one(pool)
        .await?;
        Ok(Some(calls))
    }

    /// Each statement since the last reset, leaving out the measuring ones.
    async fn profile(&self, pool: &PgPool, n: usize) -> Result<Vec<StatementProfile>, BenchError> {
        if !self.available {
            return Ok(Vec::new());
        }
        let rows: Vec<(String, i64, f64)> = sqlx::query_as(
            "SELECT query, calls, mean_exec_time FROM pg_stat_statements
             WHERE query NOT LIKE '%pg_stat_statements%' AND query NOT LIKE '%pg_current_wal_lsn%'
             ORDER BY total_exec_time DESC LIMIT 6",
        )
        .fetch_all(pool)
        .await?;
        #[allow(clippy::cast_precision_loss, reason = "task counts are far below 2^52")]
        let per_task = |calls: i64| calls as f64 / n.max(1) as f64;
        Ok(rows
            .into_iter()
            .map(|(query, calls, mean_ms)| StatementProfile {
                query: fold(&query),
                calls_per_task: per_task(calls),
                mean_us: mean_ms * 1000.0,
            })
            .collect())
    }
}

/// A statement's text on one line, cut to a width a table cell can show.
fn fold(query: &str) -> String {
    let folded = query.split_whitespace().collect::<Vec<_>>().join(" ");
    match folded.char_indices().nth(60) {
        Some((at, _)) => format!("{}…", &folded[..at]),
        None => folded,
    }
}

/// The server's WAL position, as text for `pg_wal_lsn_diff`.
async fn wal_position(pool: &PgPool) -> Result<String, BenchError> {
    Ok(sqlx::query_scalar("SELECT pg_current_wal_lsn()::text")
        .fetch_one(pool)
        .await?)
}

/// WAL bytes the server wrote since `before`.
async fn wal_since(pool: &PgPool, before: &str) -> Result<f64, BenchError> {
    let bytes =
        sqlx::query_scalar("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::float8")
            .bind(before)
            .fetch_one(pool)
            .await?;
    Ok(bytes)
}

async fn measure(
    mode: &'static str,
    pool: &PgPool,
    store: &PostgresStore,
    run: &str,
    config: &PgConfig,
    statements: Option<&Statements>,
) -> Result<PgMeasurement, BenchError> {
    let n = config.tasks;
    let prefix = Arc::new(prefix_of(run, mode));
    if let Some(statements) = statements {
        statements.reset(pool).await?;
    }
    let wal_before = wal_position(pool).await?;
    let clocks = CpuClocks::now("postgres");
    let mut timings = timed(mode, pool, store, prefix, config).await?;
    let elapsed = timings.elapsed.as_secs_f64().max(1e-9);
    let (client_cpu, server_cpu) = clocks.since();
    let wal_bytes = wal_since(pool, &wal_before).await?;
    let (statements_run, profile) = match statements {
        Some(statements) => (
            statements.count(pool).await?,
            statements.profile(pool, n).await?,
        ),
        None => (None, Vec::new()),
    };
    let rows_written: i64 = if mode.contains("transactional") {
        sqlx::query_scalar("SELECT count(*) FROM bench_effects WHERE left(key, length($1)) = $1")
            .bind(format!("{}-", prefix_of(run, mode)))
            .fetch_one(pool)
            .await?
    } else {
        0
    };
    #[allow(clippy::cast_precision_loss, reason = "task counts are far below 2^52")]
    let calls = n.max(1) as f64;
    #[allow(
        clippy::cast_precision_loss,
        reason = "statement counts are far below 2^52"
    )]
    let per_task = |count: i64| count as f64 / calls;
    Ok(PgMeasurement {
        mode,
        round: 0,
        tasks: n,
        concurrency: config.concurrency,
        tasks_per_sec: calls / elapsed,
        statements_per_task: statements_run.map(per_task),
        p50_us: percentile_us(&mut timings.latencies, 50),
        p99_us: percentile_us(&mut timings.latencies, 99),
        rows_written,
        wal_bytes_per_task: wal_bytes / calls,
        client_cpu_us_per_task: client_cpu.map(|cpu| cpu / calls),
        server_cpu_us_per_task: server_cpu.map(|cpu| cpu / calls),
        profile,
    })
}

/// Drives `config.tasks` task calls of `mode`, `config.concurrency` at a time, under `prefix`.
async fn timed(
    mode: &'static str,
    pool: &PgPool,
    store: &PostgresStore,
    prefix: Arc<String>,
    config: &PgConfig,
) -> Result<Timings, BenchError> {
    let n = config.tasks;
    let shared = SharedStore::new(store.clone());
    let (pool, store) = (pool.clone(), store.clone());
    Ok(match mode {
        "pg-fresh" | "pg-fresh-ungrouped" | "pg-duplicate" => {
            drive(n, config.concurrency, move |id| {
                let (shared, prefix) = (shared.clone(), Arc::clone(&prefix));
                async move {
                    let _: u64 = FRESH
                        .call(format!("{prefix}-{id}"))
                        .store(shared)
                        .run(async { Ok::<_, idempotask::Error>(7) })
                        .await?;
                    Ok(())
                }
            })
            .await?
        }
        "pg-handwritten-fresh" | "pg-handwritten-duplicate" => {
            drive(n, config.concurrency, move |id| {
                let (pool, prefix) = (pool.clone(), Arc::clone(&prefix));
                async move { handwritten(&pool, &format!("{prefix}-{id}")).await }
            })
            .await?
        }
        "pg-transactional" => {
            drive(n, config.concurrency, move |id| {
                let (store, prefix) = (store.clone(), Arc::clone(&prefix));
                async move {
                    let key = format!("{prefix}-{id}");
                    let transaction = store.pool().begin().await?;
                    let _: u64 = TRANSFER
                        .call(key.as_str())
                        .run_in_transaction(store.transaction(transaction), async |db| {
                            effect(db, &key).await?;
                            Ok::<_, BenchError>(7)
                        })
                        .await?;
                    Ok(())
                }
            })
            .await?
        }
        "pg-transactional-table-floor" => {
            let sql = Arc::new(FloorSql::on(store.table()));
            drive(n, config.concurrency, move |id| {
                let (pool, prefix, sql) = (pool.clone(), Arc::clone(&prefix), Arc::clone(&sql));
                async move { table_floor(&pool, &sql, TRANSFER.name(), &format!("{prefix}-{id}")).await }
            })
            .await?
        }
        _ => {
            drive(n, config.concurrency, move |id| {
                let (pool, prefix) = (pool.clone(), Arc::clone(&prefix));
                async move { handwritten_transactional(&pool, &format!("{prefix}-{id}")).await }
            })
            .await?
        }
    })
}

/// The keys' prefix of `mode` in `run`: a duplicate mode reuses its fresh pass's keys.
fn prefix_of(run: &str, mode: &str) -> String {
    format!("{run}-{mode}")
}

impl From<sqlx::Error> for BenchError {
    fn from(err: sqlx::Error) -> Self {
        Self(format!("postgres: {err}"))
    }
}

/// Input: every measurement of one run. Output: the Markdown table of `docs/performance.md`'s
/// PostgreSQL section, and each idempotask mode's median ratio to its hand-written counterpart.
pub fn markdown(measurements: &[PgMeasurement]) -> String {
    let mut out = String::from(
        "| mode | round | C | keys | tasks/s | statements/task | p50 µs | p99 µs | rows written |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for m in measurements {
        let statements = m
            .statements_per_task
            .map_or_else(|| "–".to_owned(), |s| format!("{s:.2}"));
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {:.0} | {statements} | {} | {} | {} |",
            m.mode,
            m.round,
            m.concurrency,
            m.tasks,
            m.tasks_per_sec,
            m.p50_us,
            m.p99_us,
            m.rows_written
        );
    }
    out.push_str(
        "\n| mode ÷ the hand-written run before it, tasks/s | median over rounds | rounds |\n|---|---:|---|\n",
    );
    for pair in MODES.chunks(2) {
        let [baseline, ours] = [pair[0], pair[1]];
        let ratios: Vec<f64> = measurements
            .iter()
            .enumerate()
            .filter(|(_, m)| m.mode == ours)
            .filter_map(|(at, m)| {
                // The baseline measured last before it, in its round.
                let base = measurements[..at]
                    .iter()
                    .rev()
                    .find(|b| b.mode == baseline && b.round == m.round)?;
                Some(m.tasks_per_sec / base.tasks_per_sec.max(1e-9))
            })
            .collect();
        let _ = writeln!(out, "| {ours} | {} |", median_and_rounds(ratios));
    }
    let _ = writeln!(
        out,
        "\n| pg-transactional ÷ {FLOOR}, tasks/s | median over rounds | rounds |\n|---|---:|---|"
    );
    let _ = writeln!(
        out,
        "| pg-transactional | {} |",
        ratio_in_rounds(measurements, "pg-transactional", FLOOR)
    );
    out.push_str(&profile_markdown(measurements));
    out
}

/// The floor of `pg-transactional`: the hand-written transactional pattern on the store's table.
const FLOOR: &str = "pg-transactional-table-floor";

/// `mode`'s tasks/s over `other`'s in each round where both ran, as [`median_and_rounds`].
fn ratio_in_rounds(measurements: &[PgMeasurement], mode: &str, other: &str) -> String {
    let ratios: Vec<f64> = measurements
        .iter()
        .filter(|m| m.mode == mode)
        .filter_map(|m| {
            let base = measurements
                .iter()
                .find(|b| b.mode == other && b.round == m.round)?;
            Some(m.tasks_per_sec / base.tasks_per_sec.max(1e-9))
        })
        .collect();
    median_and_rounds(ratios)
}

/// The median of `ratios` and each of them, lowest first: a ratio table's last two cells.
fn median_and_rounds(mut ratios: Vec<f64>) -> String {
    ratios.sort_by(f64::total_cmp);
    let median = ratios.get(ratios.len() / 2).copied().unwrap_or(0.0);
    let each: Vec<String> = ratios.iter().map(|r| format!("{r:.2}")).collect();
    format!("{median:.2} | {}", each.join(" / "))
}

/// Input: every measurement of one run. Output: the profile of the last round, each mode's
/// WAL and client CPU per task and the statements the server spent its time on.
fn profile_markdown(measurements: &[PgMeasurement]) -> String {
    let last = measurements.iter().map(|m| m.round).max().unwrap_or(0);
    let mut out = format!(
        "\n### Profile of round {last}\n\n\
         | mode | WAL bytes/task | client CPU µs/task | server CPU µs/task | statement (`pg_stat_statements`) | calls/task | mean µs |\n\
         |---|---:|---:|---:|---|---:|---:|\n"
    );
    let micros = |cpu: Option<f64>| cpu.map_or_else(|| "–".to_owned(), |cpu| format!("{cpu:.0}"));
    for m in measurements.iter().filter(|m| m.round == last) {
        let head = format!(
            "| {} | {:.0} | {} | {} ",
            m.mode,
            m.wal_bytes_per_task,
            micros(m.client_cpu_us_per_task),
            micros(m.server_cpu_us_per_task)
        );
        if m.profile.is_empty() {
            let _ = writeln!(out, "{head}| – | – | – |");
        }
        for (i, statement) in m.profile.iter().enumerate() {
            let lead = if i == 0 { head.as_str() } else { "| | | | " };
            let _ = writeln!(
                out,
                "{lead}| `{}` | {:.2} | {:.0} |",
                statement.query.replace('|', "\\|"),
                statement.calls_per_task,
                statement.mean_us
            );
        }
    }
    out
}
