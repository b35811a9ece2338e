//! Where the commands look: one Redis server, every master of a Redis Cluster, or a
//! PostgreSQL table.
//!
//! A Redis URL names one server. If that server is a cluster node (as
//! [`RedisStore::server_kind`] tells), it is a seed of a cluster: the commands then use a [`RedisClusterStore`], which routes each unit to
//! the master of its slot, and `list` scans every master. Nothing has to be told which kind it
//! is. A database URL selects a [`PostgresStore`] instead. Everything goes through the stores'
//! public operator calls (`read_unit`, `forget_exact`, `resolve_exact`, `list_task`).

use std::time::Duration;

use idempotask::operator::{Forgot, Resolution, Resolved};
use idempotask::store::{Store, StoreError, UnitOfWork, check_task_name};
use idempotask_postgres::PostgresStore;
use idempotask_redis::operator::{Listing as RedisListing, ServerKind};
use idempotask_redis::{RedisClusterStore, RedisStore};

use crate::exit::{Exit, Failure, redact};
use crate::scan::{Listing, describe, describe_row};
use crate::stored::Seen;

/// How many rows one page of a PostgreSQL listing reads.
const PAGE: usize = 1000;

/// The store, with the URL for error messages.
pub(crate) struct Target {
    backend: Backend,
    pub(crate) url: String,
}

enum Backend {
    Server(RedisStore),
    // Boxed: these stores are several times the size of the server one.
    Cluster(Box<RedisClusterStore>),
    Postgres(Box<PostgresStore>),
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
        let backend = match kind {
            ServerKind::Standalone => Backend::Server(store),
            ServerKind::ClusterNode => {
                let cluster = RedisClusterStore::builder([url])
                    .namespace(namespace)
                    .connect()
                    .await
                    .map_err(|err| Failure::redis(&err, url))?;
                Backend::Cluster(Box::new(cluster))
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
        Ok(Self {
            backend,
            url: url.to_owned(),
        })
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
        Ok(Self {
            backend: Backend::Postgres(Box::new(store)),
            url: url.to_owned(),
        })
    }

    /// Whether the URL's server is part of a Redis Cluster.
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self.backend, Backend::Cluster(..))
    }

    /// Whether the units live in PostgreSQL.
    pub(crate) fn is_postgres(&self) -> bool {
        matches!(self.backend, Backend::Postgres(..))
    }

    /// A failed store call as the CLI reports it.
    pub(crate) fn failure(&self, err: &StoreError) -> Failure {
        if self.is_postgres() {
            Failure::postgres(err, &self.url)
        } else {
            Failure::redis(err, &self.url)
        }
    }

    /// Where the units live, for JSON: `("namespace", "default")` or `("table", "…")`.
    pub(crate) fn scope(&self) -> (&'static str, &str) {
        match &self.backend {
            Backend::Server(store) => ("namespace", store.namespace()),
            Backend::Cluster(store) => ("namespace", store.namespace()),
            Backend::Postgres(store) => ("table", store.table()),
        }
    }

    /// Where the units live, for people: "namespace `default`" or "table `idempotask_units`".
    pub(crate) fn scope_text(&self) -> String {
        let (what, name) = self.scope();
        format!("{what} `{name}`")
    }

    /// The flag that selects another scope, for hints.
    pub(crate) fn scope_flag(&self) -> &'static str {
        if self.is_postgres() {
            "--table"
        } else {
            "--namespace"
        }
    }

    /// Where `unit` is stored, for messages: its Redis key, or its table's row.
    pub(crate) fn location(&self, unit: &UnitOfWork) -> String {
        match &self.backend {
            Backend::Server(store) => store.key(unit),
            Backend::Cluster(store) => store.key(unit),
            Backend::Postgres(store) => format!("the row of table {}", store.table()),
        }
    }

    pub(crate) fn check_task(task: &str) -> Result<(), Failure> {
        check_task_name(task).map_err(|err| Failure::usage(err.to_string()))
    }

    pub(crate) fn unit(&self, task: &str, key: &str) -> Result<UnitOfWork, Failure> {
        let max = match &self.backend {
            Backend::Server(store) => store.max_key_len(),
            Backend::Cluster(store) => store.max_key_len(),
            Backend::Postgres(store) => store.max_key_len(),
        };
        UnitOfWork::with_limit(task, key, max).map_err(|err| Failure::usage(err.to_string()))
    }

    /// What the unit holds now.
    pub(crate) async fn read(&self, unit: &UnitOfWork) -> Result<Seen, Failure> {
        let seen = match &self.backend {
            Backend::Server(store) => store.read_unit(unit).await.map(Seen::from_reading),
            Backend::Cluster(store) => store.read_unit(unit).await.map(Seen::from_reading),
            Backend::Postgres(store) => store.read_unit(unit).await.map(Seen::from_postgres),
        };
        seen.map_err(|err| self.failure(&err))
    }

    /// Forgets the unit if it still holds exactly `shown`.
    pub(crate) async fn forget_exact(
        &self,
        unit: &UnitOfWork,
        shown: &[u8],
    ) -> Result<Forgot, Failure> {
        let forgot = match &self.backend {
            Backend::Server(store) => store.forget_exact(unit, shown).await,
            Backend::Cluster(store) => store.forget_exact(unit, shown).await,
            Backend::Postgres(store) => store.forget_exact(unit, shown).await,
        };
        forgot.map_err(|err| self.failure(&err))
    }

    /// Resolves the unit if it still holds exactly `shown`, a lock in doubt.
    pub(crate) async fn resolve_exact(
        &self,
        unit: &UnitOfWork,
        shown: &[u8],
        resolution: &Resolution,
    ) -> Result<Resolved, Failure> {
        let resolved = match &self.backend {
            Backend::Server(store) => store.resolve_exact(unit, shown, resolution).await,
            Backend::Cluster(store) => store.resolve_exact(unit, shown, resolution).await,
            // The token `Seen::from_postgres` showed; bytes that are no text are no token, so
            // they are not the lock there.
            Backend::Postgres(store) => match std::str::from_utf8(shown) {
                Ok(token) => store.resolve_exact(unit, token, resolution).await,
                Err(_) => Ok(Resolved::Changed),
            },
        };
        resolved.map_err(|err| self.failure(&err))
    }

    /// Whether `task` has anything stored at all.
    pub(crate) async fn task_exists(&self, task: &str) -> Result<bool, Failure> {
        let exists = match &self.backend {
            Backend::Server(store) => store.task_has_keys(task).await,
            Backend::Cluster(store) => store.task_has_keys(task).await,
            Backend::Postgres(store) => store
                .list_task(task, None, 1)
                .await
                .map(|page| !page.is_empty()),
        };
        exists.map_err(|err| self.failure(&err))
    }

    /// Every done and locked unit of `task`, and the odd keys.
    pub(crate) async fn list(&self, task: &str) -> Result<Listing, Failure> {
        let redis = |found: RedisListing| {
            let mut listing = Listing {
                keys_seen: found.keys_seen,
                servers_scanned: found.servers_scanned,
                ..Listing::default()
            };
            for (digest, stored) in found.units {
                if let Some(entry) = describe(task, &digest, Seen::from_redis(stored, None)) {
                    listing.entries.insert(digest, entry);
                }
            }
            listing
        };
        let found = match &self.backend {
            Backend::Server(store) => store.list_task(task).await,
            Backend::Cluster(store) => store.list_task(task).await,
            Backend::Postgres(store) => return self.list_rows(store, task).await,
        };
        found.map(redis).map_err(|err| self.failure(&err))
    }

    /// A PostgreSQL listing, page by page.
    async fn list_rows(&self, store: &PostgresStore, task: &str) -> Result<Listing, Failure> {
        let mut listing = Listing {
            servers_scanned: 1,
            ..Listing::default()
        };
        let mut after: Option<Vec<u8>> = None;
        loop {
            let page = store
                .list_task(task, after.as_deref(), PAGE)
                .await
                .map_err(|err| self.failure(&err))?;
            let full = page.len() == PAGE;
            after = page.last().map(|row| row.key.clone());
            for row in page {
                listing.keys_seen += 1;
                if let Some((digest, entry)) = describe_row(task, row) {
                    listing.entries.insert(digest, entry);
                }
            }
            if !full {
                return Ok(listing);
            }
        }
    }
}
