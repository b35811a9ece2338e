//! For operators: what one unit's key holds, read raw; the compare-and-forget of exactly the
//! bytes an operator was shown; the resolution of a unit in doubt, against exactly the lock an
//! operator was shown; and the listing of one task's units with `SCAN`.
//!
//! [`Store::inspect`](idempotask::store::Store::inspect) answers what a delivery needs and
//! folds away what an operator needs to see: a lock without an expiry reads as one about to
//! expire, a key of another type fails the read, and the bytes themselves are not returned, so
//! a `forget` after a confirmation could not tell whether the value it deletes is still the one
//! it showed. [`Stored`] keeps all of that; [`RedisStore::read_unit`](crate::RedisStore::read_unit),
//! [`RedisStore::forget_exact`](crate::RedisStore::forget_exact),
//! [`RedisStore::resolve_exact`](crate::RedisStore::resolve_exact) and
//! [`RedisStore::list_task`](crate::RedisStore::list_task) (and the same methods of
//! [`RedisClusterStore`](crate::RedisClusterStore)) use it. Both stores implement the core's
//! [`Operator`](idempotask::operator::Operator) with these (a listing there is one `SCAN` call a
//! page), which the `idempotask` command is built on.
//!
//! ```
//! use idempotask_redis::operator::Stored;
//!
//! let lock = Stored::parse(b"L0123abcd.1764460000123456", None);
//! assert!(matches!(lock, Stored::Lock { fencing_token: Some(1_764_460_000_123_456), lock_ttl_remaining: None, .. }));
//! assert!(matches!(Stored::parse(b"T42", None), Stored::Released { fencing_token: Some(42), .. }));
//! assert!(matches!(Stored::parse(b"OK", None), Stored::Foreign { .. }));
//! ```

use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::sync::LazyLock;
use std::time::Duration;

use idempotask::operator::{Forgot, Resolution, Resolved};
use idempotask::store::{StoreError, StoreErrorKind, UnitOfWork, ttl_millis};
use redis::aio::ConnectionLike;
use redis::{Cmd, RedisError, Script, Value};

use super::keys::{FORGET_RECEIPT_MS, RedisKeys, forget_receipt_key};
use super::protocol::Protocol;
use super::reply::unexpected;
pub use super::stored::Stored;

mod impls;

/// How many keys one `SCAN` call looks at, and how many keys are read at once.
const BATCH: usize = 1000;

/// Reads one key of any type, with the server's clock.
pub(super) static READ: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("read.lua")));
/// Deletes a key only while it holds the value given, and leaves a forget receipt.
pub(super) static FORGET_EXACT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("forget_exact.lua")));

/// One unit's key as [`read_unit`](crate::RedisStore::read_unit) saw it, with the server's
/// clock at that instant (the clock fencing tokens are taken from).
///
/// ```no_run
/// # async fn run(store: idempotask_redis::RedisStore, unit: idempotask::store::UnitOfWork) -> Result<(), idempotask::store::StoreError> {
/// use idempotask_redis::operator::Stored;
///
/// let reading = store.read_unit(&unit).await?;
/// if let Stored::Lock { fencing_token: Some(granted_us), .. } = reading.stored() {
///     let age_ms = reading.server_time_us().saturating_sub(*granted_us) / 1000;
///     println!("locked about {age_ms} ms ago");
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Reading {
    stored: Stored,
    server_time_us: u64,
}

impl Reading {
    /// What the key holds.
    pub fn stored(&self) -> &Stored {
        &self.stored
    }

    /// What the key holds, taken out of the reading.
    pub fn into_stored(self) -> Stored {
        self.stored
    }

    /// The server's `TIME` when the key was read, in microseconds since the Unix epoch. A
    /// fencing token is the same clock when it was granted, so the difference is about the
    /// lock's age.
    pub fn server_time_us(&self) -> u64 {
        self.server_time_us
    }

    /// Input: the read script's reply. Output: what it says, or why the reply is not one.
    pub(super) fn from_reply(reply: &Value) -> Result<Self, String> {
        let unexpected = || format!("unexpected reply to the read script: {reply:?}");
        let Value::Array(items) = reply else {
            return Err(unexpected());
        };
        let [kind, value, pttl, time] = items.as_slice() else {
            return Err(unexpected());
        };
        let kind = text(kind).ok_or_else(unexpected)?;
        let ttl = match pttl {
            Value::Int(ms) => u64::try_from(*ms).ok().map(Duration::from_millis),
            _ => return Err(unexpected()),
        };
        let server_time_us = match time {
            Value::Array(parts) => match parts.as_slice() {
                [secs, micros] => number(secs)
                    .zip(number(micros))
                    .map(|(secs, micros)| secs.saturating_mul(1_000_000).saturating_add(micros))
                    .ok_or_else(unexpected)?,
                _ => return Err(unexpected()),
            },
            _ => return Err(unexpected()),
        };
        let stored = match (kind.as_str(), value) {
            ("none", _) => Stored::Missing,
            ("string", Value::BulkString(bytes)) => Stored::parse(bytes, ttl),
            // Expired between `TYPE` and `GET` cannot happen inside a script; anything else is
            // a reply this build does not know.
            ("string", _) => return Err(unexpected()),
            (other, _) => Stored::OtherType {
                kind: other.to_owned(),
            },
        };
        Ok(Self {
            stored,
            server_time_us,
        })
    }
}

fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
        Value::SimpleString(text) => Some(text.clone()),
        _ => None,
    }
}

fn number(value: &Value) -> Option<u64> {
    match value {
        Value::Int(n) => u64::try_from(*n).ok(),
        other => text(other)?.parse().ok(),
    }
}

/// Settles a unit in doubt only while it holds the lock shown, and leaves a receipt.
pub(super) static RESOLVE_EXACT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("resolve_exact.lua")));

/// Input: the reply of the forget scripts (1, 0 or -1). Output: what they did, or `None` for a
/// reply they never give.
fn forgot_from_reply(reply: &Value) -> Option<Forgot> {
    match reply {
        Value::Int(1) => Some(Forgot::Deleted),
        Value::Int(0) => Some(Forgot::Gone),
        Value::Int(-1) => Some(Forgot::Changed),
        _ => None,
    }
}

/// Input: the reply of the resolve script (1, 0 or -1) and what it was asked to do. Output:
/// what it did, or `None` for a reply it never gives.
fn resolved_from_reply(reply: &Value, resolution: &Resolution) -> Option<Resolved> {
    match reply {
        Value::Int(1) => Some(match resolution {
            Resolution::Record { .. } => Resolved::Recorded,
            Resolution::RecordStep { .. } => Resolved::StepRecorded,
            _ => Resolved::Freed,
        }),
        Value::Int(0) => Some(Resolved::Gone),
        Value::Int(-1) => Some(Resolved::Changed),
        _ => None,
    }
}

/// One task's keys as [`list_task`](crate::RedisStore::list_task) found them.
///
/// ```no_run
/// # async fn run(store: idempotask_redis::RedisStore) -> Result<(), idempotask::store::StoreError> {
/// use idempotask_redis::operator::Stored;
///
/// let listing = store.list_task("charge").await?;
/// let locked = listing
///     .units
///     .values()
///     .filter(|stored| matches!(stored, Stored::Lock { .. }))
///     .count();
/// println!("{locked} of {} keys locked", listing.keys_seen);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct Listing {
    /// Each unit's key that still held something when it was read, by the digest in its name
    /// (released fenced locks included; keys that expired after `SCAN` saw them are left out).
    pub units: BTreeMap<String, Stored>,
    /// How many of the task's keys `SCAN` found.
    pub keys_seen: usize,
    /// How many servers were scanned: 1, or the cluster's masters.
    pub servers_scanned: usize,
}

impl Listing {
    /// Adds another server's listing (a cluster has one per master; slots never overlap).
    ///
    /// While slots move the masters are not scanned at one instant: a unit whose key moves from
    /// a master not scanned yet to one already scanned is missed, and one seen on both sides is
    /// counted once. List again once a resharding is over.
    pub(super) fn merge(&mut self, other: Self) {
        self.units.extend(other.units);
        self.keys_seen += other.keys_seen;
        self.servers_scanned += other.servers_scanned;
    }
}

/// What kind of server a URL names, as [`RedisStore::server_kind`](crate::RedisStore::server_kind)
/// finds out: a cluster node answers a plain client too, but only for its own slots, so a
/// tool that guesses wrong gives a partial answer that looks complete.
///
/// ```no_run
/// # async fn run(store: idempotask_redis::RedisStore) -> Result<(), idempotask::store::StoreError> {
/// use idempotask_redis::operator::ServerKind;
///
/// match store.server_kind().await? {
///     ServerKind::Standalone => println!("one server holds every key"),
///     ServerKind::ClusterNode => println!("a cluster: use RedisClusterStore"),
///     other => println!("cannot tell: {other:?}"),
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ServerKind {
    /// A standalone server (or a primary with replicas): it holds every key.
    Standalone,
    /// A node of a Redis Cluster: use a [`RedisClusterStore`](crate::RedisClusterStore) with
    /// it as a seed.
    ClusterNode,
    /// The server did not say: every probe was refused, typically by the user's ACL rights
    /// (granting `+cluster|slots` settles it).
    #[non_exhaustive]
    Undetermined {
        /// What each probe answered.
        refusals: Vec<String>,
    },
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

/// The operator calls, shared by both stores; each one within the call timeout.
impl<C: ConnectionLike + Clone + Send + Sync + 'static> Protocol<C> {
    /// What `key` holds, read by one script that fails on no type of key.
    async fn read_key(&self, key: &str) -> Result<Reading, StoreError> {
        let reply = self.invoke("read", &READ, key, |_| {}).await?;
        Reading::from_reply(&reply)
            .map_err(|why| StoreError::new("read", StoreErrorKind::Protocol, why))
    }

    /// Input: the connection to one server. Output: which kind it is; the probes need only
    /// rights a worker's ACL user has anyway.
    pub(super) async fn server_kind(&self) -> Result<ServerKind, StoreError> {
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
            let reply = self
                .bounded("server kind", async { Ok(self.query(&command).await) })
                .await?;
            match reply {
                Ok(_) if probe.success_is_cluster => return Ok(ServerKind::ClusterNode),
                Ok(_) => refusals.push(format!("`{name}` answered but does not tell")),
                Err(err)
                    if err.is_io_error() || err.is_timeout() || err.is_connection_dropped() =>
                {
                    return Err(self.error("server kind", "", &err));
                }
                Err(err) if err.to_string().contains("cluster support disabled") => {
                    return Ok(ServerKind::Standalone);
                }
                Err(err) => refusals.push(format!("`{name}`: {err}")),
            }
        }
        Ok(ServerKind::Undetermined { refusals })
    }

    pub(super) async fn read_unit(&self, unit: &UnitOfWork) -> Result<Reading, StoreError> {
        self.bounded("read", self.read_key(&self.key(unit))).await
    }

    pub(super) async fn forget_exact(
        &self,
        unit: &UnitOfWork,
        shown: &[u8],
    ) -> Result<Forgot, StoreError> {
        self.exact(
            "forget",
            &FORGET_EXACT,
            unit,
            shown,
            |_| {},
            forgot_from_reply,
        )
        .await
    }

    pub(super) async fn resolve_exact(
        &self,
        unit: &UnitOfWork,
        shown: &[u8],
        resolution: &Resolution,
    ) -> Result<Resolved, StoreError> {
        let step = resolution
            .step_to_record()?
            .map(|(entry, kept_for)| (entry, ttl_millis(kept_for)));
        let marker = match step {
            Some(_) => None,
            None => resolution
                .marker_to_store(unit)?
                .map(|(marker, result_ttl)| (marker, ttl_millis(result_ttl))),
        };
        let args = |cmd: &mut Cmd| {
            match marker {
                Some((marker, ttl)) => cmd.arg(marker).arg(ttl),
                None => cmd.arg("").arg(0),
            };
            match step {
                Some((entry, kept)) => cmd.arg(entry).arg(kept),
                None => cmd.arg("").arg(0),
            };
            cmd.arg(u8::from(resolution.discards_steps()));
        };
        let read = |reply: &Value| resolved_from_reply(reply, resolution);
        self.exact("resolve", &RESOLVE_EXACT, unit, shown, args, read)
            .await
    }

    /// Input: an operator's compare-and-set `script` (`forget_exact.lua`, `resolve_exact.lua`)
    /// on `unit`'s key against the value `shown`, the script's arguments after the receipt's,
    /// and how to read its reply. Output: what the reply says.
    ///
    /// A nonce per call, as `forget` has: a re-sent command finds the receipt of its first run
    /// and answers as that run did. Both scripts share the one receipt key of the unit.
    async fn exact<T>(
        &self,
        operation: &'static str,
        script: &Script,
        unit: &UnitOfWork,
        shown: &[u8],
        args: impl FnOnce(&mut Cmd),
        read: impl FnOnce(&Value) -> Option<T>,
    ) -> Result<T, StoreError> {
        let key = self.key(unit);
        let receipt = forget_receipt_key(&self.namespace, &key);
        let journal = self.journal_key(&key);
        let nonce = format!("{:016x}", rand::random::<u64>());
        let call = async {
            let reply = self
                .invoke_on(operation, script, &[&key, &receipt, &journal], |cmd| {
                    cmd.arg(shown).arg(&nonce).arg(FORGET_RECEIPT_MS);
                    args(cmd);
                })
                .await?;
            read(&reply).ok_or_else(|| unexpected(operation, &key, &reply))
        };
        self.bounded(operation, call).await
    }

    /// Input: the keys of some units. Output: each key's reading, in order; all in flight at
    /// once on the multiplexed connection, each on its own (the cluster client refuses a
    /// pipeline that spans slots, and during a slot migration a single command follows `ASK`,
    /// which covers one command, not a pipeline).
    async fn read_keys(&self, keys: &[String]) -> Result<Vec<Reading>, StoreError> {
        let mut in_flight = tokio::task::JoinSet::new();
        for (index, key) in keys.iter().enumerate() {
            let protocol = self.clone();
            let key = key.clone();
            in_flight.spawn(async move {
                let reading = protocol.bounded("read", protocol.read_key(&key)).await;
                (index, reading)
            });
        }
        let mut readings = vec![None; keys.len()];
        while let Some(joined) = in_flight.join_next().await {
            // Nothing cancels these tasks; a panic in one is a bug to surface as such.
            let (index, reading) =
                joined.unwrap_or_else(|err| std::panic::resume_unwind(err.into_panic()));
            readings[index] = Some(reading?);
        }
        Ok(readings.into_iter().flatten().collect())
    }

    /// The `SCAN … MATCH` pattern of `task`'s keys, and the layout that reads them back.
    fn task_layout(
        &self,
        operation: &'static str,
        task: &str,
    ) -> Result<(RedisKeys, String), StoreError> {
        let configuration = |err: idempotask::InvalidKey| {
            StoreError::new(operation, StoreErrorKind::Configuration, err.to_string())
        };
        let keys = RedisKeys::new(&self.namespace).map_err(configuration)?;
        let pattern = keys.task_pattern(task).map_err(configuration)?;
        Ok((keys, pattern))
    }

    /// Input: how to send `SCAN` (to the one server, or to one master by address), a key
    /// pattern, and what to do with each page of keys it matches. Output: whether `each`
    /// stopped the walk (`Break`) before the cursor came round to 0.
    async fn scan<F, Fut>(
        &self,
        mut send: F,
        pattern: &str,
        mut each: impl FnMut(Vec<String>) -> ControlFlow<()>,
    ) -> Result<bool, StoreError>
    where
        F: FnMut(Cmd) -> Fut,
        Fut: Future<Output = Result<Value, RedisError>>,
    {
        let mut cursor = 0;
        loop {
            let (next, keys) = self.scan_once(&mut send, pattern, cursor, BATCH).await?;
            if each(keys).is_break() {
                return Ok(true);
            }
            if next == 0 {
                return Ok(false);
            }
            cursor = next;
        }
    }

    /// Input: how to send `SCAN`, a key pattern, where the walk stands (0: at its start) and
    /// about how many keys to look at. Output: where it stands after this call (0: done), and
    /// the names it matched; a name that is not UTF-8 is none of idempotask's, and left out.
    async fn scan_once<F, Fut>(
        &self,
        send: &mut F,
        pattern: &str,
        cursor: u64,
        count: usize,
    ) -> Result<(u64, Vec<String>), StoreError>
    where
        F: FnMut(Cmd) -> Fut,
        Fut: Future<Output = Result<Value, RedisError>>,
    {
        let mut scan = redis::cmd("SCAN");
        scan.arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(count);
        let page = self
            .bounded("scan", async {
                send(scan)
                    .await
                    .map_err(|err| self.error("scan", pattern, &err))
            })
            .await?;
        let (next, names): (u64, Vec<Vec<u8>>) = redis::from_redis_value(page.clone())
            .map_err(|_| unexpected("scan", pattern, &page))?;
        let names = names
            .into_iter()
            .filter_map(|name| String::from_utf8(name).ok())
            .collect();
        Ok((next, names))
    }

    /// Whether any key of `task` is on the server `send` reaches (`SCAN` stops at the first).
    pub(super) async fn has_keys_on<F, Fut>(&self, task: &str, send: F) -> Result<bool, StoreError>
    where
        F: FnMut(Cmd) -> Fut,
        Fut: Future<Output = Result<Value, RedisError>>,
    {
        let (_, pattern) = self.task_layout("scan", task)?;
        self.scan(send, &pattern, |page| {
            if page.is_empty() {
                ControlFlow::Continue(())
            } else {
                ControlFlow::Break(())
            }
        })
        .await
    }

    /// Input: a task, and how to send `SCAN` to one server. Output: that server's keys of the
    /// task, each read once; the reads are routed by key, which lands on the same master unless
    /// a slot moves meanwhile (then the cluster client follows the redirection).
    pub(super) async fn list_on<F, Fut>(
        &self,
        task: &str,
        mut send: F,
    ) -> Result<Listing, StoreError>
    where
        F: FnMut(Cmd) -> Fut,
        Fut: Future<Output = Result<Value, RedisError>>,
    {
        let mut listing = Listing {
            servers_scanned: 1,
            ..Listing::default()
        };
        let mut cursor = 0;
        loop {
            let page = self.scan_page(task, cursor, BATCH, &mut send).await?;
            listing.keys_seen += page.keys_seen;
            let units = page.readings.into_iter();
            listing
                .units
                .extend(units.map(|(digest, reading)| (digest, reading.stored)));
            if page.next == 0 {
                return Ok(listing);
            }
            cursor = page.next;
        }
    }

    /// Input: a task, where its `SCAN` on one server stands (0: at the start), about how many
    /// keys to look at, and how to send the `SCAN` there. Output: the keys of the task that one
    /// call matched, each read once (routed by key, as every read is).
    async fn scan_page<F, Fut>(
        &self,
        task: &str,
        cursor: u64,
        count: usize,
        send: &mut F,
    ) -> Result<Scanned, StoreError>
    where
        F: FnMut(Cmd) -> Fut,
        Fut: Future<Output = Result<Value, RedisError>>,
    {
        let (keys, pattern) = self.task_layout("scan", task)?;
        let (next, names) = self.scan_once(send, &pattern, cursor, count).await?;
        // digest → the unit's key; `SCAN` may answer a key twice.
        let mut found: BTreeMap<String, String> = BTreeMap::new();
        let mut keys_seen = 0;
        for name in names {
            if let Some(digest) = keys.parse(&name).map(|parsed| parsed.digest.to_owned()) {
                keys_seen += 1;
                found.insert(digest, name);
            }
        }
        let (digests, names): (Vec<String>, Vec<String>) = found.into_iter().unzip();
        let readings = self.read_keys(&names).await?;
        let readings = digests
            .into_iter()
            .zip(readings)
            .filter(|(_, reading)| !matches!(reading.stored, Stored::Missing))
            .collect();
        Ok(Scanned {
            readings,
            keys_seen,
            next,
        })
    }
}

/// What one `SCAN` call of a task's keys found on one server.
struct Scanned {
    /// Each key that still held something when it was read, by the digest in its name.
    readings: Vec<(String, Reading)>,
    /// How many of the task's keys the call matched.
    keys_seen: usize,
    /// Where the `SCAN` stands after the call: 0 when it is done.
    next: u64,
}

#[cfg(test)]
mod tests;
