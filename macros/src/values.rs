//! The values of the attribute's options: each option's value read into its typed setting
//! (durations, names, policies), or an error spanned at the value that says what was expected.
//!
//! Input: one option's value as written. Output: the setting [`Args`](crate::args::Args) keeps.

use proc_macro2::Span;
use syn::spanned::Spanned;
use syn::{Expr, ExprLit, Lit, LitStr, UnOp};

use crate::suggest::did_you_mean;

/// A duration given in the attribute, with the span of its value.
#[derive(Clone, Copy)]
pub(crate) struct Millis {
    pub(crate) ms: u64,
    pub(crate) span: Span,
}

/// What a task does with a unit left in doubt: the runtime's `InDoubt`, by the name of its
/// variant.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum InDoubt {
    Rerun,
    Hold,
}

impl InDoubt {
    /// Each policy as `in_doubt = "…"` spells it, in the order the error message lists them.
    const ALL: [(&'static str, Self); 2] = [("rerun", Self::Rerun), ("hold", Self::Hold)];

    /// The name of the runtime's variant.
    pub(crate) fn variant(self) -> &'static str {
        match self {
            Self::Rerun => "Rerun",
            Self::Hold => "Hold",
        }
    }
}

/// How `renew = …` asks for the lock to be renewed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Renewal {
    Watchdog,
    InTask,
}

impl Renewal {
    /// Each way as `renew = "…"` spells it, in the order the error message lists them.
    const ALL: [(&'static str, Self); 2] =
        [("watchdog", Self::Watchdog), ("in_task", Self::InTask)];

    /// The name of the runtime's variant.
    pub(crate) fn variant(self) -> &'static str {
        match self {
            Self::Watchdog => "Watchdog",
            Self::InTask => "InTask",
        }
    }
}

/// `true` (a watchdog), `false`, `"watchdog"` or `"in_task"`.
pub(crate) fn renewal(value: &Expr) -> syn::Result<Option<Renewal>> {
    let names = Renewal::ALL.map(|(name, _)| name);
    let expected = "expected `true`, `false`, `\"watchdog\"` or `\"in_task\"` for `renew`";
    match literal(value) {
        Some(Lit::Bool(flag)) => Ok(flag.value.then_some(Renewal::Watchdog)),
        Some(Lit::Str(text)) => {
            let way = text.value();
            if let Some((_, renewal)) = Renewal::ALL.iter().find(|(name, _)| *name == way) {
                return Ok(Some(*renewal));
            }
            let hint = did_you_mean(&way, names).map_or_else(String::new, |close| {
                format!("; did you mean `\"{close}\"`?")
            });
            Err(syn::Error::new(
                text.span(),
                format!("unknown way to renew `{way:?}`{hint}\n{expected}"),
            ))
        }
        _ => Err(syn::Error::new_spanned(value, expected)),
    }
}

/// `"my_crate::idempotask"`: the path of a crate that re-exports idempotask.
pub(crate) fn crate_path(value: &Expr) -> syn::Result<syn::Path> {
    let expected = || {
        syn::Error::new(
            value.span(),
            "expected the path idempotask is re-exported at as a string, like `crate = \"my_crate::idempotask\"`",
        )
    };
    match literal(value) {
        Some(Lit::Str(path)) => path.parse::<syn::Path>().map_err(|_| expected()),
        _ => Err(expected()),
    }
}

/// A duration in words, for messages.
pub(crate) fn show(ms: u64) -> String {
    if ms.is_multiple_of(1000) {
        format!("{} s", ms / 1000)
    } else {
        format!("{ms} ms")
    }
}

fn literal(value: &Expr) -> Option<&Lit> {
    match value {
        Expr::Lit(ExprLit { lit, .. }) => Some(lit),
        Expr::Group(group) => literal(&group.expr),
        _ => None,
    }
}

/// The runtime's `MAX_TTL` in milliseconds: 100 years of 365 days. A copy, since a proc macro
/// cannot read the runtime's constants; the UI cases `pass/ttl_at_the_ceiling.rs` and
/// `fail/ttl_too_long.rs` fail unless the two ceilings are the same.
const MAX_TTL_MS: u64 = 100 * 365 * 86_400_000;

/// The runtime's `MIN_TTL` in milliseconds. The expansion builds its task in a `static`, where
/// `Task::lock_ttl` refuses a TTL below the runtime's floor at compile time too; the UI cases
/// `pass/lock_ttl_at_the_floor.rs` and `fail/lock_ttl_below_the_floor.rs` fail unless the two
/// floors are the same.
const MIN_TTL_MS: u64 = 100;

/// Input: the value of `lock_ttl`. Output: the duration, if it is one and at least the floor.
pub(crate) fn lock_ttl(option: &str, value: &Expr) -> syn::Result<Millis> {
    let ttl = duration(option, value)?;
    if ttl.ms < MIN_TTL_MS {
        return Err(syn::Error::new(
            ttl.span,
            format!(
                "`{option}` must be at least `\"{MIN_TTL_MS}ms\"` (`idempotask::MIN_TTL`): a shorter lock can expire before its renewal or its grant's reply arrives"
            ),
        ));
    }
    Ok(ttl)
}

/// `30` (seconds) or `"750ms"`, `"30s"`, `"2m"`, `"1h"`, `"7d"`: a positive duration.
pub(crate) fn duration(option: &str, value: &Expr) -> syn::Result<Millis> {
    if is_negative(value) {
        return Err(syn::Error::new_spanned(
            value,
            format!("`{option}` must be positive; a negative duration means nothing here"),
        ));
    }
    let ttl = duration_or_zero(option, value)?;
    if ttl.ms == 0 {
        return Err(syn::Error::new(
            ttl.span,
            format!("`{option}` must be greater than zero"),
        ));
    }
    Ok(ttl)
}

fn is_negative(value: &Expr) -> bool {
    matches!(value, Expr::Unary(unary) if matches!(unary.op, UnOp::Neg(_)))
}

/// Like [`duration`], zero included: `doubt_memory = 0` turns detection off.
pub(crate) fn duration_or_zero(option: &str, value: &Expr) -> syn::Result<Millis> {
    let span = value.span();
    let expected = || {
        syn::Error::new(
            span,
            format!(
                "expected a duration for `{option}`: whole seconds like `30`, or a string like `\"750ms\"`, `\"30s\"`, `\"2m\"`, `\"1h\"`, `\"7d\"`"
            ),
        )
    };
    if is_negative(value) {
        return Err(syn::Error::new_spanned(
            value,
            format!("`{option}` cannot be negative; a negative duration means nothing here"),
        ));
    }
    let ms = match literal(value) {
        Some(Lit::Int(int)) => int
            .base10_parse::<u64>()
            .ok()
            .and_then(|secs| secs.checked_mul(1000))
            .ok_or_else(expected)?,
        Some(Lit::Str(text)) => parse_duration(&text.value()).ok_or_else(expected)?,
        _ => return Err(expected()),
    };
    if ms > MAX_TTL_MS {
        return Err(syn::Error::new(
            span,
            format!(
                "`{option}` must be at most `\"36500d\"` (100 years), the longest TTL stores keep"
            ),
        ));
    }
    Ok(Millis { ms, span })
}

/// `"750ms"` → 750, `"2m"` → 120 000; `None` for anything else.
fn parse_duration(text: &str) -> Option<u64> {
    let text = text.trim();
    let digits = text.find(|c: char| !c.is_ascii_digit())?;
    let (number, unit) = text.split_at(digits);
    let number: u64 = number.parse().ok()?;
    let factor = match unit.trim() {
        "ms" => 1,
        "s" => 1_000,
        "m" | "min" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return None,
    };
    number.checked_mul(factor)
}

pub(crate) fn task_name(value: &Expr) -> syn::Result<LitStr> {
    let Some(Lit::Str(name)) = literal(value) else {
        return Err(syn::Error::new(
            value.span(),
            "expected a string for `name`, like `name = \"charge_customer\"`",
        ));
    };
    let text = name.value();
    let valid = !text.is_empty()
        && text.len() <= 128
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    if valid {
        Ok(name.clone())
    } else {
        Err(syn::Error::new(
            name.span(),
            "a task name is 1 to 128 characters of `A-Z a-z 0-9 _ - .`; it becomes part of the store's keys",
        ))
    }
}

/// `"plain"` (false) or `"hash"` (true).
pub(crate) fn log_key(value: &Expr) -> syn::Result<bool> {
    match literal(value) {
        Some(Lit::Str(text)) if text.value() == "plain" => Ok(false),
        Some(Lit::Str(text)) if text.value() == "hash" => Ok(true),
        _ => Err(syn::Error::new(
            value.span(),
            "expected `\"plain\"` or `\"hash\"` for `log_key`; `\"hash\"` logs the key's SHA-256 instead of the key",
        )),
    }
}

/// `"rerun"` or `"hold"`. `"reconcile"` is kept for a `reconcile = path` option of its own.
pub(crate) fn in_doubt(value: &Expr) -> syn::Result<InDoubt> {
    let names = InDoubt::ALL.map(|(name, _)| name);
    let expected = names.map(|name| format!("`\"{name}\"`")).join(", ");
    let Some(Lit::Str(text)) = literal(value) else {
        // `in_doubt = hold` or `InDoubt::Hold`: the policy, written as code.
        let word = match value {
            Expr::Path(path) => path.path.segments.last().map(|s| s.ident.to_string()),
            _ => None,
        };
        let hint = word
            .and_then(|word| did_you_mean(&word.to_lowercase(), names))
            .map_or_else(String::new, |close| {
                format!("; did you mean `in_doubt = \"{close}\"`?")
            });
        return Err(syn::Error::new_spanned(
            value,
            format!("expected a string for `in_doubt`{hint}\nexpected one of: {expected}"),
        ));
    };
    let policy = text.value();
    if let Some((_, policy)) = InDoubt::ALL.iter().find(|(name, _)| *name == policy) {
        return Ok(*policy);
    }
    let message = if policy == "reconcile" {
        "reconciling is an option of its own, `reconcile = path::to::fn`: the async function that asks the downstream system whether the work was done".to_owned()
    } else {
        let hint = did_you_mean(&policy, names).map_or_else(String::new, |close| {
            format!("; did you mean `\"{close}\"`?")
        });
        format!("unknown `in_doubt` policy `{policy:?}`{hint}")
    };
    Err(syn::Error::new(
        text.span(),
        format!("{message}\nexpected one of: {expected}"),
    ))
}

/// `reconcile = path::to::fn`: a path, not a call or a closure (the attribute calls it).
pub(crate) fn reconcile_path(value: Expr) -> syn::Result<syn::ExprPath> {
    match value {
        Expr::Path(path) => Ok(path),
        Expr::Call(call) => Err(syn::Error::new_spanned(
            &call,
            "`reconcile` names the function, it does not call it: write `reconcile = path::to::fn`, without arguments (it is given the task's context)",
        )),
        other => Err(syn::Error::new_spanned(
            other,
            "expected a path to an async function for `reconcile`, such as `reconcile = payments::lookup_charge`",
        )),
    }
}

pub(crate) fn boolean(option: &str, value: &Expr) -> syn::Result<bool> {
    match literal(value) {
        Some(Lit::Bool(flag)) => Ok(flag.value),
        _ => Err(syn::Error::new(
            value.span(),
            format!("expected `true` or `false` for `{option}`"),
        )),
    }
}

pub(crate) fn count(option: &str, value: &Expr) -> syn::Result<u32> {
    match literal(value) {
        Some(Lit::Int(int)) => match int.base10_parse::<u32>() {
            Ok(0) | Err(_) => Err(syn::Error::new(
                int.span(),
                format!("`{option}` must be a whole number from 1 to {}", u32::MAX),
            )),
            Ok(n) => Ok(n),
        },
        _ => Err(syn::Error::new(
            value.span(),
            format!("expected a whole number for `{option}`, like `{option} = 10`"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::{InDoubt, Renewal, in_doubt, parse_duration, renewal};

    #[test]
    fn ways_to_renew() {
        let parse = |value: &str| {
            renewal(&syn::parse_str(value).unwrap())
                .map(|way| way.map(Renewal::variant))
                .map_err(|err| err.to_string())
        };
        assert_eq!(parse("true"), Ok(Some("Watchdog")));
        assert_eq!(parse("false"), Ok(None));
        assert_eq!(parse(r#""watchdog""#), Ok(Some("Watchdog")));
        assert_eq!(parse(r#""in_task""#), Ok(Some("InTask")));
        for (bad, says) in [
            (r#""in-task""#, "did you mean `\"in_task\"`?"),
            (r#""Watchdog""#, "did you mean `\"watchdog\"`?"),
            (r#""always""#, "unknown way to renew"),
            ("InTask", "expected `true`, `false`"),
            ("1", "expected `true`, `false`"),
        ] {
            let err = parse(bad).unwrap_err();
            assert!(err.contains(says), "{bad}: {err}");
        }
    }

    #[test]
    fn in_doubt_policies() {
        let parse = |value: &str| {
            in_doubt(&syn::parse_str(value).unwrap())
                .map(InDoubt::variant)
                .map_err(|err| err.to_string())
        };
        assert_eq!(parse(r#""rerun""#), Ok("Rerun"));
        assert_eq!(parse(r#""hold""#), Ok("Hold"));
        for (bad, says) in [
            (r#""Hold""#, "did you mean `\"hold\"`?"),
            (r#""reruns""#, "did you mean `\"rerun\"`?"),
            (
                r#""reconcile""#,
                "an option of its own, `reconcile = path::to::fn`",
            ),
            (r#""""#, "unknown `in_doubt` policy `\"\"`"),
            ("Rerun", "did you mean `in_doubt = \"rerun\"`?"),
            ("1", "expected a string for `in_doubt`"),
        ] {
            let err = parse(bad).unwrap_err();
            assert!(err.contains(says), "{bad}: {err}");
        }
    }

    #[test]
    fn durations_in_every_unit() {
        assert_eq!(parse_duration("750ms"), Some(750));
        assert_eq!(parse_duration("30s"), Some(30_000));
        assert_eq!(parse_duration("2m"), Some(120_000));
        assert_eq!(parse_duration("1h"), Some(3_600_000));
        assert_eq!(parse_duration("7d"), Some(604_800_000));
        for bad in [
            "",
            "30",
            "ms",
            "1.5s",
            "-1s",
            "2 weeks",
            "99999999999999999999ms",
        ] {
            assert_eq!(parse_duration(bad), None, "{bad}");
        }
    }
}
