//! The store's half of the outcome oracle: how the call's lock stood when its marker was
//! written, and what a store may answer to a finish given what the unit held around it. The
//! runner's half, what the call answered against what the store holds, is in `verdict`.

use idempotask::store::{Finish, Inspection};

use super::op::Answer;

/// How the call's lock stood when its marker was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Lock {
    /// Held, with time to spare.
    Held,
    /// Held with so little time left that it may have expired before the finish reached it.
    Expiring,
    /// Gone: run out (remembered or not), or another delivery's.
    Lapsed,
}

/// The call's own marker reaching the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Written {
    pub(super) lock: Lock,
    /// Before the call answered: by one of its operations, or by an operation applied late that
    /// a later read of the call's (a finish, an inspection) came after.
    pub(super) before_the_answer: bool,
}

/// What a unit holds, in a few words.
pub(super) fn shown(seen: &Inspection) -> String {
    match (&seen.marker, seen.lock_ttl) {
        (Some(bytes), _) => match idempotask::operator::Marker::decode(bytes) {
            Ok(marker) => format!("the result of delivery {:?}", marker.delivery()),
            Err(err) => format!("an unreadable marker ({err})"),
        },
        (None, Some(left)) => format!("a lock with {} ms left", left.as_millis()),
        (None, None) => "nothing".to_owned(),
    }
}

/// Input: a stored marker and the one a finish wrote. Output: whether it is that finish's,
/// and if so whether the store flagged it as written after the lock was lost.
pub(super) fn own_marker(stored: &[u8], marker: &[u8]) -> Option<bool> {
    if stored == marker {
        Some(false)
    } else {
        (idempotask::store::lock_lost_marker(marker).as_deref() == Some(stored)).then_some(true)
    }
}

/// What a store's answer to a finish may be, given what the unit held around it: the store's
/// half of the outcome oracle (the runner's half is in `verdict`).
pub(super) fn finish_answer(
    marker: &[u8],
    before: &Inspection,
    answer: &Answer,
    after: &Inspection,
    lock: Lock,
) -> Option<String> {
    let Answer::Finish(Ok(finish)) = answer else {
        return None;
    };
    let found = before
        .marker
        .as_deref()
        .map(|stored| own_marker(stored, marker));
    let kept = after
        .marker
        .as_deref()
        .and_then(|stored| own_marker(stored, marker));
    match finish {
        Finish::Completed => match found {
            Some(Some(true)) => Some(
                "a finish answered `Completed` on finding its own result written after its lock was lost"
                    .to_owned(),
            ),
            Some(None) => Some("a finish answered `Completed` on finding another result".to_owned()),
            None if kept.is_none() => {
                Some("a finish answered `Completed` and its result is not stored".to_owned())
            }
            None if lock == Lock::Lapsed && before.is_locked() => Some(
                "a finish answered `Completed` over another delivery's lock".to_owned(),
            ),
            Some(Some(false)) | None => None,
        },
        Finish::LockLost {
            marker_written: true,
            ..
        } if kept.is_none() => {
            Some("a finish answered `LockLost` with its marker written, and it is not stored".to_owned())
        }
        Finish::LockLost {
            marker_written: false,
            ..
        } if kept.is_some() && found.is_none() => {
            Some("a finish answered `LockLost` with nothing written, and stored its result".to_owned())
        }
        _ if lock == Lock::Held && !matches!(finish, Finish::Completed) => Some(format!(
            "a finish answered {finish:?} while its lock was held"
        )),
        _ => None,
    }
}
