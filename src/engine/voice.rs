//! The voice of a run: every word its log lines say, and the few places where a kind of run
//! behaves its own way, asked by the executor, which never asks what kind of run it drives.
//!
//! Here only the trait and the words it passes; each voice in its own file: a rollout's
//! (`rollout_voice::RolloutVoice`) and a deploy's (`deploy_voice::DeployVoice`, the one-replica
//! rollout that speaks as `rollgate deploy` always has). The executor picks one, once, when it
//! is made (`run::voice_of`).

use super::state::{Process, Rollout};
use super::step::Note;
use super::tasks::{Gated, Judged, Purpose};
use crate::host::hooks::{Facts, Hook};
use crate::host::journal::LogEvent;
use crate::host::state::Root;

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

/// One line of a deploy.
#[derive(Debug, PartialEq)]
pub struct Line {
    pub event: LogEvent,
    pub detail: String,
    pub elapsed_ms: Option<u64>,
    pub phase: Option<&'static str>,
}

/// How a kind of run behaves where kinds differ. Read once, when the executor is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Behaviour {
    /// The rollout's progress line on a terminal (a deploy shows its gate's line instead).
    pub progress_line: bool,
    /// A gate shows its own line on a terminal, and a signal to rollgate ends the gate (which
    /// rolls back) instead of pausing the run.
    pub gate_owns_signals: bool,
    /// Each process is a numbered replica: its output goes to the replica's file and it is
    /// told its slot (`ROLLGATE_SLOT`).
    pub numbered_replicas: bool,
    /// A process that cannot be started refuses the whole run (nothing else was started)
    /// instead of failing its slot.
    pub start_failure_refuses: bool,
    /// The run's ending is settled when the planner stops it, its state cleared with its
    /// outcome line (a deploy); otherwise once its restores are done (a rollout).
    pub settles_at_stop: bool,
    /// A revert with no fallback kept brings the slot's previous version back (a rollout's
    /// replica may have left the pool); otherwise the previous release never left, and the
    /// revert only says what it is doing.
    pub revert_brings_back: bool,
}

/// One line, said by a voice and written by the executor.
#[derive(Debug)]
pub(super) enum Said {
    /// About one process: its port, pid and token, and the last status it said.
    Process {
        event: LogEvent,
        process: Process,
        slot: Option<usize>,
        wave: Option<usize>,
        detail: String,
    },
    /// About the run (under its id).
    Run {
        event: LogEvent,
        version: String,
        slot: Option<usize>,
        wave: Option<usize>,
        detail: String,
    },
    /// A rollout's outcome, written once per rollout id.
    Outcome { event: LogEvent, detail: String },
    /// A deploy's line: its token, port and pid, a signed release's facts; an outcome once.
    Deploy(Line),
}

pub(super) trait Voice: Send + Sync {
    fn behaviour(&self) -> Behaviour;

    /// A process was started for `slot`.
    fn started(&self, rollout: &Rollout, process: &Process, slot: usize, purpose: Purpose) -> Said;

    /// The line for one of the planner's notes, or None for a note this kind does not log.
    fn note(&self, note: &Note, rollout: &Rollout, words: &Words, root: &Root) -> Option<Said>;

    /// A gate ended: what the run keeps of it for its outcome line (saved with the step it
    /// leads to).
    fn gate_ended(&self, _rollout: &mut Rollout, _gated: &Gated) {}

    /// A process joined the pool and the one it replaced was stopped (`retired` says how);
    /// true when the run kept words of it to save.
    fn swapped(
        &self,
        _rollout: &mut Rollout,
        _words: &mut Words,
        _durability: Option<&str>,
        _retired: Option<String>,
    ) -> bool {
        false
    }

    /// A process joined the pool with the one it replaced kept as the fallback, drained:
    /// the line for it, after the run's words of it are saved.
    fn switched(
        &self,
        _rollout: &mut Rollout,
        _kept: &Process,
        _durability: Option<&str>,
        _drained: &str,
    ) -> Option<Said> {
        None
    }

    /// How a soak judges the new processes it watches.
    fn soak_judge(&self, rollout: &Rollout) -> Judged {
        Judged::Soak(rollout.settings.soak_failures)
    }

    /// The facts a post hook is given.
    fn hook_facts(&self, rollout: &Rollout, hook: Hook) -> Facts;

    /// A post hook ran (`HookRan`) or failed (`HookFailed`); `detail` says how.
    fn hook_ended(&self, rollout: &Rollout, event: LogEvent, detail: String) -> Said;

    /// A background watcher took the run over (`deploy --no-wait`).
    fn watcher_left(&self, _rollout: &mut Rollout, _pid: u32) {}

    /// The run's ending was settled at the planner's stop.
    fn settled(&self, _rollout: &mut Rollout) {}
}
