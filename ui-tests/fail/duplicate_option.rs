// The same option twice.
use idempotask::{Error, idempotent_task};

#[idempotent_task(key = "a-{id}", lock_ttl = 30, lock_ttl = 60)]
async fn charge(id: u64) -> Result<u64, Error> {
    Ok(id)
}

#[idempotent_task(key = "b-{id}", in_doubt = "hold", doubt_memory = 60, in_doubt = "rerun")]
async fn transfer(id: u64) -> Result<u64, Error> {
    Ok(id)
}

fn main() {}
