//! `MemoryStore` as it fills: a fresh and a duplicate call on an empty store and on one that
//! holds a million live results. Expiry costs what expires, not what is stored, so the rows
//! should stay close.
//!
//! ```text
//! cargo bench -p idempotask --bench memory_store
//! ```

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use idempotask::store::SharedStore;
use idempotask::{Error, MemoryStore, Task};

const LIVE: u64 = 1_000_000;

static TASK: Task = Task::new("memory_bench");

async fn call(store: &SharedStore, key: String) -> u64 {
    TASK.call(key)
        .store(store.clone())
        .run(async { Ok::<_, Error>(7) })
        .await
        .unwrap()
}

/// A store holding `LIVE` results, kept for `result_ttl`.
fn filled(runtime: &tokio::runtime::Runtime, result_ttl: Duration) -> SharedStore {
    let store = SharedStore::new(MemoryStore::new());
    let task = Task::new("memory_bench_fill").result_ttl(result_ttl);
    runtime.block_on(async {
        for key in 0..LIVE {
            let _: u64 = task
                .call(format!("fill-{key}"))
                .store(store.clone())
                .run(async { Ok::<_, Error>(key) })
                .await
                .unwrap();
        }
    });
    store
}

fn rows(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let fresh = AtomicU64::new(0);
    let mut group = c.benchmark_group("memory store");
    for (name, store) in [
        ("empty", SharedStore::new(MemoryStore::new())),
        (
            "1M live results",
            filled(&runtime, Duration::from_secs(3600)),
        ),
    ] {
        runtime.block_on(call(&store, "duplicate".to_owned()));
        group.bench_function(format!("fresh call, {name}"), |b| {
            b.iter(|| {
                let key = format!("fresh-{}", fresh.fetch_add(1, Ordering::Relaxed));
                runtime.block_on(call(black_box(&store), key))
            });
        });
        group.bench_function(format!("duplicate call, {name}"), |b| {
            b.iter(|| runtime.block_on(call(black_box(&store), "duplicate".to_owned())));
        });
    }
    group.finish();
}

criterion_group!(benches, rows);
criterion_main!(benches);
