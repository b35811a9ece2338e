//! For operators: what a store holds for a unit ([`Status`], [`Marker`]), and what a
//! compare-and-forget did with it ([`Forgot`]).
//! [`Task::status`](crate::Task::status) answers it for one unit; the `idempotask` command line
//! tool is built on these and on each store crate's own layout (`idempotask_redis::RedisKeys`).

pub use crate::forgot::Forgot;
pub use crate::marker::{Marker, MarkerError, StoredResult};
pub use crate::status::{Done, Status};
