//! The benchmark harness: throughput, Redis commands and latency of idempotask
//! against the hand-written pattern, on one `RedisStore` (one multiplexed connection).
//!
//! `src/main.rs` is the command line over [`run`]; `tests/bench_smoke.rs` runs every mode
//! once with a tiny N. Each [`Measurement`] is one JSON line; [`report::markdown`] turns a whole
//! set into the tables of `docs/performance.md`.
//!
//! The measured task is annotated the way users write it, without a `store` option; [`run`]
//! scopes its store to its own workers (`idempotask::with_store`) rather than installing it, so
//! that runs in one process (the smoke tests, in parallel) neither share a store nor count each
//! other's executions.
//!
//! [`http`] is the HTTP layer's bench (`src/bin/http.rs`, and `bench/http-compare` beside the
//! `idempotent` crate's layer).
//!
//! [`sweep`] measures throughput against tasks in flight (`bench --sweep`), and [`plot`] draws
//! those measurements, and the queue bench's, as SVG (`src/bin/plot.rs`, `bench-plot`).

mod cpu;
mod driver;
mod error;
pub mod http;
pub mod plot;
pub mod postgres;
pub mod queues;
pub mod report;
mod server;
pub mod sweep;
mod target;
mod workloads;

use std::fmt;
use std::num::NonZeroUsize;
use std::str::FromStr;
use std::time::{Duration, Instant};

use idempotask::store::{LocalResultCache, SharedStore, UnitOfWork};
use idempotask_redis::RedisKeys;
use idempotask_redis::{RedisClusterStore, RedisStore, RedlockStore};
use redis::aio::ConnectionManager;
use serde::Serialize;

pub use error::BenchError;

use driver::{drive, percentile_us, spawn_in_run};
use server::{
    Counting, client_cost, client_cpu, command_stats, lock_keys, memory_usage, server_cpu,
};
use target::Connection;
use workloads::{
    BENCH_TASK, RunScope, bench_steps, bench_task, bench_task_fenced, handwritten,
    handwritten_steps,
};

/// The concurrencies of [`Mode::Scaling`].
pub const SCALING_CONCURRENCY: [usize; 5] = [1, 8, 64, 256, 1024];

/// What to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// N distinct keys, each run once through the annotated task.
    Fresh,
    /// The same N keys again, all already done (set up untimed first).
    Duplicate,
    /// `duplicate` through a `LocalResultCache` that completed the N keys itself: the
    /// duplicates answered from the process's memory.
    DuplicateCached,
    /// N distinct keys, each run once through a task with `fencing = true`.
    Fenced,
    /// C concurrent deliveries of each of N keys; the body runs once per key.
    Contended,
    /// N distinct keys through the hand-written four-command pattern.
    HandwrittenFresh,
    /// The same N keys again through the hand-written pattern, all already done.
    HandwrittenDuplicate,
    /// N distinct keys, each a unit of three steps through the annotated task: `begin`, the
    /// journal read at the first step, a `record_step` per step, `finish`.
    Steps,
    /// N distinct keys, each the three-step unit written by hand: the hand-written pattern's
    /// lock and result, and a `GET` and a `SET` of a marker per step.
    HandwrittenSteps,
    /// `fresh` at concurrency 1, next to the `PING` round trip on the same connection.
    Latency,
    /// `fresh` at each of [`SCALING_CONCURRENCY`].
    Scaling,
    /// `fresh` through a `RedlockStore` over the comma-separated servers of `--redis-url` (3
    /// or 5), at C and at concurrency 1; the server figures are summed over the servers.
    Quorum,
    /// Every mode above; the comparisons and `scaling` run back to back in each round.
    All,
}

impl Mode {
    /// Every mode's name, as the command line spells it.
    pub const NAMES: [&'static str; 13] = [
        "fresh",
        "duplicate",
        "duplicate-cached",
        "fenced",
        "contended",
        "handwritten-fresh",
        "handwritten-duplicate",
        "steps",
        "handwritten-steps",
        "latency",
        "scaling",
        "quorum",
        "all",
    ];

    const ALL: [Self; 13] = [
        Self::Fresh,
        Self::Duplicate,
        Self::DuplicateCached,
        Self::Fenced,
        Self::Contended,
        Self::HandwrittenFresh,
        Self::HandwrittenDuplicate,
        Self::Steps,
        Self::HandwrittenSteps,
        Self::Latency,
        Self::Scaling,
        Self::Quorum,
        Self::All,
    ];

    /// The mode's name, as the command line and the JSON lines spell it.
    pub fn name(self) -> &'static str {
        let index = Self::ALL.iter().position(|mode| *mode == self).unwrap_or(0);
        Self::NAMES[index]
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Mode {
    type Err = BenchError;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Self::NAMES
            .iter()
            .position(|known| *known == name)
            .map(|index| Self::ALL[index])
            .ok_or_else(|| {
                BenchError(format!(
                    "unknown mode `{name}`; expected one of: {}",
                    Self::NAMES.join(", ")
                ))
            })
    }
}

/// One benchmark run's settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// The Redis server, e.g. `redis://127.0.0.1:6379`; with `cluster`, comma-separated seed
    /// nodes of a Redis Cluster.
    pub redis_url: String,
    /// Runs on a Redis Cluster through `RedisClusterStore`; the server figures are the sums
    /// over its masters.
    pub cluster: bool,
    /// What to measure.
    pub mode: Mode,
    /// N: keys per measurement (`all` uses N / C keys for `contended`, so that it runs about N
    /// deliveries too).
    pub tasks: usize,
    /// C: tasks in flight at once (ignored by `latency` and `scaling`).
    pub concurrency: usize,
    /// How many times `all` repeats the comparisons, so that a busy machine shows as spread.
    pub rounds: usize,
}

/// One measurement: one JSON line of the bench's output.
#[derive(Debug, Clone, Serialize)]
pub struct Measurement {
    /// The mode measured (`scaling` lines differ by `concurrency`).
    pub mode: &'static str,
    /// Which round of `all` this is, from 1.
    pub round: usize,
    /// Distinct keys.
    pub tasks: usize,
    /// Task calls in flight at once.
    pub concurrency: usize,
    /// Task calls made: `tasks` times the deliveries per key (C for `contended`, else 1).
    pub deliveries: usize,
    /// Task calls completed per second of wall time.
    pub tasks_per_sec: f64,
    /// Commands the client sent per task call, from `INFO commandstats` deltas (the commands
    /// that scripts run inside are not round trips and are left out).
    pub redis_commands_per_task: f64,
    /// Redis CPU time per task call, from `INFO commandstats` (a script's time includes the
    /// commands it runs).
    pub redis_us_per_task: f64,
    /// CPU time of the Redis server per task call, from `INFO cpu` (commands, network, event
    /// loop).
    pub redis_cpu_us_per_task: f64,
    /// CPU time of this process per task call (Linux; 10 ms resolution over the whole run).
    pub client_cpu_us_per_task: f64,
    /// Median time of one task call, in microseconds.
    pub p50_us: u64,
    /// 99th percentile time of one task call, in microseconds.
    pub p99_us: u64,
    /// How many times a body ran; for `steps` and `handwritten-steps`, how many step effects
    /// ran (three per unit).
    pub executions: u64,
    /// `latency` only: the median `PING` round trip on the same connection, in microseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ping_p50_us: Option<u64>,
    /// Locks of idempotask and of the hand-written pattern left in Redis after the measurement.
    pub lock_keys_left: u64,
    /// Whether the server has `SET … IFEQ` (Valkey 8.1+, Redis 8.4+), so `finish` runs no
    /// script; the targets differ.
    pub native_cas: bool,
    /// `fresh` only: `MEMORY USAGE` of one completed unit of a `()` result (its one key), in
    /// bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub marker_bytes: Option<u64>,
}

/// Runs `config` and hands each measurement to `emit` as soon as it is done.
///
/// # Errors
/// [`BenchError`] when Redis cannot be reached or a task call fails.
pub async fn run(
    config: &Config,
    emit: impl FnMut(&Measurement),
) -> Result<Vec<Measurement>, BenchError> {
    let (bench, store) = if config.mode == Mode::Quorum {
        let urls: Vec<&str> = config.redis_url.split(',').map(str::trim).collect();
        let store = RedlockStore::connect(urls.iter().copied()).await?;
        let mut stats = Vec::with_capacity(urls.len());
        for url in &urls {
            stats.push(redis::Client::open(*url)?.get_connection_manager().await?);
        }
        let conn = Connection::Server(stats[0].clone());
        (Bench::new(conn, stats)?, SharedStore::new(store))
    } else if config.cluster {
        let seeds: Vec<&str> = config.redis_url.split(',').map(str::trim).collect();
        let store = RedisClusterStore::connect(seeds.iter().copied()).await?;
        let stats = target::masters(&store, seeds[0]).await?;
        // The hand-written pattern's own connection, as a user's code would have.
        let conn = redis::cluster::ClusterClient::new(seeds.clone())?
            .get_async_connection()
            .await?;
        let mut bench = Bench::new(Connection::Cluster(conn), stats)?;
        bench.native_cas = store.native_compare_and_set();
        (bench, SharedStore::new(store))
    } else {
        let store = RedisStore::connect(&config.redis_url).await?;
        let stats = redis::Client::open(config.redis_url.as_str())?
            .get_connection_manager()
            .await?;
        // The hand-written pattern's own connection, as a user's code would have.
        let conn = redis::Client::open(config.redis_url.as_str())?
            .get_connection_manager()
            .await?;
        let mut bench = Bench::new(Connection::Server(conn), vec![stats])?;
        bench.native_cas = store.native_compare_and_set();
        (bench, SharedStore::new(store))
    };
    // The run's store is scoped to it, not installed: two runs in one process keep apart.
    RunScope::new(store).enter(bench.run(config, emit)).await
}

impl Bench {
    /// Every measurement `config` asks for, in order.
    async fn run(
        mut self,
        config: &Config,
        mut emit: impl FnMut(&Measurement),
    ) -> Result<Vec<Measurement>, BenchError> {
        let (n, c) = (config.tasks, config.concurrency.max(1));
        let mut pending = match config.mode {
            Mode::All => Vec::new(),
            mode => vec![(mode, n, c)],
        };
        if config.mode == Mode::All {
            for round in 1..=config.rounds.max(1) {
                self.round = round;
                let mut pairs = [
                    [Mode::HandwrittenFresh, Mode::Fresh],
                    [Mode::HandwrittenDuplicate, Mode::Duplicate],
                    [Mode::HandwrittenSteps, Mode::Steps],
                ];
                // Who goes first alternates, so that a machine getting busier or quieter during a
                // round favours neither side.
                if round % 2 == 0 {
                    for pair in &mut pairs {
                        pair.reverse();
                    }
                }
                for mode in pairs.into_iter().flatten().chain([
                    Mode::DuplicateCached,
                    Mode::Fenced,
                    Mode::Scaling,
                ]) {
                    self.measure(mode, n, c, &mut emit).await?;
                }
            }
            self.round = 1;
            // The same comparison where round trips, not CPU, bound the throughput.
            pending = vec![
                (Mode::HandwrittenFresh, n.min(5_000), 1),
                (Mode::Fresh, n.min(5_000), 1),
                (Mode::Contended, (n / c).max(1), c),
                (Mode::Latency, n.min(5_000), 1),
            ];
        }
        for (mode, n, c) in pending {
            self.measure(mode, n, c, &mut emit).await?;
        }
        Ok(self.out)
    }
}

/// The connections and bookkeeping one [`run`] shares between its measurements.
struct Bench {
    /// The store's own connection, shared by the hand-written pattern and `PING`.
    conn: Connection,
    /// Connections of their own to each server (each master of a cluster) for `INFO` and
    /// `SCAN`, so they do not queue behind tasks; the figures are summed over them.
    stats: Vec<ConnectionManager>,
    /// The store's key layout (default namespace), to find a marker.
    keys: RedisKeys,
    /// Keeps keys of this process apart from earlier runs on the same server.
    run: u64,
    round: usize,
    native_cas: bool,
    /// The cache `duplicate-cached` filled untimed, for its timed pass.
    cached: Option<LocalResultCache<SharedStore>>,
    out: Vec<Measurement>,
}

/// A measurement before the server has been asked what it cost.
struct Sample {
    deliveries: usize,
    elapsed: Duration,
    latencies: Vec<Duration>,
    ping_p50_us: Option<u64>,
}

impl Bench {
    fn new(conn: Connection, stats: Vec<ConnectionManager>) -> Result<Self, BenchError> {
        Ok(Self {
            conn,
            stats,
            keys: RedisKeys::new(RedisStore::DEFAULT_NAMESPACE)?,
            run: rand::random::<u64>() >> 1,
            round: 1,
            native_cas: false,
            cached: None,
            out: Vec::new(),
        })
    }

    /// A cache in front of the run's store, large enough for `n` keys.
    fn cache(n: usize) -> Result<LocalResultCache<SharedStore>, BenchError> {
        let store = RunScope::current()
            .ok_or_else(|| BenchError("no run".into()))?
            .store();
        let capacity = NonZeroUsize::new(n.max(1)).unwrap_or(NonZeroUsize::MIN);
        Ok(LocalResultCache::new(store, capacity))
    }

    async fn measure(
        &mut self,
        mode: Mode,
        n: usize,
        c: usize,
        emit: &mut impl FnMut(&Measurement),
    ) -> Result<(), BenchError> {
        match mode {
            Mode::Scaling => {
                for c in SCALING_CONCURRENCY {
                    self.once(mode, n, c, emit).await?;
                }
            }
            Mode::Latency => self.once(mode, n, 1, emit).await?,
            Mode::Quorum => {
                self.once(mode, n, c, emit).await?;
                self.once(mode, n.min(5_000), 1, emit).await?;
            }
            _ => self.once(mode, n, c, emit).await?,
        }
        Ok(())
    }

    async fn once(
        &mut self,
        mode: Mode,
        n: usize,
        c: usize,
        emit: &mut impl FnMut(&Measurement),
    ) -> Result<(), BenchError> {
        // Every measurement gets keys of its own; duplicates first run them untimed.
        self.run += 1;
        let run = self.run;
        let counting = match mode {
            Mode::HandwrittenFresh | Mode::HandwrittenDuplicate | Mode::HandwrittenSteps => {
                Counting::Handwritten
            }
            _ => Counting::Idempotask,
        };
        match mode {
            Mode::Duplicate => {
                drive(n, c, move |id| fresh(run, id)).await?;
            }
            Mode::HandwrittenDuplicate => {
                let conn = self.conn.clone();
                drive(n, c, move |id| handwritten(conn.clone(), run, id as u64)).await?;
            }
            Mode::DuplicateCached => {
                let cache = Self::cache(n)?;
                let filling = cache.clone();
                drive(n, c, move |id| cached(filling.clone(), run, id)).await?;
                self.cached = Some(cache);
            }
            _ => {}
        }
        let run_scope = RunScope::current().ok_or_else(|| BenchError("no run".into()))?;
        let executed = run_scope.executions();
        let before = command_stats(&mut self.stats).await?;
        let (redis_cpu, own_cpu) = (server_cpu(&mut self.stats).await?, client_cpu());
        let mut sample = self.sample(mode, run, n, c).await?;
        let own_cpu = client_cpu().saturating_sub(own_cpu);
        let redis_cpu = server_cpu(&mut self.stats).await?.saturating_sub(redis_cpu);
        let after = command_stats(&mut self.stats).await?;
        let cost = client_cost(&before, &after, counting);
        let marker_bytes = if mode == Mode::Fresh {
            let unit = UnitOfWork::new(BENCH_TASK, format!("{run}-0"))?;
            memory_usage(&mut self.conn, &self.keys.unit(&unit)).await?
        } else {
            None
        };
        let measurement = Measurement {
            mode: mode.name(),
            round: self.round,
            tasks: n,
            concurrency: c,
            deliveries: sample.deliveries,
            tasks_per_sec: per(sample.deliveries, sample.elapsed.as_secs_f64()),
            redis_commands_per_task: per_task(cost.client_calls, sample.deliveries),
            redis_us_per_task: per_task(cost.usec, sample.deliveries),
            redis_cpu_us_per_task: per_task(micros(redis_cpu), sample.deliveries),
            client_cpu_us_per_task: per_task(micros(own_cpu), sample.deliveries),
            p50_us: percentile_us(&mut sample.latencies, 50),
            p99_us: percentile_us(&mut sample.latencies, 99),
            executions: run_scope.executions() - executed,
            ping_p50_us: sample.ping_p50_us,
            lock_keys_left: lock_keys(&mut self.stats).await?,
            native_cas: self.native_cas,
            marker_bytes,
        };
        emit(&measurement);
        self.out.push(measurement);
        Ok(())
    }

    /// Runs the timed part of `mode`.
    async fn sample(
        &mut self,
        mode: Mode,
        run: u64,
        n: usize,
        c: usize,
    ) -> Result<Sample, BenchError> {
        let mut deliveries = n;
        let mut ping_p50_us = None;
        let timings = match mode {
            Mode::Fresh | Mode::Duplicate | Mode::Scaling | Mode::Quorum => {
                drive(n, c, move |id| fresh(run, id)).await?
            }
            Mode::Fenced => drive(n, c, move |id| fenced(run, id)).await?,
            Mode::Steps => drive(n, c, move |id| steps(run, id)).await?,
            Mode::HandwrittenSteps => {
                let conn = self.conn.clone();
                drive(n, c, move |id| {
                    handwritten_steps(conn.clone(), run, id as u64)
                })
                .await?
            }
            Mode::DuplicateCached => {
                let cache = self
                    .cached
                    .take()
                    .ok_or_else(|| BenchError("no cache was filled".into()))?;
                drive(n, c, move |id| cached(cache.clone(), run, id)).await?
            }
            Mode::Contended => {
                // Workers take job numbers in order, so the C deliveries of a key run together.
                deliveries = n * c;
                drive(deliveries, c, move |job| fresh(run, job / c)).await?
            }
            Mode::HandwrittenFresh | Mode::HandwrittenDuplicate => {
                let conn = self.conn.clone();
                drive(n, c, move |id| handwritten(conn.clone(), run, id as u64)).await?
            }
            Mode::Latency => {
                let (timings, mut pings) = spawn_in_run(latency(self.conn.clone(), run, n))
                    .await
                    .map_err(|err| BenchError(err.to_string()))??;
                ping_p50_us = Some(percentile_us(&mut pings, 50));
                timings
            }
            Mode::All => unreachable!("`all` is split into its modes"),
        };
        Ok(Sample {
            deliveries,
            elapsed: timings.elapsed,
            latencies: timings.latencies,
            ping_p50_us,
        })
    }
}

/// Input: N keys. Output: the timings of N fresh tasks one after another, and of a `PING` on
/// the same connection right before each, so both see the same machine.
///
/// Runs in a spawned task like every other mode's workers: on the thread that blocks on the
/// runtime, each reply would first have to wake that thread, and both figures would measure
/// that wake-up instead.
async fn latency(
    mut conn: Connection,
    run: u64,
    n: usize,
) -> Result<(driver::Timings, Vec<Duration>), BenchError> {
    let mut pings = Vec::with_capacity(n);
    let mut latencies = Vec::with_capacity(n);
    let mut elapsed = Duration::ZERO;
    for id in 0..n {
        let sent = Instant::now();
        conn.ping().await?;
        pings.push(sent.elapsed());
        let sent = Instant::now();
        fresh(run, id).await?;
        let took = sent.elapsed();
        // The PINGs are not part of the tasks' throughput.
        elapsed += took;
        latencies.push(took);
    }
    Ok((driver::Timings { elapsed, latencies }, pings))
}

async fn fresh(run: u64, id: usize) -> Result<(), BenchError> {
    Ok(bench_task(run, id as u64).await?)
}

/// `fresh` through `cache`: a duplicate of a key the cache completed never reaches the store.
async fn cached(
    cache: LocalResultCache<SharedStore>,
    run: u64,
    id: usize,
) -> Result<(), BenchError> {
    Ok(idempotask::with_store(cache, bench_task(run, id as u64)).await?)
}

async fn fenced(run: u64, id: usize) -> Result<(), BenchError> {
    Ok(bench_task_fenced(run, id as u64).await?)
}

async fn steps(run: u64, id: usize) -> Result<(), BenchError> {
    Ok(bench_steps(run, id as u64).await?)
}

fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

#[allow(
    clippy::cast_precision_loss,
    reason = "counts far below 2^52 are exact as f64"
)]
fn per(count: usize, seconds: f64) -> f64 {
    if seconds > 0.0 {
        count as f64 / seconds
    } else {
        0.0
    }
}

#[allow(
    clippy::cast_precision_loss,
    reason = "counts far below 2^52 are exact as f64"
)]
fn per_task(total: u64, deliveries: usize) -> f64 {
    if deliveries == 0 {
        0.0
    } else {
        total as f64 / deliveries as f64
    }
}
