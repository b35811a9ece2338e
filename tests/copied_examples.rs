//! Examples are documentation users copy: each of these compiles when copied alone into a fresh
//! crate that depends on `idempotask` and on the dependencies its own header lists (the
//! ```` ```toml ```` block), and on nothing of this workspace.

// Every test is under `copied::`: scripts/test.sh runs them on their own, on one core beside the
// rest of the suite (they are compiles, with no server and no clock), and skips them in the main
// run.
mod copied {
    use std::path::{Path, PathBuf};
    use std::process::{Command, Output};

    /// Where each crate of this workspace that an example may name lives, from the root.
    const WORKSPACE_CRATES: &[(&str, &str)] = &[
        ("idempotask", "runtime"),
        ("idempotask-redis", "stores/redis"),
        ("idempotask-postgres", "stores/postgres"),
        ("idempotask-apalis", "integrations/apalis"),
        ("idempotask-nats", "integrations/nats"),
        ("idempotask-lapin", "integrations/lapin"),
        ("idempotask-http", "integrations/http"),
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

    /// The root of this workspace (this package lives in `tests/`).
    fn root() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("tests/ has a parent")
            .to_path_buf()
    }

    /// A fresh crate outside this workspace, as a user would have it: `dependencies` (a
    /// `[dependencies]` block, workspace crates already pointing at this checkout) and `main` as
    /// `src/main.rs`. Runs `cargo <args>` in it offline and answers its output.
    fn in_user_project(name: &str, dependencies: &str, main: &str, args: &[&str]) -> Output {
        let root = root();
        let crate_dir =
            std::env::temp_dir().join(format!("idempotask-{name}-{}", std::process::id()));
        std::fs::create_dir_all(crate_dir.join("src")).unwrap();
        let manifest = format!(
            "[package]\nname = \"{}\"\nversion = \"0.0.0\"\nedition = \"2024\"\npublish = false\n\n{dependencies}\n[workspace]\n",
            name.replace('_', "-"),
        );
        std::fs::write(crate_dir.join("Cargo.toml"), manifest).unwrap();
        std::fs::write(crate_dir.join("src/main.rs"), main).unwrap();
        // The workspace's lock file pins the same versions, which are all in the local cache.
        std::fs::copy(root.join("Cargo.lock"), crate_dir.join("Cargo.lock")).unwrap();
        // One target directory for every copied program and every run, kept under this workspace's.
        let target = root.join("target").join("copied-examples");
        let output = Command::new(env!("CARGO"))
            .args(args)
            .arg("--offline")
            .env("CARGO_TARGET_DIR", &target)
            .current_dir(&crate_dir)
            .output()
            .unwrap();
        let _ = std::fs::remove_dir_all(&crate_dir);
        output
    }

    /// `cargo check`, not `build`: what is under test is that the copied source type-checks
    /// against its header's dependencies alone; `tests/examples.rs` builds and runs every example
    /// in the workspace, and codegen and linking here took minutes of the suite.
    fn compiles_alone(example: &str) {
        let source = std::fs::read_to_string(root().join("examples").join(format!("{example}.rs")))
            .unwrap_or_else(|err| panic!("{example}: {err}"));
        let dependencies = listed_dependencies(&source, &root());
        let output = in_user_project(
            &format!("copied-{example}"),
            &dependencies,
            &source,
            &["check", "--quiet"],
        );
        assert!(
            output.status.success(),
            "{example} does not compile on its own:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }

    /// The crates' dependency trees, as a user who adds only `crates` gets them.
    fn user_tree(name: &str, crates: &[&str]) -> String {
        let dependencies: String = std::iter::once("[dependencies]".to_owned())
            .chain(
                crates
                    .iter()
                    .map(|name| from_checkout(&format!("{name} = \"0.1\""), &root())),
            )
            .collect::<Vec<_>>()
            .join("\n");
        let output = in_user_project(
            name,
            &dependencies,
            "fn main() {}\n",
            &["tree", "-e", "normal", "--prefix", "none"],
        );
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).unwrap()
    }

    /// The crate names in a `cargo tree --prefix none` listing.
    fn crate_names(tree: &str) -> Vec<&str> {
        tree.lines()
            .filter_map(|line| line.split_whitespace().next())
            .collect()
    }

    #[test]
    fn a_postgres_user_builds_no_redis() {
        let tree = user_tree("postgres-user", &["idempotask", "idempotask-postgres"]);
        let names = crate_names(&tree);
        assert!(names.contains(&"sqlx-postgres"), "{tree}");
        assert!(
            !names.iter().any(|name| name.starts_with("redis")),
            "{tree}"
        );
        assert!(
            !names.iter().any(|name| name.starts_with("apalis")),
            "{tree}"
        );
    }

    #[test]
    fn a_redis_user_builds_no_sqlx() {
        let tree = user_tree("redis-user", &["idempotask", "idempotask-redis"]);
        let names = crate_names(&tree);
        assert!(names.contains(&"redis"), "{tree}");
        assert!(!names.iter().any(|name| name.starts_with("sqlx")), "{tree}");
        assert!(
            !names.iter().any(|name| name.starts_with("apalis")),
            "{tree}"
        );
    }

    #[test]
    fn the_core_alone_builds_no_backend() {
        let tree = user_tree("core-user", &["idempotask"]);
        let names = crate_names(&tree);
        for backend in ["redis", "sqlx", "apalis", "rustls"] {
            assert!(
                !names.iter().any(|name| name.starts_with(backend)),
                "{backend} in {tree}"
            );
        }
    }

    /// The README's ```` ```rust ```` blocks, each a whole program.
    fn readme_programs() -> Vec<String> {
        let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
        let mut programs = Vec::new();
        let mut current: Option<String> = None;
        for line in readme.lines() {
            match (&mut current, line.trim_end()) {
                (None, "```rust") => current = Some(String::new()),
                (Some(program), "```") => {
                    programs.push(std::mem::take(program));
                    current = None;
                }
                (Some(program), line) => {
                    program.push_str(line);
                    program.push('\n');
                }
                (None, _) => {}
            }
        }
        programs
    }

    #[test]
    fn the_readmes_programs_compile_alone() {
        let programs = readme_programs();
        assert!(programs.len() >= 3, "{} rust blocks", programs.len());
        let dependencies = [
        "[dependencies]",
        "idempotask = \"0.1\"",
        "idempotask-redis = \"0.1\"",
        "idempotask-postgres = \"0.1\"",
        "idempotask-apalis = \"0.1\"",
        r#"apalis-core = { version = "1.0.0", default-features = false }"#,
        r#"serde = { version = "1", features = ["derive"] }"#,
        "serde_json = \"1\"",
        r#"sqlx = { version = "0.9", default-features = false, features = ["postgres", "runtime-tokio"] }"#,
        r#"tokio = { version = "1", features = ["macros", "rt-multi-thread", "time"] }"#,
    ]
    .map(|line| from_checkout(line, &root()))
    .join("\n");
        for (index, program) in programs.iter().enumerate() {
            let output = in_user_project(
                &format!("readme-block-{index}"),
                &dependencies,
                program,
                &["check", "--quiet"],
            );
            assert!(
                output.status.success(),
                "the README's rust block {index} does not compile on its own:\n{program}\n{}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
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
    fn reconcile_charges_compiles_alone() {
        compiles_alone("reconcile_charges");
    }

    #[test]
    fn stream_worker_compiles_alone() {
        compiles_alone("stream_worker");
    }

    #[test]
    fn shared_units_compiles_alone() {
        compiles_alone("shared_units");
    }

    #[test]
    fn quickstart_redis_compiles_alone() {
        compiles_alone("quickstart_redis");
    }

    #[test]
    fn apalis_worker_compiles_alone() {
        compiles_alone("apalis_worker");
    }

    #[test]
    fn nats_worker_compiles_alone() {
        compiles_alone("nats_worker");
    }

    #[test]
    fn rabbitmq_worker_compiles_alone() {
        compiles_alone("rabbitmq_worker");
    }

    #[test]
    fn http_payments_compiles_alone() {
        compiles_alone("http_payments");
    }

    #[test]
    fn webhook_receiver_compiles_alone() {
        compiles_alone("webhook_receiver");
    }

    /// `cargo run --example quickstart`, the README's first command, builds the core and the
    /// in-memory examples' few dependencies, not the backends of the other examples.
    #[test]
    fn the_quickstart_builds_only_the_core() {
        let output = Command::new(env!("CARGO"))
            .args(["tree", "-p", "idempotask-examples", "-e", "normal,build"])
            .args(["--prefix", "none", "--offline", "--locked"])
            .current_dir(root())
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let tree = String::from_utf8(output.stdout).unwrap();
        let mut crates: Vec<&str> = crate_names(&tree);
        crates.sort_unstable();
        crates.dedup();
        for backend in ["redis", "sqlx", "apalis", "rustls", "tokio-postgres"] {
            assert!(
                !crates.iter().any(|name| name.starts_with(backend)),
                "{backend} in {tree}"
            );
        }
        assert!(crates.len() <= 60, "{} crates: {crates:?}", crates.len());
    }
}
