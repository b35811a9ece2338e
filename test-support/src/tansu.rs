//! A `tansu` broker (a Kafka-protocol broker, 0.6) of the test's own on a free loopback port,
//! storing in a `tansu.db` file (sqlite) of its own.
//!
//! tansu creates no topic by itself: a test creates its topics with a Kafka admin client.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::restartable::Restartable;

/// How long a broker may take to answer Kafka requests (tens of milliseconds on an idle
/// machine, more on one shared by several builds).
const BOOT_TIMEOUT: Duration = Duration::from_secs(30);

/// A `tansu broker` on a free loopback port with its own sqlite database, killed and its
/// directory removed when dropped.
pub struct TansuServer {
    server: Restartable,
}

impl TansuServer {
    /// Starts a broker and waits until it answers Kafka's `ApiVersions` and `Metadata` requests.
    /// Panics with a clear message when `tansu` is missing: the suite never skips Kafka tests.
    pub fn start() -> Self {
        let program = program();
        Self {
            server: Restartable::start("tansu", move |port, dir| spawn(&program, port, dir)),
        }
    }

    /// `127.0.0.1:<port>`: a Kafka client's `bootstrap.servers`.
    pub fn bootstrap_servers(&self) -> String {
        format!("127.0.0.1:{}", self.port())
    }

    /// The broker's port.
    pub fn port(&self) -> u16 {
        self.server.port()
    }

    /// Kills the broker with SIGKILL: no goodbye to its clients, its database as far as sqlite
    /// committed it.
    pub fn kill(&mut self) {
        self.server.kill();
    }

    /// Kills the broker if it runs and starts it again on the same port with the same database,
    /// so its topics, records and committed offsets come back.
    pub fn restart(&mut self) {
        self.server.restart();
    }
}

/// The `tansu` binary: on `PATH`, else where `cargo install` puts it (`$CARGO_HOME/bin`, then
/// `~/.cargo/bin`), since a shell that runs the tests need not have that directory on `PATH`.
fn program() -> PathBuf {
    let on_path = std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .unwrap_or_default();
    let cargo_home = std::env::var_os("CARGO_HOME").map(PathBuf::from);
    let home_cargo = std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cargo"));
    on_path
        .into_iter()
        .chain(cargo_home.into_iter().chain(home_cargo).map(|dir| dir.join("bin")))
        .map(|dir| dir.join("tansu"))
        .find(|candidate| candidate.is_file())
        .unwrap_or_else(|| {
            panic!(
                "tansu is not installed (looked on PATH, in $CARGO_HOME/bin and ~/.cargo/bin); the README's test command (scripts/test.sh) installs it (scripts/install-servers.sh: cargo install tansu --locked --version 0.6.0 --features dynostore,libsql)"
            )
        })
}

/// Starts `tansu broker` on `port` with its database in `dir`, and waits until it answers.
fn spawn(program: &Path, port: u16, dir: &Path) -> Result<Child, String> {
    let listener = format!("tcp://127.0.0.1:{port}");
    let log_path = dir.join("tansu.log");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(|err| format!("cannot open {}: {err}", log_path.display()))?;
    let log_err = log
        .try_clone()
        .map_err(|err| format!("cannot open {}: {err}", log_path.display()))?;
    let mut child = Command::new(program)
        .arg("broker")
        // Without these two the broker listens on every interface and advertises `localhost`,
        // which a client may resolve to `::1` where nothing listens.
        .args(["--listener-url", &listener])
        .args(["--advertised-listener-url", &listener])
        // tansu puts its working directory in front of an absolute SQLite path, so the database
        // is named relative to the directory it runs in.
        .args(["--storage-engine", "sqlite://tansu.db"])
        .current_dir(dir)
        // The environment stands in for flags left out; a developer's must not reach the broker.
        .env_remove("SCHEMA_REGISTRY")
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log_err)
        .spawn()
        .map_err(|err| format!("cannot start {}: {err}", program.display()))?;
    let deadline = Instant::now() + BOOT_TIMEOUT;
    while Instant::now() < deadline {
        if let Ok(Some(status)) = child.try_wait() {
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            return Err(format!("tansu exited with {status}: {}", log.trim()));
        }
        if answers(port) {
            return Ok(child);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = child.kill();
    let _ = child.wait();
    Err(format!(
        "tansu did not answer Kafka requests within {BOOT_TIMEOUT:?}"
    ))
}

/// Whether the broker on `port` answers `ApiVersions` without error and `Metadata` with itself
/// as a broker advertised on `127.0.0.1:<port>`.
fn answers(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect((Ipv4Addr::LOCALHOST, port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    // ApiVersions v0 (key 18) has an empty body; its reply starts with an error code.
    let api_versions_ok =
        request(&mut stream, 18, 1, &[]).is_some_and(|reply| reply.get(..2) == Some(&[0, 0][..]));
    // Metadata v0 (key 3) for no topic in particular: brokers are listed first, each as node id,
    // host and port.
    api_versions_ok
        && request(&mut stream, 3, 2, &0_i32.to_be_bytes()).is_some_and(|reply| {
            let mut broker = Vec::new();
            put_string(&mut broker, "127.0.0.1");
            broker.extend_from_slice(&i32::from(port).to_be_bytes());
            reply.get(..4).is_some_and(|count| count != [0, 0, 0, 0])
                && reply.windows(broker.len()).any(|window| window == broker)
        })
}

/// Sends a version 0 request of `api_key` with `body` (header v1: key, version, correlation id,
/// client id) and returns the reply's body after its correlation id, if the id matches.
fn request(stream: &mut TcpStream, api_key: i16, correlation: i32, body: &[u8]) -> Option<Vec<u8>> {
    let mut message = Vec::new();
    message.extend_from_slice(&api_key.to_be_bytes());
    message.extend_from_slice(&0_i16.to_be_bytes());
    message.extend_from_slice(&correlation.to_be_bytes());
    put_string(&mut message, "idempotask-test-support");
    message.extend_from_slice(body);
    let mut framed = i32::try_from(message.len()).ok()?.to_be_bytes().to_vec();
    framed.extend_from_slice(&message);
    stream.write_all(&framed).ok()?;
    let mut size = [0_u8; 4];
    stream.read_exact(&mut size).ok()?;
    let size = usize::try_from(i32::from_be_bytes(size)).ok()?;
    if !(4..=1 << 20).contains(&size) {
        return None;
    }
    let mut reply = vec![0_u8; size];
    stream.read_exact(&mut reply).ok()?;
    (reply[..4] == correlation.to_be_bytes()).then(|| reply.split_off(4))
}

/// Appends a Kafka `STRING`: its length as an `i16`, then its bytes (short ASCII here).
fn put_string(buffer: &mut Vec<u8>, text: &str) {
    let length = i16::try_from(text.len()).expect("a short string");
    buffer.extend_from_slice(&length.to_be_bytes());
    buffer.extend_from_slice(text.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::{TansuServer, answers};

    #[test]
    fn a_restarted_broker_answers_on_its_port_and_a_dropped_one_leaves_nothing() {
        let mut server = TansuServer::start();
        let port = server.port();
        let dir = server.server.dir().to_path_buf();
        assert_eq!(server.bootstrap_servers(), format!("127.0.0.1:{port}"));
        assert!(
            dir.join("tansu.db").is_file(),
            "the database is in the broker's directory"
        );
        server.kill();
        assert!(!answers(port), "a killed broker answers nothing");
        server.restart();
        assert!(answers(port));
        drop(server);
        assert!(!answers(port));
        assert!(!dir.exists(), "the broker's directory goes with it");
    }
}
