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
use super::workload::{lost_everywhere, Document, Workload};
use super::Inexpressible;
use crate::engine::budgets::wave_sizes;
use crate::policy::{OnStall, RolloutSettings};

/// The Deployment for entry `name` read from `source`, or why Kubernetes would refuse it.
pub fn deployment(
    name: &str,
    settings: &RolloutSettings,
    workload: &Workload,
    source: &str,
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
    let (template, mut lost) = pod::template(name, settings, workload)?;
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
        "selector": { "matchLabels": pod::labels(name) },
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
        "metadata": { "name": object, "labels": pod::labels(name), "annotations": annotations },
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
        }
    }

    #[test]
    fn renders_the_example_policy() {
        let doc = deployment("edge_svc", &edge(), &workload(), "policy.ncl").unwrap();
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
        let err = deployment("edge_svc", &settings, &workload(), "p")
            .unwrap_err()
            .to_string();
        assert!(err.contains("both 0"), "{err}");
    }
}
