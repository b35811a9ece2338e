//! The conformance suite on `RedisClusterStore`, on one local cluster of 3 masters and
//! 3 replicas shared by the checks of this binary (each check has a namespace of its own),
//! and what is particular to a cluster: where the units go.

use idempotask_test_support as support;

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use idempotask::store::Fencing;
use idempotask::store::{Begin, Finish, LockToken, Store, UnitOfWork};
use support::cluster::RedisCluster;

idempotask_conformance::conformance_tests!({
    let cluster = RedisCluster::shared();
    let store = cluster.fresh_store().await;
    (cluster, store)
});

mod in_doubt {
    use super::*;

    idempotask_conformance::doubt_conformance_tests!({
        let cluster = RedisCluster::shared();
        let store = cluster.fresh_store().await;
        (cluster, store)
    });
}

/// Steps: the journal beside the unit's key, in its hash slot.
mod steps {
    use super::*;

    idempotask_conformance::step_conformance_tests!({
        let cluster = RedisCluster::shared();
        let store = cluster.fresh_store().await;
        (cluster, store)
    });
}

/// The same checks on connections that speak RESP3 (`?protocol=resp3` on every seed URL):
/// replies arrive as RESP3 types, scripts' `nil`s as RESP3 nulls.
mod resp3 {
    use super::*;

    async fn resp3_store(cluster: &RedisCluster) -> idempotask_redis::RedisClusterStore {
        let urls = cluster
            .urls()
            .into_iter()
            .map(|url| format!("{url}/?protocol=resp3"));
        idempotask_redis::RedisClusterStore::builder(urls.collect::<Vec<_>>())
            .namespace(format!("t{:016x}", rand::random::<u64>()))
            .connect()
            .await
            .unwrap()
    }

    idempotask_conformance::conformance_tests!({
        let cluster = RedisCluster::shared();
        let store = resp3_store(&cluster).await;
        (cluster, store)
    });

    mod steps {
        use super::*;

        idempotask_conformance::step_conformance_tests!({
            let cluster = RedisCluster::shared();
            let store = resp3_store(&cluster).await;
            (cluster, store)
        });
    }

    /// The checks above would pass on RESP2 too: on a cluster of its own (the shared one
    /// carries the other stores of this module), every master must see a RESP3 client once
    /// such a store has sent commands to it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_store_speaks_resp3_to_every_master() {
        let cluster = RedisCluster::start();
        let store = resp3_store(&cluster).await;
        for unit in random_units(60) {
            let token = LockToken::generate();
            store
                .begin(&unit, &token, Duration::from_secs(60), Fencing::Off)
                .await
                .unwrap();
        }
        for master in cluster.masters() {
            let url = format!("redis://127.0.0.1:{}", master.port);
            assert!(
                support::has_resp3_client(&url).await,
                "no RESP3 client on master {url}"
            );
        }
    }
}

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
async fn units_spread_over_every_master_and_every_operation_works_on_each() {
    let cluster = RedisCluster::shared();
    let store = cluster.fresh_store().await;
    let masters = cluster.masters();
    assert_eq!(masters.len(), 3, "{masters:?}");

    let units = random_units(300);
    let mut per_master: BTreeMap<u16, usize> = BTreeMap::new();
    let mut slots = HashSet::new();
    for unit in &units {
        // One key per unit: its slot is the unit's, whatever the caller key holds.
        let slot = cluster.slot_of(&store.key(unit));
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

    // Every command and script of the protocol on every unit, with and without fencing.
    let day = Duration::from_secs(86_400);
    for (index, unit) in units.iter().enumerate() {
        let fencing = if index % 2 == 0 {
            Fencing::Off
        } else {
            Fencing::On
        };
        let token = LockToken::generate();
        let token = match store.begin(unit, &token, day, fencing).await.unwrap() {
            Begin::Acquired {
                fencing_token: Some(fence),
                ..
            } => token.with_fencing_token(fence),
            Begin::Acquired {
                fencing_token: None,
                ..
            } => token,
            other => panic!("{other:?}"),
        };
        assert!(store.renew(unit, &token, day).await.unwrap());
        assert!(store.inspect(unit).await.unwrap().is_locked());
        let marker = format!("D{}|{}|{{}}", unit.key().len(), unit.key());
        assert_eq!(
            store
                .finish(unit, &token, marker.as_bytes(), day)
                .await
                .unwrap(),
            Finish::Completed
        );
        assert!(!store.release(unit, &token).await.unwrap());
        assert!(store.forget(unit).await.unwrap());
    }
}
