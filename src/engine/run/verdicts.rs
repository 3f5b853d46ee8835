//! The executor's verdicts: the gate's end recorded, the soak after a wave, and the traffic
//! judge's verdicts on a canary (promote, roll back, or wait), and the probes each watched
//! process is told by.

use super::*;

impl Executor {
    /// What the run keeps of a gate for its outcome line (saved with the step the gate's end
    /// leads to, which follows at once).
    pub(super) fn record_gate(&mut self, gated: &Gated) {
        self.voice.gate_ended(&mut self.rollout, gated);
    }

    pub(super) fn start_soak(&mut self, until: f64) {
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
    pub(super) fn judging(&self) -> Option<Judging> {
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
    pub(super) async fn on_verdict(&mut self, verdict: Verdict, last: bool) -> Result<(), Error> {
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

    /// How a replica of `version` on `port` is probed (as the process started with `token`
    /// was started to be — the rollout's probe for its new version —, in its release folder; a
    /// notify probe reads what that process said).
    pub(super) fn subject(&self, version: &str, port: u16, token: &str) -> Subject {
        let started = self
            .rollout
            .processes()
            .find(|p| !token.is_empty() && p.token == token);
        let launch = started.map_or(&self.rollout.settings.launch, |p| self.rollout.launch_of(p));
        Subject {
            spec: launch.probe.clone(),
            port,
            workdir: self.context.root.release_dir(version),
            notices: self.notifiers.get(token).map(Notifier::notices),
            root: self.context.root.0.clone(),
            launch: launch.clone(),
        }
    }

    /// Before a soak or watch of notify-probed processes: each one's socket is read (bound
    /// again for a process this rollgate did not start: a watch taken over after a crash or
    /// by a detached watcher), and the sockets of processes no longer recorded are closed.
    pub(super) fn watch_notifications<'p>(&mut self, watched: impl Iterator<Item = &'p Process>) {
        if !self.rollout.settings.launch.probe.is_notify() {
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
}
