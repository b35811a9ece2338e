//! [`RedisKeys`]: the Redis key layout of one namespace, built and parsed without a connection.

use crate::unit::{InvalidKey, NameKind, UnitOfWork, validate_name};

/// The Redis keys that idempotask uses in one namespace.
///
/// Each unit of work has three keys that share one Redis Cluster hash slot:
/// `idempotask:v1:{<namespace>:<task>:<sha256 hex of the caller key>}:lock`, `…:done` and
/// `…:fence`. [`RedisStore`](crate::RedisStore) uses this layout; tools use it to find a unit's
/// keys, to `SCAN` one task's keys, and to read a key they found back into its parts. Nothing
/// here connects to Redis.
///
/// ```
/// use idempotask::{RedisKeys, UnitOfWork};
/// use idempotask::store::redis::KeyKind;
///
/// let keys = RedisKeys::new("billing")?;
/// let unit = UnitOfWork::new("charge", "order-42")?;
/// let [lock, done, fence] = keys.unit(&unit);
/// assert!(done.starts_with("idempotask:v1:{billing:charge:") && done.ends_with("}:done"));
/// assert_eq!(keys.task_pattern("charge")?, "idempotask:v1:{billing:charge:*}:*");
///
/// let parsed = keys.parse(&lock).expect("one of ours");
/// assert_eq!((parsed.task, parsed.digest, parsed.kind), ("charge", unit.digest(), KeyKind::Lock));
/// # Ok::<(), idempotask::InvalidKey>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisKeys {
    namespace: String,
}

/// Which of a unit's three keys a Redis key is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum KeyKind {
    /// The lock; its value is the holder's random token.
    Lock,
    /// The completion marker; its value is a [`Marker`](crate::Marker).
    Done,
    /// The fencing counter; its value is the last fencing token granted.
    Fence,
}

/// A Redis key of one unit of work, read back into its parts by [`RedisKeys::parse`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ParsedKey<'a> {
    /// The task's stable name.
    pub task: &'a str,
    /// The SHA-256 hex of the caller key (the plain key lives only in the marker).
    pub digest: &'a str,
    /// Which key of the unit it is.
    pub kind: KeyKind,
}

pub(super) const PREFIX: &str = "idempotask:v1:{";

impl RedisKeys {
    /// The layout of `namespace`.
    ///
    /// # Errors
    /// [`InvalidKey::Namespace`] unless the namespace is 1 to 128 characters of
    /// `A-Z a-z 0-9 _ - .`.
    pub fn new(namespace: &str) -> Result<Self, InvalidKey> {
        validate_name(namespace, NameKind::Namespace)?;
        Ok(Self {
            namespace: namespace.to_owned(),
        })
    }

    /// The namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The keys of `unit`: lock, done marker, fencing counter.
    pub fn unit(&self, unit: &UnitOfWork) -> [String; 3] {
        super::key_names(&self.namespace, unit)
    }

    /// A `SCAN … MATCH` pattern for every key of `task` in this namespace.
    ///
    /// Names are limited to `A-Z a-z 0-9 _ - .`, so nothing in them is a glob character. On
    /// Redis Cluster the keys of one task spread over all slots: scan every master.
    ///
    /// # Errors
    /// [`InvalidKey::TaskName`] for a name no task can have.
    pub fn task_pattern(&self, task: &str) -> Result<String, InvalidKey> {
        validate_name(task, NameKind::Task)?;
        Ok(format!("{PREFIX}{}:{task}:*}}:*", self.namespace))
    }

    /// Reads a key of this namespace back into its parts; `None` for any other key.
    pub fn parse<'k>(&self, key: &'k str) -> Option<ParsedKey<'k>> {
        let rest = key.strip_prefix(PREFIX)?.strip_prefix(&*self.namespace)?;
        let rest = rest.strip_prefix(':')?;
        let (inner, suffix) = rest.rsplit_once("}:")?;
        let (task, digest) = inner.rsplit_once(':')?;
        let kind = match suffix {
            "lock" => KeyKind::Lock,
            "done" => KeyKind::Done,
            "fence" => KeyKind::Fence,
            _ => return None,
        };
        let is_digest = digest.len() == 64
            && digest
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        (is_digest && validate_name(task, NameKind::Task).is_ok()).then_some(ParsedKey {
            task,
            digest,
            kind,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_reads_back_every_key_of_a_unit() {
        let keys = RedisKeys::new("ns.1").unwrap();
        let unit = UnitOfWork::new("send-mail_v2", "a:{b}\n").unwrap();
        let kinds = [KeyKind::Lock, KeyKind::Done, KeyKind::Fence];
        for (key, kind) in keys.unit(&unit).iter().zip(kinds) {
            let parsed = keys.parse(key).unwrap();
            assert_eq!(parsed.task, "send-mail_v2");
            assert_eq!(parsed.digest, unit.digest());
            assert_eq!(parsed.kind, kind);
        }
    }

    #[test]
    fn parse_rejects_other_namespaces_and_foreign_keys() {
        let keys = RedisKeys::new("billing").unwrap();
        let other = RedisKeys::new("billing2").unwrap();
        let unit = UnitOfWork::new("t", "k").unwrap();
        assert!(keys.parse(&other.unit(&unit)[1]).is_none());
        for foreign in [
            "",
            "session:42",
            "idempotask:v1:{billing:t:abc}:done",
            "idempotask:v1:{billing:t:{}}:done",
            "idempotask:v2:{billing:t:0}:done",
        ] {
            assert!(keys.parse(foreign).is_none(), "{foreign:?}");
        }
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
