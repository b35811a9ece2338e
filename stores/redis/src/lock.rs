//! What a unit's key holds while it is not done: the lock of one delivery,
//! `L<token>[~<doubt memory in ms>][!<expired ms>[:<earlier fencing token>]][.<fencing token>]`,
//! and after a fenced lock was released, `T<fencing token>`, which keeps the last fencing token
//! so that the next grant's is higher. The marker (`D…`) is
//! [`Marker`](idempotask::operator::Marker)'s.
//!
//! `!` marks a lock that took over a unit in doubt, with the doubt it found: how long the
//! earlier lock had run out, and its fencing token. A `begin` repeated with the same token
//! answers that doubt again, and a release leaves such a lock to run out (remembered) instead
//! of deleting it: only a result ends a doubt.
//!
//! A lock with a doubt memory `m` is kept for its TTL plus `m`: the key's expiry is the end of
//! the memory, and the lock itself ran out once the key has `m` ms or less left (the server's
//! clock, through `PTTL`). In between the unit is in doubt. A lock without `~` (memory 0, or
//! written by an earlier version) runs out with its key.

use std::time::Duration;

use idempotask::store::LockToken;
use idempotask::store::{Begin, Doubt};

pub(super) const LOCK_TAG: u8 = b'L';
pub(super) const RELEASED_TAG: u8 = b'T';

/// The value of `token`'s lock: `L<token>[~<doubt memory>]`, with the doubt it took over and
/// `.<fencing token>` once granted with them.
pub(super) fn lock_value(token: &LockToken) -> String {
    let mut value = holder_value(token);
    if let Some(doubt) = token.doubt_taken_over() {
        value.push('!');
        push_decimal(&mut value, ttl_millis_of(doubt.expired_for));
        if let Some(earlier) = doubt.fencing_token {
            value.push(':');
            push_decimal(&mut value, earlier);
        }
    }
    if let Some(fence) = token.fencing_token() {
        value.push('.');
        push_decimal(&mut value, fence);
    }
    value
}

/// The part of `token`'s lock value that names its holder, `L<token>[~<doubt memory>]`,
/// whatever fencing token the lock was granted with.
pub(super) fn holder_value(token: &LockToken) -> String {
    let mut value = String::with_capacity(64);
    value.push(char::from(LOCK_TAG));
    value.push_str(token.as_str());
    let memory = memory_millis(token);
    if memory > 0 {
        value.push('~');
        push_decimal(&mut value, memory);
    }
    value
}

/// Appends `number` in decimal. Every fresh call writes its lock's value: `core::fmt` (or
/// `to_string`, which also allocates) cost about 600 instructions of a fresh task's 50,000.
fn push_decimal(value: &mut String, mut number: u64) {
    let mut digits = [0_u8; 20];
    let mut start = digits.len();
    loop {
        start -= 1;
        digits[start] = b'0' + u8::try_from(number % 10).unwrap_or(0);
        number /= 10;
        if number == 0 {
            break;
        }
    }
    value.extend(digits[start..].iter().map(|&digit| char::from(digit)));
}

/// A duration in whole milliseconds, as the scripts count them.
fn ttl_millis_of(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// How long the store keeps `token`'s lock after it ran out, in ms (0: not at all).
pub(super) fn memory_millis(token: &LockToken) -> u64 {
    let memory = token.doubt_memory();
    if memory.is_zero() {
        0
    } else {
        idempotask::store::ttl_millis(memory)
    }
}

/// How long a key holding `token`'s lock for `lock_ms` lives: the lock, then its memory.
pub(super) fn key_millis(token: &LockToken, lock_ms: u64) -> u64 {
    lock_ms.saturating_add(memory_millis(token))
}

/// A lock's value read back into its parts; `None` for a value that is not a well-formed lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct LockParts<'a> {
    /// The holder's random token.
    pub(super) holder: &'a [u8],
    /// How long the key outlives the lock, in ms.
    pub(super) memory_ms: u64,
    /// The fencing token it was granted with.
    pub(super) fencing_token: Option<u64>,
    /// The doubt it took over, if it did.
    pub(super) took_over: Option<Doubt>,
}

impl LockParts<'_> {
    /// The lock's state, given its key's remaining life `key_ttl`: how long it has left, or
    /// how long ago it ran out (`Err`) while its memory lasts.
    pub(super) fn left(&self, key_ttl: Duration) -> Result<Duration, Duration> {
        let memory = Duration::from_millis(self.memory_ms);
        match key_ttl.checked_sub(memory) {
            Some(left) if !left.is_zero() => Ok(left),
            _ => Err(memory.saturating_sub(key_ttl)),
        }
    }
}

/// Input: `L<token>[~<memory>][!<expired ms>[:<earlier fence>]][.<fencing token>]`. Output:
/// its parts.
pub(super) fn lock_parts(value: &[u8]) -> Option<LockParts<'_>> {
    let number = |digits: &[u8]| -> Option<u64> { std::str::from_utf8(digits).ok()?.parse().ok() };
    let rest = value.strip_prefix(&[LOCK_TAG])?;
    let (rest, fencing_token) = match rest.iter().rposition(|&b| b == b'.') {
        None => (rest, None),
        Some(dot) => (&rest[..dot], Some(number(&rest[dot + 1..])?)),
    };
    let (rest, took_over) = match rest.iter().position(|&b| b == b'!') {
        None => (rest, None),
        Some(bang) => {
            let doubt = &rest[bang + 1..];
            let (expired, earlier) = match doubt.iter().position(|&b| b == b':') {
                None => (doubt, None),
                Some(colon) => (&doubt[..colon], Some(number(&doubt[colon + 1..])?)),
            };
            let expired = Duration::from_millis(number(expired)?);
            (&rest[..bang], Some(Doubt::new(earlier, expired)))
        }
    };
    let (holder, memory_ms) = match rest.iter().position(|&b| b == b'~') {
        None => (rest, 0),
        Some(tilde) => (&rest[..tilde], number(&rest[tilde + 1..])?),
    };
    Some(LockParts {
        holder,
        memory_ms,
        fencing_token,
        took_over,
    })
}

/// `Acquired` when the stored `value` is a lock taken with `token` (a repeated call whose first
/// reply was lost), with the fencing token it was granted and the doubt it took over.
pub(super) fn own_lock(value: &[u8], token: &LockToken) -> Option<Begin> {
    let parts = lock_parts(value)?;
    (parts.holder == token.as_str().as_bytes()).then(|| match parts.took_over {
        Some(doubt) => Begin::taken_over(parts.fencing_token, doubt),
        None => Begin::acquired(parts.fencing_token),
    })
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
        let parts = |holder: &'static [u8], memory_ms, fencing_token| {
            Some(LockParts {
                holder,
                memory_ms,
                fencing_token,
                took_over: None,
            })
        };
        assert_eq!(lock_parts(b"Labc.7"), parts(b"abc", 0, Some(7)));
        assert_eq!(lock_parts(b"Labc"), parts(b"abc", 0, None));
        assert_eq!(lock_parts(b"Labc~500.7"), parts(b"abc", 500, Some(7)));
        assert_eq!(lock_parts(b"Labc~500"), parts(b"abc", 500, None));
        assert_eq!(lock_parts(b"Labc~x"), None);
        assert_eq!(lock_parts(b"Dabc.7"), None);
        for number in [0, 7, 10, 86_400_000, u64::MAX] {
            let mut text = String::new();
            push_decimal(&mut text, number);
            assert_eq!(text, number.to_string());
        }
        let remembered = token.clone().with_doubt_memory(Duration::from_secs(2));
        assert_eq!(
            lock_value(&remembered.clone().with_fencing_token(9)),
            format!("L{}~2000.9", token.as_str())
        );
        assert_eq!(
            own_lock(
                format!("L{}~2000.9", token.as_str()).as_bytes(),
                &remembered
            ),
            acquired(Some(9))
        );
        let doubt = Doubt::new(Some(41), Duration::from_millis(250));
        let successor = remembered.clone().taking_over(doubt).with_fencing_token(42);
        let value = lock_value(&successor);
        assert_eq!(value, format!("L{}~2000!250:41.42", token.as_str()));
        assert_eq!(
            own_lock(value.as_bytes(), &remembered),
            Some(Begin::taken_over(Some(42), doubt))
        );
        let unfenced = Doubt::new(None, Duration::from_millis(3));
        let value = lock_value(&remembered.clone().taking_over(unfenced));
        assert_eq!(value, format!("L{}~2000!3", token.as_str()));
        assert_eq!(
            lock_parts(value.as_bytes()).map(|parts| (parts.memory_ms, parts.took_over)),
            Some((2000, Some(unfenced)))
        );
        for damaged in ["Labc~500!", "Labc~500!x", "Labc~500!3:", "Labc~500!3:y.7"] {
            assert_eq!(lock_parts(damaged.as_bytes()), None, "{damaged}");
        }
        let lapsed = lock_parts(b"Labc~500").unwrap();
        assert_eq!(
            lapsed.left(Duration::from_millis(800)),
            Ok(Duration::from_millis(300))
        );
        assert_eq!(
            lapsed.left(Duration::from_millis(200)),
            Err(Duration::from_millis(300))
        );
    }
}
