//! idempotask-http's layer against the `idempotent` crate's, on one axum app, one Redis, one
//! run: the routes and workloads of `idempotask_bench::http` (no layer, our layer on fresh keys
//! and on duplicates) and the same handler under `idempotent::middleware::IdempotencyLayer` on
//! its `ValkeyStore` over the same Redis, on fresh keys and on duplicates. Prints the table of
//! `idempotask_bench::http::markdown`, then the ratios the targets of `docs/performance-http.md` name.
//!
//! ```text
//! cargo run --release --ignore-rust-version --manifest-path bench/http-compare/Cargo.toml -- \
//!     --redis-url redis://127.0.0.1:6379 [--requests 20000] [--concurrency 64] [--rounds 3]
//! ```
//!
//! `--serve ADDR` (with `--redis-url`) only serves and `--load URL` only loads, as for
//! `http-bench`; `scripts/bench-http.sh` runs both ways.
//!
//! `--sweep 1,4,16,64,256` measures tasks, not requests: `idempotask_bench::sweep` (idempotask
//! and the hand-written pattern) with the `idempotent` crate's own claim beside them, over N
//! fresh keys at each number in flight, one JSON line per point; `scripts/bench-plot.sh` draws
//! them.
//!
//! ```text
//! cargo run --release --ignore-rust-version --manifest-path bench/http-compare/Cargo.toml -- \
//!     --sweep 1,4,16,64,256 --redis-url redis://127.0.0.1:6379 [--tasks 3000] [--rounds 3]
//! ```

use std::fmt::Write as _;
use std::time::Duration;

use axum::routing::post;
use idempotask_bench::BenchError;
use idempotask_bench::http::{self, Keys, Row, Workload};
use idempotask_bench::sweep::{self, Contender, SweepConfig};
use idempotask_redis::RedisStore;
use idempotent::middleware::IdempotencyLayer;
use idempotent::valkey::ValkeyStore;
use idempotent::{ExecutionOutcome, IdempotencyKey, IdempotencyStore};

/// Every workload: ours first, then `idempotent`'s on `/idempotent`.
fn workloads() -> Vec<Workload> {
    let mut all = http::workloads();
    all.extend([
        Workload {
            id: "idempotent-fresh",
            name: "idempotent 2.0, fresh keys",
            path: "/idempotent",
            keys: Keys::Fresh,
        },
        Workload {
            id: "idempotent-duplicates",
            name: "idempotent 2.0, duplicates",
            path: "/idempotent",
            keys: Keys::Duplicates,
        },
    ]);
    all
}

/// Our app with `/idempotent` merged in: the same handler under `idempotent`'s layer with its
/// defaults, which are ours where the two have the same setting: the `Idempotency-Key` header,
/// a 60 s processing lease renewed while the handler runs, responses kept 24 h, the body in the
/// fingerprint (xxHash3 of method, path, query and body; ours: SHA-256 of the body). It has no
/// setting for what ours does not do, and always does what ours leaves off by default: a
/// fencing token per claim (an `INCR` and an `INFO server` in its claim script).
async fn app(redis_url: String) -> Result<http::Router, Box<dyn std::error::Error>> {
    let ours = RedisStore::connect(&redis_url).await?;
    let theirs = ValkeyStore::with_url(redis_url)
        .prefix("idempotent_bench")
        .try_build()
        .await?;
    let compared = http::Router::new().route(
        "/idempotent",
        post(http::handler).layer(IdempotencyLayer::new(theirs)),
    );
    Ok(http::router(ours).merge(compared))
}

/// The ratios of the targets, from the rows of this one run.
fn ratios(rows: &[Row]) -> String {
    let rate = |id: &str| {
        rows.iter()
            .find(|row| row.workload.id == id)
            .map(|row| row.best.per_second)
    };
    let mut out = String::new();
    for (what, over, under) in [
        ("idempotask-http fresh / no layer", "fresh", "plain"),
        (
            "idempotask-http duplicates / no layer",
            "duplicates",
            "plain",
        ),
        (
            "idempotask-http fresh / idempotent fresh",
            "fresh",
            "idempotent-fresh",
        ),
        (
            "idempotask-http duplicates / idempotent duplicates",
            "duplicates",
            "idempotent-duplicates",
        ),
        (
            "idempotask-http fresh, renewal off / idempotent fresh",
            "fresh-unrenewed",
            "idempotent-fresh",
        ),
        (
            "idempotask-http fresh, renewal through blocking / idempotent fresh",
            "fresh-through-blocking",
            "idempotent-fresh",
        ),
        ("idempotent fresh / no layer", "idempotent-fresh", "plain"),
        (
            "idempotent duplicates / no layer",
            "idempotent-duplicates",
            "plain",
        ),
    ] {
        if let (Some(over), Some(under)) = (rate(over), rate(under)) {
            let _ = writeln!(out, "| {what} | {:.2}× |", over / under);
        }
    }
    // With `--workload`, a pair may be missing; no pair, no table.
    if out.is_empty() {
        return out;
    }
    format!("\n| ratio of requests/s | value |\n| --- | ---: |\n{out}")
}

/// The `idempotent` crate's task: its JSON claim over the key `(run, id)` with a `()` value,
/// the closest it has to `#[idempotent_task]` (a claim script with a fencing token, the value
/// stored on completion). Its leases are the layer's above: 60 s processing, 24 h completed.
async fn idempotent_task(store: ValkeyStore, run: u64, id: u64) -> Result<(), BenchError> {
    let failed = |err: &dyn std::error::Error| BenchError(format!("idempotent: {err}"));
    let key = IdempotencyKey::new(format!("{run}-{id}")).map_err(|err| failed(&err))?;
    let outcome = store
        .claim(&key, Duration::from_mins(1))
        .fingerprint("bench_task", b"")
        .json()
        .execute_or_replay(Duration::from_hours(24), |_token| async { Ok(()) })
        .await
        .map_err(|err| failed(&err))?;
    match outcome {
        ExecutionOutcome::Executed(()) => Ok(()),
        _ => Err(BenchError(format!(
            "idempotent: fresh key {key:?} did not execute"
        ))),
    }
}

/// `--sweep`: idempotask, the hand-written pattern and the `idempotent` crate, by tasks in
/// flight.
async fn sweep(args: &[String]) -> Result<(), Box<dyn std::error::Error>> {
    let mut config = SweepConfig {
        redis_url: "redis://127.0.0.1:6379".to_owned(),
        tasks: 3000,
        concurrency: sweep::SWEEP_CONCURRENCY.to_vec(),
        rounds: 3,
    };
    let mut args = args.iter();
    while let Some(flag) = args.next() {
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--sweep" => {
                config.concurrency = value.split(',').map(str::parse).collect::<Result<_, _>>()?;
            }
            "--redis-url" => config.redis_url.clone_from(value),
            "--tasks" => config.tasks = value.parse()?,
            "--rounds" => config.rounds = value.parse()?,
            other => return Err(format!("`{other}` does not go with --sweep").into()),
        }
    }
    let store = ValkeyStore::with_url(config.redis_url.clone())
        .prefix("idempotent_sweep")
        .try_build()
        .await?;
    let theirs = Contender::new("idempotent 2.0", move |run, id| {
        idempotent_task(store.clone(), run, id)
    });
    sweep::sweep(&config, vec![theirs], |point| {
        println!("{}", serde_json::to_string(point).unwrap_or_default());
    })
    .await?;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|arg| arg == "--sweep") {
        return sweep(&args).await;
    }
    http::main(workloads(), app, ratios).await
}
