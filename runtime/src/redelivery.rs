//! What a queue should do with a message whose task call failed: the one classification of
//! [`Error`] that every queue integration acts on.

use std::time::Duration;

use crate::Error;
use crate::step::kind::StepErrorKind;

/// Whether, and when, a later delivery of the same message can succeed where this one failed.
///
/// Queue integrations map it onto their queue's own verbs (a delayed nak, a retry queue, a
/// dead-letter exchange); a consumer written by hand can do the same:
///
/// | [`Error`] | `Redelivery` | the message |
/// | --- | --- | --- |
/// | [`Contended`](Error::Contended) | [`AfterHolder`](Self::AfterHolder) | back after the holder's remaining lock time |
/// | [`LockNotHeld`](Error::LockNotHeld) (a body's fence refused) | [`AfterHolder`](Self::AfterHolder)`(None)` | back after the delivery that took the unit over: it replays that delivery's result |
/// | [`Store`](Error::Store), [`NotConfigured`](Error::NotConfigured) | [`Later`](Self::Later) | back later, with backoff: the store recovers, or the deploy that installs it comes |
/// | [`Reentered`](Error::Reentered), [`NoRuntime`](Error::NoRuntime), [`TaskNameTaken`](Error::TaskNameTaken) ([`is_misuse`](Error::is_misuse)) | [`Later`](Self::Later) | back later: the program is wrong, not the message, which must outlive the fix |
/// | [`KeyReuse`](Error::KeyReuse), [`Codec`](Error::Codec), [`InvalidKey`](Error::InvalidKey), [`MarkerKeyMismatch`](Error::MarkerKeyMismatch) | [`Never`](Self::Never) | to the dead-letter path: no delivery of it can succeed. A [`Codec`](Error::Codec) error means the work already ran once (see [`CodecErrorKind`](crate::CodecErrorKind)): re-driving the message from there runs it again |
/// | [`InDoubt`](Error::InDoubt) | [`Never`](Self::Never) | to the dead-letter path, with the reason: no delivery can succeed until an operator resolves the unit; re-drive it after that (a recorded result replays, a freed unit runs) |
///
/// ```
/// use idempotask::{Error, Redelivery};
///
/// // A consumer's settle step, by hand.
/// fn settle(err: &Error) -> &'static str {
///     match err.redelivery() {
///         Redelivery::AfterHolder(_) => "nak with the holder's remaining time",
///         Redelivery::Never => "dead-letter",
///         // `Later`, and whatever later versions add: keep the message.
///         _ => "nak with backoff",
///     }
/// }
/// assert_eq!(settle(&Error::NotConfigured), "nak with backoff");
/// let unusable = Error::from(idempotask::store::check_task_name("").unwrap_err());
/// assert_eq!(settle(&unusable), "dead-letter");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Redelivery {
    /// Another delivery holds the unit. Deliver the message again once the holder is done,
    /// after its remaining lock time (`None`: the store did not say; the lock TTL bounds it):
    /// the redelivery then replays the stored result, or runs if the holder failed.
    AfterHolder(Option<Duration>),
    /// Nothing is wrong with the message: the store failed or is missing, or the program
    /// misuses idempotask. Deliver it again later, with backoff; never drop it.
    Later,
    /// No delivery of this message can succeed: its key is unusable, it reuses a key with other
    /// arguments, the stored result does not decode or does not belong to it, or its unit is
    /// held in doubt until an operator resolves it. Send it to the dead-letter path. Nothing ran for this delivery, except on a [`Codec`](Error::Codec)
    /// error: then the work ran once, in this delivery or an earlier one.
    Never,
}

impl Error {
    /// Whether, and when, a later delivery of the same message can succeed (see
    /// [`Redelivery`]). Errors added in later versions are [`Redelivery::Later`] unless they
    /// prove that no delivery can succeed: failing closed keeps the message.
    pub fn redelivery(&self) -> Redelivery {
        match self {
            Self::Contended {
                lock_ttl_remaining, ..
            } => Redelivery::AfterHolder(*lock_ttl_remaining),
            Self::LockNotHeld { .. } => Redelivery::AfterHolder(None),
            Self::KeyReuse { .. }
            | Self::InDoubt { .. }
            | Self::Codec { .. }
            | Self::InvalidKey(_)
            | Self::MarkerKeyMismatch { .. }
            // A journal that does not match the body, or a body over its limit, stops every
            // delivery at the same step.
            | Self::Step {
                kind: StepErrorKind::OrderChanged | StepErrorKind::TooMany,
                ..
            } => Redelivery::Never,
            Self::Store(_)
            | Self::Step { .. }
            | Self::NotConfigured
            | Self::Reentered { .. }
            | Self::NoRuntime
            | Self::TaskNameTaken { .. } => Redelivery::Later,
        }
    }

    /// Whether the error is a bug of the program rather than of the message or the store: a
    /// task re-entered with its own key, a call outside a tokio runtime, two tasks under one
    /// name. Worth an `error!` of its own; the message is still delivered again
    /// ([`Redelivery::Later`]) so that it outlives the fix.
    ///
    /// ```
    /// assert!(idempotask::Error::NoRuntime.is_misuse());
    /// assert!(!idempotask::Error::NotConfigured.is_misuse());
    /// ```
    pub fn is_misuse(&self) -> bool {
        matches!(
            self,
            Self::Reentered { .. } | Self::NoRuntime | Self::TaskNameTaken { .. }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{StoreError, StoreErrorKind};

    #[test]
    fn only_errors_no_delivery_can_cure_are_never() {
        let store = Error::Store(StoreError::new(
            "begin",
            StoreErrorKind::Configuration,
            "ACL",
        ));
        assert_eq!(store.redelivery(), Redelivery::Later);
        assert!(!store.is_misuse());
        let taken = Error::TaskNameTaken {
            task: "charge".into(),
            first: "a.rs:1".into(),
            second: "b.rs:2".into(),
        };
        assert_eq!(taken.redelivery(), Redelivery::Later);
        assert!(taken.is_misuse());
        let invalid = Error::from(crate::unit::check_task_name("").unwrap_err());
        assert_eq!(invalid.redelivery(), Redelivery::Never);
        let busy = Error::Contended {
            task: "charge".into(),
            key: crate::CallerKey::plain("order-42"),
            lock_ttl_remaining: Some(Duration::from_secs(3)),
            attempts: 1,
        };
        assert_eq!(
            busy.redelivery(),
            Redelivery::AfterHolder(Some(Duration::from_secs(3)))
        );
        let fenced_out = Error::LockNotHeld {
            task: "charge".into(),
            key: crate::CallerKey::plain("order-42"),
        };
        assert_eq!(fenced_out.redelivery(), Redelivery::AfterHolder(None));
        assert!(!fenced_out.is_misuse());
    }
}
