//! The executor's process lifecycle: a replica started and gated, swapped into the pool,
//! retired, stopped, switched back to the release it replaced, reverted and restored, and the
//! watcher `deploy --no-wait` leaves behind. Each change is recorded before it is made.

use super::*;

impl Executor {
    /// Records a process for the slot, then spawns and gates it.
    pub(super) async fn start(
        &mut self,
        slot: usize,
        purpose: Purpose,
        version: String,
    ) -> Result<(), Error> {
        let kind = self.rollout.slot(slot).kind.clone();
        // Another type's process serves nothing: it takes no port.
        let port = match (&kind, self.free_port()) {
            (Some(_), _) => 0,
            (None, Some(port)) => port,
            (None, None) => {
                let (first, last) = self.rollout.settings.ports;
                return self.gate_failed(
                    slot,
                    purpose,
                    format!("no free port in {first}-{last} for replica {slot}"),
                );
            }
        };
        self.spawned += 1;
        let token = format!(
            "{}-{slot}-{}.{}",
            self.rollout.id,
            std::process::id(),
            self.spawned
        );
        // The run's new version is started as the run was planned; the release it replaced,
        // brought back, as it ran before (its own user and limits).
        let launch = match purpose {
            Purpose::Upgrade => kind.as_ref().map(|kind| kind.launch.clone()),
            _ => self.rollout.slot(slot).from_launch.clone(),
        };
        let mut recorded = Process {
            version: version.clone(),
            port,
            pid: 0,
            start_time: 0,
            token: token.clone(),
            launch,
        };
        let launch = self.rollout.launch_of(&recorded).clone();
        self.rollout.slot_mut(slot).candidate = Some(recorded.clone());
        self.save()?;
        let root = &self.context.root;
        let executable = self.executable_for(&version);
        let output = self.output_of(slot, &version);
        let probe = &launch.probe;
        // The held socket is web's: another type is never handed it.
        let listen_fd = self
            .context
            .listen
            .as_ref()
            .filter(|_| kind.is_none())
            .map(std::os::fd::AsRawFd::as_raw_fd);
        let started = match (&launch.listen, listen_fd) {
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
                .then(|| notify::Socket::for_token(&token))
                .transpose()
                .and_then(|socket| {
                    let child = crate::host::keeper::start(
                        &process::Launch {
                            executable: &executable,
                            workdir: &root.release_dir(&version),
                            output: &output,
                            port,
                            version: &version,
                            token: &token,
                            slot: (self.behaviour.numbered_replicas && kind.is_none())
                                .then_some(slot),
                            notify: socket.as_ref().map(|s| (s.address(), probe.watchdog())),
                            secrets: &crate::host::config::secrets_dir(&root.0),
                            rotation: self.rollout.settings.output,
                            listen: listen_fd,
                            record: &launch,
                            root: &root.0,
                            grace: self.grace_for(slot, &recorded),
                        },
                        &self.rollout.service,
                        crate::host::keeper::Backoff::default(),
                    )?;
                    Ok((child, socket))
                })
        });
        let child = match started {
            Ok((child, socket)) => {
                if let Some(socket) = socket {
                    let group = child.release.pid;
                    self.notifiers
                        .insert(token.clone(), socket.listen(group, false));
                }
                child
            }
            Err(e) => {
                // A keeper that died before it said whether it started the release may have
                // started it: whatever carries the token goes, or it would run on named by
                // nothing (found by the random-kill test: a worker left after `up`).
                let grace = self.grace_for(slot, &recorded);
                stop_recorded(&recorded, grace).await;
                self.rollout.slot_mut(slot).candidate = None;
                self.save()?;
                let reason = format!("cannot start {}: {e}", executable.display());
                if self.behaviour.start_failure_refuses && kind.is_none() {
                    return Err(Error::Refused(reason));
                }
                return self.gate_failed(slot, purpose, reason);
            }
        };
        recorded.pid = child.release.pid;
        recorded.start_time = child.release.start_time;
        self.rollout.slot_mut(slot).candidate = Some(recorded.clone());
        self.save()?;
        self.say_started(slot, purpose, &recorded, &launch)?;
        self.gate(slot, purpose, child, &version, port, token);
        Ok(())
    }

    /// How long a stop of `process` in `slot` waits after SIGTERM: another type's grace is its
    /// own (on its launch record); web's is the run's.
    fn grace_for(&self, slot: usize, process: &Process) -> Duration {
        match self.rollout.slot(slot).kind {
            Some(_) => self.rollout.launch_of(process).grace(),
            None => Duration::from_millis(self.rollout.settings.grace_ms),
        }
    }

    /// A process of another type that passed its gate (it is in its slot, the run's version)
    /// and has exited since, while web's switch is still to come: the slot and why, in words
    /// with its true time (issue 80, 3: it was seen only after the switch, users already on
    /// the release, its rollback saying "2 ms after the switch").
    pub(super) fn a_ready_type_gone(&self) -> Option<(usize, String)> {
        if self.rollout.phase != Phase::Running {
            return None;
        }
        let to = &self.rollout.to;
        self.rollout
            .slots
            .iter()
            .filter(|s| !s.serves() && s.state == SlotState::Succeeded)
            .find_map(|s| {
                let process = s.live.as_ref().filter(|p| p.version == *to && p.pid > 0)?;
                if process.identity().is_running() {
                    return None;
                }
                let since = s.finished.map_or(0.0, |ready| journal::now() - ready);
                Some((
                    s.slot,
                    format!(
                        "pid {} exited after it was ready, before web's switch (found gone {since:.1} s after its ready)",
                        process.pid
                    ),
                ))
            })
    }

    /// Where the slot's process of `version` writes its output: another type's file of its
    /// own, a replica's numbered one, or a deploy's in its release's output folder.
    fn output_of(&self, slot: usize, version: &str) -> PathBuf {
        let root = &self.context.root;
        let service = &self.rollout.service;
        match &self.rollout.slot(slot).kind {
            Some(kind) => {
                root.process_output_path(version, service, &kind.process_type, kind.index)
            }
            None if self.behaviour.numbered_replicas => {
                root.replica_output_path(version, service, slot)
            }
            None => root.output_path(version, service),
        }
    }

    /// The started line: the voice's for web; another type's names its process and how it
    /// will be judged ready.
    fn say_started(
        &self,
        slot: usize,
        purpose: Purpose,
        recorded: &Process,
        launch: &crate::host::launch::LaunchRecord,
    ) -> Result<(), Error> {
        let Some(kind) = &self.rollout.slot(slot).kind else {
            return self.say(self.voice.started(&self.rollout, recorded, slot, purpose));
        };
        let held = match kind.min_ready_ms {
            0 => String::new(),
            ms => format!(", up {ms} ms"),
        };
        let detail = format!(
            "{} {} started (pid {}); ready once: {}{held}",
            kind.name(),
            recorded.version,
            recorded.pid,
            launch.probe.describe()
        );
        self.log_process(kind, recorded, slot, detail)
    }

    /// Gates a started process in a task of its own, which reports back as a message; the
    /// task is kept by slot (with, where the gate owns the signals, the way to interrupt it).
    pub(super) fn gate(
        &mut self,
        slot: usize,
        purpose: Purpose,
        child: crate::host::keeper::Kept,
        version: &str,
        port: u16,
        token: String,
    ) {
        let mut timing = GateTiming::of(&self.rollout);
        let kind = self.rollout.slot(slot).kind.clone();
        if let Some(kind) = &kind {
            timing.min_ready = Duration::from_millis(kind.min_ready_ms);
        }
        let subject = self.subject(version, port, &token);
        let sender = self.sender.clone();
        let task_token = token.clone();
        // Web's gate owns the terminal and the signals; another type's is quiet.
        let owns_signals = self.behaviour.gate_owns_signals && kind.is_none();
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
    pub(super) fn gate_failed(
        &mut self,
        slot: usize,
        purpose: Purpose,
        reason: String,
    ) -> Result<(), Error> {
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

    pub(super) fn brought_back_failed(&mut self, slot: usize, reason: String) -> Result<(), Error> {
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

    pub(super) fn log_restored(&mut self, slot: usize) -> Result<(), Error> {
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
    pub(super) async fn swap_in(&mut self, slot: usize, keep_previous: bool) -> Result<(), Error> {
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
        if let Some(kind) = self.rollout.slot(slot).kind.clone() {
            return self.typed_swapped(slot, &kind, keep_previous).await;
        }
        let Some(kept) = self
            .rollout
            .slot(slot)
            .fallback
            .clone()
            .filter(|_| keep_previous)
        else {
            let retired = self.stop_retiring(slot, Tunnels::Wait).await?;
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
        // The previous release runs on as the fallback: the proxy only confirms it switched
        // (its requests and tunnels go on), and `switched` is said now, at the switch.
        let drained = confirm_switch(&self.context.root, kept.port).await;
        if let Some(said) =
            self.voice
                .switched(&mut self.rollout, &kept, durability.as_deref(), &drained)
        {
            self.save()?;
            self.say(said)?;
        }
        Ok(())
    }

    /// Another type's process is in `formation.json` now: its old one runs on until the
    /// release is promoted (`keep_previous`), or (a stop-first type, a process brought back)
    /// the one it replaced is stopped.
    async fn typed_swapped(
        &mut self,
        slot: usize,
        kind: &crate::engine::state::Kind,
        keep_previous: bool,
    ) -> Result<(), Error> {
        let stopped = match keep_previous {
            true => None,
            false => self.stop_retiring(slot, Tunnels::Wait).await?,
        };
        let Some(live) = self.rollout.slot(slot).live.clone() else {
            return Ok(());
        };
        let kept = match (keep_previous, &self.rollout.slot(slot).fallback) {
            (true, Some(old)) => format!(
                "; {} {} (pid {}) runs on until the release is promoted",
                kind.name(),
                old.version,
                old.pid
            ),
            _ => stopped.map_or(String::new(), |s| format!("; {s}")),
        };
        self.log_process(
            kind,
            &live,
            slot,
            format!(
                "{} {} ready (pid {}){kept}",
                kind.name(),
                live.version,
                live.pid
            ),
        )
    }

    /// The watch passed: the fallback leaves the pool, is drained again (requests it took as
    /// the fallback finish) and stopped. Another type's old process is stopped — also one a
    /// dead rollgate had recorded leaving and not stopped (its keeper may be gone too: then
    /// nothing else would).
    pub(super) async fn drop_fallback(&mut self, slot: usize) -> Result<(), Error> {
        let s = self.rollout.slot(slot);
        let Some(old) = s.fallback.clone().or_else(|| s.retiring.clone()) else {
            return Ok(());
        };
        // Its tunnels (WebSockets) had the watch to move to the new release: the rest are sent
        // away now rather than waited for (a drain timeout after the watch).
        let leaving = |s: &mut state::Slot| s.fallback.take().or_else(|| s.retiring.take());
        let retired = self.retire(slot, leaving, Tunnels::SendAway).await?;
        match self.rollout.slot(slot).kind.clone() {
            Some(kind) => {
                let stopped = retired.unwrap_or_default();
                let detail = format!("{}: {stopped}", kind.name());
                self.log_process(&kind, &old, slot, detail)?;
            }
            None => {
                self.words.retired = retired;
                self.words.watched = true;
            }
        }
        Ok(())
    }

    /// Takes the slot's live process out of the pool, then drains and stops it.
    pub(super) async fn retire_live(&mut self, slot: usize) -> Result<(), Error> {
        self.retire(slot, |s| s.live.take(), Tunnels::Wait)
            .await
            .map(drop)
    }

    /// The process `take` moves out of the slot is recorded as retiring, saved, out of the
    /// pool, then drained and stopped (how, as [`Executor::stop_retiring`] says); None when
    /// the slot had none.
    async fn retire(
        &mut self,
        slot: usize,
        take: impl FnOnce(&mut state::Slot) -> Option<Process>,
        tunnels: Tunnels,
    ) -> Result<Option<String>, Error> {
        let s = self.rollout.slot_mut(slot);
        let Some(leaving) = take(s) else {
            return Ok(None);
        };
        s.retiring = Some(leaving);
        self.save()?;
        self.write_pool()?;
        self.stop_retiring(slot, tunnels).await
    }

    /// Drains and stops the slot's retiring process (its tunnels as `tunnels` says); says how
    /// ("drained ...; old release v1 stopped (SIGTERM)"), None when there was none.
    pub(crate) async fn stop_retiring(
        &mut self,
        slot: usize,
        tunnels: Tunnels,
    ) -> Result<Option<String>, Error> {
        let Some(old) = self.rollout.slot(slot).retiring.clone() else {
            return Ok(None);
        };
        let settings = &self.rollout.settings;
        // Another type's process serves nothing to drain, and stops with its type's grace.
        let drained = match self.rollout.slot(slot).kind {
            Some(_) => String::new(),
            None => drain_before_stop(&self.context.root, old.port, settings.drain_ms, tunnels)
                .await
                .to_string(),
        };
        let grace = self.grace_for(slot, &old);
        let stopped = process::stop_group(old.identity(), grace).await;
        self.rollout.slot_mut(slot).retiring = None;
        self.save()?;
        Ok(Some(format!(
            "{drained}old release {} {stopped}",
            old.version
        )))
    }

    /// Stops the slot's process being gated (found by its token if its pid was never
    /// recorded); says how.
    pub(super) async fn stop_candidate(&mut self, slot: usize) -> Result<String, Error> {
        if let Some(task) = self.tasks.remove(&slot) {
            task.handle.abort();
        }
        let Some(candidate) = self.rollout.slot(slot).candidate.clone() else {
            return Ok(process::Stopped::AlreadyGone.to_string());
        };
        let grace = self.grace_for(slot, &candidate);
        let stopped = stop_recorded(&candidate, grace).await;
        self.rollout.slot_mut(slot).candidate = None;
        self.save()?;
        Ok(stopped)
    }

    /// After the switch, in the watch: the kept previous release serves again at once (it was
    /// only drained), and the new one is stopped.
    pub(super) async fn switch_back(&mut self, slot: usize, kept: Process) -> Result<(), Error> {
        if let Some(kind) = self.rollout.slot(slot).kind.clone() {
            // Its old process ran on: `formation.json` names it again, the new one stops.
            let s = self.rollout.slot_mut(slot);
            s.fallback = None;
            s.retiring = s.live.replace(kept.clone());
            self.save()?;
            self.write_pool()?;
            let stopped = self
                .stop_retiring(slot, Tunnels::Wait)
                .await?
                .unwrap_or_default();
            let detail = format!(
                "{} back on {} (pid {}); {stopped}",
                kind.name(),
                kept.version,
                kept.pid
            );
            return self.log_process(&kind, &kept, slot, detail);
        }
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
    pub(super) async fn previous_answers(&self, slot: usize) -> String {
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
    pub(super) async fn revert(&mut self, slot: usize) -> Result<(), Error> {
        let stopped = self.stop_candidate(slot).await?;
        if let Some(kept) = self.rollout.slot(slot).fallback.clone() {
            return self.switch_back(slot, kept).await;
        }
        let typed = !self.rollout.slot(slot).serves();
        if typed {
            // An old process whose stop was cut short is gone (its whole tree) before its
            // release is brought back: two of a singleton never run at once.
            self.stop_retiring(slot, Tunnels::Wait).await?;
        }
        if !self.behaviour.revert_brings_back && !typed {
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
    pub(super) async fn start_restores(&mut self) -> Result<(), Error> {
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
                    // A stop-first type's (a singleton's) new process is gone before its old
                    // one starts again.
                    let stop_first = self
                        .rollout
                        .slot(slot)
                        .kind
                        .as_ref()
                        .is_some_and(|k| k.stop_first);
                    if !beside || stop_first {
                        self.retire_live(slot).await?;
                    }
                    self.start(slot, Purpose::Restore, from).await?;
                }
            }
        }
        Ok(())
    }

    /// The lowest port of the range that no recorded process holds and that binds now.
    pub(super) fn free_port(&self) -> Option<u16> {
        let held: Vec<u16> = self.rollout.processes().map(|p| p.port).collect();
        let (first, last) = self.rollout.settings.ports;
        (first..=last).find(|port| {
            !held.contains(port) && std::net::TcpListener::bind(("127.0.0.1", *port)).is_ok()
        })
    }

    pub(super) fn executable_for(&self, version: &str) -> PathBuf {
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

    /// `deploy --no-wait`: a detached `rollgate watch` takes the watch over once this rollgate
    /// lets go of the lock; its pid goes into the state, so `status` shows it.
    pub(super) fn leave_watcher(&mut self) -> Result<(), Error> {
        use std::os::unix::process::CommandExt;
        let root = &self.context.root;
        let exe = std::env::current_exe()
            .map_err(|e| failed(format!("cannot find rollgate's own executable: {e}")))?;
        let output = std::fs::File::create(root.0.join(WATCHER_OUTPUT))
            .map_err(|e| failed(format!("cannot create the watcher's output: {e}")))?;
        let err = output.try_clone().map_err(|e| failed(e.to_string()))?;
        let mut watcher = std::process::Command::new(exe);
        // SAFETY: close is async-signal-safe: the watcher takes the lock itself once this
        // rollgate lets go, and never holds it by inheritance.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut watcher, || {
                crate::host::lock::close_held_in_child();
                Ok(())
            });
        }
        let child = watcher
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
