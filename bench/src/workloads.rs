//! The work being measured: an annotated task, and the hand-written pattern it replaces.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use idempotask::store::{LockToken, SharedStore};
use idempotask::{Error, idempotent_task};

use super::BenchError;
use super::target::Connection;

tokio::task_local! {
    /// The run whose workers these are.
    static RUN: RunScope;
}

/// What one benchmark run keeps to itself: its store and its count of bodies run.
///
/// Two runs in one process (the smoke tests run in parallel) would otherwise replace each
/// other's installed store and count each other's executions.
#[derive(Clone)]
pub(crate) struct RunScope {
    store: SharedStore,
    executions: Arc<AtomicU64>,
}

impl RunScope {
    pub(crate) fn new(store: SharedStore) -> Self {
        Self {
            store,
            executions: Arc::new(AtomicU64::new(0)),
        }
    }

    /// `future` with this run's store as the one its task calls use, and its bodies counted
    /// here.
    pub(crate) async fn enter<F: Future>(self, future: F) -> F::Output {
        let store = self.store.clone();
        RUN.scope(self, idempotask::with_store(store, future)).await
    }

    /// The scope of the running future, to carry into the tasks it spawns.
    pub(crate) fn current() -> Option<Self> {
        RUN.try_with(Clone::clone).ok()
    }

    /// The run's store.
    pub(crate) fn store(&self) -> SharedStore {
        self.store.clone()
    }

    /// Bodies run so far in this run.
    pub(crate) fn executions(&self) -> u64 {
        self.executions.load(Ordering::Relaxed)
    }
}

/// Counts one body run in the current run's scope.
fn executed() {
    // Outside a run (never, in the bench itself) there is nothing to count into.
    let _ = RUN.try_with(|run| run.executions.fetch_add(1, Ordering::Relaxed));
}

/// The task every idempotask mode runs: the macro path as users write it, on the run's store,
/// with a `()` result (so the marker is the smallest there is).
#[idempotent_task(key = "{run}-{id}")]
pub(crate) async fn bench_task(run: u64, id: u64) -> Result<(), Error> {
    executed();
    Ok(())
}

/// `bench_task` with a fencing token for every execution.
#[idempotent_task(key = "{run}-{id}", fencing = true)]
pub(crate) async fn bench_task_fenced(run: u64, id: u64) -> Result<(), Error> {
    executed();
    Ok(())
}

/// A unit of three steps, as users write one: each effect recorded in the unit's journal
/// (`read_journal` at the first step, one `record_step` each), then the unit's marker. Each
/// effect, whose value is the key's `id` (a step's value is what a rerun gets back), is
/// counted as a body run.
#[idempotent_task(key = "{run}-{id}")]
pub(crate) async fn bench_steps(run: u64, id: u64) -> Result<(), Error> {
    let ctx = idempotask::context().ok_or(Error::NotConfigured)?;
    ctx.step("reserve", async {
        executed();
        Ok::<_, Error>(id)
    })
    .await?;
    ctx.step("charge", async {
        executed();
        Ok::<_, Error>(id)
    })
    .await?;
    ctx.step("receipt", async {
        executed();
        Ok::<_, Error>(id)
    })
    .await?;
    Ok(())
}

/// The task name `bench_task` stores under.
pub(crate) const BENCH_TASK: &str = "bench_task";

/// The names of the three steps, in both the idempotask unit and its hand-written equivalent.
const STEPS: [&str; 3] = ["reserve", "charge", "receipt"];

/// The compare-and-delete that the pattern's blog posts release their lock with.
const RELEASE: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

/// The pattern users write by hand, four commands for a fresh key: `SET lock NX EX`, `GET` the
/// stored result, run and `SET result EX`, `EVAL` the release. A duplicate skips the `SET` of
/// the result, so it costs three.
pub(crate) async fn handwritten(conn: Connection, run: u64, id: u64) -> Result<(), BenchError> {
    locked(conn, run, id, async |_| {
        executed();
        Ok(())
    })
    .await
}

/// The three-step unit written by hand, as a careful user would: the lock and the result of
/// [`handwritten`] around it, and a marker per step, `GET` before its effect and `SET` after
/// it, so that a rerun skips the steps that finished (and gets the step's value, the key's
/// `id`, back). Ten commands for a fresh key.
pub(crate) async fn handwritten_steps(
    conn: Connection,
    run: u64,
    id: u64,
) -> Result<(), BenchError> {
    locked(conn, run, id, async |conn| {
        for step in STEPS {
            let marker = format!("handwritten:{run}-{id}:step:{step}");
            let stored: Option<Vec<u8>> = redis::cmd("GET").arg(&marker).query_async(conn).await?;
            if let Some(bytes) = stored {
                serde_json::from_slice::<u64>(&bytes)?;
                continue;
            }
            executed();
            let value = serde_json::to_vec(&id)?;
            let () = redis::cmd("SET")
                .arg(&marker)
                .arg(value)
                .arg("EX")
                .arg(86_400)
                .query_async(conn)
                .await?;
        }
        Ok(())
    })
    .await
}

/// Input: a key and the work. Output: the work run under `SET lock NX EX`
/// unless the key's stored result says it ran, the result stored after it, and the lock
/// released with a compare-and-delete.
async fn locked(
    mut conn: Connection,
    run: u64,
    id: u64,
    work: impl AsyncFnOnce(&mut Connection) -> Result<(), BenchError>,
) -> Result<(), BenchError> {
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
        work(&mut conn).await?;
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
