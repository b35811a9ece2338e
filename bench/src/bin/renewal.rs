//! What lock renewal costs a body that does not block: fresh tasks per second on the in-memory
//! store, with `renew` off and on, at `--concurrency` calls in flight on a two-worker runtime.
//! Each body awaits `--awaits` times (as a body that talks to another service polls), so the
//! price of a renewed body, a `block_in_place` hand-off per poll and a watchdog task per call,
//! shows per poll. Prints one Markdown row per round and the median ratio.
//!
//! ```text
//! cargo run --release -p idempotask-bench --bin renewal-bench -- \
//!     [--tasks 20000] [--concurrency 64] [--awaits 4] [--rounds 3]
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use idempotask::{Error, MemoryStore, Task};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut tasks: u32 = 20_000;
    let mut concurrency: usize = 64;
    let mut awaits: u32 = 4;
    let mut rounds: u32 = 3;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--tasks" => tasks = value.parse()?,
            "--concurrency" => concurrency = value.parse()?,
            "--awaits" => awaits = value.parse()?,
            "--rounds" => rounds = value.parse()?,
            other => return Err(format!("unknown argument `{other}`").into()),
        }
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    println!("| round | renew off (tasks/s) | renew on (tasks/s) | on / off |");
    println!("| --- | --- | --- | --- |");
    let mut ratios = Vec::new();
    for round in 1..=rounds {
        let off = runtime.block_on(run(false, tasks, concurrency, awaits))?;
        let on = runtime.block_on(run(true, tasks, concurrency, awaits))?;
        ratios.push(on / off);
        println!("| {round} | {off:.0} | {on:.0} | {:.2} |", on / off);
    }
    ratios.sort_by(f64::total_cmp);
    println!(
        "\nmedian on / off: {:.2} ({tasks} tasks, {concurrency} in flight, {awaits} awaits per body)",
        ratios[ratios.len() / 2]
    );
    Ok(())
}

/// Fresh tasks per second of one run.
async fn run(renew: bool, tasks: u32, concurrency: usize, awaits: u32) -> Result<f64, Error> {
    let store = MemoryStore::new();
    let task = Arc::new(
        Task::new("renewal-bench")
            .lock_ttl(Duration::from_secs(30))
            .renew(renew),
    );
    let slots = Arc::new(tokio::sync::Semaphore::new(concurrency));
    let started = Instant::now();
    let mut calls = tokio::task::JoinSet::new();
    for key in 0..tasks {
        let permit = slots.clone().acquire_owned().await.expect("never closed");
        let (task, store) = (task.clone(), store.clone());
        calls.spawn(async move {
            let _permit = permit;
            task.call(key.to_string())
                .store(store)
                .run(async move {
                    for _ in 0..awaits {
                        tokio::task::yield_now().await;
                    }
                    Ok::<_, Error>(key)
                })
                .await
        });
    }
    while let Some(call) = calls.join_next().await {
        call.expect("a call panicked")?;
    }
    Ok(f64::from(tasks) / started.elapsed().as_secs_f64())
}
