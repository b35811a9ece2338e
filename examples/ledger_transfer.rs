//! Exactly once for database work: money transfers whose ledger writes commit together with
//! their completion marker, in one PostgreSQL transaction.
//!
//! Worker processes deliver every transfer several times at once. The first worker to reach one
//! particular transfer is killed with SIGKILL (`kill -9`) in the middle of its transaction,
//! after it moved the money and before it committed; the deliveries of that transfer in the
//! other workers wait on its row, and once PostgreSQL has aborted the dead worker's transaction
//! one of them runs it. A last pass redelivers every transfer, as a queue would after the crash.
//!
//! The ledger has no `UNIQUE` constraint of its own: the unit's row in idempotask's table,
//! written in the same transaction as the transfer, is what keeps a transfer from being written
//! twice. The last line of output is one JSON summary; `rows_written` equals `transfers`,
//! `duplicates` is 0 and `balance_ok` is true. `executed` counts the `executed` lines the
//! processes printed; `written_by_killed` counts the transfers the killed worker committed, read
//! from the ledger since it may have died before printing them; `executed_by_survivors` and
//! `written_by_killed` add up to `transfers`.
//!
//! ```text
//! DATABASE_URL=postgres://postgres@127.0.0.1/postgres cargo run --example ledger_transfer --features postgres
//! ```
//!
//! It needs, next to `idempotask`:
//!
//! ```toml
//! [dependencies]
//! idempotask = "0.1"
//! idempotask-postgres = "0.1"
//! serde = { version = "1", features = ["derive"] }
//! serde_json = "1"
//! sqlx = { version = "0.9", default-features = false, features = ["postgres", "runtime-tokio"] }
//! tokio = { version = "1", features = ["macros", "rt-multi-thread", "process", "io-util", "time"] }
//! ```

use std::collections::BTreeMap;
use std::process::Stdio;
use std::time::{Duration, Instant};

use idempotask::Task;
use idempotask_postgres::PostgresStore;
use serde::{Deserialize, Serialize};
use serde_json::json;
use sqlx::postgres::{PgConnection, PgPoolOptions};
use sqlx::{PgPool, Row};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const ACCOUNTS: i64 = 8;
const OPENING_BALANCE: i64 = 10_000;
const TRANSFERS: u64 = 40;
const WORKERS: usize = 3;
/// Each worker delivers each transfer this many times at once.
const COPIES: usize = 2;
/// The worker that first reaches this transfer dies inside its transaction.
const CRASH_TRANSFER: u64 = 7;

static TRANSFER: Task = Task::new("ledger_transfer");

/// One transfer, decided by the producer; its id is the idempotency key.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct Transfer {
    id: u64,
    from: i64,
    to: i64,
    amount: i64,
}

/// The same transfers for every worker: the producer's decisions, not the workers'.
fn transfers() -> Vec<Transfer> {
    (0..TRANSFERS)
        .map(|id| {
            let from = i64::try_from(id % 8).unwrap_or(0);
            let to = (from + 1 + i64::try_from(id % 5).unwrap_or(0)) % ACCOUNTS;
            let amount = 100 + i64::try_from(id * 37 % 400).unwrap_or(0);
            Transfer {
                id,
                from,
                to,
                amount,
            }
        })
        .collect()
}

/// What each delivery reports on stdout, one JSON line.
#[derive(Debug, Serialize, Deserialize)]
struct Delivery {
    transfer: u64,
    /// `executed`, `replayed`, `failed`, or `dying` (killed before it could commit).
    outcome: String,
}

/// The ledger of one run: accounts, and one row per transfer written.
async fn prepare(pool: &PgPool, run: i64) -> Result<(), BoxError> {
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS ledger_accounts (
             run bigint NOT NULL, id bigint NOT NULL, balance bigint NOT NULL,
             PRIMARY KEY (run, id));
         -- No UNIQUE constraint on (run, transfer): the point of the example.
         -- `writer`: the process that committed the row (a worker's index, or -1 for the last
         -- pass), so what a killed worker committed is counted from here, not from its output.
         CREATE TABLE IF NOT EXISTS ledger_transfers (
             run bigint NOT NULL, transfer bigint NOT NULL, from_account bigint NOT NULL,
             to_account bigint NOT NULL, amount bigint NOT NULL, writer bigint NOT NULL);
         CREATE TABLE IF NOT EXISTS ledger_crashes (
             run bigint NOT NULL, transfer bigint NOT NULL, PRIMARY KEY (run, transfer));",
    )
    .execute(pool)
    .await?;
    sqlx::query(
        "INSERT INTO ledger_accounts (run, id, balance)
         SELECT $1, id, $3 FROM generate_series(0, $2 - 1) AS id",
    )
    .bind(run)
    .bind(ACCOUNTS)
    .bind(OPENING_BALANCE)
    .execute(pool)
    .await?;
    Ok(())
}

/// The process a delivery runs in: a worker's index, or [`LAST_PASS`].
type Writer = i64;
/// The parent's redelivery pass after the workers are done.
const LAST_PASS: Writer = -1;

/// The transfer's writes, inside the delivery's transaction.
async fn apply(
    db: &mut PgConnection,
    run: i64,
    writer: Writer,
    transfer: Transfer,
) -> Result<i64, BoxError> {
    // Both accounts are updated in id order, so two transfers over the same pair cannot
    // deadlock.
    let mut legs = [
        (transfer.from, -transfer.amount),
        (transfer.to, transfer.amount),
    ];
    legs.sort_unstable();
    for (account, change) in legs {
        sqlx::query("UPDATE ledger_accounts SET balance = balance + $3 WHERE run = $1 AND id = $2")
            .bind(run)
            .bind(account)
            .bind(change)
            .execute(&mut *db)
            .await?;
    }
    let row = sqlx::query(
        "INSERT INTO ledger_transfers (run, transfer, from_account, to_account, amount, writer)
         VALUES ($1, $2, $3, $4, $5, $6) RETURNING (SELECT balance FROM ledger_accounts
                                                    WHERE run = $1 AND id = $3)",
    )
    .bind(run)
    .bind(i64::try_from(transfer.id)?)
    .bind(transfer.from)
    .bind(transfer.to)
    .bind(transfer.amount)
    .bind(writer)
    .fetch_one(&mut *db)
    .await?;
    Ok(row.try_get(0)?)
}

/// Whether this is the first time anyone reaches the crash point of `transfer` in this run
/// (recorded outside the transaction, so it survives the crash).
async fn first_to_crash(pool: &PgPool, run: i64, transfer: u64) -> Result<bool, BoxError> {
    let inserted = sqlx::query(
        "INSERT INTO ledger_crashes (run, transfer) VALUES ($1, $2) ON CONFLICT DO NOTHING",
    )
    .bind(run)
    .bind(i64::try_from(transfer)?)
    .execute(pool)
    .await?;
    Ok(inserted.rows_affected() == 1)
}

/// One delivery: the transfer and the unit's marker commit together, or neither does.
async fn deliver(
    store: &PostgresStore,
    run: i64,
    writer: Writer,
    transfer: Transfer,
) -> Result<Delivery, BoxError> {
    let pool = store.pool().clone();
    let executed = std::sync::atomic::AtomicBool::new(false);
    let transaction = pool.begin().await?;
    let _balance: i64 = TRANSFER
        .call(format!("transfer-{run}-{}", transfer.id))
        .fingerprint_of(&transfer)?
        .run_in_transaction(store.transaction(transaction), async |db| {
            executed.store(true, std::sync::atomic::Ordering::Relaxed);
            // Asked before the transfer takes its account locks, so this delivery's own
            // workers are not waiting on them for the connection it needs.
            let dying =
                transfer.id == CRASH_TRANSFER && first_to_crash(&pool, run, transfer.id).await?;
            let balance = apply(db, run, writer, transfer).await?;
            if dying {
                // The money has moved inside the transaction; the parent kills this process
                // on this line, before the commit.
                report(&Delivery {
                    transfer: transfer.id,
                    outcome: "dying".to_owned(),
                });
                std::future::pending::<()>().await;
            }
            Ok::<_, BoxError>(balance)
        })
        .await?;
    let outcome = if executed.into_inner() {
        "executed"
    } else {
        "replayed"
    };
    Ok(Delivery {
        transfer: transfer.id,
        outcome: outcome.to_owned(),
    })
}

fn report(delivery: &Delivery) {
    println!("{}", json!(delivery));
}

/// A worker process: every transfer, `COPIES` deliveries at once.
async fn worker(store: PostgresStore, run: i64, writer: Writer) -> Result<(), BoxError> {
    let mut deliveries = tokio::task::JoinSet::new();
    for transfer in transfers() {
        for _ in 0..COPIES {
            let store = store.clone();
            deliveries.spawn(async move {
                let delivery = deliver(&store, run, writer, transfer).await;
                report(&delivery.unwrap_or_else(|err| {
                    eprintln!("transfer {}: {err}", transfer.id);
                    Delivery {
                        transfer: transfer.id,
                        outcome: "failed".to_owned(),
                    }
                }));
            });
        }
    }
    while deliveries.join_next().await.transpose()?.is_some() {}
    Ok(())
}

/// Starts the workers, kills the one that reports it is dying, and collects every delivery.
async fn run_workers(
    url: &str,
    run: i64,
) -> Result<(Vec<(Writer, Delivery)>, Vec<Writer>), BoxError> {
    let (lines_tx, mut lines) = tokio::sync::mpsc::unbounded_channel();
    let mut children = Vec::new();
    for index in 0..WORKERS {
        let mut child = Command::new(std::env::current_exe()?)
            .args(["--worker", &run.to_string(), &index.to_string()])
            .env("DATABASE_URL", url)
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let mut stdout = BufReader::new(child.stdout.take().ok_or("no stdout")?).lines();
        let lines_tx = lines_tx.clone();
        tokio::spawn(async move {
            while let Ok(Some(line)) = stdout.next_line().await {
                if lines_tx.send((index, line)).is_err() {
                    break;
                }
            }
        });
        children.push(child);
    }
    drop(lines_tx);
    let mut deliveries = Vec::new();
    let mut killed = Vec::new();
    // Every line until every worker's stdout closed: the killed worker's with its death.
    while let Some((index, line)) = lines.recv().await {
        let delivery: Delivery = serde_json::from_str(&line)?;
        if delivery.outcome == "dying" {
            // SIGKILL, as `kill -9`: the connection drops mid-transaction.
            children[index].start_kill()?;
            killed.push(Writer::try_from(index)?);
        }
        deliveries.push((Writer::try_from(index)?, delivery));
    }
    for (index, child) in children.iter_mut().enumerate() {
        let status = child.wait().await?;
        if !status.success() && !killed.contains(&Writer::try_from(index)?) {
            return Err(format!("worker {index} failed: {status}").into());
        }
    }
    Ok((deliveries, killed))
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let url = std::env::var("DATABASE_URL")
        .map_err(|_| "set DATABASE_URL: this example needs a PostgreSQL server")?;
    let pool = PgPoolOptions::new()
        .max_connections(12)
        .connect(&url)
        .await?;
    let builder = PostgresStore::builder(pool.clone());
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [flag, run, writer] = args.as_slice()
        && flag == "--worker"
    {
        return worker(builder.connect().await?, run.parse()?, writer.parse()?).await;
    }

    let started = Instant::now();
    builder.migrate().await?;
    let store = builder.connect().await?;
    let run = i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_micros(),
    )?;
    prepare(&pool, run).await?;
    let (mut deliveries, killed) =
        tokio::time::timeout(Duration::from_secs(120), run_workers(&url, run))
            .await
            .map_err(|_| "the workers did not finish within 120 s")??;
    // The queue redelivers what the dead worker had in flight; here, everything once more.
    for transfer in transfers() {
        deliveries.push((LAST_PASS, deliver(&store, run, LAST_PASS, transfer).await?));
    }

    let written: Vec<(i64, i64)> = sqlx::query_as(
        "SELECT transfer, count(*) FROM ledger_transfers WHERE run = $1 GROUP BY transfer",
    )
    .bind(run)
    .fetch_all(&pool)
    .await?;
    let rows_written: i64 = written.iter().map(|(_, rows)| rows).sum();
    let duplicates: i64 = written.iter().map(|(_, rows)| rows - 1).sum();
    // A killed worker may have committed transfers whose `executed` line it never printed.
    let written_by_killed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM ledger_transfers WHERE run = $1 AND writer = ANY($2)",
    )
    .bind(run)
    .bind(&killed)
    .fetch_one(&pool)
    .await?;
    let balances: BTreeMap<i64, i64> =
        sqlx::query_as("SELECT id, balance FROM ledger_accounts WHERE run = $1")
            .bind(run)
            .fetch_all(&pool)
            .await?
            .into_iter()
            .collect();
    let mut expected: BTreeMap<i64, i64> = (0..ACCOUNTS).map(|id| (id, OPENING_BALANCE)).collect();
    for transfer in transfers() {
        *expected.entry(transfer.from).or_default() -= transfer.amount;
        *expected.entry(transfer.to).or_default() += transfer.amount;
    }
    let count = |outcome: &str| {
        deliveries
            .iter()
            .filter(|(_, d)| d.outcome == outcome)
            .count()
    };
    let executed_by_survivors = deliveries
        .iter()
        .filter(|(writer, d)| d.outcome == "executed" && !killed.contains(writer))
        .count();
    let summary = json!({
        "transfers": TRANSFERS,
        "deliveries": deliveries.len(),
        "executed": count("executed"),
        "replayed": count("replayed"),
        "failed": count("failed"),
        "killed_mid_transaction": killed.len(),
        "written_by_killed": written_by_killed,
        "executed_by_survivors": executed_by_survivors,
        "rows_written": rows_written,
        "duplicates": duplicates,
        "balance_ok": balances == expected,
        "elapsed_ms": started.elapsed().as_millis(),
    });
    println!("{summary}");
    if u64::try_from(rows_written)? != TRANSFERS || duplicates != 0 || balances != expected {
        return Err(format!("the ledger is wrong: {summary}").into());
    }
    Ok(())
}
