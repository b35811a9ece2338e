//! What the protocol makes of a server's replies and errors: typed [`StoreError`]s that name
//! the key, and the few errors it answers itself (out of memory, no `SET … IFEQ`).

use std::time::Duration;

use redis::{ConnectionAddr, ErrorKind, RedisError, ServerErrorKind, Value};

use idempotask::store::{StoreError, StoreErrorKind};

/// Whether the server refused a write for `maxmemory` (`OOM`), directly or from a script.
pub(super) fn is_out_of_memory(err: &StoreError) -> bool {
    std::error::Error::source(err)
        .and_then(|source| source.downcast_ref::<RedisError>())
        .is_some_and(|err| {
            err.code() == Some("OOM") || err.to_string().contains("OOM command not allowed")
        })
}

/// Whether the server refused a command as malformed: how a server without `SET … IFEQ`
/// answers it, before doing anything.
pub(super) fn is_syntax_error(err: &RedisError) -> bool {
    err.code() == Some("ERR") && err.detail().is_some_and(|detail| detail.contains("syntax"))
}

pub(super) fn parse_flag(
    operation: &'static str,
    key: &str,
    reply: &Value,
) -> Result<bool, StoreError> {
    match reply {
        Value::Int(0) => Ok(false),
        Value::Int(1) => Ok(true),
        other => Err(unexpected(operation, key, other)),
    }
}

/// A `PTTL` answer: `None` for a missing key (-2) or a key without expiry (-1).
pub(super) fn pttl(
    operation: &'static str,
    key: &str,
    reply: &Value,
) -> Result<Option<Duration>, StoreError> {
    match reply {
        Value::Int(-2 | -1) => Ok(None),
        Value::Int(ms) => u64::try_from(*ms)
            .map(|ms| Some(Duration::from_millis(ms)))
            .map_err(|_| unexpected(operation, key, reply)),
        other => Err(unexpected(operation, key, other)),
    }
}

/// A value under one of our keys that idempotask did not write.
pub(super) fn foreign(operation: &'static str, key: &str, value: &[u8]) -> StoreError {
    StoreError::new(
        operation,
        StoreErrorKind::Protocol,
        format!(
            "key `{key}` holds {}, which is not idempotask's",
            shorten(&format!("{:?}", String::from_utf8_lossy(value)))
        ),
    )
}

fn shorten(shown: &str) -> String {
    let mut shown = shown.to_owned();
    if shown.len() > 200 {
        let cut = (0..=200)
            .rev()
            .find(|&i| shown.is_char_boundary(i))
            .unwrap_or(0);
        shown.truncate(cut);
        shown.push('…');
    }
    shown
}

pub(super) fn unexpected(operation: &'static str, key: &str, reply: &Value) -> StoreError {
    // The command ran, so whatever it changed is unknown to us.
    StoreError::ambiguous(
        operation,
        StoreErrorKind::Protocol,
        format!(
            "unexpected reply {} for key `{key}`",
            shorten(&format!("{reply:?}"))
        ),
    )
}

/// Classifies a redis-rs error; `ambiguous` when the command may have reached the server.
///
/// With `resends`, the client may have applied the command on an earlier try before the error
/// it reports (a timeout, then `CLUSTERDOWN` from the next node): only a refused configuration
/// proves that nothing was applied.
pub(super) fn store_error(operation: &'static str, err: &RedisError, resends: bool) -> StoreError {
    if is_certificate_refusal(err) {
        // The TLS handshake refused the server's certificate: trying again changes nothing
        // until the trusted CA or the certificate changes. A client that resends (a Cluster
        // reconnecting to a node that failed over) may have applied the command on an earlier
        // node before the handshake with this one failed; connecting applies nothing.
        return StoreError::new(
            operation,
            StoreErrorKind::Configuration,
            format!(
                "{err}; the server's TLS certificate is not trusted: give its CA with \
                 `tls_root_certificate`, or check that it names the host in the URL"
            ),
        )
        .ambiguous_if(resends && operation != "connect")
        .with_source(err.clone());
    }
    let (kind, ambiguous) = if err.is_timeout() {
        (StoreErrorKind::Timeout, true)
    } else if err.is_connection_refusal() {
        (StoreErrorKind::Unreachable, false)
    } else if err.is_io_error() || err.is_connection_dropped() {
        (StoreErrorKind::Unreachable, true)
    } else if matches!(err.code(), Some("NOAUTH" | "WRONGPASS" | "NOPERM"))
        || is_permanent_refusal(err)
    {
        // Missing or wrong credentials, an ACL user without the rights, or an argument the
        // server will refuse every time: fix the settings, trying again changes nothing.
        (StoreErrorKind::Configuration, false)
    } else {
        match err.kind() {
            ErrorKind::AuthenticationFailed | ErrorKind::InvalidClientConfig => {
                (StoreErrorKind::Configuration, false)
            }
            ErrorKind::Server(ServerErrorKind::NoPerm) => (StoreErrorKind::Configuration, false),
            ErrorKind::ClusterConnectionNotFound => (StoreErrorKind::Unreachable, false),
            ErrorKind::Server(_) | ErrorKind::Extension => (StoreErrorKind::Rejected, false),
            _ => (StoreErrorKind::Protocol, true),
        }
    };
    let ambiguous = ambiguous || (resends && kind != StoreErrorKind::Configuration);
    StoreError::new(operation, kind, err.to_string())
        .ambiguous_if(ambiguous)
        .with_source(err.clone())
}

/// A first connection that found no server, said in one line: the URL (its password hidden),
/// that nothing answers there, and for a server on this machine the command that starts one.
///
/// Input: the URL the builder was given, the address the client made of it, the deadline of
/// the attempt, and its error. Output: for an unreachable or silent server, an error of the same
/// kind, not ambiguous (connecting applies nothing), with the client's error as its source;
/// any other error as it is.
pub(super) fn unanswered(
    url: &str,
    addr: &ConnectionAddr,
    deadline: Duration,
    err: StoreError,
) -> StoreError {
    let cause = std::error::Error::source(&err)
        .and_then(|source| source.downcast_ref::<RedisError>())
        .cloned();
    let shown = shown_url(url);
    let message = match err.kind() {
        StoreErrorKind::Unreachable
            if cause
                .as_ref()
                .is_some_and(RedisError::is_connection_refusal) =>
        {
            format!(
                "nothing answers at {shown} (connection refused){}",
                start_hint(addr)
            )
        }
        StoreErrorKind::Unreachable => match &cause {
            Some(cause) => format!("nothing answers at {shown} ({cause})"),
            None => format!("nothing answers at {shown}"),
        },
        StoreErrorKind::Timeout => format!(
            "nothing answers at {shown} within {} ms",
            deadline.as_millis()
        ),
        _ => return err,
    };
    let unanswered = StoreError::new("connect", err.kind(), message);
    match cause {
        Some(cause) => unanswered.with_source(cause),
        None => unanswered,
    }
}

/// `url` as an error may show it: with `***` for its password.
fn shown_url(url: &str) -> String {
    let Some(mut parsed) = redis::parse_redis_url(url) else {
        // The client parsed it before it tried to connect, so this is not reached; what it
        // holds is unknown, so none of it is shown.
        return "the URL given".to_owned();
    };
    if parsed.password().is_some() {
        // Only a URL that cannot have a host refuses a password, and a Redis URL has one.
        let _ = parsed.set_password(Some("***"));
    }
    parsed.to_string()
}

/// For a plain TCP address on this machine, how to start a server there: a newcomer's first
/// run without one is the common case. Elsewhere the server is someone else's to start.
fn start_hint(addr: &ConnectionAddr) -> String {
    match addr {
        ConnectionAddr::Tcp(host, port)
            if host == "localhost"
                || host
                    .trim_matches(['[', ']'])
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback()) =>
        {
            format!("; start a Redis server there with `redis-server --port {port} --save ''`")
        }
        _ => String::new(),
    }
}

/// Whether the client refused the server's TLS certificate (an unknown CA, a name it does not
/// cover, an expired one). The cluster client passes on only the text of the error it met on
/// the seed nodes, so it is recognised by rustls's wording.
fn is_certificate_refusal(err: &RedisError) -> bool {
    err.is_io_error() && err.to_string().contains("invalid peer certificate")
}

/// Whether the server refused a command in a way no retry can change: a script that calls a
/// command the ACL user may not run (reported as a script error, not `NOPERM`), or an expiry
/// the server does not accept.
fn is_permanent_refusal(err: &RedisError) -> bool {
    const REFUSALS: [&str; 4] = [
        "can't run this command",
        "ACL failure in script",
        "invalid expire time",
        "value is not an integer or out of range",
    ];
    let text = err.to_string();
    REFUSALS.iter().any(|refusal| text.contains(refusal))
}

#[cfg(test)]
mod tests {
    use redis::ConnectionAddr;

    use super::{shown_url, start_hint};

    #[test]
    fn a_password_never_reaches_the_message() {
        assert_eq!(
            shown_url("redis://app:hunter2@redis.internal:6379/0"),
            "redis://app:***@redis.internal:6379/0"
        );
        assert_eq!(shown_url("redis://:hunter2@h:1"), "redis://:***@h:1");
        assert_eq!(
            shown_url("redis://127.0.0.1:6379"),
            "redis://127.0.0.1:6379"
        );
    }

    #[test]
    fn only_a_server_on_this_machine_gets_the_command_that_starts_it() {
        let hint = |host: &str| start_hint(&ConnectionAddr::Tcp(host.to_owned(), 6380));
        for here in ["127.0.0.1", "localhost", "::1", "[::1]"] {
            assert_eq!(
                hint(here),
                "; start a Redis server there with `redis-server --port 6380 --save ''`"
            );
        }
        assert_eq!(hint("redis.internal"), "");
        assert_eq!(hint("10.0.0.7"), "");
    }
}
