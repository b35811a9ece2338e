//! Asking the store for the lock or the stored result: waiting while another delivery holds
//! the unit, and trying again when the store fails.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::{Instant, sleep};

use crate::backoff::STORE_RETRY_BACKOFF;
use crate::context::{Lease, expiry};
use crate::error::{
    CodecErrorKind, Error, StoreError, StoreErrorKind, check_marker_key, codec, contended,
    held_in_doubt,
};
use crate::held_lock::{release, release_in_background};
use crate::marker::MarkerView;
use crate::observe;
use crate::store::{Begin, Doubt, SharedStore, Store};
use crate::task::Task;
use crate::unit::{LockToken, UnitOfWork};

/// How many times a failing store call is tried before the task call gives up.
const STORE_ATTEMPTS: u32 = 3;

/// The least time a granted lock must have left for the body to start, a tenth of
/// [`MIN_TTL`](crate::MIN_TTL); `RedlockStore` uses the same floor for its own rounds.
const MIN_LEASE: Duration = Duration::from_millis(10);

/// What asking for the lock came to.
pub(super) enum Start {
    /// The unit is done: its stored marker, for a replay. Read only where it is replayed, so
    /// that a duplicate reads it once, in place.
    Replay { marker: Vec<u8>, attempts: u32 },
    /// The lock is ours: run the body.
    Run {
        fencing_token: Option<u64>,
        attempts: u32,
        lease: Arc<Lease>,
        /// The unit was taken over in doubt (the task reruns such units). Boxed: rare, and
        /// carried through the whole call's future.
        in_doubt: Option<Box<Doubt>>,
    },
}

/// Asks for the lock until it is granted, the unit turns out done, or waiting is over.
pub(super) async fn begin(
    task: &Task,
    store: &SharedStore,
    unit: &UnitOfWork,
    token: &LockToken,
) -> Result<Start, Error> {
    let policy = &task.retry;
    let started = Instant::now();
    let mut attempts = 0;
    let mut failures = 0;
    // A begin whose reply was lost may have taken the lock already: the lease then started
    // when that request was sent, not when a later one was.
    let mut first_unconfirmed: Option<Instant> = None;
    loop {
        let sent = Instant::now();
        // The answer is matched into a pause, and the pause slept after the `match`: a value
        // matched on would stay in the call's future for as long as its arms await.
        let pause = match store.begin(unit, token, task.lock_ttl, task.fencing).await {
            Ok(Begin::Done(marker)) => {
                attempts += 1;
                return Ok(Start::Replay { marker, attempts });
            }
            Ok(Begin::InDoubt(doubt)) => {
                // Asked with a token that leaves doubt alone: nothing was written.
                observe::in_doubt(
                    unit,
                    task.log_key,
                    task.in_doubt,
                    task.hold_alert_after,
                    &doubt,
                );
                return Err(held_in_doubt(unit, doubt));
            }
            Ok(Begin::Acquired {
                fencing_token,
                in_doubt,
            }) => {
                attempts += 1;
                let lease_start = first_unconfirmed.unwrap_or(sent).min(sent);
                // A grant whose reply came late (a stalled network, a statement that waited on
                // a row lock) may have expired on the server already, and another delivery may
                // hold the unit now: running the body would run it twice. The lease is made
                // after this check, so that it is not part of this future while a release waits.
                let left =
                    expiry(lease_start, task.lock_ttl).saturating_duration_since(Instant::now());
                if left < MIN_LEASE {
                    let granted = token.clone().granted(fencing_token);
                    // Boxed: a rare path, which would otherwise enlarge every call's future.
                    Box::pin(release(store, unit, &granted, task.log_key)).await;
                    return Err(Error::Store(StoreError::ambiguous(
                        "begin",
                        StoreErrorKind::Timeout,
                        format!(
                            "the lock was granted {} ms after it was asked for, with {} ms of its {} ms TTL left (less than {} ms); it was released and the body did not run",
                            sent.elapsed().as_millis(),
                            left.as_millis(),
                            task.lock_ttl.as_millis(),
                            MIN_LEASE.as_millis()
                        ),
                    )));
                }
                if let Some(doubt) = &in_doubt {
                    observe::in_doubt(
                        unit,
                        task.log_key,
                        task.in_doubt,
                        task.hold_alert_after,
                        doubt,
                    );
                }
                return Ok(Start::Run {
                    fencing_token,
                    attempts,
                    lease: Arc::new(Lease::new(lease_start, task.lock_ttl, task.log_key)),
                    in_doubt,
                });
            }
            Ok(Begin::Busy { lock_ttl_remaining }) => {
                attempts += 1;
                let Some(pause) = policy.pause_after_busy(
                    task.lock_ttl,
                    attempts,
                    started.elapsed(),
                    lock_ttl_remaining,
                ) else {
                    return Err(contended(unit, lock_ttl_remaining, attempts));
                };
                pause
            }
            Err(err) => {
                failures += 1;
                if err.is_ambiguous() {
                    first_unconfirmed.get_or_insert(sent);
                }
                if !err.is_retryable() || failures >= STORE_ATTEMPTS {
                    if first_unconfirmed.is_some() {
                        // The lock may be ours with nobody running the body: free it.
                        release_in_background(Some(store.clone()), unit, token, task.log_key);
                    }
                    return Err(err.into());
                }
                STORE_RETRY_BACKOFF.delay(failures)
            }
        };
        // Boxed: a timer is large, and most calls never wait.
        Box::pin(sleep(pause)).await;
    }
}

/// The marker a store answered for `unit`, once it is known to be readable and this key's own
/// (stores find a unit by a digest of its key, and a marker holds the key it was written for).
pub(super) fn stored_marker<'a>(
    unit: &UnitOfWork,
    bytes: &'a [u8],
) -> Result<MarkerView<'a>, Error> {
    let marker = MarkerView::parse(bytes).map_err(|err| unreadable(unit, &err))?;
    check_marker_key(unit, marker.key)?;
    Ok(marker)
}

/// The [`CodecErrorKind::Unreadable`] error of a stored marker that is not one.
pub(super) fn unreadable(unit: &UnitOfWork, err: &dyn std::fmt::Display) -> Error {
    codec(
        unit,
        CodecErrorKind::Unreadable,
        format!("the stored marker cannot be read: {err}"),
    )
}
