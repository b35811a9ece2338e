//! Independent redis-servers for the quorum store, started on free loopback ports.

use std::time::Duration;

use idempotask_redis::RedlockStore;

use super::{Flavor, RedisServer};

/// `n` independent servers, stopped when dropped.
pub struct Quorum {
    /// The quorum's servers, in the order of [`urls`](Self::urls).
    pub servers: Vec<RedisServer>,
}

impl Quorum {
    /// `n` redis-servers with persistence off.
    pub fn start(n: usize) -> Self {
        Self::start_with(n, &[])
    }

    /// `n` redis-servers with extra `--option value` arguments each.
    pub fn start_with(n: usize, extra: &[&str]) -> Self {
        Self {
            servers: (0..n).map(|_| RedisServer::start_with(extra)).collect(),
        }
    }

    /// Redis and Valkey servers mixed (`flavors` in order): the store speaks to each as it is.
    pub fn start_mixed(flavors: &[Flavor]) -> Self {
        Self {
            servers: flavors
                .iter()
                .map(|flavor| RedisServer::start_flavor(*flavor, &[]))
                .collect(),
        }
    }

    /// Each server's URL.
    pub fn urls(&self) -> Vec<String> {
        self.servers.iter().map(RedisServer::url).collect()
    }

    /// A store on every server, with a per-server timeout generous enough for a busy test
    /// machine.
    pub async fn store(&self) -> RedlockStore {
        self.store_timed(Duration::from_secs(1)).await
    }

    /// A store on every server that waits `server_timeout` for each.
    pub async fn store_timed(&self, server_timeout: Duration) -> RedlockStore {
        RedlockStore::builder(self.urls())
            .server_timeout(server_timeout)
            .connect()
            .await
            .unwrap()
    }

    /// Sends `signal` (`KILL`, `STOP`, `CONT`) to server `index`.
    pub fn signal(&self, index: usize, signal: &str) {
        let pid = self.servers[index].pid().to_string();
        let status = std::process::Command::new("kill")
            .args([&format!("-{signal}"), &pid])
            .status()
            .unwrap();
        assert!(status.success(), "kill -{signal} {pid} failed");
    }
}

impl Drop for Quorum {
    fn drop(&mut self) {
        // A stopped server cannot act on SIGKILL's cleanup until it runs again.
        for index in 0..self.servers.len() {
            let _ = std::process::Command::new("kill")
                .args(["-CONT", &self.servers[index].pid().to_string()])
                .status();
        }
    }
}

/// Busy loops that keep the machine's cores loaded while a test runs, so that timeouts which
/// never fire on an idle machine fire: each is a `sh` spinning under `timeout`, which bounds it
/// even if the test process dies; dropped, they are stopped.
pub struct BusyLoops {
    loops: Vec<std::process::Child>,
}

impl BusyLoops {
    /// Starts `count` busy loops, each stopped after `bound` at the latest.
    pub fn start(count: usize, bound: Duration) -> Self {
        let loops = (0..count)
            .map(|_| {
                std::process::Command::new("timeout")
                    .args([
                        &bound.as_secs().max(1).to_string(),
                        "sh",
                        "-c",
                        "while :; do :; done",
                    ])
                    .spawn()
                    .expect("start a busy loop with `timeout` (coreutils)")
            })
            .collect();
        Self { loops }
    }
}

impl Drop for BusyLoops {
    fn drop(&mut self) {
        for child in &mut self.loops {
            // `timeout` passes SIGTERM on to its `sh` and exits with it.
            let _ = std::process::Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            let _ = child.wait();
        }
    }
}
