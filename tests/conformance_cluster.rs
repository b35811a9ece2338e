//! The conformance suite on `RedisClusterStore`, on one local cluster of 3 masters and
//! 3 replicas shared by the checks of this binary (each check has a namespace of its own),
//! and what is particular to a cluster: where the keys go.

mod support;

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use idempotask::{Begin, Finish, LockToken, Store, UnitOfWork};
use support::cluster::RedisCluster;

crate::conformance_tests!({
    let cluster = RedisCluster::shared();
    let store: Arc<dyn idempotask::Store> = Arc::new(cluster.fresh_store().await);
    (cluster, store)
});

/// Units of random tasks and keys, odd characters included.
fn random_units(count: usize) -> Vec<UnitOfWork> {
    (0..count)
        .map(|i| {
            let task = format!("task_{}", rand::random::<u16>() % 7);
            let key = format!("{{{i}}}:{:x}\n{{", rand::random::<u64>());
            UnitOfWork::new(&task, key).unwrap()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_of_random_units_share_a_slot_and_spread_over_every_master() {
    let cluster = RedisCluster::shared();
    let store = cluster.fresh_store().await;
    let masters = cluster.masters();
    assert_eq!(masters.len(), 3, "{masters:?}");

    let units = random_units(300);
    let mut per_master: BTreeMap<u16, usize> = BTreeMap::new();
    let mut slots = HashSet::new();
    for unit in &units {
        let keys = store.keys(unit);
        let slot = cluster.slot_of(&keys[0]);
        for key in &keys[1..] {
            assert_eq!(cluster.slot_of(key), slot, "{keys:?}");
        }
        slots.insert(slot);
        let owner = masters.iter().find(|m| m.owns(slot)).expect("an owner");
        *per_master.entry(owner.port).or_default() += 1;
    }
    println!(
        "{} units over {} slots; units per master (by port): {per_master:?}",
        units.len(),
        slots.len()
    );
    assert_eq!(per_master.len(), 3, "{per_master:?}");
    assert!(per_master.values().all(|&n| n > 0));

    // Every script of the protocol on every unit: a CROSSSLOT (or any other error) would fail.
    for unit in &units {
        let token = LockToken::generate();
        let day = Duration::from_secs(86_400);
        assert!(matches!(
            store.begin(unit, &token, day, day).await.unwrap(),
            Begin::Acquired { .. }
        ));
        assert!(store.renew(unit, &token, day).await.unwrap());
        assert!(store.inspect(unit).await.unwrap().is_locked());
        assert_eq!(
            store.finish(unit, &token, b"{}", day).await.unwrap(),
            Finish::Completed
        );
        assert!(!store.release(unit, &token).await.unwrap());
        assert!(store.forget(unit).await.unwrap());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cross_slot_script_is_what_the_hash_tag_prevents() {
    // The control experiment: the same keys without the shared tag are refused by the cluster,
    // so the test above passing means the tag, not luck, kept every script in one slot.
    let cluster = RedisCluster::shared();
    let mut conn = cluster.connection().await;
    let (a, b) = ("idempotask:v1:no-tag:a:lock", "idempotask:v1:no-tag:b:done");
    assert_ne!(cluster.slot_of(a), cluster.slot_of(b));
    let refused: redis::RedisResult<redis::Value> = redis::cmd("EVAL")
        .arg("return redis.call('GET', KEYS[1])")
        .arg(2)
        .arg(a)
        .arg(b)
        .query_async(&mut conn)
        .await;
    let err = refused.unwrap_err();
    assert_eq!(
        err.kind(),
        redis::ErrorKind::Server(redis::ServerErrorKind::CrossSlot),
        "{err}"
    );
}
