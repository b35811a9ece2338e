// The error type must carry idempotask's own errors.
use idempotask::idempotent_task;

#[derive(Debug)]
enum PaymentError {
    Declined,
}

#[idempotent_task(key = "a-{id}")]
async fn charge(id: u64) -> Result<u64, PaymentError> {
    if id == 0 {
        return Err(PaymentError::Declined);
    }
    Ok(id)
}

fn main() {}
