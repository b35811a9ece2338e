//! The runner's half of the outcome oracle: what the call under test answered, held against
//! what the store holds once it is over. The store's half is in `oracle`.

use idempotask::operator::Status;
use idempotask::{Error, InDoubt, Outcome, Report};

use super::oracle::Lock;
use super::probe::Probe;
use super::shapes::{Body, Caller, Prior, Shape};

/// The body's error, next to the runner's.
#[derive(Debug)]
pub(super) enum CaseError {
    Body,
    Call(Error),
}

impl From<Error> for CaseError {
    fn from(err: Error) -> Self {
        Self::Call(err)
    }
}

/// What the call under test came to.
pub(super) enum Ended {
    Delivered(Result<Report<u32>, CaseError>),
    Status(Result<Status, Error>),
    Dropped,
}

/// Holds what the caller saw against what the store holds now.
pub(super) fn check_ending(
    probe: &Probe,
    shape: &Shape,
    ended: &Ended,
    stored: Option<u32>,
    prior: Option<u32>,
) {
    let call = 1;
    let ran = probe.started(call);
    let wrong = |what: String| probe.violation(what);
    match ended {
        Ended::Dropped | Ended::Status(Err(Error::Store(_))) => {}
        Ended::Status(Ok(Status::Done(_))) if stored.is_some() => {}
        Ended::Status(Ok(status)) => wrong(format!(
            "the status says {status:?} while the store holds {stored:?}"
        )),
        Ended::Status(Err(err)) => wrong(format!("the status failed with {err}")),
        Ended::Delivered(Ok(report)) => {
            let value = Some(report.value);
            // The outcome oracle: what the call reported against how its marker reached the
            // store, as the wrapper saw every operation apply.
            let written = probe.written().filter(|written| written.before_the_answer);
            let fits = match report.outcome {
                // Only when the lock was held through the finish.
                Outcome::Executed => {
                    ran && report.value == call
                        && stored == value
                        && written.is_some_and(|written| written.lock != Lock::Lapsed)
                }
                Outcome::Replayed => !ran && stored == value && value == prior,
                Outcome::LockLost {
                    marker_written: true,
                    ..
                } => ran && stored == value && written.is_some(),
                Outcome::LockLost {
                    marker_written: false,
                    ..
                }
                | Outcome::MarkerNotWritten => ran && written.is_none(),
                // An outcome newer than this harness: it cannot say what should hold, so it
                // reports the case rather than pass it.
                _ => false,
            };
            if ran && shape.prior == Prior::Lapsed && report.in_doubt.is_none() {
                wrong(format!(
                    "the body of a unit taken over in doubt ran without being told ({:?})",
                    report.outcome
                ));
            }
            if !fits {
                wrong(format!(
                    "the call answered {:?} {:?} (its body {}) while the store holds {stored:?}; its own marker: {}",
                    report.outcome,
                    report.value,
                    if ran { "ran" } else { "did not run" },
                    match written {
                        Some(written) if written.lock == Lock::Lapsed =>
                            "written after its lock lapsed",
                        Some(written) if written.lock == Lock::Expiring =>
                            "written as its lock expired",
                        Some(_) => "written while its lock was held",
                        None => "not written before the call answered",
                    }
                ));
            }
        }
        Ended::Delivered(Err(err)) => {
            let fits = match err {
                CaseError::Body => shape.body == Body::Fails && ran && stored.is_none(),
                CaseError::Call(Error::Store(_)) => !ran && stored == prior,
                CaseError::Call(Error::Contended { .. }) => {
                    (shape.prior == Prior::Held || probe.taken_over()) && !ran && stored == prior
                }
                CaseError::Call(Error::InDoubt { .. }) => {
                    shape.in_doubt == InDoubt::Hold && shape.prior == Prior::Lapsed && !ran
                }
                CaseError::Call(Error::KeyReuse { .. }) => {
                    shape.caller
                        == Caller::Delivery {
                            other_arguments: true,
                        }
                        && !ran
                        && stored == prior
                }
                CaseError::Call(_) => false,
            };
            if !fits {
                wrong(format!(
                    "the call failed with {err:?} (its body {}) while the store holds {stored:?}",
                    if ran { "ran" } else { "did not run" },
                ));
            }
        }
    }
}
