//! For operators: what a store holds for a unit ([`Status`], [`Marker`]).
//! [`Task::status`](crate::Task::status) answers it for one unit; the `idempotask` command line
//! tool is built on these and on each store crate's own layout (`idempotask_redis::RedisKeys`).

pub use crate::marker::{Marker, MarkerError, StoredResult};
pub use crate::status::{Done, Status};
