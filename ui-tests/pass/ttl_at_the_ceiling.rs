//! A result TTL and a doubt memory of exactly `idempotask::MAX_TTL` (36 500 days) are taken
//! by the attribute, and the runtime's `MAX_TTL` is that long. With `fail/ttl_too_long.rs` (a
//! second more is refused), this keeps the attribute's copy of the ceiling equal to the
//! runtime's: a proc macro cannot read the runtime's constant, and the runtime would clamp a
//! longer duration silently.
#![deny(warnings, clippy::pedantic)]

use std::time::Duration;

use idempotask::{Error, MemoryStore, idempotent_task};

#[idempotent_task(key = "archive-{id}", result_ttl = "36500d", doubt_memory = "36500d")]
async fn archive(id: u64) -> Result<u64, Error> {
    Ok(id)
}

#[tokio::main]
async fn main() {
    assert_eq!(idempotask::MAX_TTL, Duration::from_secs(36_500 * 24 * 60 * 60));
    idempotask::install(MemoryStore::new());
    assert_eq!(archive(7).await.unwrap(), 7);
    assert_eq!(archive(7).await.unwrap(), 7);
}
