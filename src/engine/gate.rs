//! The readiness gate, one for a single deploy and for every replica of a rollout: the first
//! of ready (the policy's probe passing `success_threshold` times in a row; `GET /readyz` = 200
//! by default), the process's exit, the deadline, or a signal to rollgate ends it.
//! Probes run one at a time every `poll`; the deadline and the exit are watched the whole
//! time, so neither waits for a probe.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::judge::{GateEvent, Judge, Verdict};
use crate::host::probe::Probe;
use crate::host::probe::Subject;
use crate::host::progress::Progress;
use crate::host::signals::Signals;

/// Probe results kept for a rollback's detail.
const PROBES_KEPT: usize = 3;

/// What the gate saw.
pub(crate) struct Gate {
    pub verdict: Verdict,
    pub probes: u32,
    pub recent: VecDeque<Probe>,
    /// The deadline it ended with: the policy's, or later when the release asked for more
    /// time (`EXTEND_TIMEOUT_USEC=`, within `extend_max`).
    pub deadline: Duration,
}

impl Gate {
    pub fn last_probes(&self) -> String {
        if self.recent.is_empty() {
            return "none".into();
        }
        let said = self
            .recent
            .iter()
            .map(Probe::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        match self.recent.back() {
            // Django's ALLOWED_HOSTS, Rails' host authorization, a virtual host: the request
            // reached the app, which refused the name it was asked by (issue 67, 4).
            Some(Probe::Status(400 | 421)) => format!(
                "{said} (the app may check the Host header: the probe sends 127.0.0.1:PORT unless the policy's probe.host names the host it serves, as probe = {{ host = \"app.example.com\" }})"
            ),
            _ => said,
        }
    }
}

/// How long the gate waits and how often it probes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timing {
    pub deadline: Duration,
    pub poll: Duration,
    /// How far past `deadline` a release may push it by asking (0: not at all).
    pub extend_max: Duration,
}

/// What a gate watches beyond the process: a single deploy ends it on a signal and shows its
/// progress on a terminal; a rollout's replicas are gated quietly (the rollout shows its own).
#[derive(Default)]
pub(crate) struct Watchers<'a> {
    pub signals: Option<&'a mut Signals>,
    /// A signal's name passed on by whoever holds the signals (the engine's executor).
    pub interrupt: Option<tokio::sync::oneshot::Receiver<&'static str>>,
    pub progress: Option<&'a Progress>,
}

/// Gates the process `child`, probed as `subject` says, started at `started`.
pub(crate) async fn run(
    child: &mut crate::host::keeper::Kept,
    subject: &Subject,
    timing: Timing,
    started: Instant,
    mut watchers: Watchers<'_>,
) -> Gate {
    let mut deadline = tokio::time::Instant::from_std(started + timing.deadline);
    let latest = deadline + timing.extend_max;
    let mut notices = subject.notices.clone();
    let mut ticker = tokio::time::interval(timing.poll);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    type InFlight<'s> = std::pin::Pin<Box<dyn std::future::Future<Output = Probe> + Send + 's>>;
    let mut in_flight: Option<InFlight<'_>> = None;
    let mut judge = Judge::new(subject.spec.clone());
    let mut gate = Gate {
        verdict: Verdict::Stalled,
        probes: 0,
        recent: VecDeque::new(),
        deadline: timing.deadline,
    };
    let who = Some(child.release);
    loop {
        let event = tokio::select! {
            biased;
            status = child.wait() => GateEvent::Exited(crate::host::process::ended_words(status, who.as_ref())),
            name = async {
                match watchers.signals.as_mut() {
                    Some(signals) => signals.recv().await,
                    None => std::future::pending().await,
                }
            } => GateEvent::Signal(name),
            name = async {
                match watchers.interrupt.as_mut() {
                    // A sender dropped unused interrupts nothing.
                    Some(interrupt) => match interrupt.await {
                        Ok(name) => name,
                        Err(_) => std::future::pending().await,
                    },
                    None => std::future::pending().await,
                }
            } => GateEvent::Signal(name),
            _ = tokio::time::sleep_until(deadline) => GateEvent::DeadlinePassed,
            // A notify probe: what the release says wakes the gate at once (no poll to wait).
            changed = async {
                match notices.as_mut() {
                    Some(notices) => notices.changed().await,
                    None => std::future::pending().await,
                }
            } => {
                if changed.is_err() {
                    // Its reader is gone (the socket closed): nothing more will be said.
                    notices = None;
                    continue;
                }
                let asked = notices.as_mut().and_then(|n| n.borrow_and_update().extend_until);
                if let Some(until) = asked {
                    deadline = deadline.max(until.min(latest));
                    gate.deadline = deadline.duration_since(tokio::time::Instant::from_std(started));
                }
                if in_flight.is_none() {
                    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                    in_flight = Some(Box::pin(subject.probe(left)));
                }
                continue;
            }
            probe = async { in_flight.as_mut().expect("guarded").await }, if in_flight.is_some() => {
                in_flight = None;
                gate.probes += 1;
                if gate.recent.len() == PROBES_KEPT {
                    gate.recent.pop_front();
                }
                gate.recent.push_back(probe.clone());
                GateEvent::Probed(probe)
            }
            _ = ticker.tick(), if in_flight.is_none() && subject.polls() => {
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                in_flight = Some(Box::pin(subject.probe(left)));
                continue;
            }
        };
        if let Some(progress) = watchers.progress {
            progress.show(started.elapsed(), gate.probes, gate.recent.back());
        }
        if let Some(verdict) = judge.decide(&event) {
            if let Some(progress) = watchers.progress {
                progress.finish();
            }
            gate.verdict = match (verdict, who) {
                // Ready by its port only if the candidate is what listens there (read off
                // /proc on the blocking pool: the other gates of a rollout go on meanwhile).
                (Verdict::Ready, Some(who)) if subject.probes_its_port() => {
                    let port = subject.port;
                    let held = tokio::task::spawn_blocking(move || {
                        crate::host::ports::held_by_another(port, &who)
                    });
                    match held.await.ok().flatten() {
                        Some(why) => Verdict::Impostor(why),
                        None => Verdict::Ready,
                    }
                }
                (verdict, _) => verdict,
            };
            return gate;
        }
    }
}

/// How a process that passed its gate failed to hold ready, and how long after it was first
/// ready.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Lapse {
    #[error("candidate exited with {status} {after_ms} ms after it was first ready")]
    Exited { status: String, after_ms: u128 },
    #[error("stopped being ready ({probe}) {after_ms} ms after it was first ready")]
    Unready { probe: String, after_ms: u128 },
}

/// After a gate passed: the process must pass its probe at every poll for `min_ready`, and not
/// exit. The error says what happened and how long after it was first ready.
pub(crate) async fn hold_ready(
    child: &mut crate::host::keeper::Kept,
    subject: &Subject,
    min_ready: Duration,
    poll: Duration,
) -> Result<(), Lapse> {
    let ready_at = tokio::time::Instant::now();
    let held = ready_at + min_ready;
    let since = || ready_at.elapsed().as_millis();
    let who = Some(child.release);
    let mut ticker = tokio::time::interval(poll);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            status = child.wait() => {
                return Err(Lapse::Exited {
                    status: crate::host::process::ended_words(status, who.as_ref()),
                    after_ms: since(),
                });
            }
            _ = tokio::time::sleep_until(held) => return Ok(()),
            _ = ticker.tick() => {
                let (passed, probe) = subject.check().await;
                if !passed {
                    return Err(Lapse::Unready {
                        probe: probe.to_string(),
                        after_ms: since(),
                    });
                }
            }
        }
    }
}
