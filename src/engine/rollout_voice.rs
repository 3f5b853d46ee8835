//! The voice of a rollout of N replicas (see `voice`): a line per replica's step, a wave's end,
//! and the outcome.

use super::state::{Process, Rollout};
use super::step::Note;
use super::tasks::Purpose;
use super::voice::{Behaviour, Said, Voice, Words};
use crate::host::hooks::{Facts, Hook};
use crate::host::journal::LogEvent;
use crate::host::state::Root;

/// A rollout of N replicas: a line per replica's step, a wave's end, and the outcome.
pub(super) struct RolloutVoice;

impl Voice for RolloutVoice {
    fn behaviour(&self) -> Behaviour {
        Behaviour {
            progress_line: true,
            gate_owns_signals: false,
            numbered_replicas: true,
            start_failure_refuses: false,
            settles_at_stop: false,
            revert_brings_back: true,
        }
    }

    fn started(&self, rollout: &Rollout, process: &Process, slot: usize, purpose: Purpose) -> Said {
        let why = match purpose {
            Purpose::Upgrade => "",
            Purpose::BringBack => "; its previous version, back after a failure",
            Purpose::Restore => "; the baseline, for the rollback",
        };
        Said::Process {
            event: LogEvent::ReplicaStarted,
            process: process.clone(),
            slot: Some(slot),
            wave: rollout.slot(slot).wave,
            detail: format!(
                "replica {slot}: {} on port {} (pid {}){why}",
                process.version, process.port, process.pid
            ),
        }
    }

    fn note(&self, note: &Note, rollout: &Rollout, _words: &Words, _root: &Root) -> Option<Said> {
        if note.event.is_outcome() {
            return Some(Said::Outcome {
                event: note.event,
                detail: note.detail.clone(),
            });
        }
        // Another type's process is named by its type and place (it is in no pool).
        let typed = note.slot.and_then(|slot| rollout.slot(slot).kind.as_ref());
        let detail = match (note.event, note.slot, typed) {
            (LogEvent::ReplicaReady, _, Some(kind)) => format!("{} ready", kind.name()),
            (LogEvent::ReplicaReady, Some(slot), None) => {
                format!("replica {slot} ready; in the pool")
            }
            (LogEvent::ReplicaFailed, _, Some(kind)) => format!("{}: {}", kind.name(), note.detail),
            (LogEvent::ReplicaFailed, Some(slot), None) => {
                format!("replica {slot}: {}", note.detail)
            }
            _ => note.detail.clone(),
        };
        // A removed replica's line names the version it ran, not the one rolled out.
        let version = match (note.event, note.slot) {
            (LogEvent::ReplicaRemoved, Some(slot)) => rollout.slot(slot).from_version.clone(),
            _ => None,
        };
        Some(Said::Run {
            event: note.event,
            version: version.unwrap_or_else(|| rollout.to.clone()),
            slot: note.slot,
            wave: note.wave,
            detail,
        })
    }

    fn hook_facts(&self, r: &Rollout, _hook: Hook) -> Facts {
        let ports = |new: bool| -> Vec<u16> {
            r.slots
                .iter()
                .filter_map(|s| s.live.as_ref())
                .filter(|p| (p.version == r.to) == new)
                .map(|p| p.port)
                .collect()
        };
        Facts {
            service: r.service.clone(),
            version: r.to.clone(),
            previous_version: r.from.clone(),
            ports: ports(true),
            previous_ports: ports(false),
            reason: r.abort_cause.as_ref().map(|c| c.reason.clone()),
        }
    }

    fn hook_ended(&self, rollout: &Rollout, event: LogEvent, detail: String) -> Said {
        Said::Run {
            event,
            version: rollout.to.clone(),
            slot: None,
            wave: None,
            detail,
        }
    }
}
