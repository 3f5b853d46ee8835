//! A release's process types besides web, planned as slots of its run (issue 69): the
//! policy's `processes` resolved into each type's rules, the release's Procfile lines into the
//! slots they fill, and the live processes of the types (`formation.json`) into what each slot
//! replaces. Every process of the release is then one slot of the one planner: started by its
//! type's rule (beside its old one, or once the old one is gone), gated by its type's
//! readiness, swapped in, and — with the rest of the release — promoted or rolled back whole.

use std::collections::BTreeMap;

use super::state::{Kind, Process, Rollout, Slot, SlotState};
use crate::defaults;
use crate::host::fault::Fault;
use crate::host::launch::LaunchRecord;
use crate::host::probe::{Spec as ProbeSpec, Target};
use crate::host::state::{ReplicaClass, TypedProcess};
use crate::policy::{ProcessPolicy, ReadyKind, RolloutSettings};

/// One type's rules, resolved from `processes.TYPE` (or the defaults for a type the policy does
/// not name).
#[derive(Debug, Clone, PartialEq)]
pub struct TypeRules {
    pub replicas: usize,
    /// Its old processes stop before its new ones start (`overlap = false`, or a singleton).
    pub stop_first: bool,
    pub singleton: bool,
    pub min_ready_ms: u64,
    /// How it proves it is ready: `Up` (it stays up `min_ready_ms`), notify or exec.
    pub ready: ProbeSpec,
    pub grace_ms: Option<u64>,
}

impl Default for TypeRules {
    fn default() -> TypeRules {
        TypeRules::of(&ProcessPolicy::default())
    }
}

impl TypeRules {
    pub(super) fn of(policy: &ProcessPolicy) -> TypeRules {
        let timeout_ms = policy
            .ready
            .as_ref()
            .and_then(|r| r.timeout_ms)
            .unwrap_or(defaults::PROBE_TIMEOUT.as_millis() as u64);
        let target = match &policy.ready {
            None => Target::Up,
            Some(ready) => match (ready.kind, &ready.command) {
                (ReadyKind::Exec, Some(command)) => Target::Exec {
                    command: command.clone(),
                },
                _ => Target::Notify {
                    confirm: None,
                    watchdog_ms: None,
                    extend_max_ms: 0,
                },
            },
        };
        TypeRules {
            replicas: policy.count() as usize,
            stop_first: !policy.overlaps(),
            singleton: policy.is_singleton(),
            min_ready_ms: policy.min_ready_ms.unwrap_or(match policy.ready {
                None => defaults::PROCESS_MIN_READY_MS,
                Some(_) => 0,
            }),
            ready: ProbeSpec {
                target,
                timeout_ms,
                success_threshold: 1,
            },
            grace_ms: policy.stop_grace_ms,
        }
    }
}

/// The policy's `processes`, each checked again within the contract's bounds (a `.ncl` policy
/// need not apply the bundled contract); errors name the field.
pub fn rules_of(policy: Option<&RolloutSettings>) -> Result<BTreeMap<String, TypeRules>, Fault> {
    let mut rules = BTreeMap::new();
    let Some(processes) = policy.and_then(|p| p.processes.as_ref()) else {
        return Ok(rules);
    };
    for (name, asked) in processes {
        let field = |f: &str| format!("processes.{name}.{f}");
        let bad = |f: &str, why: String| Err(Fault::setting(&field(f), why));
        if name == "web" || name == "release" {
            return Err(Fault::setting(
                "processes",
                format!("processes.{name}: `{name}` is not a type the policy's processes may name (web has the policy's own fields; release runs once)"),
            ));
        }
        crate::host::names::check_name("process type", name)?;
        let replicas = asked.count();
        if replicas > 1000 || (asked.is_singleton() && replicas > 1) {
            return bad(
                "replicas",
                format!(
                    "{} is {replicas}; it must be 0 to 1000, and at most 1 for a singleton",
                    field("replicas")
                ),
            );
        }
        for (f, value) in [
            ("stop_grace_ms", asked.stop_grace_ms),
            ("min_ready_ms", asked.min_ready_ms),
        ] {
            if value.is_some_and(|ms| ms > 600_000) {
                return bad(f, format!("{} is above 600000", field(f)));
            }
        }
        if let Some(ready) = &asked.ready {
            let command_ok = ready
                .command
                .as_ref()
                .is_some_and(|c| !c.is_empty() && c.iter().all(|w| !w.is_empty()));
            if ready.kind == ReadyKind::Exec && !command_ok {
                return bad(
                    "ready.command",
                    format!(
                        "{} is required for an exec check: the program and its arguments",
                        field("ready.command")
                    ),
                );
            }
            if ready
                .timeout_ms
                .is_some_and(|ms| !(10..=60_000).contains(&ms))
            {
                return bad(
                    "ready.timeout_ms",
                    format!("{} must be 10 to 60000", field("ready.timeout_ms")),
                );
            }
        }
        rules.insert(name.clone(), TypeRules::of(asked));
    }
    Ok(rules)
}

/// The slots a release's types fill: each Procfile line besides `web:` and `release:` (name,
/// command), as many times as its type's replicas, started from the run's launch record with
/// the line as its command, its type's readiness and grace (and never the held socket, which
/// is web's). A policy naming a type the Procfile lacks is refused: it would run nothing.
pub fn kinds(
    lines: &[(String, String)],
    rules: &BTreeMap<String, TypeRules>,
    scaled: &BTreeMap<String, usize>,
    run: &LaunchRecord,
    stop_first_run: bool,
) -> Result<Vec<Kind>, String> {
    if let Some(missing) = rules
        .keys()
        .find(|name| !lines.iter().any(|(n, _)| n == *name))
    {
        return Err(format!(
            "the policy's processes.{missing} names a type the release's Procfile has no line for"
        ));
    }
    let mut kinds = Vec::new();
    for (name, command) in lines {
        let mut rule = rules.get(name).cloned().unwrap_or_default();
        // `rollgate scale` overrides the policy's count; a singleton stays one.
        if let Some(count) = scaled.get(name) {
            if rule.singleton && *count > 1 {
                return Err(format!(
                    "{name} is a singleton (processes.{name}.singleton): it cannot be scaled past 1"
                ));
            }
            rule.replicas = *count;
        }
        let launch = LaunchRecord {
            probe: rule.ready.clone(),
            listen: None,
            command: Some(vec!["/bin/sh".into(), "-c".into(), command.clone()]),
            grace_ms: rule.grace_ms,
            min_ready_ms: (rule.min_ready_ms > 0).then_some(rule.min_ready_ms),
            ..run.clone()
        };
        for index in 0..rule.replicas {
            kinds.push(Kind {
                process_type: name.clone(),
                index,
                // A run that changes the service's user stops everything first.
                stop_first: rule.stop_first || stop_first_run,
                min_ready_ms: rule.min_ready_ms,
                launch: launch.clone(),
            });
        }
    }
    if kinds.len() > MAX_TYPED_PROCESSES {
        return Err(format!(
            "the release's types would run {} processes ({}); at most {MAX_TYPED_PROCESSES} run beside web",
            kinds.len(),
            counts_of(&kinds)
        ));
    }
    Ok(kinds)
}

/// The most processes a release's types may run in all (each is a process tree and a keeper):
/// a Procfile's 32 types at a few each, not a thousand of each.
pub const MAX_TYPED_PROCESSES: usize = 256;

/// `worker 200, clock 1`: how many of each type, in order.
fn counts_of(kinds: &[Kind]) -> String {
    let mut counts: Vec<(&str, usize)> = Vec::new();
    for kind in kinds {
        match counts.last_mut() {
            Some((name, n)) if *name == kind.process_type => *n += 1,
            _ => counts.push((&kind.process_type, 1)),
        }
    }
    counts
        .iter()
        .map(|(name, n)| format!("{name} {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Adds the types' slots to a planned run, after web's: one per process the release runs
/// (replacing the live process of its type and place, if one runs — a scale of the types
/// keeps it, `Skipped`, when it already runs the version), each in its wave
/// ([`in_step`]: a deploy's one wave, or in step with a replica set's web),
/// and one surplus slot for each live process the release no longer has a place for (its type
/// gone or scaled down), which leaves before anything starts if its type is gone, once the
/// release is promoted if it was scaled down (`step::remove_surplus`).
pub fn add_slots(rollout: &mut Rollout, kinds: Vec<Kind>, live: &[TypedProcess]) {
    let web_waves = rollout.waves.clone();
    if rollout.waves.is_empty() {
        rollout.waves.push(Vec::new());
    }
    let mut placed = Vec::new();
    let counts: BTreeMap<String, usize> = kinds.iter().fold(BTreeMap::new(), |mut n, k| {
        *n.entry(k.process_type.clone()).or_default() += 1;
        n
    });
    for kind in kinds {
        let wave = in_step(kind.index, counts[&kind.process_type], &web_waves);
        let old = live
            .iter()
            .find(|p| p.process_type == kind.process_type && p.index == kind.index);
        placed.extend(old.map(TypedProcess::identity));
        let slot = rollout.slots.len();
        // A scale of the types keeps a process already on the version where it is.
        if let Some(old) = old.filter(|o| rollout.types_only && o.version == rollout.to) {
            rollout.slots.push(Slot {
                kind: Some(kind),
                ..Slot::new(
                    slot,
                    ReplicaClass::Required,
                    SlotState::Skipped,
                    Some(process_of(old)),
                )
            });
            continue;
        }
        rollout.waves[wave].push(slot);
        rollout.slots.push(Slot {
            wave: Some(wave),
            kind: Some(kind),
            ..Slot::new(
                slot,
                ReplicaClass::Required,
                SlotState::Pending,
                old.map(process_of),
            )
        });
    }
    for old in live.iter().filter(|p| !placed.contains(&p.identity())) {
        let slot = rollout.slots.len();
        rollout.slots.push(Slot {
            kind: Some(Kind {
                process_type: old.process_type.clone(),
                index: old.index,
                stop_first: false,
                min_ready_ms: 0,
                launch: old.launch.clone(),
            }),
            ..Slot::new(
                slot,
                ReplicaClass::Required,
                SlotState::Surplus,
                Some(process_of(old)),
            )
        });
    }
}

/// The wave a type's process `index` (of `count`) moves in: the first of web's waves after
/// which web's share on the new release is at least the type's would be with this process
/// moved — so no type is ever further along than web (a singleton moves in the last wave).
/// A deploy has one wave; a run that moves no web process puts every type in wave 0.
fn in_step(index: usize, count: usize, web_waves: &[Vec<usize>]) -> usize {
    let total: usize = web_waves.iter().map(Vec::len).sum();
    let mut moved = 0;
    for (wave, slots) in web_waves.iter().enumerate() {
        moved += slots.len();
        if moved * count >= (index + 1) * total {
            return wave;
        }
    }
    web_waves.len().saturating_sub(1)
}

/// A live process of another type as a run names it (it took no port).
fn process_of(p: &TypedProcess) -> Process {
    Process {
        version: p.version.clone(),
        port: 0,
        pid: p.pid,
        start_time: p.start_time,
        token: String::new(),
        launch: Some(p.launch.clone()),
    }
}
