//! [`RedlockStore`]: the store protocol on several independent Redis servers at once, each
//! decision taken by a majority of them (the Redlock algorithm).

use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::task::Poll;
use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::{IntoConnectionInfo, Script, Value};
use tokio::sync::OnceCell;
use tokio::time::Instant;

use super::protocol::{Protocol, check_namespace, lock_value, store_error};
use super::{DEFAULT_CONNECTION_TIMEOUT, DEFAULT_NAMESPACE, RedisStore, RedisStoreBuilder};
use crate::error::{StoreError, StoreErrorKind};
use crate::store::{Begin, Fencing, Finish, Inspection, Store};
use crate::unit::{LockToken, MAX_KEY_LEN, UnitOfWork};

static RAISE_FENCE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("raise_fence.lua")));

/// How long one server may take to answer one operation, by default.
pub(crate) const DEFAULT_SERVER_TIMEOUT: Duration = Duration::from_millis(250);
/// The clock-drift allowance by default, as a fraction of the lock TTL (2 ms are added to it).
pub(crate) const DEFAULT_CLOCK_DRIFT: f64 = 0.01;
/// The shortest validity a grant may have left to be kept, by default.
pub(crate) const DEFAULT_MIN_VALIDITY: Duration = Duration::from_millis(10);

/// Added to every drift allowance: Redis expires keys with a millisecond's precision.
const EXPIRY_PRECISION: Duration = Duration::from_millis(2);
/// How long a server that failed to answer is left out before it is asked again.
const DOWN_PAUSE: Duration = Duration::from_millis(500);

/// A store over several independent Redis servers (3 or 5), for work where one Redis failing
/// over must not hand a lock to two workers: each operation runs the protocol of
/// [`RedisStore`] on every server at once and counts as done when a majority agree (Redlock).
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
///   reports [`Outcome::MarkerNotWritten`](crate::Outcome::MarkerNotWritten) with a warning,
///   never a silent success.
/// - `release` and `renew` go to every server and touch only a lock that holds the caller's
///   token; `renew` succeeds when a majority renewed.
///
/// Servers are independent primaries: no replicas, no cluster, nothing in common. Each one
/// keeps the same keys a [`RedisStore`] would (so `idempotask-cli` can inspect any of them).
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
/// # Behaviour
/// - Every operation asks all servers at once and waits for each at most
///   [`server_timeout`](RedlockStoreBuilder::server_timeout): a call takes as long as the
///   slowest server that answers, bounded by that timeout. A server that timed out or could not
///   be reached is left out for half a second (calls fail on it at once), then asked again.
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
/// let store = idempotask::RedlockStore::builder([
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

struct Inner {
    servers: Vec<Server>,
    namespace: String,
    max_key_len: usize,
    server_timeout: Duration,
    clock_drift: f64,
    min_validity: Duration,
}

/// One of the quorum's servers: its address for messages, and its connection once made.
struct Server {
    /// `host:port`, without credentials.
    name: String,
    builder: RedisStoreBuilder,
    protocol: OnceCell<Protocol<ConnectionManager>>,
    /// Until when the server is left out after a failure to answer.
    down_until: Mutex<Option<Instant>>,
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
#[derive(Debug, Clone)]
#[must_use]
pub struct RedlockStoreBuilder {
    urls: Vec<String>,
    #[cfg(feature = "tls")]
    root_certificate: Option<Vec<u8>>,
    namespace: String,
    connection_timeout: Duration,
    server_timeout: Duration,
    clock_drift: f64,
    min_validity: Duration,
    max_key_len: usize,
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

    /// A builder with the defaults: namespace [`DEFAULT_NAMESPACE`](crate::RedisStore::DEFAULT_NAMESPACE), per-server timeout
    /// [`DEFAULT_SERVER_TIMEOUT`](RedlockStore::DEFAULT_SERVER_TIMEOUT), connection timeout [`DEFAULT_CONNECTION_TIMEOUT`](crate::RedisStore::DEFAULT_CONNECTION_TIMEOUT), drift
    /// allowance [`DEFAULT_CLOCK_DRIFT`](RedlockStore::DEFAULT_CLOCK_DRIFT), validity floor [`DEFAULT_MIN_VALIDITY`](RedlockStore::DEFAULT_MIN_VALIDITY), keys up to
    /// [`MAX_KEY_LEN`] bytes. Each URL is one server, as [`RedisStore::builder`] takes it
    /// (`rediss://`, ACL users and passwords per server).
    pub fn builder<I>(urls: I) -> RedlockStoreBuilder
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        RedlockStoreBuilder {
            urls: urls.into_iter().map(Into::into).collect(),
            #[cfg(feature = "tls")]
            root_certificate: None,
            namespace: DEFAULT_NAMESPACE.to_owned(),
            connection_timeout: DEFAULT_CONNECTION_TIMEOUT,
            server_timeout: DEFAULT_SERVER_TIMEOUT,
            clock_drift: DEFAULT_CLOCK_DRIFT,
            min_validity: DEFAULT_MIN_VALIDITY,
            max_key_len: MAX_KEY_LEN,
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

    /// The Redis key of `unit` on each server (the layout of [`RedisKeys`](crate::ops::RedisKeys)).
    pub fn key(&self, unit: &UnitOfWork) -> String {
        super::keys::unit_key(&self.inner.namespace, unit)
    }
}

impl RedlockStoreBuilder {
    /// The namespace that separates applications sharing the servers (default `"default"`).
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// How long one server may take to answer one operation (default
    /// [`DEFAULT_SERVER_TIMEOUT`](RedlockStore::DEFAULT_SERVER_TIMEOUT)). Keep it a small part of the lock TTL: a round that takes
    /// longer leaves the grant less validity.
    pub fn server_timeout(mut self, timeout: Duration) -> Self {
        self.server_timeout = timeout;
        self
    }

    /// How long connecting to one server may take (default [`DEFAULT_CONNECTION_TIMEOUT`](crate::RedisStore::DEFAULT_CONNECTION_TIMEOUT)).
    pub fn connection_timeout(mut self, timeout: Duration) -> Self {
        self.connection_timeout = timeout;
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

    /// The longest caller key accepted, in bytes (default [`MAX_KEY_LEN`]).
    pub fn max_key_len(mut self, max: usize) -> Self {
        self.max_key_len = max;
        self
    }

    /// Trusts this CA (PEM) for every `rediss://` server instead of the system's roots.
    #[cfg(feature = "tls")]
    pub fn tls_root_certificate(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.root_certificate = Some(pem.into());
        self
    }

    /// Checks the settings, connects to the servers at once, and loads the scripts.
    ///
    /// # Errors
    /// A [`StoreError`] of kind `Configuration` for an even number of servers or fewer than
    /// three, the same server twice, a bad URL, namespace, drift or credentials; `Unreachable`
    /// or `Timeout` when fewer than a majority can be reached in time.
    pub async fn connect(self) -> Result<RedlockStore, StoreError> {
        check_namespace(&self.namespace)?;
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
        let inner = Inner {
            servers,
            namespace: self.namespace,
            max_key_len: self.max_key_len,
            server_timeout: self.server_timeout,
            clock_drift: self.clock_drift,
            min_validity: self.min_validity,
        };
        let deadline = self.connection_timeout;
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

    /// The settings of one server's connection.
    fn server_builder(&self, url: &str) -> RedisStoreBuilder {
        let builder = RedisStore::builder(url)
            .namespace(self.namespace.clone())
            .connection_timeout(self.connection_timeout)
            .response_timeout(self.server_timeout)
            .max_key_len(self.max_key_len);
        #[cfg(feature = "tls")]
        let builder = match &self.root_certificate {
            Some(pem) => builder.tls_root_certificate(pem.clone()),
            None => builder,
        };
        builder
    }
}

fn configuration(message: String) -> StoreError {
    StoreError::classified("connect", StoreErrorKind::Configuration, false, message)
}

impl Server {
    /// The server's protocol, connecting first if it has not been reached yet; fails at once
    /// while the server is left out after a failure.
    async fn connected(
        &self,
        operation: &'static str,
    ) -> Result<&Protocol<ConnectionManager>, StoreError> {
        if let Some(protocol) = self.protocol.get() {
            return Ok(protocol);
        }
        self.check_up(operation)?;
        let protocol = self
            .protocol
            .get_or_try_init(|| async {
                self.builder
                    .clone()
                    .connect()
                    .await
                    .map(|store| store.protocol)
            })
            .await;
        protocol.map_err(|err| {
            if err.kind() != StoreErrorKind::Configuration {
                self.left_out();
            }
            self.named(operation, &err)
        })
    }

    fn check_up(&self, operation: &'static str) -> Result<(), StoreError> {
        let down_until = *self
            .down_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match down_until {
            Some(until) if Instant::now() < until => Err(StoreError::classified(
                operation,
                StoreErrorKind::Unreachable,
                false,
                format!(
                    "{} failed to answer less than {} ms ago and is left out until then",
                    self.name,
                    DOWN_PAUSE.as_millis()
                ),
            )),
            _ => Ok(()),
        }
    }

    fn left_out(&self) {
        *self
            .down_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(Instant::now() + DOWN_PAUSE);
    }

    fn named(&self, operation: &'static str, err: &StoreError) -> StoreError {
        StoreError::classified(
            operation,
            err.kind(),
            err.is_ambiguous(),
            format!("{}: {err}", self.name),
        )
    }

    fn timed_out(&self, operation: &'static str, timeout: Duration, sent: bool) -> StoreError {
        StoreError::classified(
            operation,
            StoreErrorKind::Timeout,
            sent,
            format!(
                "{} did not answer within {} ms",
                self.name,
                timeout.as_millis()
            ),
        )
    }

    /// Runs `operation` on this server within the per-server timeout.
    async fn run<T, F, Fut>(&self, inner: &Inner, operation: &'static str, f: F) -> Answer<T>
    where
        F: FnOnce(Protocol<ConnectionManager>) -> Fut,
        Fut: Future<Output = Result<T, StoreError>>,
    {
        if self.protocol.get().is_some() {
            self.check_up(operation)?;
        }
        let attempt = async {
            let protocol = self.connected(operation).await?.clone();
            f(protocol).await.map_err(|err| self.named(operation, &err))
        };
        let answer = tokio::time::timeout(inner.server_timeout, attempt)
            .await
            .unwrap_or_else(|_| Err(self.timed_out(operation, inner.server_timeout, true)));
        if let Err(err) = &answer
            && matches!(
                err.kind(),
                StoreErrorKind::Unreachable | StoreErrorKind::Timeout
            )
        {
            self.left_out();
        }
        answer
    }
}

type Answer<T> = Result<T, StoreError>;

impl Inner {
    fn quorum(&self) -> usize {
        self.servers.len() / 2 + 1
    }

    /// Runs `operation` on every server at once; the answers in the servers' order.
    async fn each<T, F, Fut>(&self, operation: &'static str, f: F) -> Vec<Answer<T>>
    where
        F: Fn(Protocol<ConnectionManager>) -> Fut,
        Fut: Future<Output = Result<T, StoreError>>,
    {
        join_all(
            self.servers
                .iter()
                .map(|server| server.run(self, operation, &f)),
        )
        .await
    }

    /// Runs `operation` on the servers at `indices` at once.
    async fn some<T, F, Fut>(
        &self,
        operation: &'static str,
        indices: &[usize],
        f: F,
    ) -> Vec<Answer<T>>
    where
        F: Fn(usize, Protocol<ConnectionManager>) -> Fut,
        Fut: Future<Output = Result<T, StoreError>>,
    {
        join_all(indices.iter().map(|&index| {
            let f = &f;
            self.servers[index].run(self, operation, move |protocol| f(index, protocol))
        }))
        .await
    }

    /// The error of an operation that too few servers answered.
    fn no_quorum(&self, operation: &'static str, errors: Vec<StoreError>) -> StoreError {
        let kind = match errors.first().map(StoreError::kind) {
            Some(first) if errors.iter().all(|err| err.kind() == first) => first,
            _ => StoreErrorKind::Unreachable,
        };
        let ambiguous = errors.iter().any(StoreError::is_ambiguous);
        let failed: Vec<String> = errors.iter().map(ToString::to_string).collect();
        let mut err = StoreError::classified(
            operation,
            kind,
            ambiguous,
            format!(
                "no majority: {} of {} servers failed, {} needed to agree ({})",
                errors.len(),
                self.servers.len(),
                self.quorum(),
                failed.join("; ")
            ),
        );
        if let Some(first) = errors.into_iter().next() {
            err = err.with_source(first);
        }
        err
    }

    /// Gives up the grants of one `begin` (server index and the lock value's token there),
    /// answering nothing: a release that fails leaves the lock to expire.
    async fn release_grants(&self, unit: &UnitOfWork, grants: &[(usize, LockToken)]) {
        let indices: Vec<usize> = grants.iter().map(|(index, _)| *index).collect();
        let answers = self
            .some("release", &indices, |index, protocol| {
                let token = grants
                    .iter()
                    .find(|(at, _)| *at == index)
                    .map(|(_, token)| token.clone());
                async move {
                    match token {
                        Some(token) => protocol.release(unit, &token).await,
                        None => Ok(false),
                    }
                }
            })
            .await;
        for err in answers.into_iter().filter_map(Result::err) {
            tracing::debug!(error = %err, "could not release a grant of a quorum begin; it expires with its TTL");
        }
    }

    /// Takes the quorum's fencing token `fence` into the locks granted with another counter
    /// (`grants` holds each granting server and the token its lock holds); answers the grants
    /// that now hold `fence`.
    async fn raise(
        &self,
        unit: &UnitOfWork,
        grants: Vec<(usize, LockToken)>,
        raised: &LockToken,
    ) -> (Vec<(usize, LockToken)>, Vec<(usize, LockToken)>) {
        let (done, lower): (Vec<_>, Vec<_>) = grants
            .into_iter()
            .partition(|(_, token)| token.fencing_token() == raised.fencing_token());
        if lower.is_empty() {
            return (done, Vec::new());
        }
        let indices: Vec<usize> = lower.iter().map(|(index, _)| *index).collect();
        let target = lock_value(raised);
        let answers = self
            .some("begin", &indices, |index, protocol| {
                let from = lower
                    .iter()
                    .find(|(at, _)| *at == index)
                    .map(|(_, token)| lock_value(token))
                    .unwrap_or_default();
                let target = &target;
                async move {
                    let key = protocol.key(unit);
                    let reply = protocol
                        .invoke("begin", &RAISE_FENCE, &key, |cmd| {
                            cmd.arg(from).arg(target);
                        })
                        .await?;
                    Ok(matches!(reply, Value::Int(1)))
                }
            })
            .await;
        let mut kept = done;
        let mut left = Vec::new();
        for ((index, token), answer) in lower.into_iter().zip(answers) {
            match answer {
                Ok(true) => kept.push((index, raised.clone())),
                // Not raised: release it as granted (a failed raise may still have raised it,
                // and then the lock expires with its TTL).
                _ => left.push((index, token)),
            }
        }
        (kept, left)
    }

    /// The drift allowance for a lock of `lock_ttl`.
    fn drift(&self, lock_ttl: Duration) -> Duration {
        lock_ttl.mul_f64(self.clock_drift) + EXPIRY_PRECISION
    }
}

/// Polls every future of `futures` until all are ready; their outputs in the same order.
async fn join_all<F: Future>(futures: impl IntoIterator<Item = F>) -> Vec<F::Output> {
    let mut pending: Vec<Option<Pin<Box<F>>>> =
        futures.into_iter().map(|f| Some(Box::pin(f))).collect();
    let mut outputs: Vec<Option<F::Output>> = pending.iter().map(|_| None).collect();
    poll_fn(|cx| {
        let mut ready = true;
        for (slot, output) in pending.iter_mut().zip(outputs.iter_mut()) {
            if let Some(future) = slot {
                match future.as_mut().poll(cx) {
                    Poll::Ready(value) => {
                        *output = Some(value);
                        *slot = None;
                    }
                    Poll::Pending => ready = false,
                }
            }
        }
        if ready {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
    outputs.into_iter().flatten().collect()
}

/// How long until enough of the busy servers' locks (`remaining`, one per busy server) expire
/// for a majority of `servers` to be free; `None` when one of them is not known.
fn busy_until(
    mut remaining: Vec<Option<Duration>>,
    servers: usize,
    quorum: usize,
) -> Option<Duration> {
    let must_expire = remaining.len().checked_sub(servers - quorum)?;
    if must_expire == 0 {
        return Some(Duration::ZERO);
    }
    if remaining.iter().any(Option::is_none) {
        return None;
    }
    remaining.sort_unstable();
    remaining.get(must_expire - 1).copied().flatten()
}

impl Store for RedlockStore {
    fn max_key_len(&self) -> usize {
        self.inner.max_key_len
    }

    async fn begin(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        lock_ttl: Duration,
        fencing: Fencing,
    ) -> Result<Begin, StoreError> {
        let inner = &*self.inner;
        let started = Instant::now();
        let answers = inner
            .each("begin", |protocol| async move {
                protocol.begin(unit, token, lock_ttl, fencing).await
            })
            .await;
        let mut grants: Vec<(usize, LockToken)> = Vec::new();
        let mut done = None;
        let mut busy = Vec::new();
        let mut errors = Vec::new();
        for (index, answer) in answers.into_iter().enumerate() {
            match answer {
                Ok(Begin::Acquired { fencing_token }) => {
                    grants.push((index, token.clone().granted(fencing_token)));
                }
                Ok(Begin::Done(marker)) => {
                    done.get_or_insert(marker);
                }
                Ok(Begin::Busy { lock_ttl_remaining }) => busy.push(lock_ttl_remaining),
                Err(err) => errors.push(err),
            }
        }
        if let Some(marker) = done {
            inner.release_grants(unit, &grants).await;
            return Ok(Begin::Done(marker));
        }
        // A server that held a released fenced lock continues its counter even for a task
        // without fencing, so the grants of one round may carry counters or not.
        let fence = grants
            .iter()
            .filter_map(|(_, token)| token.fencing_token())
            .max();
        let granted = token.clone().granted(fence);
        let mut left = Vec::new();
        if fence.is_some() && grants.len() >= inner.quorum() {
            (grants, left) = inner.raise(unit, grants, &granted).await;
        }
        let validity = lock_ttl
            .saturating_sub(started.elapsed())
            .saturating_sub(inner.drift(lock_ttl));
        if grants.len() >= inner.quorum() && validity >= inner.min_validity {
            if !left.is_empty() {
                inner.release_grants(unit, &left).await;
            }
            return Ok(Begin::Acquired {
                fencing_token: fence,
            });
        }
        grants.append(&mut left);
        let granted_count = grants.len();
        inner.release_grants(unit, &grants).await;
        if granted_count >= inner.quorum() {
            return Err(StoreError::classified(
                "begin",
                StoreErrorKind::Timeout,
                false,
                format!(
                    "a majority granted the lock, but the round took {} ms and left {} ms of its {} ms TTL, less than the {} ms floor; the grants were released",
                    started.elapsed().as_millis(),
                    validity.as_millis(),
                    lock_ttl.as_millis(),
                    inner.min_validity.as_millis()
                ),
            ));
        }
        if granted_count + errors.len() >= inner.quorum() {
            // The servers that failed could have made the majority: that is the failure.
            return Err(inner.no_quorum("begin", errors));
        }
        Ok(Begin::Busy {
            lock_ttl_remaining: busy_until(busy, inner.servers.len(), inner.quorum()),
        })
    }

    async fn finish(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        marker: &[u8],
        result_ttl: Duration,
    ) -> Result<Finish, StoreError> {
        let inner = &*self.inner;
        let answers = inner
            .each("finish", |protocol| async move {
                protocol.finish(unit, token, marker, result_ttl).await
            })
            .await;
        let (mut completed, mut stored) = (0, 0);
        let mut errors = Vec::new();
        for answer in answers {
            match answer {
                Ok(Finish::Completed) => {
                    completed += 1;
                    stored += 1;
                }
                Ok(Finish::LockLost {
                    marker_written: true,
                }) => stored += 1,
                Ok(Finish::LockLost { .. }) => {}
                Err(err) => errors.push(err),
            }
        }
        if completed >= inner.quorum() {
            return Ok(Finish::Completed);
        }
        if stored >= inner.quorum() {
            return Ok(Finish::LockLost {
                marker_written: true,
            });
        }
        if stored + errors.len() >= inner.quorum() {
            // A repeat may still reach a majority; the runner repeats while its lock lasts.
            return Err(inner.no_quorum("finish", errors));
        }
        Ok(Finish::LockLost {
            marker_written: false,
        })
    }

    async fn release(&self, unit: &UnitOfWork, token: &LockToken) -> Result<bool, StoreError> {
        let inner = &*self.inner;
        let answers = inner
            .each("release", |protocol| async move {
                protocol.release(unit, token).await
            })
            .await;
        let (mut released, mut not_ours) = (0, 0);
        let mut errors = Vec::new();
        for answer in answers {
            match answer {
                Ok(true) => released += 1,
                Ok(false) => not_ours += 1,
                Err(err) => errors.push(err),
            }
        }
        if released > 0 {
            return Ok(true);
        }
        if not_ours >= inner.quorum() {
            return Ok(false);
        }
        Err(inner.no_quorum("release", errors))
    }

    async fn renew(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        lock_ttl: Duration,
    ) -> Result<bool, StoreError> {
        let inner = &*self.inner;
        let answers = inner
            .each("renew", |protocol| async move {
                protocol.renew(unit, token, lock_ttl).await
            })
            .await;
        let (mut renewed, mut lost) = (0, 0);
        let mut errors = Vec::new();
        for answer in answers {
            match answer {
                Ok(true) => renewed += 1,
                Ok(false) => lost += 1,
                Err(err) => errors.push(err),
            }
        }
        if renewed >= inner.quorum() {
            return Ok(true);
        }
        if lost > inner.servers.len() - inner.quorum() {
            return Ok(false);
        }
        Err(inner.no_quorum("renew", errors))
    }

    /// What the servers hold for `unit`: the marker of any server that has one, and a lock
    /// when a majority of servers hold one (its time left is when fewer than a majority will).
    async fn inspect(&self, unit: &UnitOfWork) -> Result<Inspection, StoreError> {
        let inner = &*self.inner;
        let answers = inner
            .each(
                "inspect",
                |protocol| async move { protocol.inspect(unit).await },
            )
            .await;
        let mut seen = Inspection::default();
        let mut locks = Vec::new();
        let mut errors = Vec::new();
        for answer in answers {
            match answer {
                Ok(inspection) => {
                    if seen.marker.is_none() && inspection.marker.is_some() {
                        seen.marker = inspection.marker;
                        seen.marker_ttl = inspection.marker_ttl;
                    }
                    locks.extend(inspection.lock_ttl);
                }
                Err(err) => errors.push(err),
            }
        }
        if inner.servers.len() - errors.len() < inner.quorum() {
            return Err(inner.no_quorum("inspect", errors));
        }
        if locks.len() >= inner.quorum() {
            locks.sort_unstable_by(|a, b| b.cmp(a));
            seen.lock_ttl = locks.get(inner.quorum() - 1).copied();
        }
        Ok(seen)
    }

    /// Deletes the marker on every server; an error unless every server answered, since a
    /// marker left on one would still answer later deliveries as duplicates.
    async fn forget(&self, unit: &UnitOfWork) -> Result<bool, StoreError> {
        let inner = &*self.inner;
        let answers = inner
            .each(
                "forget",
                |protocol| async move { protocol.forget(unit).await },
            )
            .await;
        let mut deleted = false;
        let mut errors = Vec::new();
        for answer in answers {
            match answer {
                Ok(flag) => deleted |= flag,
                Err(err) => errors.push(err),
            }
        }
        if errors.is_empty() {
            Ok(deleted)
        } else {
            Err(inner.no_quorum("forget", errors))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_waits_for_enough_locks_to_expire_for_a_majority() {
        let ms = |ms| Some(Duration::from_millis(ms));
        // Five servers, all busy: three must expire, so the third soonest decides.
        assert_eq!(
            busy_until(vec![ms(50), ms(10), ms(40), ms(20), ms(30)], 5, 3),
            ms(30)
        );
        // Three busy of five: one must expire.
        assert_eq!(busy_until(vec![ms(50), ms(10), ms(40)], 5, 3), ms(10));
        assert_eq!(busy_until(vec![ms(50), None, ms(40)], 5, 3), None);
        // Fewer busy than can keep a majority out: nothing to wait for.
        assert_eq!(busy_until(vec![ms(50)], 3, 2), ms(0));
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
