//! One store operation of the call under test, owned so that a late one can be applied after
//! its caller moved on, and what the store answered to it.

use std::time::Duration;

use idempotask::store::{Begin, Fencing, Finish, Inspection, SharedStore, Store};
use idempotask::store::{LockToken, StoreError, UnitOfWork};

/// One store operation, owned, so that a late one can be applied after its caller moved on.
#[derive(Debug, Clone)]
pub(super) enum Op {
    Begin {
        token: LockToken,
        lock_ttl: Duration,
        fencing: Fencing,
    },
    Finish {
        token: LockToken,
        marker: Vec<u8>,
        result_ttl: Duration,
    },
    Release {
        token: LockToken,
    },
    Renew {
        token: LockToken,
        lock_ttl: Duration,
    },
    Inspect,
    Forget,
}

impl Op {
    pub(super) fn name(&self) -> &'static str {
        match self {
            Self::Begin { .. } => "begin",
            Self::Finish { .. } => "finish",
            Self::Release { .. } => "release",
            Self::Renew { .. } => "renew",
            Self::Inspect => "inspect",
            Self::Forget => "forget",
        }
    }

    pub(super) fn token(&self) -> Option<&LockToken> {
        match self {
            Self::Begin { token, .. }
            | Self::Finish { token, .. }
            | Self::Release { token }
            | Self::Renew { token, .. } => Some(token),
            Self::Inspect | Self::Forget => None,
        }
    }

    pub(super) async fn apply(&self, store: &SharedStore, unit: &UnitOfWork) -> Answer {
        match self {
            Self::Begin {
                token,
                lock_ttl,
                fencing,
            } => Answer::Begin(store.begin(unit, token, *lock_ttl, *fencing).await),
            Self::Finish {
                token,
                marker,
                result_ttl,
            } => Answer::Finish(store.finish(unit, token, marker, *result_ttl).await),
            Self::Release { token } => Answer::Flag(store.release(unit, token).await),
            Self::Renew { token, lock_ttl } => {
                Answer::Flag(store.renew(unit, token, *lock_ttl).await)
            }
            Self::Inspect => Answer::Inspect(store.inspect(unit).await),
            Self::Forget => Answer::Flag(store.forget(unit).await),
        }
    }
}

/// What the wrapped store answered.
#[derive(Debug)]
pub(super) enum Answer {
    Begin(Result<Begin, StoreError>),
    Finish(Result<Finish, StoreError>),
    Flag(Result<bool, StoreError>),
    Inspect(Result<Inspection, StoreError>),
}
