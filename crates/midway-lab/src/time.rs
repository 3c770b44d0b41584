//! Wall-clock timestamps for records and folder names (UTC, no time-zone database needed).

use std::time::{SystemTime, UNIX_EPOCH};

/// (year, month, day, hour, minute, second) of a Unix time, UTC. Howard Hinnant's
/// days-to-civil algorithm.
pub(crate) fn civil(unix_seconds: u64) -> (i64, u32, u32, u32, u32, u32) {
    let days = (unix_seconds / 86_400) as i64;
    let rem = unix_seconds % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (
        year,
        month,
        day,
        (rem / 3600) as u32,
        (rem / 60 % 60) as u32,
        (rem % 60) as u32,
    )
}

fn now_seconds() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// "2026-11-21T06:30:00Z".
pub(crate) fn rfc3339_now() -> String {
    let (y, mo, d, h, mi, s) = civil(now_seconds());
    format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}Z")
}

/// "20261121-063000", for folder names.
pub(crate) fn compact_now() -> String {
    let (y, mo, d, h, mi, s) = civil(now_seconds());
    format!("{y:04}{mo:02}{d:02}-{h:02}{mi:02}{s:02}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_dates_match_known_instants() {
        assert_eq!(civil(0), (1970, 1, 1, 0, 0, 0));
        // 2000-02-29T12:34:56Z, a leap day.
        assert_eq!(civil(951_827_696), (2000, 2, 29, 12, 34, 56));
        // 2026-11-21T05:55:15Z.
        assert_eq!(civil(1_795_240_515), (2026, 11, 21, 5, 55, 15));
    }
}
