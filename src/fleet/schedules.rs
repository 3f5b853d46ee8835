//! A policy's `schedules` past one host (issue 70): each schedule as a Kubernetes CronJob and a
//! Nomad periodic job, with what the engine cannot hold said. Both read five-field cron and the
//! `@hourly`-style names; `@every N` becomes the nearest expression they can run (exact when N
//! divides an hour or a day, else every minute), and says so.

use serde_json::{json, Value};

use super::pod::{object_name, seconds_up};
use super::workload::Workload;
use super::Inexpressible;
use crate::policy::{CatchUp, Concurrency, SchedulePolicy};

/// Kubernetes refuses a CronJob name longer than this (its Jobs get a suffix).
const CRONJOB_NAME_MAX: usize = 52;
/// How late a CronJob may still start a run with `catch_up = 'none` (a missed run is skipped).
const NO_CATCH_UP_S: u64 = 60;

/// The expression an engine runs for `cron`, and what was lost making it.
fn expression(name: &str, cron: &str, engine: &str) -> (String, Option<String>) {
    let Some(every) = cron.strip_prefix("@every ") else {
        return (cron.to_string(), None);
    };
    let digits: String = every.chars().take_while(char::is_ascii_digit).collect();
    let n: u64 = digits.parse().unwrap_or(1);
    let seconds = match &every[digits.len()..] {
        "ms" => n / 1000,
        "m" => n * 60,
        "h" => n * 3600,
        _ => n,
    };
    let exact = match seconds {
        s if s % 3600 == 0 && 24 % (s / 3600) == 0 => Some(format!("0 */{} * * *", s / 3600)),
        s if s % 60 == 0 && s < 3600 && 60 % (s / 60) == 0 => Some(format!("*/{} * * * *", s / 60)),
        _ => None,
    };
    match exact {
        Some(expression) => (expression, None),
        None => (
            "* * * * *".to_string(),
            Some(format!(
                "schedules.{name}: `{cron}`: {engine} runs a schedule at most once a minute and on \
                 the clock's minutes; it runs every minute"
            )),
        ),
    }
}

/// Schedule `name` of entry `entry` as a CronJob, and what it could not hold.
pub fn cron_job(
    entry: &str,
    name: &str,
    schedule: &SchedulePolicy,
    workload: &Workload,
) -> Result<(Value, Vec<String>), Inexpressible> {
    let object = format!("{}-{}", object_name(entry), object_name(name));
    if object.len() > CRONJOB_NAME_MAX {
        return Err(Inexpressible::new(
            entry,
            format!(
                "schedules.{name}: CronJob `{object}` is {} characters; Kubernetes allows {CRONJOB_NAME_MAX}",
                object.len()
            ),
        ));
    }
    let mut lost = Vec::new();
    let (cron, every) = expression(name, &schedule.cron, "Kubernetes");
    lost.extend(every);
    let mut container = json!({ "name": object_name(name), "command": schedule.command });
    if let Some(image) = &workload.image {
        container["image"] = json!(image);
    }
    let mut job = json!({
        "backoffLimit": 0,
        "template": { "spec": { "restartPolicy": "Never", "containers": [container] } },
    });
    if let Some(ms) = schedule.timeout_ms {
        job["activeDeadlineSeconds"] = json!(seconds_up(ms));
    }
    let mut spec = json!({
        "schedule": cron,
        "concurrencyPolicy": match schedule.concurrency.unwrap_or_default() {
            Concurrency::Forbid => "Forbid",
            Concurrency::Replace => "Replace",
            Concurrency::Allow => "Allow",
        },
        "jobTemplate": { "spec": job },
    });
    if schedule.catch_up.unwrap_or_default() == CatchUp::None {
        spec["startingDeadlineSeconds"] = json!(NO_CATCH_UP_S);
    }
    if let Some(zone) = &schedule.zone {
        spec["timeZone"] = json!(zone);
    }
    let labels = super::pod::labels_of(entry, &format!("schedule-{name}"));
    let object = json!({
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": { "name": object, "labels": labels },
        "spec": spec,
    });
    Ok((object, lost))
}

/// Schedule `name` of entry `entry` as a Nomad periodic batch job, and what it could not hold.
pub fn periodic_job(entry: &str, name: &str, schedule: &SchedulePolicy) -> (Value, Vec<String>) {
    let mut lost = Vec::new();
    let (cron, every) = expression(name, &schedule.cron, "Nomad");
    lost.extend(every);
    let concurrency = schedule.concurrency.unwrap_or_default();
    if concurrency == Concurrency::Replace {
        lost.push(format!(
            "schedules.{name}.concurrency = 'replace: Nomad cannot stop a run for the next one; \
             ProhibitOverlap skips the next instead"
        ));
    }
    if schedule.catch_up.unwrap_or_default() == CatchUp::Last {
        lost.push(format!(
            "schedules.{name}.catch_up = 'last: Nomad does not run a periodic job it missed"
        ));
    }
    let (program, args) = schedule
        .command
        .split_first()
        .map_or(("", &[][..]), |(p, a)| (p.as_str(), a));
    let task = json!({ "Name": name, "Config": { "command": program, "args": args } });
    if let Some(ms) = schedule.timeout_ms {
        lost.push(format!(
            "schedules.{name}.timeout_ms: a Nomad batch task has no run deadline ({ms} ms)"
        ));
    }
    let mut periodic = json!({
        "Enabled": true,
        "SpecType": "cron",
        "Spec": cron,
        "ProhibitOverlap": concurrency != Concurrency::Allow,
    });
    if let Some(zone) = &schedule.zone {
        periodic["TimeZone"] = json!(zone);
    }
    let id = format!("{entry}-{name}");
    let job = json!({
        "Job": {
            "ID": id,
            "Name": id,
            "Type": "batch",
            "Meta": { "rollgate.entry": entry, "rollgate.schedule": name },
            "Periodic": periodic,
            "TaskGroups": [{ "Name": name, "Count": 1, "Tasks": [task] }],
        }
    });
    (job, lost)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_becomes_the_nearest_expression_and_says_when_it_is_not_exact() {
        assert_eq!(expression("a", "0 3 * * *", "K").0, "0 3 * * *");
        assert_eq!(
            expression("a", "@every 15m", "K"),
            ("*/15 * * * *".into(), None)
        );
        assert_eq!(
            expression("a", "@every 6h", "K"),
            ("0 */6 * * *".into(), None)
        );
        let (cron, lost) = expression("often", "@every 2s", "Kubernetes");
        assert_eq!(cron, "* * * * *");
        assert!(lost.unwrap().starts_with("schedules.often: `@every 2s`"));
        assert!(
            expression("a", "@every 7m", "K").1.is_some(),
            "7 does not divide 60"
        );
    }
}
