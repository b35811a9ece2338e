//! The work being measured: an annotated task, and the hand-written pattern it replaces.

use std::sync::atomic::{AtomicU64, Ordering};

use idempotask::store::LockToken;
use idempotask::{Error, idempotent_task};

use super::BenchError;
use super::target::Connection;

/// How many times a body really ran, across every workload of this process.
static EXECUTIONS: AtomicU64 = AtomicU64::new(0);

/// Bodies run so far in this process.
pub(crate) fn executions() -> u64 {
    EXECUTIONS.load(Ordering::Relaxed)
}

/// The task every idempotask mode runs: the macro path as users write it, on the installed
/// store, with a `()` result (so the marker is the smallest there is).
#[idempotent_task(key = "{run}-{id}")]
pub(crate) async fn bench_task(run: u64, id: u64) -> Result<(), Error> {
    EXECUTIONS.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

/// `bench_task` with a fencing token for every execution.
#[idempotent_task(key = "{run}-{id}", fencing = true)]
pub(crate) async fn bench_task_fenced(run: u64, id: u64) -> Result<(), Error> {
    EXECUTIONS.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

/// The task name `bench_task` stores under.
pub(crate) const BENCH_TASK: &str = "bench_task";

/// The compare-and-delete that the pattern's blog posts release their lock with.
const RELEASE: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

/// The pattern users write by hand, four commands for a fresh key: `SET lock NX EX`, `GET` the
/// stored result, run and `SET result EX`, `EVAL` the release. A duplicate skips the `SET` of
/// the result, so it costs three.
pub(crate) async fn handwritten(mut conn: Connection, run: u64, id: u64) -> Result<(), BenchError> {
    let lock = format!("handwritten:{run}-{id}:lock");
    let done = format!("handwritten:{run}-{id}:done");
    let token = LockToken::generate();
    let acquired: Option<String> = redis::cmd("SET")
        .arg(&lock)
        .arg(token.as_str())
        .arg("NX")
        .arg("EX")
        .arg(30)
        .query_async(&mut conn)
        .await?;
    if acquired.is_none() {
        return Err(BenchError(format!("{lock} is busy")));
    }
    let stored: Option<Vec<u8>> = redis::cmd("GET").arg(&done).query_async(&mut conn).await?;
    if let Some(bytes) = stored {
        serde_json::from_slice::<()>(&bytes)?;
    } else {
        EXECUTIONS.fetch_add(1, Ordering::Relaxed);
        let value = serde_json::to_vec(&())?;
        let () = redis::cmd("SET")
            .arg(&done)
            .arg(value)
            .arg("EX")
            .arg(86_400)
            .query_async(&mut conn)
            .await?;
    }
    let _: i64 = redis::cmd("EVAL")
        .arg(RELEASE)
        .arg(1)
        .arg(&lock)
        .arg(token.as_str())
        .query_async(&mut conn)
        .await?;
    Ok(())
}
