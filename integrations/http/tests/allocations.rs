//! Heap allocations per request through the layer, counted by a global allocator that counts:
//! a fresh request, a duplicate (its stored response replayed) and, beside them, the same
//! request to the bare service and a plain task call of the core, on the in-memory store and a
//! current-thread runtime, so that every allocation is made on this test's thread. One test in
//! this binary: the counter is process-wide, and a second test running beside it would add to it.
//!
//! The ceilings are today's counts: an allocation added on the request path fails the test, and
//! one taken away lowers its ceiling here and in `docs/performance-http.md`.

use std::alloc::System;
use std::convert::Infallible;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use idempotask::{MemoryStore, Task};
use idempotask_http::{Idempotency, RequestBody};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};
use tower::{Layer, Service, ServiceExt, service_fn};

#[global_allocator]
static COUNTED: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// Requests per measurement: the figure is their mean.
const REQUESTS: usize = 200;

/// Allocations of a fresh request through the layer, and of a duplicate, at the most. Each is a
/// whole count plus a half: the in-memory store's table grows now and then, a fraction of an
/// allocation per request.
const FRESH_CEILING: f64 = 30.5;
const DUPLICATE_CEILING: f64 = 23.5;
/// Allocations of a fresh task call of the core, and of a duplicate, at the most.
const CORE_FRESH_CEILING: f64 = 10.5;
const CORE_DUPLICATE_CEILING: f64 = 7.5;

/// The handler: a small JSON receipt, as a payments endpoint answers.
async fn handler<B>(_: Request<B>) -> Result<Response<Full<Bytes>>, Infallible> {
    Ok(Response::builder()
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(
            br#"{"id":"ch_1","amount":1000}"#,
        )))
        .unwrap())
}

fn payment(key: &str) -> Request<Full<Bytes>> {
    Request::post("/payments")
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(
            br#"{"amount":1000,"currency":"eur"}"#,
        )))
        .unwrap()
}

/// Sends `request` through `service` and reads the whole answer, as a server would.
async fn send<S, B>(service: &mut S, request: Request<Full<Bytes>>) -> Bytes
where
    S: Service<Request<Full<Bytes>>, Response = Response<B>, Error = Infallible>,
    B: http_body::Body<Data = Bytes>,
    B::Error: std::fmt::Debug,
{
    let response = service.ready().await.unwrap().call(request).await.unwrap();
    assert!(response.status().is_success(), "{}", response.status());
    response.into_body().collect().await.unwrap().to_bytes()
}

/// The mean allocations of sending each of `requests` through `service`.
async fn allocations_per_request<S, B>(service: &mut S, requests: Vec<Request<Full<Bytes>>>) -> f64
where
    S: Service<Request<Full<Bytes>>, Response = Response<B>, Error = Infallible>,
    B: http_body::Body<Data = Bytes>,
    B::Error: std::fmt::Debug,
{
    let count = requests.len();
    let region = Region::new(COUNTED);
    for request in requests {
        send(service, request).await;
    }
    let allocations = region.change().allocations;
    mean(allocations, count)
}

#[test]
fn allocations_per_fresh_and_duplicate_request() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let layer = Idempotency::new(Task::new("http_allocations")).store(MemoryStore::new());
        let mut layered = layer.layer(service_fn(handler::<RequestBody<Full<Bytes>>>));
        let mut bare = service_fn(handler::<Full<Bytes>>);
        // Lazily built state (tracing's callsites, the task's names) is made once, untimed.
        for warm_up in 0..10 {
            send(&mut layered, payment(&format!("warm-up-{warm_up}"))).await;
            send(&mut layered, payment(&format!("warm-up-{warm_up}"))).await;
        }
        let keys: Vec<String> = (0..REQUESTS).map(|i| format!("order-{i:06}")).collect();
        let fresh =
            allocations_per_request(&mut layered, keys.iter().map(|k| payment(k)).collect())
                .await;
        let duplicate =
            allocations_per_request(&mut layered, keys.iter().map(|k| payment(k)).collect())
                .await;
        let without =
            allocations_per_request(&mut bare, keys.iter().map(|k| payment(k)).collect()).await;
        let (core_fresh, core_duplicate) = core_allocations(&keys).await;
        println!(
            "allocations per request: fresh {fresh:.2}, duplicate {duplicate:.2}, without the layer {without:.2}; a task call of the core: fresh {core_fresh:.2}, duplicate {core_duplicate:.2}"
        );
        assert!(fresh <= FRESH_CEILING, "fresh: {fresh:.1}");
        assert!(duplicate <= DUPLICATE_CEILING, "duplicate: {duplicate:.1}");
        assert!(core_fresh <= CORE_FRESH_CEILING, "core fresh: {core_fresh:.1}");
        assert!(
            core_duplicate <= CORE_DUPLICATE_CEILING,
            "core duplicate: {core_duplicate:.1}"
        );
    });
}

/// The mean allocations of a fresh task call of the core for each of `keys`, then of a
/// duplicate; the caller keys are made before counting.
async fn core_allocations(keys: &[String]) -> (f64, f64) {
    let store = idempotask::store::SharedStore::new(MemoryStore::new());
    let task = Task::new("core_allocations");
    let call = |key: String| {
        task.call(key)
            .store(store.clone())
            .run(async { Ok::<u32, idempotask::Error>(1) })
    };
    for warm_up in 0..10 {
        call(format!("warm-up-{warm_up}")).await.unwrap();
    }
    let mut per_call = [0.0; 2];
    for slot in &mut per_call {
        let owned: Vec<String> = keys.to_vec();
        let region = Region::new(COUNTED);
        for key in owned {
            call(key).await.unwrap();
        }
        *slot = mean(region.change().allocations, keys.len());
    }
    (per_call[0], per_call[1])
}

#[allow(
    clippy::cast_precision_loss,
    reason = "counts of a few thousand allocations are exact in an f64"
)]
fn mean(total: usize, count: usize) -> f64 {
    total as f64 / count as f64
}
