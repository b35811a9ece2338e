//! One queue's worth of work and what every consumer of a run shares: the batch, the bodies it
//! counts, the clocks its consumption is measured with.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use idempotask::{RetryPolicy, Task};
use idempotask_redis::RedisStore;
use redis::aio::ConnectionManager;

use super::config::{Broker, Consumer, QueueError};
use crate::cpu::{CpuClocks, client_cpu_us};
use crate::server::server_cpu;

/// The task every idempotask consumer runs; the keys carry the run's id, so each run's units
/// are fresh.
pub(super) static QUEUE_TASK: Task = Task::new("queue_bench").retry(RetryPolicy::no_wait());

/// What consuming one batch cost: wall time, and CPU time of the client, Redis and the broker.
pub(super) struct Consumed {
    pub(super) elapsed: Duration,
    pub(super) client_cpu_us: Option<f64>,
    pub(super) redis_cpu_us: f64,
    pub(super) broker_cpu_us: Option<f64>,
}

/// The clocks a batch's consumption is measured with, started just before its first delivery
/// is asked for (the publishing before it is not counted).
pub(super) struct Clocks {
    wall: Instant,
    /// The broker's processes; `None` for a broker whose CPU time is Redis's
    /// ([`Broker::process`]).
    broker: Option<CpuClocks>,
    client: Option<f64>,
    redis: Duration,
    server: ConnectionManager,
}

impl Clocks {
    pub(super) async fn start(shared: &Shared, broker: Broker) -> Result<Self, QueueError> {
        let mut server = shared.redis.clone();
        let redis = server_cpu(std::slice::from_mut(&mut server)).await?;
        Ok(Self {
            // The scan of `/proc` first, so that its CPU time is not counted as the client's.
            broker: broker.process().map(CpuClocks::now),
            client: client_cpu_us(),
            redis,
            server,
            wall: Instant::now(),
        })
    }

    pub(super) async fn stop(mut self) -> Result<Consumed, QueueError> {
        let elapsed = self.wall.elapsed();
        let client_cpu_us = client_cpu_us()
            .zip(self.client)
            .map(|(after, before)| after - before);
        let broker_cpu_us = self.broker.as_ref().and_then(|broker| broker.since().1);
        let redis = server_cpu(std::slice::from_mut(&mut self.server)).await?;
        Ok(Consumed {
            elapsed,
            client_cpu_us,
            redis_cpu_us: redis.saturating_sub(self.redis).as_secs_f64() * 1e6,
            broker_cpu_us,
        })
    }
}

/// How many times each message's body ran, by the message's number.
pub(super) struct Bodies(Vec<AtomicU32>);

impl Bodies {
    pub(super) fn new(messages: usize) -> Arc<Self> {
        Arc::new(Self((0..messages).map(|_| AtomicU32::new(0)).collect()))
    }

    /// The body every consumer runs: reads the message's number from its payload, counts the
    /// run, and computes a small value from it.
    pub(super) fn run(&self, payload: &[u8]) -> u64 {
        let number: usize = std::str::from_utf8(payload)
            .ok()
            .and_then(|text| text.parse().ok())
            .unwrap_or(usize::MAX);
        if let Some(count) = self.0.get(number) {
            count.fetch_add(1, Ordering::Relaxed);
        }
        payload
            .iter()
            .fold(17_u64, |sum, byte| sum.wrapping_mul(31) ^ u64::from(*byte))
    }

    /// Bodies run in total, and messages run exactly once.
    pub(super) fn counts(&self) -> (u64, usize) {
        let runs = self.0.iter().map(|count| count.load(Ordering::Relaxed));
        let total = runs.clone().map(u64::from).sum();
        (total, runs.filter(|&count| count == 1).count())
    }
}

/// What every consumer of a run shares: the store and the hand-written consumer's connection.
#[derive(Clone)]
pub(super) struct Shared {
    pub(super) store: RedisStore,
    pub(super) redis: ConnectionManager,
    /// Sets this run's keys apart from any earlier run's on the same Redis.
    pub(super) run: u64,
}

/// One queue's worth of work: its name (a subject or a queue), its messages' keys' prefix, and
/// their count.
pub(super) struct Batch {
    pub(super) name: String,
    pub(super) messages: usize,
    pub(super) in_flight: usize,
    pub(super) consumer: Consumer,
    pub(super) bodies: Arc<Bodies>,
}

impl Batch {
    pub(super) fn key(&self, number: usize) -> String {
        format!("{}-{number}", self.name)
    }
}
