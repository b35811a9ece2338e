// TTLs past what any store keeps: Redis refuses such an expiry, so the attribute does.
use idempotask::{Error, idempotent_task};

#[idempotent_task(key = "a-{id}", result_ttl = "107000000000d")]
async fn result_for_ages(id: u64) -> Result<u64, Error> {
    Ok(id)
}

#[idempotent_task(key = "b-{id}", lock_ttl = 3153600001, result_ttl = "36500d")]
async fn lock_past_a_century(id: u64) -> Result<u64, Error> {
    Ok(id)
}

#[idempotent_task(key = "c-{id}", doubt_memory = "36501d")]
async fn remembered_past_a_century(id: u64) -> Result<u64, Error> {
    Ok(id)
}

// Exactly the limit is accepted.
#[idempotent_task(key = "d-{id}", result_ttl = "36500d", doubt_memory = "36500d")]
async fn a_century(id: u64) -> Result<u64, Error> {
    Ok(id)
}

fn main() {}
