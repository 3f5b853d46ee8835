//! The executor: performs what [`step`] decides, one action at a time, and turns what it sees
//! (gates, the soak, signals, requests from another shell) into the next events.
//!
//! Order of every change, so that a crash at any moment leaves nothing unnamed: the rollout is
//! saved first (a process is recorded, with its token, before it is spawned; a process leaving
//! the pool is recorded as retiring before the pool changes), then the pool (`replicas.json`)
//! is replaced, then processes are drained and stopped, then the rollout is saved again.

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
use super::retire::drain_before_stop;
use super::state::{self, Phase, Process, Rollout, SlotState};
use super::step::{step, Action, Event, Note};
use super::tasks::{
    analyse, gate_replica, instant_after, soak, GateEnd, GateTiming, Gated, Judging, Message,
    Purpose,
};
use super::view as render;
use super::voice::{Behaviour, Reverted, Said, Voice, Words};
use crate::error::Error;
use crate::host::identity::Identity;
use crate::host::journal::{self, LogEvent};
use crate::host::notify::{self, Notifier};
use crate::host::probe::{Probe, Subject};
use crate::host::process;
use crate::host::signals::Signals;
use crate::host::state::Root;

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
        let behaviour = voice.behaviour();
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
        let deadline = instant_after(self.rollout.settings.release_deadline);
        let mut deadline_seen = false;
        while !self.finished() && self.detached.is_none() {
            tokio::select! {
                Some(message) = self.receiver.recv() => self.on_message(message).await?,
                name = signals.recv() => self.on_signal(name).await?,
                _ = tokio::time::sleep_until(deadline), if !deadline_seen => {
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
        if self.detached.is_none() {
            self.settle().await?;
        }
        Ok(self.rollout.phase)
    }

    /// Once an ended rollout's reverts and restores are done: the effects its ending owes,
    /// each safe to repeat after a crash (the outcome line is written once per rollout id, the
    /// floor is raised to the same value, the post hook is marked started before it runs, so
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
                self.retire_live(slot).await?;
                let version = self.rollout.to.clone();
                self.start(slot, Purpose::Upgrade, version).await
            }
            Action::Swap {
                slot,
                keep_previous,
            } => self.swap_in(slot, keep_previous).await,
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
                self.finish_outcome()
            }
        }
    }

    /// Records a process for the slot, then spawns and gates it.
    async fn start(&mut self, slot: usize, purpose: Purpose, version: String) -> Result<(), Error> {
        let Some(port) = self.free_port() else {
            let (first, last) = self.rollout.settings.ports;
            return self.gate_failed(
                slot,
                purpose,
                format!("no free port in {first}-{last} for replica {slot}"),
            );
        };
        self.spawned += 1;
        let token = format!(
            "{}-{slot}-{}.{}",
            self.rollout.id,
            std::process::id(),
            self.spawned
        );
        let mut recorded = Process {
            version: version.clone(),
            port,
            pid: 0,
            start_time: 0,
            token: token.clone(),
        };
        self.rollout.slot_mut(slot).candidate = Some(recorded.clone());
        self.save()?;
        let root = &self.context.root;
        let executable = self.executable_for(&version);
        let output = if self.behaviour.numbered_replicas {
            root.replica_output_path(&version, &self.rollout.service, slot)
        } else {
            root.output_path(&version, &self.rollout.service)
        };
        let probe = &self.rollout.settings.probe;
        let listen_fd = self
            .context
            .listen
            .as_ref()
            .map(std::os::fd::AsRawFd::as_raw_fd);
        let started = match (&self.rollout.settings.listen, listen_fd) {
            (Some(spec), None) => Err(std::io::Error::other(format!(
                "the socket on {} is held by no holder that answers ({})",
                spec.address,
                crate::host::listen::holder_socket(&root.0).display()
            ))),
            _ => Ok(()),
        };
        // The notification socket is bound before the process starts: nothing it says early
        // is lost.
        let started = started.and_then(|()| {
            probe
                .is_notify()
                .then(|| notify::Socket::bind(&notify::address_for(&token)))
                .transpose()
                .and_then(|socket| {
                    let child = process::spawn(&process::Launch {
                        executable: &executable,
                        workdir: &root.release_dir(&version),
                        output: &output,
                        port,
                        version: &version,
                        token: &token,
                        slot: self.behaviour.numbered_replicas.then_some(slot),
                        notify: socket.as_ref().map(|s| (s.address(), probe.watchdog())),
                        secrets: &crate::host::config::secrets_dir(&root.0),
                        rotation: self.rollout.settings.output,
                        listen: listen_fd,
                        confined: !self.rollout.settings.unconfined,
                        limits: self.rollout.settings.limits,
                        root: &root.0,
                        user: self.rollout.settings.user.as_deref(),
                        writable: &self.rollout.settings.writable,
                        grace: Duration::from_millis(self.rollout.settings.grace_ms),
                    })?;
                    Ok((child, socket))
                })
        });
        let child = match started {
            Ok((child, socket)) => {
                if let Some(socket) = socket {
                    let group = child.id().map_or(0, |p| p as i32);
                    self.notifiers
                        .insert(token.clone(), socket.listen(group, false));
                }
                child
            }
            Err(e) => {
                self.rollout.slot_mut(slot).candidate = None;
                self.save()?;
                let reason = format!("cannot start {}: {e}", executable.display());
                if self.behaviour.start_failure_refuses {
                    return Err(Error::Refused(reason));
                }
                return self.gate_failed(slot, purpose, reason);
            }
        };
        let pid = child.id().map_or(0, |p| p as i32);
        recorded.pid = pid;
        recorded.start_time = Identity::of(pid).map_or(0, |i| i.start_time);
        self.rollout.slot_mut(slot).candidate = Some(recorded.clone());
        self.save()?;
        self.say(self.voice.started(&self.rollout, &recorded, slot, purpose))?;
        self.gate(slot, purpose, child, &version, port, token);
        Ok(())
    }

    /// Gates a started process in a task of its own, which reports back as a message; the
    /// task is kept by slot (with, where the gate owns the signals, the way to interrupt it).
    fn gate(
        &mut self,
        slot: usize,
        purpose: Purpose,
        child: tokio::process::Child,
        version: &str,
        port: u16,
        token: String,
    ) {
        let timing = GateTiming::of(&self.rollout);
        let subject = self.subject(version, port, &token);
        let sender = self.sender.clone();
        let task_token = token.clone();
        let owns_signals = self.behaviour.gate_owns_signals;
        let (interrupt, interrupted) = match owns_signals {
            true => {
                let (sender, receiver) = oneshot::channel();
                (Some(sender), Some(receiver))
            }
            false => (None, None),
        };
        let progress = owns_signals
            .then(|| crate::host::progress::Progress::new(version, timing.gate.deadline));
        let handle = tokio::spawn(async move {
            let gated = gate_replica(child, subject, timing, interrupted, progress).await;
            let _ = sender.send(Message::Gate {
                slot,
                token: task_token,
                gated,
            });
        });
        self.tasks.insert(
            slot,
            Task {
                purpose,
                token,
                handle,
                interrupt,
            },
        );
    }

    /// A gate that could not even start: the same paths as one that failed.
    fn gate_failed(&mut self, slot: usize, purpose: Purpose, reason: String) -> Result<(), Error> {
        match purpose {
            Purpose::Upgrade | Purpose::Restore => {
                self.queued.push_back(Event::Failed { slot, reason });
                Ok(())
            }
            Purpose::BringBack => {
                self.brought_back_failed(slot, reason)?;
                // The slot's candidate place is free again: a resumed rollout may start it.
                self.queued.push_back(Event::Tick);
                Ok(())
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
                if task.purpose == Purpose::Upgrade {
                    self.record_gate(&gated);
                }
                let result = match gated.end {
                    GateEnd::Ready => Ok(()),
                    GateEnd::Stalled(reason) if task.purpose == Purpose::Upgrade => {
                        return self.handle(Event::Stalled { slot, reason }).await;
                    }
                    GateEnd::Failed(reason) | GateEnd::Stalled(reason) => Err(reason),
                };
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

    /// What the run keeps of a gate for its outcome line (saved with the step the gate's end
    /// leads to, which follows at once).
    fn record_gate(&mut self, gated: &Gated) {
        self.voice.gate_ended(&mut self.rollout, gated);
    }

    fn brought_back_failed(&mut self, slot: usize, reason: String) -> Result<(), Error> {
        let s = self.rollout.slot_mut(slot);
        let message = format!("its previous version did not come back: {reason}");
        s.error = Some(match s.error.take() {
            Some(first) => format!("{first}; {message}"),
            None => message.clone(),
        });
        let wave = s.wave;
        self.save()?;
        let to = self.rollout.to.clone();
        self.log_plain(LogEvent::ReplicaFailed, &to, Some(slot), wave, message)
    }

    fn log_restored(&mut self, slot: usize) -> Result<(), Error> {
        let s = self.rollout.slot(slot);
        let Some(live) = s.live.clone() else {
            return Ok(());
        };
        let wave = s.wave;
        self.log(
            LogEvent::ReplicaRestored,
            &live,
            Some(slot),
            wave,
            format!(
                "replica {slot} back on {} (port {}, pid {})",
                live.version, live.port, live.pid
            ),
        )
    }

    /// The slot's gated process joins the pool; the one it replaces is drained and stopped, or
    /// drained and kept running as the pool's fallback through the watch.
    async fn swap_in(&mut self, slot: usize, keep_previous: bool) -> Result<(), Error> {
        let s = self.rollout.slot_mut(slot);
        // The planner's `Ready` made the swap in the state it saved; outside it (a bring-back,
        // a restore, a swap redone after a crash) it is made and saved here first.
        if let Some(new) = s.candidate.take() {
            let old = s.live.replace(new);
            match keep_previous {
                true => s.fallback = old,
                false => s.retiring = old,
            }
            self.save()?;
        }
        let durability = self.write_pool()?;
        let Some(kept) = self
            .rollout
            .slot(slot)
            .fallback
            .clone()
            .filter(|_| keep_previous)
        else {
            let retired = self.stop_retiring(slot).await?;
            let kept_words = self.voice.swapped(
                &mut self.rollout,
                &mut self.words,
                durability.as_deref(),
                retired,
            );
            if kept_words {
                self.save()?;
            }
            return Ok(());
        };
        let drained = drain_before_stop(
            &self.context.root,
            kept.port,
            self.rollout.settings.drain_ms,
        )
        .await;
        if let Some(said) =
            self.voice
                .switched(&mut self.rollout, &kept, durability.as_deref(), &drained)
        {
            self.save()?;
            self.say(said)?;
        }
        Ok(())
    }

    /// The watch passed: the fallback leaves the pool, is drained again (requests it took as
    /// the fallback finish) and stopped.
    async fn drop_fallback(&mut self, slot: usize) -> Result<(), Error> {
        let s = self.rollout.slot_mut(slot);
        let Some(kept) = s.fallback.take() else {
            return Ok(());
        };
        s.retiring = Some(kept);
        self.save()?;
        self.write_pool()?;
        self.words.retired = self.stop_retiring(slot).await?;
        self.words.watched = true;
        Ok(())
    }

    /// Takes the slot's live process out of the pool, then drains and stops it.
    async fn retire_live(&mut self, slot: usize) -> Result<(), Error> {
        let s = self.rollout.slot_mut(slot);
        let Some(live) = s.live.take() else {
            return Ok(());
        };
        s.retiring = Some(live);
        self.save()?;
        self.write_pool()?;
        self.stop_retiring(slot).await.map(drop)
    }

    /// Drains and stops the slot's retiring process; says how ("drained ...; old release v1
    /// stopped (SIGTERM)"), None when there was none.
    pub(crate) async fn stop_retiring(&mut self, slot: usize) -> Result<Option<String>, Error> {
        let Some(old) = self.rollout.slot(slot).retiring.clone() else {
            return Ok(None);
        };
        let settings = &self.rollout.settings;
        let drained = drain_before_stop(&self.context.root, old.port, settings.drain_ms).await;
        let stopped =
            process::stop_group(old.identity(), Duration::from_millis(settings.grace_ms)).await;
        self.rollout.slot_mut(slot).retiring = None;
        self.save()?;
        Ok(Some(format!(
            "{drained}old release {} {stopped}",
            old.version
        )))
    }

    /// Stops the slot's process being gated (found by its token if its pid was never
    /// recorded); says how.
    async fn stop_candidate(&mut self, slot: usize) -> Result<String, Error> {
        if let Some(task) = self.tasks.remove(&slot) {
            task.handle.abort();
        }
        let Some(candidate) = self.rollout.slot(slot).candidate.clone() else {
            return Ok(process::Stopped::AlreadyGone.to_string());
        };
        let grace = Duration::from_millis(self.rollout.settings.grace_ms);
        let stopped = stop_recorded(&candidate, grace).await;
        self.rollout.slot_mut(slot).candidate = None;
        self.save()?;
        Ok(stopped)
    }

    /// After the switch, in the watch: the kept previous release serves again at once (it was
    /// only drained), and the new one is stopped.
    async fn switch_back(&mut self, slot: usize, kept: Process) -> Result<(), Error> {
        let s = self.rollout.slot_mut(slot);
        s.fallback = None;
        let previous = if kept.identity().is_running() {
            s.retiring = s.live.replace(kept.clone());
            self.save()?;
            match self.write_pool()? {
                None => format!("switched back to {}", kept.version),
                Some(durability) => {
                    format!("switched back to {} (current {durability})", kept.version)
                }
            }
        } else {
            // It is gone too (a reboot took both): the pointer still goes back to it, so the
            // pointer, the log and what `up` starts agree that the new release is not live.
            s.retiring = s.live.replace(kept.clone());
            self.save()?;
            self.write_pool()?;
            format!(
                "WARNING previous release {} is not running; `current` names it again for `rollgate up` to start",
                kept.version
            )
        };
        // It failed: nothing to drain for.
        let mut stopped = process::Stopped::AlreadyGone.to_string();
        if let Some(failed) = self.rollout.slot(slot).retiring.clone() {
            let grace = Duration::from_millis(self.rollout.settings.grace_ms);
            stopped = process::stop_group(failed.identity(), grace)
                .await
                .to_string();
        }
        self.rollout.slot_mut(slot).retiring = None;
        self.save()?;
        self.words.reverted = Some(Reverted {
            in_watch: true,
            previous,
            stopped,
        });
        Ok(())
    }

    /// Whether the previous release still answers after a candidate was stopped, in the words
    /// of a rollback's line.
    async fn previous_answers(&self, slot: usize) -> String {
        let Some(old) = self.rollout.slot(slot).live.clone() else {
            return "no release was live".into();
        };
        match self
            .subject(&old.version, old.port, &old.token)
            .check()
            .await
        {
            (true, _) => format!("old release {} still answering", old.version),
            // Its notifications go to nobody here: that it runs is what can be said.
            (false, Probe::Unwatched) if old.identity().is_running() => {
                format!("old release {} still running", old.version)
            }
            (false, other) => format!(
                "WARNING old release {} not answering ({other})",
                old.version
            ),
        }
    }

    /// The slot's new process failed or is no longer wanted: stop it; the previous version
    /// serves the slot again (its kept fallback, or started anew if it had left the pool).
    async fn revert(&mut self, slot: usize) -> Result<(), Error> {
        let stopped = self.stop_candidate(slot).await?;
        if let Some(kept) = self.rollout.slot(slot).fallback.clone() {
            return self.switch_back(slot, kept).await;
        }
        if !self.behaviour.revert_brings_back {
            // The previous release never left: what it is doing is what a rollback says.
            let previous = self.previous_answers(slot).await;
            self.words.reverted = Some(Reverted {
                in_watch: false,
                previous,
                stopped,
            });
            return Ok(());
        }
        let to = self.rollout.to.clone();
        let s = self.rollout.slot(slot);
        let from = s.from_version.clone();
        if s.live.as_ref().is_some_and(|l| l.version == to) && from.as_deref() != Some(&to) {
            // Swapped in, then failed in the soak.
            self.retire_live(slot).await?;
        }
        let s = self.rollout.slot(slot);
        if s.live.is_none() {
            if let Some(from) = from {
                return self.start(slot, Purpose::BringBack, from).await;
            }
        }
        Ok(())
    }

    /// Restores run within the surge budget (or, with none, the unavailable one).
    async fn start_restores(&mut self) -> Result<(), Error> {
        let settings = &self.rollout.settings;
        let beside = settings.surge > 0;
        let at_once = if beside {
            settings.surge
        } else {
            settings.unavailable.max(1)
        };
        while !self.restores.is_empty()
            && self
                .tasks
                .values()
                .filter(|t| t.purpose == Purpose::Restore)
                .count()
                < at_once
        {
            let Some(slot) = self.restores.pop_front() else {
                break;
            };
            match self.rollout.slot(slot).from_version.clone() {
                // A slot the rollout added: the baseline has no replica there.
                None => {
                    self.retire_live(slot).await?;
                    self.queued.push_back(Event::Restored { slot });
                }
                Some(from) => {
                    if !beside {
                        self.retire_live(slot).await?;
                    }
                    self.start(slot, Purpose::Restore, from).await?;
                }
            }
        }
        Ok(())
    }

    fn start_soak(&mut self, until: f64) {
        if let Some(old) = self.soak.take() {
            old.abort();
        }
        let watched: Vec<(usize, Process)> = self
            .rollout
            .slots
            .iter()
            .filter(|s| s.state == SlotState::Succeeded)
            .filter_map(|s| Some((s.slot, s.live.clone()?)))
            .filter(|(_, p)| p.version == self.rollout.to)
            .collect();
        self.watch_notifications(watched.iter().map(|(_, p)| p));
        let watched: Vec<(usize, Process, Subject)> = watched
            .into_iter()
            .map(|(slot, p)| {
                let subject = self.subject(&p.version, p.port, &p.token);
                (slot, p, subject)
            })
            .collect();
        let poll = Duration::from_millis(self.rollout.settings.poll_ms);
        let sender = self.sender.clone();
        let judge = self.voice.soak_judge(&self.rollout);
        let judging = self.judging();
        let watching = soak(
            watched,
            until,
            poll,
            judge,
            sender.clone(),
            judging.is_none(),
        );
        self.soak = Some(tokio::spawn(async move {
            match judging {
                Some(judging) => {
                    tokio::join!(watching, analyse(judging, until, sender));
                }
                None => watching.await,
            }
        }));
    }

    /// What the traffic judge compares in this soak, if the policy asks for it: the new
    /// version's replicas against the old one's (a first install has no baseline).
    fn judging(&self) -> Option<Judging> {
        let settings = self.rollout.settings.analysis.clone()?;
        Some(Judging {
            root: self.context.root.0.clone(),
            canary: self.rollout.to.clone(),
            baseline: self.rollout.from.clone()?,
            settings,
            baseline_before_switch: self.rollout.single.is_some(),
        })
    }

    /// A look of the traffic judge: logged and kept for status; a failure pauses or rolls
    /// back as the policy says; the soak's last look ends it (an inconclusive one pauses if
    /// the policy says so).
    async fn on_verdict(&mut self, verdict: Verdict, last: bool) -> Result<(), Error> {
        if self.rollout.phase != Phase::Running {
            return Ok(());
        }
        let Some(settings) = self.rollout.settings.analysis.clone() else {
            return Ok(());
        };
        log_analysis(&self.context.root, &self.rollout, &verdict)?;
        let words = verdict.words.clone();
        let finding = verdict.verdict;
        self.rollout.last_analysis = Some(verdict);
        self.save()?;
        match finding {
            Finding::Fail => {
                let reason = format!("analysis failed: {words}");
                self.handle(match settings.on_fail {
                    // A deploy has no pause: its watched release failed, as on a failed
                    // probe, and the previous one takes the traffic back.
                    _ if self.rollout.single.is_some() => Event::Failed { slot: 0, reason },
                    OnFail::Pause => Event::Pause { reason },
                    OnFail::Rollback => Event::Abort {
                        reason,
                        rollback: true,
                    },
                })
                .await
            }
            Finding::Inconclusive if last && settings.on_inconclusive == OnInconclusive::Pause => {
                let reason = format!("analysis inconclusive at the end of the soak: {words}");
                self.handle(Event::Pause { reason }).await
            }
            _ if last => self.handle(Event::Tick).await,
            _ => Ok(()),
        }
    }

    /// How a deploy's new process (held, or being gated) is probed (promote, abort, recovery).
    pub(crate) fn subject_for_new(&self) -> Subject {
        let (port, token) = self
            .rollout
            .new_process()
            .map_or((self.rollout.settings.ports.0, String::new()), |p| {
                (p.port, p.token.clone())
            });
        self.subject(&self.rollout.to, port, &token)
    }

    /// How a replica of `version` on `port` is probed (the rollout's probe, in its release
    /// folder; a notify probe reads what the process started with `token` said).
    fn subject(&self, version: &str, port: u16, token: &str) -> Subject {
        Subject {
            spec: self.rollout.settings.probe.clone(),
            port,
            workdir: self.context.root.release_dir(version),
            notices: self.notifiers.get(token).map(Notifier::notices),
        }
    }

    /// Before a soak or watch of notify-probed processes: each one's socket is read (bound
    /// again for a process this rollgate did not start: a watch taken over after a crash or
    /// by a detached watcher), and the sockets of processes no longer recorded are closed.
    fn watch_notifications<'p>(&mut self, watched: impl Iterator<Item = &'p Process>) {
        if !self.rollout.settings.probe.is_notify() {
            return;
        }
        let recorded: Vec<String> = self.rollout.processes().map(|p| p.token.clone()).collect();
        self.notifiers.retain(|token, _| recorded.contains(token));
        for process in watched {
            if process.pid > 0 && !self.notifiers.contains_key(&process.token) {
                if let Some(notifier) = Notifier::watch_live(process.pid, notify::BIND_PATIENCE) {
                    self.notifiers.insert(process.token.clone(), notifier);
                }
            }
        }
    }

    /// The lowest port of the range that no recorded process holds and that binds now.
    fn free_port(&self) -> Option<u16> {
        let held: Vec<u16> = self.rollout.processes().map(|p| p.port).collect();
        let (first, last) = self.rollout.settings.ports;
        (first..=last).find(|port| {
            !held.contains(port) && std::net::TcpListener::bind(("127.0.0.1", *port)).is_ok()
        })
    }

    fn executable_for(&self, version: &str) -> PathBuf {
        let root = &self.context.root;
        if version == self.rollout.to {
            return self.context.executable.clone();
        }
        // A signed release that once ran here runs from the copy that was verified then.
        let verified = root
            .0
            .join(".verified")
            .join(version)
            .join(&self.rollout.service);
        if verified.is_file() {
            verified
        } else {
            root.executable(version, &self.rollout.service)
        }
    }

    /// The pool as the state names it, written (for whoever finishes a deploy after a crash).
    pub(crate) fn perform_write_pool(&self) -> Result<(), Error> {
        self.write_pool().map(drop)
    }

    /// `replicas.json` for the proxy, and `current` naming the first live replica for readers
    /// that know one release (status, the lab). Some(words) when `current` was renamed but
    /// its folder's fsync failed: readers see it, so the change goes on.
    fn write_pool(&self) -> Result<Option<String>, Error> {
        write_pool(&self.context.root, &self.rollout)
    }

    fn log_note(&mut self, note: &Note) -> Result<(), Error> {
        match self
            .voice
            .note(note, &self.rollout, &self.words, &self.context.root)
        {
            Some(said) => self.say(said),
            None => Ok(()),
        }
    }

    /// Writes a line the voice said.
    fn say(&self, said: Said) -> Result<(), Error> {
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
    fn log_outcome(&self, event: LogEvent, detail: String) -> Result<(), Error> {
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

    /// `deploy --no-wait`: a detached `rollgate watch` takes the watch over once this rollgate
    /// lets go of the lock; its pid goes into the state, so `status` shows it.
    fn leave_watcher(&mut self) -> Result<(), Error> {
        use std::os::unix::process::CommandExt;
        let root = &self.context.root;
        let exe = std::env::current_exe()
            .map_err(|e| failed(format!("cannot find rollgate's own executable: {e}")))?;
        let output = std::fs::File::create(root.0.join(WATCHER_OUTPUT))
            .map_err(|e| failed(format!("cannot create the watcher's output: {e}")))?;
        let err = output.try_clone().map_err(|e| failed(e.to_string()))?;
        let child = std::process::Command::new(exe)
            .args([
                "watch",
                &self.rollout.service,
                "--token",
                &self.rollout.id,
                "--root",
            ])
            .arg(&root.0)
            .stdin(std::process::Stdio::null())
            .stdout(output)
            .stderr(err)
            .process_group(0)
            .spawn()
            .map_err(|e| failed(format!("cannot start the watcher: {e}")))?;
        self.voice.watcher_left(&mut self.rollout, child.id());
        self.save()?;
        if let Some(soak) = self.soak.take() {
            soak.abort();
        }
        self.detached = Some(child.id());
        Ok(())
    }

    /// Where a run settles at the planner's stop (a deploy), its outcome line was just written:
    /// the floor is raised, and its record (its in-flight state) goes, so `current` alone says
    /// what is live, as after every deploy. A rollout settles once its restores are done
    /// ([`Executor::settle`]).
    fn finish_outcome(&mut self) -> Result<(), Error> {
        if !self.rollout.is_over() || !self.behaviour.settles_at_stop {
            return Ok(());
        }
        self.voice.settled(&mut self.rollout);
        self.raise_floor()?;
        state::clear(&self.context.root)
            .map_err(|e| failed(format!("{}, but {e}", self.rollout.phase_word())))
    }

    /// The floor of a signed release is raised once it is live everywhere (the same value
    /// again when a crash made this run twice).
    fn raise_floor(&self) -> Result<(), Error> {
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

    fn log(
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

    fn log_plain(
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
    fn status_of(&self, slot: Option<usize>) -> Option<String> {
        let slot = slot?;
        let recorded = self.rollout.slots.get(slot)?;
        [&recorded.candidate, &recorded.live]
            .into_iter()
            .flatten()
            .find_map(|p| self.notifiers.get(&p.token).and_then(Notifier::status))
            .or_else(|| self.statuses.get(&slot).cloned())
    }
}

/// Stops a recorded process's group, found by its token when its pid was never recorded (the
/// start was cut short); says how ("stopped (SIGTERM)", or "pid N stopped (SIGTERM), ...").
pub(crate) async fn stop_recorded(recorded: &Process, grace: Duration) -> String {
    if recorded.pid > 0 {
        return process::stop_group(recorded.identity(), grace)
            .await
            .to_string();
    }
    let mut said = Vec::new();
    for who in process::find_by_token(&recorded.token) {
        let stopped = process::stop_group(who, grace).await;
        said.push(format!("pid {} {stopped}", who.pid));
    }
    match said.is_empty() {
        true => process::Stopped::AlreadyGone.to_string(),
        false => said.join(", "),
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
