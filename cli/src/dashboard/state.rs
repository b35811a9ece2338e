//! What the dashboard's handlers share.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::auth::Access;
use super::calls::History;
use super::view::TaskView;
use crate::target::Target;

/// What the command line asked of the dashboard.
pub(crate) struct Options {
    pub(crate) tasks: Vec<String>,
    pub(crate) listen: SocketAddr,
    pub(crate) hash_keys: bool,
    pub(crate) audit_log: Option<PathBuf>,
    /// Pages of the workers' metrics in Prometheus' text format, for the per-task counters.
    pub(crate) metrics: Vec<String>,
}

/// What every handler shares.
pub(crate) struct Shared {
    pub(crate) target: Target,
    pub(crate) options: Options,
    pub(crate) access: Access,
    /// The last walk of the store, which requests within [`FRESH`] of it share; its lock is
    /// held through a walk, so that several open pages walk the store once, not each.
    pub(crate) recent: tokio::sync::Mutex<Option<Recent>>,
    /// Reads the workers' metrics.
    pub(crate) client: reqwest::Client,
    /// The give-ups of earlier reads of the metrics.
    pub(crate) history: std::sync::Mutex<History>,
}

/// How long a walk of the store answers every request for the same page.
pub(crate) const FRESH: Duration = Duration::from_secs(2);

/// A walk of the store: when, for which page of done units (task, cursor), and what it found.
pub(crate) struct Recent {
    pub(crate) at: Instant,
    pub(crate) paging: (Option<String>, Option<String>),
    pub(crate) views: Vec<TaskView>,
    /// The metrics pages that did not answer, and why.
    pub(crate) unread: Vec<String>,
}
