//! When a schedule is due, and what its keeper does at a due time (issue 70) — pure: the
//! clock's keeper (`supervision::clock`) reads the time and the state, asks here, and acts.
//!
//! A schedule's due times are fixed points in time, never "so long after the last run": cron
//! fields in UTC, or `@every N` counted from the Unix epoch (every 2 s is each even second), so
//! a keeper that starts again — after a kill -9, a reboot, a `start` — finds the very due times
//! the one before it had, and the state's `last_due` says which of them were taken.

use std::str::FromStr as _;

use chrono::{DateTime, Utc};

use crate::host::fault::Fault;
use crate::policy::{CatchUp, Concurrency, SchedulePolicy};

/// How a schedule's due times fall.
#[derive(Debug, Clone)]
pub enum Timing {
    /// `@every N`: each multiple of N (seconds) since the Unix epoch.
    Every(f64),
    /// Five cron fields, or a name (`@daily`), in UTC or the schedule's `zone`.
    Cron(Box<croner::Cron>, Option<chrono_tz::Tz>),
}

/// A schedule as its keeper runs it: the policy's fields resolved.
#[derive(Debug, Clone)]
pub struct Schedule {
    pub name: String,
    /// As the policy writes it (`0 3 * * *`, `@every 2s`).
    pub expression: String,
    pub timing: Timing,
    pub command: Vec<String>,
    pub timeout_ms: u64,
    pub concurrency: Concurrency,
    pub catch_up: CatchUp,
}

/// A run's limit when the policy gives none: an hour.
pub const DEFAULT_TIMEOUT_MS: u64 = 3_600_000;

impl Schedule {
    /// The policy's `schedules.NAME`, or why it cannot run (the field named). The contract has
    /// checked the expression already; a `.ncl` that skipped it is checked here again.
    pub fn of(name: &str, policy: &SchedulePolicy) -> Result<Schedule, Fault> {
        let field = |f: &str| format!("schedules.{name}.{f}");
        let refused = |f: &str, why: String| Err(Fault::setting(&field(f), why));
        // The name reaches paths (its runs' output folder) and log lines.
        if let Err(why) = crate::host::names::check_name("schedule", name) {
            return Err(Fault::setting(
                "schedules",
                format!("schedules.{name:?}: {why}"),
            ));
        }
        let zone = match policy.zone.as_deref() {
            None => None,
            Some(zone) => match zone.parse::<chrono_tz::Tz>() {
                Ok(zone) => Some(zone),
                Err(_) => {
                    return refused(
                        "zone",
                        format!(
                            "{} = {zone:?} is not a time zone of the IANA database (Europe/Paris, America/New_York, UTC)",
                            field("zone")
                        ),
                    )
                }
            },
        };
        if policy.command.is_empty() || policy.command.iter().any(String::is_empty) {
            return refused(
                "command",
                format!(
                    "{} must name a program (and its arguments)",
                    field("command")
                ),
            );
        }
        Ok(Schedule {
            name: name.to_string(),
            expression: policy.cron.trim().to_string(),
            timing: match timing_of(&policy.cron, zone) {
                Ok(timing) => timing,
                Err(why) => return refused("cron", format!("{}: {why}", field("cron"))),
            },
            command: policy.command.clone(),
            timeout_ms: policy.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS),
            concurrency: policy.concurrency.unwrap_or_default(),
            catch_up: policy.catch_up.unwrap_or_default(),
        })
    }

    /// The first due time strictly after `t` (Unix seconds); None when the expression never
    /// matches again (a 30th of February).
    pub fn next_after(&self, t: f64) -> Option<f64> {
        match &self.timing {
            Timing::Every(every) => Some(((t / every).floor() + 1.0) * every),
            Timing::Cron(cron, zone) => {
                let at = DateTime::<Utc>::from_timestamp_millis((t * 1000.0).floor() as i64)?;
                let next = match zone {
                    Some(zone) => cron
                        .find_next_occurrence(&at.with_timezone(zone), false)
                        .ok()?
                        .timestamp(),
                    None => cron.find_next_occurrence(&at, false).ok()?.timestamp(),
                };
                Some(next as f64)
            }
        }
    }

    /// The due times in (`after`, `until`], at most `limit` of them counted (a schedule every
    /// second missed for a month is not walked second by second): how many, and the last.
    pub fn due_between(&self, after: f64, until: f64, limit: usize) -> (usize, Option<f64>) {
        let mut count = 0;
        let mut last = None;
        let mut t = after;
        while let Some(due) = self.next_after(t).filter(|due| *due <= until) {
            count += 1;
            last = Some(due);
            if count == limit {
                // The rest counted in one step where the interval is fixed.
                if let Timing::Every(every) = self.timing {
                    let rest = ((until - due) / every).floor();
                    return (count + rest as usize, Some(due + rest * every));
                }
                break;
            }
            t = due;
        }
        (count, last)
    }
}

/// `@every 2s`, `@every 500ms` (1000 at least), `@every 5m`, `@every 1h`; a name; five fields
/// (in `zone`, UTC without it; an interval has no zone).
fn timing_of(expression: &str, zone: Option<chrono_tz::Tz>) -> Result<Timing, String> {
    let expression = expression.trim();
    if let Some(every) = expression.strip_prefix("@every ") {
        let every = every.trim();
        let (number, unit) = every
            .find(|c: char| !c.is_ascii_digit())
            .map(|at| every.split_at(at))
            .ok_or_else(|| format!("`{every}` needs a unit: ms, s, m or h"))?;
        let n: f64 = number
            .parse::<u32>()
            .map_err(|_| format!("`{every}` is not a number and a unit"))?
            .into();
        let seconds = match unit {
            "ms" => n / 1000.0,
            "s" => n,
            "m" => n * 60.0,
            "h" => n * 3600.0,
            _ => return Err(format!("`{unit}` is not a unit: ms, s, m or h")),
        };
        if seconds < 1.0 {
            return Err(format!("@every {every} is under 1 s"));
        }
        return Ok(Timing::Every(seconds));
    }
    if expression.split_whitespace().count() != 5 && !expression.starts_with('@') {
        return Err(format!(
            "`{expression}` is not five fields (minute hour day-of-month month day-of-week)"
        ));
    }
    let named = match expression {
        "@midnight" => "@daily",
        other => other,
    };
    croner::Cron::from_str(named)
        .map(|cron| Timing::Cron(Box::new(cron), zone))
        .map_err(|e| format!("`{expression}`: {e}"))
}

/// What the keeper does at a due time, given the runs of the schedule still going.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AtDue {
    Start,
    /// Not run; why, for its `schedule_skipped` line.
    Skip(String),
    /// The runs still going are stopped first (`concurrency = 'replace`), then it starts.
    ReplaceThenStart,
}

/// The schedule's concurrency rule applied: `running` runs of it are still going.
pub fn at_due(schedule: &Schedule, running: usize) -> AtDue {
    match (running, schedule.concurrency) {
        (0, _) | (_, Concurrency::Allow) => AtDue::Start,
        (_, Concurrency::Replace) => AtDue::ReplaceThenStart,
        (n, Concurrency::Forbid) => AtDue::Skip(format!(
            "the last run still runs ({n} running; concurrency 'forbid)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schedule(cron: &str) -> Result<Schedule, String> {
        Schedule::of(
            "nightly",
            &SchedulePolicy {
                cron: cron.into(),
                command: vec!["bin/report".into()],
                timeout_ms: None,
                concurrency: None,
                catch_up: None,
                zone: None,
            },
        )
        .map_err(|e| e.to_string())
    }

    #[test]
    fn due_times_are_fixed_points_every_n_seconds_or_by_cron_in_utc() {
        let every = schedule("@every 2s").unwrap();
        assert_eq!(every.next_after(100.0), Some(102.0));
        assert_eq!(every.next_after(101.5), Some(102.0));
        assert_eq!(every.next_after(102.0), Some(104.0), "strictly after");
        // 2026-12-06 17:59:30 UTC → 03:00 the next morning.
        let nightly = schedule("0 3 * * *").unwrap();
        let t = 1_796_579_970.0;
        assert_eq!(nightly.next_after(t), Some(1_796_612_400.0));
        let hourly = schedule("@hourly").unwrap();
        assert_eq!(hourly.next_after(t), Some(1_796_580_000.0));
        assert_eq!(
            schedule("@midnight").unwrap().next_after(t),
            Some(1_796_601_600.0)
        );
        let every_minute = schedule("* * * * *").unwrap();
        assert_eq!(every_minute.next_after(t), Some(1_796_580_000.0));
    }

    #[test]
    fn a_bad_expression_or_zone_is_refused_naming_the_field_and_a_zone_is_kept() {
        for (cron, said) in [
            ("@every 500ms", "under 1 s"),
            ("@every 2", "needs a unit"),
            ("@every 2d", "`d` is not a unit"),
            ("0 3 * *", "not five fields"),
            ("61 * * * *", "schedules.nightly.cron: `61 * * * *`"),
        ] {
            let err = schedule(cron).unwrap_err();
            assert!(err.contains(said), "{cron}: {err}");
        }
        let mut zoned = SchedulePolicy {
            cron: "0 3 * * *".into(),
            command: vec!["x".into()],
            timeout_ms: None,
            concurrency: None,
            catch_up: None,
            zone: Some("Mars/Olympus".into()),
        };
        let err = Schedule::of("nightly", &zoned).unwrap_err().to_string();
        assert!(err.starts_with("schedules.nightly.zone"), "{err}");
        zoned.zone = Some("Europe/Paris".into());
        // 03:00 in Paris (CET, UTC+1 in December) is 02:00 UTC.
        let paris = Schedule::of("nightly", &zoned).unwrap();
        assert_eq!(paris.next_after(1_796_579_970.0), Some(1_796_608_800.0));
        let err = Schedule::of("../up", &zoned).unwrap_err().to_string();
        assert!(err.starts_with("schedules.\"../up\""), "{err}");
        zoned.zone = None;
        zoned.command = vec![];
        let err = Schedule::of("nightly", &zoned).unwrap_err().to_string();
        assert!(err.starts_with("schedules.nightly.command"), "{err}");
    }

    #[test]
    fn missed_due_times_are_counted_without_walking_each_one() {
        let every = schedule("@every 2s").unwrap();
        assert_eq!(every.due_between(100.0, 100.0, 10), (0, None));
        assert_eq!(every.due_between(100.0, 107.0, 10), (3, Some(106.0)));
        // A month of seconds, counted in one step past the limit.
        let (count, last) = every.due_between(0.0, 2_592_000.0, 1000);
        assert_eq!((count, last), (1_296_000, Some(2_592_000.0)));
        let nightly = schedule("0 3 * * *").unwrap();
        let (count, _) = nightly.due_between(1_796_579_970.0, 1_796_579_970.0 + 3.0 * 86400.0, 100);
        assert_eq!(count, 3);
    }

    #[test]
    fn concurrency_decides_a_due_time_while_a_run_goes_on() {
        let mut s = schedule("@every 2s").unwrap();
        assert_eq!(at_due(&s, 0), AtDue::Start);
        assert!(matches!(at_due(&s, 1), AtDue::Skip(why) if why.contains("'forbid")));
        s.concurrency = Concurrency::Replace;
        assert_eq!(at_due(&s, 1), AtDue::ReplaceThenStart);
        s.concurrency = Concurrency::Allow;
        assert_eq!(at_due(&s, 2), AtDue::Start);
    }
}
