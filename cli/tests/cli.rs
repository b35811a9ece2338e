//! The `idempotask` binary against a redis-server this test starts: every command, its JSON,
//! its exit codes, and the errors an operator meets (unreachable server, wrong password,
//! unknown task, a locked key), and the same commands against a Redis Cluster of its own.

use idempotask_test_support as support;

use idempotask::Task;
use idempotask::store::Fencing;
use idempotask::store::{LockToken, Store, UnitOfWork};
use serde_json::Value;
use support::RedisServer;
use support::cluster::{RedisCluster, SlotMove};

mod common;

use common::{Backend, LONG, Redis, json, runtime};

/// Runs the binary with `args` against `url`.
fn idempotask(url: &str, args: &[&str]) -> (i32, String, String) {
    common::run("--redis-url", url, args)
}

/// Runs `task` for each key (the body returns `{"charge": "ch_<key>"}`), on `namespace`.
fn complete(server: &RedisServer, namespace: &str, task: &str, keys: &[&str]) {
    Redis(server).complete_in(namespace, task, keys);
}

/// Takes the lock of `task`/`key` as a running delivery would, and keeps it for `LONG`.
fn lock(server: &RedisServer, task: &str, key: &str) {
    Redis(server).lock(task, key);
}

#[test]
fn status_says_done_locked_or_unknown_in_text_json_and_exit_code() {
    let server = RedisServer::start();
    complete(&server, "default", "charge", &["order-1"]);
    lock(&server, "charge", "order-2");
    let (_, locked) = common::status_says_done_locked_or_unknown(&Redis(&server));
    assert!(locked["token_age_ms"].is_u64(), "{locked}");
    // `--json` before the command as well as after it.
    let (code, out, _) = idempotask(
        &server.url(),
        &["--json", "status", "--task", "charge", "--key", "order-3"],
    );
    assert_eq!(code, 4);
    assert_eq!(json(&out)["state"], "unknown");
}

#[test]
fn status_of_an_unknown_task_says_so() {
    let server = RedisServer::start();
    complete(&server, "default", "charge", &["order-1"]);
    let (code, out, _) = idempotask(
        &server.url(),
        &["status", "--task", "chrage", "--key", "order-1"],
    );
    assert_eq!(code, 4);
    assert!(out.contains("task `chrage` has no keys at all"), "{out}");
    // The same task in another namespace is another task.
    let (code, out, _) = idempotask(
        &server.url(),
        &[
            "status",
            "--namespace",
            "billing",
            "--task",
            "charge",
            "--key",
            "order-1",
            "--json",
        ],
    );
    assert_eq!(code, 4);
    assert_eq!(json(&out)["task_has_keys"], false);
}

#[test]
fn list_counts_and_filters_with_plain_keys_and_digests() {
    let server = RedisServer::start();
    let url = server.url();
    complete(&server, "default", "charge", &["order-1", "order:{2}"]);
    complete(&server, "default", "refund", &["order-1"]);
    lock(&server, "charge", "order-3");

    let (code, out, _) = idempotask(&url, &["list", "--task", "charge"]);
    assert_eq!(code, 0);
    assert!(
        out.starts_with("charge in namespace default: 2 done, 1 locked"),
        "{out}"
    );
    assert!(out.contains("\"order:{2}\""), "{out}");
    let digest = UnitOfWork::new("charge", "order-3")
        .unwrap()
        .digest()
        .to_owned();
    assert!(out.contains(&format!("digest:{digest}")), "{out}");

    let all = json(&idempotask(&url, &["list", "--task", "charge", "--json"]).1);
    assert_eq!(
        (all["done"].as_u64(), all["locked"].as_u64()),
        (Some(2), Some(1))
    );
    let entries = all["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 3);
    let mut keys: Vec<&str> = entries.iter().filter_map(|e| e["key"].as_str()).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["order-1", "order:{2}"]);

    let locked = json(&idempotask(&url, &["list", "--task", "charge", "--locked", "--json"]).1);
    let locked = locked["entries"].as_array().unwrap();
    assert_eq!(locked.len(), 1);
    assert_eq!(locked[0]["digest"], digest.as_str());
    assert_eq!(locked[0]["key"], Value::Null);

    let done = json(&idempotask(&url, &["list", "--task", "charge", "--done", "--json"]).1);
    assert_eq!(done["entries"].as_array().unwrap().len(), 2);
    assert_eq!(
        done["done"], 2,
        "the counts are the task's, whatever the filter"
    );

    let (code, _, err) = idempotask(&url, &["list", "--task", "charge", "--done", "--locked"]);
    assert_eq!(code, 2, "{err}");
}

#[test]
fn list_of_an_unknown_task_fails_with_exit_4() {
    let server = RedisServer::start();
    complete(&server, "default", "charge", &["order-1"]);
    let (code, out, err) = idempotask(&server.url(), &["list", "--task", "nope", "--json"]);
    assert_eq!(code, 4);
    assert_eq!(json(&out)["error"]["kind"], "unknown_task");
    assert!(
        err.contains("unknown task: `nope` has no keys in namespace `default`"),
        "{err}"
    );
}

// The receipt a store's `forget` leaves next to the unit's key is no unit: `list` counts no odd
// key and `status` finds nothing, as after any forget.
#[test]
fn a_forget_receipt_is_no_unit_to_list_or_status() {
    let server = RedisServer::start();
    let url = server.url();
    complete(&server, "default", "charge", &["order-1", "order-2"]);
    let forgot = runtime().block_on(async {
        let store = server.store().await;
        store
            .forget(&UnitOfWork::new("charge", "order-1").unwrap())
            .await
            .unwrap()
    });
    assert!(forgot);
    let receipt = format!(
        "idempotask:v2:default:{{{}}}:forgotten",
        redis_key("charge", "order-1")
    );
    assert_eq!(
        redis(&server, &[b"EXISTS", receipt.as_bytes()]),
        redis::Value::Int(1),
        "the receipt is there"
    );

    let listing = json(&idempotask(&url, &["list", "--task", "charge", "--json"]).1);
    assert_eq!(
        (listing["done"].as_u64(), listing["locked"].as_u64()),
        (Some(1), Some(0)),
        "{listing}"
    );
    let entries = listing["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 1, "{listing}");
    assert_eq!(entries[0]["key"], "order-2");
    let (code, out, _) = idempotask(
        &url,
        &["status", "--task", "charge", "--key", "order-1", "--json"],
    );
    assert_eq!(code, 4, "{out}");
    assert_eq!(json(&out)["state"], "unknown");
}

#[test]
fn forget_deletes_a_marker_only_when_confirmed_and_not_locked() {
    let server = RedisServer::start();
    complete(&server, "default", "charge", &["order-1"]);
    lock(&server, "charge", "order-2");
    common::forget_refuses_a_lock_and_deletes_a_confirmed_marker(&Redis(&server));
    // As the store's own `forget` does: the fenced marker leaves its counter, and a receipt
    // tells a re-sent command that this call deleted the marker.
    let key = redis_key("charge", "order-1");
    let counter = value_of(&server, &key).expect("the fencing counter stays");
    assert_eq!(counter.first(), Some(&b'T'), "{counter:?}");
    let receipt = format!("idempotask:v2:default:{{{key}}}:forgotten");
    assert!(
        value_of(&server, &receipt).is_some(),
        "no receipt at {receipt}"
    );
    let redis::Value::Int(receipt_ms) = redis(&server, &[b"PTTL", receipt.as_bytes()]) else {
        panic!("PTTL {receipt}");
    };
    assert!((1..=60_000).contains(&receipt_ms), "{receipt_ms}");
}

#[test]
fn an_unreachable_server_is_an_error_that_names_the_url() {
    let url = format!("redis://127.0.0.1:{}", support::free_port());
    let (code, out, err) = idempotask(
        &url,
        &["status", "--task", "charge", "--key", "k", "--json"],
    );
    assert_eq!(code, 1);
    assert_eq!(json(&out)["error"]["kind"], "unreachable");
    assert!(
        err.contains(&format!("nothing answers at {url}")) && err.matches(&url).count() == 1,
        "{err}"
    );
}

#[test]
fn a_wrong_or_missing_password_is_an_auth_error_that_hides_the_password() {
    let server = RedisServer::start_with(&["--requirepass", "s3cret"]);
    let port = server.port();
    for url in [
        format!("redis://127.0.0.1:{port}"),
        format!("redis://:wrong-one@127.0.0.1:{port}"),
    ] {
        let (code, out, err) = idempotask(&url, &["list", "--task", "charge", "--json"]);
        assert_eq!(code, 1, "{err}");
        assert_eq!(json(&out)["error"]["kind"], "auth", "{out}");
        assert!(err.contains("refused the credentials"), "{err}");
        assert!(
            !err.contains("wrong-one") && !out.contains("wrong-one"),
            "{err}"
        );
    }
    let right = format!("redis://:s3cret@127.0.0.1:{port}");
    assert_eq!(
        idempotask(&right, &["status", "--task", "charge", "--key", "k"]).0,
        4
    );
}

#[test]
fn bad_arguments_are_usage_errors() {
    let url = "redis://127.0.0.1:1";
    assert_eq!(idempotask(url, &["status", "--task", "charge"]).0, 2);
    assert_eq!(idempotask(url, &["frobnicate"]).0, 2);
    let server = RedisServer::start();
    let (code, _, err) = idempotask(&server.url(), &["status", "--task", "a:b", "--key", "k"]);
    assert_eq!(code, 2);
    assert!(err.contains("task name `a:b`"), "{err}");
    let (code, _, err) = idempotask(
        &server.url(),
        &["list", "--task", "t", "--namespace", "a b"],
    );
    assert_eq!(code, 2);
    assert!(err.contains("namespace `a b`"), "{err}");
}

#[test]
fn list_follows_the_scan_cursor_past_one_page() {
    let server = RedisServer::start();
    let keys: Vec<String> = (0..1_500).map(|i| format!("order-{i}")).collect();
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    complete(&server, "default", "charge", &keys);
    complete(&server, "default", "refund", &keys[..10]);
    let (code, out, _) = idempotask(&server.url(), &["list", "--task", "charge", "--json"]);
    assert_eq!(code, 0);
    let listing = json(&out);
    assert_eq!(listing["done"], 1_500);
    let mut listed: Vec<&str> = listing["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["key"].as_str().unwrap())
        .collect();
    listed.sort_unstable();
    let mut expected = keys.clone();
    expected.sort_unstable();
    assert_eq!(listed, expected);
}

/// Runs `charge` for each key on the cluster and locks `order-locked`; answers the keys of the
/// markers in Redis.
fn fill_cluster(cluster: &RedisCluster, keys: &[String]) -> Vec<String> {
    runtime().block_on(async {
        let store = cluster.store_in("default").await;
        for key in keys {
            Task::named("charge")
                .call(key.clone())
                .store(store.clone())
                .run(async {
                    Ok::<_, idempotask::Error>(serde_json::json!({ "charge": format!("ch_{key}") }))
                })
                .await
                .unwrap();
        }
        let locked = UnitOfWork::new("charge", "order-locked").unwrap();
        store
            .begin(&locked, &LockToken::generate(), LONG, Fencing::On)
            .await
            .unwrap();
        keys.iter()
            .map(|key| store.key(&UnitOfWork::new("charge", key.clone()).unwrap()))
            .collect()
    })
}

#[test]
fn every_command_works_against_a_redis_cluster_and_list_scans_every_master() {
    let cluster = RedisCluster::start();
    let masters = cluster.masters();
    let master_url = format!("redis://127.0.0.1:{}", masters[0].port);
    let replica_port = cluster
        .ports()
        .into_iter()
        .find(|port| masters.iter().all(|m| m.port != *port))
        .expect("a replica");
    let replica_url = format!("redis://127.0.0.1:{replica_port}");
    let keys: Vec<String> = (0..60).map(|i| format!("order-{i}")).collect();
    let unit_keys = fill_cluster(&cluster, &keys);
    // The markers really are spread: a listing of one master alone would miss some.
    for master in &masters {
        assert!(
            unit_keys
                .iter()
                .any(|key| master.owns(cluster.slot_of(key))),
            "no marker on master {}",
            master.port
        );
    }

    // Any node is a seed, a replica too.
    for url in [&master_url, &replica_url] {
        let (code, out, _) = idempotask(url, &["list", "--task", "charge"]);
        assert_eq!(code, 0);
        assert!(
            out.starts_with(
                "charge in namespace default: 60 done, 1 locked (on 3 cluster masters)"
            ),
            "{out}"
        );
    }
    let listing = json(&idempotask(&master_url, &["list", "--task", "charge", "--json"]).1);
    assert_eq!(listing["cluster"], true);
    assert_eq!(listing["servers_scanned"], 3);
    assert_eq!(
        (listing["done"].as_u64(), listing["locked"].as_u64()),
        (Some(60), Some(1))
    );
    let mut listed: Vec<&str> = listing["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["key"].as_str())
        .collect();
    listed.sort_unstable();
    let mut expected: Vec<&str> = keys.iter().map(String::as_str).collect();
    expected.sort_unstable();
    assert_eq!(listed, expected);
    let (code, _, _) = idempotask(&master_url, &["list", "--task", "nope"]);
    assert_eq!(code, 4);

    status_and_forget_on_a_cluster(&master_url, &replica_url);

    // order-3's slot half moved: its keys already on the importing master, the slot still the
    // old master's, so every read of them is answered with `ASK`.
    let half_moved = SlotMove::start(&cluster, cluster.slot_of(&unit_keys[3]));
    let listing = json(&idempotask(&master_url, &["list", "--task", "charge", "--json"]).1);
    assert_eq!(
        (listing["done"].as_u64(), listing["locked"].as_u64()),
        (Some(59), Some(1)),
        "order-7 was forgotten; every other unit is still listed: {listing}"
    );
    // `status` reads the unit's one key with one script, which follows `ASK` to the importing
    // master like any single-key command: it answers during the move, and after it.
    let status = ["status", "--json", "--task", "charge", "--key", "order-3"];
    let (code, out, err) = idempotask(&master_url, &status);
    assert_eq!(code, 0, "{out} {err}");
    assert_eq!(json(&out)["result"]["charge"], "ch_order-3");
    half_moved.finish(&cluster);
    let (code, out, _) = idempotask(&master_url, &status);
    assert_eq!(code, 0, "{out}");
    assert_eq!(json(&out)["result"]["charge"], "ch_order-3");
}

fn status_and_forget_on_a_cluster(master_url: &str, replica_url: &str) {
    let done = json(
        &idempotask(
            replica_url,
            &["status", "--json", "--task", "charge", "--key", "order-7"],
        )
        .1,
    );
    assert_eq!(done["state"], "done");
    assert_eq!(done["result"]["charge"], "ch_order-7");
    let (code, out, _) = idempotask(
        master_url,
        &[
            "status",
            "--json",
            "--task",
            "charge",
            "--key",
            "order-locked",
        ],
    );
    assert_eq!(code, 3);
    assert!(json(&out)["token_age_ms"].is_u64(), "{out}");
    let (code, out, _) = idempotask(
        master_url,
        &["status", "--json", "--task", "charge", "--key", "order-x"],
    );
    assert_eq!(code, 4);
    assert_eq!(json(&out)["task_has_keys"], true);
    let (code, out, _) = idempotask(
        master_url,
        &["status", "--json", "--task", "nope", "--key", "order-x"],
    );
    assert_eq!(code, 4);
    assert_eq!(json(&out)["task_has_keys"], false);

    let (code, _, err) = idempotask(
        master_url,
        &[
            "forget",
            "--task",
            "charge",
            "--key",
            "order-locked",
            "--yes",
        ],
    );
    assert_eq!(code, 3, "{err}");
    let (code, out, _) = idempotask(
        master_url,
        &[
            "forget", "--json", "--task", "charge", "--key", "order-7", "--yes",
        ],
    );
    assert_eq!(code, 0);
    assert_eq!(json(&out)["forgotten"], true);
    assert_eq!(
        idempotask(
            master_url,
            &["status", "--task", "charge", "--key", "order-7"]
        )
        .0,
        4
    );
}

/// The Redis key of `task`/`key` in the default namespace.
fn redis_key(task: &str, key: &str) -> String {
    idempotask_redis::RedisKeys::new("default")
        .unwrap()
        .unit(&UnitOfWork::new(task, key).unwrap())
}

/// Runs one command on `server` with a plain connection; answers its reply.
fn redis(server: &RedisServer, args: &[&[u8]]) -> redis::Value {
    runtime().block_on(async {
        let mut command = redis::cmd(std::str::from_utf8(args[0]).unwrap());
        for arg in &args[1..] {
            command.arg(*arg);
        }
        command
            .query_async(&mut server.connection().await)
            .await
            .unwrap()
    })
}

fn value_of(server: &RedisServer, key: &str) -> Option<Vec<u8>> {
    match redis(server, &[b"GET", key.as_bytes()]) {
        redis::Value::BulkString(bytes) => Some(bytes),
        redis::Value::Nil => None,
        other => panic!("GET {key}: {other:?}"),
    }
}

// The ACL user a worker of `RedisClusterStore` needs: no `cluster|info`. The CLI used to take
// the refusal of `CLUSTER INFO` for a standalone server and listed one master's keys, exit 0.
const WORKER_ACL: &[&str] = &[
    "reset",
    "on",
    ">s3cret",
    "~idempotask:*",
    "+@read",
    "+@write",
    "+@scripting",
    "+@connection",
    "+time",
    "+cluster|slots",
];

#[test]
fn list_finds_a_cluster_whose_user_may_not_run_cluster_info() {
    let cluster = RedisCluster::start();
    for port in cluster.ports() {
        let () = redis::cmd("ACL")
            .arg("SETUSER")
            .arg("worker")
            .arg(WORKER_ACL)
            .query(&mut support::cluster::node(port))
            .unwrap();
    }
    let keys: Vec<String> = (0..30).map(|i| format!("order-{i}")).collect();
    let unit_keys = fill_cluster(&cluster, &keys);
    let masters = cluster.masters();
    assert!(
        masters.iter().all(|master| unit_keys
            .iter()
            .any(|key| master.owns(cluster.slot_of(key)))),
        "the units are spread over every master"
    );
    let url = format!("redis://worker:s3cret@127.0.0.1:{}", masters[0].port);
    let (code, out, err) = idempotask(&url, &["list", "--task", "charge", "--json"]);
    assert_eq!(code, 0, "{err}");
    let listing = json(&out);
    assert_eq!(listing["cluster"], true, "{listing}");
    assert_eq!(listing["servers_scanned"], 3);
    assert_eq!(
        (listing["done"].as_u64(), listing["locked"].as_u64()),
        (Some(30), Some(1))
    );
}

// With none of its probes allowed the CLI cannot know whether one server holds every key; it
// says so rather than listing what might be a third of them.
#[test]
fn a_server_whose_kind_cannot_be_told_is_an_error_not_a_partial_listing() {
    let server = RedisServer::start();
    complete(&server, "default", "charge", &["order-1"]);
    let acl = |user: &str, rights: &[&str]| {
        let mut args: Vec<&[u8]> = vec![b"ACL", b"SETUSER", user.as_bytes()];
        args.extend(rights.iter().map(|right| right.as_bytes()));
        redis(&server, &args);
    };
    acl("worker", WORKER_ACL);
    let blind: Vec<&str> = WORKER_ACL
        .iter()
        .copied()
        .filter(|right| *right != "+cluster|slots")
        .chain(["-readwrite"])
        .collect();
    acl("blind", &blind);

    let worker = format!("redis://worker:s3cret@127.0.0.1:{}", server.port());
    let (code, out, _) = idempotask(&worker, &["list", "--task", "charge", "--json"]);
    assert_eq!(code, 0);
    assert_eq!(json(&out)["cluster"], false);

    let blind = format!("redis://blind:s3cret@127.0.0.1:{}", server.port());
    let (code, out, err) = idempotask(&blind, &["list", "--task", "charge", "--json"]);
    assert_eq!(code, 1, "{out}");
    assert_eq!(json(&out)["error"]["kind"], "server_kind");
    assert!(
        err.contains("cannot tell whether Redis at redis://blind:***@")
            && err.contains("+cluster|slots"),
        "{err}"
    );
}

// A hash under a task's pattern made the one pipeline of `list` fail with `WRONGTYPE`.
#[test]
fn list_flags_a_key_of_another_type_and_lists_the_rest() {
    let server = RedisServer::start();
    let url = server.url();
    complete(&server, "default", "charge", &["order-1", "order-2"]);
    let odd = redis_key("charge", "order-3");
    redis(&server, &[b"HSET", odd.as_bytes(), b"field", b"value"]);

    let (code, out, err) = idempotask(&url, &["list", "--task", "charge", "--json"]);
    assert_eq!(code, 0, "{err}");
    let listing = json(&out);
    assert_eq!(
        (listing["done"].as_u64(), listing["flagged"].as_u64()),
        (Some(2), Some(1))
    );
    let entries = listing["entries"].as_array().unwrap();
    let flagged: Vec<&Value> = entries
        .iter()
        .filter(|e| e["problem"].is_string())
        .collect();
    assert_eq!(flagged.len(), 1, "{listing}");
    assert_eq!(flagged[0]["problem"], "wrong_type");
    assert!(flagged[0]["error"].as_str().unwrap().contains("a hash key"));

    let (code, out, _) = idempotask(&url, &["list", "--task", "charge"]);
    assert_eq!(code, 0);
    assert!(
        out.starts_with("charge in namespace default: 2 done, 0 locked, 1 flagged"),
        "{out}"
    );
    assert!(
        out.contains("\"order-1\"") && out.contains("warning: a hash key"),
        "{out}"
    );

    let (code, out, _) = idempotask(
        &url,
        &["status", "--json", "--task", "charge", "--key", "order-3"],
    );
    assert_eq!(code, 1);
    assert_eq!(json(&out)["error"]["kind"], "wrong_type");
    let (code, _, _) = idempotask(
        &url,
        &[
            "forget", "--task", "charge", "--key", "order-3", "--yes", "--force",
        ],
    );
    assert_eq!(code, 1, "--force deletes markers, not other data");
}

// A lock without a TTL showed "expires in 0 ms", and `forget` told the operator to wait for it.
#[test]
fn a_lock_without_a_ttl_never_expires() {
    let server = RedisServer::start();
    let url = server.url();
    lock(&server, "charge", "order-1");
    redis(
        &server,
        &[b"PERSIST", redis_key("charge", "order-1").as_bytes()],
    );

    let status = ["status", "--task", "charge", "--key", "order-1"];
    let (code, out, _) = idempotask(&url, &status);
    assert_eq!(code, 3);
    // Only the expiry line: the token's age, in milliseconds too, may well end in "0 ms".
    let expiry = out
        .lines()
        .find(|line| line.contains("lock expires"))
        .unwrap_or_default();
    assert!(expiry.contains("never") && !expiry.contains(" ms"), "{out}");
    let (_, out, _) = idempotask(&url, &[&status[..], &["--json"]].concat());
    let locked = json(&out);
    assert_eq!(locked["lock_ttl_ms"], Value::Null, "{locked}");
    assert_eq!(locked["lock_expires"], false);

    let listing = json(&idempotask(&url, &["list", "--task", "charge", "--json"]).1);
    let entry = &listing["entries"][0];
    assert_eq!(
        (&entry["lock_ttl_ms"], &entry["lock_expires"]),
        (&Value::Null, &Value::Bool(false))
    );
    let (_, out, _) = idempotask(&url, &["list", "--task", "charge"]);
    assert!(out.contains("lock never expires"), "{out}");

    let (code, _, err) = idempotask(
        &url,
        &[
            "forget", "--task", "charge", "--key", "order-1", "--yes", "--force",
        ],
    );
    assert_eq!(code, 3);
    assert!(
        err.contains("the lock never expires") && err.contains("redis-cli DEL"),
        "{err}"
    );
}

// `forget` refused unreadable and mismatched markers, so the documented remedy for
// `Error::Codec` was not available from the CLI.
#[test]
fn forget_force_deletes_unreadable_and_mismatched_markers_but_never_a_lock() {
    let server = RedisServer::start();
    let url = server.url();
    complete(
        &server,
        "default",
        "charge",
        &["order-1", "order-2", "order-9"],
    );
    lock(&server, "charge", "order-4");
    let junk = redis_key("charge", "order-1");
    redis(
        &server,
        &[b"SET", junk.as_bytes(), b"D7,zz|order-1|{not json"],
    );
    let forged = value_of(&server, &redis_key("charge", "order-9")).unwrap();
    let mismatched = redis_key("charge", "order-2");
    redis(&server, &[b"SET", mismatched.as_bytes(), &forged]);

    for (key, kind) in [("order-1", "unreadable"), ("order-2", "key_mismatch")] {
        let command = [
            "forget", "--json", "--task", "charge", "--key", key, "--yes",
        ];
        let (code, out, err) = idempotask(&url, &command);
        assert_eq!(code, 1);
        assert_eq!(json(&out)["error"]["kind"], kind);
        assert!(err.contains("pass --force"), "{err}");
        let (code, out, err) = idempotask(
            &url,
            &["status", "--json", "--task", "charge", "--key", key],
        );
        assert_eq!(code, 1);
        assert_eq!(json(&out)["error"]["kind"], kind);
        assert!(err.contains("forget --force"), "{err}");

        let (code, out, err) = idempotask(&url, &[&command[..], &["--force"]].concat());
        assert_eq!(code, 0, "{err}");
        let forgotten = json(&out);
        assert_eq!(
            (&forgotten["forgotten"], &forgotten["forced"]),
            (&Value::Bool(true), &Value::Bool(true))
        );
        let (code, _, _) = idempotask(&url, &["status", "--task", "charge", "--key", key]);
        assert!(code == 4, "{key} is unknown now, so a delivery runs it");
    }
    assert_eq!(
        value_of(&server, &redis_key("charge", "order-9")),
        Some(forged),
        "the key whose marker was copied is untouched"
    );
    let (code, _, _) = idempotask(
        &url,
        &[
            "forget", "--task", "charge", "--key", "order-4", "--yes", "--force",
        ],
    );
    assert_eq!(code, 3, "--force never deletes a lock");
}

// `list` showed a marker copied under another key's name as that key's, with no warning.
#[test]
fn list_flags_a_marker_written_for_another_key() {
    let server = RedisServer::start();
    let url = server.url();
    complete(&server, "default", "charge", &["order-1", "order-9"]);
    let forged = value_of(&server, &redis_key("charge", "order-9")).unwrap();
    redis(
        &server,
        &[b"SET", redis_key("charge", "order-1").as_bytes(), &forged],
    );

    let listing = json(&idempotask(&url, &["list", "--task", "charge", "--json"]).1);
    assert_eq!(listing["flagged"], 1, "{listing}");
    let digest = UnitOfWork::new("charge", "order-1")
        .unwrap()
        .digest()
        .to_owned();
    let entries = listing["entries"].as_array().unwrap();
    let entry = entries
        .iter()
        .find(|e| e["digest"] == digest.as_str())
        .unwrap();
    assert_eq!(entry["problem"], "key_mismatch");
    assert_eq!(entry["stored_key"], "order-9");
    assert_eq!(
        entry["key"],
        Value::Null,
        "the forged marker does not name this unit"
    );
    assert_eq!(
        entry["result"],
        Value::Null,
        "nor does its result belong to it"
    );

    let (_, out, _) = idempotask(&url, &["list", "--task", "charge"]);
    assert!(
        out.contains(&format!("digest:{digest}"))
            && out.contains("warning: the marker names key `order-9`"),
        "{out}"
    );
}

// `forget` checked, asked, then deleted whatever was there by then: a marker that a newer
// delivery wrote while the operator read the question was lost.
#[test]
fn forget_deletes_only_the_value_it_showed() {
    let server = RedisServer::start();
    complete(&server, "default", "charge", &["order-1"]);
    complete(&server, "other", "charge", &["order-1"]);
    let key = redis_key("charge", "order-1");
    let newer = runtime().block_on(async {
        let other = idempotask_redis::RedisKeys::new("other")
            .unwrap()
            .unit(&UnitOfWork::new("charge", "order-1").unwrap());
        redis::cmd("GET")
            .arg(other)
            .query_async::<Vec<u8>>(&mut server.connection().await)
            .await
            .unwrap()
    });
    assert_ne!(Some(&newer), value_of(&server, &key).as_ref());

    common::forget_keeps_a_marker_written_while_it_asks(&Redis(&server), || {
        redis(&server, &[b"SET", key.as_bytes(), &newer]);
    });
    assert_eq!(
        value_of(&server, &key),
        Some(newer),
        "the newer marker stays"
    );
}
