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

use std::fmt::Write as _;

use axum::routing::post;
use idempotask_bench::http::{self, Keys, Row, Workload};
use idempotask_redis::RedisStore;
use idempotent::middleware::IdempotencyLayer;
use idempotent::valkey::ValkeyStore;

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

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    http::main(workloads(), app, ratios).await
}
