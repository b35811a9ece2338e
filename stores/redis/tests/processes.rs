//! Concurrent deliveries of the same keys from several OS processes, on one real Redis and on
//! a Redis Cluster.
//!
//! The parent test starts Redis and re-runs this test binary as worker processes (the
//! `worker_process` test, which does nothing unless the parent gave it a config; see
//! `support::workers`).

use idempotask_test_support as support;

use std::collections::HashMap;
use std::time::Duration;

use idempotask::store::SharedStore;
use idempotask::{Error, Task};
use idempotask_redis::{RedisClusterStore, RedisStore};
use redis::aio::ConnectionLike;
use serde::{Deserialize, Serialize};
use support::RedisServer;
use support::cluster::RedisCluster;
use support::workers::{self, Workers};

const PROCESSES: usize = 2;
const KEYS: usize = 25;
const DELIVERIES_PER_KEY: usize = 64;

static SHIP: Task = Task::new("ship_order");

/// Where the workers find Redis.
#[derive(Serialize, Deserialize)]
enum Servers {
    /// One server's URL.
    Single(String),
    /// The URLs of the cluster's nodes.
    Cluster(Vec<String>),
}

/// One delivery, as a worker reports it.
#[derive(Serialize, Deserialize)]
struct Delivery {
    key: String,
    value: String,
    executed: bool,
    /// The delivery found the lock held by the other process and got its result after waiting.
    waited_on_other: bool,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_from_several_processes_run_each_key_once() {
    let server = RedisServer::start();
    deliver_from_processes(&Servers::Single(server.url()), server.connection().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_from_several_processes_run_each_key_once_on_a_cluster() {
    let cluster = RedisCluster::start();
    let servers = Servers::Cluster(cluster.urls());
    deliver_from_processes(&servers, cluster.connection().await).await;
}

/// Starts the workers on `servers` all at once; `conn` is a plain connection to them.
async fn deliver_from_processes<C: ConnectionLike>(servers: &Servers, mut conn: C) {
    let mut workers = Workers::spawn(PROCESSES, "worker_process", servers);
    workers.start_together(Duration::from_secs(30)).await;
    let reports: Vec<Vec<Delivery>> = workers.reports(Duration::from_secs(120)).await;

    let mut results: HashMap<String, Vec<String>> = HashMap::new();
    let mut executed = 0;
    let mut waited_on_another_process = 0;
    for delivery in reports.into_iter().flatten() {
        executed += usize::from(delivery.executed);
        waited_on_another_process += usize::from(delivery.waited_on_other);
        results
            .entry(delivery.key)
            .or_default()
            .push(delivery.value);
    }

    assert_eq!(results.len(), KEYS);
    for (key, values) in &results {
        assert_eq!(values.len(), DELIVERIES_PER_KEY, "{key}");
        assert!(values.iter().all(|v| *v == values[0]), "{key}: {values:?}");
        let executions: i64 = redis::cmd("GET")
            .arg(format!("test:executions:{key}"))
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(executions, 1, "{key} ran {executions} times");
    }
    assert_eq!(executed, KEYS);
    // The processes really competed: some deliveries found the lock held by the other process
    // and got its result after waiting.
    assert!(
        waited_on_another_process > 0,
        "no delivery waited on the other process"
    );
}

/// A worker process: delivers every key `DELIVERIES_PER_KEY / PROCESSES` times concurrently.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_process() {
    // Run as an ordinary test, this does nothing: only the parents above start workers.
    match workers::config::<Servers>() {
        Some(Servers::Single(url)) => {
            let store = SharedStore::new(RedisStore::connect(&url).await.unwrap());
            let client = redis::Client::open(url).unwrap();
            work(
                store,
                client.get_multiplexed_async_connection().await.unwrap(),
            )
            .await;
        }
        Some(Servers::Cluster(urls)) => {
            let store = SharedStore::new(RedisClusterStore::connect(urls.clone()).await.unwrap());
            let client = redis::cluster::ClusterClient::new(urls).unwrap();
            work(store, client.get_async_connection().await.unwrap()).await;
        }
        None => {}
    }
}

async fn work<C: ConnectionLike + Clone + Send + 'static>(store: SharedStore, conn: C) {
    workers::wait_for_start().await;
    let mut deliveries = Vec::new();
    for round in 0..DELIVERIES_PER_KEY / PROCESSES {
        for key in 0..KEYS {
            let (store, mut conn) = (store.clone(), conn.clone());
            deliveries.push(tokio::spawn(async move {
                let key = format!("order-{key}");
                let counter = format!("test:executions:{key}");
                let report = SHIP
                    .call(key.clone())
                    .store(store)
                    .run_reported(async move {
                        let _: i64 = redis::cmd("INCR")
                            .arg(&counter)
                            .query_async(&mut conn)
                            .await
                            .unwrap();
                        // Keep the lock a while so that deliveries from both processes overlap.
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        Ok::<_, Error>(format!(
                            "{}/{round}/{}",
                            std::process::id(),
                            rand::random::<u64>()
                        ))
                    })
                    .await
                    .unwrap();
                (key, report)
            }));
        }
    }
    let mut report = Vec::with_capacity(deliveries.len());
    for delivery in deliveries {
        let (key, outcome) = delivery.await.unwrap();
        let executor = outcome.value.split('/').next().unwrap_or_default();
        report.push(Delivery {
            key,
            executed: outcome.outcome == idempotask::Outcome::Executed,
            waited_on_other: outcome.attempts > 1 && executor != std::process::id().to_string(),
            value: outcome.value,
        });
    }
    workers::report(&report);
}
