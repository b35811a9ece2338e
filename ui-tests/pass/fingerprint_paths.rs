//! Fingerprint paths: fields of a parameter, nested fields, a field of a parameter the key also
//! reads from, beside a whole parameter; the expansion is warning-free under clippy's pedantic set.
#![deny(warnings, clippy::pedantic)]

use idempotask::{Error, MemoryStore, idempotent_task};

#[derive(serde::Serialize)]
struct Customer {
    country: String,
}

#[derive(serde::Serialize)]
struct Order {
    id: u64,
    amount: u64,
    customer: Customer,
}

#[idempotent_task(
    key = "order-{order.id}",
    fingerprint = [order.amount, order.customer.country, currency],
)]
async fn charge(order: &Order, currency: String, note: String) -> Result<u64, Error> {
    let _ = (currency, note);
    Ok(order.amount)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    idempotask::install(MemoryStore::new());
    let order = Order {
        id: 1,
        amount: 1200,
        customer: Customer {
            country: "FR".into(),
        },
    };
    assert_eq!(
        charge(&order, "EUR".into(), "first".into()).await.unwrap(),
        1200
    );
    // `note` is not fingerprinted: a different note reuses the key.
    assert_eq!(
        charge(&order, "EUR".into(), "second".into()).await.unwrap(),
        1200
    );
    let changed = Order {
        amount: 1300,
        ..order
    };
    assert!(matches!(
        charge(&changed, "EUR".into(), "third".into()).await,
        Err(Error::KeyReuse { .. })
    ));
}
