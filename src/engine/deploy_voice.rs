//! A deploy's voice: the words of `rollgate deploy`'s log lines (`candidate_started`,
//! `switched`, `promoted`, `rolled_back`, `escalated`, as deploys have always said them) and
//! the few ways a deploy behaves apart from a rollout (see `voice`'s `Behaviour`).

use super::state::{Process, Rollout};
use super::step::Note;
use super::tasks::{GateEnd, Gated, Judged, Purpose};
use super::voice::{Behaviour, Line, Reverted, Said, Voice, Words};
use crate::host::hooks::{Facts, Hook};
use crate::host::journal::LogEvent;
use crate::host::state::Root;
use crate::proxy::control::Drain;

/// `candidate_started`, as a deploy has always said it.
pub fn started(rollout: &Rollout, process: &Process) -> String {
    let deadline_source = rollout
        .single
        .as_ref()
        .map_or("policy", |s| s.deadline_source.as_str());
    format!(
        "port {}; pid {}; deadline {} ms ({deadline_source}); poll {} ms{}",
        process.port,
        process.pid,
        rollout.settings.progress_deadline_ms,
        rollout.settings.poll_ms,
        if rollout.settings.launch.unconfined {
            "; NOT confined (isolation.enabled = false): it runs with rollgate's own privileges"
        } else {
            ""
        }
    )
}

/// `switched`: the new release is in `current`, the previous one kept as its fallback.
pub fn switched(previous: &str, watch_ms: u64, drained: &str) -> String {
    format!(
        "switched from {previous}; watching for {watch_ms} ms with {previous} kept running; {}",
        drained.trim_end_matches("; ")
    )
}

/// A watched deploy's `promoted` words. Its old release was drained twice: at the switch (then
/// kept running as the fallback) and after the watch (then stopped); each drain is named by
/// when it happened, and "no proxy", when both found none, is said once.
fn watched_promotion(gate: &str, how: &str, switch_detail: &str, retired: &str) -> String {
    let no_proxy = Drain::NoProxy.to_string();
    let at_switch = switch_detail.trim_end_matches("; ");
    let after_watch = match retired.strip_prefix(&format!("{no_proxy}; ")) {
        Some(rest) if at_switch.ends_with(&no_proxy) => rest,
        _ => retired,
    };
    match at_switch {
        "" => format!("{gate}; passed the watch{how}; after the watch: {after_watch}"),
        _ => format!(
            "{gate}; passed the watch{how}; at the switch: {at_switch}; after the watch: {after_watch}"
        ),
    }
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
        tail => format!("{detail}; {} output: {tail}", failed_name(rollout)),
    };
    let slot = rollout.slot(0);
    match note.event {
        LogEvent::Promoted => {
            let gate = single.gate_detail.as_deref().unwrap_or_default();
            let retired = words.retired.as_deref().unwrap_or("first release");
            let detail = if words.watched {
                watched_promotion(gate, &words.how, &single.switch_detail, retired)
            } else {
                format!("{gate}{}; {retired}", single.switch_detail)
            };
            Some(Line {
                event: LogEvent::Promoted,
                detail,
                elapsed_ms: gate_elapsed,
                phase: None,
            })
        }
        LogEvent::RolledBack => {
            // A person's or a signal's abort names no slot; a failure is the slot's own words,
            // or (another type's process failed) the cause, which names it.
            let reason = match &rollout.abort_cause {
                Some(cause) if cause.slot.is_none() => Some(cause.reason.clone()),
                Some(cause) if cause.slot.is_some_and(|n| n != 0) => Some(cause.reason.clone()),
                _ => slot.error.clone(),
            }
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

/// Whose output a rollback's line quotes: the process of another type that failed, else the
/// candidate.
fn failed_name(rollout: &Rollout) -> String {
    rollout
        .abort_cause
        .as_ref()
        .and_then(|c| rollout.slots.get(c.slot?))
        .and_then(|s| s.kind.as_ref())
        .map_or("candidate".to_string(), |kind| kind.name())
}

/// A deploy's voice: `candidate_started`, `switched`, `promoted`, `rolled_back` and
/// `escalated`, as `rollgate deploy` has always said them, and a deploy's ways: its gate owns
/// the terminal and the signals, its candidate's output goes to its release's output folder, and its
/// ending is settled (its state cleared) with its outcome line.
pub(super) struct DeployVoice;

impl Voice for DeployVoice {
    fn behaviour(&self) -> Behaviour {
        Behaviour {
            progress_line: false,
            gate_owns_signals: true,
            numbered_replicas: false,
            start_failure_refuses: true,
            settles_at_stop: true,
            revert_brings_back: false,
        }
    }

    fn started(&self, rollout: &Rollout, process: &Process, slot: usize, purpose: Purpose) -> Said {
        if purpose != Purpose::Upgrade {
            // A stop-first deploy's previous release, started again after the new one failed:
            // no candidate of the deploy (its attempt has its own start line already).
            return Said::Process {
                event: LogEvent::ReplicaStarted,
                process: process.clone(),
                slot: Some(slot),
                wave: None,
                detail: format!(
                    "{} started again on port {} (pid {}): the release the failed deploy replaced, stopped first for its user change",
                    process.version, process.port, process.pid
                ),
            };
        }
        Said::Deploy(Line {
            event: LogEvent::CandidateStarted,
            detail: started(rollout, process),
            elapsed_ms: None,
            phase: None,
        })
    }

    fn note(&self, note: &Note, rollout: &Rollout, words: &Words, root: &Root) -> Option<Said> {
        let tail = match note.event {
            LogEvent::RolledBack => {
                // The output of what failed: another type's process, else web's.
                let failed_kind = rollout
                    .abort_cause
                    .as_ref()
                    .and_then(|c| rollout.slots.get(c.slot?))
                    .and_then(|s| s.kind.as_ref());
                let output = match failed_kind {
                    Some(kind) => root.process_output_path(
                        &rollout.to,
                        &rollout.service,
                        &kind.process_type,
                        kind.index,
                    ),
                    None => root.output_path(&rollout.to, &rollout.service),
                };
                let said =
                    crate::host::output::quote_settled(&output, 3, crate::host::output::SETTLE);
                // A confined release refused something by the kernel: which rule, and the
                // policy line that allows it.
                let hint = match rollout.settings.launch.unconfined {
                    true => None,
                    false => {
                        let release = root.release_dir(&rollout.to);
                        let stranded = crate::release::shebang::stranded(&release, &release, 20);
                        let stranded: Vec<_> = stranded
                            .iter()
                            .map(|s| (s.script.as_path(), s.interpreter.as_path()))
                            .collect();
                        crate::host::confine::hint(&said, &root.0, &release, &stranded)
                    }
                };
                match hint {
                    Some(hint) => format!("{said} [{hint}]"),
                    None => said,
                }
            }
            _ => String::new(),
        };
        line(note, rollout, words, root, &tail).map(Said::Deploy)
    }

    fn gate_ended(&self, rollout: &mut Rollout, gated: &Gated) {
        let Some(single) = rollout.single.as_mut() else {
            return;
        };
        single.gate_elapsed_ms = Some(gated.elapsed.as_millis() as u64);
        single.last_probes = Some(gated.last_probes.clone());
        if gated.end == GateEnd::Ready {
            single.gate_detail = Some(format!(
                "ready after {} ms ({} probe{})",
                gated.elapsed.as_millis(),
                gated.probes,
                if gated.probes == 1 { "" } else { "s" }
            ));
        }
    }

    fn swapped(
        &self,
        rollout: &mut Rollout,
        words: &mut Words,
        durability: Option<&str>,
        retired: Option<String>,
    ) -> bool {
        let Some(single) = rollout.single.as_mut() else {
            return false;
        };
        single.switch_detail = durability.map_or(String::new(), |d| format!("; current {d}"));
        words.retired = retired;
        true
    }

    fn switched(
        &self,
        rollout: &mut Rollout,
        kept: &Process,
        durability: Option<&str>,
        drained: &str,
    ) -> Option<Said> {
        let watch_ms = rollout.settings.watch_ms;
        let single = rollout.single.as_mut()?;
        let durability = durability.map_or(String::new(), |d| format!("current {d}; "));
        single.switch_detail = format!("{durability}{drained}");
        Some(Said::Deploy(Line {
            event: LogEvent::Switched,
            detail: switched(&kept.version, watch_ms, drained),
            elapsed_ms: None,
            phase: None,
        }))
    }

    fn soak_judge(&self, rollout: &Rollout) -> Judged {
        // The watch tolerates `watch_failures - 1` failed probes in a row.
        Judged::Watch(rollout.single.as_ref().map_or(1, |s| s.watch_failures))
    }

    fn hook_facts(&self, r: &Rollout, hook: Hook) -> Facts {
        Facts {
            service: r.service.clone(),
            version: r.to.clone(),
            previous_version: r.from.clone(),
            ports: vec![r.settings.ports.0],
            previous_ports: r
                .single
                .iter()
                .flat_map(|s| s.previous.iter().map(|p| p.port))
                .collect(),
            reason: (hook == Hook::PostRollback)
                .then(|| r.slot(0).error.clone())
                .flatten(),
        }
    }

    fn hook_ended(&self, _rollout: &Rollout, event: LogEvent, detail: String) -> Said {
        Said::Deploy(Line {
            event,
            detail,
            elapsed_ms: None,
            phase: None,
        })
    }

    fn watcher_left(&self, rollout: &mut Rollout, pid: u32) {
        if let Some(single) = rollout.single.as_mut() {
            single.watcher_pid = Some(pid);
        }
    }

    fn settled(&self, rollout: &mut Rollout) {
        if let Some(single) = rollout.single.as_mut() {
            single.settled = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::plan::tests::{live, planned};

    #[test]
    fn the_outcome_lines_are_the_deploys_own() {
        let pointer = live();
        let mut r = planned("v2", Some(&pointer), "t1");
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
            "ready after 412 ms (5 probes); passed the watch; at the switch: drained by the proxy; after the watch: drained by the proxy; old release v1 stopped (SIGTERM)"
        );
        assert_eq!(promoted.elapsed_ms, Some(412));
        // No proxy at either drain: said once.
        assert_eq!(
            watched_promotion(
                "ready after 13 ms (1 probe)",
                "",
                "no proxy; ",
                "no proxy; old release v1 stopped (SIGTERM)"
            ),
            "ready after 13 ms (1 probe); passed the watch; at the switch: no proxy; after the watch: old release v1 stopped (SIGTERM)"
        );
        // A switch finished by recovery has no words of its own.
        assert_eq!(
            watched_promotion("g", " (cut short)", "", "no proxy; old release v1 stopped"),
            "g; passed the watch (cut short); after the watch: no proxy; old release v1 stopped"
        );

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
