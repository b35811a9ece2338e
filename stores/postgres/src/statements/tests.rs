use super::*;

#[test]
fn table_names_are_plain_identifiers() {
    for good in ["idempotask_units", "jobs.units", "_t1", &"a".repeat(56)] {
        assert!(TableName::parse(good).is_ok(), "{good}");
    }
    for bad in [
        "",
        "Units",
        "1units",
        "a.b.c",
        ".units",
        "units.",
        "units; DROP TABLE x",
        "\"units\"",
        &"a".repeat(57),
    ] {
        assert!(TableName::parse(bad).is_err(), "{bad}");
    }
}

#[test]
fn row_lock_waits_are_bounded_outside_transactions_only() {
    let bound = lock_wait_bound;
    assert_eq!(
        bound(Duration::from_secs(4)),
        "set_config('lock_timeout', '4000ms', true) IS NOT NULL"
    );
    // `0` would turn the limit off; PostgreSQL takes at most `i32::MAX` ms.
    assert!(bound(Duration::ZERO).contains("'1ms'"));
    assert!(bound(Duration::MAX).contains("'2147483647ms'"));
    let statements = Statements::new(
        &TableName::parse("units").unwrap(),
        Duration::from_millis(800),
    );
    let bounded = bound(Duration::from_millis(800));
    for (name, sql) in [
        ("begin_fresh", &statements.begin_fresh),
        ("begin_fresh_fenced", &statements.begin_fresh_fenced),
        ("begin", &statements.begin),
        ("take_over", &statements.take_over),
        ("finish_held", &statements.finish_held),
        ("finish", &statements.finish),
        ("release", &statements.release),
        ("renew", &statements.renew),
        ("forget", &statements.forget),
        ("forget_exact", &statements.forget_exact),
        ("resolve_free", &statements.resolve_free),
        (
            "resolve_free_discarding",
            &statements.resolve_free_discarding,
        ),
        ("resolve_record", &statements.resolve_record),
        ("record_step", &statements.record_step),
        (
            "record_step_in_transaction",
            &statements.in_transaction.record,
        ),
        ("open_attempt", &statements.in_transaction.open_attempt),
    ] {
        assert!(sql.as_str().contains(&bounded), "{name}");
    }
    for (name, sql) in [
        (
            "begin_fresh_in_transaction",
            &statements.begin_fresh_in_transaction,
        ),
        (
            "begin_fresh_fenced_in_transaction",
            &statements.begin_fresh_fenced_in_transaction,
        ),
        ("begin_in_transaction", &statements.begin_in_transaction),
        (
            "take_over_in_transaction",
            &statements.take_over_in_transaction,
        ),
        (
            "complete_in_transaction",
            &statements.complete_in_transaction,
        ),
    ] {
        assert!(!sql.as_str().contains("lock_timeout"), "{name}");
    }
}

#[test]
fn objects_are_quoted_and_derived_from_the_table() {
    let name = TableName::parse("jobs.units").unwrap();
    assert_eq!(name.table(), r#""jobs"."units""#);
    assert_eq!(name.sequence(), r#""jobs"."units_fence""#);
    assert_eq!(name.display(), "jobs.units");
    let migration = name.migration();
    assert!(migration.starts_with("-- Replicas"), "{migration}");
    assert!(migration.contains(
            "pg_advisory_xact_lock(hashtextextended('idempotask migration \"jobs\".\"units\"', 0));\nCREATE SCHEMA IF NOT EXISTS \"jobs\";\nCREATE TABLE"
        ), "{migration}");
    // The columns of units in doubt, on tables of earlier versions, after their creation,
    // and only when the catalog says one is missing: all of them in one `ALTER`.
    let guard = migration
            .find("WHERE attrelid = '\"jobs\".\"units\"'::regclass AND NOT attisdropped\n          AND attname IN ('doubt_memory', 'doubt_earlier_fence', 'doubt_expired_for')\n    ) < 3 THEN")
            .expect(&migration);
    let alter = migration
        .find(
            "ALTER TABLE \"jobs\".\"units\"
            ADD COLUMN IF NOT EXISTS doubt_memory interval,
            ADD COLUMN IF NOT EXISTS doubt_earlier_fence bigint,
            ADD COLUMN IF NOT EXISTS doubt_expired_for interval;",
        )
        .expect(&migration);
    assert!(migration.find("CREATE TABLE").unwrap() < guard && guard < alter);
    assert_eq!(migration.matches("ALTER TABLE").count(), 1, "{migration}");
    for column in [
        "doubt_memory interval,",
        "doubt_earlier_fence bigint,",
        "doubt_expired_for interval,",
    ] {
        assert!(migration.contains(&format!("    {column}\n")), "{column}");
    }
}

#[test]
fn a_takeover_keeps_the_doubt_it_found_and_the_fresh_path_never_reads_it() {
    let statements = Statements::new(
        &TableName::parse("units").unwrap(),
        Duration::from_millis(800),
    );
    for (name, sql) in [
        ("take_over", &statements.take_over),
        (
            "take_over_in_transaction",
            &statements.take_over_in_transaction,
        ),
    ] {
        for part in [
            "doubt_earlier_fence = old.fence",
            "doubt_expired_for = statement_timestamp() - old.expires_at",
        ] {
            assert!(sql.as_str().contains(part), "{name}: {part}");
        }
    }
    // Only the holder's repeated grant keeps it; every other grant clears it.
    for (name, sql) in [
        ("begin", &statements.begin),
        ("begin_in_transaction", &statements.begin_in_transaction),
    ] {
        assert!(
                sql.as_str().contains(
                    "doubt_expired_for = CASE WHEN (u.state = 'locked' AND u.token = excluded.token) THEN u.doubt_expired_for END"
                ),
                "{name}"
            );
    }
    // A result recorded, or an operator's decision, ends the doubt.
    for (name, sql) in [
        ("finish_held", &statements.finish_held),
        ("finish", &statements.finish),
        (
            "complete_in_transaction",
            &statements.complete_in_transaction,
        ),
        ("resolve_record", &statements.resolve_record),
        ("resolve_free", &statements.resolve_free),
        (
            "resolve_free_discarding",
            &statements.resolve_free_discarding,
        ),
    ] {
        assert!(sql.as_str().contains("doubt_expired_for = NULL"), "{name}");
    }
    // A release deletes only a lock that carries none, and lapses one that does.
    let release = statements.release.as_str();
    assert!(release.contains("u.fence IS NULL AND u.doubt_expired_for IS NULL"));
    assert!(release.contains("least(u.expires_at, statement_timestamp())"));
    assert_eq!(
        release
            .matches(&lock_wait_bound(Duration::from_millis(800)))
            .count(),
        2
    );
    for (name, sql) in [
        ("begin_fresh", &statements.begin_fresh),
        ("begin_fresh_fenced", &statements.begin_fresh_fenced),
    ] {
        assert!(!sql.as_str().contains("doubt_e"), "{name}");
    }
}

#[test]
fn a_unit_in_doubt_is_a_remembered_lock_of_a_holder() {
    let condition = in_doubt("u");
    for part in [
        "u.state = 'locked'",
        "u.token IS NOT NULL",
        "u.expires_at <= statement_timestamp()",
        // A row of an earlier version, `NULL`, remembers nothing, and the condition is
        // never null: `NOT` of it is a plain negation in `purge` and `begin`.
        "COALESCE(u.expires_at + u.doubt_memory > statement_timestamp(), FALSE)",
    ] {
        assert!(condition.contains(part), "{condition}");
    }
    let statements = Statements::new(
        &TableName::parse("units").unwrap(),
        Duration::from_millis(800),
    );
    for (name, sql) in [
        ("purge", &statements.purge),
        ("inspect", &statements.inspect),
        ("read", &statements.read),
        ("list", &statements.list),
        ("release", &statements.release),
        ("renew", &statements.renew),
        ("finish_held", &statements.finish_held),
        ("finish", &statements.finish),
        ("begin", &statements.begin),
        ("take_over", &statements.take_over),
        ("resolve_free", &statements.resolve_free),
        (
            "resolve_free_discarding",
            &statements.resolve_free_discarding,
        ),
        ("resolve_record", &statements.resolve_record),
    ] {
        assert!(
            sql.as_str().contains(&in_doubt("u")) || sql.as_str().contains(&in_doubt("o")),
            "{name}"
        );
    }
}

#[test]
fn the_steps_table_is_created_by_the_migration_and_named_only_where_steps_need_it() {
    let name = TableName::parse("jobs.units").unwrap();
    assert_eq!(name.steps(), r#""jobs"."units_steps""#);
    let migration = name.migration();
    // Created for tables of earlier versions too, under the same advisory lock.
    let lock = migration.find("pg_advisory_xact_lock").unwrap();
    let created = migration
        .find("CREATE TABLE IF NOT EXISTS \"jobs\".\"units_steps\" (")
        .expect(&migration);
    assert!(lock < created);
    assert!(migration.contains("PRIMARY KEY (task, key, position)"));
    let statements = Statements::new(&name, Duration::from_millis(800));
    let steps = name.steps();
    // A unit without steps: its statements never name the steps table.
    for (name, sql) in [
        ("begin_fresh", &statements.begin_fresh),
        ("begin_fresh_fenced", &statements.begin_fresh_fenced),
        ("begin_fresh_batch", &statements.begin_fresh_batch),
        ("begin", &statements.begin),
        ("take_over", &statements.take_over),
        ("finish_held", &statements.finish_held),
        ("finish_held_batch", &statements.finish_held_batch),
        ("finish", &statements.finish),
        ("release", &statements.release),
        ("renew", &statements.renew),
        ("resolve_free", &statements.resolve_free),
        ("resolve_record", &statements.resolve_record),
    ] {
        assert!(!sql.as_str().contains(&steps), "{name}");
    }
    // A forgotten marker takes the journal with it, and so does a free that discards it.
    for (name, sql) in [
        ("forget", &statements.forget),
        ("forget_exact", &statements.forget_exact),
        (
            "resolve_free_discarding",
            &statements.resolve_free_discarding,
        ),
    ] {
        assert!(
            sql.as_str().contains(&format!("DELETE FROM {steps} s")),
            "{name}"
        );
    }
}

#[test]
fn a_step_is_recorded_under_the_lock_renew_checks() {
    let statements = Statements::new(
        &TableName::parse("units").unwrap(),
        Duration::from_millis(800),
    );
    let renew = statements.renew.as_str();
    let held = renew
        .split(" WHERE ")
        .nth(1)
        .expect(renew)
        .trim_end_matches(|c: char| c.is_whitespace());
    let record = statements.record_step.as_str();
    assert!(record.contains(held), "{record}");
    // The holder's row, then the journal's, each locked before it is trusted.
    let holder = record.find("FOR NO KEY UPDATE").expect(record);
    let journal = record.find("FOR UPDATE\n").expect(record);
    assert!(holder < journal);
    assert!(record.contains("OR s.entry = excluded.entry"));
}

/// A caller's transaction holds its unit's row until it ends and waits for its steps'
/// records, so the record sent beside it must not lock, or even name, the units table.
#[test]
fn a_step_inside_a_transaction_never_names_the_units_row() {
    let statements = Statements::new(
        &TableName::parse("units").unwrap(),
        Duration::from_millis(800),
    );
    let record = statements.in_transaction.record.as_str();
    assert!(!record.contains("units u"), "{record}");
    assert!(!record.contains("FOR NO KEY UPDATE"), "{record}");
    assert!(record.contains("pg_xact_status($3"), "{record}");
    assert!(record.contains("OR s.entry = excluded.entry"));
    let units = TableName::parse("units").unwrap();
    assert_eq!(units.runs(), r#""units_runs""#);
    assert!(
        units
            .migration()
            .contains(r#"CREATE TABLE IF NOT EXISTS "units_runs" ("#)
    );
    let (in_transaction, attempts) = (&statements.in_transaction, &statements.attempts);
    for attempt in [
        &in_transaction.open_attempt,
        &in_transaction.close_attempt,
        &attempts.purge,
        &attempts.probe,
        &attempts.read,
        &attempts.list,
        &attempts.free,
        &attempts.free_discarding,
        &attempts.step,
    ] {
        let attempt = attempt.as_str();
        assert!(!attempt.contains(r#""units" "#), "{attempt}");
        assert!(attempt.contains(r#""units_runs""#), "{attempt}");
    }
}
