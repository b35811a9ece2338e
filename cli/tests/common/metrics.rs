//! Workers' metrics pages, as `metrics-exporter-prometheus` renders them, for `--metrics`.

use std::net::SocketAddr;

use axum::Router;
use axum::routing::get;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

/// One worker's counters, as the runtime names them: `(task, outcome, count)` of
/// `idempotask_calls_total`, and `(task, count)` of `idempotask_lock_waits_total`.
pub(crate) fn worker(calls: &[(&str, &str, u64)], waits: &[(&str, u64)]) -> PrometheusHandle {
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, || {
        for &(task, outcome, count) in calls {
            metrics::counter!(
                "idempotask_calls_total",
                "task" => task.to_owned(),
                "outcome" => outcome.to_owned()
            )
            .increment(count);
        }
        for &(task, count) in waits {
            metrics::counter!("idempotask_lock_waits_total", "task" => task.to_owned())
                .increment(count);
        }
        // Another metric of the same worker, which the dashboard leaves alone.
        metrics::histogram!("idempotask_lock_wait_seconds", "task" => "charge").record(0.25);
    });
    handle
}

/// Serves `handle`'s page at `/metrics` on a loopback port of its own, for the test's life.
pub(crate) fn serve(handle: PrometheusHandle) -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let app = Router::new().route("/metrics", get(move || async move { handle.render() }));
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            axum::serve(listener, app).await.unwrap();
        });
    });
    addr
}
