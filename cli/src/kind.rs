//! Whether the URL's server is a node of a Redis Cluster or a standalone server.
//!
//! A cluster node answers a plain client too, but only for its own slots, so a wrong guess
//! gives a partial answer that looks complete. The probes need only rights that a worker's ACL
//! user has anyway, and when none of them can tell, the command fails instead of guessing.

use redis::RedisError;
use redis::aio::ConnectionManager;

use crate::exit::{Exit, Failure, redact};

/// The kind of server a URL names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ServerKind {
    Standalone,
    Cluster,
}

/// One way of asking, and what its success means.
struct Probe {
    command: &'static str,
    subcommand: Option<&'static str>,
    /// Whether an answer other than an error proves a cluster. Valkey answers `READWRITE` with
    /// `OK` on a standalone server too; only Redis's refusal of it is telling.
    success_is_cluster: bool,
}

/// `CLUSTER SLOTS` first: `RedisClusterStore` needs it, so a worker's ACL user may run it.
/// `READWRITE` is in `@connection`, which a restricted user usually has.
const PROBES: [Probe; 3] = [
    Probe {
        command: "CLUSTER",
        subcommand: Some("SLOTS"),
        success_is_cluster: true,
    },
    Probe {
        command: "CLUSTER",
        subcommand: Some("INFO"),
        success_is_cluster: true,
    },
    Probe {
        command: "READWRITE",
        subcommand: None,
        success_is_cluster: false,
    },
];

/// Input: a connection to the URL's server. Output: which kind it is, or a failure when the
/// server does not say (every probe refused, typically by the user's ACL rights).
pub(crate) async fn detect(
    connection: &mut ConnectionManager,
    url: &str,
) -> Result<ServerKind, Failure> {
    let mut refusals = Vec::new();
    for probe in &PROBES {
        let mut command = redis::cmd(probe.command);
        if let Some(subcommand) = probe.subcommand {
            command.arg(subcommand);
        }
        let name = match probe.subcommand {
            Some(subcommand) => format!("{} {subcommand}", probe.command),
            None => probe.command.to_owned(),
        };
        let reply: Result<redis::Value, RedisError> = command.query_async(connection).await;
        match reply {
            Ok(_) if probe.success_is_cluster => return Ok(ServerKind::Cluster),
            Ok(_) => refusals.push(format!("`{name}` answered but does not tell")),
            Err(err) if err.is_io_error() || err.is_timeout() || err.is_connection_dropped() => {
                return Err(crate::target::redis_failure(url, "server kind", &err));
            }
            Err(err) if err.to_string().contains("cluster support disabled") => {
                return Ok(ServerKind::Standalone);
            }
            Err(err) => refusals.push(format!("`{name}`: {err}")),
        }
    }
    Err(Failure::new(
        Exit::Error,
        "server_kind",
        format!(
            "cannot tell whether Redis at {} is a cluster node or a standalone server, so a listing could miss keys: {}; grant the user `+cluster|slots` (`RedisClusterStore` needs it too)",
            redact(url),
            refusals.join("; ")
        ),
    ))
}
