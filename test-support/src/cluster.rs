//! A local Redis Cluster of the test's own: 3 masters and 3 replicas on free loopback ports.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use super::tls::PrivateCa;
use super::{free_port, spawn};

/// How long the cluster waits before it declares a silent node failed, unless told otherwise.
/// Generous, so that a starved machine does not fail over on its own in the middle of a test.
pub const DEFAULT_NODE_TIMEOUT: Duration = Duration::from_secs(5);

const NODES: usize = 6;
/// Cluster start-up, a failover and a slot move each finish well within this.
const SETTLE: Duration = Duration::from_secs(60);

/// Six `redis-server --cluster-enabled yes` processes joined by `redis-cli --cluster create
/// --cluster-replicas 1`, each with its own temporary directory and persistence off; killed
/// and cleaned up when dropped.
pub struct RedisCluster {
    nodes: Vec<Node>,
}

struct Node {
    child: Child,
    port: u16,
    /// The node's TLS port, on a cluster started with [`RedisCluster::start_tls`].
    tls_port: Option<u16>,
    dir: PathBuf,
}

/// One master as `CLUSTER NODES` shows it.
#[derive(Debug, Clone)]
pub struct Master {
    /// The node's cluster id.
    pub id: String,
    /// The node's port.
    pub port: u16,
    /// Slot ranges, both ends included.
    pub slots: Vec<(u16, u16)>,
    /// The ids of its replicas.
    pub replicas: Vec<String>,
}

impl Master {
    /// Whether this master serves `slot`.
    pub fn owns(&self, slot: u16) -> bool {
        self.slots.iter().any(|&(lo, hi)| (lo..=hi).contains(&slot))
    }
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

/// A slot on its way from one master to the next (by port), moved the way `redis-cli --cluster
/// reshard` does it.
pub struct SlotMove {
    /// The slot being moved.
    pub slot: u16,
    /// The master that gives it up.
    pub source: Master,
    /// The master that takes it.
    pub target: Master,
    /// How many keys `MIGRATE` moved.
    pub keys_moved: usize,
}

impl SlotMove {
    /// The first half: `IMPORTING` on the target, `MIGRATING` on the source, then `MIGRATE` of
    /// every key. The slot still belongs to the source; reads of its keys are answered with
    /// `ASK`. Starts only once every node knows every master's config epoch (see
    /// [`RedisCluster::epochs_agree`]).
    pub fn start(cluster: &RedisCluster, slot: u16) -> Self {
        cluster.wait_until(
            "every node knows every master's config epoch",
            RedisCluster::epochs_agree,
        );
        let masters = cluster.masters();
        let from = masters
            .iter()
            .position(|m| m.owns(slot))
            .expect("the slot's owner");
        let (source, target) = (
            masters[from].clone(),
            masters[(from + 1) % masters.len()].clone(),
        );
        let (mut src, mut dst) = (node(source.port), node(target.port));
        setslot(&mut dst, slot, "IMPORTING", &source.id);
        setslot(&mut src, slot, "MIGRATING", &target.id);
        let mut keys_moved = 0;
        loop {
            let keys: Vec<String> = redis::cmd("CLUSTER")
                .arg("GETKEYSINSLOT")
                .arg(slot)
                .arg(100)
                .query(&mut src)
                .unwrap();
            if keys.is_empty() {
                break;
            }
            // No REPLACE: a key already on the target would mean a script wrote to both sides.
            let _: redis::Value = redis::cmd("MIGRATE")
                .arg("127.0.0.1")
                .arg(target.port)
                .arg("")
                .arg(0)
                .arg(5000)
                .arg("KEYS")
                .arg(&keys)
                .query(&mut src)
                .unwrap();
            keys_moved += keys.len();
        }
        Self {
            slot,
            source,
            target,
            keys_moved,
        }
    }

    /// The second half: `NODE` on the target, the source and every other master, then waits
    /// until every node sees the target own the slot. Answers how many keys moved.
    pub fn finish(self, cluster: &RedisCluster) -> usize {
        setslot(
            &mut node(self.target.port),
            self.slot,
            "NODE",
            &self.target.id,
        );
        setslot(
            &mut node(self.source.port),
            self.slot,
            "NODE",
            &self.target.id,
        );
        for other in cluster
            .masters()
            .iter()
            .filter(|m| m.id != self.source.id && m.id != self.target.id)
        {
            setslot(&mut node(other.port), self.slot, "NODE", &self.target.id);
        }
        cluster.wait_until("every node sees the slot moved", |cluster| {
            cluster.ports().into_iter().all(|port| {
                masters_seen_by(port)
                    .iter()
                    .any(|m| m.id == self.target.id && m.owns(self.slot))
            })
        });
        self.keys_moved
    }
}

fn setslot(conn: &mut redis::Connection, slot: u16, state: &str, id: &str) {
    let () = redis::cmd("CLUSTER")
        .arg("SETSLOT")
        .arg(slot)
        .arg(state)
        .arg(id)
        .query(conn)
        .unwrap();
}

impl Node {
    fn spawn(node_timeout: Duration, tls: Option<&PrivateCa>) -> Self {
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

/// The masters as the node on `port` sees them (failed ones left out).
pub fn masters_seen_by(port: u16) -> Vec<Master> {
    let nodes: String = redis::cmd("CLUSTER")
        .arg("NODES")
        .query(&mut node(port))
        .unwrap();
    parse_masters(&nodes)
}

/// Makes the server on `port`, started with `--cluster-enabled yes`, a cluster of one master
/// that serves every slot and names itself at `announced_port`, and waits until it says
/// `cluster_state:ok`.
///
/// A cluster client connects to the addresses the nodes give for themselves: announcing the
/// port of a [`Proxy`](crate::proxy::Proxy) in front of the node sends every command of the
/// client through that proxy, so that a test can lose the reply to one of them.
pub fn serve_every_slot(port: u16, announced_port: u16) {
    let mut conn = node(port);
    let () = redis::cmd("CLUSTER")
        .arg("ADDSLOTSRANGE")
        .arg(0)
        .arg(16383)
        .query(&mut conn)
        .unwrap();
    for (name, value) in [
        ("cluster-announce-ip", "127.0.0.1".to_owned()),
        ("cluster-announce-port", announced_port.to_string()),
    ] {
        let () = redis::cmd("CONFIG")
            .arg("SET")
            .arg(name)
            .arg(value)
            .query(&mut conn)
            .unwrap();
    }
    let deadline = Instant::now() + SETTLE;
    loop {
        let info: String = redis::cmd("CLUSTER").arg("INFO").query(&mut conn).unwrap();
        if info.contains("cluster_state:ok") {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "a one-node cluster did not come up:\n{info}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A plain connection to the node on `port`, for cluster administration.
pub fn node(port: u16) -> redis::Connection {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).unwrap();
    let connection = client
        .get_connection_with_timeout(Duration::from_secs(5))
        .unwrap();
    connection
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    connection
}

/// The masters in a `CLUSTER NODES` reply that are not flagged as failed.
fn parse_masters(nodes: &str) -> Vec<Master> {
    let mut masters = Vec::new();
    let mut replicas: HashMap<String, Vec<String>> = HashMap::new();
    for line in nodes.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let [id, address, flags, master, _, _, _, _, slots @ ..] = fields.as_slice() else {
            continue;
        };
        if flags.contains("fail") && !flags.contains("fail?") {
            continue;
        }
        if flags.contains("slave") {
            replicas
                .entry((*master).to_owned())
                .or_default()
                .push((*id).to_owned());
            continue;
        }
        if !flags.contains("master") {
            continue;
        }
        let port = address
            .split(['@', ','])
            .next()
            .and_then(|host_port| host_port.rsplit_once(':'))
            .and_then(|(_, port)| port.parse().ok())
            .unwrap_or(0);
        let slots = slots
            .iter()
            // `[slot->-id]` and `[slot-<-id]` are slots being migrated or imported.
            .filter(|range| !range.starts_with('['))
            .filter_map(|range| match range.split_once('-') {
                Some((lo, hi)) => Some((lo.parse().ok()?, hi.parse().ok()?)),
                None => range.parse().ok().map(|slot| (slot, slot)),
            })
            .collect();
        masters.push(Master {
            id: (*id).to_owned(),
            port,
            slots,
            replicas: Vec::new(),
        });
    }
    for master in &mut masters {
        master.replicas = replicas.remove(&master.id).unwrap_or_default();
    }
    masters.retain(|master| !master.slots.is_empty());
    masters.sort_by_key(|master| master.port);
    masters
}
