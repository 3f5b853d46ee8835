//! The `candidate` record older rollgates wrote for a deploy in flight: read into the engine's
//! terms ([`from_candidate`]) so one recovery finishes both (the view the state writes of a
//! deploy is `state::candidate_view`). Pure: nothing here touches a file.

use super::state::{
    Phase, Process, Rollout, Settings, Single, Slot, SlotState, NO_RELEASE_DEADLINE_S,
};
use crate::host::state::{Candidate, Pointer, ReplicaClass, Stage};

/// The one-replica rollout a `candidate` record describes.
pub fn from_candidate(left: &Candidate, pointer: Option<&Pointer>) -> Rollout {
    let previous = left.previous.as_ref().map(|p| Process {
        version: p.version.clone(),
        port: p.port,
        pid: p.pid,
        start_time: p.start_time,
        token: String::new(),
    });
    let candidate = Process {
        version: left.version.clone(),
        port: left.port,
        pid: left.pid.unwrap_or(0),
        start_time: left.start_time.unwrap_or(0),
        token: left.token.clone(),
    };
    let switched = left
        .identity()
        .is_some_and(|i| pointer.is_some_and(|p| p.names(i)));
    let watching = left.stage == Stage::Watching;
    let mut slot = Slot {
        candidate: Some(candidate.clone()),
        wave: Some(0),
        started: Some(left.started_at),
        held: left.stage == Stage::Escalated,
        ..Slot::new(
            0,
            ReplicaClass::Required,
            SlotState::Upgrading,
            previous.clone(),
        )
    };
    if switched {
        slot.state = SlotState::Succeeded;
        slot.candidate = None;
        slot.live = Some(candidate);
        match watching {
            true => slot.fallback = previous.clone(),
            false => slot.retiring = previous.clone(),
        }
    }
    let watch = left.watch.as_ref();
    Rollout {
        id: left.token.clone(),
        service: left.service.clone(),
        from: previous.as_ref().map(|p| p.version.clone()),
        to: left.version.clone(),
        started_at: left.started_at,
        phase: match slot.held {
            true => Phase::Paused,
            false => Phase::Running,
        },
        settings: Settings {
            replicas: 1,
            surge: 1,
            unavailable: 0,
            progress_deadline_ms: 0,
            poll_ms: watch.map_or(crate::defaults::POLL.as_millis() as u64, |w| w.poll_ms),
            min_ready_ms: 0,
            soak_ms: 0,
            max_failure_ratio: 0.0,
            grace_ms: left.grace_ms,
            drain_ms: left.drain_ms,
            release_deadline: left.started_at + NO_RELEASE_DEADLINE_S,
            ports: (left.port, left.port),
            wave_percents: vec![100],
            probe: left.probe.clone(),
            watch_ms: 0,
            on_stall: crate::policy::OnStall::Rollback,
            keep_fallback: true,
            output: Default::default(),
            unconfined: false,
            limits: Default::default(),
            user: None,
            writable: Vec::new(),
            listen: None,
            analysis: None,
        },
        waves: vec![vec![0]],
        wave: 0,
        slots: vec![slot],
        soak_until: watch.filter(|_| watching && switched).map(|w| w.until),
        pause_reason: None,
        abort_cause: None,
        signed: left.signed.clone(),
        hooks: left.hooks.clone(),
        single: Some(Single {
            deployer_pid: left.deployer_pid,
            previous,
            deadline_source: String::new(),
            watch_failures: watch.map_or(1, |w| w.failures),
            gate_detail: watch.map(|w| w.gate_detail.clone()),
            gate_elapsed_ms: watch.map(|w| w.gate_elapsed_ms),
            last_probes: None,
            switch_detail: watch.map(|w| w.switch_detail.clone()).unwrap_or_default(),
            watcher_pid: watch.and_then(|w| w.watcher_pid),
            settled: false,
        }),
        unsettled: true,
        post_hook_started: false,
        last_analysis: None,
    }
}
