//! apalis workers that crash: each order is charged once all the same.
//!
//! A producer pushes orders onto an apalis queue (apalis-redis, or apalis-postgres); several
//! worker processes charge them at a payment gateway (a ledger on the same server). The gateway
//! rejects the first request for some orders, so those jobs fail once and apalis retries them.
//! The worker that finishes one particular order first dies right after the charge and before
//! the queue hears of it (its process gets SIGKILL, `kill -9`); once its heartbeat is overdue,
//! the queue puts the job back and another worker runs it again.
//!
//! With the handler wrapped in `idempotask_apalis::Idempotent`, that redelivery gets the stored
//! receipt and the order is charged once; with `--without-idempotask` it is charged twice. The
//! last line of output is one JSON summary; each delivery is shown on stderr as it happens.
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --example apalis_worker --features apalis -- redis
//! REDIS_URL=redis://127.0.0.1:6379 DATABASE_URL=postgres://postgres@127.0.0.1/postgres \
//!     cargo run --example apalis_worker --features apalis -- postgres [--without-idempotask]
//! ```
//! The idempotask store is the Redis at `REDIS_URL` in both cases.
//!
//! It needs:
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
//! serde_json = "1"
//! sqlx = { version = "0.9", default-features = false, features = ["postgres", "runtime-tokio"] }
//! tokio = { version = "1", features = ["macros", "rt-multi-thread", "process", "io-util", "io-std", "time"] }
//! ```

use std::collections::{BTreeMap, HashSet};
use std::pin::Pin;
use std::process::Stdio;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use apalis::prelude::{
    BoxDynError, Data, Layer, Service, Task, TaskSink, WorkerBuilder, WorkerBuilderExt, WorkerError,
};
use apalis_postgres::{PgPool, PostgresStorage};
use apalis_redis::{ConnectionManager, RedisStorage};
use idempotask_apalis::Idempotent;
use idempotask_redis::RedisStore;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::{Child, Command};

const ORDERS: u64 = 12;
const WORKERS: usize = 3;
/// The worker that completes this order first dies before the queue hears of it.
const CRASH_ORDER: u64 = 5;
/// The gateway rejects the first request for these orders.
fn flaky(order: u64) -> bool {
    order % 4 == 2
}

/// Heartbeats this often, and a worker that misses this many is presumed dead and its jobs are
/// put back: a 2 s orphan timeout instead of the backends' default 300 s, so the run takes
/// seconds.
const HEARTBEAT: Duration = Duration::from_millis(500);
const MISSED_HEARTBEATS: usize = 4;

/// The lock TTL stays well under the queue's orphan timeout: a job redelivered because its worker
/// died mid-charge then finds the lock expired instead of waiting for it.
static CHARGE: idempotask::Task =
    idempotask::Task::new("apalis_order_charge").lock_ttl(Duration::from_secs(1));

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Order {
    /// Each run uses its own orders, so runs against the same servers do not share results.
    run: u64,
    id: u64,
}

/// What the gateway answers a charge with; the charge id names one charge of one order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Receipt {
    order: u64,
    charge_id: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    Redis,
    Postgres,
}

/// What happens once per order and run: a rejected request, a crash.
#[derive(Debug, Clone, Copy)]
enum Happening {
    Rejection,
    Crash,
}

/// The payment gateway: a ledger of charges per order on the queue's own server.
#[derive(Clone)]
enum Gateway {
    Redis(ConnectionManager),
    Postgres(PgPool),
}

impl Gateway {
    async fn connect(backend: Backend) -> Result<Self, BoxDynError> {
        Ok(match backend {
            Backend::Redis => Self::Redis(apalis_redis::connect(env("REDIS_URL")?).await?),
            Backend::Postgres => Self::Postgres(PgPool::connect(&env("DATABASE_URL")?).await?),
        })
    }

    /// Creates the ledger's tables, once, before any worker starts.
    async fn prepare(&self) -> Result<(), BoxDynError> {
        if let Self::Postgres(pool) = self {
            for table in [
                "CREATE TABLE IF NOT EXISTS gateway_charges (run BIGINT, order_id BIGINT, charges INT NOT NULL, PRIMARY KEY (run, order_id))",
                "CREATE TABLE IF NOT EXISTS gateway_happenings (run BIGINT, what TEXT, order_id BIGINT, PRIMARY KEY (run, what, order_id))",
            ] {
                sqlx::query(table).execute(pool).await?;
            }
        }
        Ok(())
    }

    /// Charges the order, or fails before charging when the gateway rejects this request.
    async fn charge(&self, order: &Order) -> Result<Receipt, BoxDynError> {
        if flaky(order.id) && self.first_time(Happening::Rejection, order).await? {
            return Err("the gateway is unavailable; try again".into());
        }
        let charges: i64 = match self {
            Self::Redis(conn) => {
                redis::cmd("HINCRBY")
                    .arg(format!("gateway:{}:charges", order.run))
                    .arg(order.id)
                    .arg(1)
                    .query_async(&mut conn.clone())
                    .await?
            }
            Self::Postgres(pool) => sqlx::query_scalar::<_, i32>(
                "INSERT INTO gateway_charges VALUES ($1, $2, 1) ON CONFLICT (run, order_id) \
                     DO UPDATE SET charges = gateway_charges.charges + 1 RETURNING charges",
            )
            .bind(i64::try_from(order.run)?)
            .bind(i64::try_from(order.id)?)
            .fetch_one(pool)
            .await?
            .into(),
        };
        Ok(Receipt {
            order: order.id,
            charge_id: format!("ch_{}_{charges}", order.id),
        })
    }

    /// Whether this is the first time `happening` happens to `order` in this run, across
    /// processes.
    async fn first_time(&self, happening: Happening, order: &Order) -> Result<bool, BoxDynError> {
        let what = match happening {
            Happening::Rejection => "rejection",
            Happening::Crash => "crash",
        };
        Ok(match self {
            Self::Redis(conn) => {
                let set: Option<String> = redis::cmd("SET")
                    .arg(format!("gateway:{}:{what}:{}", order.run, order.id))
                    .arg(1)
                    .arg("NX")
                    .query_async(&mut conn.clone())
                    .await?;
                set.is_some()
            }
            Self::Postgres(pool) => {
                sqlx::query(
                    "INSERT INTO gateway_happenings VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
                )
                .bind(i64::try_from(order.run)?)
                .bind(what)
                .bind(i64::try_from(order.id)?)
                .execute(pool)
                .await?
                .rows_affected()
                    == 1
            }
        })
    }

    /// Charges per order in `run`.
    async fn ledger(&self, run: u64) -> Result<BTreeMap<u64, u64>, BoxDynError> {
        Ok(match self {
            Self::Redis(conn) => {
                redis::cmd("HGETALL")
                    .arg(format!("gateway:{run}:charges"))
                    .query_async(&mut conn.clone())
                    .await?
            }
            Self::Postgres(pool) => {
                let rows: Vec<(i64, i32)> =
                    sqlx::query_as("SELECT order_id, charges FROM gateway_charges WHERE run = $1")
                        .bind(i64::try_from(run)?)
                        .fetch_all(pool)
                        .await?;
                rows.into_iter()
                    .map(|(order, charges)| Ok((u64::try_from(order)?, u64::try_from(charges)?)))
                    .collect::<Result<_, BoxDynError>>()?
            }
        })
    }

    /// Jobs of `queue` that the queue has recorded as done.
    async fn acked(&self, queue: &str) -> Result<u64, BoxDynError> {
        Ok(match self {
            Self::Redis(conn) => {
                redis::cmd("SCARD")
                    .arg(format!("{queue}:done"))
                    .query_async(&mut conn.clone())
                    .await?
            }
            Self::Postgres(pool) => u64::try_from(
                sqlx::query_scalar::<_, i64>(
                    "SELECT count(*) FROM apalis.jobs WHERE job_type = $1 AND status = 'Done'",
                )
                .bind(queue)
                .fetch_one(pool)
                .await?,
            )?,
        })
    }
}

/// The job handler: charge the order at the gateway.
async fn charge(order: Order, gateway: Data<Gateway>) -> Result<Receipt, BoxDynError> {
    gateway.charge(&order).await
}

/// Sits between the queue's ack and the handler: reports each delivery to the parent process as
/// one JSON line, and plays the crash. The worker that completes [`CRASH_ORDER`] first reports
/// that it is dying and never returns the result, so the queue never acks the job; the parent
/// kills the process. Workers run one job at a time, so the dying worker is in the middle of no
/// other charge: a crash between a charge and the recording of its result is the lock TTL's and
/// the fencing token's business, not this example's.
#[derive(Clone)]
struct Report<S> {
    inner: S,
    gateway: Gateway,
}

#[derive(Clone)]
struct ReportLayer(Gateway);

impl<S> Layer<S> for ReportLayer {
    type Service = Report<S>;

    fn layer(&self, inner: S) -> Report<S> {
        Report {
            inner,
            gateway: self.0.clone(),
        }
    }
}

impl<S> Service<Task<Order>> for Report<S>
where
    S: Service<Task<Order>, Response = Receipt>,
    S::Error: Into<BoxDynError>,
    S::Future: Send + 'static,
{
    type Response = Receipt;
    type Error = BoxDynError;
    type Future = Pin<Box<dyn Future<Output = Result<Receipt, BoxDynError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxDynError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, job: Task<Order>) -> Self::Future {
        let order = job.args.clone();
        let gateway = self.gateway.clone();
        let outcome = self.inner.call(job);
        Box::pin(async move {
            let result = outcome.await.map_err(Into::into);
            let dying = result.is_ok()
                && order.id == CRASH_ORDER
                && gateway.first_time(Happening::Crash, &order).await?;
            let line = match &result {
                Ok(receipt) => {
                    json!({"order": order.id, "charge_id": receipt.charge_id, "dying": dying})
                }
                Err(err) => json!({"order": order.id, "error": err.to_string()}),
            };
            println!("{line}");
            if dying {
                std::future::pending::<()>().await;
            }
            result
        })
    }
}

fn env(name: &str) -> Result<String, BoxDynError> {
    std::env::var(name).map_err(|_| format!("set {name}: this example needs a real server").into())
}

fn queue_name(run: u64) -> String {
    format!("apalis-orders-{run}")
}

/// Until the parent closes our stdin.
async fn parent_gone() -> Result<(), WorkerError> {
    let mut sink = Vec::new();
    tokio::io::stdin().read_to_end(&mut sink).await?;
    Ok(())
}

/// One worker process: charges orders from the queue until the parent closes its stdin.
async fn worker(
    backend: Backend,
    run: u64,
    index: usize,
    idempotask: bool,
) -> Result<(), BoxDynError> {
    idempotask::install(RedisStore::connect(&env("REDIS_URL")?).await?);
    let gateway = Gateway::connect(backend).await?;
    let name = format!("charger-{index}");
    let queue = queue_name(run);
    let charge_once = Idempotent::new(CHARGE.clone(), |order: &Order| {
        format!("order-charge-{}-{}", order.run, order.id)
    });
    // The wrapped handler goes to `build`: the innermost service, under every layer of the worker.
    match backend {
        Backend::Redis => {
            let config = apalis_redis::Config::default()
                .queue(&queue)
                .heartbeat_interval(HEARTBEAT)
                .missed_heartbeats(MISSED_HEARTBEATS)
                .batch_size(2);
            let storage =
                RedisStorage::<Order>::new(apalis_redis::connect(env("REDIS_URL")?).await?)
                    .with_config(config);
            let builder = WorkerBuilder::new(name)
                .backend(storage)
                .data(gateway.clone())
                // One job at a time: see `Report`.
                .concurrency(1)
                .layer(ReportLayer(gateway));
            if idempotask {
                builder
                    .build(charge_once.handler(charge))
                    .run_until(parent_gone())
                    .await?;
            } else {
                builder.build(charge).run_until(parent_gone()).await?;
            }
        }
        Backend::Postgres => {
            let config = apalis_postgres::Config::default()
                .queue(&queue)
                .heartbeat_interval(HEARTBEAT)
                .missed_heartbeats(MISSED_HEARTBEATS)
                .batch_size(2);
            let pool = PgPool::connect(&env("DATABASE_URL")?).await?;
            let storage = PostgresStorage::<Order>::new(&pool).with_config(config);
            let builder = WorkerBuilder::new(name)
                .backend(storage)
                .data(gateway.clone())
                // One job at a time: see `Report`.
                .concurrency(1)
                .layer(ReportLayer(gateway));
            if idempotask {
                builder
                    .build(charge_once.handler(charge))
                    .run_until(parent_gone())
                    .await?;
            } else {
                builder.build(charge).run_until(parent_gone()).await?;
            }
        }
    }
    Ok(())
}

/// Pushes the orders of `run`.
async fn push_orders(backend: Backend, run: u64) -> Result<(), BoxDynError> {
    let queue = queue_name(run);
    let orders = (1..=ORDERS).map(|id| Order { run, id });
    match backend {
        Backend::Redis => {
            let config = apalis_redis::Config::default().queue(&queue);
            let mut storage =
                RedisStorage::<Order>::new(apalis_redis::connect(env("REDIS_URL")?).await?)
                    .with_config(config);
            for order in orders {
                storage.push(order).await?;
            }
        }
        Backend::Postgres => {
            let pool = PgPool::connect(&env("DATABASE_URL")?).await?;
            PostgresStorage::setup(&pool).await?;
            let config = apalis_postgres::Config::default().queue(&queue);
            let mut storage = PostgresStorage::<Order>::new(&pool).with_config(config);
            for order in orders {
                storage.push(order).await?;
            }
        }
    }
    Ok(())
}

/// One line a worker printed about one delivery.
#[derive(Debug, Deserialize)]
struct Delivery {
    order: u64,
    charge_id: Option<String>,
    #[serde(default)]
    dying: bool,
}

/// Starts the workers, kills the one that dies, and waits until every order was answered by a
/// worker that lives to ack it.
async fn run_workers(
    backend: Backend,
    run: u64,
    idempotask: bool,
) -> Result<(Vec<Delivery>, usize), BoxDynError> {
    let (lines_tx, mut lines) = tokio::sync::mpsc::unbounded_channel();
    let mut children: Vec<Child> = Vec::new();
    for index in 0..WORKERS {
        let mut command = Command::new(std::env::current_exe()?);
        command
            .arg(match backend {
                Backend::Redis => "redis",
                Backend::Postgres => "postgres",
            })
            .args(["--worker", &index.to_string(), "--run", &run.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true);
        if !idempotask {
            command.arg("--without-idempotask");
        }
        let mut child = command.spawn()?;
        let mut stdout = BufReader::new(child.stdout.take().ok_or("no stdout")?).lines();
        let lines_tx = lines_tx.clone();
        tokio::spawn(async move {
            while let Ok(Some(line)) = stdout.next_line().await {
                if lines_tx.send((index, line)).is_err() {
                    break;
                }
            }
        });
        children.push(child);
    }
    drop(lines_tx);

    let mut deliveries = Vec::new();
    let mut killed = HashSet::new();
    let mut answered = HashSet::new();
    while answered.len() < usize::try_from(ORDERS)? {
        let (index, line) = lines.recv().await.ok_or("every worker exited")?;
        eprintln!("worker {index}: {line}");
        let delivery: Delivery = serde_json::from_str(&line)?;
        if delivery.dying {
            // SIGKILL, as `kill -9`: no destructor, no ack, no goodbye to the queue.
            children[index].start_kill()?;
            children[index].wait().await?;
            killed.insert(index);
        } else if delivery.charge_id.is_some() {
            answered.insert(delivery.order);
        }
        deliveries.push(delivery);
    }
    // Closing their stdin stops the others gracefully: they ack what they ran and leave.
    for child in &mut children {
        drop(child.stdin.take());
    }
    for (index, child) in children.iter_mut().enumerate() {
        let status = child.wait().await?;
        if !status.success() && !killed.contains(&index) {
            return Err(format!("worker {index} failed: {status}").into());
        }
    }
    // Lines printed while the workers shut down.
    while let Some((index, line)) = lines.recv().await {
        eprintln!("worker {index}: {line}");
        deliveries.push(serde_json::from_str(&line)?);
    }
    Ok((deliveries, killed.len()))
}

#[tokio::main]
async fn main() -> Result<(), BoxDynError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let backend = match args.first().map(String::as_str) {
        Some("redis") => Backend::Redis,
        Some("postgres") => Backend::Postgres,
        _ => return Err("usage: apalis_worker redis|postgres [--without-idempotask]".into()),
    };
    let idempotask = !args.iter().any(|arg| arg == "--without-idempotask");
    let value = |flag: &str| -> Option<u64> {
        let at = args.iter().position(|arg| arg == flag)?;
        args.get(at + 1)?.parse().ok()
    };
    if let (Some(index), Some(run)) = (value("--worker"), value("--run")) {
        return worker(backend, run, usize::try_from(index)?, idempotask).await;
    }

    let started = Instant::now();
    let run = u64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_micros(),
    )?;
    let gateway = Gateway::connect(backend).await?;
    gateway.prepare().await?;
    push_orders(backend, run).await?;
    let (deliveries, killed) = tokio::time::timeout(
        Duration::from_secs(60),
        run_workers(backend, run, idempotask),
    )
    .await
    .map_err(|_| "the workers did not charge every order within 60 s")??;

    let ledger = gateway.ledger(run).await?;
    let side_effects: u64 = ledger.values().sum();
    let charged_twice = ledger.values().filter(|charges| **charges > 1).count();
    let answers: Vec<&String> = deliveries
        .iter()
        .filter_map(|d| d.charge_id.as_ref())
        .collect();
    let distinct: HashSet<&String> = answers.iter().copied().collect();
    // A delivery that got a receipt another delivery already got was answered from the store.
    let duplicates_prevented = answers.len() - distinct.len();
    let summary = json!({
        "backend": match backend { Backend::Redis => "apalis-redis", Backend::Postgres => "apalis-postgres" },
        "idempotask": idempotask,
        "jobs": ORDERS,
        "deliveries": deliveries.len(),
        "failed_deliveries": deliveries.len() - answers.len(),
        "killed_workers": killed,
        "side_effects": side_effects,
        "duplicates_prevented": duplicates_prevented,
        "charged_twice": charged_twice,
        "acked": gateway.acked(&queue_name(run)).await?,
        "elapsed_ms": started.elapsed().as_millis(),
    });
    println!("{summary}");
    if idempotask && (side_effects != ORDERS || charged_twice != 0) {
        return Err(format!("{side_effects} charges for {ORDERS} orders").into());
    }
    Ok(())
}
