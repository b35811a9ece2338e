//! `in_doubt` and `doubt_memory` reach the task: a store that records what each delivery's
//! lock token asks of it (the task's `static` is out of reach, and this is where its settings
//! act) sees `leaving_doubt` from `in_doubt = "hold"` and the memory given, in seconds or as a
//! string, `0` included; a task without them asks for the defaults.
#![deny(warnings, clippy::pedantic)]

use std::sync::Mutex;
use std::time::Duration;

use idempotask::store::{
    Begin, Fencing, Finish, Inspection, LockToken, Store, StoreError, UnitOfWork,
};
use idempotask::{DEFAULT_DOUBT_MEMORY, Error, MemoryStore, idempotent_task};

/// For each `begin`: the task, whether its token takes over a unit in doubt, and for how long
/// it asks the store to remember its lock.
static ASKED: Mutex<Vec<(String, bool, Duration)>> = Mutex::new(Vec::new());

#[derive(Debug, Default)]
struct Recording(MemoryStore);

impl Store for Recording {
    async fn begin(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        lock_ttl: Duration,
        fencing: Fencing,
    ) -> Result<Begin, StoreError> {
        let asked = (
            unit.task().to_owned(),
            token.takes_over_doubt(),
            token.doubt_memory(),
        );
        ASKED.lock().unwrap().push(asked);
        self.0.begin(unit, token, lock_ttl, fencing).await
    }
    async fn finish(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        marker: &[u8],
        result_ttl: Duration,
    ) -> Result<Finish, StoreError> {
        self.0.finish(unit, token, marker, result_ttl).await
    }
    async fn release(&self, unit: &UnitOfWork, token: &LockToken) -> Result<bool, StoreError> {
        self.0.release(unit, token).await
    }
    async fn renew(
        &self,
        unit: &UnitOfWork,
        token: &LockToken,
        lock_ttl: Duration,
    ) -> Result<bool, StoreError> {
        self.0.renew(unit, token, lock_ttl).await
    }
    async fn inspect(&self, unit: &UnitOfWork) -> Result<Inspection, StoreError> {
        self.0.inspect(unit).await
    }
    async fn forget(&self, unit: &UnitOfWork) -> Result<bool, StoreError> {
        self.0.forget(unit).await
    }
}

/// At most once: a unit left in doubt is held for an operator, remembered for a week.
#[idempotent_task(
    key = "transfer-{id}",
    in_doubt = "hold",
    doubt_memory = "7d",
    hold_alert_after = "4h"
)]
async fn transfer(id: u64) -> Result<u64, Error> {
    Ok(id)
}

#[idempotent_task(key = "report-{id}", in_doubt = "rerun", doubt_memory = 3600)]
async fn report(id: u64) -> Result<u64, Error> {
    Ok(id)
}

/// Zero turns detection off.
#[idempotent_task(key = "ping-{id}", doubt_memory = 0)]
async fn ping(id: u64) -> Result<u64, Error> {
    Ok(id)
}

#[idempotent_task(key = "plain-{id}")]
async fn plain(id: u64) -> Result<u64, Error> {
    Ok(id)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    idempotask::install(Recording::default());
    assert_eq!(transfer(1).await.unwrap(), 1);
    assert_eq!(report(2).await.unwrap(), 2);
    assert_eq!(ping(3).await.unwrap(), 3);
    assert_eq!(plain(4).await.unwrap(), 4);
    let day = 24 * 60 * 60;
    assert_eq!(
        *ASKED.lock().unwrap(),
        [
            ("transfer".to_owned(), false, Duration::from_secs(7 * day)),
            ("report".to_owned(), true, Duration::from_secs(3600)),
            ("ping".to_owned(), true, Duration::ZERO),
            ("plain".to_owned(), true, DEFAULT_DOUBT_MEMORY),
        ]
    );
}
