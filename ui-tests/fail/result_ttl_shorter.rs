// A marker that expires before the lock would let a duplicate run.
use idempotask::{Error, idempotent_task};

#[idempotent_task(key = "a-{id}", lock_ttl = "2m", result_ttl = 60)]
async fn explicit(id: u64) -> Result<u64, Error> {
    Ok(id)
}

#[idempotent_task(key = "b-{id}", result_ttl = "10s")]
async fn against_the_default(id: u64) -> Result<u64, Error> {
    Ok(id)
}

fn main() {}
