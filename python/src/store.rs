//! The stores, as Python builds them: a description (a URL and settings) kept as it is, and
//! the Rust store built from it lazily, once per process.
//!
//! A store object built in Celery's parent process (at import, with `install`) is used by the
//! forked children: each child connects on its first call and never touches the parent's
//! connections, which belong to the parent's runtime.

use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use idempotask::store::{
    LocalResultCache as RustLocalResultCache, SharedStore, StoreError, StoreErrorKind,
};
use idempotask_postgres::PostgresStore as RustPostgresStore;
use idempotask_redis::{RedisClusterStore as RustClusterStore, RedisStore as RustRedisStore};
use pyo3::prelude::*;
use tokio::sync::OnceCell;

use crate::errors::to_py_err;
use crate::options::seconds;

/// What a store is built from.
#[derive(Debug, Clone)]
enum Spec {
    Memory,
    Redis {
        url: String,
        redis: RedisSettings,
    },
    Cluster {
        urls: Vec<String>,
        redis: RedisSettings,
    },
    Postgres {
        url: String,
        table: Option<String>,
        migrate: bool,
    },
    /// Another store object behind a `LocalResultCache` of this process: that object's store
    /// in this process, not a second one built from its description (a second `MemoryStore`
    /// would hold other units).
    Cached {
        store: Arc<Lazy>,
        cache: CacheSettings,
    },
}

/// The settings of a `LocalResultCache`.
#[derive(Debug, Clone)]
struct CacheSettings {
    items: NonZeroUsize,
    age: Option<Duration>,
    marker_bytes: Option<usize>,
}

/// The settings the two Redis builders share.
#[derive(Debug, Clone, Default)]
struct RedisSettings {
    namespace: Option<String>,
    connection_timeout: Option<Duration>,
    response_timeout: Option<Duration>,
}

/// A store description and the store built from it in this process.
#[derive(Debug)]
pub(crate) struct Lazy {
    spec: Spec,
    /// The process that built the cell's store, and the cell.
    built: Mutex<Option<(u32, Arc<OnceCell<SharedStore>>)>>,
}

impl Lazy {
    fn new(spec: Spec) -> Self {
        Self {
            spec,
            built: Mutex::new(None),
        }
    }

    /// The cell of this process: a fresh one in a forked child, whose parent's store (and its
    /// connections) are left alone.
    fn cell(&self) -> Arc<OnceCell<SharedStore>> {
        let pid = std::process::id();
        let mut built = self.built.lock().unwrap_or_else(PoisonError::into_inner);
        match built.as_ref() {
            Some((by, cell)) if *by == pid => Arc::clone(cell),
            _ => {
                if let Some(inherited) = built.take() {
                    // Its connection tasks lived on the parent's runtime: dropping them here
                    // could wait on what this process does not have.
                    std::mem::forget(inherited);
                }
                let cell = Arc::new(OnceCell::new());
                *built = Some((pid, Arc::clone(&cell)));
                cell
            }
        }
    }

    /// The store of this process, connected now if it is not yet. A failed connection is not
    /// kept: the next call tries again.
    pub(crate) async fn get(&self) -> Result<SharedStore, StoreError> {
        let cell = self.cell();
        cell.get_or_try_init(|| build(&self.spec)).await.cloned()
    }
}

/// Applies the shared Redis settings to either Redis builder (two types with the same setters).
macro_rules! redis_setters {
    ($builder:ident, $settings:expr) => {
        if let Some(namespace) = &$settings.namespace {
            $builder = $builder.namespace(namespace.clone());
        }
        if let Some(timeout) = $settings.connection_timeout {
            $builder = $builder.connection_timeout(timeout);
        }
        if let Some(timeout) = $settings.response_timeout {
            $builder = $builder.response_timeout(timeout);
        }
    };
}

/// Input: a store's description. Output: the store, connected.
async fn build(spec: &Spec) -> Result<SharedStore, StoreError> {
    if let Spec::Cached { store, cache } = spec {
        let mut cached = RustLocalResultCache::new(Box::pin(store.get()).await?, cache.items);
        if let Some(age) = cache.age {
            cached = cached.max_age(age);
        }
        if let Some(bytes) = cache.marker_bytes {
            cached = cached.max_marker_bytes(bytes);
        }
        return Ok(SharedStore::new(cached));
    }
    Ok(match spec {
        Spec::Cached { .. } => unreachable!("built above"),
        Spec::Memory => SharedStore::new(idempotask::MemoryStore::new()),
        Spec::Redis { url, redis } => {
            let mut builder = RustRedisStore::builder(url.clone());
            redis_setters!(builder, redis);
            SharedStore::new(builder.connect().await?)
        }
        Spec::Cluster { urls, redis } => {
            let mut builder = RustClusterStore::builder(urls.clone());
            redis_setters!(builder, redis);
            SharedStore::new(builder.connect().await?)
        }
        Spec::Postgres {
            url,
            table,
            migrate,
        } => {
            // As `PostgresStore::connect`: connections are not pinged before each statement.
            let pool = sqlx::postgres::PgPoolOptions::new()
                .test_before_acquire(false)
                .connect(url)
                .await
                .map_err(|err| {
                    StoreError::new("connect", StoreErrorKind::Unreachable, err.to_string())
                })?;
            let mut builder = RustPostgresStore::builder(pool);
            if let Some(table) = table {
                builder = builder.table(table);
            }
            if *migrate {
                builder.migrate().await?;
            }
            SharedStore::new(builder.connect().await?)
        }
    })
}

/// Python's store objects, one class per kind; each is a [`Lazy`] store.
macro_rules! store_class {
    ($(#[$doc:meta])* $name:ident, $python:literal, { $($constructor:tt)* }) => {
        $(#[$doc])*
        #[pyclass(frozen, module = "idempotask._native", name = $python)]
        #[derive(Debug)]
        pub(crate) struct $name {
            pub(crate) lazy: Arc<Lazy>,
        }

        #[pymethods]
        impl $name {
            $($constructor)*

            /// Connects in this process now, so that a wrong URL or an unreachable server
            /// fails at start-up rather than at the first call.
            fn check(&self, py: Python<'_>) -> PyResult<()> {
                check(py, &self.lazy)
            }

            fn __repr__(&self) -> String {
                format!("{}({})", $python, describe(&self.lazy.spec))
            }
        }
    };
}

store_class!(
    /// The in-memory store: one process, nothing survives it (tests, one-process tools). A
    /// forked child starts with an empty one of its own.
    MemoryStore,
    "MemoryStore",
    {
    #[new]
    fn new() -> Self {
        Self {
            lazy: Arc::new(Lazy::new(Spec::Memory)),
        }
    }
    }
);
store_class!(
    /// One Redis 7+ or Valkey 7.2+ server, by URL (`redis://`, `rediss://`).
    RedisStore,
    "RedisStore",
    {
    #[new]
    #[pyo3(signature = (url, *, namespace=None, connection_timeout=None, response_timeout=None))]
    fn new(
        url: String,
        namespace: Option<String>,
        connection_timeout: Option<&Bound<'_, PyAny>>,
        response_timeout: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let redis = redis_settings(namespace, connection_timeout, response_timeout)?;
        Ok(Self {
            lazy: Arc::new(Lazy::new(Spec::Redis { url, redis })),
        })
    }
    }
);
store_class!(
    /// A Redis Cluster, from the URLs of a few of its nodes.
    RedisClusterStore,
    "RedisClusterStore",
    {
    #[new]
    #[pyo3(signature = (urls, *, namespace=None, connection_timeout=None, response_timeout=None))]
    fn new(
        urls: Vec<String>,
        namespace: Option<String>,
        connection_timeout: Option<&Bound<'_, PyAny>>,
        response_timeout: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        if urls.is_empty() {
            return Err(pyo3::exceptions::PyValueError::new_err(
                "a Redis Cluster store needs the URL of at least one node",
            ));
        }
        let redis = redis_settings(namespace, connection_timeout, response_timeout)?;
        Ok(Self {
            lazy: Arc::new(Lazy::new(Spec::Cluster { urls, redis })),
        })
    }
    }
);
store_class!(
    /// PostgreSQL 12+, by URL.
    PostgresStore,
    "PostgresStore",
    {
    #[new]
    #[pyo3(signature = (url, *, table=None, migrate=false))]
    fn new(url: String, table: Option<String>, migrate: bool) -> Self {
        Self {
            lazy: Arc::new(Lazy::new(Spec::Postgres {
                url,
                table,
                migrate,
            })),
        }
    }
    }
);

store_class!(
    /// Another store behind a bounded cache, in this process, of the results of the units it
    /// saw completed: a duplicate of one of them is answered without the store. Locks and
    /// units in progress or in doubt always reach the store; each entry expires no later than
    /// its result in the store. What it cannot see: a `forget` or an operator's resolve made
    /// through another process (or another store object) reaches its entries only when they
    /// expire; `max_age` bounds that.
    LocalResultCache,
    "LocalResultCache",
    {
    #[new]
    #[pyo3(signature = (store, *, max_items, max_age=None, max_marker_bytes=None))]
    fn new(
        store: &Bound<'_, PyAny>,
        max_items: i64,
        max_age: Option<&Bound<'_, PyAny>>,
        max_marker_bytes: Option<i64>,
    ) -> PyResult<Self> {
        let inner = lazy_of(store)?;
        let max_items = usize::try_from(max_items)
            .ok()
            .and_then(NonZeroUsize::new)
            .ok_or_else(|| {
                pyo3::exceptions::PyValueError::new_err(format!(
                    "max_items must be at least 1, got {max_items}: without a cache, pass the store itself"
                ))
            })?;
        let max_marker_bytes = max_marker_bytes
            .map(|bytes| {
                usize::try_from(bytes).map_err(|_| {
                    pyo3::exceptions::PyValueError::new_err(format!(
                        "max_marker_bytes must not be negative, got {bytes}"
                    ))
                })
            })
            .transpose()?;
        let cache = CacheSettings {
            items: max_items,
            age: max_age.map(seconds).transpose()?,
            marker_bytes: max_marker_bytes,
        };
        Ok(Self {
            lazy: Arc::new(Lazy::new(Spec::Cached {
                store: inner,
                cache,
            })),
        })
    }
    }
);

fn redis_settings(
    namespace: Option<String>,
    connection_timeout: Option<&Bound<'_, PyAny>>,
    response_timeout: Option<&Bound<'_, PyAny>>,
) -> PyResult<RedisSettings> {
    Ok(RedisSettings {
        namespace,
        connection_timeout: connection_timeout.map(seconds).transpose()?,
        response_timeout: response_timeout.map(seconds).transpose()?,
    })
}

/// A store's description without its URLs' passwords.
fn describe(spec: &Spec) -> String {
    let hide = |url: &str| match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}://…@{}", &url[..scheme], &url[at + 1..])
        }
        _ => url.to_owned(),
    };
    match spec {
        Spec::Memory => String::new(),
        Spec::Redis { url, .. } | Spec::Postgres { url, .. } => format!("{:?}", hide(url)),
        Spec::Cluster { urls, .. } => {
            let urls: Vec<String> = urls.iter().map(|url| hide(url)).collect();
            format!("{urls:?}")
        }
        Spec::Cached { store, cache } => {
            let kind = match store.spec {
                Spec::Memory => "MemoryStore",
                Spec::Redis { .. } => "RedisStore",
                Spec::Cluster { .. } => "RedisClusterStore",
                Spec::Postgres { .. } => "PostgresStore",
                Spec::Cached { .. } => "LocalResultCache",
            };
            format!(
                "{kind}({}), max_items={}",
                describe(&store.spec),
                cache.items
            )
        }
    }
}

/// Connects `lazy` in this process, with the GIL released.
fn check(py: Python<'_>, lazy: &Arc<Lazy>) -> PyResult<()> {
    let handle = crate::runtime::handle()?;
    let lazy = Arc::clone(lazy);
    py.detach(move || handle.block_on(lazy.get()))
        .map(drop)
        .map_err(|err| to_py_err(&idempotask::Error::Store(err)))
}

/// Any of the store classes, as a call takes it.
pub(crate) fn lazy_of(store: &Bound<'_, PyAny>) -> PyResult<Arc<Lazy>> {
    if let Ok(store) = store.cast::<MemoryStore>() {
        return Ok(Arc::clone(&store.get().lazy));
    }
    if let Ok(store) = store.cast::<RedisStore>() {
        return Ok(Arc::clone(&store.get().lazy));
    }
    if let Ok(store) = store.cast::<RedisClusterStore>() {
        return Ok(Arc::clone(&store.get().lazy));
    }
    if let Ok(store) = store.cast::<PostgresStore>() {
        return Ok(Arc::clone(&store.get().lazy));
    }
    if let Ok(store) = store.cast::<LocalResultCache>() {
        return Ok(Arc::clone(&store.get().lazy));
    }
    Err(pyo3::exceptions::PyTypeError::new_err(format!(
        "expected an idempotask store (MemoryStore, RedisStore, RedisClusterStore, PostgresStore, LocalResultCache), got {}",
        store.get_type().name()?
    )))
}
