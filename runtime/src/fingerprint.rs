//! Fingerprints of the arguments that must match when an idempotency key is reused.

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::unit::hex;

/// The SHA-256 of some arguments' JSON encoding.
///
/// A task that declares a fingerprint stores it in its marker; a later call with the same key
/// but a different fingerprint gets [`Error::KeyReuse`](crate::Error::KeyReuse) instead of the
/// first call's result, which catches two operations sharing one key by mistake.
///
/// ```
/// use idempotask::Fingerprint;
/// let a = Fingerprint::of(&(42_u64, "EUR"))?;
/// assert_eq!(a, Fingerprint::of(&(42_u64, "EUR"))?);
/// assert_ne!(a, Fingerprint::of(&(43_u64, "EUR"))?);
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Fingerprint(String);

impl Fingerprint {
    /// The fingerprint of `value` (use a tuple for several arguments).
    ///
    /// # Errors
    /// When `value` cannot be serialised to JSON (a map with non-string keys, a failing
    /// `Serialize` implementation).
    pub fn of<T: Serialize + ?Sized>(value: &T) -> Result<Self, serde_json::Error> {
        let json = serde_json::to_vec(value)?;
        Ok(Self(hex(&Sha256::digest(&json))))
    }

    /// The lowercase hex digest, as stored in markers.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}
