//! Throughput against tasks in flight: idempotask, the hand-written pattern and any other
//! implementation handed in, each over fresh keys at every concurrency of the sweep, back to
//! back, so that the points at one concurrency saw the same machine.
//!
//! After an untimed warm-up of each implementation, each round runs every concurrency in turn,
//! and at each one every implementation once, in an order that rotates round by round so that
//! none always runs first. Each measurement is a
//! [`SweepPoint`], one JSON line; [`plot`](crate::plot) draws the medians over the rounds.
//!
//! `bench --sweep 1,4,16,64,256` runs the two of this workspace; `bench/http-compare --sweep`
//! adds the `idempotent` crate's claim (it builds outside the workspace), and
//! `scripts/bench-plot.sh` runs that one on Redis 7 and Valkey 8.1.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use idempotask::store::SharedStore;
use idempotask_redis::RedisStore;
use serde::{Deserialize, Serialize};

use crate::BenchError;
use crate::driver::drive;
use crate::target::Connection;
use crate::workloads::{RunScope, bench_task, handwritten};

/// The concurrencies the sweep measures by default, a factor of 4 apart.
pub const SWEEP_CONCURRENCY: [usize; 5] = [1, 4, 16, 64, 256];

/// What [`sweep`] measures.
#[derive(Debug, Clone)]
pub struct SweepConfig {
    /// The Redis (or Valkey) server, e.g. `redis://127.0.0.1:6379`.
    pub redis_url: String,
    /// Fresh keys per measurement.
    pub tasks: usize,
    /// Tasks in flight, in the order each round runs them.
    pub concurrency: Vec<usize>,
    /// How many times every (concurrency, implementation) is measured.
    pub rounds: usize,
}

/// One measurement of the sweep: one JSON line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SweepPoint {
    /// The server, as its `INFO server` names it: `Redis 7.0.15`, `Valkey 8.1.1`.
    pub server: String,
    /// Who ran the tasks: `idempotask`, `hand-written`, or a [`Contender`]'s name.
    pub implementation: String,
    /// The round, from 1.
    pub round: usize,
    /// Tasks in flight at once.
    pub concurrency: usize,
    /// Fresh keys, each run once.
    pub tasks: usize,
    /// Tasks completed per second of wall time.
    pub tasks_per_sec: f64,
}

/// One fresh task of a [`Contender`], boxed so that any implementation fits.
pub type TaskFuture = Pin<Box<dyn Future<Output = Result<(), BenchError>> + Send>>;

/// An implementation measured beside idempotask and the hand-written pattern: its name in the
/// JSON lines and the legend, and a function that runs the fresh task `(run, id)` once.
///
/// `run` is new for every measurement, so `(run, id)` is a key no earlier measurement used.
#[derive(Clone)]
pub struct Contender {
    /// The name in the JSON lines and the legend.
    pub name: String,
    /// Runs the fresh task `(run, id)`; an `Err` stops the sweep.
    pub task: Arc<dyn Fn(u64, u64) -> TaskFuture + Send + Sync>,
}

impl Contender {
    /// A contender named `name` whose task is `task`.
    pub fn new<F, Fut>(name: impl Into<String>, task: F) -> Self
    where
        F: Fn(u64, u64) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), BenchError>> + Send + 'static,
    {
        Self {
            name: name.into(),
            task: Arc::new(move |run, id| Box::pin(task(run, id))),
        }
    }
}

/// Who runs a measurement: one of ours, or a contender.
#[derive(Clone)]
enum Runner {
    Idempotask,
    Handwritten(Connection),
    Other(Contender),
}

impl Runner {
    fn name(&self) -> &str {
        match self {
            Self::Idempotask => "idempotask",
            Self::Handwritten(_) => "hand-written",
            Self::Other(contender) => &contender.name,
        }
    }
}

/// Runs the sweep of `config` for idempotask (a `RedisStore`, the bench's annotated task), the
/// hand-written pattern (a connection of its own) and `contenders`, handing each point to
/// `emit` as soon as it is measured.
///
/// # Errors
/// [`BenchError`] when the server cannot be reached or a task fails.
pub async fn sweep(
    config: &SweepConfig,
    contenders: Vec<Contender>,
    mut emit: impl FnMut(&SweepPoint),
) -> Result<Vec<SweepPoint>, BenchError> {
    let store = RedisStore::connect(&config.redis_url).await?;
    let client = redis::Client::open(config.redis_url.as_str())?;
    let mut info_conn = client.get_connection_manager().await?;
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut info_conn)
        .await?;
    let server = server_name(&info);
    let conn = Connection::Server(client.get_connection_manager().await?);
    let mut runners = vec![Runner::Idempotask, Runner::Handwritten(conn)];
    runners.extend(contenders.into_iter().map(Runner::Other));
    let scope = RunScope::new(SharedStore::new(store));
    let mut run = rand::random::<u64>() >> 1;
    // Untimed, so that loading scripts and opening connections are not in the first points.
    for runner in &runners {
        run += 1;
        let warm_up = config.tasks.min(500);
        scope
            .clone()
            .enter(measure(runner, run, warm_up, 16))
            .await?;
    }
    let mut points = Vec::new();
    for round in 1..=config.rounds.max(1) {
        let mut order = runners.clone();
        let shift = (round - 1) % order.len();
        order.rotate_left(shift);
        for &concurrency in &config.concurrency {
            for runner in &order {
                run += 1;
                let seconds = scope
                    .clone()
                    .enter(measure(runner, run, config.tasks, concurrency))
                    .await?;
                let point = SweepPoint {
                    server: server.clone(),
                    implementation: runner.name().to_owned(),
                    round,
                    concurrency,
                    tasks: config.tasks,
                    tasks_per_sec: per_sec(config.tasks, seconds),
                };
                emit(&point);
                points.push(point);
            }
        }
    }
    Ok(points)
}

/// Input: a runner, a fresh run number, N and C. Output: the seconds N fresh tasks took at C in
/// flight.
async fn measure(runner: &Runner, run: u64, n: usize, c: usize) -> Result<f64, BenchError> {
    let timings = match runner {
        Runner::Idempotask => {
            drive(n, c, move |id| async move {
                Ok(bench_task(run, id as u64).await?)
            })
            .await?
        }
        Runner::Handwritten(conn) => {
            let conn = conn.clone();
            drive(n, c, move |id| handwritten(conn.clone(), run, id as u64)).await?
        }
        Runner::Other(contender) => {
            let task = Arc::clone(&contender.task);
            drive(n, c, move |id| task(run, id as u64)).await?
        }
    };
    Ok(timings.elapsed.as_secs_f64())
}

/// `Valkey 8.1.1` or `Redis 7.0.15`, from the text of `INFO server`: Valkey names itself in
/// `server_name` and gives its own version in `valkey_version` (its `redis_version` is the
/// Redis version it is compatible with).
fn server_name(info: &str) -> String {
    let field = |name: &str| {
        info.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
            .map(str::trim)
    };
    match (field("server_name"), field("valkey_version")) {
        (Some("valkey"), Some(version)) => format!("Valkey {version}"),
        _ => format!(
            "Redis {}",
            field("redis_version").unwrap_or("(unknown version)")
        ),
    }
}

#[allow(
    clippy::cast_precision_loss,
    reason = "counts far below 2^52 are exact as f64"
)]
fn per_sec(count: usize, seconds: f64) -> f64 {
    count as f64 / seconds.max(1e-9)
}

#[cfg(test)]
mod tests {
    use super::server_name;

    #[test]
    fn servers_are_named_by_what_they_are() {
        let valkey =
            "# Server\r\nredis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:8.1.1\r\n";
        assert_eq!(server_name(valkey), "Valkey 8.1.1");
        let redis = "# Server\r\nredis_version:7.0.15\r\nredis_git_sha1:00000000\r\n";
        assert_eq!(server_name(redis), "Redis 7.0.15");
    }
}
