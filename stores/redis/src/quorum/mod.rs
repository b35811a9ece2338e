//! [`RedlockStore`]: the store protocol on several independent Redis servers at once, each
//! decision taken by a majority of them (the Redlock algorithm).

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::{IntoConnectionInfo, Script};
use tokio::sync::OnceCell;
use tokio::time::Instant;

use super::RedisStoreBuilder;
use super::protocol::{Protocol, check_namespace, store_error};
use super::settings::{ConnectionSettings, connection_setters};
use idempotask::store::UnitOfWork;
use idempotask::store::{StoreError, StoreErrorKind};

mod gather;
mod servers;
mod steps;
mod store;

use gather::join_all;

static RAISE_FENCE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("raise_fence.lua")));
static RETRACT: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("retract.lua")));

/// How long one server may take to answer one operation, by default.
pub(crate) const DEFAULT_SERVER_TIMEOUT: Duration = Duration::from_millis(250);
/// The clock-drift allowance by default, as a fraction of the lock TTL (2 ms are added to it).
pub(crate) const DEFAULT_CLOCK_DRIFT: f64 = 0.01;
/// The shortest validity a grant may have left to be kept, by default.
pub(crate) const DEFAULT_MIN_VALIDITY: Duration = Duration::from_millis(10);

/// Added to every drift allowance: Redis expires keys with a millisecond's precision.
const EXPIRY_PRECISION: Duration = Duration::from_millis(2);
/// How long a server that could not be reached is left out before it is asked again.
const DOWN_PAUSE: Duration = Duration::from_millis(500);
/// How many per-server timeouts a round waits at most for a server whose answer can still
/// change what the round decides.
const PATIENCE: u32 = 8;

/// A store over several independent Redis servers (3 or 5), for work where one Redis failing
/// over must not hand a lock to two workers: each operation runs the protocol of
/// [`RedisStore`](crate::RedisStore) on every server at once and counts as done when a
/// majority agree (Redlock).
///
/// - `begin` asks every server at once. The lock is granted when a majority grant it and the
///   time the round took leaves it a validity (lock TTL − elapsed − clock-drift allowance) of at
///   least [`min_validity`](RedlockStoreBuilder::min_validity); otherwise every grant is
///   released and the answer is busy (other holders have a majority between them) or a
///   [`StoreError`] (too few servers answered). A completion marker found on **any** server
///   answers the call as a duplicate, after releasing what it was granted.
/// - `finish` stores the marker on every server; it is complete when a majority confirm, so
///   that every later majority includes a server that holds it. Fewer than a majority after the
///   body succeeded is a [`StoreError`]: the task runner retries while the lock lasts and then
///   reports [`Outcome::MarkerNotWritten`](idempotask::Outcome::MarkerNotWritten) with a warning,
///   never a silent success.
/// - `release` and `renew` go to every server and touch only a lock that holds the caller's
///   token; `renew` succeeds when a majority renewed.
///
/// Servers are independent primaries: no replicas, no cluster, nothing in common. Each one
/// keeps the same keys a [`RedisStore`](crate::RedisStore) would (so `idempotask-cli` can
/// inspect any of them).
///
/// # Fencing tokens
/// Each server keeps its own counter. A fenced `begin` takes the highest of the granting
/// servers' counters as the grant's fencing token and writes it into the lock on each of them
/// (a second round trip, fenced tasks only), so that a release leaves it behind as the counter
/// those servers go on from. Any two grants' majorities share a server, hence:
/// - a grant made after an earlier grant was **released** (or completed and then forgotten) has
///   a strictly greater token;
/// - after a lock **expired** instead, each server counts on from its own clock: the next token
///   is greater as long as the servers' clocks differ by less than the lock TTL, and none of
///   them steps back (keep them on NTP, slewing).
///
/// What does not hold: a server restarted without persistence forgets its counters (as it
/// forgets locks, below), and a token only orders holders that reach a database which checks
/// it. A task that must never act on a stale lock makes the database the final arbiter: a
/// unique constraint or a conditional update on the business key (insert the charge for
/// order 42 unless one exists, or `UPDATE … WHERE fencing_token < $1`), which holds whatever the
/// locks do.
///
/// # Steps
/// The quorum records steps ([`TaskContext::step`](idempotask::TaskContext::step)): each
/// server keeps a unit's journal as a [`RedisStore`](crate::RedisStore) does, and
/// - a record goes to every server at once, each checking the lock (its token and fencing
///   token) and the position as one server does; it is recorded when a majority accepted it,
///   refused (the step answers `LockNotHeld`) when a majority refused it, and otherwise an
///   ambiguous error: the runner sends it again, then reports the step
///   [`Unrecorded`](idempotask::StepErrorKind::Unrecorded) and keeps the lock, as after a lost
///   reply on one server;
/// - an entry is in the journal when a majority of all the servers hold it at its position.
///   What a failed record left on a minority is not replayed, and the next record at that
///   position replaces it there. A read whose missing servers could make an entry's majority
///   fails (retryable) rather than guess: a confirmed step is never run again because a server
///   that holds it is down;
/// - `forget` deletes the journal on every server with the marker.
///
/// A server that missed a record (down, or too slow: a record is confirmed without waiting for
/// the last servers) is behind on that journal and cannot take the next record as it is. Where
/// the lock there is the caller's, the quorum reads the majority's journal and gives it to that
/// server: before the record when the record needs that server for its majority (a holder
/// granted on a bare majority), after it otherwise, so that the server carries the journal
/// again. Such a server never counts as refusing the record: the lock there is ours. Until it
/// has the journal, a step recorded while a server was down is held by a bare majority: if one
/// of those servers is down too when the journal is read, the read fails until one of them is
/// back (the runner retries, then the delivery is retried).
///
/// Every round that can confirm a record ends within half the lock's TTL of the record's first
/// send (or one server timeout, when that is longer): acceptances further apart would not be
/// the majority of one lock. Past it the record is ambiguous and the runner sends it again.
/// Keep the `lock_ttl` of a task with steps at two server timeouts or more, so that the
/// patience stays within half the TTL; a shorter TTL lets a slow record's acceptances lie
/// further apart. The first `begin` with a shorter TTL logs it at `WARN`, naming its task (once
/// per store).
///
/// # Behaviour
/// - Every operation asks all servers at once and waits for each up to
///   [`server_timeout`](RedlockStoreBuilder::server_timeout). A server that has not answered
///   by then is slow, not down: the round goes on waiting for it while its answer can still
///   change the decision (a `begin` whose grants are one short of a majority, a `finish` whose
///   marker is not yet on a majority, fewer than a majority answered at all), for at most 8
///   server timeouts and, for `begin` and `renew`, half the lock TTL (but at least one server
///   timeout). Under load a call takes longer rather than failing; a server that stays silent
///   that long counts as timed out. A
///   [`response_timeout`](RedlockStoreBuilder::response_timeout) that is set bounds the wait
///   for each server too, when it is the shorter of the two; unset, it is those 8 server
///   timeouts.
/// - A timeout is ambiguous: the server may have run the command, or may run it later. A
///   `begin` that does not keep its grants releases them *and* its lock on every server whose
///   answer it lacks (a compare-and-delete with its token, which each server's connection runs
///   after the `SET` it follows); and a `begin` that finds its own lock, sent again, sets its
///   expiry from now, so a grant's validity never counts from a later request than its lock's.
///   Neither a grant that was not seen nor one that came late makes a second holder: the body
///   runs only on a majority that answered "granted" to this token in this round.
/// - Only a server that cannot be reached (a refused or dropped connection) is left out, for
///   half a second (calls fail on it at once), then asked again. A slow server never is: on a
///   loaded machine every server is late now and then, and leaving them out left no majority.
/// - A `begin` that a majority answered and that did not get a majority is busy (another
///   delivery holds the unit on the others, or on servers that are down): the runner waits for
///   the holder's result. Its time left is when enough of the holder's locks expire for a
///   majority of all the servers to be free, counting as free only servers that answered; not
///   known (the runner backs off by its policy) when servers that timed out could have made
///   the majority. Fewer than a majority
///   answering is a [`StoreError`].
/// - A minority of servers down, stalled or partitioned away changes nothing but latency: the
///   majority decides. A majority down fails every call closed with a [`StoreError`] of kind
///   `Unreachable` or `Timeout` (the body never runs without a majority's lock).
/// - `connect` needs a majority of the servers; the others are connected by the first call
///   that finds them up.
/// - Validity: a grant is kept only if lock TTL − elapsed − (drift × lock TTL + 2 ms) is at
///   least the validity floor. The runner's own lease counts the lock TTL from when `begin`
///   was sent, without the drift allowance: keep bodies well inside the lock TTL (or renew).
/// - **A server restarted without persistence** forgets the locks it granted, so a majority
///   can form again without the holder's servers: two holders at once. Either run every server
///   with `appendonly yes` and `appendfsync always`, or keep a restarted server out (do not
///   start it, or firewall it) for longer than the longest lock TTL in use.
/// - Pauses longer than the validity (a stop-the-world pause, a suspended VM) let a holder run
///   on after its lock expired on every server; fencing tokens checked by the database, or a
///   database constraint, are the answer.
///
/// ```no_run
/// # async fn start() -> Result<(), idempotask::store::StoreError> {
/// let store = idempotask_redis::RedlockStore::builder([
///     "redis://redis-a.internal:6379",
///     "redis://redis-b.internal:6379",
///     "redis://redis-c.internal:6379",
/// ])
/// .namespace("billing")
/// .server_timeout(std::time::Duration::from_millis(100))
/// .connect()
/// .await?;
/// idempotask::install(store);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedlockStore {
    inner: Arc<Inner>,
}

pub(super) struct Inner {
    pub(super) servers: Vec<Server>,
    pub(super) namespace: String,
    pub(super) max_key_len: usize,
    pub(super) server_timeout: Duration,
    pub(super) clock_drift: f64,
    pub(super) min_validity: Duration,
    /// Whether a lock TTL under two server timeouts was logged: once per store, not per task.
    pub(super) short_ttl_logged: AtomicBool,
}

/// One of the quorum's servers: its address for messages, and its connection once made.
pub(super) struct Server {
    /// `host:port`, without credentials.
    pub(super) name: String,
    pub(super) builder: RedisStoreBuilder,
    pub(super) protocol: OnceCell<Protocol<ConnectionManager>>,
    /// Until when the server is left out after a failure to answer.
    pub(super) down_until: Mutex<Option<Instant>>,
}

impl std::fmt::Debug for RedlockStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let servers: Vec<&str> = self.inner.servers.iter().map(|s| s.name.as_str()).collect();
        f.debug_struct("RedlockStore")
            .field("servers", &servers)
            .field("namespace", &self.inner.namespace)
            .field("server_timeout", &self.inner.server_timeout)
            .finish_non_exhaustive()
    }
}

/// Configures and connects a [`RedlockStore`]; see [`RedlockStore::builder`].
///
/// Its setters are those of every Redis store's builder, with the same defaults (see
/// [`RedisStoreBuilder`]), applied to each server, and the quorum's own:
/// [`server_timeout`](Self::server_timeout), [`clock_drift`](Self::clock_drift),
/// [`min_validity`](Self::min_validity).
#[derive(Debug, Clone)]
#[must_use]
pub struct RedlockStoreBuilder {
    urls: Vec<String>,
    settings: ConnectionSettings,
    server_timeout: Duration,
    clock_drift: f64,
    min_validity: Duration,
}

impl RedlockStore {
    /// How long one server may take to answer one command, by default.
    pub const DEFAULT_SERVER_TIMEOUT: Duration = DEFAULT_SERVER_TIMEOUT;
    /// The clock drift allowed, as a fraction of the lock TTL, by default.
    pub const DEFAULT_CLOCK_DRIFT: f64 = DEFAULT_CLOCK_DRIFT;
    /// The least validity a grant must leave, by default.
    pub const DEFAULT_MIN_VALIDITY: Duration = DEFAULT_MIN_VALIDITY;

    /// Connects to every server in `urls` with the default settings.
    ///
    /// # Errors
    /// As [`RedlockStoreBuilder::connect`].
    pub async fn connect<I>(urls: I) -> Result<Self, StoreError>
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        Self::builder(urls).connect().await
    }

    /// A builder with every setting at its default (see [`RedlockStoreBuilder`]'s setters).
    /// Each URL is one server, as [`RedisStore::builder`](crate::RedisStore::builder) takes it
    /// (`rediss://`, ACL users and passwords per server).
    pub fn builder<I>(urls: I) -> RedlockStoreBuilder
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        RedlockStoreBuilder {
            urls: urls.into_iter().map(Into::into).collect(),
            settings: ConnectionSettings::default(),
            server_timeout: DEFAULT_SERVER_TIMEOUT,
            clock_drift: DEFAULT_CLOCK_DRIFT,
            min_validity: DEFAULT_MIN_VALIDITY,
        }
    }

    /// The namespace this store's keys live under.
    pub fn namespace(&self) -> &str {
        &self.inner.namespace
    }

    /// How many servers there are.
    pub fn servers(&self) -> usize {
        self.inner.servers.len()
    }

    /// How many servers make a majority.
    pub fn quorum(&self) -> usize {
        self.inner.quorum()
    }

    /// The Redis key of `unit` on each server (the layout of [`RedisKeys`](crate::RedisKeys)).
    pub fn key(&self, unit: &UnitOfWork) -> String {
        super::keys::unit_key(&self.inner.namespace, unit)
    }
}

impl RedlockStoreBuilder {
    connection_setters!();

    /// How long a round waits for every server before it decides with the answers it has
    /// (default [`DEFAULT_SERVER_TIMEOUT`](RedlockStore::DEFAULT_SERVER_TIMEOUT)). A server
    /// whose answer can still change the decision is waited for up to 8 times as long (for
    /// `begin`, at most half the lock TTL); see the store's Behaviour section. Keep it a small
    /// part of the lock TTL: a round that takes longer leaves the grant less validity.
    pub fn server_timeout(mut self, timeout: Duration) -> Self {
        self.server_timeout = timeout;
        self
    }

    /// How far the servers' clocks may run apart during one lock, as a fraction of the lock
    /// TTL (default [`DEFAULT_CLOCK_DRIFT`](RedlockStore::DEFAULT_CLOCK_DRIFT), 1 %; 2 ms are always added). It is taken off the
    /// validity of every grant.
    pub fn clock_drift(mut self, fraction: f64) -> Self {
        self.clock_drift = fraction;
        self
    }

    /// The shortest validity a grant may have left after the round that took it (default
    /// [`DEFAULT_MIN_VALIDITY`](RedlockStore::DEFAULT_MIN_VALIDITY)); a grant with less is released and the call fails with a
    /// `Timeout` error.
    pub fn min_validity(mut self, floor: Duration) -> Self {
        self.min_validity = floor;
        self
    }

    /// Checks the settings, connects to the servers at once, and loads the scripts.
    ///
    /// # Errors
    /// A [`StoreError`] of kind `Configuration` for an even number of servers or fewer than
    /// three, the same server twice, a bad URL, namespace, drift or credentials; `Unreachable`
    /// or `Timeout` when fewer than a majority can be reached in time.
    pub async fn connect(self) -> Result<RedlockStore, StoreError> {
        check_namespace(&self.settings.namespace)?;
        let count = self.urls.len();
        if count < 3 || count.is_multiple_of(2) {
            return Err(configuration(format!(
                "a quorum needs an odd number of independent servers, 3 or more (3 or 5 are usual); {count} given"
            )));
        }
        if !(0.0..0.5).contains(&self.clock_drift) {
            return Err(configuration(format!(
                "the clock-drift allowance is a fraction of the lock TTL from 0 to below 0.5; {} given",
                self.clock_drift
            )));
        }
        let mut servers: Vec<Server> = Vec::with_capacity(count);
        for url in &self.urls {
            let info = url
                .as_str()
                .into_connection_info()
                .map_err(|err| store_error("connect", &err, false))?;
            let name = info.addr().to_string();
            if servers.iter().any(|server| server.name == name) {
                return Err(configuration(format!(
                    "server {name} is given twice; a quorum needs independent servers"
                )));
            }
            servers.push(Server {
                name,
                builder: self.server_builder(url),
                protocol: OnceCell::new(),
                down_until: Mutex::new(None),
            });
        }
        let deadline = self.settings.connection_timeout;
        let inner = Inner {
            servers,
            namespace: self.settings.namespace,
            max_key_len: self.settings.max_key_len,
            server_timeout: self.server_timeout,
            clock_drift: self.clock_drift,
            min_validity: self.min_validity,
            short_ttl_logged: AtomicBool::new(false),
        };
        let connected = join_all(inner.servers.iter().map(|server| async move {
            tokio::time::timeout(deadline, server.connected("connect"))
                .await
                .map_err(|_| server.timed_out("connect", deadline, false))
                .and_then(|connected| connected.map(|_| ()))
        }))
        .await;
        let mut errors = Vec::new();
        for result in connected {
            if let Err(err) = result {
                if err.kind() == StoreErrorKind::Configuration {
                    return Err(err);
                }
                errors.push(err);
            }
        }
        if inner.servers.len() - errors.len() < inner.quorum() {
            return Err(inner.no_quorum("connect", errors));
        }
        Ok(RedlockStore {
            inner: Arc::new(inner),
        })
    }

    /// The settings of one server's connection: the common ones, with the response timeout
    /// the longest a round may wait for one server (the quorum cuts each round short itself),
    /// or the one set when it is shorter.
    fn server_builder(&self, url: &str) -> RedisStoreBuilder {
        let mut settings = self.settings.clone();
        let longest = self.server_timeout.saturating_mul(PATIENCE);
        settings.response_timeout = Some(
            settings
                .response_timeout
                .map_or(longest, |set| set.min(longest)),
        );
        RedisStoreBuilder {
            url: url.to_owned(),
            settings,
        }
    }
}

fn configuration(message: String) -> StoreError {
    StoreError::new("connect", StoreErrorKind::Configuration, message)
}

#[cfg(test)]
mod tests {
    use super::servers::busy_until;
    use super::*;

    #[test]
    fn busy_waits_for_enough_locks_to_expire_for_a_majority() {
        let ms = |ms| Some(Duration::from_millis(ms));
        // Five servers, all busy: three must expire, so the third soonest decides.
        assert_eq!(
            busy_until(vec![ms(50), ms(10), ms(40), ms(20), ms(30)], 0, 3),
            ms(30)
        );
        // Three busy, two free: one must expire.
        assert_eq!(busy_until(vec![ms(50), ms(10), ms(40)], 2, 3), ms(10));
        assert_eq!(busy_until(vec![ms(50), None, ms(40)], 2, 3), None);
        // Two down, two busy, one granted: both busy locks must expire, not none of them.
        assert_eq!(busy_until(vec![ms(50), ms(10)], 1, 3), ms(50));
        // Three down, one busy, one free: no expiry frees a majority.
        assert_eq!(busy_until(vec![ms(50)], 1, 3), None);
        // Enough free already: nothing to wait for.
        assert_eq!(busy_until(vec![ms(50)], 2, 2), ms(0));
    }

    #[tokio::test]
    async fn a_round_waits_for_slow_servers_only_while_their_answers_can_decide() {
        use super::gather::gather;
        let answer = |after: u64, value: u32| async move {
            tokio::time::sleep(Duration::from_millis(after)).await;
            value
        };
        let quick = |outputs: &[Option<u32>]| outputs.iter().flatten().count() >= 2;
        // Decided by two answers: the slow third is not waited for past the soft limit.
        let started = Instant::now();
        let outputs = gather(
            [answer(0, 1), answer(0, 2), answer(5_000, 3)],
            Duration::from_millis(50),
            quick,
        )
        .await;
        assert_eq!(outputs, [Some(1), Some(2), None]);
        assert!(started.elapsed() < Duration::from_secs(2));
        // Every answer that comes within the soft limit is taken, decided or not.
        let outputs = gather(
            [answer(0, 1), answer(0, 2), answer(10, 3)],
            Duration::from_millis(500),
            quick,
        )
        .await;
        assert_eq!(outputs, [Some(1), Some(2), Some(3)]);
        // Not decided: the slow answer is waited for past the soft limit.
        let outputs = gather(
            [answer(0, 1), answer(200, 2)],
            Duration::from_millis(10),
            quick,
        )
        .await;
        assert_eq!(outputs, [Some(1), Some(2)]);
    }

    #[tokio::test]
    async fn the_number_of_servers_and_the_drift_are_checked_before_connecting() {
        for urls in [
            vec!["redis://127.0.0.1:1"],
            vec!["redis://127.0.0.1:1", "redis://127.0.0.1:2"],
            vec![
                "redis://127.0.0.1:1",
                "redis://127.0.0.1:2",
                "redis://127.0.0.1:3",
                "redis://127.0.0.1:4",
            ],
        ] {
            let err = RedlockStore::connect(urls).await.unwrap_err();
            assert_eq!(err.kind(), StoreErrorKind::Configuration, "{err}");
            assert!(!err.is_retryable());
        }
        let three = [
            "redis://127.0.0.1:1",
            "redis://127.0.0.1:2",
            "redis://127.0.0.1:3",
        ];
        let err = RedlockStore::builder(three)
            .clock_drift(0.7)
            .connect()
            .await
            .unwrap_err();
        assert_eq!(err.kind(), StoreErrorKind::Configuration, "{err}");
        let twice = [
            "redis://127.0.0.1:1",
            "redis://127.0.0.1:2",
            "redis://127.0.0.1:1",
        ];
        let err = RedlockStore::connect(twice).await.unwrap_err();
        assert!(err.to_string().contains("given twice"), "{err}");
    }
}
