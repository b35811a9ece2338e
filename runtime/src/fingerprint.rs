//! Fingerprints of the arguments that must match when an idempotency key is reused.

use std::io::Write;

use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::unit::hex;

/// The SHA-256 of some arguments' canonical JSON encoding.
///
/// A task that declares a fingerprint stores it in its marker; a later call with the same key
/// but a different fingerprint gets [`Error::KeyReuse`](crate::Error::KeyReuse) instead of the
/// first call's result, which catches two operations sharing one key by mistake.
///
/// The arguments are encoded as compact JSON with the keys of every object sorted, so the
/// fingerprint depends only on the values and the names of fields and map keys: not on the
/// iteration order of a `HashMap` (random per process), nor on the order in which a struct
/// declares its fields. Values that JSON cannot tell apart (a `u8` and a `u64` holding 7, a
/// `Vec` and a tuple) have the same fingerprint.
///
/// ```
/// use std::collections::HashMap;
/// use idempotask::Fingerprint;
/// let a = Fingerprint::of(&(42_u64, "EUR"))?;
/// assert_eq!(a, Fingerprint::of(&(42_u64, "EUR"))?);
/// assert_ne!(a, Fingerprint::of(&(43_u64, "EUR"))?);
/// // The same map, built in another order, has the same fingerprint.
/// let forward: HashMap<_, _> = (0..64).map(|i| (i.to_string(), i)).collect();
/// let backward: HashMap<_, _> = (0..64).rev().map(|i| (i.to_string(), i)).collect();
/// assert_eq!(Fingerprint::of(&forward)?, Fingerprint::of(&backward)?);
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
        let mut hasher = HashWriter(Sha256::new());
        match serde_json::to_value(value) {
            Ok(tree) => write_canonical(&mut hasher, &tree)?,
            // A value the tree cannot hold (an integer beyond 64 bits) is hashed as it
            // serialises, which is canonical unless it holds a map.
            Err(_) => serde_json::to_writer(&mut hasher, value)?,
        }
        Ok(Self(hex(&hasher.0.finalize())))
    }

    /// The fingerprint whose SHA-256 is `digest`: for an integration that hashes an encoding of
    /// its own (an HTTP request's method, path and body, fed to the hash as they are) instead of
    /// serialising a value to JSON first.
    ///
    /// The encoding must be unambiguous (length-prefix each part): two requests that must
    /// differ have to feed the hash different bytes.
    ///
    /// ```
    /// use idempotask::Fingerprint;
    /// use sha2::{Digest, Sha256};
    /// let fingerprint = Fingerprint::from_sha256(Sha256::digest(b"POST /payments").into());
    /// assert_eq!(fingerprint.as_str().len(), 64);
    /// ```
    pub fn from_sha256(digest: [u8; 32]) -> Self {
        Self(hex(&digest))
    }

    /// The lowercase hex digest, as stored in markers.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Feeds what is written into the hash, so the canonical form is never held whole.
struct HashWriter(Sha256);

impl Write for HashWriter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.update(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Input: a JSON value. Output: its compact encoding with every object's keys sorted (by their
/// bytes), whatever order `serde_json`'s map keeps them in.
fn write_canonical(out: &mut impl Write, value: &Value) -> Result<(), serde_json::Error> {
    match value {
        Value::Array(items) => {
            out.write_all(b"[").map_err(serde_json::Error::io)?;
            for (index, item) in items.iter().enumerate() {
                if index > 0 {
                    out.write_all(b",").map_err(serde_json::Error::io)?;
                }
                write_canonical(out, item)?;
            }
            out.write_all(b"]").map_err(serde_json::Error::io)
        }
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
            out.write_all(b"{").map_err(serde_json::Error::io)?;
            for (index, (key, item)) in entries.into_iter().enumerate() {
                if index > 0 {
                    out.write_all(b",").map_err(serde_json::Error::io)?;
                }
                serde_json::to_writer(&mut *out, key)?;
                out.write_all(b":").map_err(serde_json::Error::io)?;
                write_canonical(out, item)?;
            }
            out.write_all(b"}").map_err(serde_json::Error::io)
        }
        leaf => serde_json::to_writer(out, leaf),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashMap};

    use super::*;

    #[test]
    fn the_canonical_form_sorts_object_keys_at_every_depth() {
        let value =
            serde_json::json!({"b": [1, {"z": null, "a": "x"}], "a": {"d": 1.5, "c": true}});
        let mut out = Vec::new();
        write_canonical(&mut out, &value).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"{"a":{"c":true,"d":1.5},"b":[1,{"a":"x","z":null}]}"#
        );
    }

    // Maps serialise in their iteration order, which for a `HashMap` is random per instance:
    // redeliveries with identical arguments must still match.
    #[test]
    fn maps_have_one_fingerprint_whatever_their_order() {
        let sorted: BTreeMap<String, u32> = (0..50).map(|i| (format!("k{i}"), i)).collect();
        let expected = Fingerprint::of(&sorted).unwrap();
        for _ in 0..50 {
            let map: HashMap<String, u32> = sorted.clone().into_iter().collect();
            assert_eq!(
                Fingerprint::of(&(7_u64, &map)).unwrap(),
                Fingerprint::of(&(7_u64, &sorted)).unwrap()
            );
            assert_eq!(Fingerprint::of(&map).unwrap(), expected);
        }
    }

    #[test]
    fn integers_beyond_64_bits_have_fingerprints() {
        let big = Fingerprint::of(&(u128::MAX,)).unwrap();
        assert_eq!(big, Fingerprint::of(&(u128::MAX,)).unwrap());
        assert_ne!(big, Fingerprint::of(&(u128::MAX - 1,)).unwrap());
    }

    #[test]
    fn different_values_have_different_fingerprints() {
        let a = Fingerprint::of(&serde_json::json!({"a": 1, "b": 2})).unwrap();
        let b = Fingerprint::of(&serde_json::json!({"a": 2, "b": 1})).unwrap();
        assert_ne!(a, b);
    }
}
