//! Models of idempotask's store protocol, checked exhaustively by the
//! [stateright](https://docs.rs/stateright) model checker in this crate's tests: every
//! interleaving of the workers' calls, expiries, pauses and crashes, up to the model's bounds.
//!
//! - [`steps`]: a unit with several side effects, each recorded in the unit's journal under
//!   the lock and the fencing token, resumed after a crash. The protocol is
//!   designed here first; the runtime follows it.
//!
//! ```
//! use idempotask_protocol_model::steps::{Bug, Policy, StepsModel};
//! use stateright::{Checker, Model};
//!
//! let model = StepsModel { steps: 2, workers: 2, deliveries: 1, policy: Policy::Hold, bug: Bug::None };
//! model.checker().spawn_bfs().join().assert_properties();
//! ```

pub mod steps;
