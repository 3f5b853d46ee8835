//! The Pod template a Kubernetes Deployment and an Argo Rollout share: one container whose
//! readiness probe is the policy's probe, and the labels that select it.

use serde_json::{json, Value};

use super::workload::Workload;
use super::Inexpressible;
use crate::host::probe::{Spec, Target};
use crate::policy::RolloutSettings;

/// Kubernetes counts probe periods and timeouts in whole seconds, at least one.
const MIN_PROBE_MS: u64 = 1000;

/// Milliseconds to whole seconds, rounded up, at least 1: Kubernetes counts in seconds and a
/// period or deadline of 0 means "default" or "invalid", never "faster".
pub fn seconds_up(ms: u64) -> u64 {
    ms.div_ceil(1000).max(1)
}

/// Kubernetes object names are DNS labels: `edge_svc` becomes `edge-svc`.
pub fn object_name(entry: &str) -> String {
    entry.replace('_', "-").to_lowercase()
}

/// The labels that tie the workload to its Pods.
pub fn labels(entry: &str) -> Value {
    json!({ "app.kubernetes.io/name": object_name(entry) })
}

/// The labels of one process type's workload: beside web's, each selects its own Pods only.
pub fn labels_of(entry: &str, process_type: &str) -> Value {
    let mut labels = labels(entry);
    labels["app.kubernetes.io/component"] = json!(object_name(process_type));
    labels
}

/// The web Pods' labels: the entry's, and its component once other types run beside it.
pub fn web_labels(entry: &str, beside_others: bool) -> Value {
    match beside_others {
        true => labels_of(entry, "web"),
        false => labels(entry),
    }
}

/// The Pod template for `entry` (`beside_others`: other process types run beside it), and what of the policy's probe it could not express.
pub fn template(
    entry: &str,
    settings: &RolloutSettings,
    workload: &Workload,
    beside_others: bool,
) -> Result<(Value, Vec<String>), Inexpressible> {
    let spec = match &settings.probe {
        Some(policy) => {
            Spec::from_policy(policy).map_err(|e| Inexpressible::new(entry, e.to_string()))?
        }
        None => Spec::default(),
    };
    let mut lost = Vec::new();
    let mut container = json!({
        "name": object_name(entry),
        "ports": [{ "name": "http", "containerPort": workload.port, "protocol": "TCP" }],
        "env": [{ "name": "PORT", "value": workload.port.to_string() }],
    });
    if let Some(image) = &workload.image {
        container["image"] = json!(image);
    }
    if let Some(command) = super::types::web(workload) {
        container["command"] = super::workload::shell(command);
    }
    let target = match &spec.target {
        Target::Notify {
            confirm: Some(confirm),
            ..
        } => {
            lost.push(
                "probe kind 'notify: Kubernetes has no readiness by notification; the Pod is \
                 ready when its confirmation probe passes"
                    .into(),
            );
            Some(confirm.as_ref())
        }
        Target::Notify { confirm: None, .. } => {
            lost.push(
                "probe kind 'notify: Kubernetes has no readiness by notification; the Pod is \
                 ready as soon as it runs (add a confirm probe)"
                    .into(),
            );
            None
        }
        other => Some(other),
    };
    if let Some(target) = target {
        let (handler, handler_lost) = handler(target);
        lost.extend(handler_lost);
        let mut probe = handler;
        if settings.poll_ms < MIN_PROBE_MS || spec.timeout_ms < MIN_PROBE_MS {
            lost.push(format!(
                "poll_ms {} / probe.timeout_ms {}: Kubernetes probes at most every second, each \
                 given at least a second",
                settings.poll_ms, spec.timeout_ms
            ));
        }
        probe["periodSeconds"] = json!(seconds_up(settings.poll_ms));
        probe["timeoutSeconds"] = json!(seconds_up(spec.timeout_ms));
        probe["successThreshold"] = json!(spec.success_threshold.max(1));
        container["readinessProbe"] = probe;
    }
    let template = json!({
        "metadata": { "labels": web_labels(entry, beside_others) },
        "spec": { "containers": [container] },
    });
    Ok((template, lost))
}

/// A probe handler for one target (never a notify one), and what of it Kubernetes cannot check.
fn handler(target: &Target) -> (Value, Vec<String>) {
    let mut lost = Vec::new();
    let handler = match target {
        Target::Http {
            path,
            host,
            status_min,
            status_max,
        } => {
            // Kubernetes' httpGet passes on any status from 200 to 399.
            if (*status_min, *status_max) != (200, 399) {
                lost.push(format!(
                    "probe status {status_min}-{status_max}: a Kubernetes httpGet probe passes \
                     on 200-399"
                ));
            }
            let mut get = json!({ "path": path, "port": "http", "scheme": "HTTP" });
            if let Some(host) = host {
                get["httpHeaders"] = json!([{ "name": "Host", "value": host }]);
            }
            json!({ "httpGet": get })
        }
        Target::Tcp => json!({ "tcpSocket": { "port": "http" } }),
        Target::Exec { command } => json!({ "exec": { "command": command } }),
        // A confirmation is http or tcp; the contract allows nothing deeper. A policy's probe is
        // never `Up` (that is a worker's readiness, not web's).
        Target::Notify { .. } | Target::Up => json!({}),
    };
    (handler, lost)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_round_up_and_never_reach_zero() {
        assert_eq!(seconds_up(1500), 2);
        assert_eq!(seconds_up(1000), 1);
        assert_eq!(seconds_up(100), 1);
        assert_eq!(seconds_up(600000), 600);
        assert_eq!(seconds_up(0), 1);
    }

    #[test]
    fn names_are_dns_labels() {
        assert_eq!(object_name("Edge_Svc"), "edge-svc");
    }
}
