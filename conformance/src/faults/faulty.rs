//! The store the call under test is given: each operation goes through [`Probe`] on its way
//! to the store under test.

use std::sync::Arc;
use std::time::Duration;

use idempotask::store::{Begin, Fencing, Finish, Inspection, SharedStore, Store, StoreErrorKind};
use idempotask::store::{LockToken, StoreError, UnitOfWork};

use super::op::{Answer, Op};
use super::probe::Probe;

/// A store that hands each operation to [`Probe`] on its way to the store under test.
#[derive(Debug, Clone)]
pub(super) struct Faulty {
    pub(super) inner: SharedStore,
    pub(super) probe: Arc<Probe>,
}

fn mismatched(op: &'static str) -> StoreError {
    StoreError::new(
        op,
        StoreErrorKind::Protocol,
        "the harness answered another operation",
    )
}

impl Store for Faulty {
    fn max_key_len(&self) -> usize {
        self.inner.max_key_len()
    }

    async fn begin(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        lock_ttl: Duration,
        fencing: Fencing,
    ) -> Result<Begin, StoreError> {
        let op = Op::Begin {
            token: token.clone(),
            lock_ttl,
            fencing,
        };
        match self.probe.perform(&self.inner, unit, op).await? {
            Answer::Begin(answer) => answer,
            _ => Err(mismatched("begin")),
        }
    }

    async fn finish(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        marker: &[u8],
        result_ttl: Duration,
    ) -> Result<Finish, StoreError> {
        let op = Op::Finish {
            token: token.clone(),
            marker: marker.to_vec(),
            result_ttl,
        };
        match self.probe.perform(&self.inner, unit, op).await? {
            Answer::Finish(answer) => answer,
            _ => Err(mismatched("finish")),
        }
    }

    async fn release(&self, unit: &UnitOfWork, token: &LockToken) -> Result<bool, StoreError> {
        let op = Op::Release {
            token: token.clone(),
        };
        match self.probe.perform(&self.inner, unit, op).await? {
            Answer::Flag(answer) => answer,
            _ => Err(mismatched("release")),
        }
    }

    async fn renew(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        lock_ttl: Duration,
    ) -> Result<bool, StoreError> {
        let op = Op::Renew {
            token: token.clone(),
            lock_ttl,
        };
        match self.probe.perform(&self.inner, unit, op).await? {
            Answer::Flag(answer) => answer,
            _ => Err(mismatched("renew")),
        }
    }

    async fn inspect(&self, unit: &UnitOfWork) -> Result<Inspection, StoreError> {
        match self.probe.perform(&self.inner, unit, Op::Inspect).await? {
            Answer::Inspect(answer) => answer,
            _ => Err(mismatched("inspect")),
        }
    }

    async fn forget(&self, unit: &UnitOfWork) -> Result<bool, StoreError> {
        match self.probe.perform(&self.inner, unit, Op::Forget).await? {
            Answer::Flag(answer) => answer,
            _ => Err(mismatched("forget")),
        }
    }
}
