//! The HTTP layer's cost: requests per second and latency percentiles of one axum app at C
//! concurrent reqwest clients, route by route. The handler awaits 1 ms (as a call to another
//! service would) and answers `201`.
//!
//! `src/bin/http.rs` (`http-bench`) measures [`workloads`] on [`router`]: no layer, the layer
//! on fresh keys, the layer on duplicates, and the layer on fresh keys without lock renewal
//! and with renewal through blocking.
//! `bench/http-compare`, a crate outside the workspace (its dependency declares a newer
//! `rust-version` than the workspace's), merges the `idempotent` crate's layer into the same app
//! and adds its workloads, so every row comes from one run.
//!
//! [`main`] is the command line of both: one process serving and loading by default, or
//! `--serve ADDR` and `--load URL` as two processes, so that a script can pin them to cores of
//! their own.

use std::error::Error;
use std::fmt::Write as _;
use std::future::Future;
use std::io::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::routing::post;
use idempotask::{LockRenewal, Task};
use idempotask_http::Idempotency;
use idempotask_redis::RedisStore;

pub use axum::Router;

use crate::BenchError;

/// The handler's awaited work.
pub const HANDLER_WORK: Duration = Duration::from_millis(1);

/// The body every request sends.
pub const REQUEST_BODY: &str = "{\"amount\":4200}";

/// The lock TTL of the layer's task, the same as `idempotent`'s default processing lease (the
/// core's default is 30 s); the result TTL is the core's default, 24 h, `idempotent`'s too.
pub const LOCK_TTL: Duration = Duration::from_secs(60);

/// The handler of every route: [`HANDLER_WORK`] of awaiting, then `201` and a small body.
pub async fn handler(body: String) -> (::http::StatusCode, String) {
    tokio::time::sleep(HANDLER_WORK).await;
    (
        ::http::StatusCode::CREATED,
        format!("{{\"paid\":{}}}", body.len()),
    )
}

/// How a workload's requests pick their `Idempotency-Key`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keys {
    /// A key no request has sent before.
    Fresh,
    /// One of C keys, each answered once before the first round, so every request is a replay.
    Duplicates,
}

/// One row of the table: what it is called, the route it posts to, how it picks keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workload {
    /// The short name `--workload` selects it by.
    pub id: &'static str,
    /// The name in the table.
    pub name: &'static str,
    /// The route, e.g. `/keyed`.
    pub path: &'static str,
    /// How its requests pick keys.
    pub keys: Keys,
}

/// No layer, the layer on fresh keys, the layer on duplicates, and the layer on fresh keys with
/// lock renewal off (what renewal costs a request) and through blocking (a watchdog task and a
/// hand-off per poll, `LockRenewal::Watchdog`): the routes of [`router`].
pub fn workloads() -> Vec<Workload> {
    vec![
        Workload {
            id: "plain",
            name: "no layer",
            path: "/plain",
            keys: Keys::Fresh,
        },
        Workload {
            id: "fresh",
            name: "idempotask-http, fresh keys",
            path: "/keyed",
            keys: Keys::Fresh,
        },
        Workload {
            id: "duplicates",
            name: "idempotask-http, duplicates",
            path: "/keyed",
            keys: Keys::Duplicates,
        },
        Workload {
            id: "fresh-unrenewed",
            name: "idempotask-http, fresh keys, renewal off",
            path: "/keyed-unrenewed",
            keys: Keys::Fresh,
        },
        Workload {
            id: "fresh-through-blocking",
            name: "idempotask-http, fresh keys, renewal through blocking",
            path: "/keyed-through-blocking",
            keys: Keys::Fresh,
        },
    ]
}

/// The app of [`workloads`]: `/plain` is [`handler`] alone, `/keyed` the same handler under
/// [`Idempotency`] on `store` (default settings but the [`LOCK_TTL`]: the `Idempotency-Key`
/// header, the body's SHA-256 in the fingerprint, lock renewal on, in the handler's task);
/// `/keyed-unrenewed` the same without renewal, `/keyed-through-blocking` with renewal that
/// holds through a blocking handler. Callers merge routes of their own into it.
pub fn router(store: RedisStore) -> Router {
    let layer = Idempotency::new(Task::new("http_bench").lock_ttl(LOCK_TTL)).store(store);
    let unrenewed = layer.clone().lock_renewal(LockRenewal::Off);
    let through_blocking = layer.clone().lock_renewal(LockRenewal::Watchdog);
    Router::new()
        .route("/plain", post(handler))
        .route("/keyed", post(handler).layer(layer))
        .route("/keyed-unrenewed", post(handler).layer(unrenewed))
        .route(
            "/keyed-through-blocking",
            post(handler).layer(through_blocking),
        )
}

/// What one measurement of one workload gave.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Figures {
    /// Requests answered per second of wall time.
    pub per_second: f64,
    /// The median request's time, sent to body read.
    pub p50: Duration,
    /// The 99th percentile.
    pub p99: Duration,
}

/// How much to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Load {
    /// Requests per measurement.
    pub requests: u64,
    /// Clients sending at once, each its share one request after another.
    pub concurrency: u64,
    /// Measurements of each workload; the best (by requests/s) is reported.
    pub rounds: u64,
}

/// Input: a base URL and a workload. Output: `load.requests` requests to its route from
/// `load.concurrency` clients, timed. `run` keeps keys apart from other measurements.
///
/// # Errors
/// When a request fails or is answered with another status than `201`.
pub async fn measure(
    base: &str,
    workload: &Workload,
    run: u64,
    requests: u64,
    concurrency: u64,
) -> Result<Figures, BenchError> {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(usize::try_from(concurrency).unwrap_or(usize::MAX))
        .build()
        .map_err(|err| BenchError(format!("http client: {err}")))?;
    let next = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut clients = tokio::task::JoinSet::new();
    for _ in 0..concurrency {
        let (client, next) = (client.clone(), Arc::clone(&next));
        let url = format!("{base}{}", workload.path);
        let (keys, name) = (workload.keys, workload.name);
        clients.spawn(async move {
            let mut latencies = Vec::new();
            loop {
                let index = next.fetch_add(1, Ordering::Relaxed);
                if index >= requests {
                    return Ok::<_, BenchError>(latencies);
                }
                let key = match keys {
                    Keys::Duplicates => format!("dup-{run}-{}", index % concurrency),
                    Keys::Fresh => format!("run-{run}-{index}"),
                };
                let sent = Instant::now();
                let response = client
                    .post(&url)
                    .header("idempotency-key", key)
                    .body(REQUEST_BODY)
                    .send()
                    .await
                    .map_err(|err| BenchError(format!("{name}: {err}")))?;
                let status = response.status();
                let body = response
                    .bytes()
                    .await
                    .map_err(|err| BenchError(format!("{name}: {err}")))?;
                if status != 201 {
                    return Err(BenchError(format!(
                        "{name}: answered {status}: {}",
                        String::from_utf8_lossy(&body)
                    )));
                }
                latencies.push(sent.elapsed());
            }
        });
    }
    let mut latencies = Vec::new();
    while let Some(done) = clients.join_next().await {
        latencies.extend(done.map_err(|err| BenchError(format!("a client: {err}")))??);
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
        latencies.get(index).copied().unwrap_or_default()
    };
    #[allow(clippy::cast_precision_loss, reason = "a request count")]
    let per_second = latencies.len() as f64 / elapsed.as_secs_f64();
    Ok(Figures {
        per_second,
        p50: at(0.50),
        p99: at(0.99),
    })
}

/// One workload's best measurement.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// What was measured.
    pub workload: Workload,
    /// Its best round, by requests/s.
    pub best: Figures,
}

/// Input: a served app and its workloads. Output: each workload's best of `load.rounds`
/// measurements. Every round measures every workload, forwards in odd rounds and backwards in
/// even ones, so a machine getting busier or quieter during the run favours none of them.
/// The duplicates' keys are answered once before the first round.
///
/// # Errors
/// When a request fails or gets another status than `201`.
pub async fn run(base: &str, workloads: &[Workload], load: Load) -> Result<Vec<Row>, BenchError> {
    let run = u64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_err(|err| BenchError(err.to_string()))?
            .as_millis(),
    )
    .map_err(|err| BenchError(err.to_string()))?;
    for workload in workloads.iter().filter(|w| w.keys == Keys::Duplicates) {
        measure(base, workload, run, load.concurrency, load.concurrency).await?;
    }
    let mut best: Vec<Option<Figures>> = vec![None; workloads.len()];
    let mut measured = 0;
    for round in 0..load.rounds {
        let mut order: Vec<usize> = (0..workloads.len()).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        for index in order {
            measured += 1;
            // Fresh keys never repeat: each measurement has a run number of its own. Duplicates
            // send the keys answered before the first round.
            let keys_of = match workloads[index].keys {
                Keys::Fresh => run + measured,
                Keys::Duplicates => run,
            };
            let figures = measure(
                base,
                &workloads[index],
                keys_of,
                load.requests,
                load.concurrency,
            )
            .await?;
            if best[index].is_none_or(|b| figures.per_second > b.per_second) {
                best[index] = Some(figures);
            }
        }
    }
    workloads
        .iter()
        .zip(best)
        .map(|(workload, best)| {
            Ok(Row {
                workload: workload.clone(),
                best: best.ok_or_else(|| BenchError("no rounds".into()))?,
            })
        })
        .collect()
}

/// The Markdown table of `rows`, with each row's requests/s as a multiple of the first row's.
pub fn markdown(rows: &[Row]) -> String {
    let mut out = String::from(
        "| workload | requests/s | × first row | p50 | p99 |\n| --- | ---: | ---: | ---: | ---: |\n",
    );
    let first = rows.first().map_or(0.0, |row| row.best.per_second);
    for row in rows {
        let ratio = if first > 0.0 {
            row.best.per_second / first
        } else {
            0.0
        };
        let _ = writeln!(
            out,
            "| {} | {} | {ratio:.2}× | {:.2} ms | {:.2} ms |",
            row.workload.name,
            thousands(row.best.per_second),
            row.best.p50.as_secs_f64() * 1000.0,
            row.best.p99.as_secs_f64() * 1000.0,
        );
    }
    out
}

/// `18391.6` as `18 392`, the docs' way.
fn thousands(value: f64) -> String {
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "a rate of requests per second, far below 2^53"
    )]
    let whole = value.round().max(0.0) as u64;
    let digits = whole.to_string();
    let mut out = String::new();
    for (index, digit) in digits.chars().enumerate() {
        if index > 0 && (digits.len() - index).is_multiple_of(3) {
            out.push(' ');
        }
        out.push(digit);
    }
    out
}

/// What the command line asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// Serve the app on a free loopback port and load it from the same process.
    Both {
        /// The Redis the layers store into.
        redis_url: String,
    },
    /// Serve the app on `addr` until killed; prints `listening on http://ADDR` once bound.
    Serve {
        /// The Redis the layers store into.
        redis_url: String,
        /// Where to listen, e.g. `127.0.0.1:8080`.
        addr: String,
    },
    /// Load the app served at `url` (another process's `--serve`).
    Load {
        /// The base URL, e.g. `http://127.0.0.1:8080`.
        url: String,
    },
}

/// The parsed command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Args {
    /// Serve, load, or both.
    pub role: Role,
    /// How much to send.
    pub load: Load,
    /// `--workload ID` (repeatable): only these workloads, in this order; all when empty.
    pub only: Vec<String>,
}

/// The usage line of [`Args::parse`].
pub const USAGE: &str = "usage: (--redis-url URL [--serve ADDR] | --load URL) [--requests N] \
     [--concurrency C] [--rounds R] [--workload ID]...";

impl Args {
    /// Input: the arguments after the program's name. Output: what they ask for; `--requests`
    /// defaults to 20 000, `--concurrency` to 64, `--rounds` to 3.
    ///
    /// # Errors
    /// An unknown flag, a flag without its value, a number that does not parse, or neither
    /// `--redis-url` nor `--load`.
    pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Self, BenchError> {
        let (mut redis_url, mut serve, mut load_url) = (None, None, None);
        let mut load = Load {
            requests: 20_000,
            concurrency: 64,
            rounds: 3,
        };
        let mut only = Vec::new();
        let mut args = args.into_iter();
        let number = |value: String| {
            value
                .parse::<u64>()
                .map_err(|err| BenchError(format!("`{value}`: {err}; {USAGE}")))
        };
        while let Some(flag) = args.next() {
            let value = args
                .next()
                .ok_or_else(|| BenchError(format!("`{flag}` needs a value; {USAGE}")))?;
            match flag.as_str() {
                "--redis-url" => redis_url = Some(value),
                "--serve" => serve = Some(value),
                "--load" => load_url = Some(value),
                "--requests" => load.requests = number(value)?,
                "--concurrency" => load.concurrency = number(value)?.max(1),
                "--rounds" => load.rounds = number(value)?.max(1),
                "--workload" => only.push(value),
                _ => return Err(BenchError(format!("unknown flag `{flag}`; {USAGE}"))),
            }
        }
        let role = match (redis_url, serve, load_url) {
            (Some(redis_url), None, None) => Role::Both { redis_url },
            (Some(redis_url), Some(addr), None) => Role::Serve { redis_url, addr },
            (None, None, Some(url)) => Role::Load { url },
            _ => return Err(BenchError(USAGE.into())),
        };
        Ok(Self { role, load, only })
    }

    /// `workloads` cut down to `--workload`, in its order.
    ///
    /// # Errors
    /// A `--workload` that names none of them.
    pub fn select(&self, workloads: &[Workload]) -> Result<Vec<Workload>, BenchError> {
        if self.only.is_empty() {
            return Ok(workloads.to_vec());
        }
        self.only
            .iter()
            .map(|id| {
                workloads
                    .iter()
                    .find(|w| w.id == id)
                    .cloned()
                    .ok_or_else(|| {
                        let ids: Vec<_> = workloads.iter().map(|w| w.id).collect();
                        BenchError(format!(
                            "unknown workload `{id}`; expected one of: {}",
                            ids.join(", ")
                        ))
                    })
            })
            .collect()
    }
}

/// The whole program over `workloads` and the app `app` builds from a Redis URL: parses the
/// command line, serves, loads, and prints the Markdown table of [`markdown`] (then `after`'s
/// lines, e.g. ratios between rows) on standard output.
///
/// # Errors
/// Bad arguments, Redis unreachable, a port taken, a request that fails.
pub async fn main<A, F>(
    workloads: Vec<Workload>,
    app: A,
    after: impl FnOnce(&[Row]) -> String,
) -> Result<(), Box<dyn Error>>
where
    A: FnOnce(String) -> F,
    F: Future<Output = Result<Router, Box<dyn Error>>>,
{
    let args = Args::parse(std::env::args().skip(1))?;
    let selected = args.select(&workloads)?;
    let base = match args.role {
        Role::Serve { redis_url, addr } => {
            let app = app(redis_url).await?;
            let listener = tokio::net::TcpListener::bind(&addr).await?;
            println!("listening on http://{}", listener.local_addr()?);
            std::io::stdout().flush()?;
            axum::serve(listener, app).await?;
            return Ok(());
        }
        Role::Both { redis_url } => {
            let app = app(redis_url).await?;
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
            let base = format!("http://{}", listener.local_addr()?);
            tokio::spawn(async move { axum::serve(listener, app).await });
            base
        }
        Role::Load { url } => url.trim_end_matches('/').to_owned(),
    };
    let rows = run(&base, &selected, args.load).await?;
    print!("{}", markdown(&rows));
    print!("{}", after(&rows));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &str) -> Result<Args, BenchError> {
        Args::parse(line.split_whitespace().map(str::to_owned))
    }

    #[test]
    fn the_roles_are_told_apart_and_the_rest_refused() {
        assert_eq!(
            args("--redis-url redis://r").unwrap().role,
            Role::Both {
                redis_url: "redis://r".into()
            }
        );
        assert_eq!(
            args("--redis-url redis://r --serve 127.0.0.1:1")
                .unwrap()
                .role,
            Role::Serve {
                redis_url: "redis://r".into(),
                addr: "127.0.0.1:1".into()
            }
        );
        let load = args("--load http://h --rounds 0 --requests 7").unwrap();
        assert_eq!(
            load.role,
            Role::Load {
                url: "http://h".into()
            }
        );
        assert_eq!((load.load.rounds, load.load.requests), (1, 7));
        assert!(args("--load http://h --redis-url redis://r").is_err());
        assert!(args("--requests 5").is_err());
        assert!(args("--redis-url").is_err());
        assert!(args("--redis-url r --requests many").is_err());
    }

    #[test]
    fn workloads_are_selected_by_id_in_the_order_asked() {
        let asked = args("--load u --workload duplicates --workload plain").unwrap();
        let ids: Vec<_> = asked
            .select(&workloads())
            .unwrap()
            .iter()
            .map(|w| w.id)
            .collect();
        assert_eq!(ids, ["duplicates", "plain"]);
        let wrong = args("--load u --workload nope")
            .unwrap()
            .select(&workloads());
        assert!(wrong.unwrap_err().0.contains("plain, fresh, duplicates"));
    }

    #[test]
    fn the_table_has_each_row_against_the_first() {
        let figures = |per_second| Figures {
            per_second,
            p50: Duration::from_micros(3_360),
            p99: Duration::from_micros(12_970),
        };
        let all = workloads();
        let rows = [
            Row {
                workload: all[0].clone(),
                best: figures(18_391.6),
            },
            Row {
                workload: all[1].clone(),
                best: figures(9_195.8),
            },
        ];
        let table = markdown(&rows);
        assert!(table.contains("| no layer | 18 392 | 1.00× | 3.36 ms | 12.97 ms |"));
        assert!(table.contains("| idempotask-http, fresh keys | 9 196 | 0.50× |"));
        assert_eq!(thousands(999.0), "999");
        assert_eq!(thousands(1_234_567.0), "1 234 567");
    }
}
