//! Steps inside transactional completion: their records commit on the store's own connections,
//! outside the caller's transaction, so that a rollback keeps them as it keeps their effects;
//! the marker alone commits with the body's writes. A transaction that took over an existing
//! row holds that row's lock while its steps record, and a record that waited on it would never
//! end; a record that cannot be written fails the step closed; and all of it works for the
//! least-privileged user the deployment notes give. An execution that dies in its steps (its
//! connection cut, its worker gone) leaves its attempt behind: the next one finds the step it
//! may have started in doubt and applies that step's policy, once, however many deliveries
//! race; one that ends cleanly leaves no doubt.

#[allow(clippy::wildcard_imports)]
use super::*;

use idempotask::{Reconciled, StepErrorKind};

static STEPPED: Task = Task::new("pg_tx_steps");
static FENCED: Task = Task::new("pg_tx_steps_fenced").fencing(true);

/// How often each step's effect ran.
#[derive(Default)]
struct Effects {
    charges: AtomicUsize,
    mails: AtomicUsize,
    bodies: AtomicUsize,
}

/// A role `name` with the grants the deployment notes give, on the tables `owner` migrated,
/// and the effects table; its URL.
async fn least_privileged(server: &PostgresServer, owner: &PgPool, name: &str) -> String {
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE ROLE {name} LOGIN;
         GRANT SELECT, INSERT, UPDATE, DELETE
             ON idempotask_units, idempotask_units_steps, idempotask_units_runs TO {name};
         GRANT USAGE, SELECT ON SEQUENCE idempotask_units_fence TO {name};
         GRANT SELECT, INSERT ON effects TO {name};"
    )))
    .execute(owner)
    .await
    .unwrap();
    server
        .url()
        .replace("postgres://postgres@", &format!("postgres://{name}@"))
}

/// The owner's pool, with the tables migrated and the effects table made.
async fn migrated(server: &PostgresServer) -> PgPool {
    let owner = server.pool(4).await;
    PostgresStore::builder(owner.clone())
        .migrate()
        .await
        .unwrap();
    effects_table(&owner).await;
    owner
}

/// One transactional delivery of `key`: an effect row written inside the transaction, a
/// charge and a mail as steps, then `ends` as the body's answer.
async fn deliver(
    store: &PostgresStore,
    pool: &PgPool,
    key: &str,
    effects: &Effects,
    ends: Result<(), &'static str>,
) -> Result<String, BoxError> {
    let transaction = pool.begin().await?;
    STEPPED
        .call(key)
        .run_in_transaction(store.transaction(transaction), async |db| {
            effects.bodies.fetch_add(1, Ordering::SeqCst);
            write_effect(db, key, 1).await?;
            let ctx = idempotask::context().expect("inside a task");
            let charge: usize = ctx
                .step("charge", async {
                    Ok::<_, BoxError>(effects.charges.fetch_add(1, Ordering::SeqCst) + 1)
                })
                .await?;
            let mail: String = ctx
                .step("mail", async {
                    effects.mails.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, BoxError>(format!("receipt for charge {charge}"))
                })
                .await?;
            // The fence of a transactional holder: its transaction still runs.
            ctx.fence().await?;
            ends?;
            Ok(mail)
        })
        .await
}

/// Run as the least-privileged user: the body's transaction rolls back after two steps; the
/// unit is not done and its effect row is gone, but both steps stay recorded, so the rerun
/// replays them without running their effects and commits; a duplicate then gets the result
/// without running the body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn a_rollback_keeps_the_steps_and_the_rerun_replays_them() {
    let server = PostgresServer::start();
    let (owner, pool, store) = least_privileged_store(&server, "app").await;
    let unit = UnitOfWork::new("pg_tx_steps", "order-7").unwrap();
    let ran = Effects::default();

    let failed = deliver(&store, &pool, "order-7", &ran, Err("the ledger said no")).await;
    assert_eq!(failed.unwrap_err().to_string(), "the ledger said no");
    assert_eq!(
        effects(&owner, "order-7").await,
        0,
        "the rollback kept a write"
    );
    assert!(!store.inspect(&unit).await.unwrap().is_done());
    let recorded = store.read_journal(&unit).await.unwrap();
    assert_eq!(
        recorded.into_entries().len(),
        2,
        "the rollback took the steps"
    );

    let receipt = deliver(&store, &pool, "order-7", &ran, Ok(())).await;
    assert_eq!(receipt.unwrap(), "receipt for charge 1");
    assert_eq!(ran.charges.load(Ordering::SeqCst), 1, "charged twice");
    assert_eq!(ran.mails.load(Ordering::SeqCst), 1, "mailed twice");
    assert_eq!(effects(&owner, "order-7").await, 1);
    assert!(store.inspect(&unit).await.unwrap().is_done());

    let again = deliver(&store, &pool, "order-7", &ran, Ok(())).await;
    assert_eq!(again.unwrap(), "receipt for charge 1");
    assert_eq!(ran.bodies.load(Ordering::SeqCst), 2, "a duplicate ran");
    assert_eq!(effects(&owner, "order-7").await, 1);
}

/// A fenced unit that was forgotten keeps its row (for its fencing token), so the next
/// transactional delivery takes that row over with an `UPDATE` and holds its lock until the
/// transaction ends (the step checks that it does): a step's record that locked the unit's row
/// from another connection would wait on the very transaction that waits for it, until the
/// lock timeout (24 s here), three times. It must not touch that row at all: the call
/// finishes well within 10 s. (A record that locks the row by its key fails this test.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn a_step_does_not_wait_on_the_row_its_own_transaction_holds() {
    let server = PostgresServer::start();
    let pool = migrated(&server).await;
    let store = PostgresStore::builder(pool.clone())
        .response_timeout(Duration::from_secs(30))
        .connect()
        .await
        .unwrap();
    let unit = UnitOfWork::new("pg_tx_steps_fenced", "row-held").unwrap();
    let first: u64 = FENCED
        .call("row-held")
        .store(store.clone())
        .run(async { Ok::<_, Error>(1) })
        .await
        .unwrap();
    assert_eq!(first, 1);
    assert!(store.forget(&unit).await.unwrap());

    let transaction = pool.begin().await.unwrap();
    let observer = pool.clone();
    let call =
        FENCED
            .call("row-held")
            .run_in_transaction(store.transaction(transaction), async |db| {
                write_effect(db, "row-held", 1).await?;
                let ctx = idempotask::context().expect("inside a task");
                let held = ctx
                    .step("charge", async {
                        // The transaction holds the unit's row: a lock on it is refused now.
                        let locked = sqlx::query(
                            "SELECT 1 FROM idempotask_units
                         WHERE task = 'pg_tx_steps_fenced' AND key = 'row-held'
                         FOR NO KEY UPDATE NOWAIT",
                        )
                        .fetch_optional(&observer)
                        .await;
                        Ok::<_, BoxError>(locked.is_err())
                    })
                    .await?;
                let second: u64 = ctx.step("mail", async { Ok::<_, BoxError>(2) }).await?;
                Ok::<_, BoxError>((held, second))
            });
    let (held, second) = tokio::time::timeout(Duration::from_secs(10), call)
        .await
        .expect("a step waited on its own transaction's row")
        .unwrap();
    assert!(held, "the transaction did not hold the unit's row");
    assert_eq!(second, 2);
    assert_eq!(effects(&pool, "row-held").await, 1);
    assert!(store.inspect(&unit).await.unwrap().is_done());
}

/// The store's own connections go away while a step's effect runs (its role may no longer log
/// in, its sessions are ended): the record cannot be written, so the step answers `Unrecorded`,
/// the body's transaction rolls back, and nothing is done or recorded. The next delivery, with
/// the store back, runs the step again: it is a plain `step`, in doubt, rerun (under
/// `step_or_hold` it would hold: see `a_step_cut_off_in_its_effect_is_held`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn a_step_whose_record_cannot_be_written_fails_closed() {
    let server = PostgresServer::start();
    let owner = migrated(&server).await;
    let url = least_privileged(&server, &owner, "stepper").await;
    let stepper = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect(&url)
        .await
        .unwrap();
    let store = PostgresStore::builder(stepper)
        .response_timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap();
    let unit = UnitOfWork::new("pg_tx_steps", "store-gone").unwrap();
    let charges = AtomicUsize::new(0);
    let run = |cut: bool| {
        let (store, owner, charges) = (&store, &owner, &charges);
        async move {
            let transaction = owner.begin().await?;
            STEPPED
                .call("store-gone")
                .run_in_transaction(store.transaction(transaction), async |db| {
                    write_effect(db, "store-gone", 1).await?;
                    let ctx = idempotask::context().expect("inside a task");
                    ctx.step("charge", async {
                        charges.fetch_add(1, Ordering::SeqCst);
                        if cut {
                            sqlx::raw_sql(
                                "ALTER ROLE stepper NOLOGIN;
                                 SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                                 WHERE usename = 'stepper';",
                            )
                            .execute(owner)
                            .await?;
                        }
                        Ok::<_, BoxError>(7_u32)
                    })
                    .await
                })
                .await
        }
    };

    let cut = tokio::time::timeout(Duration::from_secs(60), run(true))
        .await
        .expect("the step never gave up");
    let err = cut.unwrap_err();
    assert!(
        matches!(
            err.downcast_ref::<Error>(),
            Some(Error::Step {
                kind: StepErrorKind::Unrecorded,
                ..
            })
        ),
        "{err}"
    );
    assert_eq!(
        effects(&owner, "store-gone").await,
        0,
        "the rollback kept a write"
    );
    let owners = PostgresStore::builder(owner.clone())
        .connect()
        .await
        .unwrap();
    assert!(!owners.inspect(&unit).await.unwrap().is_done());
    assert!(
        owners
            .read_journal(&unit)
            .await
            .unwrap()
            .into_entries()
            .is_empty()
    );

    sqlx::raw_sql("ALTER ROLE stepper LOGIN")
        .execute(&owner)
        .await
        .unwrap();
    assert_eq!(run(false).await.unwrap(), 7);
    assert_eq!(
        charges.load(Ordering::SeqCst),
        2,
        "the unrecorded step is run again"
    );
    assert_eq!(effects(&owner, "store-gone").await, 1);
    assert!(owners.inspect(&unit).await.unwrap().is_done());
}

/// The records of a transaction's steps are accepted only while it runs: once it rolled back,
/// its step store (a late step of a body whose connection the server killed) appends nothing
/// and its fence is refused, while the next holder's transaction records after the entries the
/// first one did write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn a_transaction_that_ended_records_no_step() {
    use idempotask::store::{StepEntry, TransactionScope};

    let server = PostgresServer::start();
    let pool = migrated(&server).await;
    let store = PostgresStore::builder(pool.clone())
        .connect()
        .await
        .unwrap();
    let unit = UnitOfWork::new("pg_tx_steps", "ended").unwrap();
    let ttl = Duration::from_secs(30);
    let (first, second) = (br#"{"step":"a","ok":1}"#, br#"{"step":"b","ok":2}"#);
    let holder = LockToken::generate();
    let mut transaction = store.transaction(pool.begin().await.unwrap());
    let taken = transaction.begin(&unit, &holder, ttl, Fencing::Off).await;
    assert!(matches!(taken, Ok(Begin::Acquired { .. })), "{taken:?}");
    let steps = transaction
        .step_store()
        .await
        .unwrap()
        .expect("a step store");
    let recorded = steps.record_step(&unit, &holder, StepEntry::new(0, first, ttl), ttl);
    assert!(recorded.await.unwrap());
    transaction.abort().await;

    let late = steps.record_step(&unit, &holder, StepEntry::new(1, second, ttl), ttl);
    assert!(!late.await.unwrap(), "a rolled-back transaction appended");
    assert!(!steps.renew(&unit, &holder, ttl).await.unwrap());
    assert_eq!(
        store.read_journal(&unit).await.unwrap().entries(),
        [first.to_vec()]
    );

    let next = LockToken::generate();
    let mut transaction = store.transaction(pool.begin().await.unwrap());
    let taken = transaction.begin(&unit, &next, ttl, Fencing::Off).await;
    assert!(matches!(taken, Ok(Begin::Acquired { .. })), "{taken:?}");
    let steps = transaction
        .step_store()
        .await
        .unwrap()
        .expect("a step store");
    let recorded = steps.record_step(&unit, &next, StepEntry::new(1, second, ttl), ttl);
    assert!(recorded.await.unwrap());
    transaction.abort().await;
}

static MAILED: Task = Task::new("pg_tx_doubt");
static MAILED_HOLDING: Task = Task::new("pg_tx_doubt_held").in_doubt(InDoubt::Hold);

/// What the second step (`mail`) does when it is in doubt.
#[derive(Clone, Copy)]
enum Policy {
    Rerun,
    Hold,
    Reconcile,
    /// A plain `step` of a task that holds units in doubt (`InDoubt::Hold`).
    TaskHolds,
}

/// Where a delivery dies: its transaction's backend ended from outside (`pg_terminate_backend`
/// by the owner), or its future dropped as a killed worker's is.
#[derive(Clone, Copy, PartialEq)]
enum Death {
    None,
    BeforeTheFirstStep,
    InTheMailsEffect,
    DroppedInTheMailsEffect,
    AfterTheLastStep,
}

/// How often the steps' effects and the reconcile function ran.
#[derive(Default)]
struct Mailer {
    charges: AtomicUsize,
    mails: AtomicUsize,
    reconciled: AtomicUsize,
    /// Told when a dropped delivery is inside the mail's effect.
    dying: tokio::sync::Notify,
}

/// One transactional delivery of `key`, run by the least-privileged `pool`: an effect row
/// written in the transaction, a charge, `ends`, then a mail under `policy` (its reconcile
/// function answers from the charge, the mail's input). `owner` ends the transaction's
/// backend where `death` says.
#[expect(clippy::too_many_arguments, reason = "one knob per scenario")]
async fn mail(
    store: &PostgresStore,
    pool: &PgPool,
    owner: &PgPool,
    key: &str,
    ran: &Mailer,
    policy: Policy,
    death: Death,
    ends: Result<(), &'static str>,
) -> Result<String, BoxError> {
    let kill = async |pid: i32| -> Result<(), BoxError> {
        // Waits until the backend is gone: its transaction is over when the effect returns.
        sqlx::query("SELECT pg_terminate_backend($1, 30000)")
            .bind(pid)
            .execute(owner)
            .await?;
        Ok(())
    };
    let task = match policy {
        Policy::TaskHolds => &MAILED_HOLDING,
        _ => &MAILED,
    };
    let transaction = pool.begin().await?;
    task.call(key)
        .run_in_transaction(store.transaction(transaction), async |db| {
            let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
                .fetch_one(&mut *db)
                .await?;
            write_effect(db, key, 1).await?;
            if death == Death::BeforeTheFirstStep {
                kill(pid).await?;
            }
            let ctx = idempotask::context().expect("inside a task");
            let charge: usize = ctx
                .step("charge", async {
                    Ok::<_, BoxError>(ran.charges.fetch_add(1, Ordering::SeqCst) + 1)
                })
                .await?;
            ends?;
            let effect = async {
                ran.mails.fetch_add(1, Ordering::SeqCst);
                match death {
                    Death::InTheMailsEffect => kill(pid).await?,
                    Death::DroppedInTheMailsEffect => {
                        ran.dying.notify_one();
                        std::future::pending::<()>().await;
                    }
                    _ => {}
                }
                Ok::<_, BoxError>(format!("receipt for charge {charge}"))
            };
            let receipt: String = match policy {
                Policy::Rerun | Policy::TaskHolds => ctx.step("mail", effect).await?,
                Policy::Hold => ctx.step_or_hold("mail", effect).await?,
                Policy::Reconcile => {
                    let reconcile = || async {
                        ran.reconciled.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, BoxError>(Reconciled::Done(format!("found for charge {charge}")))
                    };
                    ctx.step_or_reconcile("mail", reconcile, effect).await?
                }
            };
            if death == Death::AfterTheLastStep {
                kill(pid).await?;
            }
            write_effect(db, key, 2).await?;
            Ok(receipt)
        })
        .await
}

/// [`mail`] under `step_or_hold`, the body ending well.
async fn mail_or_hold(
    store: &PostgresStore,
    pool: &PgPool,
    owner: &PgPool,
    key: &str,
    ran: &Mailer,
    death: Death,
) -> Result<String, BoxError> {
    mail(store, pool, owner, key, ran, Policy::Hold, death, Ok(())).await
}

/// The owner's pool, the least-privileged user's pool and its store.
async fn least_privileged_store(
    server: &PostgresServer,
    name: &str,
) -> (PgPool, PgPool, PostgresStore) {
    let owner = migrated(server).await;
    let url = least_privileged(server, &owner, name).await;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(6)
        .connect(&url)
        .await
        .unwrap();
    let store = PostgresStore::builder(pool.clone())
        .connect()
        .await
        .unwrap();
    (owner, pool, store)
}

/// Whether `result` is the refusal of a unit held in doubt.
fn is_held(result: &Result<String, BoxError>) -> bool {
    matches!(
        result.as_ref().map_err(|err| err.downcast_ref::<Error>()),
        Err(Some(Error::InDoubt { .. }))
    )
}

/// A delivery whose transaction's backend is ended while the mail's effect runs leaves the
/// mail in doubt: under `step_or_hold` the next delivery, and every one after it, is refused
/// with `Error::InDoubt` without mailing again, and nothing of theirs commits. So is one whose
/// worker died there (its call future dropped, its transaction rolled back as its connection
/// goes), and, under a plain `step`, one of a task that holds units in doubt
/// (`InDoubt::Hold`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn a_step_cut_off_in_its_effect_is_held() {
    let server = PostgresServer::start();
    let (owner, pool, store) = least_privileged_store(&server, "holder").await;
    let ran = Mailer::default();
    let deliver = |key, death| mail_or_hold(&store, &pool, &owner, key, &ran, death);

    let cut = deliver("cut", Death::InTheMailsEffect).await;
    assert!(cut.is_err(), "{cut:?}");
    assert_eq!(ran.mails.load(Ordering::SeqCst), 1);
    for _ in 0..2 {
        let held = deliver("cut", Death::None).await;
        assert!(is_held(&held), "{held:?}");
    }
    assert_eq!(
        ran.mails.load(Ordering::SeqCst),
        1,
        "the mail in doubt ran again"
    );
    assert_eq!(
        ran.charges.load(Ordering::SeqCst),
        1,
        "the charge ran again"
    );
    assert_eq!(effects(&owner, "cut").await, 0, "a held delivery committed");

    let dropped = deliver("dropped", Death::DroppedInTheMailsEffect);
    tokio::select! {
        ended = dropped => panic!("the delivery ended: {ended:?}"),
        () = ran.dying.notified() => {}
    }
    let held = deliver("dropped", Death::None).await;
    assert!(is_held(&held), "{held:?}");
    assert_eq!(
        ran.mails.load(Ordering::SeqCst),
        2,
        "the dropped mail ran again"
    );
    let unit = UnitOfWork::new("pg_tx_doubt", "dropped").unwrap();
    assert!(!store.inspect(&unit).await.unwrap().is_done());

    // A task that holds units in doubt holds its plain `step` in doubt too.
    let holding = |death| {
        mail(
            &store,
            &pool,
            &owner,
            "task",
            &ran,
            Policy::TaskHolds,
            death,
            Ok(()),
        )
    };
    let cut = holding(Death::InTheMailsEffect).await;
    assert!(cut.is_err(), "{cut:?}");
    let held = holding(Death::None).await;
    assert!(is_held(&held), "{held:?}");
    assert_eq!(
        ran.mails.load(Ordering::SeqCst),
        3,
        "the task's mail ran again"
    );
}

/// Under `step_or_reconcile`, the next delivery after a cut asks the reconcile function, with
/// the mail's input (the charge), instead of mailing again; its answer is recorded as the
/// mail's and the unit commits. Under `step`, the mail runs again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn a_step_cut_off_in_its_effect_is_reconciled_or_rerun() {
    let server = PostgresServer::start();
    let (owner, pool, store) = least_privileged_store(&server, "reconciler").await;
    let ran = Mailer::default();
    let deliver =
        |key, policy, death| mail(&store, &pool, &owner, key, &ran, policy, death, Ok(()));

    let cut = deliver("reconciled", Policy::Reconcile, Death::InTheMailsEffect).await;
    assert!(cut.is_err(), "{cut:?}");
    let found = deliver("reconciled", Policy::Reconcile, Death::None).await;
    assert_eq!(found.unwrap(), "found for charge 1");
    assert_eq!(ran.reconciled.load(Ordering::SeqCst), 1);
    assert_eq!(
        ran.mails.load(Ordering::SeqCst),
        1,
        "the mail in doubt ran again"
    );
    let unit = UnitOfWork::new("pg_tx_doubt", "reconciled").unwrap();
    assert!(store.inspect(&unit).await.unwrap().is_done());
    assert_eq!(effects(&owner, "reconciled").await, 2);
    let replayed = deliver("reconciled", Policy::Reconcile, Death::None).await;
    assert_eq!(replayed.unwrap(), "found for charge 1");
    assert_eq!(ran.reconciled.load(Ordering::SeqCst), 1);

    let cut = deliver("rerun", Policy::Rerun, Death::InTheMailsEffect).await;
    assert!(cut.is_err(), "{cut:?}");
    let rerun = deliver("rerun", Policy::Rerun, Death::None).await;
    assert_eq!(rerun.unwrap(), "receipt for charge 2");
    assert_eq!(
        ran.mails.load(Ordering::SeqCst),
        3,
        "the rerun did not mail"
    );
    assert_eq!(ran.reconciled.load(Ordering::SeqCst), 1);
}

/// Two deliveries at once after a cut: the unit's row, which each takes in its transaction,
/// lets one decide; it reconciles and commits, and the other waits for it and replays its
/// result. The reconcile function runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn deliveries_racing_after_a_cut_decide_once() {
    let server = PostgresServer::start();
    let (owner, pool, store) = least_privileged_store(&server, "racer").await;
    let ran = Mailer::default();
    let deliver = |death| {
        mail(
            &store,
            &pool,
            &owner,
            "raced",
            &ran,
            Policy::Reconcile,
            death,
            Ok(()),
        )
    };

    let cut = deliver(Death::InTheMailsEffect).await;
    assert!(cut.is_err(), "{cut:?}");
    let (first, second) = tokio::join!(deliver(Death::None), deliver(Death::None));
    assert_eq!(first.unwrap(), "found for charge 1");
    assert_eq!(second.unwrap(), "found for charge 1");
    assert_eq!(ran.reconciled.load(Ordering::SeqCst), 1, "both decided");
    assert_eq!(ran.mails.load(Ordering::SeqCst), 1);
    assert_eq!(effects(&owner, "raced").await, 2);
}

/// What is not in doubt: a body that returns an error after its first step (its attempt is
/// closed, so the next delivery under `step_or_hold` mails), a cut before the first step (no
/// attempt was opened) and a cut after the last step (the journal holds every step; the next
/// delivery replays them and commits, mailing nothing again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn clean_errors_and_cuts_outside_the_steps_hold_nothing() {
    let server = PostgresServer::start();
    let (owner, pool, store) = least_privileged_store(&server, "clean").await;
    let ran = Mailer::default();
    let deliver =
        |key, death, ends| mail(&store, &pool, &owner, key, &ran, Policy::Hold, death, ends);

    let failed = deliver("failed", Death::None, Err("the ledger said no")).await;
    assert_eq!(failed.unwrap_err().to_string(), "the ledger said no");
    let done = deliver("failed", Death::None, Ok(())).await;
    assert_eq!(done.unwrap(), "receipt for charge 1");
    assert_eq!(ran.mails.load(Ordering::SeqCst), 1, "mailed twice");

    let before = deliver("before", Death::BeforeTheFirstStep, Ok(())).await;
    assert!(before.is_err(), "{before:?}");
    let done = deliver("before", Death::None, Ok(())).await;
    assert_eq!(done.unwrap(), "receipt for charge 2");

    let after = deliver("after", Death::AfterTheLastStep, Ok(())).await;
    assert!(after.is_err(), "{after:?}");
    let done = deliver("after", Death::None, Ok(())).await;
    assert_eq!(done.unwrap(), "receipt for charge 3");
    assert_eq!(ran.mails.load(Ordering::SeqCst), 3, "a mail ran twice");
    assert_eq!(ran.charges.load(Ordering::SeqCst), 3, "a charge ran twice");
    for key in ["failed", "before", "after"] {
        assert_eq!(effects(&owner, key).await, 2, "{key}");
    }
}

/// The attempts table is kept small and checked at once: `purge_expired`, run by the
/// least-privileged user, deletes the attempts whose doubt memory ran out (they count as
/// absent already) and keeps the others, and a store without the table is refused at
/// `connect`, not at a transactional call's first step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn run_out_attempts_are_purged_and_a_missing_table_refused() {
    let server = PostgresServer::start();
    let (owner, _pool, store) = least_privileged_store(&server, "purger").await;
    sqlx::raw_sql(
        "INSERT INTO idempotask_units_runs
             (task, key, xid, fence, started_at, expires_at, doubt_fence, doubt_since)
         VALUES ('pg_tx_steps', 'ran-out', 1, NULL, now() - interval '2 minutes',
                 now() - interval '1 minute', NULL, now() - interval '2 minutes'),
                ('pg_tx_steps', 'remembered', 2, NULL, now(),
                 now() + interval '1 hour', NULL, now())",
    )
    .execute(&owner)
    .await
    .unwrap();
    assert!(store.purge_expired().await.unwrap() >= 1);
    let kept: Vec<Vec<u8>> =
        sqlx::query_scalar("SELECT key FROM idempotask_units_runs ORDER BY key")
            .fetch_all(&owner)
            .await
            .unwrap();
    assert_eq!(kept, [b"remembered".to_vec()]);

    sqlx::raw_sql("DROP TABLE idempotask_units_runs")
        .execute(&owner)
        .await
        .unwrap();
    super::doubt::refused_until_migrated(&owner).await;
}

/// The units of `keys` (in key order), each listed in doubt (two to a page) and read in
/// doubt, held for some time already; each with the token its resolution compares.
async fn listed_in_doubt(store: &PostgresStore, keys: &[&str; 3]) -> Vec<(UnitOfWork, Vec<u8>)> {
    use idempotask::operator::{Held, Operator};
    let page = Operator::list(store, "pg_tx_doubt", None, 2).await.unwrap();
    let listed: Vec<_> = page
        .units
        .iter()
        .filter_map(|unit| unit.key.clone())
        .collect();
    assert_eq!(listed, ["discarded", "freed"]);
    let rest = Operator::list(store, "pg_tx_doubt", page.next.as_ref(), 2)
        .await
        .unwrap();
    assert_eq!(rest.units.len(), 1, "{rest:?}");
    let mut tokens = Vec::new();
    for key in *keys {
        let unit = UnitOfWork::new("pg_tx_doubt", key).unwrap();
        let Held::InDoubt {
            bytes, expired_for, ..
        } = Operator::read(store, &unit).await.unwrap()
        else {
            panic!("{key} is not shown in doubt");
        };
        assert!(expired_for > Duration::ZERO, "{key}: {expired_for:?}");
        tokens.push((unit, bytes));
    }

    tokens
}

/// A unit held at a step inside a transaction shows to the operator's reads and listings as a
/// unit in doubt, for as long as it is held (so `list --in-doubt --older-than` and the
/// dashboard find it), and the operator ends the hold through the resolutions that serve a lock
/// in doubt: the held step's result recorded (the next delivery replays it and mails nothing),
/// the unit freed (it mails again, the charge replayed) or freed with its journal (it charges
/// and mails again). A unit's own result is refused: only a step's fits there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn operators_list_and_resolve_a_step_held_in_a_transaction() {
    use idempotask::operator::{Held, Operator, step_entry};
    use serde_json::value::RawValue;

    let server = PostgresServer::start();
    let (owner, pool, store) = least_privileged_store(&server, "operator").await;
    let ran = Mailer::default();
    let deliver = |key, death| mail_or_hold(&store, &pool, &owner, key, &ran, death);
    let keys = ["discarded", "freed", "recorded"];
    for key in keys {
        assert!(deliver(key, Death::InTheMailsEffect).await.is_err());
        assert!(is_held(&deliver(key, Death::None).await));
    }
    assert_eq!(ran.mails.load(Ordering::SeqCst), 3);
    let tokens = listed_in_doubt(&store, &keys).await;
    let value = RawValue::from_string(r#""receipt by hand""#.to_owned()).unwrap();
    let kept = Duration::from_secs(3600);
    let [
        (discarded, discarded_token),
        (freed, freed_token),
        (recorded, recorded_token),
    ] = <[_; 3]>::try_from(tokens).unwrap();
    let marker = Marker::encode_resolution(&recorded, None, &value);
    let refused = Operator::resolve_exact(
        &store,
        &recorded,
        &recorded_token,
        &Resolution::record(marker, kept),
    )
    .await
    .unwrap_err();
    assert_eq!(refused.kind(), StoreErrorKind::Configuration, "{refused}");
    for (unit, token, resolution, resolved) in [
        (
            &recorded,
            &recorded_token,
            Resolution::record_step(step_entry("mail", None, &value), kept),
            Resolved::StepRecorded,
        ),
        (&freed, &freed_token, Resolution::Free, Resolved::Freed),
        (
            &discarded,
            &discarded_token,
            Resolution::FreeDiscardingSteps,
            Resolved::Freed,
        ),
    ] {
        let answer = Operator::resolve_exact(&store, unit, token, &resolution).await;
        assert_eq!(answer.unwrap(), resolved, "{unit:?}");
        assert!(matches!(
            Operator::read(&store, unit).await.unwrap(),
            Held::Nothing
        ));
        let again = Operator::resolve_exact(&store, unit, token, &resolution).await;
        assert_eq!(again.unwrap(), Resolved::Gone, "{unit:?}");
    }

    let replayed = deliver("recorded", Death::None).await.unwrap();
    assert_eq!(replayed, "receipt by hand");
    assert_eq!(ran.mails.load(Ordering::SeqCst), 3, "the recorded mail ran");
    assert_eq!(ran.charges.load(Ordering::SeqCst), 3);
    assert_eq!(
        deliver("freed", Death::None).await.unwrap(),
        "receipt for charge 2"
    );
    assert_eq!(ran.mails.load(Ordering::SeqCst), 4);
    assert_eq!(
        ran.charges.load(Ordering::SeqCst),
        3,
        "the freed charge ran"
    );
    assert_eq!(
        deliver("discarded", Death::None).await.unwrap(),
        "receipt for charge 4"
    );
    assert_eq!(ran.mails.load(Ordering::SeqCst), 5);
    assert_eq!(
        ran.charges.load(Ordering::SeqCst),
        4,
        "the journal was kept"
    );
    for key in keys {
        assert_eq!(effects(&owner, key).await, 2, "{key}");
    }
}
