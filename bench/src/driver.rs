//! Running many jobs at a fixed concurrency and timing each one.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::BenchError;
use super::workloads::RunScope;

/// What one [`drive`] took: the wall time of the whole run and each job's latency.
pub(crate) struct Timings {
    pub(crate) elapsed: Duration,
    pub(crate) latencies: Vec<Duration>,
}

/// Input: `jobs` job numbers and a job. Output: every job run once by `concurrency` tokio tasks
/// that each take the next number as soon as their previous job is done, with each job's time.
///
/// Workers pull numbers in order, so jobs next to each other run at the same time: that is how
/// the contended mode puts the deliveries of one key side by side.
pub(crate) async fn drive<F, Fut>(
    jobs: usize,
    concurrency: usize,
    job: F,
) -> Result<Timings, BenchError>
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), BenchError>> + Send + 'static,
{
    let job = Arc::new(job);
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let workers: Vec<_> = (0..concurrency.clamp(1, jobs.max(1)))
        .map(|_| {
            let (job, next) = (Arc::clone(&job), Arc::clone(&next));
            let worker = async move {
                let mut latencies = Vec::new();
                loop {
                    let number = next.fetch_add(1, Ordering::Relaxed);
                    if number >= jobs {
                        return Ok::<_, BenchError>(latencies);
                    }
                    let sent = Instant::now();
                    job(number).await?;
                    latencies.push(sent.elapsed());
                }
            };
            spawn_in_run(worker)
        })
        .collect();
    let mut latencies = Vec::with_capacity(jobs);
    for worker in workers {
        latencies.extend(worker.await.map_err(|err| BenchError(err.to_string()))??);
    }
    Ok(Timings {
        elapsed: started.elapsed(),
        latencies,
    })
}

/// Spawns `future` inside the run that spawns it, if any (task-local values stay with their
/// task otherwise).
pub(crate) fn spawn_in_run<F>(future: F) -> tokio::task::JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    match RunScope::current() {
        Some(run) => tokio::spawn(run.enter(future)),
        None => tokio::spawn(future),
    }
}

/// The `percent`th percentile (nearest rank) of `samples` in whole microseconds; 0 when empty.
pub(crate) fn percentile_us(samples: &mut [Duration], percent: usize) -> u64 {
    if samples.is_empty() {
        return 0;
    }
    samples.sort_unstable();
    let rank = (samples.len() * percent).div_ceil(100).max(1);
    u64::try_from(samples[rank - 1].as_micros()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let mut samples: Vec<Duration> = (1..=100).rev().map(Duration::from_micros).collect();
        assert_eq!(percentile_us(&mut samples, 50), 50);
        assert_eq!(percentile_us(&mut samples, 99), 99);
        assert_eq!(percentile_us(&mut [Duration::from_micros(7)], 99), 7);
        assert_eq!(percentile_us(&mut [], 50), 0);
    }
}
