//! A local Redis Cluster of the test's own: 3 masters and 3 replicas on free loopback ports.
//!
//! [`RedisCluster`] starts the nodes (`process`), joins them and waits on them; [`SlotMove`]
//! moves a slot between its masters; `admin` holds what one node says of the cluster.

mod admin;
mod process;
mod slot_move;

use std::collections::HashMap;
use std::fmt::Write as _;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use super::tls::PrivateCa;

pub use admin::{Master, masters_seen_by, node, serve_every_slot};
pub use slot_move::SlotMove;

use admin::{SETTLE, parse_masters};
use process::Node;

/// How long the cluster waits before it declares a silent node failed, unless told otherwise.
/// Generous, so that a starved machine does not fail over on its own in the middle of a test.
pub const DEFAULT_NODE_TIMEOUT: Duration = Duration::from_secs(5);

const NODES: usize = 6;

/// Six `redis-server --cluster-enabled yes` processes joined by `redis-cli --cluster create
/// --cluster-replicas 1`, each with its own temporary directory and persistence off; killed
/// and cleaned up when dropped.
pub struct RedisCluster {
    nodes: Vec<Node>,
}

impl RedisCluster {
    /// A cluster with [`DEFAULT_NODE_TIMEOUT`], ready: every node says `cluster_state:ok` and
    /// every replica is in sync with its master.
    pub fn start() -> Self {
        Self::start_with_node_timeout(DEFAULT_NODE_TIMEOUT)
    }

    /// A cluster whose nodes declare a silent peer failed after `node_timeout`.
    pub fn start_with_node_timeout(node_timeout: Duration) -> Self {
        Self::start_nodes(node_timeout, None)
    }

    /// A cluster whose nodes also serve TLS with `ca`'s server certificate, and talk to each
    /// other over TLS (`tls-cluster yes`): a client on a TLS port is told the other nodes'
    /// TLS ports. The plain ports stay open for the helpers and the assertions.
    pub fn start_tls(ca: &PrivateCa) -> Self {
        Self::start_nodes(DEFAULT_NODE_TIMEOUT, Some(ca))
    }

    fn start_nodes(node_timeout: Duration, tls: Option<&PrivateCa>) -> Self {
        let nodes: Vec<Node> = (0..NODES).map(|_| Node::spawn(node_timeout, tls)).collect();
        let cluster = Self { nodes };
        let addresses: Vec<String> = cluster
            .nodes
            .iter()
            .map(|node| format!("127.0.0.1:{}", node.port))
            .collect();
        let created = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addresses)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdin(Stdio::null())
            .output();
        let created = match created {
            Ok(output) => output,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => panic!(
                "redis-cli is not installed; the README's test command installs it (apt-get install -y redis-tools)"
            ),
            Err(err) => panic!("cannot run redis-cli: {err}"),
        };
        assert!(
            created.status.success(),
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&created.stdout),
            String::from_utf8_lossy(&created.stderr)
        );
        cluster.wait_until("the cluster forms", |cluster| cluster.is_ready(&[]));
        cluster
    }

    /// One cluster shared by the tests of a binary that are running at the same time; the
    /// last one to drop its handle stops it. Tests that share it keep apart by namespace.
    pub fn shared() -> Arc<Self> {
        static SHARED: Mutex<Weak<RedisCluster>> = Mutex::new(Weak::new());
        let mut shared = SHARED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(cluster) = shared.upgrade() {
            return cluster;
        }
        let cluster = Arc::new(Self::start());
        *shared = Arc::downgrade(&cluster);
        cluster
    }

    /// The ports of the nodes still running.
    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|node| node.port).collect()
    }

    /// Seed URLs of every running node.
    pub fn urls(&self) -> Vec<String> {
        self.ports()
            .into_iter()
            .map(|port| format!("redis://127.0.0.1:{port}"))
            .collect()
    }

    /// `rediss://` seed URLs of every running node, on a cluster started with
    /// [`start_tls`](Self::start_tls).
    pub fn tls_urls(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|node| {
                let port = node.tls_port.expect("a cluster started with `start_tls`");
                format!("rediss://127.0.0.1:{port}")
            })
            .collect()
    }

    /// A store on this cluster under `namespace`.
    pub async fn store_in(&self, namespace: &str) -> idempotask_redis::RedisClusterStore {
        idempotask_redis::RedisClusterStore::builder(self.urls())
            .namespace(namespace)
            .connect()
            .await
            .unwrap()
    }

    /// A store under a namespace of its own, so that tests sharing the cluster never meet.
    pub async fn fresh_store(&self) -> idempotask_redis::RedisClusterStore {
        self.store_in(&format!("t{:016x}", rand::random::<u64>()))
            .await
    }

    /// A plain cluster connection for assertions next to the store (no response timeout, so
    /// blocking commands work).
    pub async fn connection(&self) -> redis::cluster_async::ClusterConnection {
        redis::cluster::ClusterClient::new(self.urls())
            .unwrap()
            .get_async_connection()
            .await
            .unwrap()
    }

    /// The masters, as the first running node sees them.
    pub fn masters(&self) -> Vec<Master> {
        masters_seen_by(self.nodes[0].port)
    }

    /// The hash slot of `key`, from `CLUSTER KEYSLOT`.
    pub fn slot_of(&self, key: &str) -> u16 {
        redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query(&mut node(self.nodes[0].port))
            .unwrap()
    }

    /// `kill -9` of the node on `port`; it stays down. Answers the node's id.
    pub fn kill(&mut self, port: u16) -> String {
        let id: String = redis::cmd("CLUSTER")
            .arg("MYID")
            .query(&mut node(port))
            .unwrap();
        let index = self
            .nodes
            .iter()
            .position(|node| node.port == port)
            .expect("a node of this cluster");
        drop(self.nodes.remove(index));
        id
    }

    /// Waits until a replica took over from the killed master `id` and every running node says
    /// `cluster_state:ok` again.
    pub fn wait_for_failover(&self, id: &str) {
        self.wait_until("a replica takes over", |cluster| cluster.is_ready(&[id]));
    }

    /// Polls `ready` until it holds, panicking with `what` after a minute.
    pub fn wait_until(&self, what: &str, ready: impl Fn(&Self) -> bool) {
        let deadline = Instant::now() + SETTLE;
        while !ready(self) {
            assert!(
                Instant::now() < deadline,
                "timed out waiting until {what}; the nodes' views:\n{}",
                self.describe()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Every running node knows every master's current config epoch, the one the master
    /// reports for itself.
    ///
    /// A manual slot move bumps the importing master's epoch "without consensus", to one above
    /// the highest it knows of. If it has not heard of the last bump yet, the new epoch collides
    /// with another master's, the collision is resolved by bumping one of the two, and that can
    /// hand the slot back to its old owner half-way through the move: a slot no node serves. So
    /// a move starts only once the epochs have spread everywhere.
    pub fn epochs_agree(&self) -> bool {
        let views: Option<Vec<String>> = self
            .ports()
            .into_iter()
            .map(|port| {
                let mut conn = redis::Client::open(format!("redis://127.0.0.1:{port}"))
                    .and_then(|client| client.get_connection_with_timeout(Duration::from_secs(1)))
                    .ok()?;
                redis::cmd("CLUSTER").arg("NODES").query(&mut conn).ok()
            })
            .collect();
        let Some(views) = views else {
            return false;
        };
        // (node id, flags, config epoch) of every line of every view.
        let lines = |view: &String| -> Vec<(String, String, String)> {
            view.lines()
                .filter_map(|line| {
                    let fields: Vec<&str> = line.split(' ').collect();
                    let [id, _, flags, _, _, _, epoch, ..] = fields.as_slice() else {
                        return None;
                    };
                    Some(((*id).to_owned(), (*flags).to_owned(), (*epoch).to_owned()))
                })
                .collect()
        };
        let own: HashMap<String, String> = views
            .iter()
            .flat_map(lines)
            .filter(|(_, flags, _)| flags.contains("myself") && flags.contains("master"))
            .map(|(id, _, epoch)| (id, epoch))
            .collect();
        views
            .iter()
            .flat_map(lines)
            .all(|(id, _, epoch)| own.get(&id).is_none_or(|truth| *truth == epoch))
    }

    /// `CLUSTER NODES` as every running node answers it, for a failure message.
    fn describe(&self) -> String {
        let mut views = String::new();
        for port in self.ports() {
            let nodes = redis::Client::open(format!("redis://127.0.0.1:{port}"))
                .and_then(|client| client.get_connection_with_timeout(Duration::from_secs(1)))
                .and_then(|mut conn| {
                    redis::cmd("CLUSTER")
                        .arg("NODES")
                        .query::<String>(&mut conn)
                })
                .unwrap_or_else(|err| format!("unreachable: {err}\n"));
            let _ = writeln!(views, "-- node {port}:\n{}", nodes.trim_end());
        }
        views
    }

    /// Every running node sees every slot served by a master that is up, says
    /// `cluster_state:ok`, and every running replica is in sync. `failed` are node ids that
    /// must be flagged as failed (and own no slots) everywhere.
    fn is_ready(&self, failed: &[&str]) -> bool {
        self.nodes.iter().all(|node| {
            let Ok(mut conn) = redis::Client::open(format!("redis://127.0.0.1:{}", node.port))
                .and_then(|client| client.get_connection_with_timeout(Duration::from_secs(1)))
            else {
                return false;
            };
            let info: String = match redis::cmd("CLUSTER").arg("INFO").query(&mut conn) {
                Ok(info) => info,
                Err(_) => return false,
            };
            let nodes: String = match redis::cmd("CLUSTER").arg("NODES").query(&mut conn) {
                Ok(nodes) => nodes,
                Err(_) => return false,
            };
            let replication: String = match redis::cmd("INFO").arg("replication").query(&mut conn) {
                Ok(replication) => replication,
                Err(_) => return false,
            };
            let masters = parse_masters(&nodes);
            let slots: u32 = masters
                .iter()
                .flat_map(|m| &m.slots)
                .map(|&(lo, hi)| u32::from(hi - lo) + 1)
                .sum();
            let failed_flagged = failed.iter().all(|id| {
                nodes.lines().any(|line| {
                    let mut fields = line.split(' ');
                    fields.next() == Some(id)
                        && fields.nth(1).is_some_and(|flags| flags.contains("fail"))
                })
            });
            info.contains("cluster_state:ok")
                && slots == 16384
                && failed_flagged
                && !masters.iter().any(|m| failed.contains(&m.id.as_str()))
                && (replication.contains("role:master")
                    || replication.contains("master_link_status:up"))
        })
    }
}
