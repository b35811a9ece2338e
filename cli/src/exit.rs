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
    /// The key (or the whole task) is unknown to Redis.
    Unknown = 4,
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

    /// Input: a store error from talking to the server at `url`. Output: the failure an
    /// operator can act on (the password is never shown).
    pub(crate) fn store(err: &StoreError, url: &str) -> Self {
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

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// Whether the server refused to let us in: a wrong password, or none given to a server that
/// wants one.
fn is_auth(err: &StoreError) -> bool {
    let source = std::error::Error::source(err).and_then(|s| s.downcast_ref::<redis::RedisError>());
    if let Some(redis) = source
        && (redis.kind() == redis::ErrorKind::AuthenticationFailed
            || matches!(redis.code(), Some("NOAUTH" | "WRONGPASS")))
    {
        return true;
    }
    let text = err.to_string();
    text.contains("NOAUTH") || text.contains("WRONGPASS")
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
