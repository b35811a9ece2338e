//! The dashboard as its tests run it: the binary serving on a free loopback port, and plain
//! HTTP/1.0 requests to it (one per connection, the answer read to its end).

use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

/// A running `idempotask dashboard`, stopped when dropped.
pub(crate) struct Dashboard {
    child: Child,
    pub(crate) addr: SocketAddr,
    pub(crate) token: String,
    /// What it wrote on stderr after its first line: its audit lines.
    pub(crate) stderr: Arc<Mutex<String>>,
}

impl Dashboard {
    /// Starts `idempotask --redis-url <url> dashboard --listen 127.0.0.1:0 <args>` with a fresh
    /// token in `IDEMPOTASK_DASHBOARD_TOKEN`; answers once it listens.
    pub(crate) fn start(url_flag: &str, url: &str, args: &[&str]) -> Self {
        let token = format!("{:032x}", rand::random::<u128>());
        let mut child = Command::new(env!("CARGO_BIN_EXE_idempotask"))
            .env_remove("REDIS_URL")
            .env_remove("DATABASE_URL")
            .env("IDEMPOTASK_DASHBOARD_TOKEN", &token)
            .args([url_flag, url, "dashboard", "--listen", "127.0.0.1:0"])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let first = lines
            .next()
            .expect("the dashboard wrote nothing and exited")
            .unwrap();
        let addr = first
            .strip_prefix("dashboard: listening on http://")
            .and_then(|rest| rest.split('/').next())
            .unwrap_or_else(|| panic!("unexpected first line: {first}"))
            .parse()
            .unwrap();
        let stderr = Arc::new(Mutex::new(String::new()));
        let sink = stderr.clone();
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                println!("dashboard: {line}");
                let _ = writeln!(sink.lock().unwrap(), "{line}");
            }
        });
        Self {
            child,
            addr,
            token,
            stderr,
        }
    }

    /// `GET path` with the token as a bearer.
    pub(crate) fn get(&self, path: &str) -> Reply {
        let bearer = format!("Bearer {}", self.token);
        http(self.addr, "GET", path, &[("Authorization", &bearer)], None)
    }

    /// `POST /action` of the form `body`, with the token as a bearer.
    pub(crate) fn post_action(&self, body: &str) -> Reply {
        let bearer = format!("Bearer {}", self.token);
        http(
            self.addr,
            "POST",
            "/action",
            &[("Authorization", &bearer)],
            Some(body),
        )
    }
}

impl Drop for Dashboard {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An answer: its status, headers (names in lowercase) and body.
#[derive(Debug)]
pub(crate) struct Reply {
    pub(crate) status: u16,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: String,
}

impl Reply {
    /// The first value of header `name` (lowercase).
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    }
}

/// Sends one request to `addr` and reads the whole answer.
pub(crate) fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> Reply {
    let mut stream = TcpStream::connect(addr).unwrap();
    let mut request = format!("{method} {path} HTTP/1.0\r\nHost: {addr}\r\n");
    for (name, value) in headers {
        let _ = write!(request, "{name}: {value}\r\n");
    }
    if let Some(body) = body {
        let _ = write!(
            request,
            "Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n",
            body.len()
        );
    }
    request.push_str("\r\n");
    request.push_str(body.unwrap_or_default());
    stream.write_all(request.as_bytes()).unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|line| line.split(' ').nth(1))
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {raw:?}"));
    let headers = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_lowercase(), value.trim().to_owned()))
        .collect();
    Reply {
        status,
        headers,
        body: body.to_owned(),
    }
}

/// `text` as a form field's value: every byte but letters and digits percent-encoded.
pub(crate) fn form_value(text: &str) -> String {
    text.bytes()
        .map(|byte| {
            if byte.is_ascii_alphanumeric() {
                char::from(byte).to_string()
            } else {
                format!("%{byte:02X}")
            }
        })
        .collect()
}
