//! A PostgreSQL store for [`idempotask`]: locks and completion markers in one table,
//! for services that have PostgreSQL and no Redis, and transactional completion for work that is
//! itself a write to the same database.
//!
//! - [`PostgresStore`] implements [`Store`](idempotask::store::Store): every
//!   [`Task`](idempotask::Task) runs on it as on any store, a fresh execution in two statements
//!   and a duplicate in one. A body's steps are recorded in a second table beside it
//!   (`<table>_steps`), which a unit without steps never touches.
//! - [`PostgresStore::transaction`] makes a [`PostgresTransaction`] of a sqlx transaction, for
//!   [`Call::run_in_transaction`](idempotask::Call::run_in_transaction): the body's writes and
//!   the unit's marker commit together, so a crash between the two cannot happen.
//!
//! - [`operator`]: for operators, what one unit's row holds raw, a forget of exactly the marker that
//!   was shown, the resolution of a unit in doubt against exactly the lock that was shown, and
//!   a task's units page by page (the `idempotask` command uses them).
//!
//! sqlx is part of this crate's public API (`PgPool`, `Transaction`, `PgConnection`): use the
//! sqlx 0.9 your service already has.
//!
#![doc = include_str!("deployment.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod batch;
mod builder;
mod checkout;
mod errors;
pub mod operator;
mod rows;
mod single;
mod statements;
mod steps;
mod store;
mod table;
mod transaction_steps;
mod transactional;

pub use builder::PostgresStoreBuilder;
pub use store::PostgresStore;
pub use transactional::PostgresTransaction;
