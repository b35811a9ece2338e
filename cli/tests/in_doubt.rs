//! Units in doubt through the `idempotask` binary, against a redis-server (and a Redis Cluster)
//! this test starts: a worker killed after its side effect leaves its lock to run out; `status`
//! shows it, `list --in-doubt` finds it, `forget` refuses it, and `resolve` settles it (records
//! the result it had, or frees it) only while it still holds the lock that was shown. The
//! scenarios are `common`'s, which `postgres.rs` runs on PostgreSQL too.

use idempotask_test_support as support;

use idempotask::Outcome;
use idempotask::store::Fencing;
use serde_json::json as value;
use support::RedisServer;
use support::cluster::RedisCluster;

mod common;

use common::{Redis, deliver_on, json, leave_in_doubt_on, runtime};

#[test]
fn status_list_and_forget_show_a_unit_in_doubt() {
    let server = RedisServer::start();
    let out = common::status_list_and_forget_show_a_unit_in_doubt(&Redis(&server));
    // A Redis lock does not know its caller key: the row names the digest.
    assert!(out.contains("\ndoubt   digest:"), "{out}");
}

#[test]
fn a_recorded_result_is_what_the_next_delivery_gets_back() {
    let server = RedisServer::start();
    common::a_recorded_result_is_what_the_next_delivery_gets_back(&Redis(&server));
}

#[test]
fn a_freed_unit_runs_as_new_with_no_doubt() {
    let server = RedisServer::start();
    common::a_freed_unit_runs_as_new_with_no_doubt(&Redis(&server), || {});
}

#[test]
fn resolve_refuses_a_unit_not_in_doubt() {
    let server = RedisServer::start();
    common::resolve_refuses_a_unit_not_in_doubt(&Redis(&server));
}

#[test]
fn resolve_leaves_alone_a_unit_that_changed_while_it_asked() {
    let server = RedisServer::start();
    common::resolve_leaves_alone_a_unit_that_changed_while_it_asked(&Redis(&server));
}

#[test]
fn status_list_and_resolve_work_on_a_redis_cluster() {
    let cluster = RedisCluster::shared();
    let namespace = format!("t{:016x}", rand::random::<u64>());
    let keys: Vec<String> = (0..12).map(|i| format!("order-{i}")).collect();
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    runtime().block_on(async {
        let store = cluster.store_in(&namespace).await;
        leave_in_doubt_on(&store, "charge", &keys, Fencing::On).await;
    });
    let deliver = |key: &str| {
        runtime().block_on(async { deliver_on(&cluster.store_in(&namespace).await, key).await })
    };
    let url = cluster.urls()[0].clone();
    let idempotask = |args: &[&str]| {
        let mut all = vec!["--namespace", &namespace];
        all.extend(args);
        common::run("--redis-url", &url, &all)
    };

    let listing = json(&idempotask(&["list", "--task", "charge", "--in-doubt", "--json"]).1);
    assert_eq!(listing["cluster"], true);
    assert_eq!(listing["in_doubt"], 12, "{listing}");
    let (code, out, _) = idempotask(&["status", "--task", "charge", "--key", "order-1"]);
    assert_eq!(code, 5, "{out}");

    let (code, _, err) = idempotask(&[
        "resolve", "--task", "charge", "--key", "order-1", "--result", "7", "--yes",
    ]);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = idempotask(&[
        "resolve", "--task", "charge", "--key", "order-2", "--free", "--yes",
    ]);
    assert_eq!(code, 0, "{err}");
    let (report, ran) = deliver("order-1");
    assert!(!ran && report.outcome == Outcome::Replayed && report.value == value!(7));
    let (report, ran) = deliver("order-2");
    assert!(ran && report.in_doubt.is_none());
    let listing = json(&idempotask(&["list", "--task", "charge", "--json"]).1);
    assert_eq!(
        (&listing["done"], &listing["in_doubt"]),
        (&value!(2), &value!(10)),
        "{listing}"
    );
}
