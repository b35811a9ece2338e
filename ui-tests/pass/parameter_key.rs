//! A bare parameter as the key: a `String`, a `&str` or a `Uuid` chosen by the caller.
#![deny(warnings, clippy::pedantic)]

use idempotask::{Error, MemoryStore, idempotent_task};
use uuid::Uuid;

#[idempotent_task(key = idempotency_key)]
async fn by_string(idempotency_key: String, amount: u64) -> Result<u64, Error> {
    Ok(amount)
}

#[idempotent_task(key = request_id)]
async fn by_uuid(request_id: Uuid) -> Result<String, Error> {
    Ok(request_id.to_string())
}

#[idempotent_task(key = message_id)]
async fn by_str(message_id: &str) -> Result<usize, Error> {
    Ok(message_id.len())
}

#[tokio::main]
async fn main() {
    idempotask::install(MemoryStore::new());
    assert_eq!(by_string("k".to_owned(), 1).await.unwrap(), 1);
    assert_eq!(by_string("k".to_owned(), 2).await.unwrap(), 1);
    // The caller decides the UUID, once, where the business decision is made.
    let request_id = Uuid::new_v4();
    assert_eq!(by_uuid(request_id).await.unwrap(), request_id.to_string());
    assert_eq!(by_str("m-1").await.unwrap(), 3);
}
