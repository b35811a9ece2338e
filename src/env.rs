//! The store the examples use, chosen by the environment as a deployment would choose it.

use idempotask::store::SharedStore;
use idempotask::store::StoreError;
use idempotask::{MemoryStore, RedisClusterStore, RedisStore};

/// The Redis store the environment names, and a line that says which it is.
///
/// `REDIS_CLUSTER_URLS` (comma-separated seed nodes; one reachable node is enough) gives a
/// [`RedisClusterStore`]; otherwise `REDIS_URL` gives a [`RedisStore`]; with neither set the
/// answer is `None`, and an example falls back to the in-memory store or says what it needs.
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idempotask::store::StoreError> {
/// if let Some((store, backend)) = idempotask_suite::env::redis_store().await? {
///     idempotask::install(store);
///     println!("store: {backend}");
/// }
/// # Ok(()) }
/// ```
///
/// # Errors
/// The [`StoreError`] of a store that cannot connect.
pub async fn redis_store() -> Result<Option<(SharedStore, String)>, StoreError> {
    if let Ok(urls) = std::env::var("REDIS_CLUSTER_URLS") {
        let seeds: Vec<&str> = urls.split(',').map(str::trim).collect();
        let store = RedisClusterStore::connect(seeds).await?;
        return Ok(Some((
            SharedStore::new(store),
            format!("Redis Cluster at {urls}"),
        )));
    }
    if let Ok(url) = std::env::var("REDIS_URL") {
        let store = RedisStore::connect(&url).await?;
        return Ok(Some((SharedStore::new(store), format!("Redis at {url}"))));
    }
    Ok(None)
}

/// Installs the store the environment names (see [`redis_store`]), or a [`MemoryStore`] when it
/// names none; answers which one, for the output.
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idempotask::store::StoreError> {
/// println!("store: {}", idempotask_suite::env::install_store().await?);
/// # Ok(()) }
/// ```
///
/// # Errors
/// The [`StoreError`] of a Redis store that cannot connect (never a silent fallback to memory).
pub async fn install_store() -> Result<String, StoreError> {
    if let Some((store, backend)) = redis_store().await? {
        idempotask::install(store);
        Ok(backend)
    } else {
        idempotask::install(MemoryStore::new());
        Ok("the in-memory store".to_owned())
    }
}
