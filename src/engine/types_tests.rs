//! The tests of `types.rs`: a release's types moving with web through the planner (`step`),
//! from a deploy the planner made (`plan`). Apart from `types.rs` so that it never names
//! `plan.rs`, which names it (issue 81: the only circle inside a room).

use std::collections::BTreeMap;

use super::state::{Kind, Process, Rollout, SlotState};
use super::types::*;
use crate::engine::plan::tests::{live, planned};
use crate::engine::state::Phase;
use crate::engine::step::tests::starts;
use crate::engine::step::{step, Action, Event};
use crate::host::launch::LaunchRecord;
use crate::host::probe::Target;
use crate::host::state::TypedProcess;
use crate::policy::{ProcessPolicy, RolloutSettings};

fn old(process_type: &str, index: usize, pid: i32) -> TypedProcess {
    TypedProcess {
        process_type: process_type.into(),
        index,
        version: "v1".into(),
        port: None,
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

/// A crash after the worker's old process was recorded leaving (out of the pool, its stop
/// decided) and before it stopped: the recovery, which sees the switch, has it stopped — its
/// keeper killed with the deployer, nothing else would (the formation's random-kill test).
#[test]
fn an_old_process_recorded_leaving_when_the_deployer_died_goes_at_the_switch_seen() {
    let mut r = release();
    let old_worker = r.slot(1).live.clone();
    assert!(old_worker.is_some());
    step(&mut r, Event::Tick, 100.0);
    step(&mut r, Event::Ready { slot: 0 }, 101.0);
    step(&mut r, Event::Ready { slot: 1 }, 102.0);
    step(&mut r, Event::Ready { slot: 2 }, 103.0);
    step(&mut r, Event::Tick, 106.0);
    assert_eq!(r.phase, Phase::Completed);
    // The executor's retire of the worker's old process: recorded leaving, saved — and killed
    // before the stop.
    r.slot_mut(1).retiring = old_worker;
    let recovered = step(&mut r, Event::SwitchSeen { slot: 0 }, 110.0);
    assert!(
        recovered.contains(&Action::DropFallback { slot: 1 }),
        "{recovered:?}"
    );
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
