//! For operators: what a store holds for a unit ([`Status`], [`Marker`]) and where Redis keeps it
//! ([`RedisKeys`]). [`Task::status`](crate::Task::status) answers the first question; the
//! `idempotask` command line tool is built on these.

pub use crate::marker::{Marker, MarkerError, StoredResult};
pub use crate::status::{Done, Status};
#[cfg(feature = "redis")]
pub use crate::store::redis::{ParsedKey, RedisKeys};
