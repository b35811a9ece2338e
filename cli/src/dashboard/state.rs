//! What the dashboard's handlers share.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::auth::Access;
use super::view::TaskView;
use crate::target::Target;

/// What the command line asked of the dashboard.
pub(crate) struct Options {
    pub(crate) tasks: Vec<String>,
    pub(crate) listen: SocketAddr,
    pub(crate) hash_keys: bool,
    pub(crate) audit_log: Option<PathBuf>,
}

/// What every handler shares.
pub(crate) struct Shared {
    pub(crate) target: Target,
    pub(crate) options: Options,
    pub(crate) access: Access,
    /// The last walk of the store, which requests within [`FRESH`] of it share; its lock is
    /// held through a walk, so that several open pages walk the store once, not each.
    pub(crate) recent: tokio::sync::Mutex<Option<Recent>>,
}

/// How long a walk of the store answers every request for the same page.
pub(crate) const FRESH: Duration = Duration::from_secs(2);

/// A walk of the store: when, for which page of done units (task, cursor), and what it found.
pub(crate) struct Recent {
    pub(crate) at: Instant,
    pub(crate) paging: (Option<String>, Option<String>),
    pub(crate) views: Vec<TaskView>,
}
