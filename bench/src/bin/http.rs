//! The HTTP layer's cost: requests per second and latency percentiles of one axum service at
//! `--concurrency` clients, without the layer, with it on fresh keys, and with it on
//! duplicates (every key already answered), against the Redis at `--redis-url`. The handler
//! does 1 ms of work (an await, as a call to another service would). Prints a Markdown table.
//! The measuring is `idempotask_bench::http`; `bench/http-compare` runs the same with the
//! `idempotent` crate's layer beside ours.
//!
//! ```text
//! cargo run --release -p idempotask-bench --bin http-bench -- \
//!     --redis-url redis://127.0.0.1:6379 --requests 20000 --concurrency 64 [--rounds 3]
//! ```
//!
//! `--serve ADDR` only serves (with `--redis-url`), `--load URL` only loads, so that server and
//! clients can run as two processes on cores of their own.

use idempotask_bench::http;
use idempotask_redis::RedisStore;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    http::main(
        http::workloads(),
        |redis_url| async move { Ok(http::router(RedisStore::connect(&redis_url).await?)) },
        |_| String::new(),
    )
    .await
}
