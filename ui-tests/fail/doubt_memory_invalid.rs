// Doubt memories that are negative or unreadable. Zero is allowed (it turns detection off).
use idempotask::{Error, idempotent_task};

#[idempotent_task(key = "a-{id}", doubt_memory = -1)]
async fn negative(id: u64) -> Result<u64, Error> {
    Ok(id)
}

#[idempotent_task(key = "b-{id}", doubt_memory = "forever")]
async fn unreadable(id: u64) -> Result<u64, Error> {
    Ok(id)
}

#[idempotent_task(key = "c-{id}", doubt_memory = 1.5)]
async fn fractional(id: u64) -> Result<u64, Error> {
    Ok(id)
}

fn main() {}
