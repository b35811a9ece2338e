//! One `redis-server --cluster-enabled yes` process of a cluster, in a temporary directory of
//! its own; killed and cleaned up when dropped.

use std::path::PathBuf;
use std::process::Child;
use std::time::Duration;

use crate::tls::PrivateCa;
use crate::{free_port, spawn};

pub(super) struct Node {
    child: Child,
    pub(super) port: u16,
    /// The node's TLS port, on a cluster started with
    /// [`RedisCluster::start_tls`](super::RedisCluster::start_tls).
    pub(super) tls_port: Option<u16>,
    dir: PathBuf,
}

impl Node {
    pub(super) fn spawn(node_timeout: Duration, tls: Option<&PrivateCa>) -> Self {
        let mut last_error = String::new();
        // A free port can be taken by someone else between probing and binding: try a few.
        for _ in 0..5 {
            let (port, bus_port) = (free_port(), free_port());
            let dir = std::env::temp_dir()
                .join(format!("idempotask-cluster-{}-{port}", std::process::id()));
            std::fs::create_dir_all(&dir).expect("create the node's directory");
            let tls_port = tls.map(|_| free_port());
            let mut cluster_args: Vec<String> = [
                // Given explicitly: the default, port + 10000, may be above 65535 or taken.
                "--cluster-port",
                &bus_port.to_string(),
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                &node_timeout.as_millis().to_string(),
                // Replicas sync at once instead of after the default 5 s of waiting for company.
                "--repl-diskless-sync-delay",
                "0",
            ]
            .map(str::to_owned)
            .into();
            if let (Some(ca), Some(tls_port)) = (tls, tls_port) {
                cluster_args.extend(ca.redis_args(tls_port));
                cluster_args.extend(
                    ["--tls-cluster", "yes", "--tls-replication", "yes"].map(str::to_owned),
                );
            }
            match spawn("redis-server", port, &dir, &cluster_args) {
                Ok(child) => {
                    return Self {
                        child,
                        port,
                        tls_port,
                        dir,
                    };
                }
                Err(err) => last_error = err,
            }
            let _ = std::fs::remove_dir_all(&dir);
        }
        panic!("a cluster node did not come up: {last_error}");
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        // SIGKILL: the same as `kill -9`, which is also what the failover test wants.
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
