//! What the CLI's test files share: running the binary as a script would, and reading its JSON.

use std::process::{Command, Output, Stdio};

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
pub(crate) fn json(stdout: &str) -> serde_json::Value {
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
