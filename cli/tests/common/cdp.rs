//! Headless Chromium driven through the `DevTools` protocol: a page target's websocket, spoken
//! over a plain `TcpStream` (text frames, masked as a client masks them), so the browser test
//! needs no crate beyond the ones the workspace has.

use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// Where Debian's `chromium` package puts the browser.
const CHROMIUM: &str = "/usr/bin/chromium";

/// A headless Chromium with one page, stopped (and its profile deleted) when dropped.
pub(crate) struct Browser {
    child: Child,
    profile: PathBuf,
    socket: TcpStream,
    next_id: u64,
    /// The page's session on the browser's connection, once attached.
    session: Option<String>,
}

impl Browser {
    /// Starts Chromium on a free port with a fresh profile and connects to its first page.
    /// Panics when Chromium is missing: the test never passes without a browser.
    pub(crate) fn start() -> Self {
        assert!(
            std::path::Path::new(CHROMIUM).exists(),
            "{CHROMIUM} is missing: install Debian's `chromium` package (scripts/install-servers.sh does)"
        );
        let profile =
            std::env::temp_dir().join(format!("idempotask-chromium-{:x}", rand::random::<u64>()));
        let mut child = Command::new(CHROMIUM)
            .args([
                "--headless=new",
                // Root in a container has no user namespaces for the sandbox.
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--window-size=1200,900",
                "--remote-debugging-port=0",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = BufReader::new(child.stderr.take().unwrap());
        let mut lines = stderr.lines().map_while(Result::ok);
        let browser_url = lines.by_ref().find_map(|line| {
            line.strip_prefix("DevTools listening on ws://")
                .map(str::to_owned)
        });
        // Chromium goes on writing to stderr: a closed pipe would fail its writes.
        std::thread::spawn(move || lines.for_each(drop));
        let browser_url = browser_url.expect("Chromium exited before it listened for DevTools");
        let (addr, path) = browser_url.split_once('/').unwrap();
        let socket = handshake(addr.parse().unwrap(), &format!("/{path}"));
        let mut browser = Self {
            child,
            profile,
            socket,
            next_id: 0,
            session: None,
        };
        let targets = browser.call("Target.getTargets", &json!({}));
        let page = targets["targetInfos"]
            .as_array()
            .unwrap()
            .iter()
            .find(|target| target["type"] == "page")
            .unwrap_or_else(|| panic!("no page among {targets}"))["targetId"]
            .clone();
        let attached = browser.call(
            "Target.attachToTarget",
            &json!({ "targetId": page, "flatten": true }),
        );
        browser.session = Some(attached["sessionId"].as_str().unwrap().to_owned());
        browser
    }
    /// Sends `DevTools` command `method` and answers its result; panics on an error.
    pub(crate) fn call(&mut self, method: &str, params: &Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let mut message = json!({ "id": id, "method": method, "params": params });
        if let Some(session) = &self.session {
            message["sessionId"] = json!(session);
        }
        let message = message.to_string();
        send(&mut self.socket, message.as_bytes());
        loop {
            let answer: Value = serde_json::from_slice(&receive(&mut self.socket)).unwrap();
            if answer["id"] == id {
                assert!(answer.get("error").is_none(), "{method}: {answer}");
                return answer["result"].clone();
            }
        }
    }

    /// Evaluates `expression` in the page; answers its value.
    pub(crate) fn eval(&mut self, expression: &str) -> Value {
        let result = self.call(
            "Runtime.evaluate",
            &json!({ "expression": expression, "returnByValue": true }),
        );
        assert!(
            result.get("exceptionDetails").is_none(),
            "{expression}: {result}"
        );
        result["result"]["value"].clone()
    }

    /// Evaluates `expression` until it is `true`, for up to 20 s.
    pub(crate) fn wait_for(&mut self, expression: &str) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.eval(expression) != Value::Bool(true) {
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {expression}"
            );
            // The page changes on its own (a navigation, a fetch): look again shortly.
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Saves what the page shows, as PNG, to `path`.
    pub(crate) fn screenshot(&mut self, path: &std::path::Path) {
        use base64::Engine as _;
        let shot = self.call("Page.captureScreenshot", &json!({ "format": "png" }));
        let png = base64::engine::general_purpose::STANDARD
            .decode(shot["data"].as_str().unwrap())
            .unwrap();
        std::fs::write(path, png).unwrap();
    }

    /// Clicks the middle of the element `selector` finds, as a mouse does.
    pub(crate) fn click(&mut self, selector: &str) {
        let quoted = serde_json::to_string(selector).unwrap();
        let point = self.eval(&format!(
            "(() => {{ const r = document.querySelector({quoted}).getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; }})()"
        ));
        for kind in ["mousePressed", "mouseReleased"] {
            self.call(
            "Input.dispatchMouseEvent",
            &json!({ "type": kind, "x": point[0], "y": point[1], "button": "left", "clickCount": 1 }),
            );
        }
    }

    /// Clicks the field `selector` finds and types `text` into it.
    pub(crate) fn type_into(&mut self, selector: &str, text: &str) {
        self.click(selector);
        self.call("Input.insertText", &json!({ "text": text }));
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

/// Opens the websocket at `path` on `addr`.
fn handshake(addr: SocketAddr, path: &str) -> TcpStream {
    let mut socket = TcpStream::connect(addr).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut request = String::new();
    let _ = write!(
        request,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: aWRlbXBvdGFzay10ZXN0cw==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    );
    socket.write_all(request.as_bytes()).unwrap();
    let mut head = Vec::new();
    let mut byte = [0];
    while !head.ends_with(b"\r\n\r\n") {
        socket.read_exact(&mut byte).unwrap();
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head);
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    socket
}

/// Sends one text frame, masked.
fn send(socket: &mut TcpStream, payload: &[u8]) {
    let mask = rand::random::<[u8; 4]>();
    let mut frame = vec![0x81];
    match payload.len() {
        len @ 0..126 => frame.push(0x80 | u8::try_from(len).unwrap()),
        len @ 126..65_536 => {
            frame.push(0x80 | 0x7e);
            frame.extend(u16::try_from(len).unwrap().to_be_bytes());
        }
        len => {
            frame.push(0x80 | 0x7f);
            frame.extend((len as u64).to_be_bytes());
        }
    }
    frame.extend(mask);
    frame.extend(payload.iter().zip(mask.iter().cycle()).map(|(b, m)| b ^ m));
    socket.write_all(&frame).unwrap();
}

/// Receives one whole message (its frames joined); answers pings, panics on a close.
fn receive(socket: &mut TcpStream) -> Vec<u8> {
    let mut message = Vec::new();
    loop {
        let mut head = [0; 2];
        socket.read_exact(&mut head).unwrap();
        let (fin, opcode) = (head[0] & 0x80 != 0, head[0] & 0x0f);
        let len = match head[1] & 0x7f {
            126 => {
                let mut len = [0; 2];
                socket.read_exact(&mut len).unwrap();
                u64::from(u16::from_be_bytes(len))
            }
            127 => {
                let mut len = [0; 8];
                socket.read_exact(&mut len).unwrap();
                u64::from_be_bytes(len)
            }
            len => u64::from(len),
        };
        let mut payload = vec![0; usize::try_from(len).unwrap()];
        socket.read_exact(&mut payload).unwrap();
        match opcode {
            0x8 => panic!("the browser closed the DevTools connection"),
            0x9 => {
                let mut pong = vec![0x8a, 0x80];
                pong.extend([0; 4]);
                socket.write_all(&pong).unwrap();
            }
            _ => {
                message.extend(payload);
                if fin {
                    return message;
                }
            }
        }
    }
}
