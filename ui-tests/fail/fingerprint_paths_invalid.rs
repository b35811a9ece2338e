// Fingerprint paths name fields by name, of a parameter, each once; a field the type lacks is
// rustc's error, at the path.
use idempotask::{Error, idempotent_task};

#[derive(serde::Serialize)]
struct Order {
    id: u64,
    amount: u64,
}

#[idempotent_task(key = "a-{order.id}", fingerprint = [order.amount, order.amount, pair.0, ordr.amount, order.amount()])]
async fn mistakes(order: &Order, pair: (u64, u64)) -> Result<u64, Error> {
    Ok(order.amount + pair.0)
}

#[idempotent_task(key = "b-{order.id}", fingerprint = [order.amont])]
async fn no_such_field(order: &Order) -> Result<u64, Error> {
    Ok(order.amount)
}

#[idempotent_task(key = "c-{order.id}", fingerprint = [])]
async fn nothing_listed(order: &Order) -> Result<u64, Error> {
    Ok(order.amount)
}

fn main() {}
