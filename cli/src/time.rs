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
}
