//! What a listing answers ([`Page`], [`Cursor`], [`Stats`]) and where a store keeps its units
//! ([`Scope`]).

use std::fmt;

use super::held::{Held, Listed};
use crate::unit::{InvalidKey, MAX_KEY_LEN, UnitOfWork};

/// Where a listing goes on: made by the store that answered a [`Page`], handed back to the
/// same store for the next one.
///
/// It is text, so that it fits in a URL or a form; only the store that made it reads it. A
/// store given one it cannot read (another store's, or typed by hand) fails the call with a
/// `Configuration` [`StoreError`](crate::store::StoreError) and reads nothing.
///
/// ```
/// use idempotask::operator::Cursor;
///
/// let cursor = Cursor::new("1792");
/// assert_eq!(cursor.as_str(), "1792");
/// assert_eq!(cursor.to_string(), "1792");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Cursor(String);

impl Cursor {
    /// A cursor of `text`, as a store writes it (or as it came back from a URL).
    pub fn new(text: impl Into<String>) -> Self {
        Self(text.into())
    }

    /// The text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Cursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One page of a task's units: the answer of [`Operator::list`](super::Operator::list).
///
/// A listing is not one snapshot: units written while it goes on may or may not be in it, and
/// a unit may be answered twice (then the later answer is the newer). A page may hold no unit
/// and still have a [`next`](Self::next) one.
///
/// ```
/// use idempotask::operator::{Cursor, Held, Listed, Page};
///
/// let units = vec![Listed::new("charge", "Xq3oDP2xgYrGWoRV", Held::Nothing)];
/// let last = Page::new(units, 2, None);
/// assert_eq!((last.keys_seen, last.servers_scanned), (2, 1));
/// let more = Page::new(Vec::new(), 0, Some(Cursor::new("17")));
/// assert_eq!(more.servers_scanned, 0);
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Page {
    /// The units that hold something ([`Held::Nothing`] left out), in the store's order.
    pub units: Vec<Listed>,
    /// How many of the task's keys or rows this page looked at: the units, and those that held
    /// nothing by the time they were read (a released fenced lock's counter, an expiry).
    pub keys_seen: usize,
    /// How many servers this page finished walking: a listing's pages add up to how many it
    /// scanned (one, or a Redis Cluster's masters, walked in turn).
    pub servers_scanned: usize,
    /// Where the listing goes on; `None` on its last page.
    pub next: Option<Cursor>,
}

impl Page {
    /// A page of `units`, after looking at `keys_seen` keys or rows, followed by `next`
    /// (`None`: the last page). It finished walking one server when it is the last page, none
    /// otherwise; a store of several servers says otherwise with
    /// [`with_servers_scanned`](Self::with_servers_scanned).
    pub fn new(units: Vec<Listed>, keys_seen: usize, next: Option<Cursor>) -> Self {
        Self {
            servers_scanned: usize::from(next.is_none()),
            units,
            keys_seen,
            next,
        }
    }

    /// The same page, having finished walking `servers` servers.
    #[must_use]
    pub fn with_servers_scanned(mut self, servers: usize) -> Self {
        self.servers_scanned = servers;
        self
    }
}

/// How a task's units stand: the answer of [`Operator::stats`](super::Operator::stats), or
/// added up page by page with [`add`](Self::add).
///
/// ```
/// use idempotask::operator::{Held, Listed, Page, Stats};
///
/// let units = vec![
///     Listed::new("charge", "Xq3oDP2xgYrGWoRV", Held::lock(None, None, None)),
///     Listed::new("charge", "qS1pTqEYmu0bU9kR", Held::foreign(b"OK".to_vec())),
/// ];
/// let mut stats = Stats::default();
/// stats.add(&Page::new(units, 3, None));
/// assert_eq!((stats.locked, stats.unreadable, stats.keys_seen), (1, 1, 3));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Units done: a marker that decodes and was written for the unit.
    pub done: usize,
    /// Units locked: a delivery is running them.
    pub locked: usize,
    /// Units in doubt.
    pub in_doubt: usize,
    /// Units no delivery can use: a marker that does not decode or was written for another
    /// key, a value that is not idempotask's, data of another type.
    pub unreadable: usize,
    /// The task's keys or rows looked at, as [`Page::keys_seen`] counts them: 0 for a task
    /// the store knows nothing of.
    pub keys_seen: usize,
    /// The servers walked, as [`Page::servers_scanned`] counts them.
    pub servers_scanned: usize,
}

impl Stats {
    /// Counts `page` in. A unit that a listing answers on two pages (a Redis `SCAN` may, while
    /// the server resizes its table) is counted twice; [`Operator::stats`](super::Operator::stats)
    /// counts each unit once.
    pub fn add(&mut self, page: &Page) {
        self.add_walked(page);
        for listed in &page.units {
            self.count(listed);
        }
    }

    /// Counts in what `page` looked at, but none of its units.
    pub(super) fn add_walked(&mut self, page: &Page) {
        self.keys_seen += page.keys_seen;
        self.servers_scanned += page.servers_scanned;
    }

    /// Counts one unit in.
    pub(super) fn count(&mut self, listed: &Listed) {
        match &listed.held {
            Held::Nothing => {}
            Held::Lock { .. } => self.locked += 1,
            Held::InDoubt { .. } => self.in_doubt += 1,
            Held::Marker { .. } if listed.own_marker().is_some() => self.done += 1,
            _ => self.unreadable += 1,
        }
    }
}

/// Where a store keeps its units, and which keys it takes: the answer of
/// [`Operator::scope`](super::Operator::scope).
///
/// ```
/// use idempotask::operator::Scope;
///
/// let scope = Scope::new("namespace", "billing").with_max_key_len(64);
/// assert_eq!(scope.to_string(), "namespace `billing`");
/// assert!(scope.unit("charge", "order-42").is_ok());
/// assert!(scope.unit("charge", "x".repeat(65)).is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Scope {
    /// What the store calls the set of units it keeps together: `namespace` (Redis), `table`
    /// (PostgreSQL).
    pub kind: &'static str,
    /// Its name.
    pub name: String,
    /// The longest caller key the store takes, in bytes
    /// ([`Store::max_key_len`](crate::store::Store::max_key_len)).
    pub max_key_len: usize,
}

impl Scope {
    /// The `kind` (`namespace`, `table`, …) called `name`, taking keys up to
    /// [`MAX_KEY_LEN`](crate::store::MAX_KEY_LEN) bytes.
    pub fn new(kind: &'static str, name: impl Into<String>) -> Self {
        Self {
            kind,
            name: name.into(),
            max_key_len: MAX_KEY_LEN,
        }
    }

    /// The same scope, taking keys up to `max_key_len` bytes.
    #[must_use]
    pub fn with_max_key_len(mut self, max_key_len: usize) -> Self {
        self.max_key_len = max_key_len;
        self
    }

    /// `task`'s unit of `key` in this scope.
    ///
    /// # Errors
    /// [`InvalidKey`] for a task name no task can have, an empty key, or one longer than
    /// [`max_key_len`](Self::max_key_len).
    pub fn unit(&self, task: &str, key: impl Into<String>) -> Result<UnitOfWork, InvalidKey> {
        UnitOfWork::with_limit(task, key, self.max_key_len)
    }
}

impl fmt::Display for Scope {
    /// The kind, then the name in backticks, as messages quote it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} `{}`", self.kind, self.name)
    }
}
