// The same option twice.
use idempotask::{Error, idempotent_task};

#[idempotent_task(key = "a-{id}", lock_ttl = 30, lock_ttl = 60)]
async fn charge(id: u64) -> Result<u64, Error> {
    Ok(id)
}

fn main() {}
