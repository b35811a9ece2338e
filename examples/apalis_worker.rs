//! An apalis worker that charges each order once, however often the queue runs its job.
//!
//! It charges the orders (`{"id": 5}`) of the apalis queue `orders` (or `$QUEUE`), on Redis or
//! on PostgreSQL (`DATABASE_URL`), at a stand-in gateway that counts charges in Redis and fails
//! the first request for every fourth order. The handler runs in `idempotask_apalis::Idempotent`
//! (store: Redis): a job put back because its worker died before the ack gets the stored
//! receipt. It prints `order 5: charged ch_5_1`, `… replayed ch_5_1` or `… failed: …`; Ctrl-C
//! stops it.
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:6379 [DATABASE_URL=postgres://postgres@127.0.0.1/postgres] \
//!     cargo run --example apalis_worker --features apalis
//! ```
//! `tests/example_queues.rs` pushes the orders and kills one of three workers with SIGKILL
//! between a charge and its ack (`CRASH_BEFORE_ACK=5` waits there); `WITHOUT_IDEMPOTASK=1`, the
//! bare handler, charges the orders of that worker twice.
//!
//! ```toml
//! [dependencies]
//! idempotask = "0.1"
//! idempotask-apalis = "0.1"
//! idempotask-redis = "0.1"
//! apalis = { version = "1.0.0", default-features = false, features = ["limit"] }
//! apalis-postgres = "1.0.0"
//! apalis-redis = "1.0.0"
//! redis = { version = "1", default-features = false, features = ["tokio-comp", "connection-manager"] }
//! serde = { version = "1", features = ["derive"] }
//! tokio = { version = "1", features = ["macros", "rt-multi-thread", "signal"] }
//! ```

use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::{pin::Pin, task::Context, task::Poll, time::Duration};

use apalis::prelude::{BoxDynError, Data, Service, Task, WorkerBuilder, WorkerBuilderExt, task_fn};
use apalis_postgres::{PgPool, PostgresStorage};
use apalis_redis::{ConnectionManager, RedisStorage};
use idempotask_apalis::Idempotent;
use redis::AsyncCommands;

/// Heartbeats this often, and a worker that misses four is presumed dead and its jobs are put
/// back: 2 s instead of the backends' default 300 s, so a killed worker's job returns at once.
const HEARTBEAT: Duration = Duration::from_millis(500);
/// The lock TTL stays under that orphan timeout: the job put back finds the lock expired.
static CHARGE: idempotask::Task =
    idempotask::Task::new("apalis_order_charge").lock_ttl(Duration::from_secs(1));
/// Whether the job at hand ran the charge or got the stored receipt (one job at a time).
static CHARGED: AtomicBool = AtomicBool::new(false);

#[derive(serde::Serialize, serde::Deserialize)]
struct Order {
    id: u64,
}

/// The gateway: charges per order in the hash `ledger`; the charge id (the receipt) counts them.
#[derive(Clone)]
struct Gateway(ConnectionManager, String);

async fn charge(order: Order, gateway: Data<Gateway>) -> Result<String, BoxDynError> {
    let Gateway(mut redis, ledger) = (*gateway).clone();
    let attempts = format!("{ledger}:requests");
    let requests: u64 = redis.hincr(attempts, order.id, 1).await?;
    if order.id % 4 == 2 && requests == 1 {
        return Err("the gateway is unavailable; try again".into());
    }
    let charges: u64 = redis.hincr(ledger, order.id, 1).await?;
    CHARGED.store(true, SeqCst);
    Ok(format!("ch_{}_{charges}", order.id))
}

/// Prints a line per job. Around the handler, it sees the receipt once idempotask stored it, and
/// the queue acks the job only after it.
struct Report<S>(S);

impl<S> Service<Task<Order>> for Report<S>
where
    S: Service<Task<Order>, Response = String, Error = BoxDynError, Future: Send + 'static>,
{
    type Response = String;
    type Error = BoxDynError;
    type Future = Pin<Box<dyn Future<Output = Result<String, BoxDynError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxDynError>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, job: Task<Order>) -> Self::Future {
        let (order, answer) = (job.args.id, self.0.call(job));
        let crash = std::env::var("CRASH_BEFORE_ACK").map(|order| format!("ch_{order}_1"));
        Box::pin(async move {
            let answer = answer.await;
            match (&answer, CHARGED.swap(false, SeqCst)) {
                // With `CRASH_BEFORE_ACK=<order>`, the first charge of that order waits, unacked,
                // for the SIGKILL of the test that asked for it.
                (Ok(id), true) if crash.as_ref() == Ok(id) => {
                    println!("order {order}: charged {id}, crashing before the ack");
                    std::future::pending::<()>().await;
                }
                (Ok(id), true) => println!("order {order}: charged {id}"),
                (Ok(id), false) => println!("order {order}: replayed {id}"),
                (Err(err), _) => println!("order {order}: failed: {err}"),
            }
            answer
        })
    }
}

#[tokio::main]
async fn main() -> Result<(), BoxDynError> {
    let redis_url = std::env::var("REDIS_URL").map_err(|_| "set REDIS_URL")?;
    let queue = std::env::var("QUEUE").unwrap_or_else(|_| "orders".to_owned());
    idempotask::install(idempotask_redis::RedisStore::connect(&redis_url).await?);
    let redis = apalis_redis::connect(redis_url).await?;
    let gateway = Gateway(redis, format!("ledger:{queue}"));
    let charge_once = Idempotent::new(CHARGE.clone(), |order: &Order| {
        format!("order-charge-{}", order.id)
    });
    // The wrapped handler goes to `build`, under every layer of the worker.
    if std::env::var_os("WITHOUT_IDEMPOTASK").is_some() {
        work(Report(task_fn(charge)), &queue, gateway).await
    } else {
        work(Report(charge_once.handler(charge)), &queue, gateway).await
    }
}

/// Runs `handler` on `queue` until Ctrl-C, one job at a time: a worker that dies is in the
/// middle of no other charge. Each process is a worker of its own name, which is how apalis
/// tells a dead worker from the living.
async fn work<S>(handler: Report<S>, queue: &str, gateway: Gateway) -> Result<(), BoxDynError>
where
    S: Service<Task<Order>, Response = String, Error = BoxDynError, Future: Send + 'static>,
    S: Send + 'static,
{
    let worker = WorkerBuilder::new(format!("charger-{}", std::process::id()));
    let stop = tokio::signal::ctrl_c();
    println!("waiting for orders on {queue}");
    if let Ok(url) = std::env::var("DATABASE_URL") {
        let pool = PgPool::connect(&url).await?;
        PostgresStorage::setup(&pool).await?;
        let config = apalis_postgres::Config::default().queue(queue);
        let config = config.heartbeat_interval(HEARTBEAT).missed_heartbeats(4);
        let worker = worker.backend(PostgresStorage::new(&pool).with_config(config));
        let worker = worker.data(gateway).concurrency(1);
        worker.build(handler).run_until(stop).await?;
    } else {
        let config = apalis_redis::Config::default().queue(queue);
        let config = config.heartbeat_interval(HEARTBEAT).missed_heartbeats(4);
        let worker = worker.backend(RedisStorage::new(gateway.0.clone()).with_config(config));
        let worker = worker.data(gateway).concurrency(1);
        worker.build(handler).run_until(stop).await?;
    }
    Ok(())
}
