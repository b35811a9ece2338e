//! A server process on a free loopback port with a directory of its own, which a test can kill
//! and start again on the same port over the same directory: what the NATS and Kafka servers
//! share.

use std::path::{Path, PathBuf};
use std::process::Child;

use crate::free_port;

/// Starts the server on `port` over `dir` and returns once it answers, or says why not.
type Spawn = Box<dyn Fn(u16, &Path) -> Result<Child, String> + Send + Sync>;

/// A server process, its port and its directory; killed and its directory removed when dropped.
pub(crate) struct Restartable {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
    name: &'static str,
    spawn: Spawn,
}

impl Restartable {
    /// Starts `name` with `spawn` on a free port over a new directory in the temporary
    /// directory; panics when it does not come up.
    pub(crate) fn start(
        name: &'static str,
        spawn: impl Fn(u16, &Path) -> Result<Child, String> + Send + Sync + 'static,
    ) -> Self {
        let mut last_error = String::new();
        // A free port can be taken by someone else between probing and binding: try a few.
        for _ in 0..5 {
            let port = free_port();
            let dir = std::env::temp_dir()
                .join(format!("idempotask-{name}-{}-{port}", std::process::id()));
            std::fs::create_dir_all(&dir).expect("create the server's directory");
            match spawn(port, &dir) {
                Ok(child) => {
                    return Self {
                        child: Some(child),
                        port,
                        dir,
                        name,
                        spawn: Box::new(spawn),
                    };
                }
                Err(err) => {
                    let _ = std::fs::remove_dir_all(&dir);
                    last_error = err;
                }
            }
        }
        panic!("{name} did not come up: {last_error}");
    }

    /// The server's port.
    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    /// The server's directory.
    #[cfg(test)]
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// Kills the server with SIGKILL if it runs.
    pub(crate) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills the server if it runs and starts it again on the same port over the same
    /// directory; panics when it does not come back.
    pub(crate) fn restart(&mut self) {
        self.kill();
        let mut last_error = String::new();
        for _ in 0..50 {
            match (self.spawn)(self.port, &self.dir) {
                Ok(child) => {
                    self.child = Some(child);
                    return;
                }
                // The old socket may linger for a moment.
                Err(err) => last_error = err,
            }
        }
        panic!("{} did not come back: {last_error}", self.name);
    }
}

impl Drop for Restartable {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
