//! Test support: real servers started on free loopback ports, and helpers shared by the suites.

#![allow(dead_code, unreachable_pub)]

pub mod conformance;
pub mod postgres;

use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A `redis-server` of the test's own on a free loopback port, stopped when dropped.
pub struct RedisServer {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl RedisServer {
    /// Starts a server with persistence off. Panics with a clear message when `redis-server` is
    /// missing: the suite never skips Redis tests.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts a server with extra `--option value` arguments.
    pub fn start_with(extra: &[&str]) -> Self {
        let mut last_error = String::new();
        // A free port can be taken by someone else between probing and binding: try a few.
        for _ in 0..5 {
            let port = free_port();
            let dir = std::env::temp_dir()
                .join(format!("idempotask-redis-{}-{port}", std::process::id()));
            std::fs::create_dir_all(&dir).expect("create the server's directory");
            let spawned = Command::new("redis-server")
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
                .arg("--dir")
                .arg(&dir)
                .args(extra)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn();
            let mut child = match spawned {
                Ok(child) => child,
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => panic!(
                    "redis-server is not installed; the README's test command installs it (apt-get install -y redis-server)"
                ),
                Err(err) => panic!("cannot start redis-server: {err}"),
            };
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(status)) = child.try_wait() {
                    last_error = format!("redis-server exited with {status}");
                    break;
                }
                if ping(port) {
                    return Self { child, port, dir };
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("redis-server did not come up: {last_error}");
    }

    pub fn port(&self) -> u16 {
        self.port
    }

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
    pub async fn store(&self) -> idempotask::RedisStore {
        idempotask::RedisStore::connect(&self.url()).await.unwrap()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub(crate) fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .expect("a free loopback port")
}

fn ping(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut stream) = TcpStream::connect((Ipv4Addr::LOCALHOST, port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    let mut reply = [0_u8; 7];
    stream.write_all(b"PING\r\n").is_ok()
        && stream.read_exact(&mut reply).is_ok()
        && &reply == b"+PONG\r\n"
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
