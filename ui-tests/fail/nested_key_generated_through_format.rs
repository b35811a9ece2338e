// A generated value inside `format!`, as a nested call's key (issue:
// `SEND_RECEIPT.call(format!("receipt-{:?}", std::time::SystemTime::now()))` compiled).
use idempotask::{Error, Task, idempotent_task};
use rand::Rng as _;

static INNER: Task = Task::new("send_receipt");

#[path = "../standins/generators.rs"]
mod generators;
use generators::{chrono, fastrand};

#[idempotent_task(key = "order-uuid_v4-{order_id}")]
async fn uuid_v4(order_id: u64) -> Result<u64, Error> {
    let nested: u64 = INNER.call(format!("receipt-{:?}", uuid::Uuid::new_v4())).run(async { Ok::<_, Error>(1) }).await?;
    Ok(order_id + nested)
}

#[idempotent_task(key = "order-uuid_v7-{order_id}")]
async fn uuid_v7(order_id: u64) -> Result<u64, Error> {
    let nested: u64 = INNER.call(format!("receipt-{:?}", uuid::Uuid::now_v7())).run(async { Ok::<_, Error>(1) }).await?;
    Ok(order_id + nested)
}

#[idempotent_task(key = "order-rand_random-{order_id}")]
async fn rand_random(order_id: u64) -> Result<u64, Error> {
    let nested: u64 = INNER.call(format!("receipt-{:?}", rand::random::<u64>())).run(async { Ok::<_, Error>(1) }).await?;
    Ok(order_id + nested)
}

#[idempotent_task(key = "order-rand_rng-{order_id}")]
async fn rand_rng(order_id: u64) -> Result<u64, Error> {
    let nested: u64 = INNER.call(format!("receipt-{:?}", rand::rng().random::<u64>())).run(async { Ok::<_, Error>(1) }).await?;
    Ok(order_id + nested)
}

#[idempotent_task(key = "order-fastrand-{order_id}")]
async fn fastrand(order_id: u64) -> Result<u64, Error> {
    let nested: u64 = INNER.call(format!("receipt-{:?}", fastrand::u64(..))).run(async { Ok::<_, Error>(1) }).await?;
    Ok(order_id + nested)
}

#[idempotent_task(key = "order-system_time-{order_id}")]
async fn system_time(order_id: u64) -> Result<u64, Error> {
    let nested: u64 = INNER.call(format!("receipt-{:?}", std::time::SystemTime::now())).run(async { Ok::<_, Error>(1) }).await?;
    Ok(order_id + nested)
}

#[idempotent_task(key = "order-instant-{order_id}")]
async fn instant(order_id: u64) -> Result<u64, Error> {
    let nested: u64 = INNER.call(format!("receipt-{:?}", std::time::Instant::now())).run(async { Ok::<_, Error>(1) }).await?;
    Ok(order_id + nested)
}

#[idempotent_task(key = "order-chrono_utc-{order_id}")]
async fn chrono_utc(order_id: u64) -> Result<u64, Error> {
    let nested: u64 = INNER.call(format!("receipt-{:?}", chrono::Utc::now())).run(async { Ok::<_, Error>(1) }).await?;
    Ok(order_id + nested)
}

#[idempotent_task(key = "order-chrono_local-{order_id}")]
async fn chrono_local(order_id: u64) -> Result<u64, Error> {
    let nested: u64 = INNER.call(format!("receipt-{:?}", chrono::Local::now())).run(async { Ok::<_, Error>(1) }).await?;
    Ok(order_id + nested)
}

#[idempotent_task(key = "order-process_id-{order_id}")]
async fn process_id(order_id: u64) -> Result<u64, Error> {
    let nested: u64 = INNER.call(format!("receipt-{:?}", std::process::id())).run(async { Ok::<_, Error>(1) }).await?;
    Ok(order_id + nested)
}

fn main() {}
