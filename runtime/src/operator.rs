//! For operators: what a store holds for a unit, and the calls that act on it, the same on
//! every store.
//!
//! - [`Operator`]: the calls an operator's tool makes (read one unit raw, list a task's units
//!   page by page, count them, forget exactly the marker shown, resolve a unit in doubt against
//!   exactly the lock shown), implemented by every store crate's stores and by
//!   [`MemoryStore`](crate::MemoryStore); [`SharedOperator`] is any of them behind one
//!   pointer, for a tool that picks its store at run time (the `idempotask` command does).
//! - What they answer: [`Held`] (what one unit holds), [`Page`] of [`Listed`] units with a
//!   [`Cursor`], [`Stats`], [`Scope`], and [`Forgot`] and [`Resolved`] for what an action did.
//! - [`Resolution`]: how a unit in doubt is settled; [`Marker`] and [`Status`] read what a
//!   unit holds ([`Task::status`](crate::Task::status) answers it for one unit), and
//!   [`StepRecord`] each step a unit that has not finished recorded
//!   ([`Operator::journal`]).
//!
//! ```
//! use idempotask::operator::{Forgot, Held, Operator};
//! use idempotask::{MemoryStore, Task};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = MemoryStore::new();
//! let refund = Task::new("refund");
//! refund.call("order-7").store(store.clone()).run(async { Ok::<_, idempotask::Error>(5) }).await?;
//!
//! // What an operator is shown, and the exact bytes behind it.
//! let unit = store.scope().unit("refund", "order-7")?;
//! let Held::Marker { bytes, marker: Ok(marker), .. } = store.read(&unit).await? else {
//!     panic!("not done");
//! };
//! assert_eq!(marker.key(), "order-7");
//! // Forgotten only while it still holds what was shown: the next delivery runs it again.
//! assert_eq!(store.forget_exact(&unit, &bytes).await?, Forgot::Deleted);
//! assert!(matches!(store.read(&unit).await?, Held::Nothing));
//! assert_eq!(store.stats("refund").await?.keys_seen, 0);
//! # Ok(()) }
//! ```

pub use crate::marker::{Marker, MarkerError, StoredResult};
pub use crate::status::{Done, Status};
pub use held::{Held, Listed};
pub use page::{Cursor, Page, Scope, Stats};
pub use shared::SharedOperator;
pub use step_record::{StepRecord, StepRecordError};

use std::collections::HashSet;
use std::fmt;
use std::future::Future;
use std::time::Duration;

use serde_json::value::RawValue;

use crate::store::{Journal, StoreError, StoreErrorKind, UnitOfWork};

mod held;
mod page;
mod shared;
mod step_record;

/// How many keys or rows a page of the provided [`Operator::stats`] looks at.
const STATS_PAGE: usize = 1000;

/// How many keys or rows a page of the provided [`Operator::task_exists`] looks at.
const EXISTS_PAGE: usize = 100;

/// What an operator's tool does with a store, the same on every store: read one unit raw,
/// list a task's units page by page, count them, forget exactly the marker it was shown,
/// resolve a unit in doubt against exactly the lock it was shown.
///
/// `RedisStore` and `RedisClusterStore` in `idempotask_redis`, `PostgresStore` in
/// `idempotask_postgres` and this crate's [`MemoryStore`](crate::MemoryStore) implement it
/// (`RedlockStore` does not yet); a tool written against it (the `idempotask` command, a web
/// page) needs no arm per store. [`SharedOperator`] holds any of them.
/// `idempotask_conformance::check_operator` checks an implementation against the contract
/// below.
///
/// Implement it with `async fn`s, as [`Store`](crate::store::Store); their futures must be
/// `Send`. [`task_exists`](Self::task_exists) and [`stats`](Self::stats) are provided on top
/// of [`list`](Self::list); a store with a cheaper way overrides them. A store that records
/// steps overrides [`journal`](Self::journal).
///
/// # Contract
/// - Reads change nothing and never panic, whatever the store holds: a value no delivery wrote
///   is [`Held::Foreign`] or [`Held::OtherType`], a marker that does not decode is
///   [`Held::Marker`] with its error, and what cannot be a unit at all (a PostgreSQL row in a
///   state the table does not have) is a [`StoreError`] of kind `Protocol`, as an unreachable
///   store is one of its own kind.
/// - [`forget_exact`](Self::forget_exact) and [`resolve_exact`](Self::resolve_exact) act only
///   while the unit still holds exactly the bytes shown, in one atomic step; a unit that
///   changed meanwhile is left alone and the answer says so. Neither ever deletes a lock that
///   is held.
///
/// ```
/// use std::time::Duration;
/// use idempotask::operator::{Held, Operator};
/// use idempotask::store::{Fencing, LockToken, Store};
/// use idempotask::MemoryStore;
///
/// /// The units of `task` a delivery is running, with how long their locks have left.
/// async fn running(operator: &impl Operator, task: &str) -> Result<Vec<(String, Duration)>, Box<dyn std::error::Error>> {
///     let mut running = Vec::new();
///     let mut from = None;
///     loop {
///         let page = operator.list(task, from.as_ref(), 100).await?;
///         for listed in page.units {
///             if let Held::Lock { lock_ttl_remaining: Some(left), .. } = listed.held {
///                 running.push((listed.digest, left));
///             }
///         }
///         match page.next {
///             Some(next) => from = Some(next),
///             None => return Ok(running),
///         }
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = MemoryStore::new();
/// let unit = store.scope().unit("charge", "order-42")?;
/// store.begin(&unit, &LockToken::generate(), Duration::from_secs(30), Fencing::Off).await?;
/// let running = running(&store, "charge").await?;
/// assert_eq!(running.len(), 1);
/// assert_eq!(running[0].0, unit.digest());
/// # Ok(()) }
/// ```
pub trait Operator: Send + Sync + fmt::Debug + 'static {
    /// Where this store keeps its units (the namespace `default`, the table
    /// `idempotask_units`), and the longest caller key it takes.
    fn scope(&self) -> Scope;

    /// Where `unit` is kept, for messages: its Redis key, or which table's row.
    fn location(&self, unit: &UnitOfWork) -> String;

    /// What `unit` holds now, raw. Changes nothing.
    fn read(&self, unit: &UnitOfWork) -> impl Future<Output = Result<Held, StoreError>> + Send;

    /// The steps recorded for `unit` since it last had a result, first step first: what the
    /// next delivery replays before it runs the first step the journal lacks (decode each
    /// entry with [`StepRecord::decode`]). Changes nothing. It tells about a unit that has not
    /// finished, whatever [`read`](Self::read) shows of it (locked, in doubt, or nothing: a
    /// delivery that failed after some steps released it and left its journal); a store may
    /// keep a finished unit's journal until it expires, unread.
    ///
    /// Provided: an error of kind `Configuration`, for a store that keeps no journal of
    /// steps, so that a tool never shows "no steps" for a journal it cannot read; a store
    /// that records steps ([`Store::records_steps`](crate::store::Store::records_steps))
    /// answers its journal, as [`Store::read_journal`](crate::store::Store::read_journal)
    /// does.
    ///
    /// ```
    /// use std::time::Duration;
    /// use idempotask::operator::{Held, Operator, StepRecord};
    /// use idempotask::{MemoryStore, Task};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = MemoryStore::new();
    /// let failed = Task::new("checkout").call("order-7").store(store.clone()).run(async {
    ///     let ctx = idempotask::context().expect("inside a task");
    ///     ctx.step("charge", async { Ok::<_, idempotask::Error>(1200) }).await?;
    ///     Err::<(), _>(idempotask::Error::NotConfigured)
    /// }).await;
    /// assert!(failed.is_err());
    ///
    /// // Released, the unit holds nothing; its journal says the next delivery replays the charge.
    /// let unit = store.scope().unit("checkout", "order-7")?;
    /// assert!(matches!(store.read(&unit).await?, Held::Nothing));
    /// let journal = store.journal(&unit).await?;
    /// let charge = StepRecord::decode(&journal.entries()[0])?;
    /// assert_eq!((journal.len(), charge.label()), (1, "charge".to_owned()));
    /// # Ok(()) }
    /// ```
    fn journal(
        &self,
        unit: &UnitOfWork,
    ) -> impl Future<Output = Result<Journal, StoreError>> + Send {
        let _ = unit;
        std::future::ready(Err(StoreError::new(
            "journal",
            StoreErrorKind::Configuration,
            "this store keeps no journal of steps",
        )))
    }

    /// The journal of a unit a listing found ([`Listed`]), as [`journal`](Self::journal)
    /// answers it, for a tool that shows each unit of a page with its steps. Provided: the
    /// journal of [`Listed::unit`], and an error of kind `Configuration` for a unit known by
    /// its digest alone; a store that finds the journal from the digest (a Redis lock keeps
    /// only that) overrides it.
    ///
    /// ```
    /// use idempotask::operator::{Listed, Held, Operator};
    /// use idempotask::MemoryStore;
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = MemoryStore::new();
    /// let unit = store.scope().unit("checkout", "order-7")?;
    /// let listed = Listed::new("checkout", unit.digest(), Held::Nothing).with_key("order-7");
    /// assert!(store.listed_journal(&listed).await?.is_empty());
    /// # Ok(()) }
    /// ```
    fn listed_journal(
        &self,
        listed: &Listed,
    ) -> impl Future<Output = Result<Journal, StoreError>> + Send {
        let unit = listed.unit();
        async move {
            match unit {
                Some(unit) => self.journal(&unit).await,
                None => Err(StoreError::new(
                    "journal",
                    StoreErrorKind::Configuration,
                    "this store cannot find the journal of a unit known by its digest alone",
                )),
            }
        }
    }

    /// One page of `task`'s units that hold something: the first with `from` `None`, then each
    /// from the [`next`](Page::next) cursor of the one before, until a page has none. `limit`
    /// bounds the work of one page: about how many keys or rows it looks at (the rows of one
    /// PostgreSQL statement, the `COUNT` of one Redis `SCAN`; never `KEYS`), so that no page
    /// holds the store for long. A page may hold no unit and still have a next one.
    ///
    /// # Errors
    /// A [`StoreError`] when the store cannot be reached, and of kind `Configuration` for a
    /// task name no task can have or a cursor this store did not make.
    fn list(
        &self,
        task: &str,
        from: Option<&Cursor>,
        limit: usize,
    ) -> impl Future<Output = Result<Page, StoreError>> + Send;

    /// Forgets `unit`'s completion marker (or a value no delivery can use) only while it is
    /// still exactly `shown`: the bytes of a [`Held::Marker`] or [`Held::Foreign`] an operator
    /// confirmed. A marker a delivery wrote meanwhile stays; a lock is never deleted. A fenced
    /// unit keeps its fencing counter, as [`Store::forget`](crate::store::Store::forget)
    /// leaves it.
    fn forget_exact(
        &self,
        unit: &UnitOfWork,
        shown: &[u8],
    ) -> impl Future<Output = Result<Forgot, StoreError>> + Send;

    /// Settles `unit`, in doubt with the lock `shown` (the bytes of a [`Held::InDoubt`] an
    /// operator confirmed), only while it still holds exactly that lock and the lock is still
    /// run out: [`Resolution::Record`] stores the marker in its place, [`Resolution::Free`]
    /// frees the unit (its journal of steps stays), [`Resolution::FreeDiscardingSteps`] frees
    /// it and deletes its journal, [`Resolution::RecordStep`] appends a step's entry at the end
    /// of the unit's journal and frees the unit. A unit that changed meanwhile is left alone ([`Resolved::Changed`]),
    /// one that became free is [`Resolved::Gone`].
    ///
    /// # Errors
    /// A [`StoreError`] when the store cannot be reached, and of kind `Configuration` for a
    /// marker that is not one for `unit` ([`Resolution::marker_to_store`]), for an entry that
    /// is not a journal entry ([`Resolution::step_to_record`]), and for a
    /// [`Resolution::RecordStep`] on a store that records no steps
    /// ([`Store::records_steps`](crate::store::Store::records_steps)): nothing is written
    /// then.
    fn resolve_exact(
        &self,
        unit: &UnitOfWork,
        shown: &[u8],
        resolution: &Resolution,
    ) -> impl Future<Output = Result<Resolved, StoreError>> + Send;

    /// Whether the store holds anything of `task` at all: whether a listing would see any of
    /// its keys or rows ([`Page::keys_seen`]). Provided: pages through
    /// [`list`](Self::list) until one does.
    fn task_exists(&self, task: &str) -> impl Future<Output = Result<bool, StoreError>> + Send {
        async move {
            let mut from = None;
            loop {
                let page = self.list(task, from.as_ref(), EXISTS_PAGE).await?;
                if page.keys_seen > 0 {
                    return Ok(true);
                }
                match page.next {
                    Some(next) => from = Some(next),
                    None => return Ok(false),
                }
            }
        }
    }

    /// How `task`'s units stand: how many are done, locked, in doubt and unreadable, each unit
    /// counted once. Provided: pages through [`list`](Self::list) to the end, so it costs a
    /// whole listing.
    fn stats(&self, task: &str) -> impl Future<Output = Result<Stats, StoreError>> + Send {
        async move {
            let mut stats = Stats::default();
            let mut counted = HashSet::new();
            let mut from = None;
            loop {
                let page = self.list(task, from.as_ref(), STATS_PAGE).await?;
                stats.add_walked(&page);
                for listed in &page.units {
                    if counted.insert(listed.digest.clone()) {
                        stats.count(listed);
                    }
                }
                match page.next {
                    Some(next) => from = Some(next),
                    None => return Ok(stats),
                }
            }
        }
    }
}

/// What a store's compare-and-forget ([`Operator::forget_exact`]) did with the value an
/// operator was shown.
///
/// The operator reads a unit, shows it, and asks to forget it only if it still holds exactly
/// what was shown; this says which of the three things happened. Treat a variant this version
/// does not know as [`Changed`](Self::Changed): nothing is known to be deleted.
///
/// ```
/// use idempotask::operator::Forgot;
///
/// fn say(forgot: Forgot) -> &'static str {
///     match forgot {
///         Forgot::Deleted => "forgotten; the next delivery runs it again",
///         Forgot::Gone => "expired or forgotten meanwhile",
///         _ => "it changed since it was shown; nothing deleted",
///     }
/// }
///
/// assert_eq!(say(Forgot::Gone), "expired or forgotten meanwhile");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Forgot {
    /// The value was still the one shown; it is gone (a fenced unit keeps its fencing counter).
    Deleted,
    /// The unit held nothing any more (it expired, or someone else forgot it).
    Gone,
    /// The unit holds something else now (another marker, a lock); nothing was deleted.
    Changed,
}

/// How an operator settles a unit [in doubt](crate::store::Doubt), once the downstream system
/// has told whether the earlier delivery's side effect happened: given to a store's
/// compare-and-set for units in doubt ([`Operator::resolve_exact`]).
///
/// ```
/// use std::time::Duration;
/// use idempotask::operator::{Marker, Resolution};
/// use idempotask::store::UnitOfWork;
/// use serde_json::value::RawValue;
///
/// let unit = UnitOfWork::new("charge", "order-42")?;
/// // The charge went through: every later delivery gets its result back.
/// let result = RawValue::from_string(r#"{"charge":"ch_1"}"#.to_owned())?;
/// let marker = Marker::encode_resolution(&unit, None, &result);
/// let recorded = Resolution::record(marker, Duration::from_secs(24 * 60 * 60));
/// assert!(matches!(recorded, Resolution::Record { .. }));
/// // It did not: the next delivery runs the work as new.
/// let _freed = Resolution::Free;
/// // The body was held at its step "charge" (`step_or_hold`), and the charge went through:
/// // the next delivery replays the steps before it and this one, and goes on after it.
/// let value = RawValue::from_string(r#""ch_1""#.to_owned())?;
/// let entry = idempotask::operator::step_entry("charge", None, &value);
/// let _step = Resolution::record_step(entry, Duration::from_secs(24 * 60 * 60));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Resolution {
    /// The effect happened: store this completion marker (see [`Marker::encode_resolution`])
    /// in place of the lock, kept for `result_ttl`, as a finish would have.
    #[non_exhaustive]
    Record {
        /// The marker's bytes.
        marker: Vec<u8>,
        /// How long the marker is kept: the task's result TTL.
        result_ttl: Duration,
    },
    /// The effect did not happen: forget the lock that ran out, so that the next delivery runs
    /// the work as new, with no doubt (a fenced unit keeps its fencing counter). The unit's
    /// journal of steps stays: the next delivery replays the recorded steps and runs the one in
    /// doubt again.
    Free,
    /// [`Free`](Self::Free) the unit and delete its journal of steps in the same atomic step,
    /// so that the next delivery runs the whole body as new: the way out for a unit held
    /// because its body changed its step order (`StepErrorKind::OrderChanged`), whose journal
    /// no longer matches the body and which a plain `Free` leaves held at the next delivery.
    /// The recorded steps' effects run again; settle them downstream first, or record the
    /// unit's result instead ([`Record`](Self::Record)). On a store that keeps no journal it
    /// is `Free`.
    FreeDiscardingSteps,
    /// The step the unit is held at (its step in doubt, the first its journal lacks) had its
    /// effect: append this journal entry (see [`step_entry`]) at the journal's next position,
    /// the journal then kept for `kept_for`, and free the unit, so that the next delivery
    /// replays the recorded steps, this one included, and goes on with the next step. Only a
    /// store that records steps carries it out; others refuse it and write nothing.
    #[non_exhaustive]
    RecordStep {
        /// The journal entry's bytes.
        entry: Vec<u8>,
        /// How long the journal is kept when the unit never gets its result: the task's
        /// result TTL, as a step's own record keeps it.
        kept_for: Duration,
    },
}

/// The journal entry of the step `name` (with the key part `part`, for a step named with one)
/// whose value is `value`: the bytes a body's own step records, for
/// [`Resolution::RecordStep`]. A rerun replays it as the step's value, so `value` must be what
/// the step's type reads back from JSON.
///
/// ```
/// use idempotask::operator::{StepRecord, StoredResult, step_entry};
/// use serde_json::value::RawValue;
///
/// let value = RawValue::from_string(r#"{"id":"ch_1"}"#.to_owned())?;
/// let entry = step_entry("mail", Some("ada@example.com"), &value);
/// let record = StepRecord::decode(&entry)?;
/// assert_eq!(record.label(), "mail[ada@example.com]");
/// assert!(matches!(&record.result, StoredResult::Json(json) if json.get() == value.get()));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn step_entry(name: &str, part: Option<&str>, value: &RawValue) -> Vec<u8> {
    // No size limit: the operator chose the value, and a JSON value always reads back as one.
    crate::step::encode_named(name, part, &value.to_owned(), usize::MAX).0
}

impl Resolution {
    /// [`Record`](Self::Record) `marker`, kept for `result_ttl`.
    pub fn record(marker: Vec<u8>, result_ttl: Duration) -> Self {
        Self::Record { marker, result_ttl }
    }

    /// [`RecordStep`](Self::RecordStep) `entry` (see [`step_entry`]), the journal kept for
    /// `kept_for`.
    pub fn record_step(entry: Vec<u8>, kept_for: Duration) -> Self {
        Self::RecordStep { entry, kept_for }
    }

    /// For a store that records steps, carrying the resolution out: the journal entry to
    /// append and how long to keep the journal, or `None` for a resolution that records no
    /// step ([`marker_to_store`](Self::marker_to_store) tells what it does).
    ///
    /// ```
    /// use std::time::Duration;
    /// use idempotask::operator::{Resolution, step_entry};
    /// use serde_json::value::RawValue;
    ///
    /// let day = Duration::from_secs(24 * 60 * 60);
    /// let entry = step_entry("charge", None, &RawValue::from_string("7".to_owned())?);
    /// let step = Resolution::record_step(entry.clone(), day);
    /// assert_eq!(step.step_to_record()?, Some((&entry[..], day)));
    /// assert!(Resolution::Free.step_to_record()?.is_none());
    /// assert!(Resolution::record_step(b"not json".to_vec(), day).step_to_record().is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// A `Configuration` [`StoreError`] of the operation `resolve` when the entry is not a
    /// journal entry with a value ([`StepRecord::decode`]); every store refuses it before
    /// writing anything.
    pub fn step_to_record(&self) -> Result<Option<(&[u8], Duration)>, StoreError> {
        let Self::RecordStep { entry, kept_for } = self else {
            return Ok(None);
        };
        let refused = |why: String| {
            StoreError::new(
                "resolve",
                StoreErrorKind::Configuration,
                format!("refusing to record that step: {why}"),
            )
        };
        match StepRecord::decode(entry).map_err(|err| refused(err.to_string()))? {
            StepRecord {
                result: StoredResult::Json(_),
                ..
            } => Ok(Some((entry, *kept_for))),
            _ => Err(refused("it records no value".to_owned())),
        }
    }

    /// Whether the resolution deletes the unit's journal of steps as it frees the unit
    /// ([`FreeDiscardingSteps`](Self::FreeDiscardingSteps)).
    ///
    /// ```
    /// use idempotask::operator::Resolution;
    ///
    /// assert!(Resolution::FreeDiscardingSteps.discards_steps());
    /// assert!(!Resolution::Free.discards_steps());
    /// ```
    pub fn discards_steps(&self) -> bool {
        matches!(self, Self::FreeDiscardingSteps)
    }

    /// For a store carrying the resolution out on `unit`: the marker to store in place of the
    /// lock and how long to keep it, or `None` to free the unit.
    ///
    /// ```
    /// use std::time::Duration;
    /// use idempotask::operator::{Marker, Resolution};
    /// use idempotask::store::UnitOfWork;
    /// use serde_json::value::RawValue;
    ///
    /// let unit = UnitOfWork::new("charge", "order-42")?;
    /// let other = UnitOfWork::new("charge", "order-43")?;
    /// let result = RawValue::from_string("7".to_owned())?;
    /// let day = Duration::from_secs(24 * 60 * 60);
    /// let recorded = Resolution::record(Marker::encode_resolution(&unit, None, &result), day);
    /// assert_eq!(recorded.marker_to_store(&unit)?.map(|(_, ttl)| ttl), Some(day));
    /// assert!(recorded.marker_to_store(&other).is_err());
    /// assert!(Resolution::Free.marker_to_store(&unit)?.is_none());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// A `Configuration` [`StoreError`] of the operation `resolve` when the marker is not one
    /// that a delivery of `unit` reads: it does not decode, or it was written for another key;
    /// and for a [`RecordStep`](Self::RecordStep), which a store that records steps takes from
    /// [`step_to_record`](Self::step_to_record) before asking this. Every store refuses it
    /// before writing anything.
    pub fn marker_to_store(
        &self,
        unit: &UnitOfWork,
    ) -> Result<Option<(&[u8], Duration)>, StoreError> {
        let (marker, result_ttl) = match self {
            Self::Record { marker, result_ttl } => (marker, *result_ttl),
            Self::Free | Self::FreeDiscardingSteps => return Ok(None),
            // Reached only on a store that does not know steps: one that does asks
            // `step_to_record` first.
            Self::RecordStep { .. } => {
                return Err(StoreError::new(
                    "resolve",
                    StoreErrorKind::Configuration,
                    "this store records no steps, so it cannot record a step's result",
                ));
            }
        };
        let refused = |why: String| {
            StoreError::new(
                "resolve",
                StoreErrorKind::Configuration,
                format!("refusing to record that marker: {why}"),
            )
        };
        let decoded = Marker::decode(marker).map_err(|err| refused(err.to_string()))?;
        if decoded.key() != unit.key() {
            return Err(refused(format!(
                "it was written for key `{}`, not `{}`",
                decoded.key(),
                unit.key()
            )));
        }
        Ok(Some((marker, result_ttl)))
    }
}

/// What a store's compare-and-set for units in doubt did with the lock an operator was shown.
///
/// It acts only while the unit still holds exactly that lock and the lock is still run out;
/// a unit that changed meanwhile is left alone. Treat a variant this version does not know as
/// [`Changed`](Self::Changed): nothing is known to be written.
///
/// ```
/// use idempotask::operator::Resolved;
///
/// fn say(resolved: Resolved) -> &'static str {
///     match resolved {
///         Resolved::Recorded => "recorded; deliveries get the result back",
///         Resolved::Freed => "freed; the next delivery runs it as new",
///         Resolved::Gone => "the store forgot it meanwhile; nothing written",
///         _ => "it changed since it was shown; nothing written",
///     }
/// }
///
/// assert_eq!(say(Resolved::Freed), "freed; the next delivery runs it as new");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Resolved {
    /// The unit was still in doubt with the lock shown; the marker is stored in its place.
    Recorded,
    /// The unit was still in doubt with the lock shown; the lock is gone.
    Freed,
    /// The unit was still in doubt with the lock shown; the step's entry is appended to its
    /// journal and the lock is gone: the next delivery replays the step and goes on after it.
    StepRecorded,
    /// The unit was free: the store's memory of the lock ran out, or it was freed (or
    /// released by its holder, come back) meanwhile. Nothing was written; the next delivery
    /// runs the work as new.
    Gone,
    /// The unit holds something else now (a delivery took it over, its holder came back and
    /// finished or renewed it, or it was resolved); nothing was written.
    Changed,
}
