//! Worker processes for scenarios that need several OS processes: a test binary re-runs one of
//! its own tests as a worker, configured by one JSON value, and answers in JSON lines.
//!
//! The parent side is [`Workers`] (or one [`Worker`]); the worker side is [`config`],
//! [`wait_for_start`] and [`report`]. The worker test does nothing when it runs as an ordinary
//! test, because [`config`] answers `None` there:
//!
//! ```ignore
//! #[derive(Serialize, Deserialize)]
//! struct Config { url: String }
//!
//! #[tokio::test]
//! async fn racing_workers_run_each_key_once() {
//!     let mut workers = Workers::spawn(2, "worker", &Config { url });
//!     workers.start_together(Duration::from_secs(60)).await;
//!     let summaries: Vec<Summary> = workers.reports(Duration::from_secs(300)).await;
//! }
//!
//! #[tokio::test]
//! async fn worker() {
//!     let Some(config) = workers::config::<Config>() else { return };
//!     workers::wait_for_start().await;
//!     workers::report(&Summary { .. });
//! }
//! ```
//!
//! A role is a variant of an enum config: the worker matches on it, and a role the worker does
//! not know fails to deserialise instead of falling through a string comparison.

use std::process::Stdio;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::{Instant, timeout_at};

/// The environment variable that holds a worker's config as JSON.
const CONFIG_ENV: &str = "IDEMPOTASK_TEST_WORKER_CONFIG";
/// What starts every line a worker writes to its parent; the JSON of a [`Message`] follows.
const LINE_PREFIX: &str = "@idempotask-worker ";

/// One line from a worker to its parent.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Message<T> {
    /// The worker is set up and waits for the start signal on its stdin.
    Ready,
    /// The worker's result.
    Report(T),
}

// ---- the worker's side ----

/// The config the parent gave this process, or `None` when the test runs as an ordinary test
/// rather than as a worker. Panics when the config does not deserialise into `C`.
pub fn config<C: DeserializeOwned>() -> Option<C> {
    let json = std::env::var(CONFIG_ENV).ok()?;
    Some(serde_json::from_str(&json).unwrap_or_else(|err| {
        panic!(
            "the worker's config {json} is not a {}: {err}",
            std::any::type_name::<C>()
        )
    }))
}

/// Tells the parent this worker is ready, then waits until [`Workers::start_together`] starts
/// every worker at once. Panics when the parent goes away first.
pub async fn wait_for_start() {
    send(&Message::<()>::Ready);
    let mut line = String::new();
    let read = BufReader::new(tokio::io::stdin())
        .read_line(&mut line)
        .await
        .expect("read the start signal from stdin");
    assert!(
        read > 0,
        "the parent closed stdin before it started the workers"
    );
}

/// Sends `value` to the parent as this worker's report, which [`Worker::report`] reads. A
/// worker reports once.
pub fn report<T: Serialize>(value: &T) {
    send(&Message::Report(value));
}

fn send<T: Serialize>(message: &Message<T>) {
    use std::io::Write;
    let json = serde_json::to_string(message).expect("a worker's message serialises");
    // The leading newline puts the message on a line of its own: with `--nocapture`, libtest
    // writes `test worker ... ` without ending the line before the test's own output.
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "\n{LINE_PREFIX}{json}")
        .and_then(|()| stdout.flush())
        .expect("write to the parent");
}

// ---- the parent's side ----

/// A worker process: this test binary running the one test `test`, stopped with SIGKILL when
/// dropped. Must be spawned within a Tokio runtime.
pub struct Worker {
    test: String,
    child: Child,
    stdin: Option<ChildStdin>,
    ready: Option<oneshot::Receiver<()>>,
    messages: JoinHandle<Result<Vec<Value>, String>>,
    stderr: JoinHandle<String>,
}

impl Worker {
    /// Starts the test `test` of this binary (its full path, as `--exact` wants it) as a
    /// worker whose [`config`] answers `config`.
    pub fn spawn(test: &str, config: &impl Serialize) -> Self {
        let config = serde_json::to_string(config).expect("a worker's config serialises");
        let exe = std::env::current_exe().expect("the test binary's path");
        let mut child = Command::new(exe)
            .args(["--exact", test, "--nocapture", "--test-threads=1"])
            .env(CONFIG_ENV, config)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|err| panic!("cannot start the worker `{test}`: {err}"));
        let (ready_tx, ready) = oneshot::channel();
        let stdout = child.stdout.take().expect("a piped stdout");
        let mut stderr = child.stderr.take().expect("a piped stderr");
        Self {
            test: test.to_owned(),
            stdin: child.stdin.take(),
            child,
            ready: Some(ready),
            // Both pipes are drained while the worker runs, so that a chatty worker never
            // blocks on a full pipe.
            messages: tokio::spawn(read_messages(stdout, ready_tx)),
            stderr: tokio::spawn(async move {
                let mut written = Vec::new();
                let _ = stderr.read_to_end(&mut written).await;
                String::from_utf8_lossy(&written).into_owned()
            }),
        }
    }

    /// Kills the worker with SIGKILL, as `kill -9` does, and waits until it is gone.
    pub async fn kill(mut self) {
        self.child.kill().await.expect("kill the worker");
    }

    /// Waits until the worker exits, at most `timeout`; asserts that it succeeded and sent one
    /// report, and answers that report.
    pub async fn report<T: DeserializeOwned>(self, timeout: Duration) -> T {
        self.report_by(Instant::now() + timeout).await
    }

    async fn wait_ready(&mut self, deadline: Instant) {
        let ready = self.ready.take().expect("the worker is started once");
        match timeout_at(deadline, ready).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => self.fail("exited before it was ready").await,
            Err(_) => self.fail("was not ready in time").await,
        }
    }

    async fn start(&mut self) {
        let stdin = self.stdin.as_mut().expect("the worker is started once");
        let sent = stdin.write_all(b"start\n").await;
        if sent.and(stdin.flush().await).is_err() {
            self.fail("exited before it was started").await;
        }
    }

    async fn report_by<T: DeserializeOwned>(mut self, deadline: Instant) -> T {
        // A worker still waiting for the start signal sees its stdin close and fails at once.
        self.stdin = None;
        let status = match timeout_at(deadline, self.child.wait()).await {
            Ok(status) => status.expect("wait for the worker"),
            Err(_) => self.fail("did not finish in time").await,
        };
        let test = self.test.clone();
        let (messages, stderr) = self.output().await;
        assert!(
            status.success(),
            "the worker `{test}` failed ({status}); its stderr:\n{stderr}"
        );
        let mut reports = messages.unwrap_or_else(|err| panic!("the worker `{test}`: {err}"));
        assert_eq!(
            reports.len(),
            1,
            "the worker `{test}` sent {} reports instead of one: {reports:?}",
            reports.len()
        );
        let report = reports.remove(0);
        serde_json::from_value(report.clone()).unwrap_or_else(|err| {
            panic!(
                "the report of the worker `{test}` is not a {}: {err}; it sent {report}",
                std::any::type_name::<T>()
            )
        })
    }

    /// Kills the worker and fails the test, showing why and what the worker wrote to stderr.
    async fn fail(&mut self, why: &str) -> ! {
        let _ = self.child.kill().await;
        let status = self
            .child
            .wait()
            .await
            .map_or_else(|err| err.to_string(), |status| status.to_string());
        let stderr = (&mut self.stderr).await.unwrap_or_default();
        panic!(
            "the worker `{}` {why} ({status}); its stderr:\n{stderr}",
            self.test
        );
    }

    /// The reports the worker sent, and its stderr; both end when the process has exited.
    async fn output(self) -> (Result<Vec<Value>, String>, String) {
        let messages = self.messages.await.expect("the worker's stdout reader");
        let stderr = self.stderr.await.expect("the worker's stderr reader");
        (messages, stderr)
    }
}

/// Reads a worker's stdout until it closes: signals `ready` on the ready message and collects
/// the reports, or the first line it cannot read. Lines without the prefix are libtest's and
/// are passed over.
async fn read_messages(
    stdout: impl AsyncRead + Unpin,
    ready: oneshot::Sender<()>,
) -> Result<Vec<Value>, String> {
    let mut ready = Some(ready);
    let mut reports = Ok(Vec::new());
    let mut lines = BufReader::new(stdout).lines();
    // Reading goes on past a bad line, so that the worker never blocks on a full pipe.
    while let Some(line) = lines.next_line().await.map_err(|err| err.to_string())? {
        let Some(json) = line.strip_prefix(LINE_PREFIX) else {
            continue;
        };
        match serde_json::from_str(json) {
            Ok(Message::Ready) => {
                if let Some(ready) = ready.take() {
                    let _ = ready.send(());
                }
            }
            Ok(Message::Report(report)) => {
                if let Ok(reports) = &mut reports {
                    reports.push(report);
                }
            }
            Err(err) if reports.is_ok() => reports = Err(format!("a bad line {line:?}: {err}")),
            Err(_) => {}
        }
    }
    reports
}

/// Several workers running the same test with the same config.
pub struct Workers {
    workers: Vec<Worker>,
}

impl Workers {
    /// Starts `count` workers of the test `test`; see [`Worker::spawn`].
    pub fn spawn(count: usize, test: &str, config: &impl Serialize) -> Self {
        Self {
            workers: (0..count).map(|_| Worker::spawn(test, config)).collect(),
        }
    }

    /// Waits until every worker is ready (each has called [`wait_for_start`]), at most
    /// `timeout`, then starts them all at once.
    pub async fn start_together(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        for worker in &mut self.workers {
            worker.wait_ready(deadline).await;
        }
        for worker in &mut self.workers {
            worker.start().await;
        }
    }

    /// Waits until every worker exits, at most `timeout` for all of them, and answers each
    /// one's report, in the order they were spawned; see [`Worker::report`].
    pub async fn reports<T: DeserializeOwned>(self, timeout: Duration) -> Vec<T> {
        let deadline = Instant::now() + timeout;
        let mut reports = Vec::with_capacity(self.workers.len());
        for worker in self.workers {
            reports.push(worker.report_by(deadline).await);
        }
        reports
    }
}
