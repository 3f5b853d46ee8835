//! After a crash: the rollout as saved is matched against the processes that run, so that the
//! executor can continue from a state that names everything running and nothing else.
//!
//! Work in flight is redone, never guessed at: a process being gated is stopped and its slot
//! starts again; a swap whose save did not happen is undone the same way; a process being
//! retired is stopped; a live replica that died leaves the pool. Any process carrying the
//! rollout's token that the state does not name is stopped.
//!
//! [`recover`] is the one entry point every command that takes a root calls under its lock: a
//! deploy is the engine's one-replica case, so its state file says what it had done.

use std::time::Duration;

use super::retire::drain_before_stop;
use super::run::{Context, Executor, Redo};
use super::state::{self, Phase, Process, Rollout, SlotState};
use super::step::{Action, Event, Note};
use super::{fault, record};
use crate::error::{refused, Error};
use crate::host::identity::Identity;
use crate::host::journal::{self, LogEvent};
use crate::host::process;
use crate::host::signals::Signals;
use crate::host::state::Root;
use crate::proxy::control::Tunnels;

/// Whatever a rollgate that died left on the root (we hold the lock, so it is dead), finished
/// by the same executor. A deploy: a switch that happened is finished, one that did not is
/// undone and logged as rolled back; an escalated candidate waits for a person instead
/// (refused with what to run). A rollout: an ended one is settled, a running one is paused
/// with every replica serving (see [`finish`]).
pub(crate) async fn recover(root: &Root) -> Result<(), Error> {
    // A hook (the release phase) runs only while its command holds the lock: one still running
    // now is a dead holder's, and goes before anything else starts.
    for words in crate::host::hooks::end_left_behind(&root.0).await {
        eprintln!("rollgate: {words}");
    }
    let left = state::load(root)?;
    let finished = match left.clone() {
        Some(left) if left.unsettled_deploy() => finish_deploy(root, left).await,
        Some(left) if left.single.is_none() => finish(root, left).await,
        _ => Ok(()),
    };
    // A stop-first run's pause is lifted whichever way its ending went.
    if let Some(left) = left.filter(|_| finished.is_ok()) {
        super::run::lift_left_pause(root, &left)?;
    }
    mend_formation(root);
    finished
}

/// The formation written again from the views, where a crash came between the two writes.
fn mend_formation(root: &Root) {
    if let Err(e) = super::formation::publish(root) {
        eprintln!("rollgate: {}: {e}", root.formation_path().display());
    }
}

/// For `up` (and each pass of `up --supervise`), `promote` and `abort`: the same, except that
/// an escalated deploy is left waiting for its person. The release it would replace is live and
/// is started meanwhile: after a reboot, nothing waits on a decision to serve.
pub(crate) async fn recover_leaving_escalated(root: &Root) -> Result<(), Error> {
    if let Some(left) = state::load(root)? {
        if left.unsettled_deploy() && left.slot(0).held && !is_switched(root, &left)? {
            mend_formation(root);
            return Ok(());
        }
    }
    recover(root).await
}

/// Decides, from the saved rollout and which recorded processes still run, what the state
/// becomes; touches nothing. `running(process)` answers for one recorded process; `resuming`:
/// the rollout is about to run again, so its pending slots need not serve their old version.
pub fn reconcile(
    rollout: &mut Rollout,
    running: impl Fn(Identity) -> bool,
    resuming: bool,
) -> Redo {
    let to = rollout.to.clone();
    let over = rollout.is_over();
    let mut redo = Redo::default();
    for s in &mut rollout.slots {
        let unswapped = s.state == SlotState::Succeeded
            && s.candidate
                .as_ref()
                .is_some_and(|c| c.pid > 0 && c.version == to && running(c.identity()));
        if unswapped {
            redo.swap.push(s.slot);
        } else {
            // A process being gated (or a restore's) is stopped by the caller; the slot's
            // step is taken again.
            s.candidate = None;
        }
        // A retired process is out of the pool already (or is taken out now).
        s.retiring = None;
        // A fallback stays only while the watch it serves goes on; a slot whose new process
        // is no longer wanted gets it back in the pool (the switch back the crash cut short).
        if let Some(kept) = s.fallback.take() {
            let alive = running(kept.identity());
            match s.state {
                SlotState::Succeeded if !over => s.fallback = alive.then_some(kept),
                SlotState::Succeeded => {}
                _ => s.live = alive.then_some(kept),
            }
        }
        let was_on_new = s.live.as_ref().is_some_and(|l| l.version == to);
        if !over && s.live.as_ref().is_some_and(|l| !running(l.identity())) {
            // An ended rollout's dead replica stays named: `up` restarts what the pool names.
            s.live = None;
        }
        let on_new = s.live.as_ref().is_some_and(|l| l.version == to);
        match s.state {
            _ if unswapped => continue,
            SlotState::Upgrading => {
                s.state = SlotState::Pending;
                s.left_pool = false;
            }
            // Its new process joined the pool and died since: a failure, judged by the planner.
            SlotState::Succeeded if was_on_new && !on_new && !over => {
                redo.died.push(s.slot);
                continue;
            }
            // The swap did not happen: do it again.
            SlotState::Succeeded if !on_new && !over => {
                s.state = SlotState::Pending;
                s.finished = None;
            }
            SlotState::RollingBack if !on_new => {
                s.state = SlotState::RolledBack;
            }
            SlotState::RollingBack => redo.restore.push(s.slot),
            // Its removal was under way: finished by the stray sweep, never brought back.
            SlotState::Removed => {
                s.live = None;
                continue;
            }
            _ => {}
        }
        let upgrades_later = resuming && s.state == SlotState::Pending;
        let serves_new = s.state == SlotState::Succeeded;
        if s.live.is_none() && s.from_version.is_some() && !upgrades_later && !serves_new {
            redo.bring_back.push(s.slot);
        }
    }
    redo
}

/// Every recorded process of the saved rollout that the reconciled one no longer names (live,
/// kept as a fallback, or ready to be swapped in), plus any process carrying the rollout's token that it does not
/// name: all of it is to be stopped.
pub fn strays(saved: &Rollout, reconciled: &Rollout) -> Vec<Identity> {
    let named: Vec<Identity> = reconciled
        .slots
        .iter()
        .flat_map(|s| {
            s.live
                .iter()
                .chain(s.fallback.iter())
                .chain(s.candidate.iter())
        })
        .map(|p| p.identity())
        .collect();
    let mut stray: Vec<Identity> = saved
        .processes()
        .filter(|p| p.pid > 0)
        .map(|p| p.identity())
        .filter(|who| !named.contains(who))
        .collect();
    let named_sessions: Vec<i32> = named.iter().map(|who| who.pid).collect();
    for (who, _) in process::find_by_token_prefix(&format!("{}-", saved.id)) {
        // A worker a named release forked carries its token too: it is that release's.
        let belongs_to_named = who
            .session()
            .is_some_and(|session| named_sessions.contains(&session));
        if !named.contains(&who) && !stray.contains(&who) && !belongs_to_named {
            stray.push(who);
        }
    }
    stray
}

/// Takes over a rollout found on disk under the lock (its rollgate is gone): the state is
/// matched with what runs, strays are drained and stopped, the pool is rewritten, and the
/// executor is returned with what it must restart.
pub(crate) async fn adopt(
    root: &Root,
    saved: Rollout,
    resuming: bool,
) -> Result<(Executor, Redo), Error> {
    let mut rollout = saved.clone();
    let redo = reconcile(&mut rollout, |who| who.is_running(), resuming);
    record::write_pool(root, &rollout)?;
    let grace = Duration::from_millis(rollout.settings.grace_ms);
    for stray in strays(&saved, &rollout) {
        // Said on stderr: a process stopped here is one no state file names any more, and an
        // operator reading a replica's death afterwards must be able to tell it was this.
        eprintln!(
            "rollgate: recovery stops pid {} (rollout {}): the recovered state no longer names it",
            stray.pid, saved.id
        );
        // A process that was in the pool is drained first (the pool no longer names it).
        if let Some(port) = saved
            .processes()
            .find(|p| p.identity() == stray)
            .map(|p| p.port)
        {
            drain_before_stop(root, port, rollout.settings.drain_ms, Tunnels::Wait).await;
        }
        process::stop_group(stray, grace).await;
    }
    state::save(root, &rollout)?;
    fault::point();
    let context = Context::of_saved(root, &rollout);
    Ok((Executor::new(context, rollout), redo))
}

/// A rollout whose rollgate died, found by whichever command takes the root next (under the
/// lock): an ended one is driven to the end its state implies (restores, the outcome line,
/// the floor, the post hook, each once); a running one stops where it is, paused, with every
/// replica that had left the pool serving its previous version again, for a person to
/// resume or abort (a scale of the types goes back instead: nobody is asked about a count). A
/// paused one gets the same: the reverts its pause began are finished, and a new replica that
/// died meanwhile is judged.
pub(crate) async fn finish(root: &Root, saved: Rollout) -> Result<(), Error> {
    let event = match saved.phase {
        Phase::Paused => Event::Tick,
        Phase::Completed | Phase::Aborted if !saved.unsettled => return Ok(()),
        Phase::Completed | Phase::Aborted => Event::Tick,
        // A scale of the types waits for nobody: it goes back whole (its new processes
        // stopped, the ones it would have stopped kept, the counts as they were).
        Phase::Running if saved.types_only => Event::Abort {
            reason: "its rollgate died before the scale completed; the counts are as they were (scale again)".into(),
            rollback: true,
        },
        Phase::Running => Event::Pause {
            reason: "its rollgate died; nothing drives it".into(),
        },
    };
    let (executor, redo) = adopt(root, saved, false).await?;
    let mut executor = executor.redo(redo).await?;
    let mut signals = Signals::install()?;
    executor.run(event, &mut signals).await?;
    Ok(())
}

/// Whether `current` names the deploy's new process: the switch happened, whatever else the
/// state says.
pub(crate) fn is_switched(root: &Root, rollout: &Rollout) -> Result<bool, Error> {
    let pointer = root.read_pointer()?;
    let new = rollout.new_process().filter(|p| p.pid > 0);
    Ok(match (pointer, new) {
        (Some(pointer), Some(new)) => pointer.names(new.identity()),
        _ => false,
    })
}

/// A single deploy whose rollgate died before its outcome (we hold the lock, so it is dead):
/// a switch that happened is finished (a watch cut short decided by one final probe), one
/// that did not is undone; an escalated one waits for a person.
pub(crate) async fn finish_deploy(root: &Root, rollout: Rollout) -> Result<(), Error> {
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
        return complete_switch(
            Executor::of_saved(root, rollout),
            detail,
            single.gate_elapsed_ms,
        )
        .await;
    }
    if !switched {
        return abandon(root, rollout).await;
    }
    let mut executor = Executor::of_saved(root, rollout);
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

/// A deploy the planner had already rolled back when its rollgate died: the effects it
/// decided (the [`Action::Revert`], the rollback's line, the end) are performed again by the
/// executor, each safe to repeat. A switch back cut short after its save has its new process
/// stopped first, and `current` is written again to name what serves.
async fn finish_rollback(root: &Root, mut rollout: Rollout, gone: String) -> Result<(), Error> {
    let grace = std::time::Duration::from_millis(rollout.settings.grace_ms);
    let started = |p: &Option<Process>| p.as_ref().is_some_and(|p| rollout.started(p));
    let s = rollout.slot(0);
    let in_watch = s.fallback.is_some() || started(&s.live) || started(&s.retiring);
    if s.fallback.is_none() && started(&s.live) {
        // The new release serves with nothing kept to go back to: it is stopped all the same.
        let s = rollout.slot_mut(0);
        s.retiring = s.live.take();
    }
    let mut executor = Executor::of_saved(root, rollout);
    executor.save()?;
    let mut stopped_first = None;
    if let Some(failed) = executor.rollout().slot(0).retiring.clone() {
        stopped_first = Some(super::run::stop_recorded(&failed, grace).await);
        executor.rollout_mut().slot_mut(0).retiring = None;
        executor.save()?;
    }
    if executor.rollout().slot(0).live.is_some() {
        executor.perform_write_pool()?;
    }
    executor.perform(Action::Revert { slot: 0 }).await?;
    // The release's other types go back too: each one's new process stopped, its kept old one
    // named again (or, replaced stop-first, started again).
    let typed: Vec<usize> = executor
        .rollout()
        .slots
        .iter()
        .filter(|s| !s.serves())
        .filter(|s| {
            s.fallback.is_some()
                || s.candidate.is_some()
                || s.retiring.is_some()
                || (s.live.is_none() && s.from_version.is_some())
                || s.state == SlotState::RollingBack
        })
        .map(|s| s.slot)
        .collect();
    for slot in typed {
        executor.perform(Action::Revert { slot }).await?;
    }
    let words = executor.words_mut();
    words.how = format!(" (finished after {gone} died)");
    words.context = Some(format!("finished after {gone} died"));
    if let Some(reverted) = words.reverted.as_mut() {
        reverted.in_watch = in_watch;
        if let Some(stopped) = stopped_first {
            reverted.stopped = stopped;
        }
    }
    executor.perform(outcome_note(LogEvent::RolledBack)).await?;
    executor.perform(Action::Stop).await?;
    // A process of another type being brought back is gated to its end.
    let mut signals = Signals::install()?;
    executor.await_in_flight(&mut signals).await
}

/// The planner's outcome note, worded by the deploy's voice.
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
        .launch
        .probe
        .is_notify()
        .then(|| {
            crate::host::notify::Notifier::watch_live(new.pid, crate::host::notify::BIND_PATIENCE)
        })
        .flatten();
    let subject = crate::host::probe::Subject {
        spec: rollout.settings.launch.probe.clone(),
        port: new.port,
        workdir: root.release_dir(&new.version),
        notices: notifier.as_ref().map(|n| n.notices()),
        root: root.0.clone(),
        launch: rollout.launch_of(&new).clone(),
    };
    match subject.check().await {
        (true, _) => Ok(()),
        (false, probe) => Err(format!("failed a final probe ({probe})")),
    }
}

/// The switch did not happen (`current` names the previous release): the attempt is put back
/// to before its swap ([`rewind_unswitched`]) and the planner aborts it like any other, so the
/// executor stops what the dead deployer started (found by its token if its pid was never
/// recorded), says what serves, logs the rollback once and clears the state.
async fn abandon(root: &Root, mut rollout: Rollout) -> Result<(), Error> {
    let Some(deployer_pid) = rollout.single.as_ref().map(|s| s.deployer_pid) else {
        return Ok(());
    };
    rewind_unswitched(&mut rollout);
    let stop_first = rollout.settings.stop_first;
    if stop_first {
        // Stopped first: the previous release may be gone, and then it is brought back.
        let s = rollout.slot_mut(0);
        if s.live.as_ref().is_some_and(|l| !l.identity().is_running()) {
            s.live = None;
        }
    }
    let mut executor = Executor::of_saved(root, rollout);
    executor.words_mut().context = Some("stopped by the next deploy".into());
    let abort = Event::Abort {
        reason: format!("abandoned: deployer pid {deployer_pid} died before an outcome"),
        rollback: true,
    };
    // A release of several types may bring a stop-first type's old process back: gated to its
    // end too.
    if !stop_first && !executor.rollout().is_whole_release() {
        return executor.handle(abort).await;
    }
    // The previous release being brought back is gated to its end before the deploy's
    // ending is settled.
    let mut signals = Signals::install()?;
    executor.run(abort, &mut signals).await.map(drop)
}

/// A deploy whose switch did not happen, as it was before its swap: `current` names the
/// previous release, so whatever the state says joined the pool did not. The new process
/// (if one was recorded) is the candidate being gated, and the previous release is live.
/// Pure: what the planner then decides is an abort of a gated candidate.
pub fn rewind_unswitched(rollout: &mut Rollout) {
    let new_in_pool = rollout
        .slot(0)
        .live
        .as_ref()
        .is_some_and(|live| rollout.started(live));
    rollout.phase = Phase::Running;
    let s = rollout.slot_mut(0);
    if new_in_pool {
        // The swap was saved, its rename not made: the previous release never left the pool.
        let new = s.live.take();
        s.candidate = s.candidate.take().or(new);
        s.live = s.fallback.take().or(s.retiring.take());
    }
    s.state = SlotState::Upgrading;
    s.held = false;
}

/// `up` started a live release again: the new process is put where the state named the old
/// one (`current`, the replica set and a rollout's slot), so every file still names what runs.
/// Under the lock; refused if the state moved on meanwhile.
pub fn record_restart(
    root: &Root,
    slot: Option<usize>,
    old: Identity,
    new: Identity,
) -> Result<(), Error> {
    let failed = |e: String| Error::Failed(e);
    // Another type's process: the formation names it (its identity is its own alone).
    if let Some(mut formation) = root.read_processes()? {
        if let Some(p) = formation
            .processes
            .iter_mut()
            .find(|p| p.pid == old.pid && p.start_time == old.start_time)
        {
            p.pid = new.pid;
            p.start_time = new.start_time;
            super::formation::write_other_types(root, &formation)
                .map_err(|e| failed(e.to_string()))?;
            return Ok(());
        }
    }
    if let Some(mut set) = root.read_replicas()? {
        let Some(replica) = set
            .replicas
            .iter_mut()
            .find(|r| Some(r.slot) == slot && r.pid == old.pid && r.start_time == old.start_time)
        else {
            return Err(failed("the replica set changed meanwhile".into()));
        };
        replica.pid = new.pid;
        replica.start_time = new.start_time;
        super::formation::write_replicas(root, &set).map_err(|e| failed(e.to_string()))?;
        if let Ok(Some(mut rollout)) = state::load(root) {
            let mut changed = false;
            for each in &mut rollout.slots {
                if let Some(p) = each
                    .live
                    .as_mut()
                    .filter(|p| p.pid == old.pid && p.start_time == old.start_time)
                {
                    p.pid = new.pid;
                    p.start_time = new.start_time;
                    changed = true;
                }
            }
            if changed {
                state::save(root, &rollout)?;
            }
        }
    }
    if let Some(mut pointer) = root.read_pointer()? {
        if pointer.names(old) {
            pointer.pid = new.pid;
            pointer.start_time = new.start_time;
            super::formation::write_pointer(root, &pointer).map_err(|e| failed(e.to_string()))?;
        } else if slot.is_none() {
            return Err(failed("current changed meanwhile".into()));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::state::{Process, Settings, Slot};
    use crate::host::state::ReplicaClass;

    fn process(version: &str, pid: i32) -> Process {
        Process {
            version: version.into(),
            port: 9000 + pid as u16,
            pid,
            start_time: 7,
            token: format!("r1-{pid}"),
            launch: None,
        }
    }

    fn slot(n: usize, state: SlotState, live: Option<Process>) -> Slot {
        Slot {
            slot: n,
            class: ReplicaClass::BestEffort,
            state,
            live,
            candidate: None,
            wave: Some(0),
            from_version: Some("v1".into()),
            from_launch: None,
            retiring: None,
            left_pool: false,
            started: None,
            finished: Some(1.0),
            error: None,
            held: false,
            fallback: None,
            kind: None,
            gated: false,
        }
    }

    fn rollout(phase: Phase, slots: Vec<Slot>) -> Rollout {
        Rollout {
            id: "r1".into(),
            service: "edge-svc".into(),
            from: Some("v1".into()),
            to: "v2".into(),
            started_at: 0.0,
            phase,
            settings: Settings {
                replicas: slots.len(),
                surge: 1,
                unavailable: 0,
                progress_deadline_ms: 1000,
                poll_ms: 50,
                min_ready_ms: 0,
                soak_ms: 0,
                max_failure_ratio: 0.05,
                grace_ms: 100,
                drain_ms: 100,
                release_deadline: 1e12,
                ports: (9000, 9100),
                wave_percents: vec![100],
                watch_ms: 0,
                on_stall: Default::default(),
                soak_failures: 1,
                keep_fallback: false,
                output: Default::default(),
                stop_first: false,
                launch: Default::default(),
                analysis: None,
            },
            waves: vec![(0..slots.len()).collect()],
            wave: 0,
            slots,
            soak_until: None,
            pause_reason: None,
            abort_cause: None,
            signed: None,
            hooks: Default::default(),
            single: None,
            unsettled: false,
            post_hook_started: false,
            holds_requests: false,
            last_analysis: None,
            scale: None,
            types_only: false,
        }
    }

    #[test]
    fn an_unswitched_deploy_is_rewound_to_its_gated_candidate_beside_the_previous_release() {
        let previous = Process {
            token: "r0-1".into(),
            ..process("v1", 1)
        };
        // The swap saved (the new process live, the previous one kept as the fallback), the
        // rename of `current` not made.
        let mut swapped = slot(0, SlotState::Succeeded, Some(process("v2", 11)));
        swapped.fallback = Some(previous.clone());
        let mut r = rollout(Phase::Running, vec![swapped]);
        rewind_unswitched(&mut r);
        let s = r.slot(0);
        assert_eq!(r.phase, Phase::Running);
        assert_eq!(s.state, SlotState::Upgrading);
        assert_eq!(s.live, Some(previous.clone()));
        assert_eq!(s.candidate, Some(process("v2", 11)));
        assert_eq!((s.fallback.clone(), s.retiring.clone()), (None, None));
        // The planner's answer is the abort of a gated candidate: stopped, then the rollback
        // logged, then the end.
        let actions = crate::engine::step::step(
            &mut r,
            Event::Abort {
                reason: "abandoned".into(),
                rollback: true,
            },
            2.0,
        );
        assert_eq!(actions.first(), Some(&Action::Revert { slot: 0 }));
        assert_eq!(actions.last(), Some(&Action::Stop));
        assert_eq!(r.phase, Phase::Aborted);

        // Still being gated (or not started at all): only the state and phase change.
        let mut gating = slot(0, SlotState::Upgrading, Some(previous.clone()));
        gating.candidate = Some(process("v2", 0));
        let mut r = rollout(Phase::Running, vec![gating.clone()]);
        rewind_unswitched(&mut r);
        assert_eq!(r.slot(0).live, gating.live);
        assert_eq!(r.slot(0).candidate, gating.candidate);
        let mut r = rollout(
            Phase::Running,
            vec![slot(0, SlotState::Pending, Some(previous))],
        );
        rewind_unswitched(&mut r);
        assert_eq!(r.slot(0).state, SlotState::Upgrading);
        assert_eq!(r.slot(0).candidate, None);
    }

    #[test]
    fn work_in_flight_is_redone_and_dead_replicas_leave_the_pool() {
        let mut gating = slot(0, SlotState::Upgrading, Some(process("v1", 1)));
        gating.candidate = Some(process("v2", 11));
        gating.left_pool = true;
        // Marked ready, but the swap was never saved and its new process is gone: the live
        // one is still v1, and the slot is upgraded again.
        let mut unswapped = slot(1, SlotState::Succeeded, Some(process("v1", 2)));
        unswapped.candidate = Some(process("v2", 12));
        let mut swapped = slot(2, SlotState::Succeeded, Some(process("v2", 13)));
        swapped.retiring = Some(process("v1", 3));
        let died = slot(3, SlotState::Succeeded, Some(process("v2", 14)));
        let failed_out_of_pool = slot(4, SlotState::Failed, None);
        // Removed by a scale down, its stop cut short: it leaves for good.
        let removing = slot(5, SlotState::Removed, Some(process("v1", 6)));
        let mut r = rollout(
            Phase::Running,
            vec![
                gating,
                unswapped,
                swapped,
                died,
                failed_out_of_pool,
                removing,
            ],
        );
        let saved = r.clone();
        let redo = reconcile(&mut r, |who| who.pid != 14 && who.pid != 12, false);
        let states: Vec<SlotState> = r.slots.iter().map(|s| s.state).collect();
        assert_eq!(
            states,
            [
                SlotState::Pending,
                SlotState::Pending,
                SlotState::Succeeded,
                SlotState::Succeeded,
                SlotState::Failed,
                SlotState::Removed
            ]
        );
        // Its new process died in the pool: a failure for the planner, not a silent retry.
        assert_eq!(redo.died, vec![3]);
        assert!(r
            .slots
            .iter()
            .all(|s| s.candidate.is_none() && s.retiring.is_none()));
        assert!(!r.slots[0].left_pool);
        assert_eq!(r.slots[3].live, None, "a dead replica leaves the pool");
        // The failed slot out of the pool gets its old version back; pending ones upgrade.
        assert_eq!(redo.bring_back, vec![4]);
        assert!(redo.restore.is_empty());
        // Candidates and the retiring process are strays; live ones never are.
        let strays: Vec<i32> = strays(&saved, &r).iter().map(|who| who.pid).collect();
        assert_eq!(strays, vec![11, 12, 3, 14, 6]);
    }

    #[test]
    fn an_abort_with_rollback_resumes_its_restores_and_a_paused_rollout_serves_its_old_version() {
        let restoring = slot(0, SlotState::RollingBack, Some(process("v2", 1)));
        let restored = slot(1, SlotState::RollingBack, Some(process("v1", 2)));
        let mut r = rollout(Phase::Aborted, vec![restoring, restored]);
        let redo = reconcile(&mut r, |_| true, false);
        assert_eq!(redo.restore, vec![0]);
        assert_eq!(r.slots[1].state, SlotState::RolledBack);

        let paused_out_of_pool = slot(0, SlotState::Pending, None);
        let mut r = rollout(Phase::Paused, vec![paused_out_of_pool]);
        assert_eq!(
            reconcile(&mut r.clone(), |_| true, false).bring_back,
            vec![0]
        );
        // Resuming: it will be upgraded anyway.
        assert!(reconcile(&mut r, |_| true, true).bring_back.is_empty());
    }

    #[test]
    fn a_ready_process_whose_swap_was_cut_short_is_swapped_in_even_once_the_rollout_completed() {
        for phase in [Phase::Running, Phase::Completed] {
            // In place: the slot had left the pool; the planner completed in the same step.
            let mut ready = slot(0, SlotState::Succeeded, None);
            ready.candidate = Some(process("v2", 11));
            let mut r = rollout(phase, vec![ready]);
            let saved = r.clone();
            let redo = reconcile(&mut r, |_| true, false);
            assert_eq!(redo.swap, vec![0]);
            assert!(redo.bring_back.is_empty(), "{phase:?}");
            assert_eq!(r.slots[0].candidate.as_ref().map(|p| p.pid), Some(11));
            assert!(strays(&saved, &r).is_empty(), "the ready process is kept");
        }
    }

    #[test]
    fn a_running_rollout_taken_over_to_pause_or_abort_brings_back_a_replica_that_left_the_pool() {
        // In place (no surge): its v1 left the pool, its v2 was being gated when rollgate died.
        let mut gating = slot(0, SlotState::Upgrading, None);
        gating.candidate = Some(process("v2", 11));
        gating.left_pool = true;
        let mut r = rollout(Phase::Running, vec![gating]);
        let redo = reconcile(&mut r.clone(), |_| true, false);
        assert_eq!(redo.bring_back, vec![0], "pause or abort: v1 serves again");
        assert!(reconcile(&mut r, |_| true, true).bring_back.is_empty());
    }

    #[test]
    fn a_paused_rollouts_dead_new_replica_is_a_failure_not_a_second_old_process() {
        let died = slot(0, SlotState::Succeeded, Some(process("v2", 11)));
        let mut r = rollout(Phase::Paused, vec![died]);
        for resuming in [false, true] {
            let mut r = r.clone();
            let redo = reconcile(&mut r, |who| who.pid != 11, resuming);
            assert_eq!(redo.died, vec![0]);
            assert!(
                redo.bring_back.is_empty(),
                "the planner's revert brings v1 back, once"
            );
            assert_eq!(r.slots[0].state, SlotState::Succeeded);
        }
        // An ended rollout's dead replica stays named, for `up` to restart.
        r.phase = Phase::Completed;
        let redo = reconcile(&mut r, |who| who.pid != 11, false);
        assert_eq!(redo, Redo::default());
        assert_eq!(r.slots[0].live.as_ref().map(|p| p.pid), Some(11));
    }

    #[test]
    fn a_fallback_stays_through_the_watch_serves_again_after_a_failure_and_goes_once_completed() {
        let watched = |state| {
            let mut s = slot(0, state, Some(process("v2", 11)));
            s.fallback = Some(process("v1", 1));
            s
        };
        let mut r = rollout(Phase::Running, vec![watched(SlotState::Succeeded)]);
        reconcile(&mut r, |_| true, false);
        assert_eq!(r.slots[0].fallback.as_ref().map(|p| p.pid), Some(1));

        // Failed in the watch, killed before the switch back was saved.
        let mut r = rollout(Phase::Aborted, vec![watched(SlotState::Failed)]);
        let saved = r.clone();
        reconcile(&mut r, |_| true, false);
        assert_eq!(r.slots[0].live.as_ref().map(|p| p.pid), Some(1));
        assert_eq!(r.slots[0].fallback, None);
        let stopped: Vec<i32> = strays(&saved, &r).iter().map(|who| who.pid).collect();
        assert_eq!(stopped, vec![11], "the failed new process is stopped");

        // Completed, killed before the fallback was dropped: it is a stray.
        let mut r = rollout(Phase::Completed, vec![watched(SlotState::Succeeded)]);
        let saved = r.clone();
        reconcile(&mut r, |_| true, false);
        let stopped: Vec<i32> = strays(&saved, &r).iter().map(|who| who.pid).collect();
        assert_eq!(stopped, vec![1]);
    }
}
