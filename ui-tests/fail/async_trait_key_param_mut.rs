// Key parameters declared `mut` or `&mut` in an `#[async_trait]` method. async-trait moves a
// by-value parameter's `mut` from the signature onto its `let mut` in the body, where it is
// still reported at the user's `mut`.
use async_trait::async_trait;
use idempotask::{Error, idempotent_task};

#[async_trait]
trait Job {
    async fn by_mut(&self, idempotency_key: String) -> Result<usize, Error>;
    async fn by_mut_self(&mut self, order_id: u64) -> Result<u64, Error>;
}

struct Charge {
    tenant: String,
}

#[async_trait]
impl Job for Charge {
    #[idempotent_task(key = idempotency_key)]
    async fn by_mut(&self, mut idempotency_key: String) -> Result<usize, Error> {
        Ok(idempotency_key.len())
    }

    #[idempotent_task(key = "{self.tenant}-{order_id}")]
    async fn by_mut_self(&mut self, order_id: u64) -> Result<u64, Error> {
        Ok(order_id)
    }
}

fn main() {}
