//! `policy export --format argo`: each service entry as an Argo Rollouts `Rollout`
//! (`argoproj.io/v1alpha1`) with a canary strategy whose steps are rollgate's waves.
//!
//! Argo's basic canary (no traffic router) reaches a step's weight by replica counts, rounded
//! its own way (`approximateWeightedCanaryStableReplicaCounts` in Argo's
//! `utils/replicaset/canary.go`): for each of rollgate's cumulative wave sizes the exporter picks
//! the `setWeight` whose rounding gives exactly that many canary replicas, then a `pause` of the
//! soak. With whole-number weights out of 100, more than 100 replicas leave some sizes out of
//! reach (waves of 1 % and 1 % on 500 replicas are 5 and 6; no weight gives 6): such a wave gets
//! the nearest weight and is listed as lost, and `--strict` refuses it.
//!
//! The budgets go through as replica counts from `engine::budgets::Budgets`, so Argo's own
//! rounding of percentages never enters, and a stall becomes `progressDeadlineAbort` ('rollback)
//! or a degraded rollout that waits for a person ('escalate).

use crate::defaults;
use serde_json::{json, Value};

use super::pod::{self, seconds_up};
use super::workload::{lost_everywhere, Document, Workload};
use super::Inexpressible;
use crate::engine::budgets::{wave_sizes, Budgets};
use crate::policy::{OnStall, RolloutSettings};

/// Argo's weights are out of this without a traffic router (`MaxTrafficWeight`).
const MAX_WEIGHT: u32 = 100;

/// The canary replicas Argo's basic canary runs at `weight` out of 100 for `replicas` replicas
/// with `surge` surge places: the count among floor and ceiling, over `replicas` or (when it
/// may surge) `replicas + 1`, whose share is nearest the weight; the first option wins a tie; a
/// weight strictly between 0 and 100 never rounds down to 0 unless nothing may surge on one
/// replica.
pub fn canary_replicas(replicas: u32, weight: u32, surge: u32) -> u32 {
    if replicas == 0 {
        return 0;
    }
    let (n, w, max) = (
        f64::from(replicas),
        f64::from(weight),
        f64::from(MAX_WEIGHT),
    );
    let exact = f64::from(replicas * weight) / max;
    let (ceil, floor) = (exact.ceil() as u32, exact.floor() as u32);
    let halfway = |total: f64| (total * (w / max)).fract() == 0.5;
    let zero_allowed = weight == MAX_WEIGHT || weight == 0 || (replicas == 1 && surge == 0);
    let mut options = Vec::with_capacity(4);
    if ceil < replicas || zero_allowed {
        options.push((ceil, replicas));
    }
    if !halfway(n) && (floor != 0 || zero_allowed) {
        options.push((floor, replicas));
    }
    if surge > 0 {
        options.push((ceil, replicas + 1));
        if !halfway(n + 1.0) && (floor != 0 || zero_allowed) {
            options.push((floor, replicas + 1));
        }
    }
    let distance =
        |(canary, total): (u32, u32)| (f64::from(canary * MAX_WEIGHT) / f64::from(total) - w).abs();
    let mut best = match options.first() {
        Some(first) => *first,
        None => return 0,
    };
    for option in options.into_iter().skip(1) {
        if distance(option) < distance(best) {
            best = option;
        }
    }
    best.0
}

/// The weight that brings `replicas` replicas to `canary` canaries, or, when none does, the
/// weight whose count comes nearest (then `Err` with it).
pub fn weight_for(replicas: u32, canary: u32, surge: u32) -> Result<u32, u32> {
    let ideal = f64::from(canary * MAX_WEIGHT) / f64::from(replicas.max(1));
    let by_closeness = |a: &u32, b: &u32| {
        (f64::from(*a) - ideal)
            .abs()
            .total_cmp(&(f64::from(*b) - ideal).abs())
            .then(a.cmp(b))
    };
    let exact = (1..MAX_WEIGHT)
        .filter(|w| canary_replicas(replicas, *w, surge) == canary)
        .min_by(by_closeness);
    if let Some(weight) = exact {
        return Ok(weight);
    }
    let nearest = (1..MAX_WEIGHT)
        .min_by_key(|w| {
            let got = canary_replicas(replicas, *w, surge);
            (got.abs_diff(canary), got < canary, *w)
        })
        .unwrap_or(1);
    Err(nearest)
}

/// The canary steps for the policy's waves: a `setWeight` per wave before the last (which is
/// Argo's promotion to all replicas), each followed by the soak when there is one; and the
/// waves Argo cannot reach exactly.
pub fn steps(
    replicas: u32,
    percents: &[u64],
    surge: u32,
    soak_ms: u64,
) -> (Vec<Value>, Vec<String>) {
    let (mut steps, mut lost) = (Vec::new(), Vec::new());
    let sizes = wave_sizes(replicas as usize, percents);
    for (index, size) in sizes.iter().enumerate() {
        let size = *size as u32;
        if size >= replicas {
            break;
        }
        let weight = match weight_for(replicas, size, surge) {
            Ok(weight) => weight,
            Err(nearest) => {
                lost.push(format!(
                    "wave {index} ({size} of {replicas} replicas): no Argo weight out of 100 \
                     gives {size}; setWeight {nearest} gives {}",
                    canary_replicas(replicas, nearest, surge)
                ));
                nearest
            }
        };
        steps.push(json!({ "setWeight": weight }));
        if soak_ms > 0 {
            steps.push(json!({ "pause": { "duration": format!("{}s", seconds_up(soak_ms)) } }));
        }
    }
    (steps, lost)
}

/// The Rollout for entry `name` read from `source`, or why Argo Rollouts would refuse it.
pub fn rollout(
    name: &str,
    settings: &RolloutSettings,
    workload: &Workload,
    source: &str,
) -> Result<Document, Inexpressible> {
    let replicas = settings.replicas.unwrap_or(1).max(1);
    let count = u32::try_from(replicas)
        .map_err(|_| Inexpressible::new(name, format!("replicas {replicas} is too many")))?;
    let budgets = Budgets::of(
        replicas as usize,
        settings.max_surge_pct,
        settings.max_unavailable_pct,
    );
    let deadline_s = seconds_up(settings.progress_deadline_ms);
    let min_ready_s = settings.min_ready_ms.map_or(0, |ms| ms.div_ceil(1000));
    if min_ready_s >= deadline_s {
        return Err(Inexpressible::new(
            name,
            format!(
                "min_ready_ms rounds up to {min_ready_s} s, not below \
                 progressDeadlineSeconds ({deadline_s} s); Argo Rollouts requires \
                 progressDeadlineSeconds > minReadySeconds"
            ),
        ));
    }
    let percents = settings.waves.clone().unwrap_or(defaults::WAVES.to_vec());
    let (steps, mut lost) = steps(
        count,
        &percents,
        budgets.surge as u32,
        settings.soak_ms.unwrap_or(0),
    );
    let (template, probe_lost) = pod::template(name, settings, workload, false)?;
    lost.extend(probe_lost);
    lost.extend(unexpressed(settings));
    let others: Vec<&str> = super::types::of(name, settings, workload)?
        .iter()
        .map(|t| t.name)
        .collect();
    if !others.is_empty() {
        lost.push(format!(
            "process types {}: an Argo Rollout runs the web process; export the others with \
             --format k8s",
            others.join(", ")
        ));
    }
    if let Some(schedules) = settings.schedules.as_ref().filter(|s| !s.is_empty()) {
        let names: Vec<&str> = schedules.keys().map(String::as_str).collect();
        lost.push(format!(
            "schedules {}: an Argo Rollout has no schedules; export their CronJobs with --format k8s",
            names.join(", ")
        ));
    }
    if super::types::release_phase(workload).is_some() {
        lost.push("the release phase: export its Job with --format k8s".into());
    }
    let object = pod::object_name(name);
    let mut annotations = json!({ "rollgate.dev/entry": name });
    if !lost.is_empty() {
        annotations["rollgate.dev/unexpressed"] = json!(lost.join("; "));
    }
    let rollout = json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Rollout",
        "metadata": { "name": object, "labels": pod::labels(name), "annotations": annotations },
        "spec": {
            "replicas": replicas,
            "minReadySeconds": min_ready_s,
            "progressDeadlineSeconds": deadline_s,
            "progressDeadlineAbort": settings.on_stall == OnStall::Rollback,
            "selector": { "matchLabels": pod::labels(name) },
            "template": template,
            "strategy": {
                "canary": {
                    "maxSurge": budgets.surge,
                    "maxUnavailable": budgets.unavailable,
                    "steps": steps,
                },
            },
        },
    });
    let fragment = if workload.image.is_none() {
        " Without --image it names no image: set one before applying it."
    } else {
        ""
    };
    Ok(Document {
        text: format!(
            "---\n# rollgate policy `{name}` from {source} as Argo Rollout {object}.{fragment}\n\
             # Seconds are rounded up; each setWeight moves exactly one of rollgate's waves.\n{}",
            super::yaml::document(&rollout)
        ),
        lost,
    })
}

/// What a Rollout cannot say of the policy (waves and probe aside).
fn unexpressed(settings: &RolloutSettings) -> Vec<String> {
    let mut lost = Vec::new();
    if settings.max_failure_ratio.is_some() {
        lost.push(
            "max_failure_ratio: Argo Rollouts judges a failure ratio only through an analysis \
             with a metrics provider; a canary Pod that never becomes ready stalls the step"
                .into(),
        );
    }
    if settings.classes.is_some() {
        lost.push("classes: Argo Rollouts has no required or left-behind Pods".into());
    }
    if settings.release_deadline_ms.is_some() {
        lost.push(
            "release_deadline_ms: Argo Rollouts has only the per-step progress deadline".into(),
        );
    }
    if settings.watch_ms.unwrap_or(0) > 0 {
        lost.push("watch_ms: Argo Rollouts does not watch after the last step".into());
    }
    lost.extend(lost_everywhere(settings, "Argo Rollouts"));
    lost
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Rows of Argo's own table test for its rounding
    /// (`TestApproximateWeightedNewStableReplicaCounts`): replicas, weight, surge, canary.
    const ARGO_ROWS: &[(u32, u32, u32, u32)] = &[
        (1, 1, 0, 0),
        (1, 49, 0, 0),
        (1, 50, 0, 1),
        (1, 1, 1, 1),
        (1, 99, 1, 1),
        (2, 1, 0, 1),
        (2, 99, 0, 1),
        (2, 1, 1, 1),
        (2, 99, 1, 2),
        (3, 10, 0, 1),
        (3, 49, 0, 1),
        (3, 50, 0, 2),
        (3, 33, 1, 1),
        (3, 49, 1, 2),
        (10, 14, 0, 1),
        (10, 15, 0, 2),
        (10, 99, 0, 9),
        (10, 1, 1, 1),
        (10, 18, 1, 2),
        (10, 23, 1, 2),
        (10, 24, 1, 3),
        (10, 99, 1, 10),
        (10, 100, 1, 10),
        (10, 0, 1, 0),
    ];

    #[test]
    fn rounds_as_argos_own_table_says() {
        for &(replicas, weight, surge, canary) in ARGO_ROWS {
            assert_eq!(
                canary_replicas(replicas, weight, surge),
                canary,
                "replicas {replicas}, weight {weight}, surge {surge}"
            );
        }
    }

    #[test]
    fn ten_replicas_in_the_default_waves() {
        let (steps, lost) = steps(10, &defaults::WAVES, 3, 2500);
        assert!(lost.is_empty(), "{lost:?}");
        let weights: Vec<u64> = steps
            .iter()
            .filter_map(|s| s["setWeight"].as_u64())
            .collect();
        // Waves of 1, 2 and 5 canaries, then Argo's promotion to all 10.
        assert_eq!(weights.len(), 3);
        let counts: Vec<u32> = weights
            .iter()
            .map(|w| canary_replicas(10, *w as u32, 3))
            .collect();
        assert_eq!(counts, [1, 2, 5]);
        assert_eq!(steps[1]["pause"]["duration"], "3s");
    }

    #[test]
    fn an_unreachable_wave_is_said() {
        let (_, lost) = steps(500, &[1, 2], 0, 0);
        // 500 replicas: waves of 5 and 10 are reachable; 1 % then 1 % is 5 then 6, and 6 is not.
        assert!(lost.is_empty(), "{lost:?}");
        let (_, lost) = steps(500, &[1, 1], 0, 0);
        assert_eq!(lost.len(), 1, "{lost:?}");
        assert!(lost[0].starts_with("wave 1 (6 of 500"), "{lost:?}");
    }

    proptest! {
        /// For any replica count the contract allows up to 500 and any waves: every exported
        /// weight is rounded by Argo to exactly rollgate's wave size, or the wave is listed as
        /// lost; up to 100 replicas nothing is lost.
        #[test]
        fn argos_rounding_of_the_weights_gives_rollgates_waves(
            replicas in 1u32..=500,
            percents in proptest::collection::vec(1u64..=100, 1..6),
            surge_pct in 0u64..=100,
            unavailable_pct in 0u64..=100,
        ) {
            let surge = Budgets::of(replicas as usize, surge_pct, unavailable_pct).surge as u32;
            let (steps, lost) = steps(replicas, &percents, surge, 0);
            let sizes = wave_sizes(replicas as usize, &percents);
            prop_assert_eq!(steps.len(), sizes.len() - 1);
            for (index, step) in steps.iter().enumerate() {
                let weight = step["setWeight"].as_u64().unwrap() as u32;
                prop_assert!((1..100).contains(&weight));
                let got = canary_replicas(replicas, weight, surge) as usize;
                let said = lost.iter().any(|l| l.starts_with(&format!("wave {index} (")));
                prop_assert!(got == sizes[index] || said, "wave {index}: {got} != {}", sizes[index]);
                prop_assert!(!(got == sizes[index] && said));
            }
            if replicas <= 100 {
                prop_assert!(lost.is_empty(), "{lost:?}");
            }
        }
    }
}
