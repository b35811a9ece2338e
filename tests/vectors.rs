//! The shared test vectors of units, `tests/vectors/units.json`, that the Python package's tests
//! (`python/tests/test_vectors.py`) read too: for each case, a task of the attribute (its name,
//! key template and fingerprint list), its arguments, and what the Rust core makes of them:
//! the caller key, the fingerprint, the Redis key, a completion marker's bytes and the result
//! that marker holds.
//!
//! This test runs each case through the attribute on a Redis server of its own and asserts
//! every expected value, so the file cannot drift from the core; and it stores the file's
//! marker under the unit's key and checks that the task replays it without running. Python
//! checks the same, with its decorator. `IDEMPOTASK_WRITE_VECTORS=1` writes the file anew from
//! the core (its markers then have new delivery ids; everything else is the same).

use std::sync::atomic::{AtomicUsize, Ordering};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use idempotask::operator::{Marker, StoredResult};
use idempotask::store::UnitOfWork;
use idempotask::{Error, idempotent_task};
use idempotask_redis::RedisKeys;
use idempotask_test_support::RedisServer;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// How many bodies ran; a replay must leave it alone.
static RAN: AtomicUsize = AtomicUsize::new(0);

#[idempotent_task(key = "order-charge-{order_id}", fingerprint = [amount_cents])]
async fn charge_customer(order_id: u64, amount_cents: u64) -> Result<String, Error> {
    RAN.fetch_add(1, Ordering::SeqCst);
    Ok(format!("ch_{order_id}_{amount_cents}"))
}

#[idempotent_task(key = "ledger-{account}")]
async fn ledger_total(account: String) -> Result<u128, Error> {
    RAN.fetch_add(1, Ordering::SeqCst);
    Ok((1_u128 << 100) + u128::try_from(account.len()).unwrap())
}

#[derive(Debug, Serialize, Deserialize)]
struct Item {
    sku: String,
    quantity: u32,
    price: f64,
}

#[idempotent_task(key = "receipt-{order_id}-{resend}", fingerprint = [email, items, ratio])]
async fn send_receipt(
    order_id: u64,
    resend: bool,
    email: String,
    items: Vec<Item>,
    ratio: f64,
) -> Result<Value, Error> {
    RAN.fetch_add(1, Ordering::SeqCst);
    let _ = (order_id, resend, ratio);
    Ok(
        json!({"lines": items.len(), "nested": {"a": true, "b": [1, 2.5, null]}, "note": "reçu ✓", "to": email}),
    )
}

#[idempotent_task(key = "fx-{rate}-{flag}")]
async fn convert(rate: f64, flag: bool) -> Result<(), Error> {
    RAN.fetch_add(1, Ordering::SeqCst);
    let _ = (rate, flag);
    Ok(())
}

/// Floats where the texts of Python's `json` and of `serde_json` differ (`1.5e-05` and
/// `0.000015`, `1e-07` and `1e-7`), in a fingerprint and in a result.
#[idempotent_task(key = "sensor-{sensor}", fingerprint = [readings])]
async fn record_readings(sensor: u32, readings: Vec<f64>) -> Result<Vec<f64>, Error> {
    RAN.fetch_add(1, Ordering::SeqCst);
    let _ = sensor;
    Ok(readings.into_iter().rev().collect())
}

#[derive(Debug, Serialize, Deserialize)]
struct Shipment {
    amount: u64,
    sku: String,
}

/// A fingerprint of field paths: `order.sku` may change between deliveries, `order.amount`
/// and `currency` may not. Python's `fingerprint=["order.amount", "currency"]` hashes the same
/// list.
#[idempotent_task(key = "ship-{shipment_id}", fingerprint = [order.amount, currency])]
async fn ship_order(shipment_id: u64, order: Shipment, currency: String) -> Result<String, Error> {
    RAN.fetch_add(1, Ordering::SeqCst);
    Ok(format!(
        "{shipment_id}:{}:{}{currency}",
        order.sku, order.amount
    ))
}

/// The cases: task, key template, fingerprint list, arguments (in declaration order).
fn cases() -> Vec<(&'static str, &'static str, Vec<&'static str>, Value)> {
    let receipt = json!({
        "order_id": 7,
        "resend": true,
        "email": "zoë@example.com",
        "items": [{"sku": "A-1", "quantity": 2, "price": 12.5}, {"sku": "B", "quantity": 1, "price": 1e16}],
        "ratio": 0.1,
    });
    vec![
        (
            "charge_customer",
            "order-charge-{order_id}",
            vec!["amount_cents"],
            json!({"order_id": 42, "amount_cents": 1200}),
        ),
        (
            "ledger_total",
            "ledger-{account}",
            vec![],
            json!({"account": "acc|1 é"}),
        ),
        (
            "send_receipt",
            "receipt-{order_id}-{resend}",
            vec!["email", "items", "ratio"],
            receipt,
        ),
        (
            "convert",
            "fx-{rate}-{flag}",
            vec![],
            json!({"rate": 1e20, "flag": false}),
        ),
        (
            "convert",
            "fx-{rate}-{flag}",
            vec![],
            json!({"rate": 0.000_012_5, "flag": true}),
        ),
        (
            "record_readings",
            "sensor-{sensor}",
            vec!["readings"],
            json!({"sensor": 3, "readings": [1.5e-5, 1e16, 1e-7, -0.0, 5e-324, 1.234_567_890_123_456_8e16, 0.1, 100.0, 1e21, 2.5e-5]}),
        ),
        (
            "ship_order",
            "ship-{shipment_id}",
            vec!["order.amount", "currency"],
            json!({"shipment_id": 9, "order": {"amount": 1200, "sku": "x"}, "currency": "EUR"}),
        ),
    ]
}

/// Input: a case's task and arguments. Output: the call's result as JSON text.
async fn run(task: &str, args: &Value) -> String {
    match task {
        "charge_customer" => {
            json_of(&charge_customer(from(args, "order_id"), from(args, "amount_cents")).await)
        }
        "ledger_total" => json_of(&ledger_total(from(args, "account")).await),
        "send_receipt" => json_of(
            &send_receipt(
                from(args, "order_id"),
                from(args, "resend"),
                from(args, "email"),
                from(args, "items"),
                from(args, "ratio"),
            )
            .await,
        ),
        "convert" => json_of(&convert(from(args, "rate"), from(args, "flag")).await),
        "record_readings" => {
            json_of(&record_readings(from(args, "sensor"), from(args, "readings")).await)
        }
        "ship_order" => json_of(
            &ship_order(
                from(args, "shipment_id"),
                from(args, "order"),
                from(args, "currency"),
            )
            .await,
        ),
        other => panic!("no task {other}"),
    }
}

/// The argument `name` of a case.
fn from<T: serde::de::DeserializeOwned>(args: &Value, name: &str) -> T {
    serde_json::from_value(args[name].clone()).unwrap()
}

fn json_of<T: Serialize>(result: &Result<T, Error>) -> String {
    serde_json::to_string(result.as_ref().expect("the task succeeds")).unwrap()
}

/// Input: a fresh server and a case. Output: its vector, as the core makes it now.
async fn vector(
    server: &RedisServer,
    (task, template, fingerprint, args): &(&str, &str, Vec<&str>, Value),
) -> Value {
    let mut redis = server.connection().await;
    let _: () = redis::cmd("FLUSHALL")
        .query_async(&mut redis)
        .await
        .unwrap();
    let before = RAN.load(Ordering::SeqCst);
    let result = run(task, args).await;
    assert_eq!(
        RAN.load(Ordering::SeqCst),
        before + 1,
        "{task}: the body runs once"
    );
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("idempotask:*")
        .query_async(&mut redis)
        .await
        .unwrap();
    let [redis_key] = &keys[..] else {
        panic!("{task}: one unit, not {keys:?}")
    };
    let bytes: Vec<u8> = redis::cmd("GET")
        .arg(redis_key)
        .query_async(&mut redis)
        .await
        .unwrap();
    let marker = Marker::decode(&bytes).unwrap();
    let StoredResult::Json(stored) = marker.result() else {
        panic!("{task}: a stored result")
    };
    assert_eq!(stored.get(), result, "{task}: the marker holds the result");
    let unit = UnitOfWork::new(task, marker.key()).unwrap();
    assert_eq!(*redis_key, RedisKeys::new("default").unwrap().unit(&unit));
    json!({
        "task": task,
        "key_template": template,
        "fingerprint": fingerprint,
        "arguments": args,
        "key": marker.key(),
        "fingerprint_hex": marker.fingerprint(),
        "redis_key": redis_key,
        "marker_base64": STANDARD.encode(&bytes),
        "result_json": result,
    })
}

fn path() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("vectors/units.json")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_vectors_are_what_the_core_makes() {
    let server = RedisServer::start();
    idempotask::install(server.store().await);
    let mut made = Vec::new();
    for case in cases() {
        made.push(vector(&server, &case).await);
    }
    if std::env::var_os("IDEMPOTASK_WRITE_VECTORS").is_some() {
        let file = json!({
            "about": "Units as the Rust core makes them, checked by tests/vectors.rs and python/tests/test_vectors.py; regenerate with IDEMPOTASK_WRITE_VECTORS=1 cargo test -p idempotask-tests --test vectors",
            "namespace": "default",
            "units": made,
        });
        std::fs::write(path(), serde_json::to_string_pretty(&file).unwrap() + "\n").unwrap();
    }
    let file: Value = serde_json::from_str(&std::fs::read_to_string(path()).unwrap()).unwrap();
    let stored = file["units"].as_array().unwrap();
    assert_eq!(stored.len(), made.len());
    for (stored, made) in stored.iter().zip(&made) {
        for field in [
            "task",
            "key_template",
            "fingerprint",
            "arguments",
            "key",
            "fingerprint_hex",
            "redis_key",
            "result_json",
        ] {
            assert_eq!(stored[field], made[field], "{}: {field}", made["task"]);
        }
        replays(&server, stored).await;
    }
}

/// The vector's marker, stored under its unit's key, is what a call of its task gets back,
/// without running.
async fn replays(server: &RedisServer, vector: &Value) {
    let bytes = STANDARD
        .decode(vector["marker_base64"].as_str().unwrap())
        .unwrap();
    let marker = Marker::decode(&bytes).unwrap();
    assert_eq!(marker.key(), vector["key"]);
    assert_eq!(marker.fingerprint(), vector["fingerprint_hex"].as_str());
    let mut redis = server.connection().await;
    let _: () = redis::cmd("FLUSHALL")
        .query_async(&mut redis)
        .await
        .unwrap();
    let _: () = redis::cmd("SET")
        .arg(vector["redis_key"].as_str().unwrap())
        .arg(&bytes)
        .query_async(&mut redis)
        .await
        .unwrap();
    let before = RAN.load(Ordering::SeqCst);
    let result = run(vector["task"].as_str().unwrap(), &vector["arguments"]).await;
    assert_eq!(
        RAN.load(Ordering::SeqCst),
        before,
        "{}: replayed, not run",
        vector["task"]
    );
    assert_eq!(result, vector["result_json"].as_str().unwrap());
}
