//! The hand-written consumer's pattern, with redis-rs.

use idempotask::store::LockToken;
use redis::aio::ConnectionManager;

use super::config::QueueError;

/// The compare-and-delete that releases the hand-written consumer's lock.
const RELEASE: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

/// Why the hand-written consumer did not run a message's body.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Handwritten {
    /// The body ran and the marker was written.
    Done,
    /// The marker was there: a duplicate.
    Replayed,
    /// Another holder has the lock.
    Busy,
}

/// The seed's pattern, four round trips for a fresh key: `GET` the marker, `SET lock token NX
/// PX`, the body, `SET` the marker, the compare-and-delete of the lock.
pub(super) async fn handwritten(
    redis: &mut ConnectionManager,
    key: &str,
    body: impl FnOnce() -> u64,
) -> Result<Handwritten, QueueError> {
    let done = format!("hw:{key}:done");
    let lock = format!("hw:{key}:lock");
    let stored: Option<Vec<u8>> = redis::cmd("GET").arg(&done).query_async(redis).await?;
    if stored.is_some() {
        return Ok(Handwritten::Replayed);
    }
    let token = LockToken::generate();
    let acquired: Option<String> = redis::cmd("SET")
        .arg(&lock)
        .arg(token.as_str())
        .arg("NX")
        .arg("PX")
        .arg(30_000)
        .query_async(redis)
        .await?;
    if acquired.is_none() {
        return Ok(Handwritten::Busy);
    }
    let value = serde_json::to_vec(&body())?;
    let () = redis::cmd("SET")
        .arg(&done)
        .arg(value)
        .arg("EX")
        .arg(86_400)
        .query_async(redis)
        .await?;
    let _: i64 = redis::cmd("EVAL")
        .arg(RELEASE)
        .arg(1)
        .arg(&lock)
        .arg(token.as_str())
        .query_async(redis)
        .await?;
    Ok(Handwritten::Done)
}
