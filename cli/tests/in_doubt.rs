//! Units in doubt through the `idempotask` binary, against a redis-server (and a Redis Cluster)
//! this test starts: a worker killed after its side effect leaves its lock to run out; `status`
//! shows it, `list --in-doubt` finds it, `forget` refuses it, and `resolve` settles it (records
//! the result it had, or frees it) only while it still holds the lock that was shown.

use idempotask_test_support as support;

use idempotask::store::{Fencing, LockToken, Store, UnitOfWork};
use idempotask::{Outcome, Report, Task};
use serde_json::{Value, json as value};
use support::RedisServer;
use support::cluster::RedisCluster;

mod common;

use common::{Backend, DOUBT_MEMORY, Redis, json, leave_in_doubt_on, runtime};

/// Leaves `charge`'s `keys` in doubt on `server`.
fn leave_in_doubt(server: &RedisServer, keys: &[&str], fencing: Fencing) {
    runtime().block_on(async {
        leave_in_doubt_on(&server.store().await, "charge", keys, fencing).await;
    });
}

/// Calls `charge`/`key` on `store` as the next delivery does (reruns a unit in doubt); the
/// body returns `{"charge":"ch_rerun"}`. Answers its report and whether the body ran.
async fn deliver_on(store: &(impl Store + Clone + 'static), key: &str) -> (Report<Value>, bool) {
    let mut ran = false;
    let report = Task::named("charge")
        .fencing(true)
        .call(key)
        .store(store.clone())
        .run_reported(async {
            ran = true;
            Ok::<_, idempotask::Error>(value!({ "charge": "ch_rerun" }))
        })
        .await
        .unwrap();
    (report, ran)
}

/// [`deliver_on`] a store of its own on `server`.
fn deliver(server: &RedisServer, key: &str) -> (Report<Value>, bool) {
    runtime().block_on(async { deliver_on(&server.store().await, key).await })
}

#[test]
fn status_list_and_forget_show_a_unit_in_doubt() {
    let server = RedisServer::start();
    let backend = Redis(&server);
    backend.complete("charge", &["order-1"]);
    backend.lock("charge", "order-2");
    leave_in_doubt(&server, &["order-3"], Fencing::On);
    leave_in_doubt(&server, &["order-4"], Fencing::Off);

    let (code, out, _) = backend.idempotask(&["status", "--task", "charge", "--key", "order-3"]);
    assert_eq!(code, 5, "{out}");
    assert!(out.starts_with("charge \"order-3\": in doubt"), "{out}");
    for line in [
        "fencing token  ",
        "lock ran out   ",
        "remembered     for ",
        "--key \"order-3\" --result '<its result as JSON>'   if it did",
        "--key \"order-3\" --free   if it did not",
    ] {
        assert!(out.contains(line), "{line} in {out}");
    }
    let doubt = backend.status_json("charge", "order-3");
    assert_eq!(doubt["state"], "in_doubt");
    assert!(doubt["fencing_token"].as_u64().unwrap() > 0, "{doubt}");
    assert!(
        doubt["expired_for_ms"].as_u64().unwrap() < 60_000,
        "{doubt}"
    );
    let forgotten_in = doubt["forgotten_in_ms"].as_u64().unwrap();
    assert!(
        forgotten_in > 0 && forgotten_in <= 60_000,
        "remembered for DOUBT_MEMORY after it ran out: {doubt}"
    );
    let unfenced = backend.status_json("charge", "order-4");
    assert_eq!(unfenced["fencing_token"], Value::Null, "{unfenced}");

    let (code, out, _) = backend.idempotask(&["list", "--task", "charge"]);
    assert_eq!(code, 0);
    assert!(
        out.starts_with("charge in namespace default: 1 done, 1 locked, 2 in doubt"),
        "{out}"
    );
    assert!(out.contains("\ndoubt   digest:"), "{out}");
    assert!(out.contains("remembered for"), "{out}");
    let listing = json(
        &backend
            .idempotask(&["list", "--task", "charge", "--in-doubt", "--json"])
            .1,
    );
    assert_eq!(
        (&listing["done"], &listing["locked"], &listing["in_doubt"]),
        (&value!(1), &value!(1), &value!(2)),
        "the counts are the task's: {listing}"
    );
    let entries = listing["entries"].as_array().unwrap();
    let mut digests: Vec<&str> = entries
        .iter()
        .map(|e| {
            assert_eq!(e["in_doubt"], true, "{e}");
            assert!(e["expired_for_ms"].is_u64() && e["forgotten_in_ms"].is_u64());
            e["digest"].as_str().unwrap()
        })
        .collect();
    digests.sort_unstable();
    let mut expected = ["order-3", "order-4"]
        .map(|key| UnitOfWork::new("charge", key).unwrap().digest().to_owned());
    expected.sort_unstable();
    assert_eq!(digests, expected);
    for other in ["--locked", "--done"] {
        let (code, _, err) = backend.idempotask(&["list", "--task", "charge", "--in-doubt", other]);
        assert_eq!(code, 2, "{err}");
    }

    let (code, out, err) = backend.idempotask(&[
        "forget", "--json", "--task", "charge", "--key", "order-3", "--yes",
    ]);
    assert_eq!(code, 5);
    assert_eq!(json(&out)["error"]["kind"], "in_doubt");
    assert!(err.contains("idempotask resolve --task charge"), "{err}");
    assert_eq!(
        backend.status_json("charge", "order-3")["state"],
        "in_doubt"
    );
}

#[test]
fn a_recorded_result_is_what_the_next_delivery_gets_back() {
    let server = RedisServer::start();
    let backend = Redis(&server);
    leave_in_doubt(&server, &["order-1"], Fencing::On);
    let earlier = backend.status_json("charge", "order-1")["fencing_token"].clone();

    let (code, out, err) = backend.idempotask(&[
        "resolve",
        "--task",
        "charge",
        "--key",
        "order-1",
        "--result",
        r#"{"charge":"ch_manual"}"#,
        "--result-ttl",
        "2h",
        "--yes",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.starts_with(r#"recorded {"charge":"ch_manual"} as the result of charge "order-1""#),
        "{out}"
    );
    let done = backend.status_json("charge", "order-1");
    assert_eq!(done["result"], value!({ "charge": "ch_manual" }));
    assert_eq!(
        done["fencing_token"], earlier,
        "the marker carries the earlier delivery's token"
    );
    let ttl_ms = done["ttl_ms"].as_u64().unwrap();
    assert!((7_000_000..=7_200_000).contains(&ttl_ms), "{done}");

    let (report, ran) = deliver(&server, "order-1");
    assert!(!ran, "the body does not run again");
    assert_eq!(report.outcome, Outcome::Replayed);
    assert_eq!(report.value, value!({ "charge": "ch_manual" }));
    assert_eq!(report.in_doubt, None);
}

#[test]
fn a_freed_unit_runs_as_new_with_no_doubt() {
    let server = RedisServer::start();
    let backend = Redis(&server);
    leave_in_doubt(&server, &["order-1"], Fencing::On);
    leave_in_doubt(&server, &["order-2"], Fencing::Off);
    let earlier = backend.status_json("charge", "order-1")["fencing_token"]
        .as_u64()
        .unwrap();

    for key in ["order-1", "order-2"] {
        let (code, out, err) = backend.idempotask(&[
            "resolve", "--json", "--task", "charge", "--key", key, "--free", "--yes",
        ]);
        assert_eq!(code, 0, "{err}");
        let freed = json(&out);
        assert_eq!(freed["resolved"], "freed", "{freed}");
        assert_eq!(freed["result"], Value::Null);
        assert_eq!(backend.status_json("charge", key)["state"], "unknown");
    }

    for key in ["order-1", "order-2"] {
        let (report, ran) = deliver(&server, key);
        assert!(ran);
        assert_eq!(report.outcome, Outcome::Executed);
        assert_eq!(
            report.in_doubt, None,
            "{key}: freed, so nothing is in doubt"
        );
        if key == "order-1" {
            assert!(
                report.fencing_token.unwrap() > earlier,
                "the freed lock's counter keeps the next token above it"
            );
        }
    }
}

#[test]
fn resolve_refuses_a_unit_not_in_doubt() {
    let server = RedisServer::start();
    let backend = Redis(&server);
    backend.complete("charge", &["order-1"]);
    backend.lock("charge", "order-2");
    leave_in_doubt(&server, &["order-4"], Fencing::On);
    let resolve = |key: &str, how: &[&str]| {
        let mut args = vec![
            "resolve", "--json", "--task", "charge", "--key", key, "--yes",
        ];
        args.extend(how);
        backend.idempotask(&args)
    };
    let result: &[&str] = &["--result", "1"];
    for (key, how, exit, says) in [
        ("order-1", result, 1, "it is done, not in doubt"),
        ("order-2", &["--free"], 3, "it is not in doubt"),
        ("order-3", result, 4, "nothing to resolve"),
    ] {
        let (code, out, err) = resolve(key, how);
        assert_eq!(code, exit, "{key}: {err}");
        assert_eq!(json(&out)["error"]["kind"], "not_in_doubt", "{key}");
        assert!(err.contains(says), "{key}: {err}");
    }
    assert_eq!(backend.status_json("charge", "order-1")["state"], "done");
    assert_eq!(backend.status_json("charge", "order-2")["state"], "locked");

    // Usage errors, and nothing written: no JSON result, both ways or neither, a result TTL no
    // store keeps, no `--yes` without a terminal.
    for how in [
        &["--result", "{not json"][..],
        &["--result", "1", "--free"],
        &[],
        &["--result", "1", "--result-ttl", "50ms"],
    ] {
        let (code, _, err) = resolve("order-4", how);
        assert_eq!(code, 2, "{how:?}: {err}");
    }
    let (code, _, err) =
        backend.idempotask(&["resolve", "--task", "charge", "--key", "order-4", "--free"]);
    assert_eq!(code, 2);
    assert!(err.contains("pass --yes"), "{err}");
    assert_eq!(
        backend.status_json("charge", "order-4")["state"],
        "in_doubt"
    );
}

// The operator reads the question while a redelivery takes the unit over and finishes it: the
// answer must not overwrite that delivery's result, nor free a unit it holds.
#[test]
fn resolve_leaves_alone_a_unit_that_changed_while_it_asked() {
    let server = RedisServer::start();
    let backend = Redis(&server);
    leave_in_doubt(&server, &["order-1", "order-2"], Fencing::On);

    let (code, seen) = common::answer_yes_after(
        &backend,
        r#"resolve --task charge --key order-1 --result '{"charge":"ch_manual"}'"#,
        || {
            let (report, ran) = deliver(&server, "order-1");
            assert!(ran && report.in_doubt.is_some(), "taken over and rerun");
        },
    );
    assert_eq!(code, 1, "{seen}");
    assert!(
        seen.contains("Record {\"charge\":\"ch_manual\"} as its result")
            && seen.contains("nothing written: charge \"order-1\" changed after it was read"),
        "{seen}"
    );
    let done = backend.status_json("charge", "order-1");
    assert_eq!(done["result"], value!({ "charge": "ch_rerun" }), "{done}");

    // Taken over and still running: its lock stays.
    let unit = UnitOfWork::new("charge", "order-2").unwrap();
    let (code, seen) = common::answer_yes_after(
        &backend,
        "resolve --task charge --key order-2 --free",
        || {
            runtime().block_on(async {
                let taker = LockToken::generate().with_doubt_memory(DOUBT_MEMORY);
                server
                    .store()
                    .await
                    .begin(&unit, &taker, common::LONG, Fencing::On)
                    .await
                    .unwrap();
            });
        },
    );
    assert_eq!(code, 1, "{seen}");
    assert!(
        seen.contains("Free it, so that the next delivery"),
        "{seen}"
    );
    assert_eq!(backend.status_json("charge", "order-2")["state"], "locked");
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
