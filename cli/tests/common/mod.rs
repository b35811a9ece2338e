//! What the CLI's test files share: running the binary as a script would, reading its JSON,
//! and the scenarios that are the same on every backend.

// Each test file runs the scenarios on its own backend, so each leaves the other's part unused.
#![allow(dead_code)]

use std::process::{Command, Output, Stdio};
use std::time::Duration;

use idempotask::Task;
use idempotask::store::{Fencing, LockToken, Store, UnitOfWork};
use idempotask_postgres::PostgresStore;
use idempotask_redis::RedisStore;
use idempotask_test_support::RedisServer;
use idempotask_test_support::postgres::PostgresServer;
use serde_json::Value;

/// Runs the binary with `url_flag url` (`--redis-url`, `--database-url`) and `args`, with
/// neither `REDIS_URL` nor `DATABASE_URL` from the test's environment; stdin is empty, as in a
/// script. Answers the exit code, stdout and stderr.
pub(crate) fn run(url_flag: &str, url: &str, args: &[&str]) -> (i32, String, String) {
    let Output {
        status,
        stdout,
        stderr,
    } = Command::new(env!("CARGO_BIN_EXE_idempotask"))
        .env_remove("REDIS_URL")
        .env_remove("DATABASE_URL")
        .arg(url_flag)
        .arg(url)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8(stdout).unwrap(),
        String::from_utf8(stderr).unwrap(),
    );
    println!("$ idempotask {}\n{stdout}{stderr}", args.join(" "));
    (status.code().expect("exited"), stdout, stderr)
}

/// The one JSON document on stdout.
pub(crate) fn json(stdout: &str) -> Value {
    serde_json::from_str(stdout).unwrap_or_else(|err| panic!("{err}: {stdout}"))
}

/// A runtime for one test: a sqlx pool's connections belong to the runtime that opened them,
/// so a test that keeps a PostgreSQL store uses one runtime throughout.
pub(crate) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// What a scenario needs of a backend: the URL the binary is given, and a way to plant a done
/// unit or a held lock as a delivery would. The scenarios below run on each store alike; what
/// only one store has (a cluster, a receipt key, `--table`, paging) stays in its own file.
pub(crate) trait Backend {
    /// The flag that gives the binary this backend's URL.
    const URL_FLAG: &'static str;

    /// The URL of the server the test started.
    fn url(&self) -> String;

    /// Runs `task` for each key (the body returns `{"charge": "ch_<key>"}`), with fencing.
    fn complete(&self, task: &str, keys: &[&str]);

    /// Takes the lock of `task`/`key` as a running delivery would, and keeps it for `LONG`.
    fn lock(&self, task: &str, key: &str);

    /// Runs the binary with `args` against this backend.
    fn idempotask(&self, args: &[&str]) -> (i32, String, String) {
        run(Self::URL_FLAG, &self.url(), args)
    }

    /// `status --json` of `task`/`key`; the exit code is checked against the state it reports.
    fn status_json(&self, task: &str, key: &str) -> Value {
        let (code, out, _) = self.idempotask(&["status", "--json", "--task", task, "--key", key]);
        let status = json(&out);
        let expected = match status["state"].as_str() {
            Some("done") => 0,
            Some("locked") => 3,
            Some("unknown") => 4,
            Some("in_doubt") => 5,
            _ => 1,
        };
        assert_eq!(code, expected, "{status}");
        status
    }
}

/// How long a planted lock is held: longer than any test runs.
pub(crate) const LONG: Duration = Duration::from_secs(600);

/// Runs `task` for each key on `store` (the body returns `{"charge": "ch_<key>"}`).
pub(crate) async fn complete_on(store: &(impl Store + Clone), task: &str, keys: &[&str]) {
    for key in keys {
        Task::named(task)
            .fencing(true)
            .call(*key)
            .store(store.clone())
            .run(async {
                Ok::<_, idempotask::Error>(serde_json::json!({ "charge": format!("ch_{key}") }))
            })
            .await
            .unwrap();
    }
}

/// Takes the lock of `task`/`key` on `store` and keeps it for [`LONG`].
pub(crate) async fn lock_on(store: &impl Store, task: &str, key: &str) {
    let unit = UnitOfWork::new(task, key).unwrap();
    store
        .begin(&unit, &LockToken::generate(), LONG, Fencing::On)
        .await
        .unwrap();
}

/// How long a lock left in doubt is remembered after it ran out: longer than any test runs.
pub(crate) const DOUBT_MEMORY: Duration = Duration::from_secs(60);

/// Leaves each of `task`'s `keys` in doubt on `store`, as a worker killed after its side effect
/// does: a lock of 100 ms, remembered for [`DOUBT_MEMORY`], taken and left to run out.
pub(crate) async fn leave_in_doubt_on(
    store: &impl Store,
    task: &str,
    keys: &[&str],
    fencing: Fencing,
) {
    let short = Duration::from_millis(100);
    for key in keys {
        let unit = UnitOfWork::new(task, *key).unwrap();
        let abandoned = LockToken::generate().with_doubt_memory(DOUBT_MEMORY);
        store
            .begin(&unit, &abandoned, short, fencing)
            .await
            .unwrap();
    }
    tokio::time::sleep(short + Duration::from_millis(50)).await;
}

/// A redis-server the test started, in the default namespace.
pub(crate) struct Redis<'a>(pub(crate) &'a RedisServer);

impl Redis<'_> {
    /// [`Backend::complete`] in `namespace`.
    pub(crate) fn complete_in(&self, namespace: &str, task: &str, keys: &[&str]) {
        runtime().block_on(async {
            let store = RedisStore::builder(self.0.url())
                .namespace(namespace)
                .connect()
                .await
                .unwrap();
            complete_on(&store, task, keys).await;
        });
    }
}

impl Backend for Redis<'_> {
    const URL_FLAG: &'static str = "--redis-url";

    fn url(&self) -> String {
        self.0.url()
    }

    fn complete(&self, task: &str, keys: &[&str]) {
        self.complete_in("default", task, keys);
    }

    fn lock(&self, task: &str, key: &str) {
        runtime().block_on(async { lock_on(&self.0.store().await, task, key).await });
    }
}

/// A PostgreSQL server the test started, its default table migrated, and the one runtime the
/// store's pool belongs to.
pub(crate) struct Postgres {
    pub(crate) server: PostgresServer,
    pub(crate) rt: tokio::runtime::Runtime,
    pub(crate) store: PostgresStore,
}

impl Postgres {
    /// Starts the server and migrates the default table.
    pub(crate) fn start() -> Self {
        let server = PostgresServer::start();
        let rt = runtime();
        let store = rt.block_on(server.store());
        Self { server, rt, store }
    }
}

impl Backend for Postgres {
    const URL_FLAG: &'static str = "--database-url";

    fn url(&self) -> String {
        self.server.url()
    }

    fn complete(&self, task: &str, keys: &[&str]) {
        self.rt.block_on(complete_on(&self.store, task, keys));
    }

    fn lock(&self, task: &str, key: &str) {
        self.rt.block_on(lock_on(&self.store, task, key));
    }
}

/// Input: a backend where `charge`/`order-1` is done and `charge`/`order-2` locked. Output: the
/// `status --json` of each, after the checks every backend passes (text, JSON, exit codes).
pub(crate) fn status_says_done_locked_or_unknown(backend: &impl Backend) -> (Value, Value) {
    let status = |key: &str| backend.idempotask(&["status", "--task", "charge", "--key", key]);
    let (code, out, _) = status("order-1");
    assert_eq!(code, 0);
    assert!(out.starts_with("charge \"order-1\": done"), "{out}");
    assert!(
        out.contains(r#"result         {"charge":"ch_order-1"}"#),
        "{out}"
    );
    let done = backend.status_json("charge", "order-1");
    assert_eq!(done["state"], "done");
    assert_eq!(done["result"]["charge"], "ch_order-1");
    assert!(done["fencing_token"].as_u64().unwrap() > 0);
    assert!(done["ttl_ms"].as_u64().unwrap() > 0);

    let (code, out, _) = status("order-2");
    assert_eq!(code, 3);
    assert!(out.contains("locked"), "{out}");
    let locked = backend.status_json("charge", "order-2");
    assert_eq!(locked["state"], "locked");
    assert!(locked["lock_ttl_ms"].as_u64().unwrap() > 0);

    let (code, out, _) = status("order-3");
    assert_eq!(code, 4);
    assert!(out.contains("unknown") && !out.contains("note:"), "{out}");
    let unknown = backend.status_json("charge", "order-3");
    assert_eq!(unknown["state"], "unknown");
    assert_eq!(unknown["task_has_keys"], true);
    (done, locked)
}

/// Input: a backend where `charge`/`order-1` is done and `charge`/`order-2` locked. Output: the
/// JSON of the `forget` that deleted `order-1`, after the checks every backend passes: a lock
/// is refused (with `--force` too), a script without `--yes` deletes nothing, a confirmed
/// marker goes, and a second `forget` finds nothing (exit 4).
pub(crate) fn forget_refuses_a_lock_and_deletes_a_confirmed_marker(
    backend: &impl Backend,
) -> Value {
    let forget = |flags: &[&str], key: &str| {
        let mut args = vec!["forget", "--task", "charge", "--key", key];
        args.extend(flags);
        backend.idempotask(&args)
    };
    let status = |key: &str| {
        backend
            .idempotask(&["status", "--task", "charge", "--key", key])
            .0
    };
    for flags in [&["--yes"][..], &["--yes", "--force"]] {
        let (code, _, err) = forget(flags, "order-2");
        assert_eq!(code, 3, "{flags:?}");
        assert!(
            err.contains("refusing to forget charge \"order-2\": it is locked"),
            "{err}"
        );
        assert_eq!(status("order-2"), 3, "the lock stays");
    }

    // No terminal and no `--yes`: a usage error, nothing deleted.
    let (code, _, err) = forget(&[], "order-1");
    assert_eq!(code, 2);
    assert!(err.contains("pass --yes"), "{err}");
    assert_eq!(status("order-1"), 0);

    let (code, out, _) = forget(&["--yes", "--json"], "order-1");
    assert_eq!(code, 0);
    let forgotten = json(&out);
    assert_eq!(forgotten["forgotten"], true);
    assert_eq!(status("order-1"), 4);
    let (code, out, _) = forget(&["--yes", "--json"], "order-1");
    assert_eq!(code, 4);
    assert_eq!(json(&out)["error"]["kind"], "unknown");
    forgotten
}

/// `forget` of `charge`/`order-1` on a terminal (`script` gives it one, so that it asks):
/// `meanwhile` writes a newer marker while the operator reads the question, then the operator
/// answers yes. The command deletes nothing and says why; the caller checks the newer marker
/// is still there.
pub(crate) fn forget_keeps_a_marker_written_while_it_asks<B: Backend>(
    backend: &B,
    meanwhile: impl FnOnce(),
) {
    let (code, seen) = answer_yes_after(backend, "forget --task charge --key order-1", meanwhile);
    assert_eq!(code, 1, "{seen}");
    assert!(
        seen.contains("nothing deleted: the value of charge \"order-1\" changed"),
        "{seen}"
    );
}

/// Runs the binary with `args` on a terminal (`script` gives it one, so that it asks for
/// confirmation), runs `meanwhile` once the question is shown, then answers yes. Answers the
/// exit code and everything the terminal showed.
pub(crate) fn answer_yes_after<B: Backend>(
    backend: &B,
    args: &str,
    meanwhile: impl FnOnce(),
) -> (i32, String) {
    use std::io::{Read, Write};

    let command = format!(
        "{} {} {} {args}",
        env!("CARGO_BIN_EXE_idempotask"),
        B::URL_FLAG,
        backend.url()
    );
    let mut child = Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .env("SHELL", "/bin/sh")
        .env_remove("REDIS_URL")
        .env_remove("DATABASE_URL")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("`script` (util-linux) runs the command on a terminal");
    let mut stdout = child.stdout.take().unwrap();
    let mut seen = Vec::new();
    let mut byte = [0_u8; 1];
    while !String::from_utf8_lossy(&seen).contains("[y/N]") {
        assert_eq!(
            stdout.read(&mut byte).unwrap(),
            1,
            "{}",
            String::from_utf8_lossy(&seen)
        );
        seen.push(byte[0]);
    }
    meanwhile();
    child.stdin.take().unwrap().write_all(b"y\n").unwrap();
    let status = child.wait().unwrap();
    stdout.read_to_end(&mut seen).unwrap();
    let seen = String::from_utf8_lossy(&seen).into_owned();
    println!("{seen}");
    (status.code().expect("exited"), seen)
}
