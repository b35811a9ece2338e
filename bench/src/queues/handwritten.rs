//! The hand-written consumer's pattern, with redis-rs.

use futures_util::StreamExt;
use idempotask::store::LockToken;
use redis::aio::ConnectionManager;

use super::batch::Bodies;
use super::config::{Consumer, QueueError};

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

/// Runs one read's messages (each its key and payload) as the bare or the hand-written
/// consumer of a batching broker does: the bare one each body in turn, the hand-written one
/// each message through [`handwritten`], all of the read's at once.
pub(super) async fn run_read(
    consumer: Consumer,
    redis: &ConnectionManager,
    bodies: &Bodies,
    read: &[(&str, &[u8])],
) -> Result<(), QueueError> {
    if consumer != Consumer::Handwritten {
        for (_, payload) in read {
            bodies.run(payload);
        }
        return Ok(());
    }
    futures_util::stream::iter(read)
        .map(|&(key, payload)| {
            let mut redis = redis.clone();
            async move {
                match handwritten(&mut redis, key, || bodies.run(payload)).await? {
                    Handwritten::Busy => Err(format!("{key} was busy").into()),
                    Handwritten::Done | Handwritten::Replayed => Ok(()),
                }
            }
        })
        .buffer_unordered(read.len().max(1))
        .fold(Ok(()), |done: Result<(), QueueError>, one| async move {
            done.and(one)
        })
        .await
}
