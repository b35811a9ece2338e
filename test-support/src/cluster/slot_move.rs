//! A slot moved from one master to the next, in two halves a test can act between.

use super::RedisCluster;
use super::admin::{Master, masters_seen_by, node};

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
