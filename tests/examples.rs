//! Every example, run as its own process against servers this test starts, with its output
//! checked. `cargo test --workspace` builds the examples (the package `idempotask-examples`,
//! with every feature on, as this package asks) before it runs this binary.

use idempotask_test_support as support;

use std::collections::BTreeMap;
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use support::RedisServer;
use support::cluster::RedisCluster;
use support::example_runs::{ORDERS, example, ledger, run_workers};
use support::postgres::PostgresServer;

fn run(command: &mut Command) -> String {
    let Output {
        status,
        stdout,
        stderr,
    } = command.output().unwrap();
    let stdout = String::from_utf8(stdout).unwrap();
    let stderr = String::from_utf8_lossy(&stderr);
    assert!(
        status.success(),
        "{status}\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
    );
    // Shown with `--nocapture`, and in a failing test's output.
    println!("{stdout}{stderr}");
    stdout
}

/// The value printed after `label` on its line, e.g. `executions: 1`.
fn field<'a>(output: &'a str, label: &str) -> &'a str {
    output
        .lines()
        .find_map(|line| line.strip_prefix(label))
        .unwrap_or_else(|| panic!("no `{label}` in\n{output}"))
        .trim()
}

#[test]
fn quickstart_runs_in_memory_and_on_redis() {
    let embedded = run(&mut example("quickstart"));
    assert_eq!(field(&embedded, "store:"), "the in-memory store");
    assert_eq!(field(&embedded, "executions:"), "1");
    assert!(field(&embedded, "deliveries:").starts_with("11"));

    let server = RedisServer::start();
    let with_redis = run(example("quickstart_redis").env("REDIS_URL", server.url()));
    assert!(field(&with_redis, "store:").starts_with("Redis at"));
    assert_eq!(field(&with_redis, "executions:"), "1");
}

/// What the example's header says of `charge_customer`, one run each: one charge with
/// idempotask, several with the constraint only, two when the lock expires mid-task; one table
/// row each time. `command()` is the example with its servers in the environment.
fn check_charge_customer(command: impl Fn() -> Command) {
    let number = |output: &str, label: &str| -> u64 { field(output, label).parse().unwrap() };
    let with = run(&mut command());
    assert_eq!(field(&with, "run:"), "with-idempotask");
    for (label, expected) in [
        ("deliveries:", 11),
        ("gateway charges:", 1),
        ("table rows:", 1),
        ("same result:", 11),
    ] {
        assert_eq!(number(&with, label), expected, "{label}\n{with}");
    }
    let constraint_only = run(command().arg("constraint-only"));
    assert_eq!(number(&constraint_only, "deliveries:"), 11);
    assert_eq!(number(&constraint_only, "table rows:"), 1);
    assert!(
        number(&constraint_only, "gateway charges:") > 1,
        "{constraint_only}"
    );
    let expired = run(command().arg("lock-expired"));
    assert_eq!(number(&expired, "gateway charges:"), 2, "{expired}");
    assert_eq!(number(&expired, "table rows:"), 1, "{expired}");
}

fn check_send_order_confirmation(output: &str) {
    assert!(field(output, "order 42:").starts_with("sent "), "{output}");
    let lines: Vec<&str> = output
        .lines()
        .filter(|l| l.starts_with("order 42:"))
        .collect();
    assert_eq!(lines.len(), 4, "{output}");
    for line in &lines[1..] {
        assert!(line.starts_with("order 42: already sent"), "{output}");
    }
    assert_eq!(field(output, "outbox:"), "1 mail", "{output}");
}

/// Three `stream_worker`s on the stream `orders` of `redis`, the store on `cluster` when given:
/// one is killed with SIGKILL between a shipment and its `XACK`, and its entry, claimed by
/// another worker, is answered from the store. The ledger in Redis, which the kill cannot take
/// back, holds one shipment per order, and no entry is left pending.
async fn check_stream_worker(redis: &RedisServer, cluster: Option<&str>) {
    let mut conn = redis.connection().await;
    let publish = {
        let mut conn = conn.clone();
        async move {
            for order in 1..=ORDERS {
                let _: String = redis::cmd("XADD")
                    .arg("orders")
                    .arg("*")
                    .arg("order_id")
                    .arg(order)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
            }
        }
    };
    let worker = || {
        let mut command = example("stream_worker");
        command.env("REDIS_URL", redis.url());
        if let Some(seeds) = cluster {
            command.env("REDIS_CLUSTER_URLS", seeds);
        }
        command
    };
    let run = run_workers(worker, "orders", publish, Duration::from_secs(90)).await;
    let once: BTreeMap<u64, u64> = (1..=ORDERS).map(|order| (order, 1)).collect();
    assert_eq!(ledger(&mut conn, "orders").await, once, "{run:#?}");
    assert_eq!(run.killed, 1, "{run:#?}");
    assert!(run.duplicates_prevented() >= 1, "{run:#?}");
    assert!(run.deliveries.len() as u64 > ORDERS, "{run:#?}");
    // XPENDING's summary starts with the number of entries delivered and never acked.
    let (pending, ..): (u64, Option<String>, Option<String>, redis::Value) = redis::cmd("XPENDING")
        .arg("orders")
        .arg("shippers")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(pending, 0, "{run:#?}");
}

fn check_dlq_replay(output: &str) {
    let number = |label: &str| -> u64 { field(output, label).parse().unwrap() };
    assert_eq!(number("dead letters:"), 6, "{output}");
    assert_eq!(number("done, skipped:"), 3, "{output}");
    assert_eq!(number("locked, kept:"), 1, "{output}");
    assert_eq!(number("unknown, replayed:"), 2, "{output}");
    assert_eq!(field(output, "orders charged:"), "9 of 9", "{output}");
    assert_eq!(number("charged twice:"), 0, "{output}");
}

#[test]
fn charge_customer_shows_what_the_lock_adds_to_the_constraint() {
    let redis = RedisServer::start();
    let postgres = PostgresServer::start();
    let command = || {
        let mut command = example("charge_customer");
        command
            .env("REDIS_URL", redis.url())
            .env("DATABASE_URL", postgres.url());
        command
    };
    check_charge_customer(command);

    // A second run against the same servers uses a fresh order and holds again.
    let again = run(&mut command());
    assert_eq!(field(&again, "gateway charges:"), "1", "{again}");
}

#[test]
fn send_order_confirmation_sends_one_mail_whatever_the_redeliveries() {
    check_send_order_confirmation(&run(&mut example("send_order_confirmation")));
}

/// `send_order_confirmation` killed with SIGKILL at each point between taking an order and
/// recording its mail, before the send and after it: every such order is held in doubt (its
/// redeliveries send nothing), `idempotask status` says so, and an operator resolves each with
/// `idempotask resolve` from what the mail server holds: the confirmation found there is
/// recorded, an order whose mail never left is freed and sent by the next delivery. The outbox,
/// which the kills cannot take back, ends with exactly one mail per order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_order_confirmation_holds_the_killed_orders_until_an_operator_resolves_them() {
    const ORDERS: u64 = 6;
    let server = RedisServer::start();
    let deliveries = |orders: &str| {
        let mut command = example("send_order_confirmation");
        command.env("REDIS_URL", server.url()).env("ORDERS", orders);
        command
    };
    let killed = [
        (1, "before-send"),
        (2, "after-send"),
        (3, "before-send"),
        (4, "after-send"),
    ];
    for (order, point) in killed {
        let mut command = deliveries(&format!("{order}-{order}"));
        command.env("CRASH_AT", format!("{order}:{point}"));
        kill_at(command, &format!("order {order}: crashing {point}")).await;
    }
    let all = format!("1-{ORDERS}");
    let held = run(&mut deliveries(&all));
    for (order, _) in killed {
        let line = field(&held, &format!("order {order}:"));
        assert!(line.starts_with("held in doubt"), "{held}");
    }
    for order in 5..=ORDERS {
        assert!(
            field(&held, &format!("order {order}:")).starts_with("sent "),
            "{held}"
        );
    }

    // The operator: what the mail server sent, then each order in doubt resolved from it.
    let sent: BTreeMap<u64, String> = outbox(&server)
        .await
        .into_iter()
        .map(|(order, mails)| (order, mails[0].clone()))
        .collect();
    let operator = |args: &[&str]| {
        let mut command = support::example_runs::cli();
        command
            .env("REDIS_URL", server.url())
            .args(args)
            .args(["--task", "send_order_confirmation"]);
        command.output().unwrap()
    };
    let mut resolved = 0;
    for (order, _) in killed {
        let key = format!("order-confirmation-{order}");
        let status = operator(&["status", "--key", &key]);
        assert_eq!(status.status.code(), Some(5), "{status:?}");
        let how = match sent.get(&order) {
            Some(confirmation) => vec!["--result", confirmation.as_str()],
            None => vec!["--free"],
        };
        let mut args = vec!["resolve", "--key", key.as_str(), "--yes"];
        args.extend(how);
        let done = operator(&args);
        assert!(done.status.success(), "{done:?}");
        resolved += 1;
    }

    let after = run(&mut deliveries(&all));
    for order in 1..=ORDERS {
        let line = field(&after, &format!("order {order}:"));
        let expected = if sent.contains_key(&order) {
            "already sent"
        } else {
            "sent "
        };
        assert!(line.starts_with(expected), "order {order}: {after}");
    }
    let mails: BTreeMap<u64, usize> = outbox(&server)
        .await
        .into_iter()
        .map(|(order, mails)| (order, mails.len()))
        .collect();
    let recorded = killed
        .iter()
        .filter(|(order, _)| sent.contains_key(order))
        .count();
    println!(
        "orders {ORDERS}, kills {}, in doubt {}, resolved {resolved} ({recorded} recorded, {} freed), mails {}",
        killed.len(),
        killed.len(),
        killed.len() - recorded,
        mails.values().sum::<usize>()
    );
    assert_eq!(mails, (1..=ORDERS).map(|order| (order, 1)).collect());
}

/// `reconcile_charges` against its own gateway process, killed with SIGKILL before and after
/// charges: each order left in doubt is reconciled with the gateway's lookup (a charge it knows is
/// recorded, not made again; an order it never saw is charged), and the gateway, which the kills
/// cannot take back, ends with exactly one charge per order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_charges_asks_the_gateway_instead_of_charging_twice() {
    const ORDERS: u64 = 6;
    let server = RedisServer::start();
    let gateway_addr = format!("127.0.0.1:{}", support::free_port());
    let mut gateway = example("reconcile_charges");
    gateway.arg("gateway").env("GATEWAY_ADDR", &gateway_addr);
    let mut gateway = tokio::process::Command::from(gateway)
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut ready = BufReader::new(gateway.stdout.take().unwrap()).lines();
    let line = ready.next_line().await.unwrap().unwrap();
    assert!(line.starts_with("gateway listening"), "{line}");
    let worker = |orders: &str| {
        let mut command = example("reconcile_charges");
        command
            .env("REDIS_URL", server.url())
            .env("GATEWAY_ADDR", &gateway_addr)
            .env("ORDERS", orders);
        command
    };
    let killed = [
        (1, "before-charge"),
        (2, "after-charge"),
        (3, "after-charge"),
    ];
    for (order, point) in killed {
        let mut command = worker(&format!("{order}-{order}"));
        command.env("CRASH_AT", format!("{order}:{point}"));
        kill_at(command, &format!("order {order}: crashing {point}")).await;
    }
    let output = run(&mut worker(&format!("1-{ORDERS}")));
    for (order, point) in killed {
        let how = if point == "after-charge" {
            "reconciled"
        } else {
            "charged"
        };
        assert!(
            field(&output, &format!("order {order}:")).starts_with(how),
            "{output}"
        );
    }
    let replayed = run(&mut worker(&format!("1-{ORDERS}")));
    for order in 1..=ORDERS {
        assert!(
            field(&replayed, &format!("order {order}:")).starts_with("replayed"),
            "{replayed}"
        );
    }

    let mut socket = BufReader::new(tokio::net::TcpStream::connect(&gateway_addr).await.unwrap());
    socket.get_mut().write_all(b"CHARGES\n").await.unwrap();
    let mut charges: BTreeMap<String, usize> = BTreeMap::new();
    let mut lines = socket.lines();
    while let Some(line) = lines.next_line().await.unwrap() {
        if line == "END" {
            break;
        }
        let (key, _) = line.split_once(' ').unwrap();
        *charges.entry(key.to_owned()).or_default() += 1;
    }
    let reconciled = output.matches(": reconciled").count();
    println!(
        "orders {ORDERS}, kills {}, reconciled {reconciled}, charges {}, charged twice {}",
        killed.len(),
        charges.values().sum::<usize>(),
        charges.values().filter(|&&n| n > 1).count()
    );
    let expected = (1..=ORDERS).map(|order| (format!("order-charge-{order}"), 1));
    assert_eq!(charges, expected.collect());
}

/// `checkout_steps` aborts itself after its first step's effect; the next run replays that
/// step and runs the other two, and a third replays the whole checkout. The effects file,
/// which the abort cannot take back, holds each effect once.
#[test]
fn checkout_steps_replays_the_charge_after_a_crash_and_runs_the_rest_once() {
    let server = RedisServer::start();
    let effects = std::env::temp_dir().join(format!("checkout-effects-{}", support::free_port()));
    let checkout = |crash: bool| {
        let mut command = example("checkout_steps");
        command
            .env("REDIS_URL", server.url())
            .env("EFFECTS", &effects);
        if crash {
            command.env("CRASH_AFTER", "charge");
        }
        command
    };
    let crashed = checkout(true).output().unwrap();
    assert!(!crashed.status.success(), "{crashed:?}");
    let written = |effects: &std::path::Path| std::fs::read_to_string(effects).unwrap();
    assert_eq!(written(&effects), "charge order-7\n");

    let resumed = run(&mut checkout(false));
    assert_eq!(field(&resumed, "charge:"), "replayed \"ch_order-7\"");
    assert_eq!(field(&resumed, "ledger:"), "ran ()");
    assert_eq!(field(&resumed, "receipt:"), "ran ()");
    assert_eq!(field(&resumed, "outcome:"), "Executed ch_order-7");
    let replayed = run(&mut checkout(false));
    assert_eq!(field(&replayed, "outcome:"), "Replayed ch_order-7");
    assert!(!replayed.contains("ran"), "{replayed}");
    assert_eq!(
        written(&effects),
        "charge order-7\nledger order-7 ch_order-7\nreceipt order-7 ch_order-7\n"
    );
    std::fs::remove_file(&effects).unwrap();
}

/// Runs `command` until it prints `line` (the first line it prints), then kills it with
/// SIGKILL.
async fn kill_at(command: Command, line: &str) {
    let mut child = tokio::process::Command::from(command)
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    assert_eq!(lines.next_line().await.unwrap().as_deref(), Some(line));
    child.start_kill().unwrap();
    child.wait().await.unwrap();
}

/// The mails in `send_order_confirmation`'s outbox on `server`, by order, as JSON.
async fn outbox(server: &RedisServer) -> BTreeMap<u64, Vec<String>> {
    let mut conn = server.connection().await;
    let outbox: Vec<String> = redis::cmd("LRANGE")
        .arg("outbox")
        .arg(0)
        .arg(-1)
        .query_async(&mut conn)
        .await
        .unwrap();
    let mut mails: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    for text in outbox {
        let mail: serde_json::Value = serde_json::from_str(&text).unwrap();
        mails
            .entry(mail["order_id"].as_u64().unwrap())
            .or_default()
            .push(text);
    }
    mails
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_worker_ships_each_order_once_despite_a_kill_9() {
    let server = RedisServer::start();
    check_stream_worker(&server, None).await;
}

#[test]
fn dlq_replay_replays_only_the_unknown_dead_letters() {
    let server = RedisServer::start();
    for command in [example("dlq_replay"), {
        let mut with_redis = example("dlq_replay");
        with_redis.env("REDIS_URL", server.url());
        with_redis
    }] {
        let mut command = command;
        check_dlq_replay(&run(&mut command));
    }
}

#[test]
fn every_example_runs_against_a_redis_cluster() {
    let cluster = RedisCluster::start();
    let seeds = cluster.urls().join(",");
    let on_cluster = |name: &str| {
        let mut command = example(name);
        command.env("REDIS_CLUSTER_URLS", &seeds);
        command
    };
    let quickstart = run(&mut on_cluster("quickstart_redis"));
    assert!(field(&quickstart, "store:").starts_with("Redis Cluster at"));
    assert_eq!(field(&quickstart, "executions:"), "1");
    check_send_order_confirmation(&run(&mut on_cluster("send_order_confirmation")));
    check_dlq_replay(&run(&mut on_cluster("dlq_replay")));
    // The stream is the queue on a plain server; the store is the cluster.
    let queue = RedisServer::start();
    tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(check_stream_worker(&queue, Some(&seeds)));
    let postgres = PostgresServer::start();
    check_charge_customer(|| {
        let mut command = on_cluster("charge_customer");
        command.env("DATABASE_URL", postgres.url());
        command
    });
}

/// A running `http_payments` or `webhook_receiver` server: its base URL, and the lines it
/// prints after the first.
struct ExampleServer {
    child: tokio::process::Child,
    base: String,
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
}

impl ExampleServer {
    /// Starts the example `name` with `env` and waits for its `listening on http://ADDR`.
    async fn start(name: &str, env: &[(&str, &str)]) -> Self {
        use tokio::io::AsyncBufReadExt;
        let mut command = tokio::process::Command::from(example(name));
        command
            .envs(env.iter().copied())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true);
        let mut child = command.spawn().unwrap();
        let stdout = child.stdout.take().unwrap();
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        let first = lines
            .next_line()
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{name} printed nothing"));
        let base = first
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("not `listening on http://ADDR`: {first}"))
            .to_owned();
        Self { child, base, lines }
    }

    /// Waits until the server prints `line`.
    async fn printed(&mut self, line: &str) {
        while let Some(printed) = self.lines.next_line().await.unwrap() {
            if printed == line {
                return;
            }
        }
        panic!("the server ended without printing `{line}`");
    }

    /// SIGKILL, then every line the server printed that was not read yet.
    async fn kill_9_and_read_the_rest(mut self) -> Vec<String> {
        self.child.start_kill().unwrap();
        self.child.wait().await.unwrap();
        let mut rest = Vec::new();
        while let Some(line) = self.lines.next_line().await.unwrap() {
            rest.push(line);
        }
        rest
    }

    /// SIGKILL, as `kill -9` does.
    async fn kill_9(mut self) {
        self.child.start_kill().unwrap();
        self.child.wait().await.unwrap();
    }

    async fn pay(&self, key: Option<&str>) -> (u16, bool, String) {
        answer_of(payment(&self.base, key).send().await.unwrap()).await
    }

    /// Retries the payment with `key`, eight at once, until it is answered `201` (a `409`
    /// says a request with the key is still held, as the client is told to retry); answers
    /// every `201` body.
    async fn pay_until_done(&self, key: &str) -> Vec<String> {
        for _ in 0..300 {
            let answers = eight_at_once(self, key).await;
            let done: Vec<String> = answers
                .iter()
                .filter(|(status, _, _)| *status == 201)
                .map(|(_, _, body)| body.clone())
                .collect();
            for (status, _, body) in &answers {
                assert!(matches!(status, 201 | 409), "{status}: {body}");
            }
            if !done.is_empty() {
                return done;
            }
            // The dead holder's lock is still there: retry a moment later, as Retry-After says.
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        panic!("{key} was never answered 201");
    }
}

/// The example's payment request to the server at `base`, with `key` if any.
fn payment(base: &str, key: Option<&str>) -> reqwest::RequestBuilder {
    let request = reqwest::Client::new()
        .post(format!("{base}/payments"))
        .header("content-type", "application/json")
        .body(r#"{"amount": 4200, "currency": "EUR"}"#);
    match key {
        Some(key) => request.header("idempotency-key", key),
        None => request,
    }
}

/// The status, whether it is a replay, and the body of `response`.
async fn answer_of(response: reqwest::Response) -> (u16, bool, String) {
    let replayed = response.headers().get("idempotent-replayed").is_some();
    (
        response.status().as_u16(),
        replayed,
        response.text().await.unwrap(),
    )
}

/// The payment with `key`, sent eight times at once; every answer.
async fn eight_at_once(server: &ExampleServer, key: &str) -> Vec<(u16, bool, String)> {
    let mut answers = Vec::new();
    let mut running = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let (base, key) = (server.base.clone(), key.to_owned());
        running.spawn(
            async move { answer_of(payment(&base, Some(&key)).send().await.unwrap()).await },
        );
    }
    while let Some(answer) = running.join_next().await {
        answers.push(answer.unwrap());
    }
    answers
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_payments_charges_once_per_key_in_memory_and_on_redis() {
    let redis = RedisServer::start();
    let url = redis.url();
    for env in [vec![], vec![("REDIS_URL", url.as_str())]] {
        let server = ExampleServer::start("http_payments", &env).await;
        let done = server.pay_until_done("\"order-42\"").await;
        let again = server.pay(Some("order-42")).await;
        assert_eq!((again.0, again.1), (201, true), "{again:?}");
        for body in &done {
            assert_eq!(*body, again.2);
        }
        assert!(again.2.contains("\"id\":\"pay_1\""), "{}", again.2);
        let unkeyed = server.pay(None).await;
        assert_eq!(unkeyed.0, 400, "{unkeyed:?}");
        // The handler prints `charging KEY` each time it runs.
        let printed = server.kill_9_and_read_the_rest().await;
        let charged = printed
            .iter()
            .filter(|l| l.starts_with("charging "))
            .count();
        assert_eq!(charged, 1, "{env:?}: {printed:?}");
    }
}

/// The server killed with SIGKILL in the middle of a charge, then after answering one: counted
/// in Redis, which the kill cannot reach, each payment is charged once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_payments_killed_mid_handler_charges_once_after_the_restart() {
    let redis = RedisServer::start();
    let url = redis.url();
    let mut conn = redis.connection().await;
    let charged = |conn: &mut redis::aio::MultiplexedConnection| {
        let mut conn = conn.clone();
        async move {
            let count: Option<u64> = redis::cmd("GET")
                .arg("http_payments:charges")
                .query_async(&mut conn)
                .await
                .unwrap();
            count.unwrap_or(0)
        }
    };
    let lock_ttl = ("LOCK_TTL_MS", "1000");

    // Killed while the handler waits on the gateway: nothing was charged, the lock is left.
    let mut slow = ExampleServer::start(
        "http_payments",
        &[("REDIS_URL", &url), lock_ttl, ("PAYMENT_PAUSE_MS", "60000")],
    )
    .await;
    let base = slow.base.clone();
    let first = tokio::spawn(payment(&base, Some("\"order-7\"")).send());
    slow.printed("charging \"order-7\"").await;
    slow.kill_9().await;
    assert!(first.await.unwrap().is_err(), "the killed server answered");
    assert_eq!(charged(&mut conn).await, 0, "the kill landed mid-handler");

    // Restarted: eight retries at once, again and again until the dead lock expires; the
    // payment is charged once, and every answer is that charge.
    let server = ExampleServer::start("http_payments", &[("REDIS_URL", &url), lock_ttl]).await;
    let done = server.pay_until_done("\"order-7\"").await;
    assert!(done.iter().all(|body| *body == done[0]), "{done:?}");
    assert_eq!(charged(&mut conn).await, 1);

    // Killed after answering: the retry on the next server replays, and charges nothing.
    let answered = server.pay(Some("order-8")).await;
    assert_eq!((answered.0, answered.1), (201, false), "{answered:?}");
    assert_eq!(charged(&mut conn).await, 2);
    server.kill_9().await;
    let restarted = ExampleServer::start("http_payments", &[("REDIS_URL", &url), lock_ttl]).await;
    let replay = restarted.pay(Some("order-8")).await;
    assert_eq!(replay, (201, true, answered.2));
    assert_eq!(charged(&mut conn).await, 2);
    restarted.kill_9().await;
}

/// How the sender's deliveries of one event went.
#[derive(Debug, Default)]
struct Tally {
    attempts: u32,
    timeouts: u32,
    replayed: u32,
}

/// Delivers `order`'s event to `url` with the delivery id `delivery` until it is answered with a
/// 2xx, retrying on timeouts and errors as webhook senders do; answers the body of that answer.
async fn deliver_webhook(url: &str, delivery: &str, order: u32, tally: &Mutex<Tally>) -> String {
    let body = format!(r#"{{"kind": "order.paid", "order": {order}}}"#);
    for attempt in 1..=40 {
        tally.lock().unwrap().attempts += 1;
        let sent = reqwest::Client::new()
            .post(url)
            .header("x-delivery-id", delivery)
            .header("content-type", "application/json")
            // The first attempt waits less than the receiver takes over an event, so it times
            // out however fast the machine is; each retry waits longer, as senders back off,
            // up to 3 s, so that a loaded machine's slow answer is still taken in the end.
            .timeout((Duration::from_millis(300) * attempt).min(Duration::from_secs(3)))
            .body(body.clone())
            .send()
            .await;
        match sent {
            Ok(response) if response.status().is_success() => {
                let replayed = response.headers().contains_key("idempotent-replayed");
                // The timeout covers the body too: one that runs out while it is read is a
                // timeout like any other, and the sender tries again.
                match response.text().await {
                    Ok(text) => {
                        if replayed {
                            tally.lock().unwrap().replayed += 1;
                        }
                        return text;
                    }
                    Err(err) if err.is_timeout() => tally.lock().unwrap().timeouts += 1,
                    Err(err) => println!("{delivery}: {err}"),
                }
            }
            Ok(response) => println!("{delivery}: {}", response.status()),
            Err(err) if err.is_timeout() => tally.lock().unwrap().timeouts += 1,
            Err(err) => println!("{delivery}: {err}"),
        }
        // A sender's pause between attempts, not a wait for anything.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{delivery} was never answered")
}

/// A sender that retries on timeout and delivers events 5 and 10 twice at once, to a receiver
/// that takes longer over each event than the sender waits: each event is handled once, and
/// every delivery of it gets the same answer. On Redis, the delivery ids are kept there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_receiver_handles_each_event_once_despite_timeouts_and_double_deliveries() {
    const EVENTS: u32 = 12;
    let redis = RedisServer::start();
    let url = redis.url();
    for on_redis in [false, true] {
        let mut env = vec![("HANDLING_MS", "1000")];
        if on_redis {
            env.push(("REDIS_URL", url.as_str()));
        }
        let server = ExampleServer::start("webhook_receiver", &env).await;
        let webhooks = format!("{}/webhooks", server.base);
        let tally = Arc::new(Mutex::new(Tally::default()));
        let mut sending = tokio::task::JoinSet::new();
        for order in 1..=EVENTS {
            let copies = if [5, 10].contains(&order) { 2 } else { 1 };
            for _ in 0..copies {
                let (webhooks, tally) = (webhooks.clone(), Arc::clone(&tally));
                sending.spawn(async move {
                    let delivery = format!("delivery-{order}");
                    let answer = deliver_webhook(&webhooks, &delivery, order, &tally).await;
                    (delivery, answer)
                });
            }
        }
        let mut answers: BTreeMap<String, Vec<String>> = BTreeMap::new();
        while let Some(sent) = sending.join_next().await {
            let (delivery, answer) = sent.unwrap();
            answers.entry(delivery).or_default().push(answer);
        }
        let printed = server.kill_9_and_read_the_rest().await;
        let mut handled: BTreeMap<String, u32> = BTreeMap::new();
        for line in &printed {
            let (delivery, _) = line
                .strip_prefix("handled ")
                .and_then(|rest| rest.split_once(": "))
                .unwrap_or_else(|| panic!("{line}"));
            *handled.entry(delivery.to_owned()).or_default() += 1;
        }
        let tally = std::mem::take(&mut *tally.lock().unwrap());
        let context = format!("on Redis: {on_redis}, {tally:?}\n{printed:#?}\n{answers:#?}");
        assert_eq!(handled.len(), EVENTS as usize, "{context}");
        assert!(handled.values().all(|&times| times == 1), "{context}");
        assert_eq!(answers.len(), EVENTS as usize, "{context}");
        for copies in answers.values() {
            assert!(
                copies.iter().all(|answer| *answer == copies[0]),
                "{context}"
            );
            assert!(copies[0].contains("order.paid"), "{context}");
        }
        // Every event timed out at least once, and retries (and the copies sent at once) got
        // the stored answer.
        assert!(tally.timeouts >= EVENTS, "{context}");
        assert!(tally.replayed >= 2, "{context}");
        assert!(tally.attempts >= EVENTS + 4, "{context}");
        if on_redis {
            let mut conn = redis.connection().await;
            let keys: u64 = redis::cmd("DBSIZE").query_async(&mut conn).await.unwrap();
            assert!(keys >= u64::from(EVENTS), "{keys} keys in Redis: {context}");
        }
    }
}
