//! One unit of work: a task name and the caller's key, validated and hashed once.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};

/// The longest caller key accepted by default, in bytes.
pub const MAX_KEY_LEN: usize = 1024;

/// The longest task name or namespace accepted, in bytes.
pub const MAX_NAME_LEN: usize = 128;

/// One unit of work: the task's stable name and the caller's idempotency key.
///
/// Stores address what they keep for a unit through [`digest`](Self::digest), a short hash of
/// the caller key, so no caller text ever reaches a raw store key: a key containing `:`, `{`,
/// `}` or a newline cannot change a key name's structure. The plain key travels inside the
/// stored marker, so operators can read it and a duplicate can check that a marker found under
/// the digest really is its own key's (a digest collision is an error, never a replay of another
/// key's result).
///
/// ```
/// use idempotask::store::UnitOfWork;
/// let unit = UnitOfWork::new("charge_customer", "order-42")?;
/// assert_eq!(unit.key(), "order-42");
/// assert_eq!(unit.digest().len(), 16);
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
    /// Base64url text, kept inline: one allocation fewer per unit.
    digest: [u8; DIGEST_LEN],
}

/// The length of a unit's digest, in characters.
const DIGEST_LEN: usize = 16;

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
        Ok(Self {
            inner: Arc::new(Inner {
                task: task.into(),
                digest: digest_bytes(key.as_bytes()),
                key: key.into_boxed_str(),
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

    /// The first 96 bits of the caller key's SHA-256 in unpadded base64url (16 characters of
    /// `A-Z a-z 0-9 - _`): what stores put in their key names.
    pub fn digest(&self) -> &str {
        // Base64url is ASCII, so this never falls back.
        std::str::from_utf8(&self.inner.digest).unwrap_or_default()
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

/// Checks a store's namespace as task names are checked: 1 to [`MAX_NAME_LEN`] characters of
/// `A-Z a-z 0-9 _ - .`, which reach store keys in plain text.
///
/// ```
/// assert!(idempotask::store::check_namespace("billing.eu-1").is_ok());
/// assert!(idempotask::store::check_namespace("billing:*").is_err());
/// ```
///
/// # Errors
/// [`InvalidKey::Namespace`] when it is not such a name.
pub fn check_namespace(namespace: &str) -> Result<(), InvalidKey> {
    validate_name(namespace, NameKind::Namespace)
}

/// Checks a task name: 1 to [`MAX_NAME_LEN`] characters of `A-Z a-z 0-9 _ - .` (for a store
/// that parses its own keys back into units).
///
/// ```
/// assert!(idempotask::store::check_task_name("charge_customer").is_ok());
/// assert!(idempotask::store::check_task_name("charge customer").is_err());
/// ```
///
/// # Errors
/// [`InvalidKey::TaskName`] when it is not such a name.
pub fn check_task_name(name: &str) -> Result<(), InvalidKey> {
    validate_name(name, NameKind::Task)
}

/// The first 96 bits of the SHA-256 of `key`, in unpadded base64url.
///
/// 96 bits keep a Redis key short (the whole unit fits a small allocation) while an accidental
/// collision stays out of reach (about 2^48 units for even odds); a collision is detected anyway,
/// because markers carry the plain key.
fn digest_bytes(key: &[u8]) -> [u8; DIGEST_LEN] {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let hash = Sha256::digest(key);
    let mut out = [0; DIGEST_LEN];
    let mut at = 0;
    for chunk in hash[..12].chunks(3) {
        let bits = u32::from(chunk[0]) << 16 | u32::from(chunk[1]) << 8 | u32::from(chunk[2]);
        for shift in [18, 12, 6, 0] {
            out[at] = ALPHABET[(bits >> shift & 0x3f) as usize];
            at += 1;
        }
    }
    out
}

/// The digest of a key as [`UnitOfWork::digest`] gives it, for a key that may not make a unit
/// (one too long for a store, or a stored marker's key).
pub(crate) fn digest_of(key: &str) -> String {
    String::from_utf8_lossy(&digest_bytes(key.as_bytes())).into_owned()
}

/// Lowercase hex of 16 bytes, on the stack: the token is made into its shared string with no
/// allocation before that one.
#[derive(Clone, PartialEq, Eq, Hash)]
struct HexBuf([u8; 32]);

impl HexBuf {
    fn of(bytes: &[u8; 16]) -> Self {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut out = [0; 32];
        for (pair, &b) in out.chunks_exact_mut(2).zip(bytes) {
            pair[0] = DIGITS[usize::from(b >> 4)];
            pair[1] = DIGITS[usize::from(b & 0x0f)];
        }
        Self(out)
    }

    fn as_str(&self) -> &str {
        // Hex digits are ASCII, so this never falls back.
        std::str::from_utf8(&self.0).unwrap_or_default()
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

/// The random token that identifies one lock holder, and the fencing token its grant carries.
///
/// 128 random bits, hex-encoded. A store only deletes, extends or finishes a lock that still
/// holds this token, so a holder whose lock expired can never touch its successor's lock. When
/// the task asked for fencing, [`Store::begin`](crate::store::Store::begin) grants a fencing
/// token too; the runner then passes [`with_fencing_token`](Self::with_fencing_token) to
/// `finish`, `release` and `renew`, because a store may keep the lock as one value holding both.
///
/// ```
/// let a = idempotask::store::LockToken::generate();
/// let b = idempotask::store::LockToken::generate();
/// assert_ne!(a, b);
/// assert_eq!(a.as_str().len(), 32);
/// assert_eq!(a.fencing_token(), None);
/// let granted = a.clone().with_fencing_token(7);
/// assert_eq!((granted.as_str(), granted.fencing_token()), (a.as_str(), Some(7)));
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct LockToken {
    /// Shared: a call hands its token to the store and to the guard that releases it, and a
    /// clone costs no allocation. Behind one thin pointer: a call's future holds several.
    holder: Arc<Holder>,
    fencing_token: Option<u64>,
}

/// What a holder is and asks for, set before its first `begin`.
#[derive(Clone, PartialEq, Eq, Hash)]
struct Holder {
    random: HexBuf,
    doubt_memory: Duration,
    takes_over_doubt: bool,
    /// Set once the lock took over a unit in doubt.
    took_over: Option<crate::store::Doubt>,
}

impl LockToken {
    /// A fresh token from the thread-local CSPRNG, without a fencing token.
    pub fn generate() -> Self {
        Self {
            holder: Arc::new(Holder {
                random: HexBuf::of(&rand::random::<[u8; 16]>()),
                doubt_memory: Duration::ZERO,
                takes_over_doubt: true,
                took_over: None,
            }),
            fencing_token: None,
        }
    }

    /// The same holder, asking the store to remember its lock for `memory` after the lock's
    /// TTL ran out without a release or a marker, so that the delivery that takes the unit
    /// over learns that it is [in doubt](crate::store::Doubt) (zero, the default of a new
    /// token: forgotten at once).
    ///
    /// A store that keeps a lock as one value keeps the memory in it, as it keeps the fencing
    /// token, which is why the token carries it.
    ///
    /// ```
    /// use std::time::Duration;
    /// let token = idempotask::store::LockToken::generate();
    /// assert_eq!(token.doubt_memory(), Duration::ZERO);
    /// let remembered = token.with_doubt_memory(Duration::from_secs(60));
    /// assert_eq!(remembered.doubt_memory(), Duration::from_secs(60));
    /// ```
    #[must_use]
    pub fn with_doubt_memory(mut self, memory: Duration) -> Self {
        Arc::make_mut(&mut self.holder).doubt_memory = crate::ttl::clamp_ttl(memory);
        self
    }

    /// How long the store should remember this lock once its TTL ran out; see
    /// [`with_doubt_memory`](Self::with_doubt_memory).
    pub fn doubt_memory(&self) -> Duration {
        self.holder.doubt_memory
    }

    /// The same holder, asking `begin` not to take over a unit [in doubt](crate::store::Doubt):
    /// the store then answers [`Begin::InDoubt`](crate::store::Begin::InDoubt) and writes
    /// nothing, so the unit stays in doubt, as remembered, for every later delivery. What
    /// [`InDoubt::Hold`](crate::InDoubt::Hold) tasks ask.
    ///
    /// ```
    /// let token = idempotask::store::LockToken::generate();
    /// assert!(token.takes_over_doubt());
    /// assert!(!token.leaving_doubt().takes_over_doubt());
    /// ```
    #[must_use]
    pub fn leaving_doubt(mut self) -> Self {
        Arc::make_mut(&mut self.holder).takes_over_doubt = false;
        self
    }

    /// Whether `begin` may take over a unit in doubt (true unless
    /// [`leaving_doubt`](Self::leaving_doubt)).
    pub fn takes_over_doubt(&self) -> bool {
        self.holder.takes_over_doubt
    }

    /// The same holder once its lock took over a unit [in doubt](crate::store::Doubt): the
    /// store keeps that doubt with the lock, and answers it again to a repeated `begin`. A
    /// store that keeps a lock as one value keeps the doubt in it too, which is why the token
    /// carries it (the runner sets it from what `begin` answered).
    ///
    /// ```
    /// use std::time::Duration;
    /// use idempotask::store::{Doubt, LockToken};
    /// let token = LockToken::generate();
    /// assert_eq!(token.doubt_taken_over(), None);
    /// let doubt = Doubt::new(Some(7), Duration::from_secs(3));
    /// let granted = token.clone().taking_over(doubt);
    /// assert_eq!(granted.doubt_taken_over(), Some(&doubt));
    /// assert_eq!(granted.as_str(), token.as_str());
    /// ```
    #[must_use]
    pub fn taking_over(mut self, doubt: crate::store::Doubt) -> Self {
        Arc::make_mut(&mut self.holder).took_over = Some(doubt);
        self
    }

    /// The doubt this holder's lock took over, if it did; see
    /// [`taking_over`](Self::taking_over).
    pub fn doubt_taken_over(&self) -> Option<&crate::store::Doubt> {
        self.holder.took_over.as_ref()
    }

    /// The same holder once its lock was granted with `fencing_token`.
    #[must_use]
    pub fn with_fencing_token(mut self, fencing_token: u64) -> Self {
        self.fencing_token = Some(fencing_token);
        self
    }

    /// The same holder once its lock was granted, with the fencing token if there is one (a
    /// store that grants in several steps, as a quorum does, builds the holder it answers for).
    #[must_use]
    pub fn granted(self, fencing_token: Option<u64>) -> Self {
        match fencing_token {
            Some(fence) => self.with_fencing_token(fence),
            None => self,
        }
    }

    /// The random part, which identifies the holder.
    pub fn as_str(&self) -> &str {
        self.holder.random.as_str()
    }

    /// The fencing token the lock was granted with, if the task uses fencing.
    pub fn fencing_token(&self) -> Option<u64> {
        self.fencing_token
    }
}

impl fmt::Debug for LockToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Eight characters identify a holder in logs without handing out the whole token.
        write!(f, "LockToken({}…", &self.as_str()[..8])?;
        match self.fencing_token {
            Some(fence) => write!(f, ", fencing token {fence})"),
            None => f.write_str(")"),
        }
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
    fn digest_is_the_first_96_bits_of_sha256_in_base64url() {
        // SHA-256("abc") starts ba7816bf 8f01cfea 414140de; base64url of those 12 bytes:
        let unit = UnitOfWork::new("t", "abc").unwrap();
        assert_eq!(unit.digest(), "ungWv48Bz-pBQUDe");
    }
}
