// The key parameter rebound inside an `#[async_trait]` method. async-trait's own
// `let idempotency_key = idempotency_key;`, which moves the argument into its block, is not
// reported; the user's rebinding is, with the same message as in a free function.
use async_trait::async_trait;
use idempotask::{Error, idempotent_task};
use uuid::Uuid;

#[async_trait]
trait Job {
    async fn run(&self, idempotency_key: String) -> Result<usize, Error>;
}

struct Charge;

#[async_trait]
impl Job for Charge {
    #[idempotent_task(key = idempotency_key)]
    async fn run(&self, idempotency_key: String) -> Result<usize, Error> {
        let idempotency_key = Uuid::new_v4().to_string();
        Ok(idempotency_key.len())
    }
}

fn main() {}
