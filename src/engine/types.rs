//! A release's process types besides web, planned as slots of its run (issue 69): the
//! policy's `processes` resolved into each type's rules, the release's Procfile lines into the
//! slots they fill, and the live processes of the types (`processes.json`) into what each slot
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
    fn of(policy: &ProcessPolicy) -> TypeRules {
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
/// (replacing the live process of its type and place, if one runs), each in its wave
/// ([`in_step`]: a deploy's one wave, or in step with a replica set's web),
/// and one surplus slot for each live process the release no longer has a place for (its type
/// gone or scaled down), which leaves before anything starts.
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::plan::tests::{live, planned};
    use crate::engine::state::Phase;
    use crate::engine::step::tests::starts;
    use crate::engine::step::{step, Action, Event};

    fn old(process_type: &str, index: usize, pid: i32) -> TypedProcess {
        TypedProcess {
            process_type: process_type.into(),
            index,
            version: "v1".into(),
            pid,
            start_time: 5,
            launch: LaunchRecord::default(),
        }
    }

    /// A worker (overlap, `workers` of them) and a singleton clock.
    fn worker_and_clock(workers: usize) -> Vec<Kind> {
        let mut rules = BTreeMap::new();
        rules.insert(
            "clock".to_string(),
            TypeRules::of(&ProcessPolicy {
                singleton: Some(true),
                ..Default::default()
            }),
        );
        let lines = [
            ("worker".to_string(), "work".to_string()),
            ("clock".to_string(), "tick".to_string()),
        ];
        let scaled = BTreeMap::from([("worker".to_string(), workers)]);
        kinds(&lines, &rules, &scaled, &LaunchRecord::default(), false).unwrap()
    }

    /// v1 → v2 of web, a worker (overlap) and a singleton clock, v1's worker and clock live;
    /// plus v1's `gone.0`, a type v2 no longer has.
    fn release() -> Rollout {
        let kinds = worker_and_clock(1);
        let mut r = planned("v2", Some(&live()), "t1");
        add_slots(
            &mut r,
            kinds,
            &[
                old("worker", 0, 51),
                old("clock", 0, 52),
                old("gone", 0, 53),
            ],
        );
        r
    }

    #[test]
    fn the_types_are_slots_web_switches_last_and_the_singleton_is_stopped_last() {
        let mut r = release();
        assert_eq!(r.waves, vec![vec![0, 1, 2]]);
        assert_eq!(r.slot(3).state, SlotState::Surplus, "gone.0 has no place");
        assert_eq!(
            r.slot(1)
                .kind
                .as_ref()
                .unwrap()
                .launch
                .command
                .as_ref()
                .unwrap()[2],
            "work"
        );
        assert_eq!(
            r.slot(1).kind.as_ref().unwrap().launch.probe.target,
            Target::Up
        );
        let first = step(&mut r, Event::Tick, 100.0);
        assert!(first.contains(&Action::Remove { slot: 3 }), "{first:?}");
        // Web and the worker start; the clock waits for them.
        assert_eq!(starts(&first), vec![0, 1]);
        // Web ready first: it waits for the other types.
        let actions = step(&mut r, Event::Ready { slot: 0 }, 101.0);
        assert!(
            actions.iter().all(|a| !matches!(a, Action::Swap { .. })),
            "{actions:?}"
        );
        assert!(r.slot(0).gated);
        // The worker ready: in, its old one kept running; now the clock, in place.
        let actions = step(&mut r, Event::Ready { slot: 1 }, 102.0);
        assert!(
            actions.contains(&Action::Swap {
                slot: 1,
                keep_previous: true
            }),
            "{actions:?}"
        );
        assert!(
            actions.contains(&Action::StartInPlace { slot: 2 }),
            "{actions:?}"
        );
        // The clock ready: in, and web switches last.
        let actions = step(&mut r, Event::Ready { slot: 2 }, 103.0);
        let swaps: Vec<usize> = actions
            .iter()
            .filter_map(|a| match a {
                Action::Swap { slot, .. } => Some(*slot),
                _ => None,
            })
            .collect();
        assert_eq!(swaps, vec![2, 0]);
    }

    /// A replica set of four (waves 1, 10, 50, 100 %: one replica each, surge 1) with two
    /// workers and a clock: each type moves in step with web (a worker once half of web has
    /// moved, the other and the clock with the last wave), no web replica waits on a type, the
    /// clock starts last — and a clock that fails there takes every moved replica back.
    #[test]
    fn a_replica_set_moves_each_type_in_step_with_web_and_goes_back_whole() {
        use crate::engine::step::tests::{rollout, run_all_ready};
        let olds = [
            old("worker", 0, 51),
            old("worker", 1, 52),
            old("clock", 0, 53),
        ];
        let mut r = rollout(4, 25, 0, 0);
        add_slots(&mut r, worker_and_clock(2), &olds);
        assert_eq!(r.waves, vec![vec![0], vec![1, 4], vec![2], vec![3, 5, 6]]);
        let (order, _) = run_all_ready(&mut r);
        assert_eq!(r.phase, Phase::Completed);
        assert_eq!(order, vec![0, 1, 4, 2, 3, 5, 6], "the clock last");
        assert!(r.slots.iter().all(|s| s.state == SlotState::Succeeded));

        let mut r = rollout(4, 25, 0, 0);
        add_slots(&mut r, worker_and_clock(2), &olds);
        let mut now = 0.0;
        let mut actions = step(&mut r, Event::Tick, now);
        loop {
            // What the executor records as it starts a slot's new process.
            for slot in starts(&actions) {
                r.slot_mut(slot).candidate = Some(Process {
                    version: "v2".into(),
                    port: 0,
                    pid: 60 + slot as i32,
                    start_time: 9,
                    token: "t".into(),
                    launch: None,
                });
            }
            if actions.contains(&Action::StartInPlace { slot: 6 }) {
                break;
            }
            let upgrading = r.slots.iter().find(|s| s.state == SlotState::Upgrading);
            let slot = upgrading.map(|s| s.slot).unwrap();
            now += 1.0;
            actions = step(&mut r, Event::Ready { slot }, now);
            assert!(
                r.slots.iter().all(|s| !s.gated),
                "web never waits on a type"
            );
        }
        let reason = "exited with exit status: 1".to_string();
        let actions = step(&mut r, Event::Failed { slot: 6, reason }, now + 1.0);
        assert_eq!(r.phase, Phase::Aborted);
        for web in 0..4 {
            assert!(
                actions.contains(&Action::Restore { slot: web }),
                "{actions:?}"
            );
        }
        for typed in [4, 5, 6] {
            assert!(
                actions.contains(&Action::Revert { slot: typed }),
                "{actions:?}"
            );
        }
    }

    #[test]
    fn a_failing_worker_rolls_the_release_back_whole_and_never_touches_the_clock() {
        let mut r = release();
        step(&mut r, Event::Tick, 100.0);
        step(&mut r, Event::Ready { slot: 0 }, 101.0);
        let reason = "exited with exit status: 3".to_string();
        let actions = step(&mut r, Event::Failed { slot: 1, reason }, 102.0);
        assert!(actions.contains(&Action::Revert { slot: 1 }), "{actions:?}");
        assert!(actions.contains(&Action::Revert { slot: 0 }), "{actions:?}");
        assert_eq!(
            starts(&actions),
            Vec::<usize>::new(),
            "the clock never starts"
        );
        assert_eq!(r.slot(2).state, SlotState::Pending);
        assert_eq!(r.phase, Phase::Aborted);
        assert_eq!(
            r.abort_cause.as_ref().unwrap().reason,
            "process worker.0 failed: exited with exit status: 3"
        );
    }

    #[test]
    fn in_the_watch_a_failure_switches_every_type_back_to_its_kept_process() {
        let mut r = release();
        // What the executor records as it starts each slot's new process (the clock's old one
        // retired first).
        let started = |r: &mut Rollout, slot: usize| {
            let s = r.slot_mut(slot);
            if s.kind.as_ref().is_some_and(|k| k.stop_first) {
                s.live = None;
            }
            s.candidate = Some(Process {
                version: "v2".into(),
                port: 0,
                pid: 60 + slot as i32,
                start_time: 9,
                token: format!("t1-{slot}"),
                launch: None,
            });
        };
        step(&mut r, Event::Tick, 100.0);
        started(&mut r, 0);
        started(&mut r, 1);
        step(&mut r, Event::Ready { slot: 0 }, 101.0);
        step(&mut r, Event::Ready { slot: 1 }, 102.0);
        started(&mut r, 2);
        step(&mut r, Event::Ready { slot: 2 }, 103.0);
        assert!(r.slot(1).fallback.is_some(), "the old worker runs on");
        let reason = "not answering".to_string();
        let actions = step(&mut r, Event::Failed { slot: 0, reason }, 104.0);
        // Web and the worker switch back to what they kept; the clock's old one is gone, so
        // it is restored (started again once its new one is stopped).
        assert!(actions.contains(&Action::Revert { slot: 0 }), "{actions:?}");
        assert!(actions.contains(&Action::Revert { slot: 1 }), "{actions:?}");
        assert!(
            actions.contains(&Action::Restore { slot: 2 }),
            "{actions:?}"
        );
    }

    #[test]
    fn a_policy_naming_a_type_the_procfile_lacks_is_refused_and_a_singleton_of_two_too() {
        let mut rules = BTreeMap::new();
        rules.insert("clock".to_string(), TypeRules::default());
        let lines = [("worker".to_string(), "work".to_string())];
        let err = kinds(
            &lines,
            &rules,
            &BTreeMap::new(),
            &LaunchRecord::default(),
            false,
        )
        .unwrap_err();
        assert!(err.contains("processes.clock"), "{err}");
        let policy: RolloutSettings = serde_json::from_value(serde_json::json!({
            "progress_deadline_ms": 1000, "poll_ms": 100, "max_unavailable_pct": 0,
            "max_surge_pct": 100, "on_stall": "rollback",
            "processes": {"clock": {"singleton": true, "replicas": 2}}}))
        .unwrap();
        let err = rules_of(Some(&policy)).unwrap_err().to_string();
        assert!(err.contains("processes.clock.replicas is 2"), "{err}");
    }
}
