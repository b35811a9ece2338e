// `crate` takes the path idempotask is re-exported at, as a string.
use idempotask::{Error, idempotent_task};

#[idempotent_task(key = "a-{id}", crate = 5)]
async fn numbered(id: u64) -> Result<u64, Error> {
    Ok(id)
}

#[idempotent_task(key = "b-{id}", crate = "not a path")]
async fn spaced(id: u64) -> Result<u64, Error> {
    Ok(id)
}

fn main() {}
