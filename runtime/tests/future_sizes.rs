//! How many bytes a task's future takes before it is polled, on every way of running a call.
//!
//! Sizes are deterministic for a given compiler and profile, so these are bounds, not exact
//! values: the body's future is stored once (on the heap), and the runner's own state is small.
//! `docs/performance.md` gives the measured table.

use std::mem::size_of_val;
use std::time::Duration;

use idempotask::store::{Begin, Fencing, LockToken, StoreError, TransactionScope, UnitOfWork};
use idempotask::{Error, MemoryStore, Task, idempotent_task};

/// What the runner may add to the body's own future.
const RUNNER: usize = 1024;

/// A body holding a 4 KiB buffer across an await, as one holding a request or a query would.
async fn holds_a_buffer(order_id: u64) -> Result<u64, Error> {
    let buffer = [order_id.to_le_bytes()[0]; 4096];
    tokio::task::yield_now().await;
    Ok(buffer.iter().map(|&byte| u64::from(byte)).sum())
}

#[idempotent_task(key = "buffer-{order_id}")]
async fn buffer_task(order_id: u64) -> Result<u64, Error> {
    let buffer = [order_id.to_le_bytes()[0]; 4096];
    tokio::task::yield_now().await;
    Ok(buffer.iter().map(|&byte| u64::from(byte)).sum())
}

#[idempotent_task(key = "trivial-{order_id}")]
async fn trivial_task(order_id: u64) -> Result<u64, Error> {
    Ok(order_id)
}

#[idempotent_task(key = "outer-{order_id}")]
async fn nested_task(order_id: u64) -> Result<u64, Error> {
    trivial_task(order_id).await
}

#[async_trait::async_trait]
trait Job {
    async fn run(&self, order_id: u64) -> Result<u64, Error>;
}

struct BufferJob;

#[async_trait::async_trait]
impl Job for BufferJob {
    #[idempotent_task(key = "job-{order_id}")]
    async fn run(&self, order_id: u64) -> Result<u64, Error> {
        let buffer = [order_id.to_le_bytes()[0]; 4096];
        tokio::task::yield_now().await;
        Ok(buffer.iter().map(|&byte| u64::from(byte)).sum())
    }
}

/// A transaction that commits nothing anywhere: only its future's size matters here.
struct NoDatabase(Vec<u8>);

impl TransactionScope for NoDatabase {
    type Handle = Vec<u8>;

    async fn begin(
        &mut self,
        _: &UnitOfWork,
        _: &LockToken,
        _: Duration,
        _: Fencing,
    ) -> Result<Begin, StoreError> {
        Ok(Begin::acquired(None))
    }

    fn handle(&mut self) -> &mut Vec<u8> {
        &mut self.0
    }

    async fn commit(
        self,
        _: &UnitOfWork,
        _: &LockToken,
        _: &[u8],
        _: Duration,
    ) -> Result<(), StoreError> {
        Ok(())
    }

    async fn abort(self) {}
}

static PLAIN: Task = Task::new("sizes_plain");

#[test]
fn sizes() {
    let body = size_of_val(&holds_a_buffer(1));
    let attribute = size_of_val(&buffer_task(1));
    let trivial = size_of_val(&trivial_task(1));
    let nested = size_of_val(&nested_task(1));
    let run = size_of_val(&PLAIN.call("k").run(holds_a_buffer(1)));
    let reported = size_of_val(&PLAIN.call("k").run_reported(holds_a_buffer(1)));
    let boxed_trait = size_of_val(&*BufferJob.run(1));
    let transactional = size_of_val(
        &PLAIN
            .call("k")
            .run_in_transaction(NoDatabase(Vec::new()), async |_: &mut Vec<u8>| {
                holds_a_buffer(1).await
            }),
    );
    let with_store = size_of_val(
        &PLAIN
            .call("k")
            .store(MemoryStore::new())
            .run(holds_a_buffer(1)),
    );
    // One `name=bytes` list, which scripts/bench.sh turns into a table.
    println!(
        "future sizes: body={body} attribute={attribute} trivial={trivial} nested={nested} run={run} run_reported={reported} async_trait={boxed_trait} transactional={transactional}"
    );
    for (what, size) in [
        ("the attribute", attribute),
        ("Task::run", run),
        ("run_reported", reported),
        ("the async-trait shape", boxed_trait),
        ("the transactional path", transactional),
        ("a call with its own store", with_store),
    ] {
        assert!(
            size <= body + RUNNER,
            "{what}: {size} bytes for a {body}-byte body"
        );
    }
    assert!(trivial <= 1024, "a trivial task takes {trivial} bytes");
    assert!(
        nested <= 2 * trivial + size_of_val(&async { Ok::<u64, Error>(1) }),
        "a task awaiting a task takes {nested} bytes, a trivial one {trivial}"
    );
}
