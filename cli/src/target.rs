//! Where the commands look: one Redis server, every master of a Redis Cluster, or a
//! PostgreSQL table.
//!
//! A Redis URL names one server. If that server is a cluster node (as
//! [`RedisStore::server_kind`] tells), it is a seed of a cluster: the commands then use a [`RedisClusterStore`], which routes each unit to
//! the master of its slot, and `list` scans every master. Nothing has to be told which kind it
//! is. A database URL selects a [`PostgresStore`] instead. Once connected, everything goes
//! through the core's [`Operator`], the same calls on every store: a store that implements it
//! needs only a way here to connect.

use std::time::Duration;

use idempotask::operator::{
    Cursor, Forgot, Held, Listed, Operator, Page, Resolution, Resolved, Scope, SharedOperator,
};
use idempotask::store::{Journal, StoreError, StoreErrorKind, UnitOfWork, check_task_name};
use idempotask_postgres::PostgresStore;
use idempotask_redis::operator::ServerKind;
use idempotask_redis::{RedisClusterStore, RedisStore};

use crate::exit::{Exit, Failure, redact};
use crate::scan::{Listing, describe};

/// How many keys or rows one page of a listing looks at.
const PAGE: usize = 1000;

/// The store, with the URL for error messages.
pub(crate) struct Target {
    operator: SharedOperator,
    /// Where the units live, asked of the store once.
    scope: Scope,
    pub(crate) url: String,
    /// Whether the URL's server is part of a Redis Cluster.
    cluster: bool,
    /// The flag that selects another scope, for hints.
    scope_flag: &'static str,
    /// A failed store call as the CLI reports it, with the flags of the URL's kind of server.
    report: fn(&StoreError, &str) -> Failure,
}

impl Target {
    /// Input: a Redis URL and a namespace. Output: a target on that server, or on its cluster.
    pub(crate) async fn redis(url: &str, namespace: &str) -> Result<Self, Failure> {
        idempotask::store::check_namespace(namespace)
            .map_err(|err| Failure::usage(err.to_string()))?;
        let store = RedisStore::builder(url)
            .namespace(namespace)
            .connect()
            .await
            .map_err(|err| Failure::redis(&err, url))?;
        let kind = store
            .server_kind()
            .await
            .map_err(|err| Failure::redis(&err, url))?;
        let (operator, cluster) = match kind {
            ServerKind::Standalone => (SharedOperator::new(store), false),
            ServerKind::ClusterNode => {
                let cluster = RedisClusterStore::builder([url])
                    .namespace(namespace)
                    .connect()
                    .await
                    .map_err(|err| Failure::redis(&err, url))?;
                (SharedOperator::new(cluster), true)
            }
            // A wrong guess would give a partial answer that looks complete.
            undetermined => {
                let refusals = match undetermined {
                    ServerKind::Undetermined { refusals, .. } => refusals.join("; "),
                    other => format!("{other:?}"),
                };
                return Err(Failure::new(
                    Exit::Error,
                    "server_kind",
                    format!(
                        "cannot tell whether Redis at {} is a cluster node or a standalone server, so a listing could miss keys: {refusals}; grant the user `+cluster|slots` (`RedisClusterStore` needs it too)",
                        redact(url)
                    ),
                ));
            }
        };
        Ok(Self::new(
            operator,
            url,
            cluster,
            "--namespace",
            Failure::redis,
        ))
    }

    /// Input: a PostgreSQL URL and the store's table. Output: a target on that table.
    pub(crate) async fn postgres(url: &str, table: &str) -> Result<Self, Failure> {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(2)
            .acquire_timeout(Duration::from_secs(5))
            .connect(url)
            .await
            .map_err(|err| Failure::postgres_connect(&err, url))?;
        let store = PostgresStore::builder(pool)
            .table(table)
            .max_connections(2)
            .connect()
            .await
            .map_err(|err| Failure::postgres(&err, url))?;
        Ok(Self::new(
            SharedOperator::new(store),
            url,
            false,
            "--table",
            Failure::postgres,
        ))
    }

    /// Input: a connected store's operator, its URL, and what the CLI says of that kind of
    /// server. Output: the target.
    fn new(
        operator: SharedOperator,
        url: &str,
        cluster: bool,
        scope_flag: &'static str,
        report: fn(&StoreError, &str) -> Failure,
    ) -> Self {
        Self {
            scope: operator.scope(),
            operator,
            url: url.to_owned(),
            cluster,
            scope_flag,
            report,
        }
    }

    /// Whether the URL's server is part of a Redis Cluster.
    pub(crate) fn is_cluster(&self) -> bool {
        self.cluster
    }

    /// A failed store call as the CLI reports it.
    pub(crate) fn failure(&self, err: &StoreError) -> Failure {
        (self.report)(err, &self.url)
    }

    /// Where the units live, for JSON: `("namespace", "default")` or `("table", "…")`.
    pub(crate) fn scope(&self) -> (&'static str, &str) {
        (self.scope.kind, &self.scope.name)
    }

    /// Where the units live, for people: "namespace `default`" or "table `idempotask_units`".
    pub(crate) fn scope_text(&self) -> String {
        self.scope.to_string()
    }

    /// The flag that selects another scope, for hints.
    pub(crate) fn scope_flag(&self) -> &'static str {
        self.scope_flag
    }

    /// Where `unit` is stored, for messages: its Redis key, or its table's row.
    pub(crate) fn location(&self, unit: &UnitOfWork) -> String {
        self.operator.location(unit)
    }

    pub(crate) fn check_task(task: &str) -> Result<(), Failure> {
        check_task_name(task).map_err(|err| Failure::usage(err.to_string()))
    }

    pub(crate) fn unit(&self, task: &str, key: &str) -> Result<UnitOfWork, Failure> {
        self.scope
            .unit(task, key)
            .map_err(|err| Failure::usage(err.to_string()))
    }

    /// What the unit holds now.
    pub(crate) async fn read(&self, unit: &UnitOfWork) -> Result<Held, Failure> {
        self.operator
            .read(unit)
            .await
            .map_err(|err| self.failure(&err))
    }

    /// The steps the unit recorded since it last had a result; `None` where the store keeps
    /// no journal of steps (the core's provided answer, of kind `Configuration`).
    pub(crate) async fn journal(&self, unit: &UnitOfWork) -> Result<Option<Journal>, Failure> {
        match self.operator.journal(unit).await {
            Ok(journal) => Ok(Some(journal)),
            Err(err) if err.kind() == StoreErrorKind::Configuration => Ok(None),
            Err(err) => Err(self.failure(&err)),
        }
    }

    /// The journal of a unit a listing found, known by its digest alone on Redis; `None`
    /// where the store keeps no journal or cannot find it from what the listing knows.
    pub(crate) async fn listed_journal(&self, listed: &Listed) -> Result<Option<Journal>, Failure> {
        match self.operator.listed_journal(listed).await {
            Ok(journal) => Ok(Some(journal)),
            Err(err) if err.kind() == StoreErrorKind::Configuration => Ok(None),
            Err(err) => Err(self.failure(&err)),
        }
    }

    /// Forgets the unit if it still holds exactly `shown`.
    pub(crate) async fn forget_exact(
        &self,
        unit: &UnitOfWork,
        shown: &[u8],
    ) -> Result<Forgot, Failure> {
        self.operator
            .forget_exact(unit, shown)
            .await
            .map_err(|err| self.failure(&err))
    }

    /// Resolves the unit if it still holds exactly `shown`, a lock in doubt.
    pub(crate) async fn resolve_exact(
        &self,
        unit: &UnitOfWork,
        shown: &[u8],
        resolution: &Resolution,
    ) -> Result<Resolved, Failure> {
        self.operator
            .resolve_exact(unit, shown, resolution)
            .await
            .map_err(|err| self.failure(&err))
    }

    /// Whether `task` has anything stored at all.
    pub(crate) async fn task_exists(&self, task: &str) -> Result<bool, Failure> {
        self.operator
            .task_exists(task)
            .await
            .map_err(|err| self.failure(&err))
    }

    /// One page of `task`'s units, looking at about `limit` keys or rows.
    pub(crate) async fn page(
        &self,
        task: &str,
        from: Option<&Cursor>,
        limit: usize,
    ) -> Result<Page, Failure> {
        self.operator
            .list(task, from, limit)
            .await
            .map_err(|err| self.failure(&err))
    }

    /// Every done and locked unit of `task`, and the odd keys, page by page.
    pub(crate) async fn list(&self, task: &str) -> Result<Listing, Failure> {
        let mut listing = Listing::default();
        let mut from = None;
        loop {
            let page = self
                .operator
                .list(task, from.as_ref(), PAGE)
                .await
                .map_err(|err| self.failure(&err))?;
            listing.keys_seen += page.keys_seen;
            listing.servers_scanned += page.servers_scanned;
            // A unit answered twice (a `SCAN` may) is shown as last read.
            for (digest, entry) in page.units.iter().filter_map(describe) {
                listing.entries.insert(digest, entry);
            }
            match page.next {
                Some(next) => from = Some(next),
                None => return Ok(listing),
            }
        }
    }
}
