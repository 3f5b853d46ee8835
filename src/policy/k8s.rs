//! The policy as Kubernetes Deployment fields, for services that outgrow one host.
//!
//! Pure: takes the exported policy, returns YAML text. Kubernetes' own rules are applied here
//! rather than left for `kubectl apply` to refuse later.

use serde_json::Value;

/// One service's policy fields, as exported.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub name: String,
    pub progress_deadline_ms: u64,
    pub poll_ms: u64,
    pub max_unavailable_pct: u64,
    pub max_surge_pct: u64,
    pub on_stall: String,
    pub replicas: Option<u64>,
    pub min_ready_ms: Option<u64>,
}

/// Why a policy cannot be expressed as a Deployment.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum K8sError {
    #[error("the policy has no service entries (records with `progress_deadline_ms`)")]
    NoEntries,
    #[error("`{entry}`: field `{field}` is missing or not a whole number")]
    BadField { entry: String, field: &'static str },
    #[error(
        "`{0}`: max_unavailable_pct and max_surge_pct are both 0; Kubernetes refuses a rolling \
         update that may neither add nor remove a Pod (set one of them above 0)"
    )]
    NoRoomToRoll(String),
    #[error(
        "`{0}`: min_ready_ms rounds up to {1} s, not below progressDeadlineSeconds ({2} s); \
         Kubernetes requires progressDeadlineSeconds > minReadySeconds"
    )]
    MinReadyNotBelowDeadline(String, u64, u64),
}

/// Finds the service entries: each top-level record holding `progress_deadline_ms`, or the whole
/// document when it is a single policy (then named `fallback_name`).
pub fn entries(exported: &Value, fallback_name: &str) -> Result<Vec<Entry>, K8sError> {
    let Some(top) = exported.as_object() else {
        return Err(K8sError::NoEntries);
    };
    if top.contains_key("progress_deadline_ms") {
        return Ok(vec![entry(fallback_name, exported)?]);
    }
    let found: Vec<Entry> = top
        .iter()
        .filter(|(_, v)| v.get("progress_deadline_ms").is_some())
        .map(|(name, v)| entry(name, v))
        .collect::<Result<_, _>>()?;
    if found.is_empty() {
        return Err(K8sError::NoEntries);
    }
    Ok(found)
}

fn entry(name: &str, v: &Value) -> Result<Entry, K8sError> {
    let number = |field: &'static str| {
        v.get(field)
            .and_then(Value::as_u64)
            .ok_or(K8sError::BadField {
                entry: name.to_string(),
                field,
            })
    };
    Ok(Entry {
        name: name.to_string(),
        progress_deadline_ms: number("progress_deadline_ms")?,
        poll_ms: number("poll_ms")?,
        max_unavailable_pct: number("max_unavailable_pct")?,
        max_surge_pct: number("max_surge_pct")?,
        on_stall: v
            .get("on_stall")
            .and_then(Value::as_str)
            .ok_or(K8sError::BadField {
                entry: name.to_string(),
                field: "on_stall",
            })?
            .to_string(),
        replicas: v.get("replicas").and_then(Value::as_u64),
        min_ready_ms: v.get("min_ready_ms").and_then(Value::as_u64),
    })
}

/// Milliseconds to whole seconds, rounded up, at least 1: Kubernetes counts in seconds and a
/// period or deadline of 0 means "default" or "invalid", never "faster".
pub fn seconds_up(ms: u64) -> u64 {
    ms.div_ceil(1000).max(1)
}

/// Kubernetes object names are DNS labels: `edge_svc` becomes `edge-svc`.
fn object_name(entry: &str) -> String {
    entry.replace('_', "-").to_lowercase()
}

/// One YAML document per entry, each a Deployment fragment for `kubectl patch --patch-file` or
/// a merge into a manifest. `minReadySeconds` is `min_ready_ms` rounded up (0 without it), and
/// Kubernetes' rule `progressDeadlineSeconds > minReadySeconds` is checked here. `replicas`
/// becomes `spec.replicas` when the policy sets it.
pub fn render(entries: &[Entry], source: &str) -> Result<String, K8sError> {
    let mut out = String::new();
    for e in entries {
        if e.max_unavailable_pct == 0 && e.max_surge_pct == 0 {
            return Err(K8sError::NoRoomToRoll(e.name.clone()));
        }
        let name = object_name(&e.name);
        let quoted = serde_json::to_string(&name).expect("string");
        let deadline_s = seconds_up(e.progress_deadline_ms);
        let min_ready_s = e.min_ready_ms.map_or(0, |ms| ms.div_ceil(1000));
        if min_ready_s >= deadline_s {
            return Err(K8sError::MinReadyNotBelowDeadline(
                e.name.clone(),
                min_ready_s,
                deadline_s,
            ));
        }
        let replicas = e
            .replicas
            .map_or(String::new(), |n| format!("\x20 replicas: {n}\n"));
        out.push_str(&format!(
            "---\n\
             # rollgate policy `{entry}` from {source}: merge into Deployment {name}\n\
             # (kubectl patch deployment {name} --patch-file FILE). Seconds are rounded up.\n\
             apiVersion: apps/v1\n\
             kind: Deployment\n\
             metadata:\n\
             \x20 name: {quoted}\n\
             \x20 annotations:\n\
             \x20   rollgate.dev/on-stall: {on_stall}\n\
             \x20   rollgate.dev/progress-deadline-ms: \"{deadline_ms}\"\n\
             spec:\n\
             {replicas}\
             \x20 minReadySeconds: {min_ready_s}\n\
             \x20 progressDeadlineSeconds: {deadline_s}\n\
             \x20 strategy:\n\
             \x20   type: RollingUpdate\n\
             \x20   rollingUpdate:\n\
             \x20     maxUnavailable: \"{unavailable}%\"\n\
             \x20     maxSurge: \"{surge}%\"\n\
             \x20 template:\n\
             \x20   spec:\n\
             \x20     containers:\n\
             \x20     - name: {quoted}\n\
             \x20       readinessProbe:\n\
             \x20         periodSeconds: {period_s}\n",
            entry = e.name,
            on_stall = serde_json::to_string(&e.on_stall).expect("string"),
            deadline_ms = e.progress_deadline_ms,
            unavailable = e.max_unavailable_pct,
            surge = e.max_surge_pct,
            period_s = seconds_up(e.poll_ms),
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn edge() -> Value {
        json!({"edge_svc": {"progress_deadline_ms": 1500, "poll_ms": 100,
            "max_unavailable_pct": 0, "max_surge_pct": 100, "on_stall": "rollback", "max_polls": 15}})
    }

    #[test]
    fn seconds_round_up_and_never_reach_zero() {
        assert_eq!(seconds_up(1500), 2);
        assert_eq!(seconds_up(1000), 1);
        assert_eq!(seconds_up(100), 1);
        assert_eq!(seconds_up(600000), 600);
        assert_eq!(seconds_up(0), 1);
    }

    #[test]
    fn renders_the_example_policy() {
        let yaml = render(&entries(&edge(), "x").unwrap(), "policy.ncl").unwrap();
        assert!(yaml.contains("  name: \"edge-svc\"\n"), "{yaml}");
        assert!(yaml.contains("progressDeadlineSeconds: 2\n"));
        assert!(yaml.contains("maxUnavailable: \"0%\"\n"));
        assert!(yaml.contains("maxSurge: \"100%\"\n"));
        assert!(yaml.contains("periodSeconds: 1\n"));
        assert!(yaml.contains("rollgate.dev/on-stall: \"rollback\"\n"));
    }

    #[test]
    fn refuses_a_policy_with_no_room_to_roll() {
        let mut v = edge();
        v["edge_svc"]["max_surge_pct"] = json!(0);
        let err = render(&entries(&v, "x").unwrap(), "p").unwrap_err();
        assert_eq!(err, K8sError::NoRoomToRoll("edge_svc".into()));
    }

    #[test]
    fn a_bare_policy_is_one_entry() {
        let v = edge()["edge_svc"].clone();
        let found = entries(&v, "bad").unwrap();
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].name, "bad");
    }
}
