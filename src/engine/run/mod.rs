//! The executor: performs what [`step`] decides, one action at a time, and turns what it sees
//! (gates, the soak, signals, requests from another shell) into the next events.
//!
//! Order of every change, so that a crash at any moment leaves nothing unnamed: the rollout is
//! saved first (a process is recorded, with its token, before it is spawned; a process leaving
//! the pool is recorded as retiring before the pool changes), then the pool (`replicas.json`)
//! is replaced, then processes are drained and stopped, then the rollout is saved again.
//!
//! This file is the event loop and its one rule (decide, save, act: [`Executor::handle`]);
//! the acts are in its children, one job each: `lifecycle.rs` (start, gate, swap, retire,
//! revert), `verdicts.rs` (the gate's end, the soak, the traffic judge) and `lines.rs` (what is
//! written to the log and the pool).

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::time::Duration;

use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::analysis::{Finding, OnFail, OnInconclusive, Verdict};
use super::control;
use super::fault;
use super::record::{append, log_analysis, log_deploy, log_outcome, write_pool};
use super::retire::{confirm_switch, drain_before_stop};
use super::state::{self, Phase, Process, Rollout, SlotState};
use super::step::{step, Action, Event, Note};
use super::tasks::{
    analyse, gate_replica, sleep_until_wall, soak, GateEnd, GateTiming, Gated, Judging, Message,
    Purpose,
};
use super::view as render;
use super::voice::{Behaviour, Reverted, Said, Voice, Words};
use crate::error::Error;
use crate::host::journal::{self, LogEvent};
use crate::host::notify::{self, Notifier};
use crate::host::probe::{Probe, Subject};
use crate::host::process;
use crate::host::signals::Signals;
use crate::host::state::Root;
use crate::proxy::control::Tunnels;

mod held;
pub(crate) use held::lift_left_pause;
mod lifecycle;
mod lines;
mod verdicts;

pub(crate) use lifecycle::stop_recorded;

/// How often the executor looks for a pause, resume or abort asked from another shell.
const CONTROL_POLL: Duration = Duration::from_millis(100);

struct Task {
    purpose: Purpose,
    token: String,
    handle: JoinHandle<()>,
    /// Where the gate owns the signals: a signal to rollgate ends it.
    interrupt: Option<oneshot::Sender<&'static str>>,
}

/// What the executor must restart once recovery is done.
#[derive(Debug, Default, PartialEq)]
pub struct Redo {
    /// Slots whose previous version must serve again (their new process failed or the
    /// rollout stopped while they were out of the pool).
    pub bring_back: Vec<usize>,
    /// Slots an abort with rollback had not returned yet.
    pub restore: Vec<usize>,
    /// Slots whose new process had joined the pool and died while no rollgate watched it:
    /// failures for the planner to judge (it reverts them, and may pause or abort).
    pub died: Vec<usize>,
    /// Slots whose new process was judged ready but not yet put in the pool: the swap is
    /// performed now (the planner's decision stands; only its effect was cut short).
    pub swap: Vec<usize>,
}

/// What the executor needs beyond the persisted rollout.
pub struct Context {
    pub root: Root,
    /// The new version's executable (the verified copy of a signed release).
    pub executable: PathBuf,
    /// The service's held socket, when the run's settings hand one to each process.
    pub listen: Option<std::os::fd::OwnedFd>,
}

impl Context {
    /// For a rollout found on disk (a resume, a recovery, a person's word): the new version
    /// runs from the copy verified when it was admitted, if it was signed.
    pub fn of_saved(root: &Root, rollout: &Rollout) -> Context {
        let verified = root
            .0
            .join(".verified")
            .join(&rollout.to)
            .join(&rollout.service);
        Context {
            root: root.clone(),
            executable: match verified.is_file() {
                true => verified,
                false => root.executable(&rollout.to, &rollout.service),
            },
            // Taken again from the root's holder (started anew if it is gone); without it a
            // process that needs it fails its start, said in its reason.
            listen: rollout
                .settings
                .launch
                .listen
                .as_ref()
                .and_then(|spec| crate::host::listen::obtain_or_hold(&root.0, spec).ok()),
        }
    }
}

pub struct Executor {
    context: Context,
    rollout: Rollout,
    tasks: HashMap<usize, Task>,
    restores: VecDeque<usize>,
    queued: VecDeque<Event>,
    soak: Option<JoinHandle<()>>,
    sender: UnboundedSender<Message>,
    receiver: UnboundedReceiver<Message>,
    spawned: u64,
    progress: render::Progress,
    /// Every word the run says, and how its kind behaves where kinds differ.
    voice: &'static dyn Voice,
    behaviour: Behaviour,
    /// The planner stopped the run while a release was still being brought back: its ending
    /// is settled once that is done.
    settle_deferred: bool,
    /// What the run saw as it acted, for its voice's outcome line.
    words: Words,
    /// `deploy --no-wait`: hand the watch to a background watcher once it begins.
    detach_at_watch: bool,
    /// The pid of that watcher, once started (the executor then stops here).
    detached: Option<u32>,
    /// When the step being performed was decided (a soak starts when it is reached).
    decided_at: f64,
    /// What each notify-probed process (by token) has said, read for as long as it matters.
    notifiers: HashMap<String, Notifier>,
    /// Per slot, the last `STATUS=` its newest process said by the end of its gate: for the
    /// lines written after that process is gone.
    statuses: HashMap<usize, String>,
}

fn failed(message: impl Into<String>) -> Error {
    Error::Failed(message.into())
}

impl Executor {
    /// The executor for a run found on disk (recovery, a person's word, the background
    /// watcher): its new version runs from the copy verified when it was admitted.
    pub fn of_saved(root: &Root, rollout: Rollout) -> Executor {
        Executor::new(Context::of_saved(root, &rollout), rollout)
    }

    pub fn new(context: Context, mut rollout: Rollout) -> Executor {
        // Whatever runs it owes its ending's effects until they are done (a rollout an older
        // rollgate saved mid-run did not say so).
        if !rollout.is_over() {
            rollout.unsettled = true;
        }
        let (sender, receiver) = unbounded_channel();
        let voice = voice_of(&rollout);
        let mut behaviour = voice.behaviour();
        // Stopped first, the previous release left: a revert must bring it back, and a new
        // release that cannot even start fails its slot (so it does) instead of refusing a run
        // that has already stopped something.
        behaviour.revert_brings_back |= rollout.settings.stop_first;
        behaviour.start_failure_refuses &= !rollout.settings.stop_first;
        let progress = render::Progress::new(behaviour.progress_line);
        Executor {
            context,
            rollout,
            tasks: HashMap::new(),
            restores: VecDeque::new(),
            queued: VecDeque::new(),
            soak: None,
            sender,
            receiver,
            spawned: 0,
            progress,
            voice,
            behaviour,
            words: Words::default(),
            detach_at_watch: false,
            settle_deferred: false,
            detached: None,
            decided_at: journal::now(),
            notifiers: HashMap::new(),
            statuses: HashMap::new(),
        }
    }

    /// `deploy --no-wait`: stop once the watch begins and leave it to a background watcher.
    pub fn detach_at_watch(mut self) -> Executor {
        self.detach_at_watch = true;
        self
    }

    /// The background watcher this executor left, if it did.
    pub fn detached(&self) -> Option<u32> {
        self.detached
    }

    /// The words an outcome line takes (set by whoever finishes the run: a person, or the next
    /// rollgate after a crash).
    pub(crate) fn words_mut(&mut self) -> &mut Words {
        &mut self.words
    }

    pub(crate) fn rollout_mut(&mut self) -> &mut Rollout {
        &mut self.rollout
    }

    pub fn rollout(&self) -> &Rollout {
        &self.rollout
    }

    /// Restarts what recovery found half-done: previous versions to bring back, restores.
    pub async fn redo(mut self, redo: Redo) -> Result<Executor, Error> {
        for slot in redo.swap {
            self.swap_in(slot, false).await?;
        }
        for slot in redo.bring_back {
            if let Some(from) = self.rollout.slot(slot).from_version.clone() {
                self.start(slot, Purpose::BringBack, from).await?;
            }
        }
        self.restores.extend(redo.restore);
        self.start_restores().await?;
        for slot in redo.died {
            let reason = "its new process exited while no rollgate watched it".to_string();
            self.handle(Event::Failed { slot, reason }).await?;
        }
        // A soak the dead rollgate was watching: watched again until its end, or its end
        // would only be noticed at the release deadline.
        if let Some(until) = self.rollout.soak_until {
            if self.rollout.phase == Phase::Running {
                self.start_soak(until);
            }
        }
        Ok(self)
    }

    /// Runs until the rollout completes, pauses or aborts and every revert and restore is
    /// done. Returns the phase it ended in.
    pub async fn run(&mut self, first: Event, signals: &mut Signals) -> Result<Phase, Error> {
        self.handle(first).await?;
        let mut control = tokio::time::interval(CONTROL_POLL);
        let deadline = sleep_until_wall(self.rollout.settings.release_deadline);
        tokio::pin!(deadline);
        let mut deadline_seen = false;
        while !self.finished() && self.detached.is_none() {
            tokio::select! {
                Some(message) = self.receiver.recv() => self.on_message(message).await?,
                name = signals.recv() => self.on_signal(name).await?,
                _ = &mut deadline, if !deadline_seen => {
                    deadline_seen = true;
                    self.handle(Event::Tick).await?;
                }
                _ = control.tick() => {
                    if let Some(request) = control::take(&self.context.root, &self.rollout.id) {
                        self.handle(request.event()).await?;
                    }
                }
            }
        }
        self.progress.finish();
        if self.settle_deferred {
            self.settle_deferred = false;
            self.finish_outcome()?;
        }
        if self.detached.is_none() {
            self.settle().await?;
        }
        Ok(self.rollout.phase)
    }

    /// Waits for the processes still being brought back (their gates in flight) after a
    /// recovery performed an ended run's reverts, then settles its ending if it waited on them.
    pub(crate) async fn await_in_flight(&mut self, signals: &mut Signals) -> Result<(), Error> {
        while !self.finished() {
            tokio::select! {
                Some(message) = self.receiver.recv() => self.on_message(message).await?,
                name = signals.recv() => self.on_signal(name).await?,
            }
        }
        if self.settle_deferred {
            self.settle_deferred = false;
            self.finish_outcome()?;
        }
        Ok(())
    }

    /// Once an ended rollout's reverts and restores are done: the effects its ending owes,
    /// each safe to repeat after a crash (the outcome line is written once per rollout id, the
    /// floor is raised to the same value, a scale's counts written the same again, the post
    /// hook is marked started before it runs, so
    /// it runs at most once); then the state says nothing is owed.
    pub(crate) async fn settle(&mut self) -> Result<(), Error> {
        if self.behaviour.settles_at_stop {
            // Its ending was settled with its outcome line (`finish_outcome`).
            self.run_post_hook().await;
            return Ok(());
        }
        if !self.rollout.ended_unsettled() {
            return Ok(());
        }
        let (event, detail) = super::step::outcome(&self.rollout);
        self.log_outcome(event, detail)?;
        fault::point();
        self.raise_floor()?;
        self.keep_scale()?;
        if !self.rollout.post_hook_started {
            self.rollout.post_hook_started = true;
            self.save()?;
            self.run_post_hook().await;
        }
        self.rollout.unsettled = false;
        self.save()
    }

    /// A rollout pauses on a signal. Where the gate owns the signals (a deploy's), it ends the
    /// gate (which rolls back); once the gate is over, the run finishes what it began.
    async fn on_signal(&mut self, name: &'static str) -> Result<(), Error> {
        if self.behaviour.gate_owns_signals {
            for task in self.tasks.values_mut() {
                if let Some(interrupt) = task.interrupt.take() {
                    let _ = interrupt.send(name);
                }
            }
            return Ok(());
        }
        if self.rollout.phase == Phase::Running {
            let reason = format!("interrupted by {name}");
            self.handle(Event::Pause { reason }).await?;
        }
        Ok(())
    }

    /// Once the rollout has ended and every restore is done: post_promote for a completed
    /// rollout, post_rollback for an aborted one. A failure is logged; the outcome stands.
    pub(crate) async fn run_post_hook(&self) {
        use crate::host::hooks::Hook;
        let r = &self.rollout;
        let hook = match r.phase {
            Phase::Completed => Hook::PostPromote,
            Phase::Aborted => Hook::PostRollback,
            Phase::Running | Phase::Paused => return,
        };
        let facts = self.voice.hook_facts(r, hook);
        let isolation = r.settings.isolation();
        match r
            .hooks
            .run(hook, &self.context.root.0, &facts, &isolation)
            .await
        {
            Some(Ok(ran)) => {
                let _ = self.say(self.voice.hook_ended(r, LogEvent::HookRan, ran));
            }
            Some(Err(e)) => {
                eprintln!("rollgate: {e}; the outcome stands");
                let _ = self.say(
                    self.voice
                        .hook_ended(r, LogEvent::HookFailed, e.to_string()),
                );
            }
            None => {}
        }
    }

    fn finished(&self) -> bool {
        self.rollout.phase != Phase::Running && self.tasks.is_empty() && self.restores.is_empty()
    }

    /// One event and everything it leads to: decide, save, act.
    pub(crate) async fn handle(&mut self, event: Event) -> Result<(), Error> {
        self.queued.push_back(event);
        while let Some(event) = self.queued.pop_front() {
            self.decided_at = journal::now();
            let actions = step(&mut self.rollout, event, self.decided_at);
            self.save()?;
            for action in actions {
                self.perform(action).await?;
            }
            self.start_restores().await?;
            self.progress.show(&self.rollout);
        }
        Ok(())
    }

    pub(crate) fn save(&self) -> Result<(), Error> {
        state::save(&self.context.root, &self.rollout)?;
        fault::point();
        Ok(())
    }

    pub(crate) async fn perform(&mut self, action: Action) -> Result<(), Error> {
        match action {
            Action::StartBeside { slot } => {
                let version = self.rollout.to.clone();
                self.start(slot, Purpose::Upgrade, version).await
            }
            Action::StartInPlace { slot } => {
                if self.rollout.settings.stop_first {
                    self.hold_requests().await?;
                }
                self.retire_live(slot).await?;
                let version = self.rollout.to.clone();
                self.start(slot, Purpose::Upgrade, version).await
            }
            Action::Swap {
                slot,
                keep_previous,
            } => {
                self.swap_in(slot, keep_previous).await?;
                // The new release is live: the requests held for it go on to it.
                self.release_requests()
            }
            Action::DropFallback { slot } => self.drop_fallback(slot).await,
            Action::Remove { slot } => self.retire_live(slot).await,
            Action::Revert { slot } => self.revert(slot).await,
            Action::Restore { slot } => {
                self.restores.push_back(slot);
                Ok(())
            }
            Action::SoakUntil(until) => {
                // It lasts its whole length from now: the actions before it (a drain that
                // waited its timeout) do not shorten it.
                let until = until + (journal::now() - self.decided_at).max(0.0);
                self.rollout.soak_until = Some(until);
                self.save()?;
                self.start_soak(until);
                if self.detach_at_watch {
                    self.leave_watcher()?;
                }
                Ok(())
            }
            Action::Log(note) => self.log_note(&note),
            Action::Stop => {
                if let Some(soak) = self.soak.take() {
                    soak.abort();
                }
                // A release being brought back (a stop-first run's revert) is awaited before
                // the run's ending is settled: until it serves, the state names it.
                if self.tasks.is_empty() && self.restores.is_empty() {
                    self.finish_outcome()
                } else {
                    self.settle_deferred = true;
                    Ok(())
                }
            }
        }
    }

    async fn on_message(&mut self, message: Message) -> Result<(), Error> {
        match message {
            Message::Soak(event) => self.handle(event).await,
            Message::Analysis { verdict, last } => self.on_verdict(verdict, last).await,
            Message::Gate { slot, token, gated } => {
                // A gate cancelled by a revert may have answered just before it was aborted.
                if self.tasks.get(&slot).is_none_or(|t| t.token != token) {
                    return Ok(());
                }
                let task = self.tasks.remove(&slot).expect("checked above");
                match self.notifiers.get(&token).and_then(Notifier::status) {
                    Some(status) => self.statuses.insert(slot, status),
                    None => self.statuses.remove(&slot),
                };
                if task.purpose == Purpose::Upgrade && self.rollout.slot(slot).serves() {
                    self.record_gate(&gated);
                }
                let result = match gated.end {
                    GateEnd::Ready => Ok(()),
                    GateEnd::Stalled(reason) if task.purpose == Purpose::Upgrade => {
                        return self.handle(Event::Stalled { slot, reason }).await;
                    }
                    GateEnd::Failed(reason) | GateEnd::Stalled(reason) => Err(reason),
                };
                // Readiness holds until web's switch: a process of another type that was ready
                // and has exited since fails the release before a slot's readiness can lead
                // to the switch (web's own, or the last type's, which web waits for).
                if let (Purpose::Upgrade, Ok(()), Some((gone, reason))) =
                    (task.purpose, &result, self.a_ready_type_gone())
                {
                    self.handle(Event::Failed { slot: gone, reason }).await?;
                }
                match (task.purpose, result) {
                    (Purpose::Upgrade, Ok(())) => self.handle(Event::Ready { slot }).await,
                    (Purpose::Upgrade, Err(reason)) => {
                        self.handle(Event::Failed { slot, reason }).await
                    }
                    (Purpose::BringBack, Ok(())) => {
                        self.swap_in(slot, false).await?;
                        self.log_restored(slot)?;
                        // A resumed rollout may be waiting for this slot to serve before it
                        // starts the slot's new version again.
                        self.handle(Event::Tick).await
                    }
                    (Purpose::BringBack, Err(reason)) => {
                        self.stop_candidate(slot).await?;
                        self.brought_back_failed(slot, reason)?;
                        self.handle(Event::Tick).await
                    }
                    (Purpose::Restore, Ok(())) => {
                        self.swap_in(slot, false).await?;
                        self.log_restored(slot)?;
                        self.handle(Event::Restored { slot }).await
                    }
                    (Purpose::Restore, Err(reason)) => {
                        self.stop_candidate(slot).await?;
                        self.handle(Event::Failed { slot, reason }).await
                    }
                }
            }
        }
    }
}

/// The voice of a run, picked once: a deploy's when it is one, else a rollout's.
fn voice_of(rollout: &Rollout) -> &'static dyn Voice {
    match rollout.single {
        Some(_) => &super::deploy_voice::DeployVoice,
        None => &super::rollout_voice::RolloutVoice,
    }
}

/// Where a background watcher (`deploy --no-wait`) writes its output, in the root.
pub const WATCHER_OUTPUT: &str = "watcher.output";
