//! A single deploy (`rollgate deploy`) is the engine's one-replica case: one required slot on
//! the deploy's port, one wave, one surge place, the previous release kept as the proxy's
//! fallback through the watch, and the deploy's own log lines. This module holds what differs:
//! the plan of a deploy and the words of its lines. The executor does the rest.

use super::run::{Context, Executor, Purpose};
use super::state::{self, Phase, Process, Rollout, Settings, Single, Slot, SlotState};
use super::step::{Action, Event, Note};
use super::tasks::{GateEnd, Gated, Judged};
use super::voice::{Behaviour, Line, Reverted, Said, Voice, Words};
use crate::engine::judge::Settings as DeploySettings;
use crate::error::Error;
use crate::host::hooks::{Facts, Hook};
use crate::host::journal::{self, LogEvent};
use crate::host::process::{self, Identity};
use crate::host::state::{Candidate, Pointer, ReplicaClass, Root, Stage};

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
            output: s.output,
        },
        waves: vec![vec![0]],
        wave: 0,
        slots: vec![Slot {
            wave: Some(0),
            ..Slot::new(
                0,
                ReplicaClass::Required,
                SlotState::Pending,
                previous.clone(),
            )
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
        unsettled: true,
        post_hook_started: false,
    }
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
            // A person's or a signal's abort names no slot; a failure is the slot's own words.
            let reason = match &rollout.abort_cause {
                Some(cause) if cause.slot.is_none() => Some(cause.reason.clone()),
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

/// A deploy's voice: `candidate_started`, `switched`, `promoted`, `rolled_back` and
/// `escalated`, as `rollgate deploy` has always said them, and a deploy's ways: its gate owns
/// the terminal and the signals, its candidate's output goes beside its release, and its
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

    fn started(
        &self,
        rollout: &Rollout,
        process: &Process,
        _slot: usize,
        _purpose: Purpose,
    ) -> Said {
        Said::Deploy(Line {
            event: LogEvent::CandidateStarted,
            detail: started(rollout, process),
            elapsed_ms: None,
            phase: None,
        })
    }

    fn note(&self, note: &Note, rollout: &Rollout, words: &Words, root: &Root) -> Option<Said> {
        let tail = match note.event {
            LogEvent::RolledBack => crate::host::output::tail_settled(
                &root.output_path(&rollout.to, &rollout.service),
                3,
                crate::host::output::SETTLE,
            ),
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

    fn hook_failed(&self, _rollout: &Rollout, error: String) -> Said {
        Said::Deploy(Line {
            event: LogEvent::HookFailed,
            detail: error,
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

/// The executor for a single deploy found on disk (recovery, `promote`, `abort`, the
/// background watcher).
pub(crate) fn executor(root: &Root, rollout: Rollout) -> Executor {
    Executor::new(Context::of_saved(root, &rollout), rollout)
}

fn refused(message: String) -> Error {
    Error::Refused(message)
}

/// A `candidate` record an older rollgate left: the same deploy in the engine's terms, saved
/// as the state file, so one recovery finishes both.
pub(crate) fn adopt_legacy(root: &Root) -> Result<(), Error> {
    let Some(left) = root.read_candidate().map_err(refused)? else {
        return Ok(());
    };
    let saved = state::load(root).map_err(refused)?;
    if saved.is_some_and(|r| r.unsettled_deploy() && r.id == left.token) {
        // The view of the deploy the state file holds.
        return Ok(());
    }
    // Saved as the state file, the record is rewritten as that state's view.
    let pointer = root.read_pointer().map_err(refused)?;
    state::save(root, &from_candidate(&left, pointer.as_ref())).map_err(refused)
}

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
    }
}

/// The `candidate` record of a single deploy in flight, as deploys have always written it.
pub fn candidate_view(rollout: &Rollout) -> Candidate {
    let s = rollout.slot(0);
    let single = rollout.single.as_ref();
    let recorded = rollout.new_process().filter(|p| p.pid > 0);
    let watching = s.fallback.is_some() && rollout.soak_until.is_some();
    let stage = match (s.held, watching, recorded) {
        (true, _, _) => Stage::Escalated,
        (false, true, _) => Stage::Watching,
        (false, false, Some(_)) => Stage::Running,
        (false, false, None) => Stage::Spawning,
    };
    let previous = single.and_then(|x| x.previous.as_ref()).map(|p| Pointer {
        service: rollout.service.clone(),
        version: p.version.clone(),
        port: p.port,
        pid: p.pid,
        start_time: p.start_time,
        promoted_at: 0.0,
        fallback: None,
        probe: crate::host::probe::Spec::unless_default(&rollout.settings.probe),
    });
    let watch = match (watching, rollout.soak_until, single) {
        (true, Some(until), Some(single)) => Some(crate::host::state::WatchRecord {
            until,
            poll_ms: rollout.settings.poll_ms,
            failures: single.watch_failures,
            gate_detail: single.gate_detail.clone().unwrap_or_default(),
            gate_elapsed_ms: single.gate_elapsed_ms.unwrap_or(0),
            switch_detail: single.switch_detail.clone(),
            watcher_pid: single.watcher_pid,
        }),
        _ => None,
    };
    Candidate {
        service: rollout.service.clone(),
        version: rollout.to.clone(),
        port: rollout.settings.ports.0,
        token: rollout.id.clone(),
        pid: recorded.map(|p| p.pid),
        start_time: recorded.map(|p| p.start_time),
        stage,
        deployer_pid: single.map_or(0, |x| x.deployer_pid),
        started_at: rollout.started_at,
        grace_ms: rollout.settings.grace_ms,
        drain_ms: rollout.settings.drain_ms,
        previous,
        signed: rollout.signed.clone(),
        probe: rollout.settings.probe.clone(),
        watch,
        hooks: rollout.hooks.clone(),
    }
}

/// Whether `current` names the deploy's new process: the switch happened, whatever else the
/// state says.
pub(crate) fn is_switched(root: &Root, rollout: &Rollout) -> Result<bool, Error> {
    let pointer = root.read_pointer().map_err(refused)?;
    let new = rollout.new_process().filter(|p| p.pid > 0);
    Ok(match (pointer, new) {
        (Some(pointer), Some(new)) => pointer.names(new.identity()),
        _ => false,
    })
}

/// A single deploy whose rollgate died before its outcome (we hold the lock, so it is dead):
/// a switch that happened is finished (a watch cut short decided by one final probe), one
/// that did not is undone; an escalated one waits for a person.
pub(crate) async fn finish(root: &Root, rollout: Rollout) -> Result<(), Error> {
    let Some(single) = rollout.single.clone() else {
        return Ok(());
    };
    let s = rollout.slot(0).clone();
    let switched = is_switched(root, &rollout)?;
    if s.held && !switched {
        return Err(refused(format!(
            "candidate {} of {} is escalated and waiting for a person: run `rollgate promote {svc} --root {root}` or `rollgate abort {svc} --root {root}` first",
            rollout.to,
            rollout.service,
            svc = rollout.service,
            root = root.0.display()
        )));
    }
    let gone = match single.watcher_pid {
        Some(pid) => format!("watcher pid {pid}"),
        None => format!("deployer pid {}", single.deployer_pid),
    };
    // The planner had rolled it back (in the gate or the watch): only its effects were cut
    // short, and the state says which.
    if rollout.phase == Phase::Aborted {
        return finish_rollback(root, rollout, gone).await;
    }
    // The planner had completed it (a person's promote, a watch that passed): the swap it
    // decided is made if the crash came first, and the deploy finished.
    if rollout.phase == Phase::Completed {
        let detail = format!("promoted before {gone} died; finished by the next command");
        let detail = single
            .gate_detail
            .clone()
            .filter(|_| !switched)
            .unwrap_or(detail);
        return complete_switch(executor(root, rollout), detail, single.gate_elapsed_ms).await;
    }
    if !switched {
        return abandon(root, rollout).await;
    }
    let mut executor = executor(root, rollout);
    match s.fallback {
        Some(_) if executor.rollout().phase == Phase::Running => {
            executor.words_mut().how =
                format!(" (cut short: {gone} was gone; decided by one final probe)");
            match final_probe(root, executor.rollout()).await {
                Ok(()) => {
                    executor.rollout_mut().soak_until = Some(journal::now());
                    executor.handle(Event::Tick).await?;
                }
                Err(reason) => executor.handle(Event::Failed { slot: 0, reason }).await?,
            }
        }
        _ => {
            let detail = format!(
                "switched before deployer pid {} died; recorded by the next deploy",
                single.deployer_pid
            );
            return complete_switch(executor, detail, None).await;
        }
    }
    executor.run_post_hook().await;
    Ok(())
}

/// A switch that happened (`current` names the new process) finished: the previous release
/// (retiring, or kept as the fallback) drained and stopped, `promoted` logged with `detail` in
/// place of the gate's words, the floor raised, the post hook run.
pub(crate) async fn complete_switch(
    mut executor: Executor,
    detail: String,
    elapsed_ms: Option<u64>,
) -> Result<(), Error> {
    // The words its `promoted` line takes in place of the gate's; the planner decides the rest.
    if let Some(single) = executor.rollout_mut().single.as_mut() {
        single.gate_detail = Some(detail);
        single.gate_elapsed_ms = elapsed_ms;
        single.switch_detail.clear();
    }
    executor.handle(Event::SwitchSeen { slot: 0 }).await?;
    executor.run_post_hook().await;
    Ok(())
}

/// A deploy the planner had already rolled back when its rollgate died: the kept previous
/// release serves again (the switch back it was making), everything the deploy started is
/// stopped, `current` names what serves, and the rollback is logged once.
async fn finish_rollback(root: &Root, rollout: Rollout, gone: String) -> Result<(), Error> {
    let grace = std::time::Duration::from_millis(rollout.settings.grace_ms);
    let mut executor = executor(root, rollout);
    let r = executor.rollout_mut();
    let started = |p: &Option<Process>| p.as_ref().is_some_and(|p| r.started(p));
    let s = r.slot(0);
    let in_watch = s.fallback.is_some() || started(&s.live) || started(&s.retiring);
    let mut stop: Vec<Process> = Vec::new();
    let s = r.slot(0).clone();
    let mut live = s.live.clone();
    if let Some(kept) = s.fallback.clone() {
        stop.extend(live.take());
        live = kept.identity().is_running().then_some(kept);
    }
    if started(&live) {
        stop.extend(live.take());
    }
    stop.extend(s.candidate.clone());
    stop.extend(s.retiring.clone());
    let slot = r.slot_mut(0);
    slot.live = live.clone();
    slot.fallback = None;
    slot.candidate = None;
    slot.retiring = None;
    // Named as retiring until stopped, so a second crash finds them again.
    slot.retiring = stop.first().cloned();
    executor.save()?;
    if live.is_some() {
        executor.perform_write_pool()?;
    }
    let mut stopped = Vec::new();
    for process in &stop {
        let how = match process.pid > 0 {
            true => process::stop_group(process.identity(), grace)
                .await
                .to_string(),
            false => {
                for who in process::find_by_token(&process.token) {
                    process::stop_group(who, grace).await;
                }
                "stopped".to_string()
            }
        };
        stopped.push(format!("pid {} {how}", process.pid));
    }
    executor.rollout_mut().slot_mut(0).retiring = None;
    executor.save()?;
    let previous = match &live {
        Some(p) => format!("old release {} serves again", p.version),
        None => "WARNING no previous release is running".to_string(),
    };
    let words = executor.words_mut();
    words.how = format!(" (finished after {gone} died)");
    words.context = Some(format!("finished after {gone} died"));
    words.reverted = Some(Reverted {
        in_watch,
        previous,
        stopped: match stopped.is_empty() {
            true => process::Stopped::AlreadyGone.to_string(),
            false => stopped.join(", "),
        },
    });
    executor.perform(outcome_note(LogEvent::RolledBack)).await?;
    executor.perform(Action::Stop).await
}

/// The planner's outcome note, worded by [`line`].
fn outcome_note(event: LogEvent) -> Action {
    Action::Log(Note {
        event,
        slot: None,
        wave: None,
        detail: String::new(),
    })
}

/// One probe decides a watch that was cut short.
async fn final_probe(root: &Root, rollout: &Rollout) -> Result<(), String> {
    let Some(new) = rollout.slot(0).live.clone() else {
        return Err("exited during the watch".into());
    };
    if !new.identity().is_running() {
        return Err("exited during the watch".into());
    }
    // A release that is notified ready is asked on its socket: bound again here, it has said
    // nothing yet, so only an ERRNO= or a missed watchdog from now on (or its confirmation)
    // fails it.
    let notifier = rollout
        .settings
        .probe
        .is_notify()
        .then(|| {
            crate::host::notify::Notifier::watch_live(new.pid, crate::host::notify::BIND_PATIENCE)
        })
        .flatten();
    let subject = crate::host::probe::Subject {
        spec: rollout.settings.probe.clone(),
        port: new.port,
        workdir: root.release_dir(&new.version),
        notices: notifier.as_ref().map(|n| n.notices()),
    };
    match subject.check().await {
        (true, _) => Ok(()),
        (false, probe) => Err(format!("failed a final probe ({probe})")),
    }
}

/// The switch did not happen: whatever the dead deployer started is stopped (found by its
/// token if its pid was never recorded), the live release stays, and the rollback is logged.
async fn abandon(root: &Root, rollout: Rollout) -> Result<(), Error> {
    let Some(single) = rollout.single.clone() else {
        return Ok(());
    };
    let grace = std::time::Duration::from_millis(rollout.settings.grace_ms);
    let slot = rollout.slot(0).clone();
    let mut found: Vec<Identity> = Vec::new();
    for p in slot.candidate.iter().chain(slot.live.iter()) {
        if !rollout.started(p) {
            continue;
        }
        match p.pid > 0 {
            true => found.push(p.identity()),
            false => found.extend(process::find_by_token(&p.token)),
        }
    }
    let mut outcome = Vec::new();
    for who in &found {
        outcome.push(format!(
            "pid {} {}",
            who.pid,
            process::stop_group(*who, grace).await
        ));
    }
    if outcome.is_empty() {
        outcome.push(process::Stopped::AlreadyGone.to_string());
    }
    let detail = format!(
        "abandoned: deployer pid {} died before an outcome; candidate {}; stopped by the next deploy",
        single.deployer_pid,
        outcome.join(", ")
    );
    super::record::log_deploy(
        root,
        &rollout,
        &journal::Entry::new(
            LogEvent::RolledBack,
            &rollout.to,
            &rollout.service,
            detail.clone(),
        ),
    )?;
    // Its outcome is on record; `current` (never switched) says what is live.
    state::clear(root).map_err(Error::Failed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn deploy_settings() -> DeploySettings {
        crate::engine::judge::resolve_with_watch(Some(600), None, None, Some(2000), None)
            .expect("defaults resolve")
    }

    /// A deploy of `version` on port 9002, with the deploy's token.
    fn planned(version: &str, live: Option<&Pointer>, token: &str) -> Rollout {
        plan(&Asked {
            service: "edge-svc",
            version,
            port: 9002,
            settings: &deploy_settings(),
            live,
            token: token.into(),
            now: 100.0,
        })
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
        let r = planned("v2", Some(&pointer), "t1");
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
        let first = planned("v1", None, "t0");
        assert_eq!(first.settings.watch_ms, 0);
        assert!(first.slot(0).live.is_none());
    }

    #[test]
    fn the_new_process_is_told_from_the_live_one_by_its_token_not_its_version() {
        // Deploying the live version again (a restart): both processes run "v1".
        let pointer = live();
        let mut r = planned("v1", Some(&pointer), "4242-100.5");
        assert!(
            r.new_process().is_none(),
            "the live release is not the new one"
        );
        r.slot_mut(0).candidate = Some(Process {
            version: "v1".into(),
            port: 9002,
            pid: 43,
            start_time: 8,
            token: "4242-100.5-0-4242.1".into(),
        });
        assert_eq!(r.new_process().map(|p| p.pid), Some(43));
        // Swapped in: the previous one is kept as the fallback; the new one is still told apart.
        let s = r.slot_mut(0);
        s.fallback = s.live.take();
        s.live = s.candidate.take();
        assert_eq!(r.new_process().map(|p| p.pid), Some(43));
        // A legacy record's candidate carries the token itself.
        let mut legacy = r.clone();
        legacy.slot_mut(0).live.as_mut().expect("live").token = "4242-100.5".into();
        assert_eq!(legacy.new_process().map(|p| p.pid), Some(43));
        legacy.slot_mut(0).live.as_mut().expect("live").token = "4242-100.55".into();
        assert!(legacy.new_process().is_none(), "another deploy's token");
    }

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
