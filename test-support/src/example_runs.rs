//! The crash demonstrations of the examples, run as a user would run the examples: several
//! copies of one example binary ([`Copies`]), one of them killed with SIGKILL at the moment the
//! example names, the others left to finish. What the work came to is read afterwards from the
//! database or Redis, which the kill cannot take back, never from a dead copy's output.
//!
//! [`run_workers`] runs the queue examples (`apalis_worker`, `nats_worker`, `rabbitmq_worker`,
//! `stream_worker`): the copies consume one queue, the copy that charges the crash order first is
//! killed between the charge and its ack, and the others are stopped with Ctrl-C (SIGINT) once
//! every order has an answer. Each prints one line per delivery, which is how the run follows it:
//!
//! ```text
//! waiting for orders on orders
//! order 5: charged ch_5_1, crashing before the ack   (only with CRASH_BEFORE_ACK=5)
//! order 5: charged ch_5_1                          (`stream_worker`: `shipped parcel_5_1`)
//! order 5: replayed ch_5_1
//! order 2: failed: the gateway is unavailable; try again
//! ```
//!
//! [`run_transfers`] runs `ledger_transfer`, which delivers a fixed set of transfers and exits:
//! one copy is killed inside the transaction of the crash transfer while two more run, and a
//! last copy delivers everything again once they are done. Its lines:
//!
//! ```text
//! delivering 40 transfers, 2 at once each
//! transfer 7: moved, crashing before the commit   (only with CRASH_BEFORE_COMMIT=7)
//! transfer 7: executed
//! transfer 7: replayed
//! transfer 3: failed: …
//! ```

use std::collections::{BTreeMap, BTreeSet};
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
        "KAFKA_BROKERS",
    ] {
        command.env_remove(variable);
    }
    for variable in [
        "QUEUE",
        "CRASH_BEFORE_ACK",
        "CRASH_BEFORE_COMMIT",
        "CRASH_AT",
        "ORDERS",
        "WITHOUT_IDEMPOTASK",
    ] {
        command.env_remove(variable);
    }
    command
}

/// The `idempotask` command (package `idempotask-cli`), built beside the running test binary as
/// the examples are, with no server URL inherited from the environment.
pub fn cli() -> std::process::Command {
    let exe = std::env::current_exe().expect("the test binary's path");
    let path = exe
        .parent()
        .and_then(std::path::Path::parent)
        .expect("the test binary is in target/<profile>/deps")
        .join("idempotask");
    assert!(
        path.exists(),
        "{} is not built: run through `cargo test --workspace`, which builds the `idempotask` command for its own tests",
        path.display()
    );
    let mut command = std::process::Command::new(path);
    command.env_remove("REDIS_URL").env_remove("DATABASE_URL");
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
    /// The delivery a worker's stdout `line` tells of, or `None` for another line.
    pub fn parse(worker: usize, line: &str) -> Option<Self> {
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

/// Copies of an example binary, started one at a time, whose stdout lines come in through one
/// channel, each with the index of its copy (the order they were started in).
#[derive(Debug)]
pub struct Copies {
    children: Vec<Child>,
    /// The copies killed with SIGKILL, by index, and their process ids.
    killed: BTreeMap<usize, u32>,
    /// Dropped by [`all_started`](Self::all_started), so that the channel ends with the copies.
    lines_tx: Option<mpsc::UnboundedSender<(usize, Option<String>)>>,
    lines: mpsc::UnboundedReceiver<(usize, Option<String>)>,
}

impl Default for Copies {
    fn default() -> Self {
        let (lines_tx, lines) = mpsc::unbounded_channel();
        Self {
            children: Vec::new(),
            killed: BTreeMap::new(),
            lines_tx: Some(lines_tx),
            lines,
        }
    }
}

impl Copies {
    /// No copies yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts `command` as the next copy, with no stdin and its stdout piped; answers its index.
    /// The copy is killed if this value is dropped first.
    pub fn start(&mut self, command: std::process::Command) -> usize {
        let index = self.children.len();
        let mut command = Command::from(command);
        command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .kill_on_drop(true);
        let mut child = command.spawn().expect("start the example");
        let stdout = child.stdout.take().expect("a piped stdout");
        let lines_tx = self
            .lines_tx
            .clone()
            .expect("a copy started after all_started");
        tokio::spawn(async move {
            let mut stdout = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = stdout.next_line().await {
                if lines_tx.send((index, Some(line))).is_err() {
                    return;
                }
            }
            let _ = lines_tx.send((index, None));
        });
        self.children.push(child);
        index
    }

    /// No copy is started after this one: [`next`](Self::next) answers `None` once every copy
    /// closed its stdout.
    pub fn all_started(&mut self) {
        self.lines_tx = None;
    }

    /// The next line a copy printed, shown as `worker <index>: <line>`, or `None` for the end of
    /// its output (it exited, or was killed); `None` once every copy's output ended after
    /// [`all_started`](Self::all_started).
    pub async fn next(&mut self) -> Option<(usize, Option<String>)> {
        let (index, line) = self.lines.recv().await?;
        match &line {
            Some(line) => println!("worker {index}: {line}"),
            None => println!("worker {index}: (its output ended)"),
        }
        Some((index, line))
    }

    /// Kills copy `index` with SIGKILL, as `kill -9` does: no destructor, no ack, no commit, no
    /// goodbye to the queue.
    pub async fn kill(&mut self, index: usize) {
        let child = &mut self.children[index];
        let pid = child.id().expect("the copy is still running");
        child.kill().await.expect("kill the copy");
        self.killed.insert(index, pid);
    }

    /// The copies killed so far, by index, with their process ids.
    pub fn killed(&self) -> &BTreeMap<usize, u32> {
        &self.killed
    }

    /// Sends SIGINT, as Ctrl-C does, to every copy still running.
    pub fn interrupt(&self) {
        for child in &self.children {
            if let Some(pid) = child.id() {
                let status = std::process::Command::new("kill")
                    .args(["-INT", &pid.to_string()])
                    .status()
                    .expect("run kill");
                assert!(status.success(), "kill -INT {pid}: {status}");
            }
        }
    }

    /// Waits for every copy to exit; panics when one that was not killed failed.
    pub async fn wait(&mut self) {
        for (index, child) in self.children.iter_mut().enumerate() {
            let status = child.wait().await.expect("wait for a copy");
            assert!(
                status.success() || self.killed.contains_key(&index),
                "worker {index} failed: {status}"
            );
        }
    }
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
    let mut copies = Copies::new();
    for _ in 0..WORKERS {
        let mut command = worker();
        command
            .env("QUEUE", queue)
            .env("CRASH_BEFORE_ACK", CRASH_ORDER.to_string());
        copies.start(command);
    }
    copies.all_started();
    let run = tokio::time::timeout(timeout, async {
        let mut run = QueueRun {
            deliveries: Vec::new(),
            killed: 0,
        };
        let mut waiting = 0;
        while waiting < WORKERS {
            let (index, line) = copies.next().await.expect("every worker exited");
            let line = line.unwrap_or_else(|| panic!("worker {index} exited before it was ready"));
            assert!(
                line.starts_with("waiting for orders on "),
                "worker {index}: {line}"
            );
            waiting += 1;
        }
        publish.await;
        let mut answered = BTreeSet::new();
        while (answered.len() as u64) < ORDERS {
            let Some((index, line)) = copies.next().await else {
                panic!("every worker exited: {run:#?}");
            };
            let Some(line) = line else { continue };
            let delivery =
                Delivery::parse(index, &line).unwrap_or_else(|| panic!("worker {index}: {line}"));
            if let Answer::Crashing(_) = delivery.answer {
                copies.kill(index).await;
                run.killed = copies.killed().len();
            } else if delivery.receipt().is_some() {
                answered.insert(delivery.order);
            }
            run.deliveries.push(delivery);
        }
        copies.interrupt();
        // The killed worker's status is SIGKILL's; the others stop cleanly on SIGINT.
        copies.wait().await;
        // Lines printed while the workers stopped.
        while let Some((index, line)) = copies.next().await {
            let Some(line) = line else { continue };
            run.deliveries.push(
                Delivery::parse(index, &line).unwrap_or_else(|| panic!("worker {index}: {line}")),
            );
        }
        run
    })
    .await;
    run.unwrap_or_else(|_| panic!("the workers did not answer every order within {timeout:?}"))
}

/// The transfer whose execution the first copy of `ledger_transfer` is killed in, before its
/// commit.
pub const CRASH_TRANSFER: u64 = 7;

/// What one delivery of a transfer came to, as a copy of `ledger_transfer` printed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transferred {
    /// The body ran and committed with the unit's marker: `transfer 7: executed`.
    Executed,
    /// The stored result was handed back; the body did not run: `transfer 7: replayed`.
    Replayed,
    /// The body moved the money and waits, uncommitted, to be killed.
    Crashing,
    /// The delivery failed: `transfer 7: failed: …`.
    Failed(String),
}

/// One line a copy of `ledger_transfer` printed about one delivery.
#[derive(Debug, Clone)]
pub struct TransferDelivery {
    /// Which copy printed it, by start order.
    pub worker: usize,
    /// The transfer's id.
    pub transfer: u64,
    /// What became of it.
    pub answer: Transferred,
}

impl TransferDelivery {
    fn parse(worker: usize, line: &str) -> Option<Self> {
        let (transfer, rest) = line.strip_prefix("transfer ")?.split_once(": ")?;
        let answer = match rest {
            "executed" => Transferred::Executed,
            "replayed" => Transferred::Replayed,
            "moved, crashing before the commit" => Transferred::Crashing,
            _ => Transferred::Failed(rest.strip_prefix("failed: ")?.to_owned()),
        };
        Some(Self {
            worker,
            transfer: transfer.parse().ok()?,
            answer,
        })
    }
}

/// Everything the copies of one `ledger_transfer` run printed, and which were killed.
#[derive(Debug, Default)]
pub struct TransferRun {
    /// Every delivery line, in the order they were read.
    pub deliveries: Vec<TransferDelivery>,
    /// The copies killed with SIGKILL, by index, with their process ids, which `ledger_transfer`
    /// writes beside each transfer it commits.
    pub killed: BTreeMap<usize, u32>,
    /// How many transfers each copy said it delivers (`delivering 40 transfers, …`), ids
    /// `0..transfers`.
    pub transfers: u64,
}

/// What a line of a copy of `ledger_transfer` was.
enum Seen {
    /// `delivering …`: the copy is about to deliver.
    Delivering,
    /// A delivery, recorded.
    Delivery(Transferred),
    /// The copy's output ended.
    Ended,
}

impl TransferRun {
    /// How many deliveries came to `answer`, by the copies `worker` picks.
    pub fn count(&self, answer: &Transferred, worker: impl Fn(usize) -> bool) -> usize {
        self.deliveries
            .iter()
            .filter(|d| d.answer == *answer && worker(d.worker))
            .count()
    }

    /// The deliveries that failed, by any copy.
    pub fn failed(&self) -> usize {
        self.deliveries
            .iter()
            .filter(|d| matches!(d.answer, Transferred::Failed(_)))
            .count()
    }

    fn see(&mut self, (worker, line): (usize, Option<String>)) -> Seen {
        let Some(line) = line else {
            return Seen::Ended;
        };
        if let Some(rest) = line.strip_prefix("delivering ") {
            let transfers = rest.split_once(' ').and_then(|(n, _)| n.parse().ok());
            let transfers = transfers.unwrap_or_else(|| panic!("worker {worker}: {line}"));
            assert!(
                self.transfers == 0 || self.transfers == transfers,
                "worker {worker}: {line}"
            );
            self.transfers = transfers;
            return Seen::Delivering;
        }
        let delivery = TransferDelivery::parse(worker, &line)
            .unwrap_or_else(|| panic!("worker {worker}: {line}"));
        let answer = delivery.answer.clone();
        self.deliveries.push(delivery);
        Seen::Delivery(answer)
    }
}

/// Runs `ledger_transfer` (`worker()` makes each command, with `DATABASE_URL` set): a first copy
/// alone, with `CRASH_BEFORE_COMMIT` set to [`CRASH_TRANSFER`], until it says it is crashing;
/// then two more, and once both are delivering, the first is killed with SIGKILL, its
/// transaction open; once those two are done, a last copy delivers every transfer again, as a
/// queue redelivers what a dead worker had in flight. Panics when a copy that was not killed
/// fails, or the run takes more than `timeout`.
pub async fn run_transfers(
    mut worker: impl FnMut() -> std::process::Command,
    timeout: Duration,
) -> TransferRun {
    const OPEN: &str = "more copies are to start";
    let mut copies = Copies::new();
    let mut run = TransferRun::default();
    let ran = tokio::time::timeout(timeout, async {
        let mut first = worker();
        first.env("CRASH_BEFORE_COMMIT", CRASH_TRANSFER.to_string());
        let crashing = copies.start(first);
        loop {
            let (index, line) = copies.next().await.expect(OPEN);
            match run.see((index, line)) {
                Seen::Delivery(Transferred::Crashing) => break,
                Seen::Ended => panic!("worker {index} ended before its crash: {run:#?}"),
                Seen::Delivering | Seen::Delivery(_) => {}
            }
        }
        let others = [copies.start(worker()), copies.start(worker())];
        let mut delivering = 0;
        while delivering < others.len() {
            let (index, line) = copies.next().await.expect(OPEN);
            match run.see((index, line)) {
                Seen::Delivering => delivering += 1,
                Seen::Ended => panic!("worker {index} ended before the kill: {run:#?}"),
                Seen::Delivery(_) => {}
            }
        }
        // Their deliveries of the crash transfer wait on its row; the kill ends its transaction.
        copies.kill(crashing).await;
        let mut ended = 0;
        while ended < 1 + others.len() {
            let next = copies.next().await.expect(OPEN);
            if let Seen::Ended = run.see(next) {
                ended += 1;
            }
        }
        copies.start(worker());
        copies.all_started();
        while let Some(next) = copies.next().await {
            run.see(next);
        }
        copies.wait().await;
    })
    .await;
    ran.unwrap_or_else(|_| panic!("the copies did not finish within {timeout:?}: {run:#?}"));
    run.killed.clone_from(copies.killed());
    run
}
