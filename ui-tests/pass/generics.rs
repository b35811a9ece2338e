//! Generic functions, `impl Trait` and reference parameters.
#![deny(warnings, clippy::pedantic)]

use std::fmt::Display;

use idempotask::{Error, MemoryStore, idempotent_task};
use serde::Serialize;
use serde::de::DeserializeOwned;

#[idempotent_task(key = "echo-{id}")]
async fn echo<T>(id: impl Display + Send, value: T) -> Result<T, Error>
where
    T: Serialize + DeserializeOwned + Send,
{
    Ok(value)
}

#[idempotent_task(key = "len-{name}")]
async fn length<'a>(name: &'a str, items: &'a [u8]) -> Result<usize, Error> {
    Ok(name.len() + items.len())
}

#[idempotent_task(key = "sum-{key}", fingerprint = [values])]
async fn sum<K: Display + Sync>(key: &K, values: Vec<u64>) -> Result<u64, Error> {
    Ok(values.iter().sum())
}

#[tokio::main]
async fn main() {
    idempotask::install(MemoryStore::new());
    assert_eq!(echo(1, "a".to_owned()).await.unwrap(), "a");
    assert_eq!(echo(1, "b".to_owned()).await.unwrap(), "a");
    assert_eq!(length("ab", &[1, 2, 3]).await.unwrap(), 5);
    assert_eq!(sum(&"k", vec![1, 2]).await.unwrap(), 3);
}
