//! Times in deploy logs are Unix seconds; people read and type RFC 3339.

use chrono::{DateTime, SecondsFormat, Utc};

/// A time that is none of the forms [`parse_time`] reads; it quotes what was given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "`{given}` is not a time: give Unix seconds (1730540400) or RFC 3339 (2026-11-02T10:00:00Z)"
)]
pub struct NotATime {
    pub given: String,
}

/// `--at`, `--since`, `--until`: Unix seconds or RFC 3339 (`2026-11-02T10:00:00Z`,
/// `2026-11-02T11:00:00+01:00`, or a bare date `2026-11-02` for its midnight UTC).
pub fn parse_time(text: &str) -> Result<f64, NotATime> {
    let text = text.trim();
    if let Ok(seconds) = text.parse::<f64>() {
        if seconds.is_finite() {
            return Ok(seconds);
        }
    }
    if let Ok(t) = DateTime::parse_from_rfc3339(text) {
        return Ok(t.timestamp() as f64 + f64::from(t.timestamp_subsec_nanos()) / 1e9);
    }
    if let Ok(date) = chrono::NaiveDate::parse_from_str(text, "%Y-%m-%d") {
        let midnight = date.and_hms_opt(0, 0, 0).expect("midnight exists");
        return Ok(midnight.and_utc().timestamp() as f64);
    }
    Err(NotATime {
        given: text.to_string(),
    })
}

/// RFC 3339 in UTC, to the second unless the time has a fraction.
pub fn format_time(seconds: f64) -> String {
    let whole = seconds.floor();
    let nanos = ((seconds - whole) * 1e9).round() as u32;
    match DateTime::<Utc>::from_timestamp(whole as i64, nanos.min(999_999_999)) {
        Some(t) if nanos == 0 => t.to_rfc3339_opts(SecondsFormat::Secs, true),
        Some(t) => t.to_rfc3339_opts(SecondsFormat::Millis, true),
        None => format!("{seconds}"),
    }
}

/// A duration for a person: `850 ms`, `12.3 s`, `4 min 05 s`, `2 h 03 min`, `3 d 4 h`.
pub fn format_duration(seconds: f64) -> String {
    if seconds < 0.0 {
        return format!("-{}", format_duration(-seconds));
    }
    if seconds < 1.0 {
        return format!("{} ms", (seconds * 1000.0).round());
    }
    if seconds < 60.0 {
        return format!("{:.1} s", seconds);
    }
    let s = seconds.round() as u64;
    match s {
        0..3600 => format!("{} min {:02} s", s / 60, s % 60),
        3600..86400 => format!("{} h {:02} min", s / 3600, s % 3600 / 60),
        _ => format!("{} d {} h", s / 86400, s % 86400 / 3600),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_seconds_rfc3339_and_dates() {
        assert_eq!(parse_time("1730540400"), Ok(1_730_540_400.0));
        assert_eq!(parse_time("2024-11-02T09:40:00Z"), Ok(1_730_540_400.0));
        assert_eq!(parse_time("2024-11-02T10:40:00+01:00"), Ok(1_730_540_400.0));
        assert_eq!(parse_time("2024-11-02"), Ok(1_730_505_600.0));
        assert!(parse_time("yesterday")
            .unwrap_err()
            .to_string()
            .contains("not a time"));
    }

    #[test]
    fn formats_round_trip() {
        assert_eq!(format_time(1_730_540_400.0), "2024-11-02T09:40:00Z");
        assert_eq!(format_time(1_730_540_400.25), "2024-11-02T09:40:00.250Z");
        assert_eq!(format_duration(0.85), "850 ms");
        assert_eq!(format_duration(12.34), "12.3 s");
        assert_eq!(format_duration(245.0), "4 min 05 s");
        assert_eq!(format_duration(7380.0), "2 h 03 min");
    }
}
