//! What the executor writes as it goes, through `record.rs`: the log lines its voice says (a
//! rollout's, a deploy's), the pool, the outcome, and the release floor once a signed release
//! is live everywhere.

use super::*;

impl Executor {
    /// The pool as the state names it, written (for whoever finishes a deploy after a crash).
    pub(crate) fn perform_write_pool(&self) -> Result<(), Error> {
        self.write_pool().map(drop)
    }

    /// `replicas.json` for the proxy, and `current` naming the first live replica for readers
    /// that know one release (status, the lab). Some(words) when `current` was renamed but
    /// its folder's fsync failed: readers see it, so the change goes on.
    pub(super) fn write_pool(&self) -> Result<Option<String>, Error> {
        write_pool(&self.context.root, &self.rollout)
    }

    pub(super) fn log_note(&mut self, note: &Note) -> Result<(), Error> {
        match self
            .voice
            .note(note, &self.rollout, &self.words, &self.context.root)
        {
            Some(said) => self.say(said),
            None => Ok(()),
        }
    }

    /// Writes a line the voice said.
    pub(super) fn say(&self, said: Said) -> Result<(), Error> {
        match said {
            Said::Process {
                event,
                process,
                slot,
                wave,
                detail,
            } => self.log(event, &process, slot, wave, detail),
            Said::Run {
                event,
                version,
                slot,
                wave,
                detail,
            } => self.log_plain(event, &version, slot, wave, detail),
            Said::Outcome { event, detail } => self.log_outcome(event, detail),
            Said::Deploy(line) => {
                self.log_deploy(line.event, line.detail, line.elapsed_ms, line.phase)
            }
        }
    }

    /// `promoted` or `rolled_back`, once per rollout (its id is the token).
    pub(super) fn log_outcome(&self, event: LogEvent, detail: String) -> Result<(), Error> {
        log_outcome(&self.context.root, &self.rollout, event, detail)
    }

    /// A deploy's line (`Said::Deploy`; promote, abort and recovery write them too).
    pub(crate) fn log_deploy(
        &self,
        event: LogEvent,
        detail: String,
        elapsed_ms: Option<u64>,
        phase: Option<&'static str>,
    ) -> Result<(), Error> {
        log_deploy(
            &self.context.root,
            &self.rollout,
            &journal::Entry {
                elapsed_ms,
                phase,
                status: self.status_of(Some(0)),
                ..journal::Entry::new(event, &self.rollout.to, &self.rollout.service, detail)
            },
        )
    }

    /// Where a run settles at the planner's stop (a deploy), its outcome line was just written:
    /// the floor is raised, and its record (its in-flight state) goes, so `current` alone says
    /// what is live, as after every deploy. A rollout settles once its restores are done
    /// ([`Executor::settle`]).
    pub(super) fn finish_outcome(&mut self) -> Result<(), Error> {
        if !self.rollout.is_over() || !self.behaviour.settles_at_stop {
            return Ok(());
        }
        // Whatever it ended in, the requests it held go on to what is live now.
        self.release_requests()?;
        self.voice.settled(&mut self.rollout);
        self.raise_floor()?;
        self.keep_scale()?;
        state::clear(&self.context.root)
            .map_err(|e| failed(format!("{}, but {e}", self.rollout.phase_word())))
    }

    /// A scale's counts become the root's once its run completed (before the run's state is
    /// cleared, so a crash between them writes them again).
    pub(super) fn keep_scale(&self) -> Result<(), Error> {
        let Some(counts) = self.rollout.scale.as_ref() else {
            return Ok(());
        };
        if self.rollout.phase != Phase::Completed {
            return Ok(());
        }
        let root = &self.context.root;
        root.write_scale(counts).map_err(|e| {
            failed(format!(
                "completed, but {} was not written: {e}",
                root.scale_path().display()
            ))
        })?;
        fault::point();
        Ok(())
    }

    /// The floor of a signed release is raised once it is live everywhere (the same value
    /// again when a crash made this run twice).
    pub(super) fn raise_floor(&self) -> Result<(), Error> {
        if self.rollout.phase != Phase::Completed {
            return Ok(());
        }
        let Some(signed) = &self.rollout.signed else {
            return Ok(());
        };
        crate::release::write_floor(&self.context.root.0, signed).map_err(|e| {
            failed(format!(
                "completed, but the release floor was not raised: {e}"
            ))
        })?;
        fault::point();
        Ok(())
    }

    pub(super) fn log(
        &self,
        event: LogEvent,
        process: &Process,
        slot: Option<usize>,
        wave: Option<usize>,
        detail: String,
    ) -> Result<(), Error> {
        append(
            &self.context.root,
            &journal::Entry {
                port: Some(process.port),
                pid: (process.pid > 0).then_some(process.pid),
                token: Some(&process.token),
                slot,
                wave,
                status: self
                    .notifiers
                    .get(&process.token)
                    .and_then(Notifier::status),
                ..journal::Entry::new(event, &process.version, &self.rollout.service, detail)
            },
        )
    }

    /// A line about another type's process (`process` names it: `worker.1`).
    pub(super) fn log_process(
        &self,
        kind: &crate::engine::state::Kind,
        process: &Process,
        slot: usize,
        detail: String,
    ) -> Result<(), Error> {
        append(
            &self.context.root,
            &journal::Entry {
                pid: (process.pid > 0).then_some(process.pid),
                token: (!process.token.is_empty()).then_some(process.token.as_str()),
                slot: Some(slot),
                process: Some(kind.name()),
                ..journal::Entry::new(
                    LogEvent::Process,
                    &process.version,
                    &self.rollout.service,
                    detail,
                )
            },
        )
    }

    pub(super) fn log_plain(
        &self,
        event: LogEvent,
        version: &str,
        slot: Option<usize>,
        wave: Option<usize>,
        detail: String,
    ) -> Result<(), Error> {
        append(
            &self.context.root,
            &journal::Entry {
                token: Some(&self.rollout.id),
                slot,
                wave,
                status: self.status_of(slot),
                ..journal::Entry::new(event, version, &self.rollout.service, detail)
            },
        )
    }

    /// The last `STATUS=` the slot's newest notify-probed process said (its candidate, else
    /// the process serving it).
    pub(super) fn status_of(&self, slot: Option<usize>) -> Option<String> {
        let slot = slot?;
        let recorded = self.rollout.slots.get(slot)?;
        [&recorded.candidate, &recorded.live]
            .into_iter()
            .flatten()
            .find_map(|p| self.notifiers.get(&p.token).and_then(Notifier::status))
            .or_else(|| self.statuses.get(&slot).cloned())
    }
}
