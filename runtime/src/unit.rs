//! One unit of work: a task name and the caller's key, validated and hashed once.

use std::fmt;
use std::sync::Arc;

use sha2::{Digest, Sha256};

/// The longest caller key accepted by default, in bytes.
pub const MAX_KEY_LEN: usize = 1024;

/// The longest task name or namespace accepted, in bytes.
pub const MAX_NAME_LEN: usize = 128;

/// One unit of work: the task's stable name and the caller's idempotency key.
///
/// Stores address everything they keep for a unit through [`digest`](Self::digest), the SHA-256
/// of the caller key, so no caller text ever reaches a raw store key: a key containing `:`, `{`,
/// `}` or a newline cannot collide with another key or change the Redis Cluster hash slot. The
/// plain key travels inside the stored marker so that operators can read it.
///
/// ```
/// use idempotask::UnitOfWork;
/// let unit = UnitOfWork::new("charge_customer", "order-42")?;
/// assert_eq!(unit.key(), "order-42");
/// assert_eq!(unit.digest().len(), 64);
/// assert!(UnitOfWork::new("charge_customer", "").is_err());
/// # Ok::<(), idempotask::InvalidKey>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct UnitOfWork {
    inner: Arc<Inner>,
}

#[derive(PartialEq, Eq, Hash)]
struct Inner {
    task: Box<str>,
    key: Box<str>,
    digest: Box<str>,
}

impl UnitOfWork {
    /// Validates `task` and `key` (at most [`MAX_KEY_LEN`] bytes) and hashes the key.
    ///
    /// # Errors
    /// [`InvalidKey`] for an empty or over-long key, or a task name that is not 1 to
    /// [`MAX_NAME_LEN`] characters of `A-Z a-z 0-9 _ - .`.
    pub fn new(task: &str, key: impl Into<String>) -> Result<Self, InvalidKey> {
        Self::with_limit(task, key, MAX_KEY_LEN)
    }

    /// Like [`new`](Self::new) with a different key length limit (a store's own).
    ///
    /// # Errors
    /// As [`new`](Self::new).
    pub fn with_limit(
        task: &str,
        key: impl Into<String>,
        max_key_len: usize,
    ) -> Result<Self, InvalidKey> {
        validate_name(task, NameKind::Task)?;
        let key = key.into();
        if key.is_empty() {
            return Err(InvalidKey::EmptyKey {
                task: task.to_owned(),
            });
        }
        if key.len() > max_key_len {
            return Err(InvalidKey::KeyTooLong {
                task: task.to_owned(),
                len: key.len(),
                max: max_key_len,
            });
        }
        let digest = hex(&Sha256::digest(key.as_bytes()));
        Ok(Self {
            inner: Arc::new(Inner {
                task: task.into(),
                key: key.into_boxed_str(),
                digest: digest.into_boxed_str(),
            }),
        })
    }

    /// The task's stable name.
    pub fn task(&self) -> &str {
        &self.inner.task
    }

    /// The caller's key as given.
    pub fn key(&self) -> &str {
        &self.inner.key
    }

    /// The lowercase hex SHA-256 of the caller key: what stores put in their keys.
    pub fn digest(&self) -> &str {
        &self.inner.digest
    }
}

impl fmt::Debug for UnitOfWork {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UnitOfWork")
            .field("task", &self.task())
            .field("key", &self.key())
            .finish_non_exhaustive()
    }
}

/// Which kind of name [`validate_name`] checks, for its error message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NameKind {
    Task,
    Namespace,
}

/// Checks a task name or namespace: 1 to [`MAX_NAME_LEN`] characters of `A-Z a-z 0-9 _ - .`.
///
/// Names reach store keys in plain text (operators read them), so they must not contain the
/// separators or hash-tag braces that the digest protects caller keys from.
pub(crate) fn validate_name(name: &str, kind: NameKind) -> Result<(), InvalidKey> {
    let valid = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    if valid {
        Ok(())
    } else if kind == NameKind::Task {
        Err(InvalidKey::TaskName {
            name: name.to_owned(),
        })
    } else {
        Err(InvalidKey::Namespace {
            name: name.to_owned(),
        })
    }
}

/// Lowercase hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    out
}

/// A caller key or name that cannot be used. Nothing was sent to the store.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidKey {
    /// The caller key is empty.
    #[error("the idempotency key of task `{task}` is empty; pass the key the caller decided on")]
    EmptyKey {
        /// The task's name.
        task: String,
    },
    /// The caller key is longer than the store accepts.
    #[error(
        "the idempotency key of task `{task}` is {len} bytes long, more than the {max} allowed; pass a shorter identifier (an order id, a message id)"
    )]
    KeyTooLong {
        /// The task's name.
        task: String,
        /// The key's length in bytes.
        len: usize,
        /// The limit in bytes.
        max: usize,
    },
    /// The task name has characters outside `A-Z a-z 0-9 _ - .`, or is empty or too long.
    #[error(
        "task name `{name}` is not 1 to 128 characters of `A-Z a-z 0-9 _ - .`; choose a stable name with `name = \"…\"`"
    )]
    TaskName {
        /// The rejected name.
        name: String,
    },
    /// The namespace has characters outside `A-Z a-z 0-9 _ - .`, or is empty or too long.
    #[error("namespace `{name}` is not 1 to 128 characters of `A-Z a-z 0-9 _ - .`")]
    Namespace {
        /// The rejected name.
        name: String,
    },
}

/// The random token that identifies one lock holder.
///
/// 128 random bits, hex-encoded. A store only deletes, extends or finishes a lock whose value is
/// still this token, so a holder whose lock expired can never touch its successor's lock.
///
/// ```
/// let a = idempotask::LockToken::generate();
/// let b = idempotask::LockToken::generate();
/// assert_ne!(a, b);
/// assert_eq!(a.as_str().len(), 32);
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct LockToken(Box<str>);

impl LockToken {
    /// A fresh token from the thread-local CSPRNG.
    pub fn generate() -> Self {
        Self(hex(&rand::random::<[u8; 16]>()).into_boxed_str())
    }

    /// The token as stored.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for LockToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Eight characters identify a holder in logs without handing out the whole token.
        write!(f, "LockToken({}…)", &self.0[..8])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_that_look_alike_get_different_digests() {
        let keys = ["a:b", "a:b ", "{a}:b", "a\nb", "a}{b", "A:B"];
        let digests: std::collections::HashSet<String> = keys
            .iter()
            .map(|k| UnitOfWork::new("t", *k).unwrap().digest().to_owned())
            .collect();
        assert_eq!(digests.len(), keys.len());
    }

    #[test]
    fn key_length_is_checked_in_bytes_at_the_limit() {
        assert!(UnitOfWork::new("t", "x".repeat(MAX_KEY_LEN)).is_ok());
        let err = UnitOfWork::new("t", "é".repeat(MAX_KEY_LEN / 2 + 1)).unwrap_err();
        assert_eq!(
            err,
            InvalidKey::KeyTooLong {
                task: "t".into(),
                len: MAX_KEY_LEN + 2,
                max: MAX_KEY_LEN
            }
        );
    }

    #[test]
    fn task_names_with_separators_are_rejected() {
        for name in [
            "",
            "a:b",
            "a{b}",
            "with space",
            &"n".repeat(MAX_NAME_LEN + 1),
        ] {
            assert!(
                matches!(UnitOfWork::new(name, "k"), Err(InvalidKey::TaskName { .. })),
                "{name:?}"
            );
        }
        assert!(UnitOfWork::new("mod_a.charge-v2", "k").is_ok());
    }

    #[test]
    fn digest_is_sha256_hex() {
        let unit = UnitOfWork::new("t", "abc").unwrap();
        assert_eq!(
            unit.digest(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
