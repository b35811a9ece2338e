//! Times and durations as operators read them, without a date library.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch.
pub(crate) fn epoch_millis(at: SystemTime) -> u64 {
    let millis = at
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis();
    u64::try_from(millis).unwrap_or(u64::MAX)
}

/// `2026-11-30T00:21:07.123Z` for milliseconds since the epoch (UTC).
pub(crate) fn rfc3339(millis: u64) -> String {
    let (secs, ms) = (millis / 1000, millis % 1000);
    let (days, rest) = (secs / 86_400, secs % 86_400);
    let (hour, minute, second) = (rest / 3600, rest % 3600 / 60, rest % 60);
    // Howard Hinnant's days-to-civil, for days since 1970-01-01 (never negative here).
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{hour:02}:{minute:02}:{second:02}.{ms:03}Z")
}

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

/// Whole milliseconds, for JSON.
pub(crate) fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_dates_across_leap_years() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(rfc3339(1_764_462_067_123), "2025-11-30T00:21:07.123Z");
    }

    #[test]
    fn durations_in_the_largest_useful_units() {
        assert_eq!(human(Duration::from_millis(850)), "850 ms");
        assert_eq!(human(Duration::from_millis(29_540)), "29.5 s");
        assert_eq!(human(Duration::from_secs(250)), "4 m 10 s");
        assert_eq!(human(Duration::from_secs(86_399)), "23 h 59 m");
        assert_eq!(human(Duration::from_secs(7 * 86_400 - 1)), "6 d 23 h");
    }
}
