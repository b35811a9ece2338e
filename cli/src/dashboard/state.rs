//! What the dashboard's handlers share.

use std::net::SocketAddr;
use std::path::PathBuf;

use super::auth::Access;
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
}
