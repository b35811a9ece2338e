//! Exactly once for database work: transfers whose ledger writes commit together with their
//! completion marker, in one PostgreSQL transaction (`Call::run_in_transaction`).
//!
//! It delivers each of 40 transfers between 8 accounts twice at once, as a queue may: the
//! transfer's writes and the unit's row in idempotask's table commit together or not at all, so
//! the second delivery waits on the first and replays it; the ledger has no `UNIQUE` constraint.
//! It prints `transfer 7: executed` or `… replayed` per delivery; run again, it replays them all.
//!
//! ```text
//! DATABASE_URL=postgres://postgres@127.0.0.1/postgres \
//!     cargo run --example ledger_transfer --features postgres
//! ```
//! `tests/example_queues.rs` kills a copy with SIGKILL inside the transaction of transfer 7, the
//! money moved and not committed (`CRASH_BEFORE_COMMIT=7` waits there), while two more copies
//! run: they write it once PostgreSQL has aborted the dead transaction.
//!
//! ```toml
//! [dependencies]
//! idempotask = "0.1"
//! idempotask-postgres = "0.1"
//! serde = { version = "1", features = ["derive"] }
//! sqlx = { version = "0.9", default-features = false, features = ["postgres", "runtime-tokio"] }
//! tokio = { version = "1", features = ["macros", "rt-multi-thread"] }
//! ```

use idempotask::Task;
use idempotask_postgres::PostgresStore;
use sqlx::{PgPool, postgres::PgConnection};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Transfers between the 8 accounts that [`LEDGER`] opens, each delivered twice at once.
const TRANSFERS: i64 = 40;
const COPIES: usize = 2;
/// The accounts and the ledger, in one transaction that copies started at once take in turn.
/// `worker` is the process that wrote the row. No `UNIQUE` constraint on `transfer`: the unit's
/// row, committed with it, is what keeps a transfer from being written twice.
const LEDGER: &str = "SELECT pg_advisory_xact_lock(8);
    CREATE TABLE IF NOT EXISTS ledger_accounts (id bigint PRIMARY KEY, balance bigint NOT NULL);
    -- Only when empty: ON CONFLICT would wait on accounts a running transfer has locked.
    INSERT INTO ledger_accounts SELECT generate_series(0, 7), 10000
        WHERE NOT EXISTS (SELECT FROM ledger_accounts);
    CREATE TABLE IF NOT EXISTS ledger_transfers (transfer bigint NOT NULL,
        from_account bigint NOT NULL, to_account bigint NOT NULL, amount bigint NOT NULL,
        worker bigint NOT NULL);";

static TRANSFER: Task = Task::new("ledger_transfer");

/// One transfer, decided by the producer; its id is the idempotency key.
#[derive(Clone, Copy, serde::Serialize)]
struct Transfer {
    id: i64,
    from: i64,
    to: i64,
    amount: i64,
}

/// The producer's transfer `id`, the same in every process.
fn transfer(id: i64) -> Transfer {
    let from = id % 8;
    let (to, amount) = ((from + 1 + id % 5) % 8, 100 + id * 37 % 400);
    Transfer {
        id,
        from,
        to,
        amount,
    }
}

/// One delivery: the transfer's writes and the unit's marker commit together, or neither does.
async fn deliver(store: &PostgresStore, t: Transfer, crash: bool) -> Result<&str, BoxError> {
    let mut executed = false;
    let body = async |db: &mut PgConnection| {
        executed = true;
        // Both accounts in id order, so two transfers over the same pair cannot deadlock.
        let mut legs = [(t.from, -t.amount), (t.to, t.amount)];
        legs.sort_unstable();
        for (account, change) in legs {
            sqlx::query("UPDATE ledger_accounts SET balance = balance + $2 WHERE id = $1")
                .bind(account)
                .bind(change)
                .execute(&mut *db)
                .await?;
        }
        sqlx::query("INSERT INTO ledger_transfers VALUES ($1, $2, $3, $4, $5)")
            .bind(t.id)
            .bind(t.from)
            .bind(t.to)
            .bind(t.amount)
            .bind(i64::from(std::process::id()))
            .execute(&mut *db)
            .await?;
        if crash {
            // The money has moved inside the transaction: wait there for the SIGKILL.
            println!("transfer {}: moved, crashing before the commit", t.id);
            std::future::pending::<()>().await;
        }
        Ok::<_, BoxError>(())
    };
    let transaction = store.transaction(store.pool().begin().await?);
    let key = format!("transfer-{}", t.id);
    let call = TRANSFER.call(key).fingerprint_of(&t)?;
    call.run_in_transaction(transaction, body).await?;
    Ok(if executed { "executed" } else { "replayed" })
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let url = std::env::var("DATABASE_URL").map_err(|_| "set DATABASE_URL")?;
    let pool = PgPool::connect(&url).await?;
    sqlx::raw_sql(LEDGER).execute(&pool).await?;
    let builder = PostgresStore::builder(pool);
    builder.migrate().await?;
    let store = builder.connect().await?;
    // `CRASH_BEFORE_COMMIT=<transfer>`: that transfer's execution here never commits.
    let crash = std::env::var("CRASH_BEFORE_COMMIT").ok();
    let crash: Option<i64> = crash.and_then(|id| id.parse().ok());
    println!("delivering {TRANSFERS} transfers, {COPIES} at once each");
    let mut deliveries = tokio::task::JoinSet::new();
    for transfer in (0..TRANSFERS).map(transfer) {
        for _ in 0..COPIES {
            let store = store.clone();
            deliveries.spawn(async move {
                let id = transfer.id;
                match deliver(&store, transfer, crash == Some(id)).await {
                    Ok(what) => println!("transfer {id}: {what}"),
                    Err(err) => println!("transfer {id}: failed: {err}"),
                }
            });
        }
    }
    deliveries.join_all().await;
    Ok(())
}
