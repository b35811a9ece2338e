//! `idempotask dashboard --metrics URL`: each task's call counters, read from the metrics pages
//! of two workers (each rendered by `metrics-exporter-prometheus`, the exporter the observe docs
//! name) and summed; a page that does not answer is named on the dashboard instead of failing
//! it; a source that is not an `http://` URL is refused before the dashboard starts.

use idempotask_test_support::RedisServer;
use serde_json::Value;

mod common;

use common::metrics::{serve, worker};
use common::web::Dashboard;
use common::{Backend, Redis, json};

#[test]
fn each_tasks_calls_are_summed_over_the_workers_pages() {
    let server = RedisServer::start();
    Redis(&server).complete("charge", &["order-1"]);
    let first = serve(worker(
        &[
            ("charge", "executed", 5),
            ("charge", "replayed", 2),
            ("charge", "contended", 1),
            ("charge", "lock_lost", 1),
            ("refund", "executed", 9),
        ],
        &[("charge", 3)],
    ));
    let second = serve(worker(
        &[
            ("charge", "executed", 2),
            ("charge", "reconciled", 1),
            ("charge", "failed", 4),
            ("charge", "in_doubt", 6),
            ("charge", "marker_not_written", 1),
        ],
        &[("charge", 1)],
    ));
    // Nothing listens on port 1.
    let gone = "http://127.0.0.1:1/metrics";
    let dashboard = Dashboard::start(
        "--redis-url",
        &server.url(),
        &[
            "--task",
            "charge",
            "--task",
            "quiet",
            "--metrics",
            &format!("http://{first}/metrics"),
            "--metrics",
            &format!("http://{second}/metrics"),
            "--metrics",
            gone,
        ],
    );
    let units = json(&dashboard.get("/api/units").body);
    let charge = &units["tasks"][0];
    assert_eq!(charge["task"], "charge");
    let calls = &charge["calls"];
    let count = |name: &str| {
        calls[name]
            .as_u64()
            .unwrap_or_else(|| panic!("{name}: {calls}"))
    };
    assert_eq!(
        [
            count("fresh"),
            count("duplicate"),
            count("waited"),
            count("gave_up"),
            count("failed"),
            count("lost"),
            count("held"),
        ],
        [8, 2, 4, 1, 4, 2, 6],
        "{calls}"
    );
    // The first read has nothing earlier to compare with.
    assert_eq!(calls["gave_up_recently"], Value::Null, "{calls}");
    // A task no worker reported has no counters; one that only the metrics name comes after
    // the tasks asked for.
    assert_eq!(units["tasks"][1]["task"], "quiet");
    assert_eq!(units["tasks"][1]["calls"], Value::Null, "{units}");
    assert_eq!(units["tasks"][2]["task"], "refund");
    assert_eq!(units["tasks"][2]["calls"]["fresh"], 9, "{units}");
    assert_eq!(units["tasks"].as_array().unwrap().len(), 3);
    let unread = units["metrics_unread"].as_array().unwrap();
    assert_eq!(unread.len(), 1, "{unread:?}");
    assert!(unread[0].as_str().unwrap().starts_with(gone), "{unread:?}");

    let page = dashboard.get("/");
    assert_eq!(page.status, 200);
    assert!(page.body.contains("8 fresh"), "{}", page.body);
    // Give-ups and lost locks are marked when there are any; failures are not.
    assert!(
        page.body
            .contains(r#"<span class="count gave-up alert">1 gave up"#)
    );
    assert!(
        page.body
            .contains(r#"<span class="count failed">4 failed</span>"#)
    );
    assert!(
        page.body
            .contains("Metrics not read: http://127.0.0.1:1/metrics")
    );
}

#[test]
fn without_task_the_tasks_are_those_the_metrics_name() {
    let server = RedisServer::start();
    Redis(&server).complete("charge", &["order-1"]);
    let worker = serve(worker(
        &[
            ("charge", "executed", 1),
            // No task can have this name: it is left out, not walked.
            ("no:colons", "executed", 1),
        ],
        &[],
    ));
    let dashboard = Dashboard::start(
        "--redis-url",
        &server.url(),
        &["--metrics", &format!("http://{worker}/metrics")],
    );
    let units = json(&dashboard.get("/api/units").body);
    let tasks = units["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 1, "{units}");
    assert_eq!(
        (&tasks[0]["task"], &tasks[0]["done"]),
        (&"charge".into(), &1.into())
    );
    assert_eq!(tasks[0]["calls"]["fresh"], 1);
}

#[test]
fn a_page_that_never_answers_is_named_and_the_others_still_count() {
    let server = RedisServer::start();
    let answering = serve(worker(&[("charge", "executed", 3)], &[]));
    // Connections to it are taken by the kernel and never answered.
    let hanging = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let hanging = format!("http://{}/metrics", hanging.local_addr().unwrap());
    let dashboard = Dashboard::start(
        "--redis-url",
        &server.url(),
        &[
            "--task",
            "charge",
            "--metrics",
            &hanging,
            "--metrics",
            &format!("http://{answering}/metrics"),
        ],
    );
    let units = json(&dashboard.get("/api/units").body);
    assert_eq!(units["tasks"][0]["calls"]["fresh"], 3, "{units}");
    let unread = units["metrics_unread"].as_array().unwrap();
    assert_eq!(unread.len(), 1, "{unread:?}");
    assert!(
        unread[0].as_str().unwrap().starts_with(&hanging),
        "{unread:?}"
    );
}

#[test]
fn the_tasks_only_the_metrics_name_are_walked_up_to_twenty() {
    let server = RedisServer::start();
    let names: Vec<String> = (0..25).map(|n| format!("task-{n:02}")).collect();
    let calls: Vec<(&str, &str, u64)> = names
        .iter()
        .map(|name| (name.as_str(), "executed", 1))
        .collect();
    let worker = serve(worker(&calls, &[]));
    let dashboard = Dashboard::start(
        "--redis-url",
        &server.url(),
        &[
            "--task",
            "charge",
            "--metrics",
            &format!("http://{worker}/metrics"),
        ],
    );
    let units = json(&dashboard.get("/api/units").body);
    let shown: Vec<&str> = units["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|task| task["task"].as_str().unwrap())
        .collect();
    assert_eq!(shown.len(), 21, "{shown:?}");
    assert_eq!(
        (shown[0], shown[1], shown[20]),
        ("charge", "task-00", "task-19")
    );
    let unread = units["metrics_unread"].as_array().unwrap();
    let note = unread[0].as_str().unwrap();
    assert!(note.starts_with("5 more tasks"), "{note}");
    assert!(note.contains("task-24"), "{note}");
}

#[test]
fn a_source_that_is_not_an_http_url_is_refused_before_the_store_is_reached() {
    for (source, says) in [
        ("https://worker:9000/metrics", "only http://"),
        ("worker:9000/metrics", "only http://"),
        ("not a url", "not a URL"),
    ] {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_idempotask"))
            .env_remove("REDIS_URL")
            .env_remove("DATABASE_URL")
            .args(["--redis-url", "redis://127.0.0.1:1", "dashboard"])
            .args(["--task", "charge", "--metrics", source])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{source}: {err}");
        assert!(err.contains(says), "{source}: {err}");
    }
}
