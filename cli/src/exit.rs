//! Exit codes and the errors that end a command, each with what the operator can do.

use std::fmt;
use std::process::ExitCode;

use idempotask::store::{StoreError, StoreErrorKind};

/// What a command found, as its exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Exit {
    /// Done, or the command did what was asked.
    Ok = 0,
    /// An error: nothing was changed.
    Error = 1,
    /// The command line was wrong.
    Usage = 2,
    /// The key is locked: a delivery is running the work now.
    Locked = 3,
    /// The key (or the whole task) is unknown to the store.
    Unknown = 4,
    /// The unit is in doubt: a delivery's lock ran out without a release or a result, so its
    /// side effect may have happened; find out downstream, then `resolve` it.
    InDoubt = 5,
}

impl From<Exit> for ExitCode {
    fn from(exit: Exit) -> Self {
        Self::from(exit as u8)
    }
}

/// An error that ends a command.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) exit: Exit,
    /// A stable word for scripts: `unreachable`, `auth`, `usage`, …
    pub(crate) kind: &'static str,
    pub(crate) message: String,
}

impl Failure {
    pub(crate) fn new(exit: Exit, kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            exit,
            kind,
            message: message.into(),
        }
    }

    pub(crate) fn usage(message: impl Into<String>) -> Self {
        Self::new(Exit::Usage, "usage", message)
    }

    /// Input: a store error from talking to the Redis server at `url`. Output: the failure an
    /// operator can act on (the password is never shown).
    pub(crate) fn redis(err: &StoreError, url: &str) -> Self {
        let url = redact(url);
        if is_auth(err) {
            return Self::new(
                Exit::Error,
                "auth",
                format!(
                    "Redis at {url} refused the credentials ({err}); put the right user and password in the URL: redis://user:password@host:port"
                ),
            );
        }
        match err.kind() {
            // The store's own connect error names the URL (redacted) and how to start a local
            // server; saying the URL again would only make the line longer.
            StoreErrorKind::Unreachable if err.operation() == "connect" => Self::new(
                Exit::Error,
                "unreachable",
                format!("{err}; check --redis-url or REDIS_URL"),
            ),
            StoreErrorKind::Unreachable | StoreErrorKind::Timeout => Self::new(
                Exit::Error,
                "unreachable",
                format!(
                    "cannot reach Redis at {url} ({err}); check --redis-url or REDIS_URL and that the server is up"
                ),
            ),
            StoreErrorKind::Configuration => Self::new(
                Exit::Error,
                "configuration",
                format!("cannot use Redis at {url}: {err}"),
            ),
            _ => Self::new(Exit::Error, "redis", format!("Redis at {url}: {err}")),
        }
    }
}

impl Failure {
    /// Input: a store error from talking to the PostgreSQL server at `url`. Output: the
    /// failure an operator can act on (the password is never shown).
    pub(crate) fn postgres(err: &StoreError, url: &str) -> Self {
        let url = redact(url);
        match err.kind() {
            StoreErrorKind::Unreachable | StoreErrorKind::Timeout => Self::new(
                Exit::Error,
                "unreachable",
                format!(
                    "cannot reach PostgreSQL at {url} ({err}); check --database-url or DATABASE_URL and that the server is up"
                ),
            ),
            StoreErrorKind::Configuration => Self::new(
                Exit::Error,
                "configuration",
                format!("cannot use PostgreSQL at {url}: {err}"),
            ),
            _ => Self::new(
                Exit::Error,
                "postgres",
                format!("PostgreSQL at {url}: {err}"),
            ),
        }
    }

    /// Input: why the first connection to PostgreSQL at `url` failed. Output: the failure.
    pub(crate) fn postgres_connect(err: &sqlx::Error, url: &str) -> Self {
        let shown = redact(url);
        match err {
            sqlx::Error::Configuration(_) => Self::usage(format!(
                "--database-url {shown} is not a PostgreSQL URL ({err}); give postgres://user:password@host:5432/database"
            )),
            sqlx::Error::Database(db)
                if matches!(db.code().as_deref(), Some("28P01" | "28000")) =>
            {
                Self::new(
                    Exit::Error,
                    "auth",
                    format!(
                        "PostgreSQL at {shown} refused the credentials ({}); put the right user and password in the URL: postgres://user:password@host:5432/database",
                        db.message()
                    ),
                )
            }
            _ => Self::new(
                Exit::Error,
                "unreachable",
                format!(
                    "cannot reach PostgreSQL at {shown} ({err}); check --database-url or DATABASE_URL and that the server is up"
                ),
            ),
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// Whether the server refused to let us in: a wrong password, or none given to a server that
/// wants one (the server's error codes, which the store's error carries in its message).
fn is_auth(err: &StoreError) -> bool {
    let text = err.to_string();
    text.contains("NOAUTH") || text.contains("WRONGPASS") || text.contains("AuthenticationFailed")
}

/// The URL with its password replaced by `***`.
pub(crate) fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let Some((userinfo, host)) = rest.rsplit_once('@') else {
        return url.to_owned();
    };
    match userinfo.split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn passwords_never_reach_the_output() {
        assert_eq!(redact("redis://:hunter2@h:1/0"), "redis://:***@h:1/0");
        assert_eq!(redact("redis://ops:p@ss@h:1"), "redis://ops:***@h:1");
        assert_eq!(redact("redis://h:1"), "redis://h:1");
    }
}
