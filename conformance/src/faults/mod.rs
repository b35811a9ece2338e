//! Every fault point of a call: see [`every_fault_point`].

mod cases;
mod faulty;
mod op;
mod oracle;
mod plan;
mod probe;
mod shapes;
mod verdict;

use std::collections::BTreeMap;
use std::fmt;

use idempotask::store::SharedStore;

use plan::{Fault, Plan, Point};
use shapes::SHAPES;

/// How many cases [`every_fault_point`] ran, by where their fault or drop was.
///
/// ```no_run
/// # #[tokio::main(flavor = "multi_thread", worker_threads = 2)] async fn main() {
/// use idempotask::store::SharedStore;
///
/// let store = SharedStore::new(idempotask::MemoryStore::new());
/// let census = idempotask_conformance::every_fault_point(store).await;
/// println!("{census}"); // the cases, by operation and fault, and by drop point
/// # }
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct FaultCensus {
    /// Cases per operation (`begin`, `finish`, `release`, `renew`, `inspect`) and fault.
    pub injected: BTreeMap<(&'static str, &'static str), usize>,
    /// Cases where the call was dropped, per place (`before begin`, `in the body`, …).
    pub dropped: BTreeMap<String, usize>,
    /// Every case, the fault-free runs of each shape included.
    pub cases: usize,
}

impl fmt::Display for FaultCensus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{} cases", self.cases)?;
        for ((operation, fault), count) in &self.injected {
            writeln!(f, "  {operation:8} {fault:24} {count}")?;
        }
        for (point, count) in &self.dropped {
            writeln!(f, "  dropped {point:26} {count}")?;
        }
        Ok(())
    }
}

/// Checks that every fault at every point of a call leaves the guarantees standing; answers how
/// many cases it ran.
///
/// Every fault point of a call: for one call at a time, each fault at each store operation the
/// call makes, and a drop of the call at each point where it waits.
///
/// [`every_fault_point`] wraps a store and runs eleven shapes of call (fresh, fenced, a failing
/// body, a renewed body, a duplicate, a duplicate with other arguments, a held unit, a unit in
/// doubt taken over (plain and fenced) and held (`InDoubt::Hold`), an operator's status read);
/// the three shapes in doubt only on a store that remembers a lock that ran out, as
/// [`doubt_conformance_tests!`](crate::doubt_conformance_tests!) checks. It first runs each
/// shape without faults to learn its operations,
/// then once per (operation, fault) and once per drop point, every one, not a sample:
///
/// | fault | what the call sees | what the store did |
/// | --- | --- | --- |
/// | refused | an error | nothing |
/// | timed out, not applied | an ambiguous timeout | nothing |
/// | reply lost | an ambiguous timeout | the operation |
/// | applied late | an ambiguous timeout | the operation, after the next one |
/// | store down | errors from here on | nothing more, until the call is over |
/// | reply lost, re-sent | the second answer | the operation, twice |
/// | past the lock TTL | the answer | the operation, once the call's lock TTL has passed |
/// | past the TTL, reply lost | an ambiguous timeout | the same |
/// | past the TTL, re-sent | the second answer | the same, twice |
/// | taken over first (, reply lost) | the answer (an ambiguous timeout) | past the TTL, a second delivery takes the unit and dies; then the operation |
/// | answered past the TTL (, taken over) | the answer, once the lock TTL has passed | the operation at once (then a second delivery takes the unit) |
///
/// The faults that reach the store past the lock TTL are injected at the operations made
/// under a lock (`finish`, `renew`, `release`); those answered past it at `begin` too.
///
/// The call is dropped before each of its operations is sent, after each one applied (its
/// reply not yet read), and in its body before and after the side effect.
///
/// After each case, and through every operation of it, the harness checks:
/// - a body never starts while a result is stored, nor while another body runs;
/// - no operation deletes or overwrites a lock its delivery did not hold, or a stored result;
/// - what the call answered matches what the store holds (an `Executed` value is the stored
///   one; a store error or a busy unit means the body did not run; and so on);
/// - the outcome oracle: `Executed` only when the call's marker was written while its lock was
///   held, `LockLost { marker_written: true }` only when it is stored, `LockLost` with nothing
///   written and `MarkerNotWritten` only when none was written before the call answered; and
///   every `finish` answer of the store fits what the unit held before and after it (a finish
///   that finds its own marker written after the lock was lost answers `LockLost` again, not
///   `Completed`);
/// - the next delivery, with the store healthy, finds the unit runnable or done within its lock
///   TTL and replays exactly what is stored;
/// - a body that runs on a unit taken over in doubt is told so, a unit in doubt stays in doubt
///   until a result is recorded, and a held one never runs.
///
///
/// Runs on a multi-threaded tokio runtime of the test's own (it counts the runtime's tasks to
/// know when a call's background work is over). Takes a minute or two: the cases that leave a
/// lock behind, or delay an operation past it, wait out its 450 ms TTL.
///
/// ```no_run
/// # #[tokio::main(flavor = "multi_thread", worker_threads = 2)] async fn main() {
/// use idempotask::store::SharedStore;
/// let census = idempotask_conformance::every_fault_point(
///     SharedStore::new(idempotask::MemoryStore::new()),
/// ).await;
/// assert!(census.cases > 100);
/// # }
/// ```
///
/// # Panics
/// With every broken invariant, case by case, when any case breaks one.
pub async fn every_fault_point(store: SharedStore) -> FaultCensus {
    let mut census = FaultCensus::default();
    let mut broken = Vec::new();
    // A store of one's own need not remember locks that ran out (see
    // `doubt_conformance_tests!`): its tasks never learn of a doubt, and there is no takeover
    // in doubt to fault.
    let remembers = cases::remembers_doubt(&store).await;
    for shape in SHAPES
        .iter()
        .filter(|shape| remembers || !shape.takes_over_doubt())
    {
        let clean = cases::run(&store, shape, Plan::Nothing).await;
        census.cases += 1;
        broken.extend(clean.violations);
        for (at, operation) in clean.trace.iter().enumerate() {
            for fault in Fault::ALL.into_iter().filter(|fault| fault.fits(operation)) {
                let case = cases::run(&store, shape, Plan::Inject { at, fault }).await;
                census.cases += 1;
                *census
                    .injected
                    .entry((operation, fault.name()))
                    .or_default() += 1;
                broken.extend(case.violations);
            }
        }
        let mut points = Vec::new();
        for &at in &clean.foreground {
            points.push((Point::Before(at), format!("before {}", clean.trace[at])));
            points.push((Point::After(at), format!("after {}", clean.trace[at])));
        }
        if shape.runs_a_body() {
            points.push((Point::BodyStarted, "in the body".to_owned()));
            points.push((Point::BodyDone, "after the side effect".to_owned()));
        }
        for (point, place) in points {
            let case = cases::run(&store, shape, Plan::DropAt(point)).await;
            census.cases += 1;
            if !case.fired {
                broken.push(format!(
                    "case `{}`: the call never reached the drop point {place}",
                    shape.name
                ));
            }
            *census.dropped.entry(place).or_default() += 1;
            broken.extend(case.violations);
        }
    }
    assert!(
        broken.is_empty(),
        "broken invariants ({census}):\n{}",
        broken.join("\n")
    );
    census
}
