//! The servers a benchmark script measures, started the way the tests start theirs (free
//! loopback ports, persistence off, a directory of their own), and stopped when this process's
//! standard input closes, its parent (the script) is gone, or it gets SIGINT, SIGTERM or SIGHUP.
//! The `scripts/bench*.sh` scripts start it through `scripts/bench-start-servers.sh` with its
//! standard input a pipe they hold, so the servers end with the script. A binary of this crate
//! rather than of `idempotask-bench`: `bench/http-compare`, outside the workspace, builds on
//! the bench's library, and would otherwise build the test servers' crate too.
//!
//! ```text
//! servers redis|valkey|redis8|cluster|nats|rabbitmq|moto|tansu|postgres [SETTING=VALUE …] …
//! ```
//!
//! `redis`, `valkey` and `redis8` are one server of that program; `cluster` is 3 masters and 3
//! replicas; `postgres` is a PostgreSQL server, with the `SETTING=VALUE` arguments after it as
//! its `-c` settings (they override the tests' `fsync=off` and `full_page_writes=off`). Once
//! every server answers, it prints `name=value` lines for a shell's `declare`, then `ready`:
//!
//! - `<server>_url`, `<server>_port`, `<server>_pid` for `redis`, `valkey` and `redis8`;
//! - `cluster_urls`, the nodes' URLs separated by commas (the bench's `--redis-url`);
//! - `postgres_url`, and `postgres_log`, the file its log goes to;
//! - `nats_url` (a `nats-server -js`), `amqp_url` (a RabbitMQ broker, as `guest`),
//!   `sqs_url` (a `moto_server`'s endpoint, for an SQS client) and `kafka_url` (a tansu
//!   broker's `bootstrap.servers`).

use std::io::Write;
use std::process::ExitCode;

use idempotask_test_support::cluster::RedisCluster;
use idempotask_test_support::moto::MotoServer;
use idempotask_test_support::nats::NatsServer;
use idempotask_test_support::postgres::PostgresServer;
use idempotask_test_support::rabbitmq::RabbitServer;
use idempotask_test_support::tansu::TansuServer;
use idempotask_test_support::{Flavor, RedisServer};
use tokio::signal::unix::{SignalKind, signal};

/// A server started for the script; each stops when dropped.
enum Server {
    Single(&'static str, RedisServer),
    Cluster(RedisCluster),
    Postgres(PostgresServer),
    Nats(NatsServer),
    Rabbit(RabbitServer),
    Moto(MotoServer),
    Tansu(TansuServer),
}

impl Server {
    /// The `name=value` lines that tell the script where the server is.
    fn lines(&self) -> Vec<String> {
        match self {
            Self::Single(name, server) => vec![
                format!("{name}_url={}", server.url()),
                format!("{name}_port={}", server.port()),
                format!("{name}_pid={}", server.pid()),
            ],
            Self::Cluster(cluster) => vec![format!("cluster_urls={}", cluster.urls().join(","))],
            Self::Postgres(server) => vec![
                format!("postgres_url={}", server.url()),
                format!("postgres_log={}", server.log_path().display()),
            ],
            Self::Nats(server) => vec![format!("nats_url={}", server.url())],
            Self::Rabbit(server) => vec![format!("amqp_url={}", server.url())],
            Self::Moto(server) => vec![format!("sqs_url={}", server.endpoint())],
            Self::Tansu(server) => vec![format!("kafka_url={}", server.bootstrap_servers())],
        }
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.is_empty() {
        eprintln!(
            "usage: servers redis|valkey|redis8|cluster|nats|rabbitmq|moto|tansu|postgres [SETTING=VALUE …] …"
        );
        return ExitCode::from(2);
    }
    // Started one after the other; a server that does not come up panics, and the unwinding
    // drops (stops) those already started.
    let mut servers = Vec::new();
    let mut args = args.iter().peekable();
    while let Some(arg) = args.next() {
        servers.push(match arg.as_str() {
            "redis" => Server::Single("redis", RedisServer::start()),
            "valkey" => Server::Single("valkey", RedisServer::start_flavor(Flavor::Valkey, &[])),
            "redis8" => Server::Single("redis8", RedisServer::start_flavor(Flavor::Redis8, &[])),
            "cluster" => Server::Cluster(RedisCluster::start()),
            "nats" => Server::Nats(NatsServer::start()),
            "rabbitmq" => Server::Rabbit(RabbitServer::start()),
            "moto" => Server::Moto(MotoServer::start()),
            "tansu" => Server::Tansu(TansuServer::start()),
            "postgres" => {
                let mut settings = Vec::new();
                while let Some(setting) = args.next_if(|arg| arg.contains('=')) {
                    settings.push(setting.as_str());
                }
                Server::Postgres(PostgresServer::start_with(&settings))
            }
            other => {
                eprintln!("servers: unknown server `{other}`");
                return ExitCode::from(2);
            }
        });
    }
    let mut stdout = std::io::stdout().lock();
    for line in servers.iter().flat_map(Server::lines) {
        let _ = writeln!(stdout, "{line}");
    }
    let _ = writeln!(stdout, "ready");
    let _ = stdout.flush();
    if let Err(err) = until_told_to_stop() {
        eprintln!("servers: cannot wait for a signal: {err}");
        return ExitCode::FAILURE;
    }
    drop(servers);
    ExitCode::SUCCESS
}

/// How often the parent is looked for.
const PARENT_CHECK: std::time::Duration = std::time::Duration::from_millis(500);

/// Returns when standard input reaches its end (the script closed it, or exited), the parent
/// process is gone, or a SIGINT, SIGTERM or SIGHUP arrives.
fn until_told_to_stop() -> std::io::Result<()> {
    // The script's children (a bench run, a backgrounded server) inherit the pipe's write end,
    // so a script killed with SIGKILL may leave it open; the parent going away, which makes
    // this process an orphan of another parent, is the sign that nothing holds the servers.
    let parent = std::os::unix::process::parent_id();
    let (closed, stdin_closed) = tokio::sync::oneshot::channel::<()>();
    // A thread of its own: a blocking read cannot be cancelled, and this one need not be, as
    // the process exits once the servers are stopped.
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
        let _ = closed.send(());
    });
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let mut interrupt = signal(SignalKind::interrupt())?;
        let mut terminate = signal(SignalKind::terminate())?;
        let mut hangup = signal(SignalKind::hangup())?;
        let orphaned = async {
            while std::os::unix::process::parent_id() == parent {
                tokio::time::sleep(PARENT_CHECK).await;
            }
        };
        tokio::select! {
            _ = stdin_closed => {}
            () = orphaned => {}
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
            _ = hangup.recv() => {}
        }
        Ok(())
    })
}
