//! The benchmark, run once with a tiny N on Redis, Valkey and a cluster: it works end to end and
//! its counts hold.
//! No timing is asserted; `scripts/bench.sh` measures.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use idempotask_test_support as support;

use idempotask_bench::sweep::{self, Contender, SweepConfig};
use idempotask_bench::{self as bench, Config, Mode, SCALING_CONCURRENCY, postgres, report};
use support::RedisServer;
use support::cluster::RedisCluster;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_mode_runs_and_costs_what_the_protocol_says() {
    let server = RedisServer::start();
    run_every_mode(server.url(), false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_mode_runs_on_valkey_with_the_same_costs() {
    let server = RedisServer::start_valkey();
    run_every_mode(server.url(), false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_mode_runs_on_a_cluster_with_the_same_costs() {
    let cluster = RedisCluster::start();
    run_every_mode(cluster.urls().join(","), true).await;
}

/// Runs `--mode all` with a tiny N and checks each mode's counts, which are the same on one
/// server and on a cluster (summed over its masters).
async fn run_every_mode(redis_url: String, cluster: bool) {
    let config = Config {
        redis_url,
        cluster,
        mode: Mode::All,
        tasks: 16,
        concurrency: 4,
        rounds: 1,
    };
    let mut lines = 0;
    let measurements = bench::run(&config, |m| {
        lines += 1;
        assert!(serde_json::to_string(m).unwrap().starts_with(r#"{"mode":"#));
    })
    .await
    .unwrap();
    assert_eq!(lines, measurements.len());

    let of = |mode: &str| {
        measurements
            .iter()
            .filter(|m| m.mode == mode)
            .collect::<Vec<_>>()
    };
    // Commands per task call, as `INFO commandstats` counts the client's commands.
    for (mode, commands, executions) in [
        ("fresh", 2.0, 16),
        ("duplicate", 1.0, 0),
        // Answered from the process's memory: no command reaches the server.
        ("duplicate-cached", 0.0, 0),
        ("fenced", 2.0, 16),
        ("handwritten-fresh", 4.0, 16),
        ("handwritten-duplicate", 3.0, 0),
        ("latency", 2.0, 16),
        // `begin`, the journal read at the first step, a `record_step` per step, `finish`; three
        // effects per unit.
        ("steps", 6.0, 48),
        // The lock, the result's `GET`, a `GET` and a `SET` per step, the result's `SET`, the
        // release.
        ("handwritten-steps", 10.0, 48),
    ] {
        // `all` also runs `fresh` and `handwritten-fresh` at C = 1, after the rounds.
        let m = of(mode)[0];
        #[allow(
            clippy::float_cmp,
            reason = "whole command counts over 16 calls are exact"
        )]
        let exact = m.redis_commands_per_task == commands;
        assert!(exact, "{m:?}");
        assert_eq!(m.executions, executions, "{m:?}");
        assert_eq!(m.deliveries, 16, "{m:?}");
        assert!(m.tasks_per_sec > 0.0 && m.p50_us <= m.p99_us, "{m:?}");
    }
    let [contended] = of("contended")[..] else {
        panic!("{measurements:?}")
    };
    // N / C keys, C deliveries each, one execution per key.
    assert_eq!(
        (contended.tasks, contended.deliveries, contended.executions),
        (4, 16, 4),
        "{contended:?}"
    );
    let scaling: Vec<usize> = of("scaling").iter().map(|m| m.concurrency).collect();
    assert_eq!(scaling, SCALING_CONCURRENCY);
    assert!(of("scaling").iter().all(|m| m.executions == 16));
    assert!(of("latency")[0].ping_p50_us.is_some());
    assert!(measurements.iter().all(|m| m.lock_keys_left == 0));
    assert!(of("fresh")[0].marker_bytes.is_some_and(|bytes| bytes > 0));
    assert_eq!(
        of("fresh")
            .iter()
            .map(|m| m.concurrency)
            .collect::<Vec<_>>(),
        [4, 1]
    );

    let markdown = report::markdown(&measurements);
    for target in report::targets(&measurements) {
        assert!(markdown.contains(target.name), "{markdown}");
    }
    assert_eq!(report::targets(&measurements).len(), 15, "{markdown}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_quorum_mode_runs_on_three_servers_with_three_times_the_commands() {
    let quorum = support::quorum::Quorum::start(3);
    let config = Config {
        redis_url: quorum.urls().join(","),
        cluster: false,
        mode: Mode::Quorum,
        tasks: 16,
        concurrency: 4,
        rounds: 1,
    };
    let measurements = bench::run(&config, |_| {}).await.unwrap();
    assert_eq!(measurements.len(), 2);
    for m in &measurements {
        assert_eq!((m.mode, m.executions, m.lock_keys_left), ("quorum", 16, 0));
        // Each fresh task is `begin` and `finish` on each of the three servers.
        assert!((m.redis_commands_per_task - 6.0).abs() < 0.01, "{m:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_postgres_modes_run_with_the_statements_the_protocol_says() {
    let server = support::postgres::PostgresServer::start_with(&[
        "shared_preload_libraries=pg_stat_statements",
    ]);
    let config = postgres::PgConfig {
        database_url: server.url(),
        tasks: 16,
        concurrency: 4,
        rounds: 1,
    };
    let measurements = postgres::run(&config, |_| {}).await.unwrap();
    let modes: Vec<&str> = measurements.iter().map(|m| m.mode).collect();
    assert_eq!(modes, postgres::MODES);
    // Statements per call as pg_stat_statements counts them, BEGIN and COMMIT included: 2 per
    // fresh task and 1 per duplicate by default; the grouping store sends a batch as one
    // statement for all its units, so at most 2 per fresh task (the batches' sizes depend on
    // the timing).
    for (m, (statements, rows)) in measurements.iter().zip([
        (2.0, 0),
        (2.0, 0),
        (2.0, 0),
        (2.0, 0),
        (2.0, 0),
        (1.0, 0),
        (5.0, 16),
        (5.0, 16),
        (5.0, 16),
        (5.0, 16),
    ]) {
        if m.mode == "pg-fresh" || m.mode == "pg-duplicate" {
            // Grouped by default: a batch statement carries several calls' units.
            let batched = m.statements_per_task.unwrap_or(f64::MAX);
            assert!(batched > 0.0 && batched <= statements, "{m:?}");
        } else {
            assert_eq!(m.statements_per_task, Some(statements), "{m:?}");
        }
        assert_eq!(m.rows_written, rows, "{m:?}");
        assert!(m.tasks_per_sec > 0.0 && m.p50_us <= m.p99_us, "{m:?}");
    }
    let markdown = postgres::markdown(&measurements);
    assert!(markdown.contains("| pg-transactional |"), "{markdown}");
    assert!(
        markdown.contains("| pg-transactional ÷ pg-transactional-table-floor, tasks/s |"),
        "{markdown}"
    );
    // The floor works on the store's own table: each of its tasks left a completed unit there.
    let pool = sqlx::PgPool::connect(&server.url()).await.unwrap();
    let floor_units: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM idempotask_units
         WHERE state = 'done' AND position('table-floor'::bytea in key) > 0",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(floor_units, 16);
}

/// Two runs at once in one process, as cargo runs this file's tests: each keeps its own store
/// and counts only its own bodies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_runs_at_once_keep_their_stores_and_counts_apart() {
    let (server, quorum) = (RedisServer::start(), support::quorum::Quorum::start(3));
    let config = |redis_url, mode| Config {
        redis_url,
        cluster: false,
        mode,
        tasks: 64,
        concurrency: 4,
        rounds: 1,
    };
    let (one, three) = (
        config(server.url(), Mode::Fresh),
        config(quorum.urls().join(","), Mode::Quorum),
    );
    let (one, three) = tokio::join!(bench::run(&one, |_| {}), bench::run(&three, |_| {}));
    let (one, three) = (one.unwrap(), three.unwrap());
    assert_eq!(one.len(), 1);
    for m in one.iter().chain(&three) {
        assert_eq!(
            (m.executions, m.lock_keys_left),
            (m.tasks as u64, 0),
            "{m:?}"
        );
    }
    // Each server saw the commands of its own run only.
    assert!(
        (one[0].redis_commands_per_task - 2.0).abs() < 0.01,
        "{one:?}"
    );
    assert!(
        three
            .iter()
            .all(|m| (m.redis_commands_per_task - 6.0).abs() < 0.01),
        "{three:?}"
    );
}

/// The sweep of `bench --sweep`, with a contender of its own: every (round, concurrency,
/// implementation) once, each round in a rotated order, named by the server it ran on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweep_measures_every_implementation_at_every_concurrency() {
    let server = RedisServer::start_valkey();
    let ran = Arc::new(AtomicU64::new(0));
    let counted = Arc::clone(&ran);
    let other = Contender::new("other", move |_run, _id| {
        counted.fetch_add(1, Ordering::Relaxed);
        async { Ok(()) }
    });
    let config = SweepConfig {
        redis_url: server.url(),
        tasks: 8,
        concurrency: vec![1, 4],
        rounds: 2,
    };
    let mut emitted = 0;
    let points = sweep::sweep(&config, vec![other], |_| emitted += 1)
        .await
        .unwrap();
    assert_eq!(emitted, points.len());
    let order: Vec<(usize, usize, &str)> = points
        .iter()
        .map(|p| (p.round, p.concurrency, p.implementation.as_str()))
        .collect();
    assert_eq!(
        order,
        [
            (1, 1, "idempotask"),
            (1, 1, "hand-written"),
            (1, 1, "other"),
            (1, 4, "idempotask"),
            (1, 4, "hand-written"),
            (1, 4, "other"),
            (2, 1, "hand-written"),
            (2, 1, "other"),
            (2, 1, "idempotask"),
            (2, 4, "hand-written"),
            (2, 4, "other"),
            (2, 4, "idempotask"),
        ]
    );
    assert!(
        points.iter().all(|p| p.server.starts_with("Valkey 8.")),
        "{points:?}"
    );
    assert!(points.iter().all(|p| p.tasks == 8 && p.tasks_per_sec > 0.0));
    // 8 untimed tasks to warm up, then 8 per measurement.
    assert_eq!(ran.load(Ordering::Relaxed), 8 + 4 * 8);
}
