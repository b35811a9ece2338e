//! `list`: one task's keys, found with SCAN (never KEYS) on every server that holds keys.
//!
//! A standalone server holds them all. On Redis Cluster a task's keys spread over every slot, so
//! the listing runs [`list_node`] on each master and merges the listings with
//! [`Listing::merge`].

use std::collections::BTreeMap;

use idempotask::store::redis::KeyKind;
use idempotask::{Marker, RedisKeys};
use redis::aio::ConnectionManager;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{Pipeline, RedisError, Value};
use serde::Serialize;

use crate::render::result_json;
use crate::time::rfc3339;

/// How many keys one SCAN call looks at, and how many units one pipeline describes.
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

    /// Input: the key stems of some units (their keys without `:lock` or `:done`). Output:
    /// `GET done`, `PTTL done`, `PTTL lock` of each unit, in order.
    async fn describe(&mut self, stems: &[&str]) -> Result<Vec<Value>, RedisError> {
        fn ask(pipe: &mut Pipeline, stem: &str) {
            let (lock, done) = (format!("{stem}:lock"), format!("{stem}:done"));
            pipe.cmd("GET")
                .arg(&done)
                .cmd("PTTL")
                .arg(&done)
                .cmd("PTTL")
                .arg(&lock);
        }
        match self {
            Self::Server(connection) => {
                let mut pipe = redis::pipe();
                for stem in stems {
                    ask(&mut pipe, stem);
                }
                pipe.query_async(connection).await
            }
            Self::Master { connection, .. } => {
                // Single-key commands, units all in flight at once on the multiplexed
                // connection. The cluster client refuses a pipeline that spans slots. While a
                // slot migrates, a single-key command follows `ASK` (`ASKING` covers one
                // command, not a pipeline), and a command on several keys of the importing
                // master is answered with `TRYAGAIN` whenever one of them is missing there, as a
                // finished unit's lock always is.
                let mut in_flight = tokio::task::JoinSet::new();
                for (index, stem) in stems.iter().enumerate() {
                    let (lock, done) = (format!("{stem}:lock"), format!("{stem}:done"));
                    let mut connection = connection.clone();
                    in_flight.spawn(async move {
                        let mut reply = Vec::with_capacity(3);
                        for (command, key) in [("GET", &done), ("PTTL", &done), ("PTTL", &lock)] {
                            let value: Result<Value, RedisError> = redis::cmd(command)
                                .arg(key)
                                .query_async(&mut connection)
                                .await;
                            match value {
                                Ok(value) => reply.push(value),
                                Err(err) => return (index, Err(err)),
                            }
                        }
                        (index, Ok(reply))
                    });
                }
                let mut replies = vec![Vec::new(); stems.len()];
                while let Some(joined) = in_flight.join_next().await {
                    // Nothing cancels these tasks; a panic in one is a bug to surface as such.
                    let (index, reply) =
                        joined.unwrap_or_else(|err| std::panic::resume_unwind(err.into_panic()));
                    replies[index] = reply?;
                }
                Ok(replies.concat())
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

/// One unit of a task that is done or locked.
#[derive(Debug, Serialize)]
pub(crate) struct Entry {
    /// The plain caller key, read from the marker; locks alone do not know it.
    pub(crate) key: Option<String>,
    /// The SHA-256 of the caller key, as in the Redis keys.
    pub(crate) digest: String,
    pub(crate) done: bool,
    pub(crate) locked: bool,
    pub(crate) completed_at: Option<String>,
    pub(crate) fencing_token: Option<u64>,
    pub(crate) result: Option<serde_json::Value>,
    pub(crate) marker_ttl_ms: Option<u64>,
    pub(crate) lock_ttl_ms: Option<u64>,
    /// Why the marker could not be read, if it could not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<String>,
}

/// What SCAN found for one task.
#[derive(Debug, Default)]
pub(crate) struct Listing {
    /// Done or locked units, by digest.
    pub(crate) entries: BTreeMap<String, Entry>,
    /// Every key of the task, fencing counters of idle units included.
    pub(crate) keys_seen: usize,
}

impl Listing {
    /// Adds another server's listing (a cluster has one per master; slots never overlap).
    ///
    /// While slots move the masters are not scanned at one instant: a unit whose keys move from
    /// a master not scanned yet to one already scanned is missed, and one seen on both sides is
    /// counted once. The README tells operators to list again once a resharding is over.
    pub(crate) fn merge(&mut self, other: Self) {
        self.entries.extend(other.entries);
        self.keys_seen += other.keys_seen;
    }
}

/// Input: one server, the namespace's layout and a task's key pattern. Output: that server's
/// done and locked units of the task, each described by a pipelined `GET`/`PTTL`.
pub(crate) async fn list_node(
    node: &mut Node,
    keys: &RedisKeys,
    pattern: &str,
) -> Result<Listing, RedisError> {
    // digest → (the unit's hash tag part of its keys, done seen, lock seen)
    let mut kinds: BTreeMap<String, (String, bool, bool)> = BTreeMap::new();
    let mut listing = Listing::default();
    let mut cursor: u64 = 0;
    loop {
        let (next, batch) = node.scan(cursor, pattern).await?;
        for key in &batch {
            let Some(parsed) = keys.parse(key) else {
                continue;
            };
            listing.keys_seen += 1;
            let slot = kinds.entry(parsed.digest.to_owned()).or_insert_with(|| {
                // A parsed key ends in `:lock`, `:done` or `:fence`; the rest names the unit.
                let stem = key.rsplit_once(':').map_or("", |(stem, _)| stem);
                (stem.to_owned(), false, false)
            });
            match parsed.kind {
                KeyKind::Done => slot.1 = true,
                KeyKind::Lock => slot.2 = true,
                _ => {}
            }
        }
        if next == 0 {
            break;
        }
        cursor = next;
    }
    let wanted: Vec<(&String, &String)> = kinds
        .iter()
        .filter(|(_, (_, done, locked))| *done || *locked)
        .map(|(digest, (stem, _, _))| (digest, stem))
        .collect();
    for chunk in wanted.chunks(BATCH) {
        let stems: Vec<&str> = chunk.iter().map(|(_, stem)| stem.as_str()).collect();
        let replies = node.describe(&stems).await?;
        for ((digest, _), reply) in chunk.iter().zip(replies.chunks(3)) {
            // A key seen by SCAN may have expired or been finished since.
            let entry = describe(digest, reply);
            if entry.done || entry.locked {
                listing.entries.insert((*digest).clone(), entry);
            }
        }
    }
    Ok(listing)
}

/// Input: a digest and its `GET done`, `PTTL done`, `PTTL lock` replies. Output: its entry.
fn describe(digest: &str, reply: &[Value]) -> Entry {
    let ttl = |value: Option<&Value>| match value {
        Some(Value::Int(ms)) if *ms >= 0 => u64::try_from(*ms).ok(),
        _ => None,
    };
    let lock_ttl_ms = ttl(reply.get(2));
    let mut entry = Entry {
        key: None,
        digest: digest.to_owned(),
        done: false,
        locked: matches!(reply.get(2), Some(Value::Int(ms)) if *ms != -2),
        completed_at: None,
        fencing_token: None,
        result: None,
        marker_ttl_ms: ttl(reply.get(1)),
        lock_ttl_ms,
        error: None,
    };
    if let Some(Value::BulkString(bytes)) = reply.first() {
        entry.done = true;
        match Marker::decode(bytes) {
            Ok(marker) => {
                entry.key = Some(marker.key().to_owned());
                entry.completed_at =
                    Some(rfc3339(crate::time::epoch_millis(marker.completed_at())));
                entry.fencing_token = Some(marker.fencing_token());
                entry.result = Some(result_json(&marker));
            }
            Err(err) => entry.error = Some(err.to_string()),
        }
    }
    entry
}
