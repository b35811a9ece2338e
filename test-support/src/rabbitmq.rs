//! A RabbitMQ broker of the test's own, on free loopback ports, stopped when dropped or when the
//! test process exits.
//!
//! Each broker is a private Erlang node: its own node name, AMQP port, distribution port and
//! `epmd` port, and a temporary directory holding its database, logs, pid file, configuration
//! and Erlang cookie (`HOME`), so brokers of tests running in parallel never meet, nor meet a
//! system broker or a leftover `epmd` on 4369. It runs as whoever runs the tests (root in CI).
//!
//! A broker takes seconds to boot: a test binary whose tests can keep to their own queues
//! shares one through [`RabbitServer::shared`].

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::free_port;

/// Debian's `rabbitmq-server` package puts the real start script here; `/usr/sbin`'s wrapper
/// switches to the `rabbitmq` user and its fixed directories, which a private node must avoid.
const SERVER: &str = "/usr/lib/rabbitmq/bin/rabbitmq-server";

/// How long a broker may take to accept AMQP connections (seconds on an idle machine, more on a
/// machine shared by several builds).
const BOOT_TIMEOUT: Duration = Duration::from_secs(120);

/// The shell that owns the broker: it starts `epmd` and the node in its own process group, and
/// once its standard input closes (the drop, or the exit of the test process however it ends)
/// kills everything in that group and removes the broker's directory.
const SUPERVISOR: &str = r#"
epmd -port "$ERL_EPMD_PORT" -address 127.0.0.1 >"$BROKER_DIR/epmd.log" 2>&1 &
epmd=$!
(
  "$RABBITMQ_SERVER" >"$BROKER_DIR/server.log" 2>&1
  echo "$?" >"$BROKER_DIR/exited"
) &
cat >/dev/null
trap '' TERM
kill -KILL "$(cat "$RABBITMQ_PID_FILE" 2>/dev/null)" 2>/dev/null
kill -TERM 0
kill -KILL "$epmd" 2>/dev/null
wait
rm -rf "$BROKER_DIR"
"#;

/// A RabbitMQ node of the test's own, with the default `guest` user, on `127.0.0.1`.
pub struct RabbitServer {
    supervisor: Child,
    stdin: Option<ChildStdin>,
    port: u16,
    dir: PathBuf,
}

impl RabbitServer {
    /// Starts a broker and waits until it accepts AMQP connections. Panics with a clear message
    /// when `rabbitmq-server` is not installed: the suite never skips RabbitMQ tests.
    pub fn start() -> Self {
        assert!(
            Path::new(SERVER).exists(),
            "{SERVER} is missing: RabbitMQ is not installed; the README's test command (scripts/test.sh) installs it (apt-get install -y rabbitmq-server)"
        );
        let mut last_error = String::new();
        // A free port can be taken by someone else between probing and binding: try again.
        for _ in 0..3 {
            match Self::spawn() {
                Ok(server) => return server,
                Err(err) => last_error = err,
            }
        }
        panic!("rabbitmq-server did not come up: {last_error}");
    }

    /// One broker for the whole test binary, started by the first test that asks. It is stopped
    /// when the test process exits (statics are not dropped; its supervisor sees its standard
    /// input close).
    pub fn shared() -> &'static Self {
        static SHARED: OnceLock<RabbitServer> = OnceLock::new();
        SHARED.get_or_init(Self::start)
    }

    fn spawn() -> Result<Self, String> {
        let port = free_port();
        let dir =
            std::env::temp_dir().join(format!("idempotask-rabbitmq-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create the broker's directory");
        write_config(&dir, port);
        let node = format!("idempotask-{}-{port}@localhost", std::process::id());
        let mut command = Command::new("sh");
        command
            .args(["-c", SUPERVISOR])
            .env("BROKER_DIR", &dir)
            .env("RABBITMQ_SERVER", SERVER)
            .env("HOME", &dir)
            .env("ERL_EPMD_PORT", free_port().to_string())
            .env("ERL_EPMD_ADDRESS", "127.0.0.1")
            .env("RABBITMQ_NODENAME", &node)
            .env("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1")
            .env("RABBITMQ_NODE_PORT", port.to_string())
            .env("RABBITMQ_DIST_PORT", free_port().to_string())
            .env("RABBITMQ_MNESIA_BASE", dir.join("mnesia"))
            .env("RABBITMQ_LOG_BASE", dir.join("log"))
            .env("RABBITMQ_PID_FILE", dir.join("pid"))
            .env("RABBITMQ_CONFIG_FILE", dir.join("rabbitmq.conf"))
            .env("RABBITMQ_ADVANCED_CONFIG_FILE", dir.join("advanced.config"))
            .env("RABBITMQ_ENABLED_PLUGINS_FILE", dir.join("enabled_plugins"))
            .env("RABBITMQ_CONF_ENV_FILE", dir.join("rabbitmq-env.conf"))
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // Its own process group, so that the supervisor's `kill 0` reaches the node and `epmd`
        // and nothing of the test's.
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let mut supervisor = command
            .spawn()
            .unwrap_or_else(|err| panic!("cannot start the RabbitMQ supervisor shell: {err}"));
        let stdin = supervisor.stdin.take();
        let mut server = Self {
            supervisor,
            stdin,
            port,
            dir,
        };
        let deadline = Instant::now() + BOOT_TIMEOUT;
        while Instant::now() < deadline {
            if server.dir.join("exited").exists() {
                return Err(format!("the broker exited:\n{}", server.log_tail()));
            }
            if amqp_ready(port) {
                return Ok(server);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let tail = server.log_tail();
        server.stop();
        Err(format!(
            "the broker did not accept AMQP connections within {} s:\n{tail}",
            BOOT_TIMEOUT.as_secs()
        ))
    }

    /// The AMQP port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `amqp://guest:guest@127.0.0.1:<port>/%2f`: the default virtual host, as `guest`.
    pub fn url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.port)
    }

    /// The last lines of the broker's output, for a failure message.
    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    fn stop(&mut self) {
        drop(self.stdin.take());
        let _ = self.supervisor.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Drop for RabbitServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The node's configuration: AMQP on loopback only, no console logging, no plugins, and a disk
/// alarm that a nearly full test machine does not trip (it would block every publisher).
fn write_config(dir: &Path, port: u16) {
    let config = format!(
        "listeners.tcp.default = 127.0.0.1:{port}\n\
         log.console = false\n\
         log.file.level = warning\n\
         disk_free_limit.absolute = 1MB\n"
    );
    std::fs::write(dir.join("rabbitmq.conf"), config).expect("write rabbitmq.conf");
    std::fs::write(dir.join("enabled_plugins"), "[].\n").expect("write enabled_plugins");
    std::fs::write(dir.join("rabbitmq-env.conf"), "").expect("write rabbitmq-env.conf");
}

/// Whether the broker answers the AMQP 0-9-1 protocol header with a `connection.start` frame
/// (a method frame, type 1, on channel 0): the listener is up and the node is serving.
fn amqp_ready(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect((Ipv4Addr::LOCALHOST, port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let mut frame = [0_u8; 3];
    stream.write_all(b"AMQP\x00\x00\x09\x01").is_ok()
        && stream.read_exact(&mut frame).is_ok()
        && frame == [1, 0, 0]
}
