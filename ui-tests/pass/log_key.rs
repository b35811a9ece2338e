//! `log_key = "hash"`: the key's SHA-256 stands for it in logs; the task behaves the same.
#![deny(warnings, clippy::pedantic)]

use idempotask::{Error, MemoryStore, idempotent_task};

#[idempotent_task(key = "statement-{email}", log_key = "hash")]
async fn send_statement(email: &str) -> Result<usize, Error> {
    Ok(email.len())
}

#[idempotent_task(key = "receipt-{email}", log_key = "plain")]
async fn send_receipt(email: &str) -> Result<usize, Error> {
    Ok(email.len() + 1)
}

#[tokio::main]
async fn main() {
    idempotask::install(MemoryStore::new());
    assert_eq!(send_statement("ada@example.com").await.unwrap(), 15);
    assert_eq!(send_statement("ada@example.com").await.unwrap(), 15);
    assert_eq!(send_receipt("ada@example.com").await.unwrap(), 16);
}
