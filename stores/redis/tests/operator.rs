//! The core's `Operator` on `RedisStore` (Redis 7 and Valkey 8.1) and on `RedisClusterStore`:
//! the operator's contract (`idempotask_conformance::check_operator`), and what only Redis can
//! hold under a unit's key (a value no delivery wrote, a hash, a lock without an expiry, a
//! name that is not UTF-8), read back as data and never a panic; and the stores' own `list_task`
//! finding what the trait's pages find.

use idempotask_test_support as support;

use std::collections::BTreeMap;

use idempotask::Task;
use idempotask::operator::{Cursor, Forgot, Held, Operator, SharedOperator};
use idempotask::store::{StoreErrorKind, UnitOfWork};
use idempotask_redis::operator::Listing;
use idempotask_redis::{RedisClusterStore, RedisStore};
use support::RedisServer;
use support::cluster::RedisCluster;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_7_keeps_the_operator_contract() {
    let server = RedisServer::start();
    idempotask_conformance::check_operator(server.store().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn valkey_8_1_keeps_the_operator_contract() {
    let server = RedisServer::start_valkey();
    idempotask_conformance::check_operator(server.store().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_cluster_keeps_the_operator_contract() {
    let cluster = RedisCluster::shared();
    idempotask_conformance::check_operator(cluster.fresh_store().await).await;
}

/// Every unit of `task`, walked with pages of `limit`, by digest.
async fn listing_of(operator: &impl Operator, task: &str, limit: usize) -> BTreeMap<String, Held> {
    let mut units = BTreeMap::new();
    let mut from = None;
    loop {
        let page = operator.list(task, from.as_ref(), limit).await.unwrap();
        units.extend(page.units.into_iter().map(|unit| (unit.digest, unit.held)));
        match page.next {
            Some(next) => from = Some(next),
            None => return units,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_no_delivery_wrote_reads_back_as_data() {
    let server = RedisServer::start();
    let store = server.store().await;
    let mut conn = server.connection().await;
    let unit = |key: &str| UnitOfWork::new("charge", key).unwrap();
    let (foreign, hash, forever) = (unit("order-1"), unit("order-2"), unit("order-3"));
    let set = |key: String, value: &'static [u8]| redis::cmd("SET").arg(key).arg(value).clone();
    let _: () = set(store.key(&foreign), b"\xff\x00OK")
        .query_async(&mut conn)
        .await
        .unwrap();
    let _: () = redis::cmd("HSET")
        .arg(store.key(&hash))
        .arg("field")
        .arg("value")
        .query_async(&mut conn)
        .await
        .unwrap();
    let _: () = set(store.key(&forever), b"Labc.7")
        .query_async(&mut conn)
        .await
        .unwrap();
    // A name under the task's pattern that is not UTF-8, and one that is no unit's.
    let pattern = store.key(&foreign);
    let prefix = &pattern[..pattern.len() - foreign.digest().len()];
    let odd = [prefix.as_bytes(), b"\xff\xfe"].concat();
    let _: () = redis::cmd("SET")
        .arg(odd)
        .arg("x")
        .query_async(&mut conn)
        .await
        .unwrap();
    let _: () = set(format!("{prefix}not-a-digest"), b"x")
        .query_async(&mut conn)
        .await
        .unwrap();

    let operator = SharedOperator::new(store.clone());
    let Held::Foreign { bytes, .. } = operator.read(&foreign).await.unwrap() else {
        panic!("a value no delivery wrote");
    };
    assert_eq!(bytes, b"\xff\x00OK");
    assert!(
        matches!(operator.read(&hash).await.unwrap(), Held::OtherType { kind, .. } if kind == "hash")
    );
    assert!(matches!(
        operator.read(&forever).await.unwrap(),
        Held::Lock {
            lock_ttl_remaining: None,
            fencing_token: Some(7),
            ..
        }
    ));
    for limit in [1, 1000] {
        let units = listing_of(&operator, "charge", limit).await;
        let digests: Vec<&str> = units.keys().map(String::as_str).collect();
        let mut expected = [foreign.digest(), hash.digest(), forever.digest()];
        expected.sort_unstable();
        assert_eq!(digests, expected, "pages of {limit}");
    }
    let stats = operator.stats("charge").await.unwrap();
    assert_eq!((stats.unreadable, stats.locked, stats.done), (2, 1, 0));

    // What was shown, exactly, is forgotten; a hash never is.
    assert_eq!(
        operator.forget_exact(&foreign, &bytes).await.unwrap(),
        Forgot::Deleted
    );
    assert_eq!(
        operator.forget_exact(&hash, b"").await.unwrap(),
        Forgot::Changed
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cursor_of_another_store_is_refused() {
    let server = RedisServer::start();
    let store: RedisStore = server.store().await;
    let cluster = RedisCluster::shared().fresh_store().await;
    for (cursor, operator) in [
        ("1792/7001/127.0.0.1", SharedOperator::new(store)),
        ("1792", SharedOperator::new(cluster)),
    ] {
        let refused = operator
            .list("charge", Some(&Cursor::new(cursor)), 10)
            .await
            .unwrap_err();
        assert_eq!(refused.kind(), StoreErrorKind::Configuration, "{refused}");
        assert!(refused.to_string().contains(cursor), "{refused}");
    }
}

/// The store's own `list_task` (what the CLI used before the trait) and the trait's pages agree:
/// both are one walk of `SCAN` pages, read by key.
async fn list_task_agrees_with_the_pages<S>(store: S, list_task: impl AsyncFnOnce(&S) -> Listing)
where
    S: Operator + idempotask::store::Store + Clone,
{
    for key in 0..40 {
        let task = Task::named("charge").fencing(true);
        let call = task.call(format!("order-{key}")).store(store.clone());
        call.run(async { Ok::<_, idempotask::Error>(key) })
            .await
            .unwrap();
    }
    let listing = list_task(&store).await;
    let paged = listing_of(&store, "charge", 7).await;
    let digests: Vec<&String> = listing.units.keys().collect();
    assert_eq!(digests, paged.keys().collect::<Vec<_>>());
    assert_eq!(listing.keys_seen, 40);
    assert!(listing.servers_scanned >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_task_agrees_with_the_pages_on_redis_and_a_cluster() {
    let server = RedisServer::start();
    list_task_agrees_with_the_pages(server.store().await, async |store: &RedisStore| {
        store.list_task("charge").await.unwrap()
    })
    .await;
    let cluster = RedisCluster::shared().fresh_store().await;
    list_task_agrees_with_the_pages(cluster, async |store: &RedisClusterStore| {
        let listing = store.list_task("charge").await.unwrap();
        assert_eq!(listing.servers_scanned, 3);
        listing
    })
    .await;
}
