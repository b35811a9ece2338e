// `log_key` takes "plain" or "hash"; anything else (a bool, another word) is rejected.
use idempotask::{Error, idempotent_task};

#[idempotent_task(key = "a-{id}", log_key = true)]
async fn boolean(id: u64) -> Result<u64, Error> {
    Ok(id)
}

#[idempotent_task(key = "b-{id}", log_key = "sha256")]
async fn other_word(id: u64) -> Result<u64, Error> {
    Ok(id)
}

fn main() {}
