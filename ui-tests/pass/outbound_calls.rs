//! A body may stamp and identify its own outbound requests: the time, a request id, jitter.
//! Only the key must come from the caller. Regression: a `.call(..)` whose arguments held
//! `now()` or `new_v4()` was taken for `Task::call` and refused, though `tower::Service::call`
//! is the most common method name in async Rust; and a `Result` alias whose name did not end in
//! `Result` was refused although the type system accepts it.
#![deny(warnings, clippy::pedantic)]

use std::time::{Duration, SystemTime};

use idempotask::{MemoryStore, idempotent_task};
use uuid::Uuid;

#[derive(Debug, thiserror::Error)]
enum PaymentError {
    #[error(transparent)]
    Idempotency(#[from] idempotask::Error),
}

struct ChargeRequest {
    order_id: u64,
    at: SystemTime,
    request_id: Uuid,
}

/// Stands in for a `tower::Service`: a `call` that takes a request and answers later.
struct Gateway;

impl Gateway {
    async fn call(&self, request: ChargeRequest) -> Result<String, PaymentError> {
        tokio::task::yield_now().await;
        let since = request.at.duration_since(SystemTime::UNIX_EPOCH).is_ok();
        Ok(format!(
            "ch_{}_{}_{since}",
            request.order_id,
            request.request_id.get_version_num()
        ))
    }
}

static GATEWAY: Gateway = Gateway;

/// A `Result` under another name: the bound on the expansion checks it, not its spelling.
type Charged = Result<String, PaymentError>;

#[idempotent_task(key = "order-charge-{order_id}", lock_ttl = 30)]
async fn charge_customer(order_id: u64) -> Charged {
    let charge = GATEWAY
        .call(ChargeRequest {
            order_id,
            at: SystemTime::now(),
            request_id: Uuid::new_v4(),
        })
        .await?;
    // Jitter before a follow-up call is the body's own business too.
    let pause = Duration::from_millis(rand::random::<u64>() % 2);
    tokio::time::sleep(pause).await;
    Ok(charge)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    idempotask::install(MemoryStore::new());
    let first = charge_customer(7).await.unwrap();
    let again = charge_customer(7).await.unwrap();
    assert_eq!(first, again);
}
