//! `async fn` in a trait's implementation.
#![deny(warnings, clippy::pedantic)]

use idempotask::{Error, MemoryStore, idempotent_task};

trait Notifier {
    async fn notify(&self, user_id: u64) -> Result<bool, Error>;
}

struct Sms;

impl Notifier for Sms {
    #[idempotent_task(key = "sms-{user_id}", store = MemoryStore::new())]
    async fn notify(&self, user_id: u64) -> Result<bool, Error> {
        Ok(user_id > 0)
    }
}

#[tokio::main]
async fn main() {
    assert!(Sms.notify(1).await.unwrap());
}
