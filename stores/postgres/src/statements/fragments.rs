//! Pieces of SQL the statements share: how a row's expiry, doubt and remaining time are
//! read, and the parameters of a grant.

/// Milliseconds left until `expires_at`, rounded up so a live entry never reads as 0 ms.
pub(super) const LEFT_MS: &str =
    "ceil(extract(epoch FROM u.expires_at - statement_timestamp()) * 1000)::bigint";

/// A lock's expiry, `$4` ms from now.
pub(super) const LOCK_EXPIRY: &str =
    "statement_timestamp() + $4::bigint * interval '1 millisecond'";

/// The doubt memory `$5` (µs) as the column keeps it: `NULL` for none.
pub(super) const MEMORY: &str = "NULLIF($5::bigint, 0) * interval '1 microsecond'";

/// Whether row `a` is a lock that ran out and is still remembered: the unit is in doubt.
/// Never null. A lock with no token is a released fenced one, kept for its counter only.
pub(super) fn in_doubt(a: &str) -> String {
    format!(
        "({a}.state = 'locked' AND {a}.token IS NOT NULL \
         AND {a}.expires_at <= statement_timestamp() \
         AND COALESCE({a}.expires_at + {a}.doubt_memory > statement_timestamp(), FALSE))"
    )
}

/// Whether row `a` counts as there: live, or a lock in doubt. Never null.
pub(super) fn present(a: &str) -> String {
    format!(
        "({a}.expires_at > statement_timestamp() OR {})",
        in_doubt(a)
    )
}

/// How long ago row `a`'s lock ran out, in µs, when the unit is in doubt; else null.
pub(super) fn doubt_us(a: &str) -> String {
    micros_in_doubt(a, &format!("statement_timestamp() - {a}.expires_at"))
}

/// How long row `a`'s lock in doubt is still remembered, in µs; null when it is not in doubt.
pub(super) fn forgotten_us(a: &str) -> String {
    micros_in_doubt(
        a,
        &format!("{a}.expires_at + {a}.doubt_memory - statement_timestamp()"),
    )
}

/// The interval `span` in µs, when row `a` is in doubt; else null.
pub(super) fn micros_in_doubt(a: &str, span: &str) -> String {
    format!("CASE WHEN {} THEN {} END", in_doubt(a), micros(span))
}

/// The interval `span` in whole µs (null for null).
pub(super) fn micros(span: &str) -> String {
    format!("(extract(epoch FROM {span}) * 1000000)::bigint")
}
