//! What one node says of the cluster, over a plain connection for cluster administration: its
//! masters, and a one-node cluster made of a single server.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Cluster start-up, a failover and a slot move each finish well within this.
pub(super) const SETTLE: Duration = Duration::from_secs(60);

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
pub(super) fn parse_masters(nodes: &str) -> Vec<Master> {
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
