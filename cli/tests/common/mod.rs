//! What the CLI's test files share: running the binary as a script would, reading its JSON,
//! and the scenarios that are the same on every backend.

// Each test file runs the scenarios on its own backend, so each leaves the other's part unused.
#![allow(dead_code)]

pub(crate) mod cdp;
pub(crate) mod metrics;
pub(crate) mod web;

use std::process::{Command, Output, Stdio};
use std::time::Duration;

use idempotask::store::{Begin, Fencing, LockToken, StepEntry, Store, UnitOfWork};
use idempotask::{Outcome, Report, Task};
use idempotask_postgres::PostgresStore;
use idempotask_redis::RedisStore;
use idempotask_test_support::RedisServer;
use idempotask_test_support::postgres::PostgresServer;
use serde_json::{Value, json as value};

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

/// What a scenario needs of a backend: the URL the binary is given, and a store to plant done
/// units, held locks and units in doubt with, as deliveries would. The scenarios below run on
/// each store alike; what only one store has (a cluster, a receipt key, `--table`, paging)
/// stays in its own file.
pub(crate) trait Backend {
    /// The flag that gives the binary this backend's URL.
    const URL_FLAG: &'static str;

    /// Where the units live, as `list` names it.
    const SCOPE: &'static str;

    /// The store the scenarios plant units with.
    type Store: Store + Clone + 'static;

    /// The URL of the server the test started.
    fn url(&self) -> String;

    /// Runs `f` with a store of this backend, on the runtime its connections belong to.
    fn with_store<T>(&self, f: impl AsyncFnOnce(Self::Store) -> T) -> T;

    /// Runs `task` for each key (the body returns `{"charge": "ch_<key>"}`), with fencing.
    fn complete(&self, task: &str, keys: &[&str]) {
        self.with_store(async |store| complete_on(&store, task, keys).await);
    }

    /// Takes the lock of `task`/`key` as a running delivery would, and keeps it for `LONG`.
    fn lock(&self, task: &str, key: &str) {
        self.with_store(async |store| lock_on(&store, task, key).await);
    }

    /// Leaves `charge`'s `keys` in doubt (see [`leave_in_doubt_on`]); answers their holders'
    /// tokens, as granted.
    fn leave_in_doubt(&self, keys: &[&str], fencing: Fencing) -> Vec<LockToken> {
        self.with_store(async |store| leave_in_doubt_on(&store, "charge", keys, fencing).await)
    }

    /// [`deliver_on`] this backend.
    fn deliver(&self, key: &str) -> (Report<Value>, bool) {
        self.with_store(async |store| deliver_on(&store, key).await)
    }

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
/// does: a lock of 100 ms, remembered for [`DOUBT_MEMORY`], taken and left to run out. Answers
/// the abandoned tokens, as granted (with their fencing tokens), for a holder that comes back.
pub(crate) async fn leave_in_doubt_on(
    store: &impl Store,
    task: &str,
    keys: &[&str],
    fencing: Fencing,
) -> Vec<LockToken> {
    let short = Duration::from_millis(100);
    let mut abandoned = Vec::new();
    for key in keys {
        let unit = UnitOfWork::new(task, *key).unwrap();
        let token = LockToken::generate().with_doubt_memory(DOUBT_MEMORY);
        match store.begin(&unit, &token, short, fencing).await.unwrap() {
            Begin::Acquired {
                fencing_token,
                in_doubt: None,
                ..
            } => abandoned.push(token.granted(fencing_token)),
            other => panic!("{key} was not free: {other:?}"),
        }
    }
    tokio::time::sleep(short + Duration::from_millis(50)).await;
    abandoned
}

/// Leaves `task`/`key` in doubt on `store` after its holder recorded `entries` (journal
/// entries, as `ctx.step` writes them) as its steps: a body held at the step after them.
pub(crate) async fn hold_at_step_on(store: &impl Store, task: &str, key: &str, entries: &[&str]) {
    let short = Duration::from_millis(100);
    let unit = UnitOfWork::new(task, key).unwrap();
    let token = LockToken::generate().with_doubt_memory(DOUBT_MEMORY);
    let Begin::Acquired { .. } = store
        .begin(&unit, &token, short, Fencing::Off)
        .await
        .unwrap()
    else {
        panic!("{key} is not free");
    };
    for (position, entry) in (0..).zip(entries) {
        let entry = StepEntry::new(position, entry.as_bytes(), LONG);
        assert!(
            store
                .record_step(&unit, &token, entry, short)
                .await
                .unwrap()
        );
    }
    tokio::time::sleep(short + Duration::from_millis(50)).await;
}

/// Calls `charge`/`key` on `store` as the next delivery does (reruns a unit in doubt); the
/// body returns `{"charge":"ch_rerun"}`. Answers its report and whether the body ran.
pub(crate) async fn deliver_on(
    store: &(impl Store + Clone + 'static),
    key: &str,
) -> (Report<Value>, bool) {
    let mut ran = false;
    let report = Task::named("charge")
        .fencing(true)
        .call(key)
        .store(store.clone())
        .run_reported(async {
            ran = true;
            Ok::<_, idempotask::Error>(value!({ "charge": "ch_rerun" }))
        })
        .await
        .unwrap();
    (report, ran)
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
    const SCOPE: &'static str = "namespace default";
    type Store = RedisStore;

    fn url(&self) -> String {
        self.0.url()
    }

    fn with_store<T>(&self, f: impl AsyncFnOnce(RedisStore) -> T) -> T {
        runtime().block_on(async { f(self.0.store().await).await })
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
    const SCOPE: &'static str = "table idempotask_units";
    type Store = PostgresStore;

    fn url(&self) -> String {
        self.server.url()
    }

    fn with_store<T>(&self, f: impl AsyncFnOnce(PostgresStore) -> T) -> T {
        self.rt.block_on(f(self.store.clone()))
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

/// Input: a backend with nothing of `charge` yet. Output: the text of `list --task charge`,
/// after the checks every backend passes: with `order-1` done, `order-2` locked and `order-3`
/// (fenced) and `order-4` (not) left in doubt, `status` of a unit in doubt exits 5 and says
/// how to resolve it, `list` counts and `list --in-doubt` finds both, and `forget` refuses one.
pub(crate) fn status_list_and_forget_show_a_unit_in_doubt<B: Backend>(backend: &B) -> String {
    backend.complete("charge", &["order-1"]);
    backend.lock("charge", "order-2");
    backend.leave_in_doubt(&["order-3"], Fencing::On);
    backend.leave_in_doubt(&["order-4"], Fencing::Off);

    let (code, out, _) = backend.idempotask(&["status", "--task", "charge", "--key", "order-3"]);
    assert_eq!(code, 5, "{out}");
    assert!(out.starts_with("charge \"order-3\": in doubt"), "{out}");
    for line in [
        "fencing token  ",
        "lock ran out   ",
        "remembered     for ",
        "--key \"order-3\" --result '<its result as JSON>'   if it did",
        "--key \"order-3\" --free   if it did not",
    ] {
        assert!(out.contains(line), "{line} in {out}");
    }
    let doubt = backend.status_json("charge", "order-3");
    assert_eq!(doubt["state"], "in_doubt");
    assert!(doubt["fencing_token"].as_u64().unwrap() > 0, "{doubt}");
    assert!(
        doubt["expired_for_ms"].as_u64().unwrap() < 60_000,
        "{doubt}"
    );
    let forgotten_in = doubt["forgotten_in_ms"].as_u64().unwrap();
    assert!(
        forgotten_in > 0 && forgotten_in <= 60_000,
        "remembered for DOUBT_MEMORY after it ran out: {doubt}"
    );
    let unfenced = backend.status_json("charge", "order-4");
    assert_eq!(unfenced["fencing_token"], Value::Null, "{unfenced}");

    let (code, out, _) = backend.idempotask(&["list", "--task", "charge"]);
    assert_eq!(code, 0);
    let counts = format!("charge in {}: 1 done, 1 locked, 2 in doubt", B::SCOPE);
    assert!(out.starts_with(&counts), "{out}");
    assert!(out.contains("remembered for"), "{out}");
    let listing = json(
        &backend
            .idempotask(&["list", "--task", "charge", "--in-doubt", "--json"])
            .1,
    );
    assert_eq!(
        (&listing["done"], &listing["locked"], &listing["in_doubt"]),
        (&value!(1), &value!(1), &value!(2)),
        "the counts are the task's: {listing}"
    );
    let entries = listing["entries"].as_array().unwrap();
    let mut digests: Vec<&str> = entries
        .iter()
        .map(|e| {
            assert_eq!(e["in_doubt"], true, "{e}");
            assert!(e["expired_for_ms"].is_u64() && e["forgotten_in_ms"].is_u64());
            e["digest"].as_str().unwrap()
        })
        .collect();
    digests.sort_unstable();
    let mut expected = ["order-3", "order-4"]
        .map(|key| UnitOfWork::new("charge", key).unwrap().digest().to_owned());
    expected.sort_unstable();
    assert_eq!(digests, expected);
    for other in ["--locked", "--done"] {
        let (code, _, err) = backend.idempotask(&["list", "--task", "charge", "--in-doubt", other]);
        assert_eq!(code, 2, "{err}");
    }
    // Held units nobody resolved: `--held` is `--in-doubt`, and `--older-than` keeps the units
    // whose lock ran out at least that long ago (both ran out well under a day ago, and more
    // than a millisecond ago).
    let held = |older_than| held_older_than(backend, "charge", older_than);
    assert_eq!(held("1ms"), 2);
    assert_eq!(held("1d"), 0);
    let (code, _, err) = backend.idempotask(&["list", "--task", "charge", "--older-than", "1h"]);
    assert_eq!(code, 2, "--older-than needs --in-doubt: {err}");

    let (code, out, err) = backend.idempotask(&[
        "forget", "--json", "--task", "charge", "--key", "order-3", "--yes",
    ]);
    assert_eq!(code, 5);
    assert_eq!(json(&out)["error"]["kind"], "in_doubt");
    assert!(err.contains("idempotask resolve --task charge"), "{err}");
    assert_eq!(
        backend.status_json("charge", "order-3")["state"],
        "in_doubt"
    );
    backend.idempotask(&["list", "--task", "charge"]).1
}

/// How many of `task`'s units `list --held --older-than older_than` shows.
pub(crate) fn held_older_than(backend: &impl Backend, task: &str, older_than: &str) -> usize {
    let (code, out, err) = backend.idempotask(&[
        "list",
        "--task",
        task,
        "--held",
        "--older-than",
        older_than,
        "--json",
    ]);
    assert_eq!(code, 0, "{out}{err}");
    json(&out)["entries"].as_array().unwrap().len()
}

/// `resolve --result` of a fenced unit in doubt: the marker carries the earlier delivery's
/// fencing token and the TTL asked for, and the next delivery replays it without running.
pub(crate) fn a_recorded_result_is_what_the_next_delivery_gets_back(backend: &impl Backend) {
    backend.leave_in_doubt(&["order-1"], Fencing::On);
    let earlier = backend.status_json("charge", "order-1")["fencing_token"].clone();

    let (code, out, err) = backend.idempotask(&[
        "resolve",
        "--task",
        "charge",
        "--key",
        "order-1",
        "--result",
        r#"{"charge":"ch_manual"}"#,
        "--result-ttl",
        "2h",
        "--yes",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.starts_with(r#"recorded {"charge":"ch_manual"} as the result of charge "order-1""#),
        "{out}"
    );
    let done = backend.status_json("charge", "order-1");
    assert_eq!(done["result"], value!({ "charge": "ch_manual" }));
    assert_eq!(
        done["fencing_token"], earlier,
        "the marker carries the earlier delivery's token"
    );
    let ttl_ms = done["ttl_ms"].as_u64().unwrap();
    assert!((7_000_000..=7_200_000).contains(&ttl_ms), "{done}");

    let (report, ran) = backend.deliver("order-1");
    assert!(!ran, "the body does not run again");
    assert_eq!(report.outcome, Outcome::Replayed);
    assert_eq!(report.value, value!({ "charge": "ch_manual" }));
    assert_eq!(report.in_doubt, None);
}

/// `resolve --free` of a fenced (`order-1`) and an unfenced (`order-2`) unit in doubt: each
/// reads as unknown; then, after `freed` (the caller's own checks), the next delivery of each
/// runs it with no doubt, and the fenced one's fencing token is above the freed lock's.
pub(crate) fn a_freed_unit_runs_as_new_with_no_doubt(backend: &impl Backend, freed: impl FnOnce()) {
    backend.leave_in_doubt(&["order-1"], Fencing::On);
    backend.leave_in_doubt(&["order-2"], Fencing::Off);
    let earlier = backend.status_json("charge", "order-1")["fencing_token"]
        .as_u64()
        .unwrap();

    for key in ["order-1", "order-2"] {
        let (code, out, err) = backend.idempotask(&[
            "resolve", "--json", "--task", "charge", "--key", key, "--free", "--yes",
        ]);
        assert_eq!(code, 0, "{err}");
        let freed = json(&out);
        assert_eq!(freed["resolved"], "freed", "{freed}");
        assert_eq!(freed["result"], Value::Null);
        assert_eq!(backend.status_json("charge", key)["state"], "unknown");
    }
    freed();

    for key in ["order-1", "order-2"] {
        let (report, ran) = backend.deliver(key);
        assert!(ran);
        assert_eq!(report.outcome, Outcome::Executed);
        assert_eq!(
            report.in_doubt, None,
            "{key}: freed, so nothing is in doubt"
        );
        if key == "order-1" {
            assert!(
                report.fencing_token.unwrap() > earlier,
                "the freed lock's counter keeps the next token above it"
            );
        }
    }
}

/// `resolve` of a done, a locked and an unknown unit is refused with that state's exit code;
/// usage errors write nothing to a unit in doubt.
pub(crate) fn resolve_refuses_a_unit_not_in_doubt(backend: &impl Backend) {
    backend.complete("charge", &["order-1"]);
    backend.lock("charge", "order-2");
    backend.leave_in_doubt(&["order-4"], Fencing::On);
    let resolve = |key: &str, how: &[&str]| {
        let mut args = vec![
            "resolve", "--json", "--task", "charge", "--key", key, "--yes",
        ];
        args.extend(how);
        backend.idempotask(&args)
    };
    let result: &[&str] = &["--result", "1"];
    for (key, how, exit, says) in [
        ("order-1", result, 1, "it is done, not in doubt"),
        ("order-2", &["--free"], 3, "it is not in doubt"),
        ("order-3", result, 4, "nothing to resolve"),
    ] {
        let (code, out, err) = resolve(key, how);
        assert_eq!(code, exit, "{key}: {err}");
        assert_eq!(json(&out)["error"]["kind"], "not_in_doubt", "{key}");
        assert!(err.contains(says), "{key}: {err}");
    }
    assert_eq!(backend.status_json("charge", "order-1")["state"], "done");
    assert_eq!(backend.status_json("charge", "order-2")["state"], "locked");

    // Usage errors, and nothing written: no JSON result, both ways or neither, a result TTL no
    // store keeps, no `--yes` without a terminal.
    for how in [
        &["--result", "{not json"][..],
        &["--result", "1", "--free"],
        &[],
        &["--result", "1", "--result-ttl", "50ms"],
    ] {
        let (code, _, err) = resolve("order-4", how);
        assert_eq!(code, 2, "{how:?}: {err}");
    }
    let (code, _, err) =
        backend.idempotask(&["resolve", "--task", "charge", "--key", "order-4", "--free"]);
    assert_eq!(code, 2);
    assert!(err.contains("pass --yes"), "{err}");
    assert_eq!(
        backend.status_json("charge", "order-4")["state"],
        "in_doubt"
    );
}

/// The operator reads the question while the unit changes: a redelivery takes it over and
/// finishes it (`order-1`), takes it over and still runs (`order-2`), or its own holder comes
/// back and renews it (`order-3`). The answer must not overwrite that delivery's result, nor
/// free a unit someone holds: `resolve` says the unit changed (exit 1) and writes nothing.
pub(crate) fn resolve_leaves_alone_a_unit_that_changed_while_it_asked(backend: &impl Backend) {
    let holders = backend.leave_in_doubt(&["order-1", "order-2", "order-3"], Fencing::On);

    let (code, seen) = answer_yes_after(
        backend,
        r#"resolve --task charge --key order-1 --result '{"charge":"ch_manual"}'"#,
        || {
            let (report, ran) = backend.deliver("order-1");
            assert!(ran && report.in_doubt.is_some(), "taken over and rerun");
        },
    );
    assert_eq!(code, 1, "{seen}");
    assert!(
        seen.contains("Record {\"charge\":\"ch_manual\"} as its result")
            && seen.contains("nothing written: charge \"order-1\" changed after it was read"),
        "{seen}"
    );
    let done = backend.status_json("charge", "order-1");
    assert_eq!(done["result"], value!({ "charge": "ch_rerun" }), "{done}");

    // Taken over and still running: its lock stays.
    let unit = UnitOfWork::new("charge", "order-2").unwrap();
    let (code, seen) = answer_yes_after(
        backend,
        "resolve --task charge --key order-2 --free",
        || {
            let taker = LockToken::generate().with_doubt_memory(DOUBT_MEMORY);
            backend.with_store(async |store| {
                store.begin(&unit, &taker, LONG, Fencing::On).await.unwrap();
            });
        },
    );
    assert_eq!(code, 1, "{seen}");
    assert!(
        seen.contains("Free it, so that the next delivery"),
        "{seen}"
    );
    assert_eq!(backend.status_json("charge", "order-2")["state"], "locked");

    // Its holder came back and renewed the very lock that was shown: it is live again.
    let unit = UnitOfWork::new("charge", "order-3").unwrap();
    let (code, seen) = answer_yes_after(
        backend,
        "resolve --task charge --key order-3 --free",
        || {
            backend.with_store(async |store| {
                assert!(store.renew(&unit, &holders[2], LONG).await.unwrap());
            });
        },
    );
    assert_eq!(code, 1, "{seen}");
    assert!(
        seen.contains("nothing written: charge \"order-3\""),
        "{seen}"
    );
    assert_eq!(backend.status_json("charge", "order-3")["state"], "locked");
}
