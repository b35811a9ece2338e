//! The four commands, one module each. Each returns what it found as a [`Found`]; `main`
//! prints it.

mod forget;
mod list;
mod resolve;
mod shared;
mod status;

pub(crate) use forget::forget;
pub(crate) use list::{Only, list};
pub(crate) use resolve::{InDoubt, Settle, read_in_doubt, resolve};
pub(crate) use shared::{Found, changed, confirm, unit_json};
pub(crate) use status::status;
