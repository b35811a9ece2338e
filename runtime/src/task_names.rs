//! Which `#[idempotent_task]` owns each task name in this process, so that two functions whose
//! names collide are refused before either one's units are shared.

use std::collections::HashMap;
use std::panic::Location;
use std::sync::{LazyLock, PoisonError, RwLock};

use crate::error::Error;
use crate::task::Task;

/// Task name → where the attribute that first used it was expanded.
static OWNERS: LazyLock<RwLock<HashMap<String, &'static Location<'static>>>> =
    LazyLock::new(RwLock::default);

/// Input: a task about to run. Output: `Ok` unless another `#[idempotent_task]` of this
/// process already used the same name; the first one used keeps it.
///
/// Tasks built by hand are not checked: their author typed the name, and sharing it on purpose
/// is how a tool reads a worker's results. Every call asks: after a task's first call that is a
/// lookup under a read lock, never held across an await.
pub(crate) fn claim(task: &Task) -> Result<(), Error> {
    let Some(defined_at) = task.defined_at else {
        return Ok(());
    };
    let known = OWNERS
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .get(task.name())
        .copied();
    let owner = match known {
        Some(owner) => owner,
        None => *OWNERS
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(task.name().to_owned())
            .or_insert(defined_at),
    };
    if owner == defined_at {
        return Ok(());
    }
    Err(Error::TaskNameTaken {
        task: task.name().to_owned(),
        first: owner.to_string(),
        second: defined_at.to_string(),
    })
}
