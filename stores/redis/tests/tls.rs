//! Every Redis store over TLS behind a private CA (a certificate for 127.0.0.1 made with
//! `openssl` at test time): `RedisClusterStore` on a Redis Cluster with `tls-cluster yes`,
//! `RedisStore` on one server and `RedlockStore` on three. Each connects with the CA given to
//! `tls_root_certificate`, runs a task once and replays it; without the CA, `connect` fails
//! with a `Configuration` error that names the setting.
//!
//! The Cluster case is the one that matters most: a Cluster reached through `rediss://` takes
//! its trusted roots from the builder alone, so without this setting a private CA leaves it
//! unusable.

use idempotask_test_support as support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use idempotask::store::{Store, StoreError, StoreErrorKind};
use idempotask::{Error, Task};
use idempotask_redis::{RedisClusterStore, RedisStore, RedlockStore};
use support::RedisServer;
use support::cluster::RedisCluster;
use support::tls::PrivateCa;

/// Runs `keys` keys three times each on `store`: each body runs once, the other two
/// deliveries replay its result.
async fn runs_once_and_replays(store: impl Store + Clone + 'static, keys: u64) {
    let runs = AtomicU64::new(0);
    let task = Task::new("tls");
    for key in 0..keys {
        for _ in 0..3 {
            let value: u64 = task
                .call(format!("order-{key}"))
                .store(store.clone())
                .run(async {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, Error>(key * 10)
                })
                .await
                .unwrap();
            assert_eq!(value, key * 10);
        }
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        keys,
        "each key's body runs once"
    );
}

/// `connect` without the CA: refused in bounded time with a typed, non-retryable error that
/// says what to set, and no panic.
async fn refused_without_the_ca<S: std::fmt::Debug>(
    connect: impl Future<Output = Result<S, StoreError>>,
) {
    let started = Instant::now();
    let err = connect
        .await
        .expect_err("a certificate from an unknown CA was accepted");
    assert_eq!(err.kind(), StoreErrorKind::Configuration, "{err}");
    assert!(!err.is_retryable() && !err.is_ambiguous(), "{err}");
    assert!(err.to_string().contains("tls_root_certificate"), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(7),
        "refused after {:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_behind_a_private_ca_is_used_with_its_root_certificate() {
    let ca = PrivateCa::generate();
    let cluster = RedisCluster::start_tls(&ca);
    let seeds = cluster.tls_urls();

    let store = RedisClusterStore::builder(seeds.clone())
        .namespace("tls")
        .tls_root_certificate(ca.ca_pem())
        .connect()
        .await
        .expect("the store connects over TLS with the private CA");
    // The client addresses every master by its TLS port: the slot map came over TLS, and so
    // do the commands.
    let tls_ports: Vec<u16> = seeds
        .iter()
        .map(|url| url.rsplit(':').next().unwrap().parse().unwrap())
        .collect();
    let masters = store.masters().await.unwrap();
    assert_eq!(masters.len(), 3, "{masters:?}");
    assert!(
        masters.iter().all(|(_, port)| tls_ports.contains(port)),
        "a master not on a TLS port: {masters:?} (TLS ports {tls_ports:?})"
    );
    // Twelve keys spread over every master.
    runs_once_and_replays(store, 12).await;

    refused_without_the_ca(
        RedisClusterStore::builder(seeds)
            .connection_timeout(Duration::from_secs(2))
            .connect(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_server_and_a_quorum_behind_a_private_ca_are_used_with_its_root_certificate() {
    let ca = PrivateCa::generate();
    let servers: Vec<(RedisServer, String)> = (0..3)
        .map(|_| {
            let tls_port = support::free_port();
            let args = ca.redis_args(tls_port);
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let server = RedisServer::start_with(&args);
            (server, format!("rediss://127.0.0.1:{tls_port}"))
        })
        .collect();
    let urls: Vec<String> = servers.iter().map(|(_, url)| url.clone()).collect();

    let store = RedisStore::builder(&urls[0])
        .namespace("tls")
        .tls_root_certificate(ca.ca_pem())
        .connect()
        .await
        .expect("the store connects over TLS with the private CA");
    runs_once_and_replays(store, 2).await;
    refused_without_the_ca(
        RedisStore::builder(&urls[0])
            .connection_timeout(Duration::from_secs(2))
            .connect(),
    )
    .await;

    // A namespace of its own: the first server already holds the markers of the keys above.
    let quorum = RedlockStore::builder(urls.clone())
        .namespace("tls-quorum")
        .tls_root_certificate(ca.ca_pem())
        .connect()
        .await
        .expect("the quorum connects over TLS with the private CA");
    runs_once_and_replays(quorum, 2).await;
    refused_without_the_ca(
        RedlockStore::builder(urls)
            .connection_timeout(Duration::from_secs(2))
            .connect(),
    )
    .await;
}
