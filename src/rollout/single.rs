//! A single deploy (`rollgate deploy`) is the engine's one-replica case: one required slot on
//! the deploy's port, one wave, one surge place, the previous release kept as the proxy's
//! fallback through the watch, and the deploy's own log lines. This module holds what differs:
//! the plan of a deploy and the words of its lines. The executor does the rest.

use super::state::{Phase, Process, Rollout, Settings, Single, Slot, SlotState};
use super::step::Note;
use crate::deploy::journal::Event as LogEvent;
use crate::deploy::plan::Settings as DeploySettings;
use crate::deploy::state::{Pointer, ReplicaClass, Root};

/// A deploy's release deadline: none that a person waiting on an escalation could miss.
const NO_RELEASE_DEADLINE_S: f64 = 100.0 * 365.0 * 86_400.0;

/// What a single deploy is asked to do.
pub struct Asked<'a> {
    pub service: &'a str,
    pub version: &'a str,
    pub port: u16,
    pub settings: &'a DeploySettings,
    pub live: Option<&'a Pointer>,
    /// The deploy's token: the rollout's id, on every line of the deploy.
    pub token: String,
    pub now: f64,
}

/// The one-replica rollout a deploy runs.
pub fn plan(asked: &Asked) -> Rollout {
    let s = asked.settings;
    let previous = asked.live.map(|live| Process {
        version: live.version.clone(),
        port: live.port,
        pid: live.pid,
        start_time: live.start_time,
        token: String::new(),
    });
    // A first release is not watched: there is nothing to switch back to.
    let watch_ms = if previous.is_some() {
        s.watch.as_millis() as u64
    } else {
        0
    };
    Rollout {
        id: asked.token.clone(),
        service: asked.service.into(),
        from: previous.as_ref().map(|p| p.version.clone()),
        to: asked.version.into(),
        started_at: asked.now,
        phase: Phase::Running,
        settings: Settings {
            replicas: 1,
            surge: 1,
            unavailable: 0,
            progress_deadline_ms: s.deadline.as_millis() as u64,
            poll_ms: s.poll.as_millis() as u64,
            min_ready_ms: 0,
            soak_ms: 0,
            max_failure_ratio: 0.0,
            grace_ms: s.grace.as_millis() as u64,
            drain_ms: s.drain.as_millis() as u64,
            release_deadline: asked.now + NO_RELEASE_DEADLINE_S,
            ports: (asked.port, asked.port),
            wave_percents: vec![100],
            probe: s.probe.clone(),
            watch_ms,
            on_stall: s.on_stall,
            keep_fallback: true,
        },
        waves: vec![vec![0]],
        wave: 0,
        slots: vec![Slot {
            slot: 0,
            class: ReplicaClass::Required,
            state: SlotState::Pending,
            from_version: previous.as_ref().map(|p| p.version.clone()),
            live: previous.clone(),
            candidate: None,
            wave: Some(0),
            retiring: None,
            left_pool: false,
            started: None,
            finished: None,
            error: None,
            held: false,
            fallback: None,
        }],
        soak_until: None,
        pause_reason: None,
        abort_cause: None,
        signed: None,
        hooks: Default::default(),
        single: Some(Single {
            deployer_pid: std::process::id(),
            previous,
            deadline_source: s.deadline_source.to_string(),
            watch_failures: s.watch_failures,
            gate_detail: None,
            gate_elapsed_ms: None,
            last_probes: None,
            switch_detail: String::new(),
            watcher_pid: None,
            settled: false,
        }),
    }
}

/// What the executor saw while it acted, for the outcome's line.
#[derive(Debug, Default, Clone)]
pub struct Words {
    /// The previous release drained and stopped ("drained ...; old release v1 stopped
    /// (SIGTERM)"); None for a first release.
    pub retired: Option<String>,
    /// The watch ran (its fallback was dropped at the end).
    pub watched: bool,
    /// How an outcome was reached when it was not by this deployer ("(cut short: ...)").
    pub how: String,
    /// How the candidate was undone.
    pub reverted: Option<Reverted>,
    /// What stands in a rollback's line for the gate's last probes when a person decided.
    pub context: Option<String>,
}

#[derive(Debug, Clone)]
pub struct Reverted {
    /// Undone after the switch (the watch failed): the line says where it went back to.
    pub in_watch: bool,
    /// "old release v1 still answering", "switched back to v1", ...
    pub previous: String,
    /// "stopped (SIGTERM)", ...
    pub stopped: String,
}

/// One line of a single deploy.
#[derive(Debug, PartialEq)]
pub struct Line {
    pub event: LogEvent,
    pub detail: String,
    pub elapsed_ms: Option<u64>,
    pub phase: Option<&'static str>,
}

/// `candidate_started`, as a deploy has always said it.
pub fn started(rollout: &Rollout, process: &Process) -> String {
    let deadline_source = rollout
        .single
        .as_ref()
        .map_or("policy", |s| s.deadline_source.as_str());
    format!(
        "port {}; pid {}; deadline {} ms ({deadline_source}); poll {} ms",
        process.port, process.pid, rollout.settings.progress_deadline_ms, rollout.settings.poll_ms
    )
}

/// `switched`: the new release is in `current`, the previous one kept as its fallback.
pub fn switched(previous: &str, watch_ms: u64, drained: &str) -> String {
    format!(
        "switched from {previous}; watching for {watch_ms} ms with {previous} kept running; {}",
        drained.trim_end_matches("; ")
    )
}

/// The deploy's words for a planner's note, or None for the notes a deploy does not log
/// (a replica's progress, a wave's end: one replica, one wave).
pub fn line(
    note: &Note,
    rollout: &Rollout,
    words: &Words,
    root: &Root,
    output_tail: &str,
) -> Option<Line> {
    let single = rollout.single.as_ref()?;
    let gate_elapsed = single.gate_elapsed_ms;
    let last_probes = || {
        format!(
            "last probes: {}",
            single.last_probes.as_deref().unwrap_or("none")
        )
    };
    let with_output = |detail: String| match output_tail {
        "" => detail,
        tail => format!("{detail}; candidate output: {tail}"),
    };
    let slot = rollout.slot(0);
    match note.event {
        LogEvent::Promoted => {
            let gate = single.gate_detail.as_deref().unwrap_or_default();
            let detail = if words.watched {
                format!(
                    "{gate}; passed the watch{}; {}",
                    words.how,
                    single.switch_detail.trim_end_matches("; ")
                )
                .trim_end_matches("; ")
                .to_string()
            } else {
                format!("{gate}{}", single.switch_detail)
            };
            let retired = words.retired.as_deref().unwrap_or("first release");
            Some(Line {
                event: LogEvent::Promoted,
                detail: format!("{detail}; {retired}"),
                elapsed_ms: gate_elapsed,
                phase: None,
            })
        }
        LogEvent::RolledBack => {
            let reason = slot
                .error
                .clone()
                .or_else(|| rollout.abort_cause.as_ref().map(|c| c.reason.clone()))
                .unwrap_or_default();
            let reverted = words.reverted.clone().unwrap_or(Reverted {
                in_watch: false,
                previous: "no release was live".into(),
                stopped: "was already gone".into(),
            });
            let (detail, phase) = if reverted.in_watch {
                (
                    format!(
                        "{reason}{}; {}; candidate {}",
                        words.how, reverted.previous, reverted.stopped
                    ),
                    Some("watch"),
                )
            } else {
                let context = words.context.clone().unwrap_or_else(last_probes);
                (
                    format!(
                        "{reason}; {}; candidate {}; {context}",
                        reverted.previous, reverted.stopped
                    ),
                    None,
                )
            };
            Some(Line {
                event: LogEvent::RolledBack,
                detail: with_output(detail),
                elapsed_ms: gate_elapsed,
                phase,
            })
        }
        LogEvent::Escalated => {
            let held = slot.candidate.as_ref();
            Some(Line {
                event: LogEvent::Escalated,
                detail: format!(
                    "{}; left running on port {} (pid {}) for a person: rollgate promote {svc} --root {root} or rollgate abort {svc} --root {root}; {}",
                    note.detail,
                    held.map_or(rollout.settings.ports.0, |p| p.port),
                    held.map_or(0, |p| p.pid),
                    last_probes(),
                    svc = rollout.service,
                    root = root.0.display(),
                ),
                elapsed_ms: gate_elapsed,
                phase: None,
            })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn deploy_settings() -> DeploySettings {
        crate::deploy::plan::resolve_with_watch(Some(600), None, None, Some(2000), None)
            .expect("defaults resolve")
    }

    fn live() -> Pointer {
        Pointer {
            service: "edge-svc".into(),
            version: "v1".into(),
            port: 9001,
            pid: 41,
            start_time: 7,
            promoted_at: 1.0,
            fallback: None,
            probe: None,
        }
    }

    #[test]
    fn a_deploy_is_one_required_replica_on_its_port_kept_as_fallback_through_the_watch() {
        let settings = deploy_settings();
        let pointer = live();
        let r = plan(&Asked {
            service: "edge-svc",
            version: "v2",
            port: 9002,
            settings: &settings,
            live: Some(&pointer),
            token: "t1".into(),
            now: 100.0,
        });
        assert_eq!(
            (
                r.settings.replicas,
                r.settings.surge,
                r.settings.unavailable
            ),
            (1, 1, 0)
        );
        assert_eq!(r.settings.ports, (9002, 9002));
        assert_eq!(r.settings.watch_ms, 2000);
        assert!(r.settings.keep_fallback);
        assert_eq!(r.slot(0).class, ReplicaClass::Required);
        assert_eq!(r.slot(0).live.as_ref().map(|p| p.pid), Some(41));
        assert_eq!(r.from.as_deref(), Some("v1"));
        assert_eq!(r.settings.progress_deadline_ms, 600);
        assert_eq!(Duration::from_millis(r.settings.grace_ms), settings.grace);
        // A first release has nothing to watch for.
        let first = plan(&Asked {
            live: None,
            ..Asked {
                service: "edge-svc",
                version: "v1",
                port: 9002,
                settings: &settings,
                live: None,
                token: "t0".into(),
                now: 100.0,
            }
        });
        assert_eq!(first.settings.watch_ms, 0);
        assert!(first.slot(0).live.is_none());
    }

    #[test]
    fn the_outcome_lines_are_the_deploys_own() {
        let settings = deploy_settings();
        let pointer = live();
        let mut r = plan(&Asked {
            service: "edge-svc",
            version: "v2",
            port: 9002,
            settings: &settings,
            live: Some(&pointer),
            token: "t1".into(),
            now: 100.0,
        });
        let root = Root::new("/srv/edge".into());
        let single = r.single.as_mut().expect("a deploy");
        single.gate_detail = Some("ready after 412 ms (5 probes)".into());
        single.gate_elapsed_ms = Some(412);
        single.switch_detail = "drained by the proxy; ".into();
        let note = |event| Note {
            event,
            slot: None,
            wave: None,
            detail: String::new(),
        };
        let words = Words {
            retired: Some("drained by the proxy; old release v1 stopped (SIGTERM)".into()),
            watched: true,
            ..Words::default()
        };
        let promoted = line(&note(LogEvent::Promoted), &r, &words, &root, "").expect("a line");
        assert_eq!(
            promoted.detail,
            "ready after 412 ms (5 probes); passed the watch; drained by the proxy; drained by the proxy; old release v1 stopped (SIGTERM)"
        );
        assert_eq!(promoted.elapsed_ms, Some(412));

        r.slot_mut(0).error = Some("not ready after 600 ms".into());
        r.single.as_mut().expect("a deploy").last_probes = Some("HTTP 503".into());
        let words = Words {
            reverted: Some(Reverted {
                in_watch: false,
                previous: "old release v1 still answering".into(),
                stopped: "stopped (SIGTERM)".into(),
            }),
            ..Words::default()
        };
        let rolled_back =
            line(&note(LogEvent::RolledBack), &r, &words, &root, "bye").expect("a line");
        assert_eq!(
            rolled_back.detail,
            "not ready after 600 ms; old release v1 still answering; candidate stopped (SIGTERM); last probes: HTTP 503; candidate output: bye"
        );
        assert_eq!(rolled_back.phase, None);
        assert!(line(&note(LogEvent::ReplicaReady), &r, &words, &root, "").is_none());
        assert!(line(&note(LogEvent::WaveCompleted), &r, &words, &root, "").is_none());
    }
}
