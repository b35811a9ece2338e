//! Every option on a free function; the expansion is warning-free under clippy's pedantic set.
#![deny(warnings, clippy::pedantic)]

use idempotask::{Error, MemoryStore, idempotent_task};

#[derive(Debug, thiserror::Error)]
enum PaymentError {
    #[error("card declined")]
    Declined,
    #[error(transparent)]
    Idempotency(#[from] Error),
}

#[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
struct ChargeId(String);

struct Order {
    id: u64,
    customer: String,
}

impl Order {
    fn region(&self) -> &'static str {
        if self.id.is_multiple_of(2) {
            "eu"
        } else {
            "us"
        }
    }
}

/// Charges a customer once per order.
#[idempotent_task(
    key = "order-charge-{order.id}-{order.customer}-{order.region()}",
    lock_ttl = "750ms",
    result_ttl = "7d",
    name = "charge_customer.v2",
    fingerprint = [amount_cents],
    renew = true,
    fencing = true,
    max_attempts = 20,
    max_wait = "2s",
    initial_backoff = "5ms",
    max_backoff = "100ms",
)]
async fn charge_customer(order: &Order, amount_cents: u64) -> Result<ChargeId, PaymentError> {
    if amount_cents == 0 {
        return Err(PaymentError::Declined);
    }
    let amount = u32::try_from(amount_cents).map_err(|_| PaymentError::Declined)?;
    Ok(ChargeId(format!("ch_{}_{amount}", order.id)))
}

/// A key template with escaped braces and two parameters; integer lock TTL.
#[idempotent_task(
    key = "{{literal}}-{tenant}-{user_id}",
    lock_ttl = 30,
    result_ttl = 3600
)]
async fn welcome(tenant: &str, user_id: u32) -> Result<(), Error> {
    let _ = (tenant, user_id);
    Ok(())
}

fn assert_send<T: Send>(value: T) -> T {
    value
}

#[tokio::main]
async fn main() {
    idempotask::install(MemoryStore::new());
    let order = Order {
        id: 42,
        customer: "c-7".to_owned(),
    };
    let first = assert_send(charge_customer(&order, 1200)).await.unwrap();
    let again = charge_customer(&order, 1200).await.unwrap();
    assert_eq!(first, again);
    assert!(matches!(
        charge_customer(&order, 999).await,
        Err(PaymentError::Idempotency(Error::KeyReuse { .. }))
    ));
    welcome("acme", 7).await.unwrap();
}
