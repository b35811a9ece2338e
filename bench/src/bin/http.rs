//! The HTTP layer's cost: requests per second and latency percentiles of one axum service at
//! `--concurrency` clients, without the layer, with it on fresh keys, and with it on
//! duplicates (every key already answered), against the Redis at `--redis-url`. The handler
//! does 1 ms of work (an await, as a call to another service would). Prints a Markdown table.
//!
//! ```text
//! cargo run --release -p idempotask-bench --bin http-bench -- \
//!     --redis-url redis://127.0.0.1:6379 --requests 20000 --concurrency 64 [--rounds 3]
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::post;
use idempotask::Task;
use idempotask_http::Idempotency;
use idempotask_redis::RedisStore;

const USAGE: &str =
    "usage: http-bench --redis-url URL [--requests N] [--concurrency C] [--rounds R]";

/// What one run sends.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Workload {
    NoLayer,
    Fresh,
    Duplicates,
}

impl Workload {
    fn name(self) -> &'static str {
        match self {
            Self::NoLayer => "no layer",
            Self::Fresh => "layer, fresh keys",
            Self::Duplicates => "layer, duplicates",
        }
    }

    fn path(self) -> &'static str {
        match self {
            Self::NoLayer => "/plain",
            Self::Fresh | Self::Duplicates => "/keyed",
        }
    }
}

struct Figures {
    per_second: f64,
    p50: Duration,
    p99: Duration,
}

async fn handler(body: String) -> (http::StatusCode, String) {
    tokio::time::sleep(Duration::from_millis(1)).await;
    (
        http::StatusCode::CREATED,
        format!("{{\"paid\":{}}}", body.len()),
    )
}

/// `requests` requests from `concurrency` clients, each sending its share one after another.
async fn measure(
    base: &str,
    workload: Workload,
    run: u64,
    requests: u64,
    concurrency: u64,
) -> Figures {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(usize::try_from(concurrency).unwrap_or(usize::MAX))
        .build()
        .expect("a client");
    let next = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut clients = tokio::task::JoinSet::new();
    for _ in 0..concurrency {
        let (client, next) = (client.clone(), Arc::clone(&next));
        let url = format!("{base}{}", workload.path());
        clients.spawn(async move {
            let mut latencies = Vec::new();
            loop {
                let index = next.fetch_add(1, Ordering::Relaxed);
                if index >= requests {
                    return latencies;
                }
                let key = match workload {
                    Workload::Duplicates => format!("dup-{}", index % concurrency),
                    _ => format!("run-{run}-{index}"),
                };
                let sent = Instant::now();
                let response = client
                    .post(&url)
                    .header("idempotency-key", key)
                    .body("{\"amount\":4200}")
                    .send()
                    .await
                    .expect("the server answers");
                assert_eq!(response.status(), 201, "{}", workload.name());
                let _ = response.bytes().await.expect("a body");
                latencies.push(sent.elapsed());
            }
        });
    }
    let mut latencies = Vec::new();
    while let Some(done) = clients.join_next().await {
        latencies.extend(done.expect("a client"));
    }
    let elapsed = started.elapsed();
    latencies.sort_unstable();
    let at = |q: f64| {
        #[allow(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            clippy::cast_precision_loss,
            reason = "an index into a sorted list of at most a few million latencies"
        )]
        let index = ((latencies.len() as f64 - 1.0) * q).round() as usize;
        latencies[index]
    };
    #[allow(clippy::cast_precision_loss, reason = "a request count")]
    let per_second = latencies.len() as f64 / elapsed.as_secs_f64();
    Figures {
        per_second,
        p50: at(0.50),
        p99: at(0.99),
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (mut redis_url, mut requests, mut concurrency, mut rounds) = (None, 20_000, 64, 3);
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or(USAGE)?;
        match flag.as_str() {
            "--redis-url" => redis_url = Some(value),
            "--requests" => requests = value.parse()?,
            "--concurrency" => concurrency = value.parse()?,
            "--rounds" => rounds = value.parse()?,
            _ => return Err(USAGE.into()),
        }
    }
    let redis_url = redis_url.ok_or(USAGE)?;
    let store = RedisStore::connect(&redis_url).await?;
    let layer = Idempotency::new(Task::new("http_bench")).store(store);
    let app = Router::new()
        .route("/plain", post(handler))
        .route("/keyed", post(handler).layer(layer));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });

    // The duplicates' keys, answered once before any round.
    let run = u64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_millis(),
    )?;
    measure(&base, Workload::Duplicates, run, concurrency, concurrency).await;

    println!("| workload | requests/s | p50 | p99 |");
    println!("| --- | ---: | ---: | ---: |");
    for workload in [Workload::NoLayer, Workload::Fresh, Workload::Duplicates] {
        let mut best: Option<Figures> = None;
        for round in 0..rounds {
            let figures = measure(&base, workload, run + 1 + round, requests, concurrency).await;
            if best
                .as_ref()
                .is_none_or(|b| figures.per_second > b.per_second)
            {
                best = Some(figures);
            }
        }
        let best = best.ok_or("no rounds")?;
        println!(
            "| {} | {:.0} | {:.2} ms | {:.2} ms |",
            workload.name(),
            best.per_second,
            best.p50.as_secs_f64() * 1000.0,
            best.p99.as_secs_f64() * 1000.0,
        );
    }
    Ok(())
}
