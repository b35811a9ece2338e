// The key parameter rebound inside the body: the key would not change, only look as if it did.
use idempotask::{Error, idempotent_task};
use uuid::Uuid;

#[idempotent_task(key = idempotency_key)]
async fn charge_customer(idempotency_key: String) -> Result<usize, Error> {
    let idempotency_key = Uuid::new_v4().to_string();
    Ok(idempotency_key.len())
}

fn main() {}
