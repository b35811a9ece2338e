//! A PostgreSQL server of the test's own, on a free loopback port, stopped when dropped.
//!
//! PostgreSQL refuses to run as root: when the tests run as root (as CI does), the data
//! directory is given to the `postgres` system user and the server runs as that user.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use idempotask_postgres::PostgresStore;

use super::free_port;

/// A throwaway PostgreSQL cluster with trust authentication for `postgres` on 127.0.0.1.
pub struct PostgresServer {
    child: Child,
    port: u16,
    dir: PathBuf,
    settings: Vec<String>,
}

/// The newest `/usr/lib/postgresql/<version>/bin` (Debian's layout), or `pg_config --bindir`.
fn bin_dir() -> PathBuf {
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    versions.sort();
    if let Some((_, bin)) = versions.pop() {
        return bin;
    }
    let output = Command::new("pg_config").arg("--bindir").output().unwrap_or_else(|_| {
        panic!("PostgreSQL is not installed; the README's test command installs it (apt-get install -y postgresql)")
    });
    PathBuf::from(String::from_utf8_lossy(&output.stdout).trim())
}

fn running_as_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| out.stdout.trim_ascii() == b"0")
}

/// `program args…`, as the `postgres` user when we are root (`setpriv` execs, so the child is
/// the server itself and can be signalled directly).
fn command(program: &Path, root: bool) -> Command {
    if root {
        let mut command = Command::new("setpriv");
        // The caller's directory may be one the `postgres` user cannot enter (a checkout under
        // a `mktemp -d` directory, mode 700), and initdb and the server refuse to start there.
        command
            .current_dir("/")
            .args([
                "--reuid=postgres",
                "--regid=postgres",
                "--init-groups",
                "--",
            ])
            .arg(program);
        command
    } else {
        Command::new(program)
    }
}

/// Runs `initdb` into `data`, up to three times: on a machine loaded by the rest of the suite
/// it has failed once in many runs while probing the server's resources, a failure of the
/// machine's moment rather than of the test. Each failed attempt's output is printed, and the
/// last one's fails the test.
fn init_cluster(bin: &Path, root: bool, data: &Path) {
    const ATTEMPTS: u32 = 3;
    for attempt in 1..=ATTEMPTS {
        let output = command(&bin.join("initdb"), root)
            .arg("-D")
            .arg(data)
            .args(["-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"])
            .output()
            .expect("run initdb");
        if output.status.success() {
            return;
        }
        let report = format!(
            "initdb failed (attempt {attempt} of {ATTEMPTS}, {}):\nstderr: {}\nstdout: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr),
            String::from_utf8_lossy(&output.stdout)
        );
        assert!(attempt < ATTEMPTS, "{report}");
        eprintln!("{report}");
        // initdb refuses a directory it left half-written.
        let _ = std::fs::remove_dir_all(data);
        std::thread::sleep(Duration::from_millis(200 * u64::from(attempt)));
    }
}

impl PostgresServer {
    /// Initialises a cluster in a temporary directory and starts it; panics with a clear message
    /// when PostgreSQL is missing (the suite never skips).
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Like [`start`](Self::start), with extra `name=value` server settings (`-c`), e.g.
    /// `shared_preload_libraries=pg_stat_statements`; given after the tests' own (`fsync=off`,
    /// `full_page_writes=off`), they override them.
    pub fn start_with(settings: &[&str]) -> Self {
        let bin = bin_dir();
        let root = running_as_root();
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("idempotask-pg-{}-{port}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create the server's directory");
        if root {
            let status = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(&dir)
                .status()
                .expect("chown the data directory");
            assert!(
                status.success(),
                "cannot give {} to the postgres user",
                dir.display()
            );
        }
        init_cluster(&bin, root, &dir.join("data"));
        let settings: Vec<String> = settings.iter().map(|s| (*s).to_owned()).collect();
        let mut server = Self {
            child: spawn(&bin, root, &dir, port, &settings),
            port,
            dir,
            settings,
        };
        server.wait_ready(&bin);
        server
    }

    /// Waits until the server accepts connections; panics after 30 s or when it exited.
    fn wait_ready(&mut self, bin: &Path) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ready = Command::new(bin.join("pg_isready"))
                .args([
                    "-h",
                    "127.0.0.1",
                    "-p",
                    &self.port.to_string(),
                    "-U",
                    "postgres",
                ])
                .stdout(Stdio::null())
                .status()
                .is_ok_and(|status| status.success());
            if ready {
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("postgres exited with {status} before it accepted connections");
            }
            assert!(
                Instant::now() < deadline,
                "postgres did not come up in 30 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops the server with a fast shutdown (SIGINT: open transactions are rolled back,
    /// committed ones are on disk) and waits until it has exited.
    pub fn stop(&mut self) {
        let _ = Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts the stopped server again on the same port and data.
    pub fn restart(&mut self) {
        let bin = bin_dir();
        self.child = spawn(
            &bin,
            running_as_root(),
            &self.dir,
            self.port,
            &self.settings,
        );
        self.wait_ready(&bin);
    }

    /// `postgres://postgres@127.0.0.1:<port>/postgres`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// The file the server's log goes to (its standard error), removed with the server.
    pub fn log_path(&self) -> PathBuf {
        self.dir.join("server.log")
    }

    /// A pool of `max_connections` on this server.
    pub async fn pool(&self, max_connections: u32) -> sqlx::PgPool {
        sqlx::postgres::PgPoolOptions::new()
            .max_connections(max_connections)
            .connect(&self.url())
            .await
            .expect("connect a pool to the test's postgres")
    }

    /// One server shared by the tests of a binary that are running at the same time; the last
    /// one to drop its handle stops it. Tests that share it keep apart by task name or table.
    pub fn shared() -> Arc<Self> {
        static SHARED: Mutex<Weak<PostgresServer>> = Mutex::new(Weak::new());
        let mut shared = SHARED.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(server) = shared.upgrade() {
            return server;
        }
        let server = Arc::new(Self::start());
        *shared = Arc::downgrade(&server);
        server
    }

    /// A [`PostgresStore`] on the default table, migrated first.
    pub async fn store(&self) -> PostgresStore {
        let builder = PostgresStore::builder(self.pool(16).await);
        builder.migrate().await.expect("create the store's table");
        builder.connect().await.expect("connect the store")
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        // SIGINT is PostgreSQL's fast shutdown: backends end, shared memory is released.
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Starts `postgres` on the cluster in `dir`, listening on 127.0.0.1:`port` only.
fn spawn(bin: &Path, root: bool, dir: &Path, port: u16, settings: &[String]) -> Child {
    // Appended to: a restarted server's log follows the first run's.
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("server.log"))
        .expect("open the server's log");
    let mut command = command(&bin.join("postgres"), root);
    command
        .arg("-D")
        .arg(dir.join("data"))
        .args(["-p", &port.to_string(), "-c", "listen_addresses=127.0.0.1"])
        .arg("-c")
        .arg(format!("unix_socket_directories={}", dir.display()))
        .args(["-c", "fsync=off", "-c", "full_page_writes=off"]);
    // After the defaults: the last `-c` of a setting is the one that counts.
    for setting in settings {
        command.arg("-c").arg(setting);
    }
    command
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start postgres")
}
