//! Hygiene: a user `mod core`, a user type named `Result`, parameters named like generated
//! locals, and `anyhow::Error` as the error type.
#![deny(warnings, clippy::pedantic)]
#![allow(non_snake_case)] // `TASK` is the name of the static in the expansion

use idempotask::{MemoryStore, idempotent_task};

#[allow(dead_code)]
mod core {
    pub(crate) struct Duration;
}

#[allow(dead_code)]
struct Result;

mod idempotask_like {
    pub(crate) type Result<T> = anyhow::Result<T>;
}

#[idempotent_task(key = "h-{__idempotask_key}", fingerprint = [__idempotask_body])]
async fn shadowing(
    __idempotask_key: u32,
    __idempotask_body: u32,
    __idempotask_task: u32,
    __idempotask_store: u32,
    TASK: u32,
) -> idempotask_like::Result<u32> {
    Ok(__idempotask_key + __idempotask_body + __idempotask_task + __idempotask_store + TASK)
}

#[idempotent_task(key = "a-{id}")]
async fn with_anyhow(id: u32) -> anyhow::Result<u32> {
    anyhow::ensure!(id > 0, "id must be positive");
    Ok(id)
}

#[tokio::main]
async fn main() {
    idempotask::install(MemoryStore::new());
    assert_eq!(shadowing(1, 2, 3, 4, 5).await.unwrap(), 15);
    assert_eq!(with_anyhow(5).await.unwrap(), 5);
    assert!(with_anyhow(0).await.is_err());
}
