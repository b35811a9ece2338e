//! Durations as operators read them.

use std::time::Duration;

/// `850 ms`, `29.5 s`, `4 m 10 s`, `23 h 59 m`, `6 d 23 h`.
pub(crate) fn human(duration: Duration) -> String {
    let ms = duration.as_millis();
    let secs = duration.as_secs();
    match secs {
        0 => format!("{ms} ms"),
        1..60 => format!("{}.{} s", secs, duration.subsec_millis() / 100),
        60..3600 => format!("{} m {} s", secs / 60, secs % 60),
        3600..86_400 => format!("{} h {} m", secs / 3600, secs % 3600 / 60),
        _ => format!("{} d {} h", secs / 86_400, secs % 86_400 / 3600),
    }
}

/// Input: a TTL as an operator types it: `500ms`, `90s`, `30m`, `24h`, `7d`, or whole seconds.
/// Output: the duration, or why it is none a store keeps (between `MIN_TTL` and `MAX_TTL`).
pub(crate) fn parse_ttl(text: &str) -> Result<Duration, String> {
    let ttl = parse_age(text)?;
    if ttl < idempotask::MIN_TTL || ttl > idempotask::MAX_TTL {
        return Err(format!(
            "`{text}` is outside what a store keeps: from {} to 100 years",
            human(idempotask::MIN_TTL)
        ));
    }
    Ok(ttl)
}

/// Input: an age as an operator types it, as [`parse_ttl`] reads a TTL, with no bounds.
/// Output: the duration, or why it is none.
pub(crate) fn parse_age(text: &str) -> Result<Duration, String> {
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("`{text}` is no duration; give e.g. `90s`, `30m`, `24h` or `7d`"))?;
    let seconds = |per: u64| Duration::from_secs(number.saturating_mul(per));
    match unit {
        "ms" => Ok(Duration::from_millis(number)),
        "" | "s" => Ok(seconds(1)),
        "m" => Ok(seconds(60)),
        "h" => Ok(seconds(3600)),
        "d" => Ok(seconds(86_400)),
        other => Err(format!(
            "unknown unit `{other}` in `{text}`; use ms, s, m, h or d"
        )),
    }
}

/// Whole milliseconds, for JSON.
pub(crate) fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_in_the_largest_useful_units() {
        assert_eq!(human(Duration::from_millis(850)), "850 ms");
        assert_eq!(human(Duration::from_millis(29_540)), "29.5 s");
        assert_eq!(human(Duration::from_secs(250)), "4 m 10 s");
        assert_eq!(human(Duration::from_secs(86_399)), "23 h 59 m");
        assert_eq!(human(Duration::from_secs(7 * 86_400 - 1)), "6 d 23 h");
    }

    #[test]
    fn ttls_in_the_units_operators_type() {
        let ok = |text| parse_ttl(text).unwrap();
        assert_eq!(ok("500ms"), Duration::from_millis(500));
        assert_eq!(ok("90"), Duration::from_secs(90));
        assert_eq!(ok("90s"), Duration::from_secs(90));
        assert_eq!(ok("30m"), Duration::from_secs(1800));
        assert_eq!(ok("24h"), idempotask::DEFAULT_RESULT_TTL);
        assert_eq!(ok("7d"), Duration::from_secs(7 * 86_400));
        for bad in ["", "h", "1.5h", "-1s", "10 s", "3w", "50ms", "40000d"] {
            assert!(parse_ttl(bad).is_err(), "{bad}");
        }
    }
}
