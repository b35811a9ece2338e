//! `LocalResultCache` over a real Redis: a duplicate it answers sends the server no command,
//! counted by the server itself, and a second process's cache learns a marker with one read.

use idempotask_test_support as support;

use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicUsize, Ordering};

use idempotask::store::LocalResultCache;
use idempotask::{Error, Task};
use idempotask_redis::RedisStore;
use support::RedisServer;
use support::commandstats::{commands_run, reset_stats, stats};

static CHARGE: Task = Task::new("charge");

async fn charge(
    store: &LocalResultCache<RedisStore>,
    key: &str,
    value: u32,
    ran: &AtomicUsize,
) -> Result<u32, Error> {
    CHARGE
        .call(key)
        .store(store.clone())
        .run(async {
            ran.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Error>(value)
        })
        .await
}

fn cache(store: RedisStore) -> LocalResultCache<RedisStore> {
    LocalResultCache::new(store, NonZeroUsize::new(1000).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cached_duplicate_sends_redis_no_command() {
    let server = RedisServer::start();
    let mut conn = server.connection().await;
    let here = cache(server.store().await);
    let ran = AtomicUsize::new(0);
    assert_eq!(charge(&here, "order-1", 1, &ran).await.unwrap(), 1);
    reset_stats(&mut conn).await;
    for value in 2..12 {
        assert_eq!(charge(&here, "order-1", value, &ran).await.unwrap(), 1);
    }
    assert_eq!(
        commands_run(&mut conn).await,
        stats(&[]),
        "ten duplicates, no command"
    );
    assert_eq!(ran.load(Ordering::SeqCst), 1);

    // Without the cache, each duplicate costs the store's one command.
    let uncached = server.store().await;
    reset_stats(&mut conn).await;
    for value in 2..12 {
        let again: u32 = CHARGE
            .call("order-1")
            .store(uncached.clone())
            .run(async move { Ok::<_, Error>(value) })
            .await
            .unwrap();
        assert_eq!(again, 1);
    }
    let sent: u64 = commands_run(&mut conn).await.values().sum();
    assert_eq!(sent, 10, "one command per uncached duplicate");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_process_cache_learns_a_marker_with_one_read_then_sends_nothing() {
    let server = RedisServer::start();
    let mut conn = server.connection().await;
    let (here, there) = (cache(server.store().await), cache(server.store().await));
    let ran = AtomicUsize::new(0);
    charge(&there, "order-2", 1, &ran).await.unwrap();
    reset_stats(&mut conn).await;
    assert_eq!(charge(&here, "order-2", 2, &ran).await.unwrap(), 1);
    let learnt: u64 = commands_run(&mut conn).await.values().sum();
    reset_stats(&mut conn).await;
    for value in 3..8 {
        assert_eq!(charge(&here, "order-2", value, &ran).await.unwrap(), 1);
    }
    assert_eq!(commands_run(&mut conn).await, stats(&[]));
    assert!(
        learnt >= 2,
        "the begin and the read of the marker's time: {learnt}"
    );
    assert_eq!(ran.load(Ordering::SeqCst), 1);
}
