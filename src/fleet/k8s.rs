//! `policy export --format k8s`: each service entry as a Kubernetes Deployment whose rolling
//! update, deadlines and readiness probe are the policy's.
//!
//! The budgets go through as percentages: Kubernetes rounds them as rollgate does (surge up,
//! unavailable down; see `engine::budgets::Budgets`). Kubernetes' own rules are applied here rather
//! than left for `kubectl apply` to refuse: not both budgets 0, and `progressDeadlineSeconds`
//! above `minReadySeconds`.

use crate::defaults;
use serde_json::{json, Value};

use super::pod::{self, seconds_up};
use super::workload::{lost_everywhere, shell, Document, Workload};
use super::Inexpressible;
use crate::engine::budgets::wave_sizes;
use crate::policy::{OnStall, ReadyKind, RolloutSettings};

/// Entry `name`'s objects: the release phase's Job (when the Procfile has one), web's
/// Deployment, then a Deployment per other process type (issue 69).
pub fn documents(
    name: &str,
    settings: &RolloutSettings,
    workload: &Workload,
    source: &str,
) -> Result<Document, Inexpressible> {
    let types = super::types::of(name, settings, workload)?;
    let mut text = String::new();
    let mut lost = Vec::new();
    if let Some(command) = super::types::release_phase(workload) {
        text.push_str(&release_job(name, settings, workload, command));
    }
    let web = deployment(name, settings, workload, source, !types.is_empty())?;
    text.push_str(&web.text);
    lost.extend(web.lost);
    for process_type in &types {
        let (yaml, type_lost) = process_deployment(name, settings, workload, process_type)?;
        text.push_str(&yaml);
        lost.extend(type_lost);
    }
    for (schedule_name, schedule) in settings.schedules.iter().flatten() {
        let (object, schedule_lost) =
            super::schedules::cron_job(name, schedule_name, schedule, workload)?;
        text.push_str(&format!(
            "---\n# Schedule `{schedule_name}` of `{name}` as a CronJob.\n{}",
            super::yaml::document(&object)
        ));
        lost.extend(schedule_lost);
    }
    Ok(Document { text, lost })
}

/// The release phase as a Job, not an init container: an init container would run it in every
/// Pod, at once, on each restart; a Job runs it once per release, and Argo CD's PreSync hook runs
/// it (and waits for it) before the Deployments change. Applied by hand: apply the Job first and
/// `kubectl wait --for=condition=complete` on it.
fn release_job(
    name: &str,
    settings: &RolloutSettings,
    workload: &Workload,
    command: &str,
) -> String {
    let object = format!("{}-release", pod::object_name(name));
    let timeout_ms = settings
        .hooks
        .as_ref()
        .and_then(|h| h.timeout_ms)
        .unwrap_or(defaults::HOOK_TIMEOUT.as_millis() as u64);
    let mut container = json!({ "name": "release", "command": shell(command) });
    if let Some(image) = &workload.image {
        container["image"] = json!(image);
    }
    let job = json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": object,
            "labels": pod::labels_of(name, "release"),
            "annotations": {
                "argocd.argoproj.io/hook": "PreSync",
                "argocd.argoproj.io/hook-delete-policy": "BeforeHookCreation",
            },
        },
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": seconds_up(timeout_ms),
            "template": {
                "metadata": { "labels": pod::labels_of(name, "release") },
                "spec": { "restartPolicy": "Never", "containers": [container] },
            },
        },
    });
    format!(
        "---\n# The release phase of `{name}`: run once per release, before the Deployments \
         change (apply it first, then kubectl wait --for=condition=complete job/{object}).\n{}",
        super::yaml::document(&job)
    )
}

/// One process type's Deployment: its count, its stop rule (overlap: a rolling update that
/// adds before it removes; stop-first and a singleton: Recreate), its readiness, its grace.
fn process_deployment(
    name: &str,
    settings: &RolloutSettings,
    workload: &Workload,
    process_type: &super::types::Type,
) -> Result<(String, Vec<String>), Inexpressible> {
    let policy = &process_type.policy;
    let field = format!("processes.{}", process_type.name);
    let mut lost = Vec::new();
    let object = format!(
        "{}-{}",
        pod::object_name(name),
        pod::object_name(process_type.name)
    );
    let labels = pod::labels_of(name, process_type.name);
    let mut container = json!({
        "name": pod::object_name(process_type.name),
        "command": shell(process_type.command),
    });
    if let Some(image) = &workload.image {
        container["image"] = json!(image);
    }
    let min_ready_ms = match &policy.ready {
        Some(ready) => {
            match (ready.kind, &ready.command) {
                (ReadyKind::Exec, Some(command)) => {
                    let timeout = ready.timeout_ms.unwrap_or(defaults::PROBE_TIMEOUT.as_millis() as u64);
                    container["readinessProbe"] = json!({
                        "exec": { "command": command },
                        "periodSeconds": seconds_up(settings.poll_ms),
                        "timeoutSeconds": seconds_up(timeout),
                    });
                }
                _ => lost.push(format!(
                    "{field}.ready 'notify: Kubernetes has no readiness by notification; its Pods are ready once they have run minReadySeconds"
                )),
            }
            policy.min_ready_ms.unwrap_or(0)
        }
        None => policy
            .min_ready_ms
            .unwrap_or(defaults::PROCESS_MIN_READY_MS),
    };
    let min_ready_s = min_ready_ms.div_ceil(1000);
    let deadline_s = seconds_up(settings.progress_deadline_ms);
    if min_ready_s >= deadline_s {
        return Err(Inexpressible::new(
            name,
            format!(
                "{field}.min_ready_ms rounds up to {min_ready_s} s, not below progressDeadlineSeconds ({deadline_s} s); Kubernetes requires progressDeadlineSeconds > minReadySeconds"
            ),
        ));
    }
    let strategy = if policy.overlaps() {
        json!({ "type": "RollingUpdate",
                 "rollingUpdate": { "maxUnavailable": "0%", "maxSurge": "100%" } })
    } else {
        json!({ "type": "Recreate" })
    };
    if policy.is_singleton() {
        lost.push(format!(
            "{field}.singleton: Recreate stops the old Pod before a rollout starts the new one, but a Pod deleted by hand or on a lost node may be replaced while it still runs"
        ));
    }
    let grace_ms = policy
        .stop_grace_ms
        .unwrap_or(defaults::GRACE.as_millis() as u64);
    let deployment = json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": { "name": object, "labels": labels },
        "spec": {
            "replicas": policy.count(),
            "minReadySeconds": min_ready_s,
            "progressDeadlineSeconds": deadline_s,
            "selector": { "matchLabels": labels },
            "strategy": strategy,
            "template": {
                "metadata": { "labels": labels },
                "spec": {
                    "terminationGracePeriodSeconds": grace_ms.div_ceil(1000),
                    "containers": [container],
                },
            },
        },
    });
    let text = format!(
        "---\n# Process type `{}` of `{name}` (its Procfile line) as Deployment {object}.\n{}",
        process_type.name,
        super::yaml::document(&deployment)
    );
    Ok((text, lost))
}

/// The Deployment for entry `name` read from `source` (`beside_others`: other process types
/// run beside its web Pods), or why Kubernetes would refuse it.
fn deployment(
    name: &str,
    settings: &RolloutSettings,
    workload: &Workload,
    source: &str,
    beside_others: bool,
) -> Result<Document, Inexpressible> {
    if settings.max_unavailable_pct == 0 && settings.max_surge_pct == 0 {
        return Err(Inexpressible::new(
            name,
            "max_unavailable_pct and max_surge_pct are both 0; Kubernetes refuses a \
             rolling update that may neither add nor remove a Pod (set one of them above 0)",
        ));
    }
    let deadline_s = seconds_up(settings.progress_deadline_ms);
    let min_ready_s = settings.min_ready_ms.map_or(0, |ms| ms.div_ceil(1000));
    if min_ready_s >= deadline_s {
        return Err(Inexpressible::new(
            name,
            format!(
                "min_ready_ms rounds up to {min_ready_s} s, not below \
                 progressDeadlineSeconds ({deadline_s} s); Kubernetes requires \
                 progressDeadlineSeconds > minReadySeconds"
            ),
        ));
    }
    let (template, mut lost) = pod::template(name, settings, workload, beside_others)?;
    let labels = pod::web_labels(name, beside_others);
    lost.extend(unexpressed(settings));
    let object = pod::object_name(name);
    let mut annotations = json!({
        "rollgate.dev/on-stall": match settings.on_stall {
            OnStall::Rollback => "rollback",
            OnStall::Escalate => "escalate",
        },
        "rollgate.dev/progress-deadline-ms": settings.progress_deadline_ms.to_string(),
    });
    if !lost.is_empty() {
        annotations["rollgate.dev/unexpressed"] = json!(lost.join("; "));
    }
    let mut spec = json!({
        "minReadySeconds": min_ready_s,
        "progressDeadlineSeconds": deadline_s,
        "selector": { "matchLabels": labels },
        "strategy": {
            "type": "RollingUpdate",
            "rollingUpdate": {
                "maxUnavailable": format!("{}%", settings.max_unavailable_pct),
                "maxSurge": format!("{}%", settings.max_surge_pct),
            },
        },
        "template": template,
    });
    if let Some(replicas) = settings.replicas {
        spec["replicas"] = json!(replicas);
    }
    let deployment: Value = json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": { "name": object, "labels": labels, "annotations": annotations },
        "spec": spec,
    });
    let fragment = if workload.image.is_none() {
        " Without --image it names no image: merge it into yours."
    } else {
        ""
    };
    Ok(Document {
        text: format!(
            "---\n# rollgate policy `{name}` from {source} as Deployment {object}.{fragment}\n\
             # Seconds are rounded up.\n{}",
            super::yaml::document(&deployment)
        ),
        lost,
    })
}

/// What a Deployment cannot say of the policy (its probe aside).
fn unexpressed(settings: &RolloutSettings) -> Vec<String> {
    let mut lost = Vec::new();
    let replicas = settings.replicas.unwrap_or(1) as usize;
    let percents = settings.waves.clone().unwrap_or(defaults::WAVES.to_vec());
    if wave_sizes(replicas, &percents).len() > 1 {
        lost.push(format!(
            "waves {percents:?}: a Deployment moves by maxSurge and maxUnavailable, not in waves"
        ));
    }
    if settings.soak_ms.unwrap_or(0) > 0 {
        lost.push("soak_ms: a Deployment does not wait between steps".into());
    }
    if settings.max_failure_ratio.is_some() {
        lost.push("max_failure_ratio: a Deployment stops at Pods that do not become ready".into());
    }
    if settings.classes.is_some() {
        lost.push("classes: Kubernetes has no required or left-behind Pods".into());
    }
    if settings.release_deadline_ms.is_some() {
        lost.push(
            "release_deadline_ms: a Deployment has only the per-step progress deadline".into(),
        );
    }
    if settings.watch_ms.unwrap_or(0) > 0 {
        lost.push("watch_ms: Kubernetes does not watch after a rollout completes".into());
    }
    if settings.on_stall == OnStall::Rollback {
        lost.push(
            "on_stall = 'rollback: a Deployment past its deadline is marked failed, not rolled \
             back (kubectl rollout undo)"
                .into(),
        );
    }
    lost.extend(lost_everywhere(settings, "Kubernetes"));
    lost
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::defaults;

    fn edge() -> RolloutSettings {
        serde_json::from_value(json!({"progress_deadline_ms": 1500, "poll_ms": 100,
            "max_unavailable_pct": 0, "max_surge_pct": 100, "on_stall": "rollback"}))
        .unwrap()
    }

    fn workload() -> Workload {
        Workload {
            image: None,
            port: defaults::EXPORT_PORT,
            strict: false,
            procfile: None,
        }
    }

    #[test]
    fn renders_the_example_policy() {
        let doc = deployment("edge_svc", &edge(), &workload(), "policy.ncl", false).unwrap();
        let yaml = doc.text;
        assert!(yaml.contains("\n  name: \"edge-svc\"\n"), "{yaml}");
        assert!(yaml.contains("progressDeadlineSeconds: 2\n"));
        assert!(yaml.contains("maxUnavailable: \"0%\"\n"));
        assert!(yaml.contains("maxSurge: \"100%\"\n"));
        assert!(yaml.contains("periodSeconds: 1\n"));
        assert!(yaml.contains("rollgate.dev/on-stall: \"rollback\"\n"));
        assert!(yaml.contains("path: \"/readyz\"\n"), "{yaml}");
        assert!(doc.lost.iter().any(|l| l.starts_with("on_stall")));
    }

    #[test]
    fn refuses_a_policy_with_no_room_to_roll() {
        let mut settings = edge();
        settings.max_surge_pct = 0;
        let err = deployment("edge_svc", &settings, &workload(), "p", false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("both 0"), "{err}");
    }
}
