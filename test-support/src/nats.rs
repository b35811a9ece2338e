//! A `nats-server -js` (streams on) of the test's own on a free loopback port.

use std::io::Read;
use std::net::{Ipv4Addr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::restartable::Restartable;

/// A `nats-server -js` on a free loopback port with its own store directory, killed and its
/// directory removed when dropped.
pub struct NatsServer {
    server: Restartable,
}

impl NatsServer {
    /// Starts a server with streams on (`-js`). Panics with a clear message when `nats-server` is
    /// missing: the suite never skips NATS tests.
    pub fn start() -> Self {
        Self {
            server: Restartable::start("nats-server", spawn),
        }
    }

    /// `nats://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port())
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.server.port()
    }

    /// Kills the server with SIGKILL: no goodbye to its clients, streams as far as it wrote
    /// them.
    pub fn kill(&mut self) {
        self.server.kill();
    }

    /// Kills the server if it runs and starts it again on the same port with the same store
    /// directory, so its streams and consumers come back.
    pub fn restart(&mut self) {
        self.server.restart();
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

#[cfg(test)]
mod tests {
    use super::{NatsServer, greets};

    #[test]
    fn a_restarted_server_greets_on_its_port_and_a_dropped_one_is_gone() {
        let mut server = NatsServer::start();
        let port = server.port();
        assert_eq!(server.url(), format!("nats://127.0.0.1:{port}"));
        server.kill();
        assert!(!greets(port), "a killed server greets nobody");
        server.restart();
        assert!(greets(port));
        drop(server);
        assert!(!greets(port));
    }
}
