//! `policy export --format nomad`: each service entry of a policy as the part of a Nomad job
//! that says how it is updated (the task group's `Update` block) and proven healthy (its
//! service `Check`, from the probe), in Nomad's JSON job form, to merge into a job.
//!
//! Nomad's rules are applied here rather than left for `nomad job run` to refuse:
//! `MaxParallel` >= 1, durations positive (`MinHealthyTime` may be 0), `MinHealthyTime` below
//! `HealthyDeadline`, `ProgressDeadline` above `HealthyDeadline`. What Nomad cannot say is
//! named in the job's `Meta` and returned, for the caller to list on stderr.

use crate::defaults;
use serde_json::{json, Value};

use super::types;
use super::workload::Workload;
use super::Inexpressible;
use crate::engine::budgets::{wave_sizes, Budgets};
use crate::host::probe::{Spec, Target};
use crate::policy::{OnStall, RolloutSettings};

const NS_PER_MS: u64 = 1_000_000;
/// Nomad's shortest check interval and timeout.
const MIN_CHECK_MS: u64 = 1000;
/// Nomad's own default progress deadline (10 min); used when the policy sets no release
/// deadline and the gate's deadline is below it.
const DEFAULT_PROGRESS_DEADLINE_MS: u64 = 600_000;

/// One entry's job fragment, and what it could not express.
#[derive(Debug)]
pub struct Job {
    pub json: Value,
    pub lost: Vec<String>,
}

/// The job fragment for entry `name`, or why Nomad would refuse it.
pub fn job(
    name: &str,
    settings: &RolloutSettings,
    workload: &Workload,
) -> Result<Job, Inexpressible> {
    let refused = |why: String| Inexpressible::new(name, why);
    let replicas = settings.replicas.unwrap_or(1).max(1) as usize;
    let budgets = Budgets::of(
        replicas,
        settings.max_surge_pct,
        settings.max_unavailable_pct,
    );
    let percents = settings.waves.clone().unwrap_or(defaults::WAVES.to_vec());
    let waves = wave_sizes(replicas, &percents);
    let canary = waves.first().copied().unwrap_or(1);
    let healthy_ms = settings.progress_deadline_ms;
    let min_healthy_ms = settings.min_ready_ms.unwrap_or(0);
    if healthy_ms == 0 {
        return Err(refused(
            "progress_deadline_ms must be above 0 for Nomad's HealthyDeadline".to_string(),
        ));
    }
    if min_healthy_ms >= healthy_ms {
        return Err(refused(format!(
            "min_ready_ms ({min_healthy_ms}) must be below progress_deadline_ms ({healthy_ms}): Nomad requires MinHealthyTime < HealthyDeadline"
        )));
    }
    let progress_ms = match settings.release_deadline_ms {
        Some(ms) if ms > healthy_ms => ms,
        Some(ms) => {
            return Err(refused(format!(
                "release_deadline_ms ({ms}) must be above progress_deadline_ms ({healthy_ms}): Nomad requires ProgressDeadline > HealthyDeadline"
            )))
        }
        None => DEFAULT_PROGRESS_DEADLINE_MS.max(healthy_ms * 2),
    };
    let mut lost = Vec::new();
    if waves.len() > 2 {
        lost.push(format!(
            "waves {percents:?}: Nomad runs a canary of {canary}, then {} at a time",
            budgets.in_flight()
        ));
    }
    if settings.soak_ms.unwrap_or(0) > 0 {
        lost.push("soak_ms: Nomad does not wait between groups of allocations".into());
    }
    if settings.max_failure_ratio.is_some() {
        lost.push("max_failure_ratio: Nomad stops at the first unhealthy allocation".into());
    }
    if settings.classes.is_some() {
        lost.push("classes: Nomad has no required or left-behind allocations".into());
    }
    if settings.watch_ms.unwrap_or(0) > 0 {
        lost.push("watch_ms: Nomad does not watch after a deployment succeeds".into());
    }
    if settings.on_stall == OnStall::Escalate {
        lost.push("on_stall = 'escalate: Nomad fails the deployment (AutoRevert is off)".into());
    }
    lost.extend(super::workload::lost_everywhere(settings, "Nomad"));
    let probe = match &settings.probe {
        Some(policy) => {
            Spec::from_policy(policy).map_err(|e| Inexpressible::new(name, e.to_string()))?
        }
        None => Spec::default(),
    };
    let (check, probe_lost) = check(&probe, settings.poll_ms);
    lost.extend(probe_lost);
    let mut meta = serde_json::Map::new();
    meta.insert("rollgate.entry".into(), json!(name));
    let mut service = json!({ "Name": name, "PortLabel": "http" });
    if let Some(check) = check {
        service["Checks"] = json!([check]);
    }
    let mut web = json!({
                "Name": name,
                "Count": replicas,
                "Update": {
                    "MaxParallel": budgets.in_flight(),
                    "Canary": canary,
                    "HealthCheck": "checks",
                    "MinHealthyTime": min_healthy_ms * NS_PER_MS,
                    "HealthyDeadline": healthy_ms * NS_PER_MS,
                    "ProgressDeadline": progress_ms * NS_PER_MS,
                    "AutoRevert": settings.on_stall == OnStall::Rollback,
                    "AutoPromote": false,
                },
                "Services": [service],
    });
    let mut tasks = Vec::new();
    if let Some(command) = types::release_phase(workload) {
        lost.push(
            "the release phase: a Nomad prestart task runs in every web allocation as it \
             starts, not once per deploy (keep it safe to run twice)"
                .into(),
        );
        tasks.push(task(
            "release",
            command,
            json!({ "Lifecycle": { "Hook": "prestart", "Sidecar": false } }),
        ));
    }
    if let Some(command) = types::web(workload) {
        tasks.push(task("web", command, json!({})));
    }
    if !tasks.is_empty() {
        web["Tasks"] = json!(tasks);
    }
    let mut groups = vec![web];
    let deadlines = (healthy_ms, progress_ms);
    for process_type in types::of(name, settings, workload)? {
        let (group, group_lost) = process_group(name, &process_type, deadlines, settings)?;
        groups.push(group);
        lost.extend(group_lost);
    }
    if !lost.is_empty() {
        meta.insert("rollgate.unexpressed".into(), json!(lost.join("; ")));
    }
    let json = json!({
        "Job": { "ID": name, "Name": name, "Type": "service", "Meta": meta, "TaskGroups": groups }
    });
    Ok(Job { json, lost })
}

/// A task running a Procfile command, with `extra` fields.
fn task(name: &str, command: &str, extra: Value) -> Value {
    let mut task = json!({
        "Name": name,
        "Config": { "command": "/bin/sh", "args": ["-c", command] },
    });
    if let (Some(task), Some(extra)) = (task.as_object_mut(), extra.as_object()) {
        task.extend(extra.clone());
    }
    task
}

/// One process type's task group: its count, its stop rule (overlap: canaries for all of its
/// allocations, promoted once healthy, then the old ones stop; stop-first and a singleton:
/// Nomad's rolling update, which stops an allocation before it places the next), judged by its
/// task's state for `min_ready_ms`.
fn process_group(
    name: &str,
    process_type: &types::Type,
    (healthy_ms, progress_ms): (u64, u64),
    settings: &RolloutSettings,
) -> Result<(Value, Vec<String>), Inexpressible> {
    let policy = &process_type.policy;
    let field = format!("processes.{}", process_type.name);
    let mut lost = Vec::new();
    let count = policy.count();
    let min_healthy_ms = policy.min_ready_ms.unwrap_or(match policy.ready {
        Some(_) => 0,
        None => defaults::PROCESS_MIN_READY_MS,
    });
    if min_healthy_ms >= healthy_ms {
        return Err(Inexpressible::new(
            name,
            format!(
                "{field}.min_ready_ms ({min_healthy_ms}) must be below progress_deadline_ms \
                 ({healthy_ms}): Nomad requires MinHealthyTime < HealthyDeadline"
            ),
        ));
    }
    if policy.ready.is_some() {
        lost.push(format!(
            "{field}.ready: Nomad judges a group without a service by its task's state"
        ));
    }
    if policy.is_singleton() {
        lost.push(format!(
            "{field}.singleton: Nomad stops the old allocation first in an update, but a lost \
             node's allocation may be replaced while it still runs"
        ));
    }
    let overlap = policy.overlaps() && count > 0;
    let grace_ms = policy
        .stop_grace_ms
        .unwrap_or(defaults::GRACE.as_millis() as u64);
    let group = json!({
        "Name": process_type.name,
        "Count": count,
        "Update": {
            "MaxParallel": if overlap { count } else { 1 },
            "Canary": if overlap { count } else { 0 },
            "AutoPromote": overlap,
            "HealthCheck": "task_states",
            "MinHealthyTime": min_healthy_ms * NS_PER_MS,
            "HealthyDeadline": healthy_ms * NS_PER_MS,
            "ProgressDeadline": progress_ms * NS_PER_MS,
            "AutoRevert": settings.on_stall == OnStall::Rollback,
        },
        "Tasks": [task(
            process_type.name,
            process_type.command,
            json!({ "KillTimeout": grace_ms * NS_PER_MS }),
        )],
    });
    Ok((group, lost))
}

/// The service check a probe becomes, and what of it Nomad cannot check.
fn check(probe: &Spec, poll_ms: u64) -> (Option<Value>, Vec<String>) {
    let mut lost = Vec::new();
    if probe.success_threshold > 1 {
        lost.push(format!(
            "probe.success_threshold = {}: a Nomad check passes at its first success",
            probe.success_threshold
        ));
    }
    // Nomad refuses a check interval or timeout under a second.
    if poll_ms < MIN_CHECK_MS || probe.timeout_ms < MIN_CHECK_MS {
        lost.push(format!(
            "poll_ms {poll_ms} / probe.timeout_ms {}: Nomad checks at most every second, each given at least a second",
            probe.timeout_ms
        ));
    }
    let timing = |mut check: Value| {
        check["Interval"] = json!(poll_ms.max(MIN_CHECK_MS) * NS_PER_MS);
        check["Timeout"] = json!(probe.timeout_ms.max(MIN_CHECK_MS) * NS_PER_MS);
        check
    };
    let check = match &probe.target {
        Target::Http {
            path,
            host,
            status_min,
            status_max,
        } => {
            if (*status_min, *status_max) != (200, 299) && (*status_min, *status_max) != (200, 200)
            {
                lost.push(format!(
                    "probe status {status_min}-{status_max}: a Nomad http check passes on any 2xx"
                ));
            }
            let mut check =
                json!({ "Name": "ready", "Type": "http", "Path": path, "PortLabel": "http" });
            if let Some(host) = host {
                check["Header"] = json!({ "Host": [host] });
            }
            Some(timing(check))
        }
        Target::Tcp => Some(timing(
            json!({ "Name": "ready", "Type": "tcp", "PortLabel": "http" }),
        )),
        Target::Exec { command } => {
            let (program, args) = command
                .split_first()
                .map_or(("", &[][..]), |(p, a)| (p.as_str(), a));
            Some(timing(
                json!({ "Name": "ready", "Type": "script", "Command": program, "Args": args }),
            ))
        }
        Target::Notify { .. } => {
            lost.push("probe kind 'notify: Nomad has no readiness by notification".into());
            None
        }
        // Never a policy's probe: a worker's readiness, judged by its task's state.
        Target::Up => None,
    };
    (check, lost)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn settings(replicas: u64, surge: u64, unavailable: u64, deadline: u64) -> RolloutSettings {
        serde_json::from_value(json!({
            "progress_deadline_ms": deadline, "poll_ms": 100,
            "max_unavailable_pct": unavailable, "max_surge_pct": surge,
            "on_stall": "rollback", "replicas": replicas,
        }))
        .unwrap()
    }

    fn bare() -> Workload {
        Workload {
            image: None,
            port: defaults::EXPORT_PORT,
            strict: false,
            procfile: None,
        }
    }

    /// Nomad's documented rules for an update block.
    fn follows_nomads_rules(update: &Value) -> Result<(), String> {
        let n = |field: &str| {
            update[field]
                .as_u64()
                .ok_or(format!("{field} is not a whole number"))
        };
        if n("MaxParallel")? < 1 {
            return Err("MaxParallel < 1".into());
        }
        if n("HealthyDeadline")? == 0 || n("ProgressDeadline")? == 0 {
            return Err("a deadline is not positive".into());
        }
        if n("MinHealthyTime")? >= n("HealthyDeadline")? {
            return Err("MinHealthyTime >= HealthyDeadline".into());
        }
        if n("ProgressDeadline")? <= n("HealthyDeadline")? {
            return Err("ProgressDeadline <= HealthyDeadline".into());
        }
        Ok(())
    }

    #[test]
    fn ten_replicas_in_the_default_waves() {
        let job = job("edge_svc", &settings(10, 25, 25, 1500), &bare()).unwrap();
        let update = &job.json["Job"]["TaskGroups"][0]["Update"];
        assert_eq!(update["MaxParallel"], 5);
        assert_eq!(update["Canary"], 1);
        assert_eq!(update["HealthyDeadline"], 1_500_000_000u64);
        assert_eq!(update["ProgressDeadline"], 600_000_000_000u64);
        assert_eq!(update["AutoRevert"], true);
        let check = &job.json["Job"]["TaskGroups"][0]["Services"][0]["Checks"][0];
        assert_eq!(check["Type"], "http");
        assert_eq!(check["Path"], "/readyz");
        // A 100 ms poll is below Nomad's shortest interval: a second, and said.
        assert_eq!(check["Interval"], 1_000_000_000u64);
        assert!(
            job.lost.iter().any(|l| l.starts_with("poll_ms 100")),
            "{:?}",
            job.lost
        );
        assert!(
            job.lost.iter().any(|l| l.starts_with("waves")),
            "{:?}",
            job.lost
        );
        follows_nomads_rules(update).unwrap();
    }

    #[test]
    fn the_rules_catch_a_broken_block_and_bad_policies_are_refused() {
        let mut broken = job("s", &settings(3, 0, 0, 1000), &bare()).unwrap().json;
        broken["Job"]["TaskGroups"][0]["Update"]["ProgressDeadline"] = json!(1);
        assert!(follows_nomads_rules(&broken["Job"]["TaskGroups"][0]["Update"]).is_err());
        let mut slow = settings(3, 25, 0, 1000);
        slow.min_ready_ms = Some(1000);
        assert!(job("s", &slow, &bare())
            .unwrap_err()
            .to_string()
            .contains("MinHealthyTime < HealthyDeadline"));
        let mut short = settings(3, 25, 0, 5000);
        short.release_deadline_ms = Some(4000);
        assert!(job("s", &short, &bare())
            .unwrap_err()
            .to_string()
            .contains("ProgressDeadline > HealthyDeadline"));
    }

    proptest! {
        #[test]
        fn every_exported_update_block_follows_nomads_rules(
            replicas in 1u64..=500,
            surge in 0u64..=100,
            unavailable in 0u64..=100,
            deadline in 1u64..=86_400_000,
            min_ready in 0u64..=600_000,
            release in proptest::option::of(1_000u64..=86_400_000),
        ) {
            let mut s = settings(replicas, surge, unavailable, deadline);
            s.min_ready_ms = Some(min_ready);
            s.release_deadline_ms = release;
            if let Ok(job) = job("s", &s, &bare()) {
                let update = &job.json["Job"]["TaskGroups"][0]["Update"];
                prop_assert!(follows_nomads_rules(update).is_ok(), "{update}");
                prop_assert_eq!(update["Canary"].as_u64(), Some(wave_sizes(replicas as usize, &defaults::WAVES)[0] as u64));
            } else {
                // Refused only for what Nomad would refuse.
                prop_assert!(min_ready >= deadline || release.is_some_and(|r| r <= deadline));
            }
        }
    }
}
