//! A `moto_server` (Python moto 5's AWS API, for SQS) of the test's own on a free loopback
//! port.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::free_port;

/// How long moto may take to answer HTTP (it imports its Python modules first: a second on an
/// idle machine, more on one shared by several builds).
const BOOT_TIMEOUT: Duration = Duration::from_secs(60);

/// A `moto_server` on a free loopback port, killed when dropped. Its state is in memory: every
/// queue a test creates lives as long as the server.
pub struct MotoServer {
    child: Child,
    stdin: Option<ChildStdin>,
    port: u16,
}

impl MotoServer {
    /// Starts a server and waits until it answers HTTP. Panics with a clear message when
    /// `moto_server` is missing: the suite never skips SQS tests.
    pub fn start() -> Self {
        let mut last_error = String::new();
        // A free port can be taken by someone else between probing and binding: try a few.
        for _ in 0..3 {
            let port = free_port();
            match spawn(port) {
                Ok(mut child) => {
                    let stdin = child.stdin.take();
                    return Self { child, stdin, port };
                }
                Err(err) => last_error = err,
            }
        }
        panic!("moto_server did not come up: {last_error}");
    }

    /// One server for the whole test binary, started by the first test that asks; each test
    /// keeps to queues of its own names. It is killed when the test process exits (through
    /// its wrapper, whose standard input then closes).
    pub fn shared() -> &'static Self {
        static SHARED: OnceLock<MotoServer> = OnceLock::new();
        SHARED.get_or_init(Self::start)
    }

    /// `http://127.0.0.1:<port>`: the endpoint URL an SQS client is given.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for MotoServer {
    fn drop(&mut self) {
        // Its wrapper kills moto once its standard input closes.
        drop(self.stdin.take());
        let _ = self.child.wait();
    }
}

/// A shell that runs `moto_server` and kills it once its standard input closes: on a drop, or
/// when the test process is gone however it ended (statics are never dropped).
const WRAPPER: &str = r#"
moto_server -H 127.0.0.1 -p "$MOTO_PORT" >/dev/null 2>&1 &
moto=$!
cat >/dev/null
kill -KILL "$moto" 2>/dev/null
"#;

/// Starts `moto_server` on `port` and waits until it answers an HTTP request.
fn spawn(port: u16) -> Result<Child, String> {
    let found = Command::new("sh")
        .args(["-c", "command -v moto_server"])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    assert!(
        found,
        "moto_server is not installed; the README's test command (scripts/test.sh) installs it (scripts/install-servers.sh: pip install 'moto[server]>=5,<6')"
    );
    let mut child = Command::new("sh")
        .args(["-c", WRAPPER])
        .env("MOTO_PORT", port.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|err| format!("cannot start moto_server: {err}"))?;
    let deadline = Instant::now() + BOOT_TIMEOUT;
    while Instant::now() < deadline {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("moto_server exited with {status}"));
        }
        if answers(port) {
            return Ok(child);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    Err(format!(
        "moto_server did not answer HTTP within {BOOT_TIMEOUT:?}"
    ))
}

/// Whether something on `port` answers `GET /` with an HTTP status line.
fn answers(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect((Ipv4Addr::LOCALHOST, port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    if stream
        .write_all(b"GET / HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut head = [0_u8; 12];
    stream.read_exact(&mut head).is_ok() && head.starts_with(b"HTTP/1.")
}
