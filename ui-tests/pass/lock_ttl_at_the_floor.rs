//! A lock TTL of exactly `idempotask::MIN_TTL` (100 ms) is taken by the attribute and by
//! `Task::lock_ttl` in the expansion's `static`. With `fail/lock_ttl_below_the_floor.rs`, this
//! keeps the attribute's copy of the floor equal to the runtime's: a higher floor on either
//! side fails this case, a lower one in the attribute changes that case's errors.
#![deny(warnings, clippy::pedantic)]

use std::time::Duration;

use idempotask::{Error, MemoryStore, idempotent_task};

#[idempotent_task(key = "export-{id}", lock_ttl = "100ms", renew = true)]
async fn export(id: u64) -> Result<u64, Error> {
    Ok(id)
}

#[tokio::main]
async fn main() {
    assert_eq!(idempotask::MIN_TTL, Duration::from_millis(100));
    idempotask::install(MemoryStore::new());
    assert_eq!(export(7).await.unwrap(), 7);
    assert_eq!(export(7).await.unwrap(), 7);
}
