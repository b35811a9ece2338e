//! Every example, run as its own process against servers this test starts, with its output
//! checked. `cargo test --workspace` builds the examples (the package `idempotask-examples`,
//! with every feature on, as this package asks) before it runs this binary.

use idempotask_test_support as support;

use std::process::{Command, Output};

use support::RedisServer;
use support::cluster::RedisCluster;
use support::example_runs::example;
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

/// What the example's header says of `charge_customer`: one charge with idempotask, several
/// with the constraint only, two when the lock expires mid-task; one table row each time.
fn check_charge_customer(output: &str) {
    // run, deliveries, gateway charges, table rows, same result
    let row = |run: &str| -> Vec<u64> {
        let line = output
            .lines()
            .find(|l| l.starts_with(run))
            .unwrap_or_else(|| panic!("{output}"));
        line[run.len()..]
            .split_whitespace()
            .map(|n| n.parse().unwrap())
            .collect()
    };
    assert_eq!(row("with idempotask"), [11, 1, 1, 11]);
    let constraint_only = row("constraint only");
    assert_eq!((constraint_only[0], constraint_only[2]), (11, 1));
    assert!(constraint_only[1] > 1, "{output}");
    assert_eq!(row("lock expired mid-task")[1..3], [2, 1]);
}

fn check_send_order_confirmation(output: &str) {
    assert!(
        field(output, "delivery 1:").starts_with("sent "),
        "{output}"
    );
    for delivery in 2..=4 {
        let line = field(output, &format!("delivery {delivery}:"));
        assert!(
            line.starts_with("already sent") && line.ends_with("(1 mail in the outbox)"),
            "{output}"
        );
    }
    assert!(field(output, "outbox:").starts_with("1 mail"), "{output}");
}

fn check_stream_worker(output: &str) {
    let number = |label: &str| -> u64 { field(output, label).parse().unwrap() };
    let messages = number("messages:");
    assert_eq!(number("side effects:"), messages);
    assert_eq!(number("shipped twice:"), 0);
    assert!(number("crashes:") > 0, "{output}");
    assert!(number("redeliveries:") >= number("crashes:"), "{output}");
    assert!(number("deliveries:") > messages, "{output}");
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
    let output = run(example("charge_customer")
        .env("REDIS_URL", redis.url())
        .env("DATABASE_URL", postgres.url()));
    check_charge_customer(&output);

    // A second run against the same servers uses fresh orders and holds again.
    let again = run(example("charge_customer")
        .env("REDIS_URL", redis.url())
        .env("DATABASE_URL", postgres.url()));
    assert!(
        again
            .lines()
            .any(|l| l.starts_with("with idempotask") && l.split_whitespace().nth(3) == Some("1"))
    );
}

#[test]
fn send_order_confirmation_sends_one_mail_whatever_the_redeliveries() {
    let server = RedisServer::start();
    for command in [example("send_order_confirmation"), {
        let mut with_redis = example("send_order_confirmation");
        with_redis.env("REDIS_URL", server.url());
        with_redis
    }] {
        let mut command = command;
        check_send_order_confirmation(&run(&mut command));
    }
}

#[test]
fn stream_worker_side_effects_equal_messages_despite_crashes() {
    let server = RedisServer::start();
    check_stream_worker(&run(example("stream_worker").env("REDIS_URL", server.url())));
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
    check_stream_worker(&run(
        on_cluster("stream_worker").env("REDIS_URL", queue.url())
    ));
    let postgres = PostgresServer::start();
    check_charge_customer(&run(
        on_cluster("charge_customer").env("DATABASE_URL", postgres.url())
    ));
}

/// The JSON summary that ends the output of an example (`webhook_receiver`).
fn apalis_summary(output: &str) -> serde_json::Value {
    let line = output.lines().last().unwrap_or_default();
    serde_json::from_str(line).unwrap_or_else(|err| panic!("{err}: not a JSON summary\n{output}"))
}

/// A running `http_payments` server: its base URL, and the lines it prints after the first.
struct PaymentsServer {
    child: tokio::process::Child,
    base: String,
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
}

impl PaymentsServer {
    /// Starts the example with `env` and waits for its `listening on http://ADDR`.
    async fn start(env: &[(&str, &str)]) -> Self {
        use tokio::io::AsyncBufReadExt;
        let mut command = tokio::process::Command::from(example("http_payments"));
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
            .expect("http_payments printed nothing");
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
        panic!("http_payments ended without printing `{line}`");
    }

    /// SIGKILL, as `kill -9` does.
    async fn kill_9(mut self) {
        self.child.start_kill().unwrap();
        self.child.wait().await.unwrap();
    }

    async fn pay(&self, key: Option<&str>) -> (u16, bool, String) {
        answer_of(payment(&self.base, key).send().await.unwrap()).await
    }

    async fn executions(&self) -> u64 {
        let url = format!("{}/executions", self.base);
        let text = reqwest::get(url).await.unwrap().text().await.unwrap();
        text.parse()
            .unwrap_or_else(|_| panic!("GET /executions: {text}"))
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
async fn eight_at_once(server: &PaymentsServer, key: &str) -> Vec<(u16, bool, String)> {
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
        let server = PaymentsServer::start(&env).await;
        let done = server.pay_until_done("\"order-42\"").await;
        let again = server.pay(Some("order-42")).await;
        assert_eq!((again.0, again.1), (201, true), "{again:?}");
        for body in &done {
            assert_eq!(*body, again.2);
        }
        assert!(again.2.contains("\"id\":\"pay_1\""), "{}", again.2);
        let unkeyed = server.pay(None).await;
        assert_eq!(unkeyed.0, 400, "{unkeyed:?}");
        assert_eq!(server.executions().await, 1, "{env:?}");
        server.kill_9().await;
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
                .arg("http_payments:executions")
                .query_async(&mut conn)
                .await
                .unwrap();
            count.unwrap_or(0)
        }
    };
    let lock_ttl = ("LOCK_TTL_MS", "1000");

    // Killed while the handler waits on the gateway: nothing was charged, the lock is left.
    let mut slow =
        PaymentsServer::start(&[("REDIS_URL", &url), lock_ttl, ("PAYMENT_PAUSE_MS", "60000")])
            .await;
    let base = slow.base.clone();
    let first = tokio::spawn(payment(&base, Some("\"order-7\"")).send());
    slow.printed("charging \"order-7\"").await;
    slow.kill_9().await;
    assert!(first.await.unwrap().is_err(), "the killed server answered");
    assert_eq!(charged(&mut conn).await, 0, "the kill landed mid-handler");

    // Restarted: eight retries at once, again and again until the dead lock expires; the
    // payment is charged once, and every answer is that charge.
    let server = PaymentsServer::start(&[("REDIS_URL", &url), lock_ttl]).await;
    let done = server.pay_until_done("\"order-7\"").await;
    assert!(done.iter().all(|body| *body == done[0]), "{done:?}");
    assert_eq!(charged(&mut conn).await, 1);

    // Killed after answering: the retry on the next server replays, and charges nothing.
    let answered = server.pay(Some("order-8")).await;
    assert_eq!((answered.0, answered.1), (201, false), "{answered:?}");
    assert_eq!(charged(&mut conn).await, 2);
    server.kill_9().await;
    let restarted = PaymentsServer::start(&[("REDIS_URL", &url), lock_ttl]).await;
    let replay = restarted.pay(Some("order-8")).await;
    assert_eq!(replay, (201, true, answered.2));
    assert_eq!(charged(&mut conn).await, 2);
    assert_eq!(restarted.executions().await, 2);
    restarted.kill_9().await;
}

#[test]
fn webhook_receiver_handles_each_event_once_despite_timeouts_and_double_deliveries() {
    let redis = RedisServer::start();
    for env in [None, Some(redis.url())] {
        let mut command = example("webhook_receiver");
        if let Some(url) = &env {
            command.env("REDIS_URL", url);
        }
        let summary = apalis_summary(&run(&mut command));
        let number = |field: &str| {
            summary[field]
                .as_u64()
                .unwrap_or_else(|| panic!("no `{field}` in {summary}"))
        };
        let events = number("events");
        assert_eq!(number("handled"), events, "{summary}");
        assert_eq!(number("handled_twice"), 0, "{summary}");
        assert_eq!(summary["same_answers"], true, "{summary}");
        // The slow events timed out at least once each, and their retries (and the events
        // sent twice at once) got the stored answer.
        assert!(number("timeouts") >= 2, "{summary}");
        assert!(number("replayed") >= 2, "{summary}");
        assert!(number("deliveries") >= events + 4, "{summary}");
        assert_eq!(
            summary["store"],
            if env.is_some() { "redis" } else { "memory" }
        );
    }
}
