//! The three commands. Each returns what it found as a [`Found`]; `main` prints it.

use std::io::{BufRead, IsTerminal, Write};

use idempotask::ops::Status;
use idempotask::store::UnitOfWork;
use serde_json::{Value, json};

use crate::exit::{Exit, Failure};
use crate::render::{self, result_json};
use crate::scan::{Listing, list_node};
use crate::target::Target;
use crate::time::millis;

/// What a command found: the JSON document, the text for people, and the exit code.
pub(crate) struct Found {
    pub(crate) json: Value,
    pub(crate) text: String,
    pub(crate) exit: Exit,
}

/// Whether `task` has any key at all, on any server.
async fn task_exists(target: &Target, task: &str) -> Result<bool, Failure> {
    let pattern = target.task_pattern(task)?;
    for mut node in target.nodes().await? {
        if node
            .has_any(&pattern)
            .await
            .map_err(|err| target.redis_failure("scan", &err))?
        {
            return Ok(true);
        }
    }
    Ok(false)
}

/// `status`: done (exit 0), locked (3) or unknown (4).
pub(crate) async fn status(target: &Target, task: &str, key: &str) -> Result<Found, Failure> {
    let unit = target.unit(task, key)?;
    let mut json = json!({
        "namespace": target.keys.namespace(),
        "task": task,
        "key": key,
        "digest": unit.digest(),
    });
    let (text, exit) = match target.status(&unit).await? {
        Status::Done(done) => {
            json["state"] = json!("done");
            json["fencing_token"] = json!(done.marker.fencing_token());
            json["result"] = result_json(&done.marker);
            json["ttl_ms"] = json!(done.ttl.map(millis));
            (render::done(&unit, &done), Exit::Ok)
        }
        Status::Locked { lock_ttl, .. } => {
            let age = target.token_age_ms(&unit).await?;
            json["state"] = json!("locked");
            json["lock_ttl_ms"] = json!(millis(lock_ttl));
            json["token_age_ms"] = json!(age);
            (render::locked(&unit, lock_ttl, age), Exit::Locked)
        }
        _ => {
            let known = task_exists(target, task).await?;
            json["state"] = json!("unknown");
            json["task_has_keys"] = json!(known);
            (
                render::unknown(&unit, target.keys.namespace(), known),
                Exit::Unknown,
            )
        }
    };
    Ok(Found { json, text, exit })
}

/// `forget`: deletes a done key's marker after a confirmation; refuses while it is locked.
pub(crate) async fn forget(
    target: &Target,
    task: &str,
    key: &str,
    yes: bool,
) -> Result<Found, Failure> {
    let unit = target.unit(task, key)?;
    let done = match target.status(&unit).await? {
        Status::Done(done) => done,
        Status::Locked { lock_ttl, .. } => return Err(locked_refusal(&unit, lock_ttl)),
        _ => {
            return Err(Failure::new(
                Exit::Unknown,
                "unknown",
                format!(
                    "nothing to forget: task `{task}` has no marker for key `{key}` in namespace `{}`",
                    target.keys.namespace()
                ),
            ));
        }
    };
    if !yes {
        confirm(&render::done(&unit, &done))?;
    }
    let deleted = target.forget(&unit).await?;
    let json = json!({
        "namespace": target.keys.namespace(),
        "task": task,
        "key": key,
        "digest": unit.digest(),
        "forgotten": deleted,
        "fencing_token": done.marker.fencing_token(),
    });
    let text = if deleted {
        format!("forgot {task} {key:?}; the next delivery runs it again")
    } else {
        format!("{task} {key:?} expired or was forgotten meanwhile; nothing deleted")
    };
    Ok(Found {
        json,
        text,
        exit: Exit::Ok,
    })
}

fn locked_refusal(unit: &UnitOfWork, lock_ttl: std::time::Duration) -> Failure {
    Failure::new(
        Exit::Locked,
        "locked",
        format!(
            "refusing to forget {} {:?}: it is locked (a delivery is running it; the lock expires in {}); try again once it has finished",
            unit.task(),
            unit.key(),
            crate::time::human(lock_ttl)
        ),
    )
}

/// Asks on the terminal; without one, refuses (a script must say `--yes`).
fn confirm(what: &str) -> Result<(), Failure> {
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        return Err(Failure::usage(
            "refusing to forget without confirmation: stdin is not a terminal; pass --yes to forget non-interactively",
        ));
    }
    let mut stderr = std::io::stderr();
    let _ = write!(
        stderr,
        "{what}\nForget it, so that the next delivery runs the work again? [y/N] "
    );
    let _ = stderr.flush();
    let mut answer = String::new();
    stdin
        .lock()
        .read_line(&mut answer)
        .map_err(|err| Failure::new(Exit::Error, "io", format!("cannot read the answer: {err}")))?;
    if matches!(answer.trim(), "y" | "Y" | "yes" | "YES" | "Yes") {
        Ok(())
    } else {
        Err(Failure::new(
            Exit::Error,
            "declined",
            "not confirmed; nothing was deleted",
        ))
    }
}

/// `list`: every done and locked unit of a task, with counts; unknown task → exit 4.
pub(crate) async fn list(
    target: &Target,
    task: &str,
    only_locked: bool,
    only_done: bool,
) -> Result<Found, Failure> {
    let pattern = target.task_pattern(task)?;
    let nodes = target.nodes().await?;
    let scanned = nodes.len();
    let mut listing = Listing::default();
    for mut node in nodes {
        let found = list_node(&mut node, &target.keys, &pattern)
            .await
            .map_err(|err| target.redis_failure("scan", &err))?;
        listing.merge(found);
    }
    let done = listing.entries.values().filter(|e| e.done).count();
    let locked = listing.entries.values().filter(|e| e.locked).count();
    let shown: Vec<_> = listing
        .entries
        .values()
        .filter(|e| (!only_locked || e.locked) && (!only_done || e.done))
        .collect();
    if listing.keys_seen == 0 {
        return Err(Failure::new(
            Exit::Unknown,
            "unknown_task",
            format!(
                "unknown task: `{task}` has no keys in namespace `{}`; check --task and --namespace",
                target.keys.namespace()
            ),
        ));
    }
    let json = json!({
        "namespace": target.keys.namespace(),
        "task": task,
        "cluster": target.is_cluster(),
        "servers_scanned": scanned,
        "done": done,
        "locked": locked,
        "entries": shown,
    });
    let cluster_masters = target.is_cluster().then_some(scanned);
    let text = render::listing(
        task,
        target.keys.namespace(),
        cluster_masters,
        done,
        locked,
        &shown,
    );
    let exit = Exit::Ok;
    Ok(Found { json, text, exit })
}
