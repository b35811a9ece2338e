//! [`RedisKeys`]: the Redis key layout of one namespace, built and parsed without a connection.

use idempotask::InvalidKey;
use idempotask::store::{UnitOfWork, check_namespace, check_task_name};

/// The Redis keys that idempotask uses in one namespace.
///
/// Each unit of work has one key, `idempotask:v2:<namespace>:<task>:<digest>`, where the digest
/// is [`UnitOfWork::digest`] (16 characters of `A-Z a-z 0-9 - _`). The key holds the unit's
/// whole state: a lock (`L<token>`, `L<token>.<fencing token>`), a released fenced lock
/// (`T<fencing token>`) or a completion [`Marker`](idempotask::operator::Marker) (`D…`). One key is one Redis
/// Cluster slot, so no hash tag is needed. [`RedisStore`](crate::RedisStore) uses this layout;
/// tools use it to find a unit's key, to `SCAN` one task's keys, and to read a key they found
/// back into its parts. Nothing here connects to Redis.
///
/// A store's `forget` (and an operator's `forget_exact` or `resolve_exact`) also leaves a
/// receipt for a minute, `idempotask:v2:<namespace>:{<unit's key>}:forgotten`, so that a client
/// that re-sends the command after losing its reply is told what the first one did. The hash tag puts it in the
/// unit's slot; no task's pattern matches it and [`parse`](RedisKeys::parse) reads it as no unit.
///
/// ```
/// use idempotask_redis::RedisKeys;
/// use idempotask::store::UnitOfWork;
///
/// let keys = RedisKeys::new("billing")?;
/// let unit = UnitOfWork::new("charge", "order-42")?;
/// let key = keys.unit(&unit);
/// assert_eq!(key, format!("idempotask:v2:billing:charge:{}", unit.digest()));
/// assert_eq!(keys.task_pattern("charge")?, "idempotask:v2:billing:charge:*");
///
/// let parsed = keys.parse(&key).expect("one of ours");
/// assert_eq!((parsed.task, parsed.digest), ("charge", unit.digest()));
/// # Ok::<(), idempotask::InvalidKey>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisKeys {
    namespace: String,
}

/// A Redis key of one unit of work, read back into its parts by [`RedisKeys::parse`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ParsedKey<'a> {
    /// The task's stable name.
    pub task: &'a str,
    /// The digest of the caller key (the plain key lives only in the marker).
    pub digest: &'a str,
}

pub(super) const PREFIX: &str = "idempotask:v2:";

/// The key of `unit` under `namespace`.
///
/// Names are built on every call, so they go into a string of the exact size.
pub(super) fn unit_key(namespace: &str, unit: &UnitOfWork) -> String {
    digest_key(namespace, unit.task(), unit.digest())
}

/// The key of `task`'s unit whose caller key has `digest`, under `namespace`: what
/// [`unit_key`] names, for a unit a listing knows by its digest alone.
pub(super) fn digest_key(namespace: &str, task: &str, digest: &str) -> String {
    let parts = [PREFIX, namespace, ":", task, ":", digest];
    let mut name = String::with_capacity(parts.iter().map(|part| part.len()).sum());
    for part in parts {
        name.push_str(part);
    }
    name
}

/// How long a `forget` receipt lasts: far longer than a client goes on re-sending one command.
pub(super) const FORGET_RECEIPT_MS: u64 = 60_000;

/// The receipt a `forget` of `unit` leaves under `namespace`: in the unit's hash slot (its
/// key, which has no braces, is the hash tag), under the namespace's prefix (so the ACL
/// patterns that cover the namespace cover it), and with a `{` where a task name starts (so
/// that no task's `SCAN` pattern matches it).
pub(super) fn forget_receipt_key(namespace: &str, unit_key: &str) -> String {
    let parts = [PREFIX, namespace, ":{", unit_key, "}:forgotten"];
    let mut name = String::with_capacity(parts.iter().map(|part| part.len()).sum());
    for part in parts {
        name.push_str(part);
    }
    name
}

/// The journal of `unit`'s steps under `namespace`: a list in the unit's hash slot, named as
/// the forget receipt is, so that the same ACL patterns cover it and no task's `SCAN` pattern
/// matches it.
pub(super) fn journal_key(namespace: &str, unit_key: &str) -> String {
    let parts = [PREFIX, namespace, ":{", unit_key, "}:steps"];
    let mut name = String::with_capacity(parts.iter().map(|part| part.len()).sum());
    for part in parts {
        name.push_str(part);
    }
    name
}

impl RedisKeys {
    /// The layout of `namespace`.
    ///
    /// # Errors
    /// [`InvalidKey::Namespace`] unless the namespace is 1 to 128 characters of
    /// `A-Z a-z 0-9 _ - .`.
    pub fn new(namespace: &str) -> Result<Self, InvalidKey> {
        check_namespace(namespace)?;
        Ok(Self {
            namespace: namespace.to_owned(),
        })
    }

    /// The namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The key of `unit`.
    pub fn unit(&self, unit: &UnitOfWork) -> String {
        unit_key(&self.namespace, unit)
    }

    /// A `SCAN … MATCH` pattern for every key of `task` in this namespace.
    ///
    /// Names are limited to `A-Z a-z 0-9 _ - .`, so nothing in them is a glob character. On
    /// Redis Cluster the keys of one task spread over all slots: scan every master.
    ///
    /// # Errors
    /// [`InvalidKey::TaskName`] for a name no task can have.
    pub fn task_pattern(&self, task: &str) -> Result<String, InvalidKey> {
        check_task_name(task)?;
        Ok(format!("{PREFIX}{}:{task}:*", self.namespace))
    }

    /// Reads a key of this namespace back into its parts; `None` for any other key.
    pub fn parse<'k>(&self, key: &'k str) -> Option<ParsedKey<'k>> {
        let rest = key.strip_prefix(PREFIX)?.strip_prefix(&*self.namespace)?;
        let (task, digest) = rest.strip_prefix(':')?.split_once(':')?;
        let is_digest = digest.len() == 16
            && digest
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_'));
        (is_digest && check_task_name(task).is_ok()).then_some(ParsedKey { task, digest })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_reads_back_the_key_of_a_unit() {
        let keys = RedisKeys::new("ns.1").unwrap();
        let unit = UnitOfWork::new("send-mail_v2", "a:{b}\n").unwrap();
        let key = keys.unit(&unit);
        let parsed = keys.parse(&key).unwrap();
        assert_eq!(parsed.task, "send-mail_v2");
        assert_eq!(parsed.digest, unit.digest());
    }

    #[test]
    fn parse_rejects_other_namespaces_and_foreign_keys() {
        let keys = RedisKeys::new("billing").unwrap();
        let other = RedisKeys::new("billing2").unwrap();
        let unit = UnitOfWork::new("t", "k").unwrap();
        assert!(keys.parse(&other.unit(&unit)).is_none());
        for foreign in [
            "",
            "session:42",
            "idempotask:v2:billing:t:abc",
            "idempotask:v2:billing:t:AAAAAAAAAAAAAAA*",
            "idempotask:v2:billing:t:AAAAAAAAAAAAAAAA:x",
            "idempotask:v1:{billing:t:0}:done",
        ] {
            assert!(keys.parse(foreign).is_none(), "{foreign:?}");
        }
    }

    #[test]
    fn a_key_has_no_hash_tag_whatever_the_caller_key_holds() {
        let keys = RedisKeys::new("default").unwrap();
        let key = keys.unit(&UnitOfWork::new("t", "order-{1}:x").unwrap());
        assert!(!key.contains('{') && !key.contains('}'), "{key}");
    }

    #[test]
    fn a_forget_receipt_is_in_the_units_slot_and_under_no_tasks_pattern() {
        let keys = RedisKeys::new("billing").unwrap();
        let unit = UnitOfWork::new("charge", "order-{1}").unwrap();
        let key = keys.unit(&unit);
        let receipt = forget_receipt_key("billing", &key);
        assert_eq!(
            receipt,
            format!("idempotask:v2:billing:{{{key}}}:forgotten")
        );
        // The first `{…}` is the hash tag: the unit's whole key.
        let tag = receipt
            .split_once('{')
            .and_then(|(_, rest)| rest.split_once('}'))
            .map(|(tag, _)| tag);
        assert_eq!(tag, Some(key.as_str()));
        assert!(keys.parse(&receipt).is_none());
        // Where a task's pattern has the task name, the receipt has a `{`, which no name has.
        let after_namespace = receipt.strip_prefix("idempotask:v2:billing:").unwrap();
        assert!(after_namespace.starts_with('{'));
        assert!(keys.task_pattern("{idempotask").is_err());
    }

    #[test]
    fn names_that_could_change_a_pattern_are_rejected() {
        assert!(RedisKeys::new("a*").is_err());
        let keys = RedisKeys::new("default").unwrap();
        for task in ["*", "a?", "[ab]", "a:b", ""] {
            assert!(keys.task_pattern(task).is_err(), "{task:?}");
        }
    }
}
