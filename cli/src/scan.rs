//! `list`: one task's keys, found with SCAN (never KEYS) on every server that holds keys.
//!
//! A standalone server holds them all. On Redis Cluster a task's keys spread over every slot, so
//! the listing runs [`list_node`] on each master and merges the listings with
//! [`Listing::merge`].

use std::collections::BTreeMap;

use idempotask_redis::RedisKeys;
use redis::aio::ConnectionManager;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{RedisError, Value};
use serde::Serialize;

use crate::render::result_json;
use crate::stored::{READ, READ_LUA, Read, Stored, belongs_to, preview};
use crate::time::millis;

/// How many keys one SCAN call looks at, and how many units one batch of reads describes.
const BATCH: usize = 1000;

/// One server whose keys SCAN walks.
pub(crate) enum Node {
    /// A standalone server.
    Server(ConnectionManager),
    /// One master of a cluster: SCAN goes to its address (as the cluster client names it); the
    /// commands that describe what it found are routed by key, which lands on the same master
    /// unless a slot moves meanwhile (then the cluster client follows the redirection).
    Master {
        connection: ClusterConnection,
        host: String,
        port: u16,
    },
}

impl Node {
    /// One SCAN step from `cursor`: the next cursor and a page of matching keys.
    async fn scan(&mut self, cursor: u64, pattern: &str) -> Result<(u64, Vec<String>), RedisError> {
        let mut scan = redis::cmd("SCAN");
        scan.arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(BATCH);
        match self {
            Self::Server(connection) => scan.query_async(connection).await,
            Self::Master {
                connection,
                host,
                port,
            } => {
                let address = SingleNodeRoutingInfo::ByAddress {
                    host: host.clone(),
                    port: *port,
                };
                let page = connection
                    .route_command(scan, RoutingInfo::SingleNode(address))
                    .await?;
                Ok(redis::from_redis_value(page)?)
            }
        }
    }

    /// Input: the keys of some units. Output: the read script's reply for each key, in order;
    /// each key is read on its own, so a key of another type is one odd reply, not an error
    /// that fails the batch.
    async fn describe(&mut self, keys: &[&str]) -> Result<Vec<Value>, RedisError> {
        match self {
            Self::Server(connection) => {
                let mut pipe = redis::pipe();
                for key in keys {
                    pipe.cmd("EVAL").arg(READ_LUA).arg(1).arg(*key);
                }
                pipe.query_async(connection).await
            }
            Self::Master { connection, .. } => {
                // Single-key scripts, units all in flight at once on the multiplexed
                // connection: the cluster client refuses a pipeline that spans slots, and while
                // a slot migrates a single command follows `ASK` (`ASKING` covers one command,
                // not a pipeline).
                let mut in_flight = tokio::task::JoinSet::new();
                for (index, key) in keys.iter().enumerate() {
                    let key = (*key).to_owned();
                    let mut connection = connection.clone();
                    in_flight.spawn(async move {
                        let reply: Result<Value, RedisError> =
                            READ.key(&key).invoke_async(&mut connection).await;
                        (index, reply)
                    });
                }
                let mut replies = vec![Value::Nil; keys.len()];
                while let Some(joined) = in_flight.join_next().await {
                    // Nothing cancels these tasks; a panic in one is a bug to surface as such.
                    let (index, reply) =
                        joined.unwrap_or_else(|err| std::panic::resume_unwind(err.into_panic()));
                    replies[index] = reply?;
                }
                Ok(replies)
            }
        }
    }

    /// Whether any key on this server matches `pattern` (SCAN stops at the first).
    pub(crate) async fn has_any(&mut self, pattern: &str) -> Result<bool, RedisError> {
        let mut cursor = 0;
        loop {
            let (next, page) = self.scan(cursor, pattern).await?;
            if !page.is_empty() {
                return Ok(true);
            }
            if next == 0 {
                return Ok(false);
            }
            cursor = next;
        }
    }
}

/// One unit of a task that is done or locked, or a key under the task's pattern that is odd.
#[derive(Debug, Serialize)]
pub(crate) struct Entry {
    /// The plain caller key, read from the marker; locks alone do not know it, and a marker
    /// written for another key does not give its key to this one.
    pub(crate) key: Option<String>,
    /// The digest of the caller key, as in the Redis key.
    pub(crate) digest: String,
    pub(crate) done: bool,
    pub(crate) locked: bool,
    pub(crate) fencing_token: Option<u64>,
    pub(crate) result: Option<serde_json::Value>,
    pub(crate) marker_ttl_ms: Option<u64>,
    pub(crate) lock_ttl_ms: Option<u64>,
    /// For a lock: `false` when it has no expiry (and `lock_ttl_ms` is null).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) lock_expires: Option<bool>,
    /// A stable word for what is wrong with the key: `unreadable`, `key_mismatch`,
    /// `wrong_type`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) problem: Option<&'static str>,
    /// For a `key_mismatch`: the caller key the marker names.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) stored_key: Option<String>,
    /// What is wrong with the key, in words.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<String>,
}

/// What SCAN found for one task.
#[derive(Debug, Default)]
pub(crate) struct Listing {
    /// Done or locked units and odd keys, by digest.
    pub(crate) entries: BTreeMap<String, Entry>,
    /// Every key of the task, released fenced locks included.
    pub(crate) keys_seen: usize,
}

impl Listing {
    /// Adds another server's listing (a cluster has one per master; slots never overlap).
    ///
    /// While slots move the masters are not scanned at one instant: a unit whose key moves from
    /// a master not scanned yet to one already scanned is missed, and one seen on both sides is
    /// counted once. The operations guide (docs/operations.md) tells operators to list again
    /// once a resharding is over.
    pub(crate) fn merge(&mut self, other: Self) {
        self.entries.extend(other.entries);
        self.keys_seen += other.keys_seen;
    }
}

/// Input: one server, the namespace's layout and a task with its key pattern. Output: that
/// server's done and locked units of the task, and its odd keys, each described by one read of
/// its key.
pub(crate) async fn list_node(
    node: &mut Node,
    keys: &RedisKeys,
    task: &str,
    pattern: &str,
) -> Result<Listing, RedisError> {
    // digest → the unit's key
    let mut units: BTreeMap<String, String> = BTreeMap::new();
    let mut listing = Listing::default();
    let mut cursor: u64 = 0;
    loop {
        let (next, batch) = node.scan(cursor, pattern).await?;
        for key in batch {
            let Some(digest) = keys.parse(&key).map(|parsed| parsed.digest.to_owned()) else {
                continue;
            };
            listing.keys_seen += 1;
            units.insert(digest, key);
        }
        if next == 0 {
            break;
        }
        cursor = next;
    }
    let wanted: Vec<(&String, &String)> = units.iter().collect();
    for chunk in wanted.chunks(BATCH) {
        let names: Vec<&str> = chunk.iter().map(|(_, key)| key.as_str()).collect();
        let replies = node.describe(&names).await?;
        for ((digest, _), reply) in chunk.iter().zip(&replies) {
            // A key seen by SCAN may have expired or changed since.
            if let Some(entry) = describe(task, digest, reply) {
                listing.entries.insert((*digest).clone(), entry);
            }
        }
    }
    Ok(listing)
}

/// Input: a task, a digest and the read script's reply for its key. Output: its entry, `None`
/// for a key that holds neither a marker, a lock nor anything odd.
fn describe(task: &str, digest: &str, reply: &Value) -> Option<Entry> {
    let mut entry = Entry {
        key: None,
        digest: digest.to_owned(),
        done: false,
        locked: false,
        fencing_token: None,
        result: None,
        marker_ttl_ms: None,
        lock_ttl_ms: None,
        lock_expires: None,
        problem: None,
        stored_key: None,
        error: None,
    };
    let read = match Read::from_reply(reply) {
        Ok(read) => read,
        Err(why) => {
            entry.problem = Some("unreadable");
            entry.error = Some(why);
            return Some(entry);
        }
    };
    match read.stored {
        Stored::Missing | Stored::Released => return None,
        Stored::Lock { fencing_token, ttl } => {
            entry.locked = true;
            entry.lock_ttl_ms = ttl.map(millis);
            entry.lock_expires = Some(ttl.is_some());
            entry.fencing_token = fencing_token;
        }
        Stored::Marker { ttl, marker, .. } => {
            entry.done = true;
            entry.marker_ttl_ms = ttl.map(millis);
            match marker {
                Ok(marker) if belongs_to(&marker, task, digest) => {
                    entry.key = Some(marker.key().to_owned());
                    entry.fencing_token = marker.fencing_token();
                    entry.result = Some(result_json(&marker));
                }
                Ok(marker) => {
                    entry.problem = Some("key_mismatch");
                    entry.error = Some(format!(
                        "the marker names key `{}`, whose digest is not this key's; a forged value or a digest collision (`status` refuses it, `forget --force` deletes it)",
                        marker.key()
                    ));
                    entry.stored_key = Some(marker.key().to_owned());
                }
                Err(err) => {
                    entry.problem = Some("unreadable");
                    entry.error = Some(format!("unreadable marker: {err}"));
                }
            }
        }
        Stored::Foreign { bytes } => {
            entry.problem = Some("unreadable");
            entry.error = Some(format!(
                "holds {}, which is not idempotask's",
                preview(&bytes)
            ));
        }
        Stored::OtherType(kind) => {
            entry.problem = Some("wrong_type");
            entry.error = Some(format!(
                "a {kind} key; idempotask writes only strings, so something else uses this name"
            ));
        }
    }
    Some(entry)
}
