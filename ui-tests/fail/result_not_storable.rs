// An `Ok` type that cannot be stored gets one clear message, not a wall of serde bounds.
use idempotask::{Error, idempotent_task};

struct Receipt {
    id: u64,
}

#[idempotent_task(key = "a-{id}")]
async fn charge(id: u64) -> Result<Receipt, Error> {
    Ok(Receipt { id })
}

fn main() {}
