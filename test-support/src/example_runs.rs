//! The crash demonstration of the queue examples (`apalis_worker`, `nats_worker`,
//! `rabbitmq_worker`, `stream_worker`), run as a user would run the examples: several copies of one example
//! binary consume one queue, the copy that charges the crash order first is killed with SIGKILL
//! between the charge and its ack, and the others are stopped with Ctrl-C (SIGINT) once every
//! order has an answer. What each order cost is read from the gateway's ledger in Redis, which
//! the kill cannot take back, never from a dead worker's output.
//!
//! Each example prints one line per delivery, which is how the run follows it:
//!
//! ```text
//! waiting for orders on orders
//! order 5: charged ch_5_1, crashing before the ack   (only with CRASH_BEFORE_ACK=5)
//! order 5: charged ch_5_1                          (`stream_worker`: `shipped parcel_5_1`)
//! order 5: replayed ch_5_1
//! order 2: failed: the gateway is unavailable; try again
//! ```

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

/// The example `name`, built beside the running test binary, with no server URL inherited from
/// the environment: the test sets the ones it started.
pub fn example(name: &str) -> std::process::Command {
    // target/<profile>/deps/<test>-<hash> → target/<profile>/examples/<name>
    let exe = std::env::current_exe().expect("the test binary's path");
    let path = exe
        .parent()
        .and_then(std::path::Path::parent)
        .expect("the test binary is in target/<profile>/deps")
        .join("examples")
        .join(name);
    assert!(
        path.exists(),
        "{} is not built: run through `cargo test --workspace`, which builds the examples package with the features this package asks for",
        path.display()
    );
    let mut command = std::process::Command::new(path);
    for variable in [
        "REDIS_URL",
        "REDIS_CLUSTER_URLS",
        "DATABASE_URL",
        "NATS_URL",
        "AMQP_URL",
    ] {
        command.env_remove(variable);
    }
    for variable in ["QUEUE", "CRASH_BEFORE_ACK", "WITHOUT_IDEMPOTASK"] {
        command.env_remove(variable);
    }
    command
}

/// How many orders each run publishes, with ids `1..=ORDERS`.
pub const ORDERS: u64 = 12;
/// How many copies of the example consume the queue.
pub const WORKERS: usize = 3;
/// The order whose first charge the worker waits after, unacked, to be killed.
pub const CRASH_ORDER: u64 = 5;

/// What one delivery came to, as a worker printed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// The charge ran: `order 5: charged ch_5_1` (or `shipped parcel_5_1`).
    Charged(String),
    /// The stored receipt was handed back: `order 5: replayed ch_5_1`.
    Replayed(String),
    /// The worker charged the crash order and waits to be killed before its ack.
    Crashing(String),
    /// The delivery failed and goes back to the queue: `order 2: failed: …`.
    Failed(String),
}

/// One line a worker printed about one delivery.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// Which worker printed it, by spawn order.
    pub worker: usize,
    /// The order's id.
    pub order: u64,
    /// What became of it.
    pub answer: Answer,
}

impl Delivery {
    fn parse(worker: usize, line: &str) -> Option<Self> {
        let (order, rest) = line.strip_prefix("order ")?.split_once(": ")?;
        let answer = if let Some(failed) = rest.strip_prefix("failed: ") {
            Answer::Failed(failed.to_owned())
        } else if let Some(replayed) = rest.strip_prefix("replayed ") {
            Answer::Replayed(replayed.to_owned())
        } else {
            let charged = rest
                .strip_prefix("charged ")
                .or_else(|| rest.strip_prefix("shipped "))?;
            match charged.strip_suffix(", crashing before the ack") {
                Some(id) => Answer::Crashing(id.to_owned()),
                None => Answer::Charged(charged.to_owned()),
            }
        };
        Some(Self {
            worker,
            order: order.parse().ok()?,
            answer,
        })
    }

    /// The charge id this delivery was answered with, when a living worker answered it.
    pub fn receipt(&self) -> Option<&str> {
        match &self.answer {
            Answer::Charged(id) | Answer::Replayed(id) => Some(id),
            Answer::Crashing(_) | Answer::Failed(_) => None,
        }
    }
}

/// Everything the workers of one run printed, and how many were killed.
#[derive(Debug)]
pub struct QueueRun {
    /// Every delivery line, in the order they were read.
    pub deliveries: Vec<Delivery>,
    /// How many workers were killed with SIGKILL.
    pub killed: usize,
}

impl QueueRun {
    /// Deliveries that failed and went back to the queue.
    pub fn failed(&self) -> usize {
        self.deliveries
            .iter()
            .filter(|d| matches!(d.answer, Answer::Failed(_)))
            .count()
    }

    /// Deliveries answered with the stored receipt instead of a charge: the redeliveries
    /// idempotask answered from the store.
    pub fn duplicates_prevented(&self) -> usize {
        self.deliveries
            .iter()
            .filter(|d| matches!(d.answer, Answer::Replayed(_)))
            .count()
    }

    /// With idempotask: one worker killed between a charge and its ack, deliveries that failed
    /// and came back, and yet the `ledger` (charges per order) holds one charge for each order,
    /// the killed worker's redelivered order answered from the store.
    pub fn assert_charged_once(&self, ledger: &BTreeMap<u64, u64>) {
        assert_eq!(self.killed, 1, "{self:#?}");
        assert!(self.failed() > 0, "{self:#?}");
        assert!(self.deliveries.len() as u64 > ORDERS, "{self:#?}");
        let once: BTreeMap<u64, u64> = (1..=ORDERS).map(|order| (order, 1)).collect();
        // The ledger, not the lines: what the kill cannot take away.
        assert_eq!(*ledger, once, "{self:#?}");
        assert!(self.duplicates_prevented() >= 1, "{self:#?}");
    }

    /// Without idempotask: the same kill, and the redelivery charges the crash order again.
    pub fn assert_charged_twice(&self, ledger: &BTreeMap<u64, u64>) {
        assert_eq!(self.killed, 1, "{self:#?}");
        assert!(ledger.values().any(|&charges| charges > 1), "{ledger:?}");
        assert!(ledger[&CRASH_ORDER] >= 2, "{ledger:?}");
        assert!(ledger.values().sum::<u64>() > ORDERS, "{ledger:?}");
        assert_eq!(self.duplicates_prevented(), 0, "{self:#?}");
    }
}

/// The gateway's ledger of the queue `queue`, as the queue examples keep it in Redis: the hash
/// `ledger:<queue>`, charges per order.
pub async fn ledger(
    redis: &mut redis::aio::MultiplexedConnection,
    queue: &str,
) -> BTreeMap<u64, u64> {
    redis::cmd("HGETALL")
        .arg(format!("ledger:{queue}"))
        .query_async(redis)
        .await
        .expect("read the ledger")
}

/// Runs [`WORKERS`] copies of an example (`worker()` makes each command, with its servers in the
/// environment) on `queue` with `CRASH_BEFORE_ACK` set to [`CRASH_ORDER`]; once each is
/// waiting for orders, awaits `publish`, which publishes orders `1..=ORDERS`; kills with
/// SIGKILL the worker that says it is crashing; and once every order was answered by a living
/// worker, stops the others with SIGINT, which lets each finish the ack at hand. Panics when a
/// worker fails or the run takes more than `timeout`.
pub async fn run_workers(
    mut worker: impl FnMut() -> std::process::Command,
    queue: &str,
    publish: impl Future<Output = ()>,
    timeout: Duration,
) -> QueueRun {
    let (lines_tx, mut lines) = mpsc::unbounded_channel();
    let mut children: Vec<Child> = (0..WORKERS)
        .map(|index| {
            let mut command = Command::from(worker());
            command
                .env("QUEUE", queue)
                .env("CRASH_BEFORE_ACK", CRASH_ORDER.to_string())
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .kill_on_drop(true);
            let mut child = command.spawn().expect("start the example");
            let stdout = child.stdout.take().expect("a piped stdout");
            let lines_tx = lines_tx.clone();
            tokio::spawn(async move {
                let mut stdout = BufReader::new(stdout).lines();
                while let Ok(Some(line)) = stdout.next_line().await {
                    if lines_tx.send((index, line)).is_err() {
                        break;
                    }
                }
            });
            child
        })
        .collect();
    drop(lines_tx);
    let run = tokio::time::timeout(timeout, async {
        let mut run = QueueRun {
            deliveries: Vec::new(),
            killed: 0,
        };
        let mut killed = HashSet::new();
        let mut waiting = 0;
        while waiting < WORKERS {
            let (index, line) = lines
                .recv()
                .await
                .expect("a worker exited before it was ready");
            println!("worker {index}: {line}");
            assert!(
                line.starts_with("waiting for orders on "),
                "worker {index}: {line}"
            );
            waiting += 1;
        }
        publish.await;
        let mut answered = BTreeSet::new();
        while (answered.len() as u64) < ORDERS {
            let (index, line) = lines
                .recv()
                .await
                .unwrap_or_else(|| panic!("every worker exited: {run:#?}"));
            println!("worker {index}: {line}");
            let delivery =
                Delivery::parse(index, &line).unwrap_or_else(|| panic!("worker {index}: {line}"));
            if let Answer::Crashing(_) = delivery.answer {
                // SIGKILL, as `kill -9`: no destructor, no ack, no goodbye to the queue.
                children[index]
                    .kill()
                    .await
                    .expect("kill the crashing worker");
                killed.insert(index);
                run.killed = killed.len();
            } else if delivery.receipt().is_some() {
                answered.insert(delivery.order);
            }
            run.deliveries.push(delivery);
        }
        for child in &mut children {
            if let Some(pid) = child.id() {
                let status = std::process::Command::new("kill")
                    .args(["-INT", &pid.to_string()])
                    .status()
                    .expect("run kill");
                assert!(status.success(), "kill -INT {pid}: {status}");
            }
        }
        for (index, child) in children.iter_mut().enumerate() {
            let status = child.wait().await.expect("wait for a worker");
            // The killed worker's status is SIGKILL's; the others stop cleanly on SIGINT.
            assert!(
                status.success() || killed.contains(&index),
                "worker {index} failed: {status}"
            );
        }
        // Lines printed while the workers stopped.
        while let Some((index, line)) = lines.recv().await {
            println!("worker {index}: {line}");
            run.deliveries.push(
                Delivery::parse(index, &line).unwrap_or_else(|| panic!("worker {index}: {line}")),
            );
        }
        run
    })
    .await;
    run.unwrap_or_else(|_| panic!("the workers did not answer every order within {timeout:?}"))
}
