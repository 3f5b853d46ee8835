//! `rollgate log schedules`: each schedule's record from the deploy log (issue 70) — how many
//! runs, how many succeeded, the success rate, the last success and failure, the longest run,
//! and the due times skipped or missed.

use serde::Serialize;

use super::read::Log;
use crate::host::journal::LogEvent;

/// One schedule's runs, as the log tells them.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ScheduleRecord {
    pub schedule: String,
    pub runs: u64,
    pub succeeded: u64,
    pub failed: u64,
    /// Succeeded of the runs that ended with a known result; none before any.
    pub success_rate: Option<f64>,
    /// Due times not run, and why (`schedule_skipped` lines).
    pub skipped: u64,
    /// Due times that passed while nothing kept the clock (counted from `schedule_missed`).
    pub missed: u64,
    pub last_success: Option<f64>,
    pub last_failure: Option<f64>,
    /// The longest run (ms), and the release it ran in.
    pub longest_ms: Option<u64>,
    pub longest_version: Option<String>,
}

/// The log's fields this reads beyond event and detail.
pub const FIELDS: [&str; 5] = ["schedule", "ok", "elapsed_ms", "version", "ts"];

/// Every schedule the log names, by name.
pub fn records(log: &Log) -> Vec<ScheduleRecord> {
    let mut found: Vec<ScheduleRecord> = Vec::new();
    for i in 0..log.len() {
        let Some(name) = log.extra_value("schedule", i).and_then(|v| v.as_str()) else {
            continue;
        };
        let at = match found.iter().position(|r| r.schedule == name) {
            Some(at) => at,
            None => {
                found.push(ScheduleRecord {
                    schedule: name.to_string(),
                    ..ScheduleRecord::default()
                });
                found.len() - 1
            }
        };
        let record = &mut found[at];
        let event = log.event.get(i).cloned().flatten().unwrap_or_default();
        let ts = log.ts.get(i).copied().flatten();
        if event == LogEvent::ScheduleStarted.as_str() {
            record.runs += 1;
        } else if event == LogEvent::ScheduleSkipped.as_str() {
            record.skipped += 1;
        } else if event == LogEvent::ScheduleMissed.as_str() {
            let detail = log.detail.get(i).cloned().flatten().unwrap_or_default();
            record.missed += missed_count(&detail);
        } else if event == LogEvent::ScheduleFinished.as_str() {
            match log.extra_value("ok", i).and_then(|v| v.as_bool()) {
                Some(true) => {
                    record.succeeded += 1;
                    record.last_success = ts.or(record.last_success);
                }
                Some(false) => {
                    record.failed += 1;
                    record.last_failure = ts.or(record.last_failure);
                }
                None => {}
            }
            let took = log.extra_value("elapsed_ms", i).and_then(|v| v.as_u64());
            if took > record.longest_ms {
                record.longest_ms = took;
                record.longest_version = log.version.get(i).cloned().flatten();
            }
        }
    }
    for record in &mut found {
        let ended = record.succeeded + record.failed;
        record.success_rate = (ended > 0).then(|| record.succeeded as f64 / ended as f64);
    }
    found.sort_by(|a, b| a.schedule.cmp(&b.schedule));
    found
}

/// `NAME: 3 due time(s) passed …` → 3.
fn missed_count(detail: &str) -> u64 {
    detail
        .split(": ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(1)
}
