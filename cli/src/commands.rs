//! The three commands. Each returns what it found as a [`Found`]; `main` prints it.

use std::io::{BufRead, IsTerminal, Write};

use idempotask::{RedisKeys, RedisStore, Status, Store, Task, UnitOfWork};
use serde_json::{Value, json};

use crate::exit::{Exit, Failure};
use crate::render::{self, result_json};
use crate::scan::{Listing, list_node};
use crate::time::{epoch_millis, millis, rfc3339};

/// What a command found: the JSON document, the text for people, and the exit code.
pub(crate) struct Found {
    pub(crate) json: Value,
    pub(crate) text: String,
    pub(crate) exit: Exit,
}

/// The store and the namespace's layout, with the URL for error messages.
pub(crate) struct Target {
    pub(crate) store: RedisStore,
    pub(crate) keys: RedisKeys,
    pub(crate) url: String,
}

impl Target {
    pub(crate) async fn connect(url: &str, namespace: &str) -> Result<Self, Failure> {
        let keys = RedisKeys::new(namespace).map_err(|err| Failure::usage(err.to_string()))?;
        let store = RedisStore::builder(url)
            .namespace(namespace)
            .connect()
            .await
            .map_err(|err| Failure::store(&err, url))?;
        Ok(Self {
            store,
            keys,
            url: url.to_owned(),
        })
    }

    fn redis_failure(&self, operation: &'static str, err: &redis::RedisError) -> Failure {
        let kind = if err.is_timeout() {
            idempotask::StoreErrorKind::Timeout
        } else if err.is_io_error() || err.is_connection_dropped() || err.is_connection_refusal() {
            idempotask::StoreErrorKind::Unreachable
        } else {
            idempotask::StoreErrorKind::Rejected
        };
        let store_err = idempotask::StoreError::new(operation, kind, false, err.to_string())
            .with_source(err.clone());
        Failure::store(&store_err, &self.url)
    }

    /// Whether the task has any key at all (SCAN stops at the first).
    async fn task_exists(&self, task: &str) -> Result<bool, Failure> {
        let pattern = self.task_pattern(task)?;
        let mut connection = self.store.connection();
        let mut cursor: u64 = 0;
        loop {
            let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut connection)
                .await
                .map_err(|err| self.redis_failure("scan", &err))?;
            if !batch.is_empty() {
                return Ok(true);
            }
            if next == 0 {
                return Ok(false);
            }
            cursor = next;
        }
    }

    fn task_pattern(&self, task: &str) -> Result<String, Failure> {
        self.keys
            .task_pattern(task)
            .map_err(|err| Failure::usage(err.to_string()))
    }

    fn unit(&self, task: &str, key: &str) -> Result<UnitOfWork, Failure> {
        UnitOfWork::with_limit(task, key, self.store.max_key_len())
            .map_err(|err| Failure::usage(err.to_string()))
    }

    async fn status(&self, unit: &UnitOfWork) -> Result<Status, Failure> {
        Task::named(unit.task())
            .status(unit.key(), &self.store)
            .await
            .map_err(|err| match err {
                idempotask::Error::Store(err) => Failure::store(&err, &self.url),
                other => Failure::new(Exit::Error, "unreadable", other.to_string()),
            })
    }

    /// How long ago the current lock was granted, from the fencing counter: a token is never
    /// below the server's clock in milliseconds when it is granted, so `now - token` is the age
    /// (or a little less when several grants shared one millisecond).
    async fn token_age_ms(&self, unit: &UnitOfWork) -> Result<Option<u64>, Failure> {
        let [_, _, fence] = self.store.keys(unit);
        let mut connection = self.store.connection();
        let (token, (secs, micros)): (Option<u64>, (u64, u64)) = redis::pipe()
            .cmd("GET")
            .arg(&fence)
            .cmd("TIME")
            .query_async(&mut connection)
            .await
            .map_err(|err| self.redis_failure("token age", &err))?;
        let now_ms = secs * 1000 + micros / 1000;
        Ok(token.map(|token| now_ms.saturating_sub(token)))
    }
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
            let completed = epoch_millis(done.marker.completed_at());
            json["state"] = json!("done");
            json["completed_at"] = json!(rfc3339(completed));
            json["completed_at_ms"] = json!(completed);
            json["fencing_token"] = json!(done.marker.fencing_token());
            json["result"] = result_json(&done.marker);
            json["ttl_ms"] = json!(done.ttl.map(millis));
            json["lock_ttl_ms"] = json!(done.lock_ttl.map(millis));
            (render::done(&unit, &done), Exit::Ok)
        }
        Status::Locked { lock_ttl } => {
            let age = target.token_age_ms(&unit).await?;
            json["state"] = json!("locked");
            json["lock_ttl_ms"] = json!(millis(lock_ttl));
            json["token_age_ms"] = json!(age);
            (render::locked(&unit, lock_ttl, age), Exit::Locked)
        }
        _ => {
            let known = target.task_exists(task).await?;
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
        Status::Done(done) if done.lock_ttl.is_none() => done,
        Status::Done(done) => return Err(locked_refusal(&unit, done.lock_ttl.unwrap_or_default())),
        Status::Locked { lock_ttl } => return Err(locked_refusal(&unit, lock_ttl)),
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
    let deleted = target
        .store
        .forget(&unit)
        .await
        .map_err(|err| Failure::store(&err, &target.url))?;
    let json = json!({
        "namespace": target.keys.namespace(),
        "task": task,
        "key": key,
        "digest": unit.digest(),
        "forgotten": deleted,
        "fencing_token": done.marker.fencing_token(),
    });
    let text = if deleted {
        format!(
            "forgot {task} {key:?} (fencing token {}); the next delivery runs it again",
            done.marker.fencing_token()
        )
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
    // One server today; a cluster target would run `list_node` on every master and merge.
    let mut connection = target.store.connection();
    let listing: Listing = list_node(&mut connection, &target.keys, &pattern)
        .await
        .map_err(|err| target.redis_failure("scan", &err))?;
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
        "done": done,
        "locked": locked,
        "entries": shown,
    });
    let text = render::listing(task, target.keys.namespace(), done, locked, &shown);
    let exit = Exit::Ok;
    Ok(Found { json, text, exit })
}
