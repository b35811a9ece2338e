//! `list`: a task's units, with counts.

use std::time::Duration;

use serde_json::json;

use crate::exit::{Exit, Failure};
use crate::render::{self, Counts};
use crate::target::Target;

use super::shared::Found;

/// Which of a task's units `list` shows; the counts are always the whole task's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Only {
    All,
    Done,
    Locked,
    /// In doubt, and with `older_than`, run out at least that long ago.
    InDoubt {
        older_than: Option<Duration>,
    },
}

/// `list`: every done, locked and in-doubt unit of a task, and the odd keys under its pattern,
/// with counts; unknown task → exit 4.
pub(crate) async fn list(target: &Target, task: &str, only: Only) -> Result<Found, Failure> {
    Target::check_task(task)?;
    let listing = target.list(task).await?;
    let scanned = listing.servers_scanned;
    let done = listing.entries.values().filter(|e| e.done).count();
    let locked = listing.entries.values().filter(|e| e.locked).count();
    let in_doubt = listing.entries.values().filter(|e| e.in_doubt).count();
    let flagged = listing
        .entries
        .values()
        .filter(|e| e.problem.is_some())
        .count();
    let shown: Vec<_> = listing
        .entries
        .values()
        .filter(|e| match only {
            Only::All => true,
            Only::Done => e.done,
            Only::Locked => e.locked,
            Only::InDoubt { older_than } => {
                e.in_doubt
                    && older_than.is_none_or(|age| {
                        e.expired_for_ms
                            .is_some_and(|ms| u128::from(ms) >= age.as_millis())
                    })
            }
        })
        .collect();
    if listing.keys_seen == 0 {
        return Err(Failure::new(
            Exit::Unknown,
            "unknown_task",
            format!(
                "unknown task: `{task}` has no keys in {}; check --task and {}",
                target.scope_text(),
                target.scope_flag()
            ),
        ));
    }
    let (scope, name) = target.scope();
    let json = json!({
        scope: name,
        "task": task,
        "cluster": target.is_cluster(),
        "servers_scanned": scanned,
        "done": done,
        "locked": locked,
        "in_doubt": in_doubt,
        "flagged": flagged,
        "entries": shown,
    });
    let cluster_masters = target.is_cluster().then_some(scanned);
    let text = render::listing(
        task,
        &format!("{scope} {name}"),
        cluster_masters,
        Counts {
            done,
            locked,
            in_doubt,
            flagged,
        },
        &shown,
    );
    let exit = Exit::Ok;
    Ok(Found { json, text, exit })
}
