//! The client-side work of one task call, without I/O (the target: under 2 µs per task).
//!
//! Each step on its own, then the whole client-side path of a fresh and of a duplicate call
//! against Redis without the round trips, then a whole call on `MemoryStore` (which adds the
//! runner's own bookkeeping and the in-memory store's work).
//!
//! ```text
//! cargo bench -p idempotask-redis --bench client_side
//! ```

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};

use criterion::{Criterion, criterion_group, criterion_main};
use idempotask::operator::{Marker, StoredResult};
use idempotask::store::Store;
use idempotask::store::{LockToken, UnitOfWork};
use idempotask::{Error, MemoryStore, Task};
use idempotask_redis::RedisKeys;

const TASK: &str = "charge_customer";
const KEY: &str = "order-charge-1764460000123";
const NAMESPACE: &str = "default";

fn steps(c: &mut Criterion) {
    let unit = UnitOfWork::new(TASK, KEY).unwrap();
    let marker = stored_marker(&unit);

    let keys = RedisKeys::new(NAMESPACE).unwrap();
    let mut group = c.benchmark_group("step");
    group.bench_function("key derivation and SHA-256", |b| {
        b.iter(|| UnitOfWork::new(black_box(TASK), black_box(KEY)).unwrap());
    });
    group.bench_function("redis key", |b| {
        b.iter(|| keys.unit(black_box(&unit)));
    });
    group.bench_function("lock token", |b| b.iter(LockToken::generate));
    group.bench_function("result encoding", |b| {
        b.iter(|| serde_json::value::to_raw_value(black_box(&())).unwrap());
    });
    group.bench_function("marker and result decoding", |b| {
        b.iter(|| decode_unit(black_box(&marker)));
    });
    group.finish();

    let mut group = c.benchmark_group("per task");
    // A fresh call's own work besides the store is the whole call on `MemoryStore` below.
    // A duplicate: the key, a token, the key name for `begin`, and decoding the stored result.
    group.bench_function("duplicate, client side", |b| {
        b.iter(|| {
            let unit = UnitOfWork::new(TASK, black_box(KEY)).unwrap();
            let token = LockToken::generate();
            let begin = keys.unit(&unit);
            decode_unit(black_box(&marker));
            black_box((token, begin))
        });
    });
    group.finish();
}

/// The marker a `()` call stores for `unit`, as the store holds it.
fn stored_marker(unit: &UnitOfWork) -> Vec<u8> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let store = MemoryStore::new();
    runtime.block_on(async {
        Task::new(TASK)
            .call(unit.key())
            .store(store.clone())
            .run(async { Ok::<_, Error>(()) })
            .await
            .unwrap();
        store.inspect(unit).await.unwrap().marker.unwrap()
    })
}

fn decode_unit(bytes: &[u8]) {
    let marker = Marker::decode(bytes).unwrap();
    let StoredResult::Json(json) = marker.result() else {
        panic!("a stored `()`")
    };
    serde_json::from_str::<()>(json.get()).unwrap();
}

fn memory_store(c: &mut Criterion) {
    static CHARGE: Task = Task::new(TASK);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let store = MemoryStore::new();
    let next = AtomicU64::new(0);
    let run = |key: String| {
        CHARGE
            .call(key)
            .store(store.clone())
            .run(async { Ok::<_, Error>(()) })
    };
    let mut group = c.benchmark_group("whole call on MemoryStore");
    group.bench_function("fresh", |b| {
        b.iter(|| {
            let key = format!("order-{}", next.fetch_add(1, Ordering::Relaxed));
            runtime.block_on(run(key)).unwrap();
        });
    });
    runtime.block_on(run(KEY.to_owned())).unwrap();
    group.bench_function("duplicate", |b| {
        b.iter(|| runtime.block_on(run(KEY.to_owned())).unwrap());
    });
    group.finish();
}

criterion_group!(benches, steps, memory_store);
criterion_main!(benches);
