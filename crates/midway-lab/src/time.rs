//! Wall-clock timestamps for records and folder names (UTC), formatted by `humantime`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// "2026-11-21T06:30:00Z": RFC 3339 in whole seconds, the form every record's `started_at`
/// carries (midway-report parses it back).
pub(crate) fn rfc3339_now() -> String {
    rfc3339(SystemTime::now())
}

/// "20261121-063000", for folder names.
pub(crate) fn compact_now() -> String {
    compact(SystemTime::now())
}

fn rfc3339(at: SystemTime) -> String {
    // humantime panics on times before 1970 and after 9999; a clock that far off is clamped
    // (to 1970, as the records have always said for a clock before the epoch) rather than
    // aborting a run.
    let last = UNIX_EPOCH + Duration::from_secs(253_402_300_799);
    humantime::format_rfc3339_seconds(at.clamp(UNIX_EPOCH, last)).to_string()
}

/// The RFC 3339 form without its separators: "2026-11-21T06:30:00Z" -> "20261121-063000".
fn compact(at: SystemTime) -> String {
    rfc3339(at)
        .chars()
        .filter_map(|c| match c {
            'T' => Some('-'),
            digit if digit.is_ascii_digit() => Some(digit),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(unix_seconds: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(unix_seconds)
    }

    #[test]
    fn civil_dates_match_known_instants() {
        assert_eq!(rfc3339(at(0)), "1970-01-01T00:00:00Z");
        // 2000-02-29T12:34:56Z, a leap day.
        assert_eq!(rfc3339(at(951_827_696)), "2000-02-29T12:34:56Z");
        // 2026-11-21T05:55:15Z.
        assert_eq!(rfc3339(at(1_795_240_515)), "2026-11-21T05:55:15Z");
        assert_eq!(compact(at(1_795_240_515)), "20261121-055515");
    }

    #[test]
    fn a_clock_before_the_epoch_reads_as_the_epoch() {
        assert_eq!(
            rfc3339(UNIX_EPOCH - Duration::from_secs(5)),
            "1970-01-01T00:00:00Z"
        );
    }
}
