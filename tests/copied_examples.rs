//! Examples are documentation users copy: each of these compiles when copied alone into a fresh
//! crate that depends on `idempotask` and on the dependencies its own header lists (the
//! ```` ```toml ```` block), and on nothing of this workspace.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Where each crate of this workspace that an example may name lives, from the root.
const WORKSPACE_CRATES: &[(&str, &str)] = &[
    ("idempotask", "runtime"),
    ("idempotask-redis", "stores/redis"),
    ("idempotask-postgres", "stores/postgres"),
    ("idempotask-apalis", "integrations/apalis"),
];

/// The `[dependencies]` block an example's header lists, with the crates of this workspace
/// pointing at this checkout instead of the registry.
fn listed_dependencies(source: &str, root: &Path) -> String {
    let mut inside = false;
    let mut block = String::new();
    for line in source
        .lines()
        .map(|line| line.strip_prefix("//!").unwrap_or("").trim_start())
    {
        match line {
            "```toml" => inside = true,
            "```" if inside => break,
            _ if inside => {
                block.push_str(&from_checkout(line, root));
                block.push('\n');
            }
            _ => {}
        }
    }
    assert!(
        block.starts_with("[dependencies]"),
        "no ```toml block in the header"
    );
    block
}

/// `line` of a `[dependencies]` block, with a crate of this workspace taken from `root`:
/// `idempotask = "0.1"` or `idempotask = { version = "0.1", features = … }` keeps its features.
fn from_checkout(line: &str, root: &Path) -> String {
    let Some((name, _)) = line.split_once(" =") else {
        return line.to_owned();
    };
    let Some((_, dir)) = WORKSPACE_CRATES
        .iter()
        .find(|(crate_name, _)| *crate_name == name)
    else {
        return line.to_owned();
    };
    let path = format!("path = {:?}", root.join(dir).display());
    if line.contains('{') {
        line.replace(r#"version = "0.1""#, &path)
    } else {
        format!("{name} = {{ {path} }}")
    }
}

fn compiles_alone(example: &str) {
    // This package lives in `tests/`; the examples and the runtime sit next to it.
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf();
    let source = std::fs::read_to_string(root.join("examples").join(format!("{example}.rs")))
        .unwrap_or_else(|err| panic!("{example}: {err}"));
    let crate_dir = std::env::temp_dir().join(format!(
        "idempotask-copied-{example}-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(crate_dir.join("src")).unwrap();
    let manifest = format!(
        "[package]\nname = \"copied-{}\"\nversion = \"0.0.0\"\nedition = \"2024\"\npublish = false\n\n{}\n[workspace]\n",
        example.replace('_', "-"),
        listed_dependencies(&source, &root)
    );
    std::fs::write(crate_dir.join("Cargo.toml"), manifest).unwrap();
    std::fs::write(crate_dir.join("src/main.rs"), &source).unwrap();
    // The workspace's lock file pins the same versions, which are all in the local cache.
    std::fs::copy(root.join("Cargo.lock"), crate_dir.join("Cargo.lock")).unwrap();
    // One target directory for every copied example and every run, kept under this workspace's.
    let target = root.join("target").join("copied-examples");
    let output = Command::new(env!("CARGO"))
        .args(["build", "--offline", "--quiet"])
        .env("CARGO_TARGET_DIR", &target)
        .current_dir(&crate_dir)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&crate_dir);
    assert!(
        output.status.success(),
        "{example} does not compile on its own:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn quickstart_compiles_alone() {
    compiles_alone("quickstart");
}

#[test]
fn charge_customer_compiles_alone() {
    compiles_alone("charge_customer");
}

#[test]
fn dlq_replay_compiles_alone() {
    compiles_alone("dlq_replay");
}

#[test]
fn ledger_transfer_compiles_alone() {
    compiles_alone("ledger_transfer");
}

#[test]
fn send_order_confirmation_compiles_alone() {
    compiles_alone("send_order_confirmation");
}

#[test]
fn stream_worker_compiles_alone() {
    compiles_alone("stream_worker");
}
