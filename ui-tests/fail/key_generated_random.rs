// Random numbers, clocks and id generators are no idempotency keys.
use idempotask::{Error, idempotent_task};

#[idempotent_task(key = rand::random::<u64>())]
async fn by_random(order_id: u64) -> Result<u64, Error> {
    Ok(order_id)
}

#[idempotent_task(key = rand::rng().random_range(0..1000))]
async fn by_rng(order_id: u64) -> Result<u64, Error> {
    Ok(order_id)
}

#[idempotent_task(key = std::time::Instant::now())]
async fn by_instant(order_id: u64) -> Result<u64, Error> {
    Ok(order_id)
}

#[idempotent_task(key = chrono::Utc::now().timestamp())]
async fn by_utc(order_id: u64) -> Result<u64, Error> {
    Ok(order_id)
}

#[idempotent_task(key = ulid::Ulid::new())]
async fn by_ulid(order_id: u64) -> Result<u64, Error> {
    Ok(order_id)
}

#[idempotent_task(key = nanoid::nanoid!())]
async fn by_nanoid(order_id: u64) -> Result<u64, Error> {
    Ok(order_id)
}

fn main() {}
