//! Concurrent deliveries of the same keys from several OS processes, on one real Redis and on
//! a Redis Cluster.
//!
//! The parent test starts Redis and re-runs this test binary as worker processes (the
//! `worker_process` test, which does nothing unless the parent set its environment).

use idempotask_test_support as support;

use std::collections::HashMap;
use std::time::Duration;

use idempotask::store::SharedStore;
use idempotask::{Error, RedisClusterStore, RedisStore, Task};
use redis::aio::ConnectionLike;
use support::RedisServer;
use support::cluster::RedisCluster;

const PROCESSES: usize = 2;
const KEYS: usize = 25;
const DELIVERIES_PER_KEY: usize = 64;
/// The URL of the server the workers use.
const WORKER_ENV: &str = "IDEMPOTASK_TEST_WORKER_REDIS";
/// The URLs of the cluster nodes the workers use, comma-separated.
const WORKER_CLUSTER_ENV: &str = "IDEMPOTASK_TEST_WORKER_CLUSTER";

static SHIP: Task = Task::new("ship_order");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_from_several_processes_run_each_key_once() {
    let server = RedisServer::start();
    deliver_from_processes((WORKER_ENV, server.url()), server.connection().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_from_several_processes_run_each_key_once_on_a_cluster() {
    let cluster = RedisCluster::start();
    let env = (WORKER_CLUSTER_ENV, cluster.urls().join(","));
    deliver_from_processes(env, cluster.connection().await).await;
}

/// Starts the workers with `env` naming the Redis to use; `conn` is a plain connection to it.
async fn deliver_from_processes<C: ConnectionLike>(env: (&str, String), mut conn: C) {
    let exe = std::env::current_exe().unwrap();
    let workers: Vec<_> = (0..PROCESSES)
        .map(|_| {
            tokio::process::Command::new(&exe)
                .args([
                    "--exact",
                    "worker_process",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(env.0, &env.1)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::inherit())
                .kill_on_drop(true)
                .spawn()
                .unwrap()
        })
        .collect();

    // Start every worker at once: each reports ready, then waits for the go signal.
    for _ in 0..PROCESSES {
        let ready: Option<(String, String)> = redis::cmd("BLPOP")
            .arg("test:ready")
            .arg(30)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(ready.is_some(), "a worker process did not start");
    }
    let _: i64 = redis::cmd("RPUSH")
        .arg("test:go")
        .arg(vec!["go"; PROCESSES])
        .query_async(&mut conn)
        .await
        .unwrap();

    let mut results: HashMap<String, Vec<String>> = HashMap::new();
    let mut executed = 0;
    let mut waited_on_another_process = 0;
    for worker in workers {
        let output = worker.wait_with_output().await.unwrap();
        assert!(
            output.status.success(),
            "a worker failed: {:?}",
            output.status
        );
        for line in String::from_utf8(output.stdout).unwrap().lines() {
            // libtest may print "test worker_process ... " on the same line as the first result.
            if let Some(rest) = line.split_once("RESULT ").map(|(_, rest)| rest) {
                let fields: Vec<&str> = rest.split(' ').collect();
                let [key, value, ran, waited_on_other] = fields[..] else {
                    panic!("bad worker line {line:?}");
                };
                results
                    .entry(key.to_owned())
                    .or_default()
                    .push(value.to_owned());
                executed += usize::from(ran == "true");
                waited_on_another_process += usize::from(waited_on_other == "true");
            }
        }
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
    if let Ok(url) = std::env::var(WORKER_ENV) {
        let store = SharedStore::new(RedisStore::connect(&url).await.unwrap());
        let client = redis::Client::open(url).unwrap();
        work(
            store,
            client.get_multiplexed_async_connection().await.unwrap(),
        )
        .await;
    } else if let Ok(urls) = std::env::var(WORKER_CLUSTER_ENV) {
        let urls: Vec<&str> = urls.split(',').collect();
        let store = SharedStore::new(RedisClusterStore::connect(urls.clone()).await.unwrap());
        let client = redis::cluster::ClusterClient::new(urls).unwrap();
        work(store, client.get_async_connection().await.unwrap()).await;
    }
    // Otherwise this runs as an ordinary test: only the parents above start workers.
}

async fn work<C: ConnectionLike + Clone + Send + 'static>(store: SharedStore, mut conn: C) {
    let _: i64 = redis::cmd("RPUSH")
        .arg("test:ready")
        .arg(std::process::id())
        .query_async(&mut conn)
        .await
        .unwrap();
    let _: Option<(String, String)> = redis::cmd("BLPOP")
        .arg("test:go")
        .arg(30)
        .query_async(&mut conn)
        .await
        .unwrap();

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
    for delivery in deliveries {
        let (key, report) = delivery.await.unwrap();
        let executed = report.outcome == idempotask::Outcome::Executed;
        let executor = report.value.split('/').next().unwrap_or_default();
        let waited_on_other = report.attempts > 1 && executor != std::process::id().to_string();
        println!("RESULT {key} {} {executed} {waited_on_other}", report.value);
    }
}
