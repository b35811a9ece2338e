// A misspelt option lists the expected ones and suggests the closest.
use idempotask::{Error, idempotent_task};

#[idempotent_task(key = "a-{id}", lok_ttl = 30)]
async fn charge(id: u64) -> Result<u64, Error> {
    Ok(id)
}

fn main() {}
