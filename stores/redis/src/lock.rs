//! What a unit's key holds while it is not done: the lock of one delivery, `L<token>` or
//! `L<token>.<fencing token>`, and after a fenced lock was released, `T<fencing token>`, which
//! keeps the last fencing token so that the next grant's is higher. The marker (`D…`) is
//! [`Marker`](idempotask::operator::Marker)'s.

use idempotask::store::Begin;
use idempotask::store::LockToken;

pub(super) const LOCK_TAG: u8 = b'L';
pub(super) const RELEASED_TAG: u8 = b'T';

/// The value of `token`'s lock: `L<token>`, or `L<token>.<fencing token>` once granted with one.
pub(super) fn lock_value(token: &LockToken) -> String {
    let mut value = String::with_capacity(54);
    value.push(char::from(LOCK_TAG));
    value.push_str(token.as_str());
    if let Some(fence) = token.fencing_token() {
        value.push('.');
        value.push_str(&fence.to_string());
    }
    value
}

/// The part of `token`'s lock value that names its holder, `L<token>`, whatever fencing token
/// the lock was granted with.
pub(super) fn holder_value(token: &LockToken) -> String {
    let mut value = String::with_capacity(33);
    value.push(char::from(LOCK_TAG));
    value.push_str(token.as_str());
    value
}

/// A lock's value read back into its parts: the holder's token and the fencing token it was
/// granted with; `None` for a value that is not a well-formed lock.
///
/// Input: `L<token>` or `L<token>.<fencing token>`. Output: `(token, fencing token)`.
pub(super) fn lock_parts(value: &[u8]) -> Option<(&[u8], Option<u64>)> {
    let rest = value.strip_prefix(&[LOCK_TAG])?;
    match rest.iter().rposition(|&b| b == b'.') {
        None => Some((rest, None)),
        Some(dot) => {
            let fence = std::str::from_utf8(&rest[dot + 1..]).ok()?.parse().ok()?;
            Some((&rest[..dot], Some(fence)))
        }
    }
}

/// `Acquired` when the stored `value` is a lock taken with `token` (a repeated call whose first
/// reply was lost), with the fencing token it was granted.
pub(super) fn own_lock(value: &[u8], token: &LockToken) -> Option<Begin> {
    let (holder, fencing_token) = lock_parts(value)?;
    (holder == token.as_str().as_bytes()).then(|| Begin::acquired(fencing_token))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_values_carry_the_token_and_the_fencing_token() {
        let token = LockToken::generate();
        let plain = lock_value(&token);
        assert_eq!(plain, format!("L{}", token.as_str()));
        let acquired = |fencing_token| Some(Begin::acquired(fencing_token));
        assert_eq!(own_lock(plain.as_bytes(), &token), acquired(None));
        let fenced = lock_value(&token.clone().with_fencing_token(1_764_460_000_123));
        assert_eq!(fenced, format!("L{}.1764460000123", token.as_str()));
        assert_eq!(
            own_lock(fenced.as_bytes(), &token),
            acquired(Some(1_764_460_000_123))
        );
        let other = LockToken::generate();
        assert_eq!(own_lock(plain.as_bytes(), &other), None);
        for damaged in [
            format!("L{}.", token.as_str()),
            format!("L{}x", token.as_str()),
            format!("L{}.7x", token.as_str()),
        ] {
            assert_eq!(own_lock(damaged.as_bytes(), &token), None, "{damaged}");
        }
        assert_eq!(lock_parts(b"Labc.7"), Some((&b"abc"[..], Some(7))));
        assert_eq!(lock_parts(b"Labc"), Some((&b"abc"[..], None)));
        assert_eq!(lock_parts(b"Dabc.7"), None);
    }
}
