//! The benchmark: prints one JSON object per measurement.
//!
//! ```text
//! cargo run --release -p idempotask-bench -- --redis-url redis://127.0.0.1:6379 \
//!     --mode fresh --tasks 20000 --concurrency 64 [--rounds 3] [--markdown results.md]
//! ```
//!
//! With `--cluster`, `--redis-url` is a comma-separated list of seed nodes of a Redis Cluster:
//! the tasks run through `RedisClusterStore`, the hand-written pattern through the same cluster
//! connection, and the server figures are summed over the masters.
//!
//! Modes: `fresh`, `duplicate`, `contended`, `handwritten-fresh`, `handwritten-duplicate`,
//! `steps` and `handwritten-steps` (a unit of three steps), `latency`, `scaling`, `all`; and
//! `quorum`, where `--redis-url` lists 3 or 5 independent servers for a `RedlockStore`.
//! `--markdown` also writes the tables of `docs/performance.md`; `scripts/bench.sh` runs the
//! whole set against a Redis of its own.
//!
//! With `--sweep 1,4,16,64,256`, the sweep runs instead (`idempotask_bench::sweep`): idempotask
//! and the hand-written pattern over N fresh keys at each of those numbers in flight, back to
//! back, for `--rounds` rounds, one JSON line per point.
//!
//! With `--database-url`, the PostgreSQL modes run instead (`PostgresStore`, transactional
//! completion and their hand-written counterparts, every round); `scripts/bench-postgres.sh`
//! runs them against a PostgreSQL of its own.

use idempotask_bench::postgres::{self, PgConfig};
use idempotask_bench::sweep::{self, SweepConfig};
use idempotask_bench::{self as bench, Config, Mode, report};

const USAGE: &str = "usage: bench (--redis-url URL[,URL…] [--cluster] --mode MODE | --database-url URL) --tasks N --concurrency C [--rounds R] [--markdown PATH] [--sweep 1,4,16,64,256]";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut config = Config {
        redis_url: "redis://127.0.0.1:6379".to_owned(),
        cluster: false,
        mode: Mode::All,
        tasks: 10_000,
        concurrency: 64,
        rounds: 3,
    };
    let mut markdown = None;
    let mut database_url = None;
    let mut sweep_concurrency = None;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || {
            args.next()
                .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))
        };
        match flag.as_str() {
            "--redis-url" => config.redis_url = value()?,
            "--cluster" => config.cluster = true,
            "--database-url" => database_url = Some(value()?),
            "--mode" => config.mode = value()?.parse()?,
            "--tasks" => config.tasks = value()?.parse()?,
            "--concurrency" => config.concurrency = value()?.parse()?,
            "--rounds" => config.rounds = value()?.parse()?,
            "--markdown" => markdown = Some(value()?),
            "--sweep" => {
                let list: Vec<usize> = value()?
                    .split(',')
                    .map(str::parse)
                    .collect::<Result<_, _>>()?;
                sweep_concurrency = Some(list);
            }
            "-h" | "--help" => {
                println!("{USAGE}\nmodes: {}", Mode::NAMES.join(", "));
                return Ok(());
            }
            other => return Err(format!("unknown argument `{other}`\n{USAGE}").into()),
        }
    }
    if let Some(concurrency) = sweep_concurrency {
        let config = SweepConfig {
            redis_url: config.redis_url,
            tasks: config.tasks,
            concurrency,
            rounds: config.rounds,
        };
        sweep::sweep(&config, Vec::new(), |point| {
            println!("{}", serde_json::to_string(point).unwrap_or_default());
        })
        .await?;
        return Ok(());
    }
    if let Some(database_url) = database_url {
        let config = PgConfig {
            database_url,
            tasks: config.tasks,
            concurrency: config.concurrency,
            rounds: config.rounds,
        };
        let measurements = postgres::run(&config, |m| {
            println!("{}", serde_json::to_string(m).unwrap_or_default());
        })
        .await?;
        if let Some(path) = markdown {
            std::fs::write(path, postgres::markdown(&measurements))?;
        }
        return Ok(());
    }
    let measurements = bench::run(&config, |m| {
        println!("{}", serde_json::to_string(m).unwrap_or_default());
    })
    .await?;
    if let Some(path) = markdown {
        std::fs::write(path, report::markdown(&measurements))?;
    }
    Ok(())
}
