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
        ("idempotask-redis-streams", "integrations/redis-streams"),
        ("idempotask-sqs", "integrations/sqs"),
        ("idempotask-kafka", "integrations/kafka"),
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

    /// [`in_user_project`], which must succeed: a failure shows `what` did not build, and why.
    fn builds_in_user_project(
        name: &str,
        dependencies: &str,
        main: &str,
        args: &[&str],
        what: &str,
    ) {
        let output = in_user_project(name, dependencies, main, args);
        assert!(
            output.status.success(),
            "{what}:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }

    /// `cargo check`, not `build`: what is under test is that the copied source type-checks
    /// against its header's dependencies alone; `tests/examples.rs` builds and runs every example
    /// in the workspace, and codegen and linking here took minutes of the suite.
    fn compiles_alone(example: &str) {
        let source = std::fs::read_to_string(root().join("examples").join(format!("{example}.rs")))
            .unwrap_or_else(|err| panic!("{example}: {err}"));
        let dependencies = listed_dependencies(&source, &root());
        builds_in_user_project(
            &format!("copied-{example}"),
            &dependencies,
            &source,
            &["check", "--quiet"],
            &format!("{example} does not compile on its own"),
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

    /// The README's blocks opened by `fence` (```` ```rust ````, ```` ```toml ````), in order.
    fn readme_blocks(fence: &str) -> Vec<String> {
        let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
        let mut blocks = Vec::new();
        let mut current: Option<String> = None;
        for line in readme.lines() {
            match (&mut current, line.trim_end()) {
                (None, line) if line == fence => current = Some(String::new()),
                (Some(block), "```") => {
                    blocks.push(std::mem::take(block));
                    current = None;
                }
                (Some(block), line) => {
                    block.push_str(line);
                    block.push('\n');
                }
                (None, _) => {}
            }
        }
        blocks
    }

    /// The README's ```` ```rust ```` blocks, each a whole program.
    fn readme_programs() -> Vec<String> {
        readme_blocks("```rust")
    }

    /// Where the README's dependency lines expect a clone of this repository.
    const README_CLONE: &str = "../idempotask/";

    /// The README's dependency lines (its first ```` ```toml ```` block), as a user copies them
    /// into a project beside a clone, with the clone's path made this checkout. Version lines,
    /// as they read once the crates are published, point at this checkout too.
    fn readme_dependencies() -> String {
        let block = readme_blocks("```toml")
            .into_iter()
            .next()
            .expect("a toml block");
        let clone = format!("{}/", root().display());
        block
            .lines()
            .map(|line| from_checkout(&line.replace(README_CLONE, &clone), &root()))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Pins two bugs of a newcomer's first hour: the README told users `idempotask = "0.1"`,
    /// which is not published, and "Ten lines" without a Redis server printed a connection
    /// error's `Debug` dump. A new project with the README's dependency lines, as written,
    /// builds its first program, which run where nothing listens prints the one line the
    /// README shows, for that port, and exits with 1.
    #[test]
    fn the_readmes_ten_lines_build_from_its_dependency_lines_and_say_when_no_redis_answers() {
        const URL: &str = "redis://127.0.0.1:6379";
        let program = readme_programs().into_iter().next().expect("a rust block");
        assert!(program.contains(URL), "{program}");
        let port = idempotask_test_support::free_port();
        let program = program.replace(URL, &format!("redis://127.0.0.1:{port}"));
        builds_in_user_project(
            "readme-ten-lines",
            &readme_dependencies(),
            &program,
            &["build", "--quiet"],
            "the README's dependency lines do not build its first program",
        );
        let shown = readme_blocks("```text")
            .into_iter()
            .find(|block| block.contains(URL))
            .expect("the README shows what \"Ten lines\" prints without a server");
        let run = Command::new(root().join("target/copied-examples/debug/readme-ten-lines"))
            .output()
            .unwrap();
        assert_eq!(run.status.code(), Some(1), "{run:?}");
        assert_eq!(
            String::from_utf8_lossy(&run.stderr),
            shown.replace("6379", &port.to_string())
        );
        assert!(run.stdout.is_empty(), "{run:?}");
    }

    /// Every crate the README names has a dependency line there, commented out or not, and
    /// each `path` in the clone holds the crate its line names.
    #[test]
    fn the_readmes_dependency_lines_name_each_crate_where_it_is() {
        let block = readme_blocks("```toml")
            .into_iter()
            .next()
            .expect("a toml block");
        let in_clone = format!("path = \"{README_CLONE}");
        let lines: Vec<(&str, Option<&str>)> = block
            .lines()
            .filter_map(|line| {
                let (name, rest) = line.trim_start_matches(['#', ' ']).split_once(" = ")?;
                let dir = rest
                    .split_once(&in_clone)
                    .and_then(|(_, path)| path.split_once('"'))
                    .map(|(dir, _)| dir);
                Some((name, dir))
            })
            .collect();
        for (name, _) in WORKSPACE_CRATES
            .iter()
            .chain(&[("idempotask-conformance", "")])
        {
            assert!(
                lines.iter().any(|(listed, _)| listed == name),
                "{name} has no line in:\n{block}"
            );
        }
        for (name, dir) in lines {
            let Some(dir) = dir else { continue };
            let manifest = std::fs::read_to_string(root().join(dir).join("Cargo.toml"))
                .unwrap_or_else(|err| panic!("{name} = {dir}: {err}"));
            assert!(
                manifest.contains(&format!("name = \"{name}\"")),
                "{dir} does not hold {name}"
            );
        }
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
        // The first, "Ten lines", is built and run on the README's own dependency lines above.
        for (index, program) in programs.iter().enumerate().skip(1) {
            builds_in_user_project(
                &format!("readme-block-{index}"),
                &dependencies,
                program,
                &["check", "--quiet"],
                &format!("the README's rust block {index} does not compile on its own:\n{program}"),
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
    fn checkout_steps_compiles_alone() {
        compiles_alone("checkout_steps");
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
    fn redis_streams_worker_compiles_alone() {
        compiles_alone("redis_streams_worker");
    }

    #[test]
    fn sqs_worker_compiles_alone() {
        compiles_alone("sqs_worker");
    }

    #[test]
    fn kafka_worker_compiles_alone() {
        compiles_alone("kafka_worker");
    }

    #[test]
    fn http_payments_compiles_alone() {
        compiles_alone("http_payments");
    }

    #[test]
    fn webhook_receiver_compiles_alone() {
        compiles_alone("webhook_receiver");
    }

    /// The README's second command, `./scripts/test.sh`, installs the servers first. Pins a bug:
    /// without root or sudo it failed inside `apt-get`; it says in one line what it needs.
    /// Run as `nobody` when the test runs as root, with a `PATH` where no server and no sudo is.
    #[test]
    fn the_server_install_without_root_says_what_it_needs() {
        // The child's PATH is where its program is looked up too, so tools are given by path.
        let system = |tool: &str| {
            ["/usr/bin", "/bin"]
                .iter()
                .map(|dir| Path::new(dir).join(tool))
                .find(|path| path.exists())
                .unwrap_or_else(|| panic!("no {tool}"))
        };
        let bin =
            std::env::temp_dir().join(format!("idempotask-no-servers-{}", std::process::id()));
        std::fs::create_dir_all(&bin).unwrap();
        for tool in ["bash", "id", "ls"] {
            std::os::unix::fs::symlink(system(tool), bin.join(tool)).unwrap();
        }
        // Copied where `nobody` can read it, and run from there: the checkout may be under a
        // directory only root may enter (`mktemp -d`, mode 700).
        let script = bin.join("install-servers.sh");
        std::fs::copy(root().join("scripts/install-servers.sh"), &script).unwrap();
        let as_root = Command::new("id").arg("-u").output().unwrap().stdout == b"0\n";
        let mut command = if as_root {
            let mut command = Command::new(system("setpriv"));
            command.args(["--reuid=nobody", "--regid=nogroup", "--clear-groups"]);
            command.arg(system("bash"));
            command
        } else {
            Command::new(system("bash"))
        };
        let output = command
            .arg(&script)
            .current_dir(&bin)
            .env_clear()
            .env("PATH", &bin)
            .output()
            .unwrap();
        let _ = std::fs::remove_dir_all(&bin);
        let said = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{output:?}");
        assert!(output.stdout.is_empty(), "{output:?}");
        assert_eq!(said.lines().count(), 1, "{said}");
        assert!(
            said.starts_with("install-servers.sh: installing redis-server, ")
                && said.contains(" needs root or sudo; "),
            "{said}"
        );
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
