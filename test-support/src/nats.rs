//! A `nats-server -js` (streams on) of the test's own on a free loopback port.

use std::io::Read;
use std::net::{Ipv4Addr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::free_port;

/// A `nats-server -js` on a free loopback port with its own store directory, killed and its
/// directory removed when dropped.
pub struct NatsServer {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
}

impl NatsServer {
    /// Starts a server with streams on (`-js`). Panics with a clear message when `nats-server` is
    /// missing: the suite never skips NATS tests.
    pub fn start() -> Self {
        let mut last_error = String::new();
        // A free port can be taken by someone else between probing and binding: try a few.
        for _ in 0..5 {
            let port = free_port();
            let dir =
                std::env::temp_dir().join(format!("idempotask-nats-{}-{port}", std::process::id()));
            std::fs::create_dir_all(&dir).expect("create the server's store directory");
            match spawn(port, &dir) {
                Ok(child) => {
                    return Self {
                        child: Some(child),
                        port,
                        dir,
                    };
                }
                Err(err) => {
                    let _ = std::fs::remove_dir_all(&dir);
                    last_error = err;
                }
            }
        }
        panic!("nats-server did not come up: {last_error}");
    }

    /// `nats://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Kills the server with SIGKILL: no goodbye to its clients, streams as far as it wrote
    /// them.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills the server if it runs and starts it again on the same port with the same store
    /// directory, so its streams and consumers come back.
    pub fn restart(&mut self) {
        self.kill();
        let mut last_error = String::new();
        for _ in 0..50 {
            match spawn(self.port, &self.dir) {
                Ok(child) => {
                    self.child = Some(child);
                    return;
                }
                // The old socket may linger for a moment.
                Err(err) => last_error = err,
            }
        }
        panic!("nats-server did not come back: {last_error}");
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Starts `nats-server -js` on `port` storing in `dir`, and waits until it greets a client
/// with its `INFO` line.
fn spawn(port: u16, dir: &std::path::Path) -> Result<Child, String> {
    let spawned = Command::new("nats-server")
        .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
    let mut child = match spawned {
        Ok(child) => child,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => panic!(
            "nats-server is not installed; the README's test command (scripts/test.sh) installs it (Debian package `nats-server`)"
        ),
        Err(err) => panic!("cannot start nats-server: {err}"),
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("nats-server exited with {status}"));
        }
        if greets(port) {
            return Ok(child);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = child.kill();
    let _ = child.wait();
    Err("nats-server did not greet a client within 10 s".to_owned())
}

/// Whether the server on `port` sends its `INFO` greeting with `"jetstream":true`.
fn greets(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect((Ipv4Addr::LOCALHOST, port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    let mut greeting = [0_u8; 2048];
    let mut read = 0;
    while read < greeting.len() {
        match stream.read(&mut greeting[read..]) {
            Ok(0) | Err(_) => return false,
            Ok(n) => read += n,
        }
        let text = String::from_utf8_lossy(&greeting[..read]);
        if text.contains("\r\n") {
            return text.starts_with("INFO ") && text.contains("\"jetstream\":true");
        }
    }
    false
}
