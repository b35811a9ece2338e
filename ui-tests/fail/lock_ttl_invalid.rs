// Lock TTLs that are zero, negative or unreadable.
use idempotask::{Error, idempotent_task};

#[idempotent_task(key = "a-{id}", lock_ttl = 0)]
async fn zero(id: u64) -> Result<u64, Error> {
    Ok(id)
}

#[idempotent_task(key = "b-{id}", lock_ttl = -5)]
async fn negative(id: u64) -> Result<u64, Error> {
    Ok(id)
}

#[idempotent_task(key = "c-{id}", lock_ttl = "2 weeks")]
async fn unreadable(id: u64) -> Result<u64, Error> {
    Ok(id)
}

#[idempotent_task(key = "d-{id}", lock_ttl = "0ms")]
async fn zero_ms(id: u64) -> Result<u64, Error> {
    Ok(id)
}

fn main() {}
