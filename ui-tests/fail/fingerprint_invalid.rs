// The fingerprint names parameters other than the key's.
use idempotask::{Error, idempotent_task};

#[idempotent_task(key = "a-{order_id}", fingerprint = [amount_cent])]
async fn unknown(order_id: u64, amount_cents: u64) -> Result<u64, Error> {
    Ok(order_id + amount_cents)
}

#[idempotent_task(key = "b-{order_id}", fingerprint = [order_id, amount_cents])]
async fn the_key_itself(order_id: u64, amount_cents: u64) -> Result<u64, Error> {
    Ok(order_id + amount_cents)
}

fn main() {}
