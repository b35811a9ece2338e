// A nested call's key made by a generator right inside `.call(..)`.
use idempotask::{Error, Task, idempotent_task};
use rand::Rng as _;

static INNER: Task = Task::new("send_receipt");

#[path = "../standins/generators.rs"]
mod generators;
use generators::{chrono, fastrand};

#[idempotent_task(key = "order-uuid_v4-{order_id}")]
async fn uuid_v4(order_id: u64) -> Result<u64, Error> {
    let nested: u64 = INNER.call(uuid::Uuid::new_v4().to_string()).run(async { Ok::<_, Error>(1) }).await?;
    Ok(order_id + nested)
}

#[idempotent_task(key = "order-uuid_v7-{order_id}")]
async fn uuid_v7(order_id: u64) -> Result<u64, Error> {
    let nested: u64 = INNER.call(uuid::Uuid::now_v7().to_string()).run(async { Ok::<_, Error>(1) }).await?;
    Ok(order_id + nested)
}

#[idempotent_task(key = "order-rand_random-{order_id}")]
async fn rand_random(order_id: u64) -> Result<u64, Error> {
    let nested: u64 = INNER.call(rand::random::<u64>().to_string()).run(async { Ok::<_, Error>(1) }).await?;
    Ok(order_id + nested)
}

#[idempotent_task(key = "order-rand_rng-{order_id}")]
async fn rand_rng(order_id: u64) -> Result<u64, Error> {
    let nested: u64 = INNER.call(rand::rng().random::<u64>().to_string()).run(async { Ok::<_, Error>(1) }).await?;
    Ok(order_id + nested)
}

#[idempotent_task(key = "order-fastrand-{order_id}")]
async fn fastrand(order_id: u64) -> Result<u64, Error> {
    let nested: u64 = INNER.call(fastrand::u64(..).to_string()).run(async { Ok::<_, Error>(1) }).await?;
    Ok(order_id + nested)
}

#[idempotent_task(key = "order-system_time-{order_id}")]
async fn system_time(order_id: u64) -> Result<u64, Error> {
    let nested: u64 = INNER.call(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos().to_string()).run(async { Ok::<_, Error>(1) }).await?;
    Ok(order_id + nested)
}

#[idempotent_task(key = "order-instant-{order_id}")]
async fn instant(order_id: u64) -> Result<u64, Error> {
    let nested: u64 = INNER.call(std::time::Instant::now().elapsed().as_nanos().to_string()).run(async { Ok::<_, Error>(1) }).await?;
    Ok(order_id + nested)
}

#[idempotent_task(key = "order-chrono_utc-{order_id}")]
async fn chrono_utc(order_id: u64) -> Result<u64, Error> {
    let nested: u64 = INNER.call(chrono::Utc::now().to_string()).run(async { Ok::<_, Error>(1) }).await?;
    Ok(order_id + nested)
}

#[idempotent_task(key = "order-chrono_local-{order_id}")]
async fn chrono_local(order_id: u64) -> Result<u64, Error> {
    let nested: u64 = INNER.call(chrono::Local::now().to_string()).run(async { Ok::<_, Error>(1) }).await?;
    Ok(order_id + nested)
}

#[idempotent_task(key = "order-process_id-{order_id}")]
async fn process_id(order_id: u64) -> Result<u64, Error> {
    let nested: u64 = INNER.call(std::process::id().to_string()).run(async { Ok::<_, Error>(1) }).await?;
    Ok(order_id + nested)
}

fn main() {}
