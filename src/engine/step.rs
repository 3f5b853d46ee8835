//! The rollout's decisions: `step(rollout, event, now)` changes the persisted state and returns
//! the actions an executor must perform, touching no process and no file, so every rule is
//! tested directly. The executor persists the state after each step, before acting.
//!
//! Invariants kept by construction: at most `surge` slots start a new process beside their live
//! one, at most `unavailable` leave the pool before their new process is ready, so the pool
//! never holds fewer than `N - unavailable` ready replicas and at most `N + surge` processes run.

use crate::host::journal::LogEvent;
use crate::host::state::ReplicaClass;

use super::budgets::too_many_failures;
use super::state::{AbortCause, Phase, Rollout, Slot, SlotState};
use crate::policy::OnStall;

/// Something the executor saw, or a person asked for.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// Nothing new: (re)decide what to start. The first event after a start or a resume.
    Tick,
    /// A slot's new process passed the gate and stayed ready for `min_ready_ms`.
    Ready {
        slot: usize,
    },
    /// A slot's new process failed: the gate (exit, deadline) or, after the swap, the soak.
    Failed {
        slot: usize,
        reason: String,
    },
    /// A slot's new process is still running but was not ready by the deadline: a failure,
    /// unless the rollout escalates stalls (then it is held for a person).
    Stalled {
        slot: usize,
        reason: String,
    },
    /// A person accepts a held slot's process as it is (`rollgate promote`).
    Accept {
        slot: usize,
    },
    /// A slot is back on its previous version (after a failure, or an abort with rollback).
    Restored {
        slot: usize,
    },
    /// `current` already names the slot's new process: a switch an interrupted run made (or
    /// the planner had decided) stands, and the run completes with it.
    SwitchSeen {
        slot: usize,
    },
    Pause {
        reason: String,
    },
    Resume,
    Abort {
        reason: String,
        rollback: bool,
    },
}

/// What the executor must do, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Start the slot's new process beside its live one (a surge place) and gate it.
    StartBeside {
        slot: usize,
    },
    /// Take the slot's live process out of the pool and stop it (an unavailable place), then
    /// start and gate the new one.
    StartInPlace {
        slot: usize,
    },
    /// Put the slot's gated process into the pool, then drain and stop the one it replaces
    /// (or, `keep_previous`, drain it and keep it running as the pool's fallback).
    Swap {
        slot: usize,
        keep_previous: bool,
    },
    /// The watch passed: the slot's fallback leaves the pool, is drained again and stopped —
    /// or its old process, recorded leaving when a crash cut its stop short, is stopped.
    DropFallback {
        slot: usize,
    },
    /// Stop the slot's new process; the previous version serves the slot again (started anew
    /// if it had left the pool), then [`Event::Restored`].
    Revert {
        slot: usize,
    },
    /// Return a slot that took the new version to its previous one, then [`Event::Restored`].
    Restore {
        slot: usize,
    },
    /// Take a surplus slot's process out of the pool, then drain and stop it (a scale down).
    Remove {
        slot: usize,
    },
    /// Watch the wave's new replicas until this time (Unix seconds), then send a `Tick`.
    SoakUntil(f64),
    Log(Note),
    /// The rollout stops here (completed, paused or aborted); outstanding reverts and restores
    /// are still performed.
    Stop,
}

/// A log line the rollout writes.
#[derive(Debug, Clone, PartialEq)]
pub struct Note {
    pub event: LogEvent,
    pub slot: Option<usize>,
    pub wave: Option<usize>,
    pub detail: String,
}

fn note(event: LogEvent, slot: Option<usize>, wave: Option<usize>, detail: String) -> Action {
    Action::Log(Note {
        event,
        slot,
        wave,
        detail,
    })
}

pub fn step(rollout: &mut Rollout, event: Event, now: f64) -> Vec<Action> {
    let mut actions = Vec::new();
    match event {
        Event::Tick => {}
        Event::Ready { slot } => ready(rollout, slot, now, &mut actions),
        Event::Failed { slot, reason } => fail(rollout, slot, reason, now, &mut actions),
        Event::Stalled { slot, reason } => {
            let escalates = rollout.settings.on_stall == OnStall::Escalate
                && rollout.phase == Phase::Running
                && rollout.slot(slot).state == SlotState::Upgrading;
            if escalates {
                hold(rollout, slot, reason, &mut actions);
            } else {
                fail(rollout, slot, reason, now, &mut actions);
            }
        }
        Event::Accept { slot } => {
            if rollout.phase == Phase::Paused && rollout.slot(slot).held {
                rollout.slot_mut(slot).held = false;
                rollout.phase = Phase::Running;
                rollout.pause_reason = None;
                // A person decided: nothing is left to watch for.
                rollout.settings.watch_ms = 0;
                ready(rollout, slot, now, &mut actions);
            }
        }
        Event::SwitchSeen { slot } => switch_seen(rollout, slot, now, &mut actions),
        Event::Restored { slot } => {
            let s = rollout.slot_mut(slot);
            if s.state == SlotState::RollingBack {
                s.state = SlotState::RolledBack;
                s.finished = Some(now);
            }
        }
        Event::Pause { reason } => {
            if rollout.phase == Phase::Running {
                pause(rollout, reason, &mut actions);
            }
        }
        Event::Resume => {
            // A held replica waits for `Accept` or `Abort`, not for the rollout to go on.
            if rollout.phase == Phase::Paused && !rollout.slots.iter().any(|s| s.held) {
                rollout.phase = Phase::Running;
                rollout.pause_reason = None;
                let retried = retry_failed(rollout);
                let detail = match retried.as_slice() {
                    [] => String::new(),
                    slots => format!("retrying failed replica(s) {}", list(slots)),
                };
                actions.push(note(
                    LogEvent::RolloutResumed,
                    None,
                    Some(rollout.wave),
                    detail,
                ));
            }
        }
        Event::Abort { reason, rollback } => {
            if matches!(rollout.phase, Phase::Running | Phase::Paused) {
                let cause = AbortCause {
                    slot: None,
                    reason,
                    phase: rollout.phase_name().into(),
                };
                abort(rollout, cause, rollback, &mut actions);
            }
        }
    }
    if rollout.phase == Phase::Running {
        advance(rollout, now, &mut actions);
    }
    actions
}

/// A slot's new process is ready: it joins the pool.
fn ready(rollout: &mut Rollout, slot: usize, now: f64, actions: &mut Vec<Action>) {
    let last_wave = rollout.wave + 1 >= rollout.waves.len();
    let settings = &rollout.settings;
    let keep = settings.keep_fallback && settings.watch_ms > 0 && last_wave;
    // A release of several types switches web last: only once every other type's new
    // processes are ready, so a type that fails leaves users on the release they had.
    let others_waiting = web_waits_for_types(rollout) && types_in_flight(rollout);
    let s = rollout.slot_mut(slot);
    // A held replica joins the pool only when a person accepts it.
    if s.state != SlotState::Upgrading || s.held {
        return;
    }
    if s.serves() && others_waiting {
        s.gated = true;
        return;
    }
    s.state = SlotState::Succeeded;
    s.finished = Some(now);
    s.left_pool = false;
    s.gated = false;
    // Another type's old process runs on (out of `formation.json`) until the release is
    // promoted, so a rollback finds it running; web keeps its fallback only through a watch.
    let keep_previous = match &s.kind {
        Some(_) => s.live.is_some(),
        None => keep && s.live.is_some(),
    };
    let typed = !s.serves();
    // The swap is decided here and saved with the decision, so that the pool is written
    // right after that one save; a crash between them finds the new process live and the
    // previous one retiring (or kept), and recovery writes the pool the same way.
    if let Some(new) = s.candidate.take() {
        let previous = s.live.replace(new);
        match keep_previous {
            true => s.fallback = previous,
            false => s.retiring = previous,
        }
    }
    actions.push(Action::Swap {
        slot,
        keep_previous,
    });
    actions.push(note(
        LogEvent::ReplicaReady,
        Some(slot),
        s.wave,
        String::new(),
    ));
    // The last other type is ready: web's gated process switches now.
    let web_waits = rollout
        .slots
        .iter()
        .find(|o| o.serves() && o.gated && o.state == SlotState::Upgrading)
        .map(|o| o.slot);
    if let (true, false, Some(web)) = (typed, types_in_flight(rollout), web_waits) {
        ready(rollout, web, now, actions);
    }
}

/// Whether a process of another type is still to be started or gated.
fn types_in_flight(rollout: &Rollout) -> bool {
    rollout
        .slots
        .iter()
        .any(|o| !o.serves() && matches!(o.state, SlotState::Pending | SlotState::Upgrading))
}

/// Web's new process waits for the other types (`gated`) when it is the one web process that
/// moves (a deploy, a rollout of one replica). A replica set's web replicas move by their waves
/// and budgets instead — gated ones would hold their budget while a singleton waited on the
/// replicas that budget keeps pending — with the types in step ([`super::types`]); a type that
/// fails restores every replica that moved all the same (`abort` of a whole release).
fn web_waits_for_types(rollout: &Rollout) -> bool {
    let moving = rollout.waves.iter().flatten();
    moving.filter(|s| rollout.slot(**s).serves()).count() <= 1
}

/// The switch to the slot's new process happened, whatever the state said: the new process
/// serves the slot, the one it replaced (or the fallback kept for it) retires, and the run is
/// complete; the pool is written as it now is and the outcome logged.
fn switch_seen(rollout: &mut Rollout, slot: usize, now: f64, actions: &mut Vec<Action>) {
    let s = rollout.slot_mut(slot);
    s.state = SlotState::Succeeded;
    s.held = false;
    s.finished.get_or_insert(now);
    if let Some(new) = s.candidate.take() {
        if s.live
            .as_ref()
            .is_some_and(|l| l.identity() != new.identity())
        {
            s.retiring = s.live.take();
        }
        s.live = Some(new);
    }
    if s.retiring.is_none() {
        s.retiring = s.fallback.take();
    }
    // The release's other types: their old processes, kept until now (or recorded leaving
    // when the run's rollgate died before they stopped), go.
    for other in &rollout.slots {
        if other.slot != slot && !other.serves() && other.has_an_old_process() {
            actions.push(Action::DropFallback { slot: other.slot });
        }
    }
    rollout.phase = Phase::Completed;
    rollout.pause_reason = None;
    rollout.soak_until = None;
    actions.push(Action::Swap {
        slot,
        keep_previous: false,
    });
    remove_typed_surplus(rollout, now, actions);
    let (event, detail) = outcome(rollout);
    actions.push(note(event, None, None, detail));
    actions.push(Action::Stop);
}

/// A stalled process left running for a person: the rollout pauses with it held (its gate is
/// over; `Accept` puts it in the pool, `Abort` stops it).
fn hold(rollout: &mut Rollout, slot: usize, reason: String, actions: &mut Vec<Action>) {
    let s = rollout.slot_mut(slot);
    s.held = true;
    s.error = Some(reason.clone());
    let wave = s.wave;
    rollout.phase = Phase::Paused;
    rollout.pause_reason = Some(format!("replica {slot} escalated: {reason}"));
    rollout.soak_until = None;
    for s in &mut rollout.slots {
        if s.state == SlotState::Upgrading && !s.held {
            s.state = SlotState::Pending;
            actions.push(Action::Revert { slot: s.slot });
        }
    }
    actions.push(note(LogEvent::Escalated, Some(slot), wave, reason));
    actions.push(Action::Stop);
}

/// A slot's new process failed.
fn fail(rollout: &mut Rollout, slot: usize, reason: String, now: f64, actions: &mut Vec<Action>) {
    let over = rollout.is_over();
    let s = rollout.slot_mut(slot);
    if s.state == SlotState::RollingBack {
        // Its previous version did not come back: the new one keeps serving the slot.
        s.state = SlotState::Succeeded;
        s.error = Some(format!("could not go back: {reason}"));
        actions.push(note(LogEvent::ReplicaFailed, Some(slot), s.wave, reason));
        return;
    }
    // A completed or aborted rollout is not undone by a late report (only the restores an
    // abort began still report, above).
    if over || !matches!(s.state, SlotState::Upgrading | SlotState::Succeeded) {
        return;
    }
    s.state = SlotState::Failed;
    s.finished = Some(now);
    s.error = Some(reason.clone());
    s.left_pool = false;
    s.held = false;
    let (wave, class) = (s.wave, s.class);
    actions.push(Action::Revert { slot });
    actions.push(note(
        LogEvent::ReplicaFailed,
        Some(slot),
        wave,
        reason.clone(),
    ));
    // A required replica's failure aborts even a paused rollout (one held for a person); so
    // does any process of a release of several types: the release goes back whole.
    if class == ReplicaClass::Required {
        let reason = match &rollout.slot(slot).kind {
            Some(kind) => format!("process {} failed: {reason}", kind.name()),
            None => format!("required replica {slot} failed: {reason}"),
        };
        let cause = AbortCause {
            slot: Some(slot),
            reason,
            phase: rollout.phase_name().into(),
        };
        abort(rollout, cause, false, actions);
        return;
    }
    // A paused rollout stays paused: the failure is on record (the slot is `Failed`, its
    // previous version serving it again), and a resume starts it again (`retry_failed`).
    if rollout.phase != Phase::Running {
        return;
    }
    // The failure counts against the wave the replica belongs to, whichever wave is current:
    // a replica of an earlier wave that dies in a later soak is no free failure.
    let wave = wave.unwrap_or(rollout.wave);
    let wave_slots = rollout.waves.get(wave).cloned().unwrap_or_default();
    let failed = wave_slots
        .iter()
        .filter(|s| rollout.slot(**s).state == SlotState::Failed)
        .count();
    let ratio = rollout.settings.max_failure_ratio;
    if too_many_failures(failed, wave_slots.len(), ratio) {
        let reason = format!(
            "wave {} paused itself: {failed} of {} replicas failed, more than the {ratio} allowed; last: replica {slot}: {reason}",
            wave,
            wave_slots.len()
        );
        pause(rollout, reason, actions);
    }
}

/// A person resumed: every best-effort replica that failed in a wave already due goes back to
/// pending and is started again in its wave's place, so a resumed rollout completes only with
/// those replicas on the new version (or pauses again when they fail again). A failure found
/// while the rollout was paused, or by a recovery, is thereby never waved through. Returns the
/// slots retried.
fn retry_failed(rollout: &mut Rollout) -> Vec<usize> {
    let due = due_slots(rollout);
    let mut retried = Vec::new();
    for slot in due {
        let s = rollout.slot_mut(slot);
        if s.state == SlotState::Failed && s.class == ReplicaClass::BestEffort {
            s.state = SlotState::Pending;
            s.finished = None;
            retried.push(slot);
        }
    }
    retried
}

fn list(slots: &[usize]) -> String {
    slots
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Stops where it is: slots still being upgraded go back to their previous version and wait.
fn pause(rollout: &mut Rollout, reason: String, actions: &mut Vec<Action>) {
    rollout.phase = Phase::Paused;
    rollout.pause_reason = Some(reason.clone());
    rollout.soak_until = None;
    for s in &mut rollout.slots {
        if s.state == SlotState::Upgrading {
            s.state = SlotState::Pending;
            actions.push(Action::Revert { slot: s.slot });
        }
    }
    actions.push(note(
        LogEvent::RolloutPaused,
        None,
        Some(rollout.wave),
        reason,
    ));
    actions.push(Action::Stop);
}

fn abort(rollout: &mut Rollout, cause: AbortCause, rollback: bool, actions: &mut Vec<Action>) {
    rollout.phase = Phase::Aborted;
    rollout.soak_until = None;
    // A release of several types goes back whole: every process of it that took the new
    // version returns, its kept old one serving again where there is one.
    let whole = rollout.is_whole_release();
    for s in &mut rollout.slots {
        match s.state {
            SlotState::Upgrading => {
                s.state = SlotState::Pending;
                s.held = false;
                s.gated = false;
                actions.push(Action::Revert { slot: s.slot });
            }
            SlotState::Succeeded if whole && s.fallback.is_some() => {
                s.state = SlotState::RolledBack;
                actions.push(Action::Revert { slot: s.slot });
            }
            SlotState::Succeeded if rollback || whole => {
                s.state = SlotState::RollingBack;
                actions.push(Action::Restore { slot: s.slot });
            }
            _ => {}
        }
    }
    let slot = cause.slot;
    rollout.abort_cause = Some(cause);
    let (event, detail) = outcome(rollout);
    actions.push(note(event, slot, Some(rollout.wave), detail));
    actions.push(Action::Stop);
}

/// The outcome line of an ended rollout: `promoted` with its counts, or `rolled_back` with
/// its cause. Written by the run that ends it, or by whoever finishes it after a crash.
pub fn outcome(rollout: &Rollout) -> (LogEvent, String) {
    if let Some(cause) = rollout.abort_cause.as_ref() {
        let detail = match cause.slot {
            Some(slot) => format!("{} (slot {slot}, {})", cause.reason, cause.phase),
            None => format!("{} ({})", cause.reason, cause.phase),
        };
        return (LogEvent::RolledBack, detail);
    }
    let removed = match rollout.count(SlotState::Removed) {
        0 => String::new(),
        n => format!(", {n} removed"),
    };
    let moved: Vec<usize> = rollout.waves.iter().flatten().copied().collect();
    let types = rollout
        .types_in_step(&moved)
        .map_or(String::new(), |types| format!(" with {types}"));
    let detail = format!(
        "rollout {} completed: {} replica(s) on {}{types}, {} failed, {} left behind{removed}",
        rollout.id,
        rollout.count(SlotState::Succeeded),
        rollout.to,
        rollout.count(SlotState::Failed),
        rollout.count(SlotState::LeftBehind)
    );
    (LogEvent::Promoted, detail)
}

/// Starts what the budgets allow, ends waves, soaks, completes.
fn advance(rollout: &mut Rollout, now: f64, actions: &mut Vec<Action>) {
    remove_surplus(rollout, now, actions);
    loop {
        if let Some(cause) = missed_release_deadline(rollout, now) {
            abort(rollout, cause, false, actions);
            return;
        }
        if let Some(until) = rollout.soak_until {
            if now < until {
                return;
            }
            rollout.soak_until = None;
            rollout.wave += 1;
            continue;
        }
        if rollout.wave >= rollout.waves.len() {
            rollout.phase = Phase::Completed;
            remove_typed_surplus(rollout, now, actions);
            for s in &rollout.slots {
                if s.fallback.is_some() {
                    actions.push(Action::DropFallback { slot: s.slot });
                }
            }
            let (event, detail) = outcome(rollout);
            actions.push(note(event, None, None, detail));
            actions.push(Action::Stop);
            return;
        }
        start_what_fits(rollout, now, actions);
        let wave_slots = rollout.wave_slots().to_vec();
        let busy = due_slots(rollout).iter().any(|s| {
            matches!(
                rollout.slot(*s).state,
                SlotState::Pending | SlotState::Upgrading
            )
        });
        if busy {
            return;
        }
        // The wave is done (its failures stayed within the ratio, or it would have paused).
        let wave = rollout.wave;
        actions.push(note(LogEvent::WaveCompleted, None, Some(wave), {
            let web: Vec<usize> = wave_slots
                .iter()
                .copied()
                .filter(|s| rollout.slot(*s).serves())
                .collect();
            let types = rollout
                .types_in_step(&wave_slots)
                .map_or(String::new(), |types| format!(" with {types}"));
            format!(
                "{} of {} replicas on {}{types}",
                web.iter()
                    .filter(|s| rollout.slot(**s).state == SlotState::Succeeded)
                    .count(),
                web.len(),
                rollout.to
            )
        }));
        // Between waves the soak; after the last, the watch: promoted only once it passed.
        let last = wave + 1 == rollout.waves.len();
        let soak = if last {
            rollout.settings.watch_ms
        } else {
            rollout.settings.soak_ms
        };
        if soak > 0 {
            let until = now + soak as f64 / 1000.0;
            rollout.soak_until = Some(until);
            actions.push(Action::SoakUntil(until));
            return;
        }
        rollout.wave += 1;
    }
}

/// A scale down of web goes first: the pool shrinks to the count asked for before any replica
/// moves, so the budgets (counted on that count) hold from the first wave on. So does the
/// process of a type the release no longer has (a clock renamed must not run beside its new
/// name). A process of a type scaled down runs on until the release is promoted, as its
/// replaced ones do ([`remove_typed_surplus`]): a run that goes back finds it running (issue
/// 80: a scale-down that rolled back never brought back the workers it had stopped first).
fn remove_surplus(rollout: &mut Rollout, now: f64, actions: &mut Vec<Action>) {
    let kept_types: Vec<String> = rollout
        .slots
        .iter()
        .filter(|s| s.state != SlotState::Surplus)
        .filter_map(|s| s.kind.as_ref().map(|k| k.process_type.clone()))
        .collect();
    for s in &mut rollout.slots {
        let scaled_down = s
            .kind
            .as_ref()
            .is_some_and(|k| kept_types.contains(&k.process_type));
        if s.state == SlotState::Surplus && !scaled_down {
            let words = format!(
                "replica {} removed: {} replicas asked for",
                s.slot, rollout.settings.replicas
            );
            remove(s, now, words, actions);
        }
    }
}

/// A surplus slot leaves: its process is taken out and stopped, and the log says why.
fn remove(s: &mut Slot, now: f64, words: String, actions: &mut Vec<Action>) {
    s.state = SlotState::Removed;
    s.finished = Some(now);
    actions.push(Action::Remove { slot: s.slot });
    actions.push(note(LogEvent::ReplicaRemoved, Some(s.slot), None, words));
}

/// At the promotion: the other types' processes that have no place in the release (its type
/// scaled down, or gone from its Procfile) leave.
fn remove_typed_surplus(rollout: &mut Rollout, now: f64, actions: &mut Vec<Action>) {
    for s in &mut rollout.slots {
        let Some(kind) = s.kind.as_ref().filter(|_| s.state == SlotState::Surplus) else {
            continue;
        };
        let words = format!("{} stopped: the release has no place for it", kind.name());
        remove(s, now, words, actions);
    }
}

/// A required replica not confirmed when the release deadline passes aborts the rollout.
fn missed_release_deadline(rollout: &Rollout, now: f64) -> Option<AbortCause> {
    if now < rollout.settings.release_deadline {
        return None;
    }
    let waiting = rollout.slots.iter().find(|s| s.awaits_confirmation())?;
    Some(AbortCause {
        slot: Some(waiting.slot),
        reason: format!(
            "required replica {} not confirmed by the release deadline",
            waiting.slot
        ),
        phase: rollout.phase_name().into(),
    })
}

/// The slots of every wave up to the current one, earliest first: a slot of a past wave can be
/// pending again (a recovery found its swap undone), and its wave's place is kept for it.
fn due_slots(rollout: &Rollout) -> Vec<usize> {
    let through = (rollout.wave + 1).min(rollout.waves.len());
    rollout.waves[..through].iter().flatten().copied().collect()
}

/// Starts pending slots due by the current wave while a surge or unavailable place is free.
fn start_what_fits(rollout: &mut Rollout, now: f64, actions: &mut Vec<Action>) {
    let settings = rollout.settings.clone();
    for slot in due_slots(rollout) {
        // Web's budgets count web's replicas only.
        let upgrading = |r: &Rollout, in_place: bool| {
            r.slots
                .iter()
                .filter(|s| s.serves())
                .filter(|s| s.state == SlotState::Upgrading && s.left_pool == in_place)
                .count()
        };
        // A slot whose previous version is still being brought back (a failure's revert, its
        // process named as the candidate until it is in the pool) moves again only once that
        // process serves: the executor ticks when it does.
        if rollout.slot(slot).state != SlotState::Pending || rollout.slot(slot).candidate.is_some()
        {
            continue;
        }
        // Another type's process starts at once, by its type's rule: beside its old one, or
        // (stop-first, a singleton) once its old one is gone.
        let typed = rollout
            .slot(slot)
            .kind
            .as_ref()
            .map(|kind| kind.stop_first && rollout.slot(slot).live.is_some());
        // A stop-first type (a singleton) is stopped last: only once everything else of the
        // release is ready, so a release that fails elsewhere never touched it.
        if typed == Some(true) && others_in_flight(rollout, slot) {
            continue;
        }
        let beside = match typed {
            Some(stop_first) => !stop_first,
            None => upgrading(rollout, false) < settings.surge || rollout.slot(slot).live.is_none(),
        };
        let in_place =
            !beside && (typed.is_some() || upgrading(rollout, true) < settings.unavailable);
        if !beside && !in_place {
            break;
        }
        let s = rollout.slot_mut(slot);
        s.state = SlotState::Upgrading;
        s.started = Some(now);
        s.error = None;
        s.left_pool = in_place;
        actions.push(if beside {
            Action::StartBeside { slot }
        } else {
            Action::StartInPlace { slot }
        });
    }
}

/// Whether any slot due by the current wave but `slot` that starts beside its old process is
/// still pending or being gated (web waiting for the other types, `gated`, counts as ready).
fn others_in_flight(rollout: &Rollout, slot: usize) -> bool {
    rollout.slots.iter().any(|o| {
        let stops_first = o.kind.as_ref().is_some_and(|k| k.stop_first) && o.live.is_some();
        let due = o.wave.is_none_or(|w| w <= rollout.wave);
        o.slot != slot
            && due
            && !stops_first
            && (o.state == SlotState::Pending || (o.state == SlotState::Upgrading && !o.gated))
    })
}

#[cfg(test)]
pub(in crate::engine) mod tests {
    use super::*;
    use crate::engine::budgets::{assign_waves, Budgets};
    use crate::engine::state::{Process, Settings, Slot};

    pub(in crate::engine) fn rollout(
        replicas: usize,
        surge: u64,
        unavailable: u64,
        soak_ms: u64,
    ) -> Rollout {
        let budgets = Budgets::of(replicas, surge, unavailable);
        let slots: Vec<usize> = (0..replicas).collect();
        let waves = assign_waves(&slots, &[1, 10, 50, 100]);
        Rollout {
            id: "r1".into(),
            service: "edge-svc".into(),
            from: Some("v1".into()),
            to: "v2".into(),
            started_at: 0.0,
            phase: Phase::Running,
            settings: Settings {
                replicas,
                surge: budgets.surge,
                unavailable: budgets.unavailable,
                progress_deadline_ms: 1000,
                poll_ms: 50,
                min_ready_ms: 0,
                soak_ms,
                max_failure_ratio: 0.05,
                grace_ms: 1000,
                drain_ms: 1000,
                release_deadline: 1000.0,
                ports: (9000, 9999),
                wave_percents: vec![1, 10, 50, 100],
                watch_ms: 0,
                on_stall: Default::default(),
                soak_failures: 1,
                keep_fallback: false,
                output: Default::default(),
                stop_first: false,
                launch: Default::default(),
                analysis: None,
            },
            slots: slots
                .iter()
                .map(|&slot| Slot {
                    wave: waves.iter().position(|w| w.contains(&slot)),
                    ..Slot::new(
                        slot,
                        ReplicaClass::BestEffort,
                        SlotState::Pending,
                        Some(Process {
                            version: "v1".into(),
                            port: 9000 + slot as u16,
                            pid: 100 + slot as i32,
                            start_time: 1,
                            token: String::new(),
                            launch: None,
                        }),
                    )
                })
                .collect(),
            waves,
            wave: 0,
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

    /// The slots whose new process the actions start (beside or in place).
    pub(in crate::engine) fn starts(actions: &[Action]) -> Vec<usize> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::StartBeside { slot } | Action::StartInPlace { slot } => Some(*slot),
                _ => None,
            })
            .collect()
    }

    /// Drives a rollout to its end, the lowest upgrading slot becoming ready each time;
    /// returns the order in which slots started and the most upgrading at once.
    pub(in crate::engine) fn run_all_ready(r: &mut Rollout) -> (Vec<usize>, usize) {
        let mut now = 0.0;
        let mut order = starts(&step(r, Event::Tick, now));
        let mut widest = 0;
        for _ in 0..10_000 {
            if r.phase != Phase::Running {
                return (order, widest);
            }
            widest = widest.max(r.count(SlotState::Upgrading));
            now += 0.1;
            let upgrading = r.slots.iter().find(|s| s.state == SlotState::Upgrading);
            let next = match upgrading.map(|s| s.slot) {
                Some(slot) => step(r, Event::Ready { slot }, now),
                None => {
                    now = r.soak_until.unwrap_or(now);
                    step(r, Event::Tick, now)
                }
            };
            order.extend(starts(&next));
        }
        panic!("the rollout never ended: {r:?}");
    }

    #[test]
    fn a_good_rollout_moves_wave_by_wave_within_its_budgets_and_completes() {
        let mut r = rollout(10, 25, 0, 1000);
        let (order, widest) = run_all_ready(&mut r);
        assert_eq!(r.phase, Phase::Completed);
        assert_eq!(order, (0..10).collect::<Vec<_>>());
        assert!(widest <= 3, "surge 3 allows 3 at once, saw {widest}");
        assert_eq!(r.count(SlotState::Succeeded), 10);
    }

    #[test]
    fn a_slot_of_a_past_wave_pending_again_is_upgraded_before_the_rollout_completes() {
        // The canary was ready and the rollout moved to the last wave in the same step; a crash
        // before the swap left the canary on v1, and recovery made it pending again.
        let mut r = rollout(4, 25, 0, 0);
        r.waves = vec![vec![0], vec![1, 2, 3]];
        step(&mut r, Event::Tick, 0.0);
        step(&mut r, Event::Ready { slot: 0 }, 0.1);
        assert_eq!(r.wave, 1);
        r.slot_mut(0).state = SlotState::Pending;
        for slot in [1, 2, 3] {
            r.slot_mut(slot).state = SlotState::Pending;
        }
        let (order, _) = run_all_ready(&mut r);
        assert_eq!(order, [0, 1, 2, 3], "the canary's slot goes first");
        assert_eq!(r.phase, Phase::Completed);
        assert_eq!(r.count(SlotState::Succeeded), 4);
    }

    #[test]
    fn a_scale_down_removes_the_surplus_before_anything_starts() {
        let mut r = rollout(5, 25, 0, 0);
        r.settings.replicas = 3;
        for slot in [3, 4] {
            let s = r.slot_mut(slot);
            s.state = SlotState::Surplus;
            s.wave = None;
        }
        r.waves = vec![vec![0], vec![1, 2]];
        let actions = step(&mut r, Event::Tick, 0.0);
        let first: Vec<&Action> = actions
            .iter()
            .filter(|a| !matches!(a, Action::Log(_)))
            .take(3)
            .collect();
        assert_eq!(
            first,
            [
                &Action::Remove { slot: 3 },
                &Action::Remove { slot: 4 },
                &Action::StartBeside { slot: 0 }
            ]
        );
        assert!(step(&mut r, Event::Tick, 0.1)
            .iter()
            .all(|a| !matches!(a, Action::Remove { .. })));
        run_all_ready(&mut r);
        assert_eq!(r.phase, Phase::Completed);
        assert_eq!(
            (r.count(SlotState::Succeeded), r.count(SlotState::Removed)),
            (3, 2)
        );
    }

    #[test]
    fn without_surge_replicas_are_replaced_in_place_one_unavailable_at_a_time() {
        let mut r = rollout(4, 0, 0, 0);
        let actions = step(&mut r, Event::Tick, 0.0);
        assert_eq!(actions, vec![Action::StartInPlace { slot: 0 }]);
        let actions = step(&mut r, Event::Ready { slot: 0 }, 0.1);
        assert_eq!(
            actions[0],
            Action::Swap {
                slot: 0,
                keep_previous: false
            }
        );
        assert_eq!(starts(&actions), [1]);
        let (_, widest) = run_all_ready(&mut r);
        assert_eq!(widest, 1);
    }

    #[test]
    fn the_next_wave_waits_for_the_soak() {
        let mut r = rollout(10, 100, 0, 2000);
        let actions = step(&mut r, Event::Tick, 0.0);
        assert_eq!(starts(&actions), [0], "the canary alone");
        let actions = step(&mut r, Event::Ready { slot: 0 }, 1.0);
        assert!(actions.contains(&Action::SoakUntil(3.0)), "{actions:?}");
        assert!(starts(&actions).is_empty());
        assert!(starts(&step(&mut r, Event::Tick, 2.9)).is_empty());
        assert_eq!(starts(&step(&mut r, Event::Tick, 3.0)), [1]);
    }

    /// Issue 36: two replicas, waves 50 and 100 %. Paused in the canary's soak, the canary's
    /// new process dies; a resume must not go on to "completed, 1 failed" with slot 0 on the
    /// old version: it starts slot 0 again, and completes only once both are on v2.
    #[test]
    fn a_failure_found_while_paused_is_retried_on_resume_not_waved_through() {
        let mut r = rollout(2, 100, 0, 5000);
        r.waves = vec![vec![0], vec![1]];
        r.settings.wave_percents = vec![50, 100];
        for s in &mut r.slots {
            s.wave = Some(s.slot);
        }
        step(&mut r, Event::Tick, 0.0);
        step(&mut r, Event::Ready { slot: 0 }, 0.1);
        assert!(r.soak_until.is_some(), "the canary soaks");
        step(
            &mut r,
            Event::Pause {
                reason: "by hand".into(),
            },
            1.0,
        );
        assert_eq!(r.phase, Phase::Paused);
        let actions = step(
            &mut r,
            Event::Failed {
                slot: 0,
                reason: "exited (signal 9)".into(),
            },
            2.0,
        );
        assert!(actions.contains(&Action::Revert { slot: 0 }));
        assert_eq!(r.phase, Phase::Paused, "still paused, for a person");
        let actions = step(&mut r, Event::Resume, 3.0);
        assert_eq!(starts(&actions), [0], "the failed canary is started again");
        assert!(actions.iter().any(|a| matches!(a, Action::Log(n)
            if n.event == LogEvent::RolloutResumed && n.detail.contains("retrying failed replica(s) 0"))));
        // Failing again is 1 of 1 in the canary: paused again, never completed.
        step(
            &mut r,
            Event::Failed {
                slot: 0,
                reason: "exit 1".into(),
            },
            3.5,
        );
        assert_eq!(r.phase, Phase::Paused);
        assert!(r
            .pause_reason
            .as_deref()
            .unwrap()
            .contains("wave 0 paused itself"));
        // Resumed and ready this time: the canary soaks, then slot 1 moves, then completed.
        step(&mut r, Event::Resume, 4.0);
        step(&mut r, Event::Ready { slot: 0 }, 4.1);
        step(&mut r, Event::Tick, 10.0);
        step(&mut r, Event::Ready { slot: 1 }, 10.1);
        assert_eq!(r.phase, Phase::Completed);
        assert_eq!(r.count(SlotState::Succeeded), 2);
        assert_eq!(r.count(SlotState::Failed), 0);
    }

    /// A replica of an earlier wave that fails in a later wave's soak counts against its own
    /// wave (here the canary, 1 of 1), not the current one (1 of 8 would pass at 0.2).
    #[test]
    fn an_earlier_waves_failure_counts_against_its_own_wave() {
        let mut r = rollout(10, 100, 0, 5000);
        r.settings.max_failure_ratio = 0.2;
        step(&mut r, Event::Tick, 0.0);
        step(&mut r, Event::Ready { slot: 0 }, 0.1);
        step(&mut r, Event::Tick, 6.0);
        assert_eq!(r.wave, 1);
        let actions = step(
            &mut r,
            Event::Failed {
                slot: 0,
                reason: "stopped answering".into(),
            },
            6.5,
        );
        assert_eq!(r.phase, Phase::Paused, "{actions:?}");
        assert!(r
            .pause_reason
            .as_deref()
            .unwrap()
            .contains("wave 0 paused itself: 1 of 1"));
    }

    #[test]
    fn too_many_failures_in_a_wave_pause_it_and_the_rest_go_back() {
        let mut r = rollout(20, 100, 0, 0);
        // Through the canary and wave 1 (slots 0 and 1).
        step(&mut r, Event::Tick, 0.0);
        step(&mut r, Event::Ready { slot: 0 }, 0.1);
        step(&mut r, Event::Ready { slot: 1 }, 0.2);
        assert_eq!(r.wave, 2);
        let actions = step(
            &mut r,
            Event::Failed {
                slot: 2,
                reason: "not ready after 1000 ms".into(),
            },
            0.3,
        );
        // 1 of 8 is more than 5 %: paused, and the other upgrading slots revert.
        assert_eq!(r.phase, Phase::Paused);
        assert!(r
            .pause_reason
            .as_ref()
            .unwrap()
            .contains("wave 2 paused itself"));
        // The progress line names the same wave (it once counted from 1: "wave 3/4").
        let line = crate::engine::view::line(&r);
        assert!(line.contains("· wave 2 of 4 ·"), "{line}");
        let mut done = r.clone();
        done.phase = Phase::Completed;
        let line = crate::engine::view::line(&done);
        assert!(line.contains("· completed · all 4 waves ·"), "{line}");
        let reverts = actions
            .iter()
            .filter(|a| matches!(a, Action::Revert { .. }))
            .count();
        assert_eq!(reverts, 8, "{actions:?}");
        assert_eq!(actions.last(), Some(&Action::Stop));
        assert_eq!(r.slot(3).state, SlotState::Pending);
        // Resumed, it carries on with the wave's pending slots, the failed one first again.
        let actions = step(&mut r, Event::Resume, 1.0);
        assert_eq!(starts(&actions), [2, 3, 4, 5, 6, 7, 8, 9]);
    }

    #[test]
    fn a_required_replica_aborts_at_once_and_a_best_effort_one_under_the_ratio_does_not() {
        let mut r = rollout(40, 100, 0, 0);
        r.settings.max_failure_ratio = 0.5;
        r.slots[5].class = ReplicaClass::Required;
        step(&mut r, Event::Tick, 0.0);
        step(&mut r, Event::Ready { slot: 0 }, 0.1);
        // Wave 1 holds slots 1..4; slot 2 (best effort) fails under the ratio.
        step(
            &mut r,
            Event::Failed {
                slot: 2,
                reason: "exit 1".into(),
            },
            0.2,
        );
        assert_eq!(r.phase, Phase::Running);
        for slot in [1, 3] {
            step(&mut r, Event::Ready { slot }, 0.3);
        }
        assert_eq!(r.wave, 2);
        let actions = step(
            &mut r,
            Event::Failed {
                slot: 5,
                reason: "exit 2".into(),
            },
            0.4,
        );
        assert_eq!(r.phase, Phase::Aborted);
        let cause = r.abort_cause.clone().unwrap();
        assert_eq!((cause.slot, cause.phase.as_str()), (Some(5), "release"));
        assert!(actions
            .iter()
            .any(|a| matches!(a, Action::Log(n) if n.event == LogEvent::RolledBack)));
    }

    #[test]
    fn a_required_replica_not_confirmed_by_the_release_deadline_aborts() {
        let mut r = rollout(3, 100, 0, 0);
        r.slots[2].class = ReplicaClass::Required;
        r.settings.release_deadline = 5.0;
        step(&mut r, Event::Tick, 0.0);
        step(&mut r, Event::Ready { slot: 0 }, 1.0);
        assert_eq!(r.phase, Phase::Running);
        step(&mut r, Event::Tick, 5.0);
        assert_eq!(r.phase, Phase::Aborted);
        assert_eq!(r.abort_cause.as_ref().unwrap().slot, Some(2));
    }

    /// A single deploy's shape: one replica, required, kept as fallback through the watch.
    fn single(watch_ms: u64, on_stall: OnStall) -> Rollout {
        let mut r = rollout(1, 100, 0, 0);
        r.settings.watch_ms = watch_ms;
        r.settings.keep_fallback = true;
        r.settings.on_stall = on_stall;
        r.slot_mut(0).class = ReplicaClass::Required;
        r
    }

    fn without_logs(actions: Vec<Action>) -> Vec<Action> {
        actions
            .into_iter()
            .filter(|a| !matches!(a, Action::Log(_)))
            .collect()
    }

    fn logged(actions: &[Action]) -> Vec<LogEvent> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Log(note) => Some(note.event),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_single_deploy_keeps_its_previous_release_through_the_watch_and_drops_it_at_the_end() {
        let mut r = single(2000, OnStall::Rollback);
        assert_eq!(
            without_logs(step(&mut r, Event::Tick, 0.0)),
            [Action::StartBeside { slot: 0 }]
        );
        assert_eq!(
            without_logs(step(&mut r, Event::Ready { slot: 0 }, 1.0)),
            [
                Action::Swap {
                    slot: 0,
                    keep_previous: true
                },
                Action::SoakUntil(3.0)
            ]
        );
        // The executor keeps the replaced process as the fallback.
        r.slot_mut(0).fallback = r.slot(0).live.clone();
        assert!(without_logs(step(&mut r, Event::Tick, 2.0)).is_empty());
        let end = step(&mut r, Event::Tick, 3.0);
        assert_eq!(logged(&end), [LogEvent::Promoted]);
        assert_eq!(
            without_logs(end),
            [Action::DropFallback { slot: 0 }, Action::Stop]
        );
        assert_eq!(r.phase, Phase::Completed);
    }

    #[test]
    fn a_first_release_or_a_rollout_keeps_no_fallback() {
        let mut first = single(2000, OnStall::Rollback);
        first.slot_mut(0).live = None;
        step(&mut first, Event::Tick, 0.0);
        assert!(
            step(&mut first, Event::Ready { slot: 0 }, 1.0).contains(&Action::Swap {
                slot: 0,
                keep_previous: false
            })
        );
        // A rollout of several replicas does not keep them (they would take its surge places).
        let mut r = rollout(2, 100, 0, 0);
        r.settings.watch_ms = 2000;
        step(&mut r, Event::Tick, 0.0);
        assert!(
            step(&mut r, Event::Ready { slot: 0 }, 1.0).contains(&Action::Swap {
                slot: 0,
                keep_previous: false
            })
        );
    }

    #[test]
    fn a_switch_seen_in_current_completes_the_run_with_the_new_process_live() {
        // Mid-watch: the new process live, the previous one kept as the fallback.
        let process = |version: &str, port: u16, pid: i32| Process {
            version: version.into(),
            port,
            pid,
            start_time: pid as u64,
            token: format!("t{pid}"),
            launch: None,
        };
        let mut r = single(2000, OnStall::Rollback);
        r.slot_mut(0).live = Some(process("v1", 9000, 10));
        step(&mut r, Event::Tick, 0.0);
        r.slot_mut(0).candidate = Some(process("v2", 9001, 11));
        step(&mut r, Event::Ready { slot: 0 }, 1.0);
        let new = r.slot(0).live.clone();
        let previous = r.slot(0).fallback.clone();
        assert!(previous.is_some());
        let actions = step(&mut r, Event::SwitchSeen { slot: 0 }, 1.5);
        assert_eq!(
            without_logs(actions.clone()),
            [
                Action::Swap {
                    slot: 0,
                    keep_previous: false
                },
                Action::Stop
            ]
        );
        assert_eq!(logged(&actions), [LogEvent::Promoted]);
        assert_eq!(r.phase, Phase::Completed);
        assert_eq!(r.slot(0).live, new);
        assert_eq!(r.slot(0).retiring, previous);
        assert_eq!(r.slot(0).fallback, None);
        assert_eq!(r.soak_until, None);

        // Escalated, and switched by a promote that was cut short: the held process is live.
        let mut held = single(0, OnStall::Escalate);
        held.slot_mut(0).live = Some(process("v1", 9000, 10));
        step(&mut held, Event::Tick, 0.0);
        held.slot_mut(0).candidate = Some(process("v2", 9001, 12));
        step(
            &mut held,
            Event::Stalled {
                slot: 0,
                reason: "not ready".into(),
            },
            1.0,
        );
        let candidate = held.slot(0).candidate.clone();
        assert!(held.slot(0).held && candidate.is_some());
        step(&mut held, Event::SwitchSeen { slot: 0 }, 2.0);
        assert_eq!(held.phase, Phase::Completed);
        assert!(!held.slot(0).held);
        assert_eq!(held.slot(0).state, SlotState::Succeeded);
        assert_eq!(held.slot(0).live, candidate);
        assert_eq!(held.pause_reason, None);
    }

    #[test]
    fn a_failure_in_the_watch_reverts_to_the_fallback_and_aborts_a_required_replica() {
        let mut r = single(2000, OnStall::Rollback);
        step(&mut r, Event::Tick, 0.0);
        step(&mut r, Event::Ready { slot: 0 }, 1.0);
        r.slot_mut(0).fallback = r.slot(0).live.clone();
        let failed = step(
            &mut r,
            Event::Failed {
                slot: 0,
                reason: "exited during the watch".into(),
            },
            1.5,
        );
        assert_eq!(
            logged(&failed),
            [LogEvent::ReplicaFailed, LogEvent::RolledBack]
        );
        assert_eq!(
            without_logs(failed),
            [Action::Revert { slot: 0 }, Action::Stop]
        );
        assert_eq!(r.phase, Phase::Aborted);
        assert_eq!(r.abort_cause.as_ref().and_then(|c| c.slot), Some(0));
    }

    #[test]
    fn a_stall_escalates_when_the_policy_says_so_and_a_person_decides() {
        let stalled = || Event::Stalled {
            slot: 0,
            reason: "not ready after 600 ms".into(),
        };
        // Rolled back by default: a stall is a failure.
        let mut r = single(0, OnStall::Rollback);
        step(&mut r, Event::Tick, 0.0);
        assert!(step(&mut r, stalled(), 1.0).contains(&Action::Revert { slot: 0 }));
        assert_eq!(r.phase, Phase::Aborted);

        // Escalated: held, running, the rollout paused; resume does not move it.
        let mut r = single(2000, OnStall::Escalate);
        step(&mut r, Event::Tick, 0.0);
        let held = step(&mut r, stalled(), 1.0);
        assert_eq!(logged(&held), [LogEvent::Escalated]);
        assert_eq!(without_logs(held), [Action::Stop]);
        assert!(r.slot(0).held && r.slot(0).state == SlotState::Upgrading);
        assert_eq!(r.phase, Phase::Paused);
        assert!(step(&mut r, Event::Resume, 2.0).is_empty());
        assert_eq!(r.phase, Phase::Paused);

        // Accepted by a person: in the pool at once, no watch, promoted.
        let mut accepted = r.clone();
        let actions = step(&mut accepted, Event::Accept { slot: 0 }, 3.0);
        assert_eq!(
            without_logs(actions.clone()),
            [
                Action::Swap {
                    slot: 0,
                    keep_previous: false
                },
                Action::Stop
            ]
        );
        assert!(logged(&actions).contains(&LogEvent::Promoted));
        assert_eq!(accepted.phase, Phase::Completed);

        // Aborted by a person: stopped, the previous release stays.
        let mut aborted = r;
        let actions = step(
            &mut aborted,
            Event::Abort {
                reason: "aborted by hand".into(),
                rollback: false,
            },
            3.0,
        );
        assert_eq!(
            without_logs(actions),
            [Action::Revert { slot: 0 }, Action::Stop]
        );
        assert!(!aborted.slot(0).held);
        assert_eq!(aborted.phase, Phase::Aborted);
    }

    #[test]
    fn abort_with_rollback_restores_every_replica_that_moved() {
        let mut r = rollout(10, 100, 0, 0);
        step(&mut r, Event::Tick, 0.0);
        step(&mut r, Event::Ready { slot: 0 }, 0.1);
        step(&mut r, Event::Ready { slot: 1 }, 0.2);
        let actions = step(
            &mut r,
            Event::Abort {
                reason: "by hand".into(),
                rollback: true,
            },
            0.3,
        );
        assert_eq!(r.phase, Phase::Aborted);
        let restores: Vec<usize> = actions
            .iter()
            .filter_map(|a| match a {
                Action::Restore { slot } => Some(*slot),
                _ => None,
            })
            .collect();
        assert_eq!(restores, [0, 1]);
        for slot in [0, 1] {
            step(&mut r, Event::Restored { slot }, 0.4);
        }
        assert_eq!(r.count(SlotState::RolledBack), 2);
        // A restore that fails leaves the new version serving the slot, and says so.
        let mut r2 = rollout(10, 100, 0, 0);
        step(&mut r2, Event::Tick, 0.0);
        step(&mut r2, Event::Ready { slot: 0 }, 0.1);
        step(
            &mut r2,
            Event::Abort {
                reason: "x".into(),
                rollback: true,
            },
            0.2,
        );
        let actions = step(
            &mut r2,
            Event::Failed {
                slot: 0,
                reason: "not ready after 1000 ms".into(),
            },
            0.3,
        );
        assert_eq!(r2.slot(0).state, SlotState::Succeeded);
        assert_eq!(
            r2.slot(0).error.as_deref(),
            Some("could not go back: not ready after 1000 ms")
        );
        assert!(actions
            .iter()
            .all(|a| matches!(a, Action::Log(n) if n.event == LogEvent::ReplicaFailed)));
        // An aborted rollout never moves again by itself.
        assert!(step(&mut r, Event::Tick, 9.0).is_empty());
        assert!(step(&mut r, Event::Resume, 9.0).is_empty());
    }

    /// What the executor does to the state for an action (the parts the rules depend on): a
    /// start records a candidate (an in-place one takes the live process out first), a swap
    /// puts it in the pool (keeping the replaced one as the fallback when asked), a revert goes
    /// back to the fallback or the previous version, a drop or removal forgets a process.
    fn perform_on_state(r: &mut Rollout, action: &Action) {
        let slot = match action {
            Action::StartBeside { slot }
            | Action::StartInPlace { slot }
            | Action::Swap { slot, .. }
            | Action::DropFallback { slot }
            | Action::Revert { slot }
            | Action::Remove { slot } => *slot,
            _ => return,
        };
        let from = r.slot(slot).from_version.clone();
        let s = r.slot_mut(slot);
        match action {
            Action::StartBeside { .. } | Action::StartInPlace { .. } => {
                if matches!(action, Action::StartInPlace { .. }) {
                    s.live = None;
                }
                s.candidate = Some(Process {
                    version: "v2".into(),
                    port: 9500 + slot as u16,
                    pid: 500 + slot as i32,
                    start_time: 2,
                    token: format!("r1-{slot}"),
                    launch: None,
                });
            }
            Action::Swap { keep_previous, .. } => {
                if let Some(new) = s.candidate.take() {
                    let old = s.live.replace(new);
                    if *keep_previous {
                        s.fallback = old;
                    }
                }
            }
            Action::DropFallback { .. } => {
                s.fallback = None;
                s.retiring = None;
            }
            Action::Revert { .. } => {
                s.candidate = None;
                if let Some(kept) = s.fallback.take() {
                    s.live = Some(kept);
                } else if s
                    .live
                    .as_ref()
                    .is_none_or(|l| Some(&l.version) != from.as_ref())
                {
                    // Brought back on its previous version.
                    s.live = from.map(|version| Process {
                        version,
                        port: 9000 + slot as u16,
                        pid: 900 + slot as i32,
                        start_time: 3,
                        token: String::new(),
                        launch: None,
                    });
                }
            }
            Action::Remove { .. } => s.live = None,
            _ => {}
        }
    }

    proptest::proptest! {
        /// Whatever happens to a single deploy, and in whatever order a person or a signal
        /// steps in: it ends once (one `promoted` or one `rolled_back`), is promoted only after
        /// its whole watch with its fallback dropped first, and never leaves more than its live
        /// release and one other process named.
        #[test]
        fn a_single_deploy_ends_once_and_only_after_its_watch(
            watch in proptest::sample::select(vec![0u64, 2000]),
            escalates in proptest::bool::ANY,
            events in proptest::collection::vec(0u8..8, 1..60),
        ) {
            let on_stall = if escalates { OnStall::Escalate } else { OnStall::Rollback };
            let mut r = single(watch, on_stall);
            let mut now = 0.0;
            let mut outcomes = Vec::new();
            let mut ready_at = None;
            for action in step(&mut r, Event::Tick, now) {
                perform_on_state(&mut r, &action);
            }
            for e in events {
                now += 0.5;
                let event = match e {
                    0 => Event::Ready { slot: 0 },
                    1 => Event::Failed { slot: 0, reason: "exit 3".into() },
                    2 => Event::Stalled { slot: 0, reason: "not ready".into() },
                    3 => Event::Accept { slot: 0 },
                    4 => Event::Abort { reason: "by hand".into(), rollback: false },
                    5 => Event::Resume,
                    _ => Event::Tick,
                };
                if matches!(event, Event::Ready { .. }) && r.slot(0).state == SlotState::Upgrading && !r.slot(0).held {
                    ready_at = Some(now);
                }
                let was_over = r.is_over();
                let actions = step(&mut r, event, now);
                if was_over {
                    proptest::prop_assert!(actions.is_empty(), "{actions:?} after the end");
                }
                let mut dropped = false;
                for action in &actions {
                    perform_on_state(&mut r, action);
                    match action {
                        Action::DropFallback { .. } => dropped = true,
                        Action::Log(note) if note.event.is_outcome() => {
                            outcomes.push(note.event);
                            if note.event == LogEvent::Promoted {
                                proptest::prop_assert_eq!(r.slot(0).state, SlotState::Succeeded);
                                proptest::prop_assert!(r.slot(0).fallback.is_none());
                                if dropped {
                                    let at = ready_at.expect("a fallback is kept only after a ready");
                                    proptest::prop_assert!(now >= at + watch as f64 / 1000.0, "promoted {now} before the watch from {at} ended");
                                }
                            }
                        }
                        _ => {}
                    }
                }
                let s = r.slot(0);
                let named = s.live.iter().chain(s.candidate.iter()).chain(s.fallback.iter()).count();
                proptest::prop_assert!(named <= 2, "{named} processes named: {s:?}");
                proptest::prop_assert!(!(s.candidate.is_some() && s.fallback.is_some()));
            }
            proptest::prop_assert!(outcomes.len() <= 1, "{outcomes:?}");
        }

        /// A rollout of several replicas, whatever its replicas report and whenever a person
        /// pauses, resumes or aborts it: it ends once, never starts a replica once it has
        /// ended, and completes only with every replica of every wave moved or failed within
        /// the ratio, none of them required and failed.
        #[test]
        fn a_rollout_ends_once_whatever_happens_in_whatever_order(
            replicas in 1usize..=12,
            surge in 0u64..=100,
            required in proptest::collection::vec(proptest::bool::weighted(0.2), 12),
            events in proptest::collection::vec((0u8..9, 0usize..12), 1..200),
        ) {
            let mut r = rollout(replicas, surge, 0, 500);
            r.settings.max_failure_ratio = 0.5;
            for (slot, required) in required.iter().enumerate().take(replicas) {
                if *required {
                    r.slot_mut(slot).class = ReplicaClass::Required;
                }
            }
            let mut now = 0.0;
            let mut outcomes = Vec::new();
            for action in step(&mut r, Event::Tick, now) {
                perform_on_state(&mut r, &action);
            }
            for (kind, pick) in events {
                now += 0.2;
                let pick_in = |state: SlotState| {
                    let found: Vec<usize> = r.slots.iter().filter(|s| s.state == state).map(|s| s.slot).collect();
                    (!found.is_empty()).then(|| found[pick % found.len()])
                };
                let event = match kind {
                    0..=2 => pick_in(SlotState::Upgrading).map(|slot| Event::Ready { slot }),
                    3 => pick_in(SlotState::Upgrading).map(|slot| Event::Failed { slot, reason: "exit 1".into() }),
                    4 => pick_in(SlotState::Succeeded).map(|slot| Event::Failed { slot, reason: "in the soak".into() }),
                    5 => Some(Event::Pause { reason: "by hand".into() }),
                    6 => Some(Event::Resume),
                    7 => Some(Event::Abort { reason: "by hand".into(), rollback: pick % 2 == 0 }),
                    _ => pick_in(SlotState::RollingBack).map(|slot| Event::Restored { slot }),
                };
                let event = event.unwrap_or(Event::Tick);
                let was_over = r.is_over();
                let actions = step(&mut r, event, now);
                for action in &actions {
                    if was_over {
                        proptest::prop_assert!(
                            !matches!(action, Action::StartBeside { .. } | Action::StartInPlace { .. } | Action::Swap { .. } | Action::Revert { .. }),
                            "{action:?} after the end"
                        );
                    }
                    perform_on_state(&mut r, action);
                    if let Action::Log(note) = action {
                        if note.event.is_outcome() {
                            outcomes.push(note.event);
                        }
                    }
                }
                if r.phase == Phase::Completed {
                    for s in &r.slots {
                        proptest::prop_assert!(
                            !matches!(s.state, SlotState::Pending | SlotState::Upgrading | SlotState::RollingBack),
                            "completed with {s:?}"
                        );
                        proptest::prop_assert!(
                            !(s.class == ReplicaClass::Required && s.state == SlotState::Failed),
                            "completed with a required replica failed: {s:?}"
                        );
                    }
                    // Failures only within each wave's ratio, whenever they were found.
                    for wave in &r.waves {
                        let failed = wave.iter().filter(|s| r.slot(**s).state == SlotState::Failed).count();
                        proptest::prop_assert!(
                            !too_many_failures(failed, wave.len(), r.settings.max_failure_ratio),
                            "completed with {failed} of {} failed in one wave", wave.len()
                        );
                    }
                }
                proptest::prop_assert!(outcomes.len() <= 1, "{outcomes:?}");
            }
        }

        #[test]
        fn the_budgets_hold_whatever_succeeds_or_fails(
            replicas in 1usize..=40,
            surge in 0u64..=100,
            unavailable in 0u64..=100,
            outcomes in proptest::collection::vec(0u8..10, 1..400),
        ) {
            let mut r = rollout(replicas, surge, unavailable, 0);
            r.settings.max_failure_ratio = 0.5;
            let mut now = 0.0;
            step(&mut r, Event::Tick, now);
            for outcome in outcomes {
                let upgrading = |r: &Rollout, left: bool| {
                    r.slots.iter().filter(|s| s.state == SlotState::Upgrading && s.left_pool == left).count()
                };
                proptest::prop_assert!(upgrading(&r, true) <= r.settings.unavailable);
                proptest::prop_assert!(upgrading(&r, false) <= r.settings.surge);
                let Some(slot) = r.slots.iter().find(|s| s.state == SlotState::Upgrading).map(|s| s.slot) else {
                    break;
                };
                now += 0.1;
                let event = if outcome == 0 {
                    Event::Failed { slot, reason: "exit 1".into() }
                } else {
                    Event::Ready { slot }
                };
                step(&mut r, event, now);
                if r.phase == Phase::Paused {
                    step(&mut r, Event::Resume, now);
                }
            }
        }
    }
}
