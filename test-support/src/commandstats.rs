//! What a Redis server ran, from `INFO commandstats`: how tests count the commands a store
//! sends.

use std::collections::HashMap;

/// Clears the server's command counts (`CONFIG RESETSTAT`).
///
/// # Panics
/// When the server refuses.
pub async fn reset_stats(conn: &mut redis::aio::MultiplexedConnection) {
    let _: String = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(conn)
        .await
        .unwrap();
}

/// The data commands the server ran since the last [`reset_stats`], by lowercase name, leaving
/// out the measuring connection's own `INFO` and `CONFIG`. A script's inner commands count too.
///
/// # Panics
/// When the server refuses `INFO`.
pub async fn commands_run(conn: &mut redis::aio::MultiplexedConnection) -> HashMap<String, u64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .unwrap();
    info.lines()
        .filter_map(|line| {
            let (name, stats) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = stats.split(',').find_map(|kv| kv.strip_prefix("calls="))?;
            Some((name.to_owned(), calls.parse().ok()?))
        })
        .filter(|(name, _)| !name.starts_with("config") && name != "info")
        .collect()
}

/// `pairs` as [`commands_run`] answers them, for an `assert_eq!`.
pub fn stats(pairs: &[(&str, u64)]) -> HashMap<String, u64> {
    pairs
        .iter()
        .map(|(name, calls)| ((*name).to_owned(), *calls))
        .collect()
}
