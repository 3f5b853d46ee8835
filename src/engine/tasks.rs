//! The tasks the executor leaves running while it waits: a replica's gate (then its
//! `min_ready_ms`) and the soak that watches a wave's new replicas. Each reports back to the
//! executor as a [`Message`]; neither touches the state.

use std::collections::HashMap;
use std::time::Duration;

use tokio::sync::mpsc::UnboundedSender;
use tokio::sync::oneshot;

use super::state::{Process, Rollout};
use super::step::Event;
use crate::engine::gate;
use crate::engine::judge::{self, Verdict};
use crate::host::journal;
use crate::host::probe::{Probe, Subject};

/// Why a replica process is being gated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Purpose {
    /// The new version, for the rollout.
    Upgrade,
    /// The slot's previous version, after its new process failed once it had left the pool.
    BringBack,
    /// The slot's previous version, for an abort with rollback.
    Restore,
}

/// What a task reports.
pub(super) enum Message {
    Gate {
        slot: usize,
        token: String,
        gated: Gated,
    },
    Soak(Event),
    /// A look of the traffic judge; the last one of a soak ends it (`analyse`).
    Analysis {
        verdict: crate::engine::analysis::Verdict,
        last: bool,
    },
}

/// How a replica's gate ended.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum GateEnd {
    Ready,
    Failed(String),
    /// Still running, not ready by the deadline.
    Stalled(String),
}

/// What a gate saw: its end, and for a single deploy's lines its probes and time.
pub(super) struct Gated {
    pub end: GateEnd,
    pub probes: u32,
    pub last_probes: String,
    pub elapsed: Duration,
}

/// The monotonic instant just after Unix time `at`: the log's clock has millisecond steps, so a
/// timer that fires exactly at `at` could see a `now` still below it and decide nothing.
pub(super) fn instant_after(at: f64) -> tokio::time::Instant {
    let wait = (at - journal::now()).max(0.0) + 0.005;
    tokio::time::Instant::now() + Duration::from_secs_f64(wait.min(MAX_WAIT_SECS))
}

/// Sleeps until the wall clock reads `at` (Unix seconds). Timers run on the monotonic clock and
/// the planner judges by the wall clock: a timer that woke before the wall clock got there
/// sleeps again, so a release deadline or a soak's end is never seen early, judged not yet
/// due, and then lost (a loaded run once soaked 5 s past a 1.5 s release deadline).
pub(super) async fn sleep_until_wall(at: f64) {
    loop {
        tokio::time::sleep_until(instant_after(at)).await;
        if journal::now() >= at {
            return;
        }
    }
}

/// A timer never waits longer than a day (release deadlines are bounded by the contract).
const MAX_WAIT_SECS: f64 = 86_400.0 * 2.0;

/// The gate's numbers, copied out of the rollout for a task that outlives a borrow.
#[derive(Debug, Clone, Copy)]
pub(super) struct GateTiming {
    pub gate: gate::Timing,
    pub min_ready: Duration,
}

impl GateTiming {
    pub(super) fn of(rollout: &Rollout) -> GateTiming {
        let s = &rollout.settings;
        let deadline = Duration::from_millis(s.progress_deadline_ms);
        // A release may ask for more time, never past the whole rollout's deadline.
        let left = (s.release_deadline - journal::now()).clamp(0.0, MAX_WAIT_SECS);
        let beyond = Duration::from_secs_f64(left).saturating_sub(deadline);
        GateTiming {
            gate: gate::Timing {
                deadline,
                poll: Duration::from_millis(s.poll_ms),
                extend_max: s.launch.probe.extend_max().min(beyond),
            },
            min_ready: Duration::from_millis(s.min_ready_ms),
        }
    }
}

/// The gate for one replica, then ready at every poll for `min_ready`. The reasons are the
/// deploy's words. A single deploy's gate also shows its progress and ends on `interrupt`.
pub(super) async fn gate_replica(
    mut child: crate::host::keeper::Kept,
    subject: Subject,
    timing: GateTiming,
    interrupt: Option<oneshot::Receiver<&'static str>>,
    progress: Option<crate::host::progress::Progress>,
) -> Gated {
    let started = std::time::Instant::now();
    let watchers = gate::Watchers {
        signals: None,
        interrupt,
        progress: progress.as_ref(),
    };
    let gate = gate::run(&mut child, &subject, timing.gate, started, watchers).await;
    let elapsed = started.elapsed();
    let reason = judge::reason(&gate.verdict, gate.deadline);
    let end = match gate.verdict {
        // No hold asked for: nothing to wait on (a timer, even one already due, costs the
        // switch a tick of the clock).
        Verdict::Ready if timing.min_ready.is_zero() => GateEnd::Ready,
        Verdict::Ready => {
            match gate::hold_ready(&mut child, &subject, timing.min_ready, timing.gate.poll).await {
                Ok(()) => GateEnd::Ready,
                Err(lapse) => GateEnd::Failed(lapse.to_string()),
            }
        }
        Verdict::Stalled => GateEnd::Stalled(reason),
        Verdict::Exited(_)
        | Verdict::Interrupted(_)
        | Verdict::Reported(_)
        | Verdict::Impostor(_) => GateEnd::Failed(reason),
    };
    Gated {
        end,
        probes: gate.probes,
        last_probes: gate.last_probes(),
        elapsed,
    }
}

/// How a soak judges its replicas.
#[derive(Debug, Clone, Copy)]
pub(super) enum Judged {
    /// A rollout's soak: this many failed probes in a row fail a replica.
    Soak(u32),
    /// A single deploy's watch: this many failed probes in a row.
    Watch(u32),
}

/// Watches the new version's replicas until `until` (Unix seconds): one that exits, fails a
/// fatal probe, or fails the judge's number of probes in a row has failed. Then a `Tick` ends
/// the soak, unless the traffic judge ends it (`ends_soak` false: its last look does).
pub(super) async fn soak(
    mut watched: Vec<(usize, Process, Subject)>,
    until: f64,
    poll: Duration,
    judged: Judged,
    sender: UnboundedSender<Message>,
    ends_soak: bool,
) {
    let end = sleep_until_wall(until);
    tokio::pin!(end);
    let began = journal::now();
    let mut ticker = tokio::time::interval(poll);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut judges: HashMap<usize, judge::WatchJudge> = HashMap::new();
    loop {
        tokio::select! {
            _ = &mut end => break,
            _ = ticker.tick() => {}
        }
        let mut still = Vec::new();
        for (slot, process, subject) in watched {
            let out_of_memory = || crate::host::cgroup::out_of_memory(&process.identity());
            let reason = match (judged, process.identity().is_running()) {
                (Judged::Soak(_), false) => Some(match out_of_memory() {
                    Some(mb) => {
                        format!("killed: out of memory at its {mb} MiB limit during the soak")
                    }
                    None => "exited during the soak".to_string(),
                }),
                (Judged::Watch(_), false) => Some(format!(
                    "{} during the watch, {} ms after the switch",
                    out_of_memory().map_or("exited".to_string(), |mb| format!(
                        "killed: out of memory at its {mb} MiB limit"
                    )),
                    ((journal::now() - began) * 1000.0).round() as u64
                )),
                (Judged::Soak(failures), true) => match subject.check().await {
                    // Nobody here reads its socket: that it runs is what can be judged.
                    (false, Probe::Unwatched) => None,
                    (passed, probe) => judges
                        .entry(slot)
                        .or_insert_with(|| judge::WatchJudge::soak(failures))
                        .observe(passed, &probe),
                },
                (Judged::Watch(failures), true) => {
                    let (passed, probe) = subject.check().await;
                    judges
                        .entry(slot)
                        .or_insert_with(|| judge::WatchJudge::new(failures))
                        .observe(passed, &probe)
                }
            };
            match reason {
                Some(reason) => {
                    let _ = sender.send(Message::Soak(Event::Failed { slot, reason }));
                }
                None => still.push((slot, process, subject)),
            }
        }
        watched = still;
    }
    if ends_soak {
        let _ = sender.send(Message::Soak(Event::Tick));
    }
}

/// What the traffic judge compares, for one soak.
pub(super) struct Judging {
    pub root: std::path::PathBuf,
    pub canary: String,
    pub baseline: String,
    pub settings: crate::engine::analysis::Analysis,
    /// A deploy: no old release serves beside the new one after the switch, so the baseline
    /// is what the old release answered through this proxy up to the switch.
    pub baseline_before_switch: bool,
}

/// How long a read of the proxy's counts may take.
const COUNTS_TIMEOUT: Duration = Duration::from_secs(2);

/// The traffic judge through one soak: every `interval_ms` it reads the proxy's counts and
/// judges the canary against the baseline over the window since the soak (re)started, then
/// once more at `until`; each verdict is sent, and the last (or a failure) ends it. Counts read
/// from another proxy than the first (it restarted) start fresh, and the verdict says so.
pub(super) async fn analyse(judging: Judging, until: f64, sender: UnboundedSender<Message>) {
    use crate::engine::analysis::{judge, Finding, Side};
    use crate::proxy::control::counts;
    let began = journal::now();
    let window_ms = ((until - began).max(0.0) * 1000.0) as u64;
    let interval = Duration::from_millis(judging.settings.interval_ms);
    // The window's start: the counts when the soak began (None: from the proxy's start).
    let mut base = counts(&judging.root, COUNTS_TIMEOUT).await.ok();
    let mut note = match base {
        Some(_) => "counts start now (the soak began)".to_string(),
        None => String::new(),
    };
    // A deploy's baseline, fixed now: the old release through this proxy up to the switch.
    let before_switch = match (judging.baseline_before_switch, &base) {
        (true, Some(switch)) => {
            let side = Side::between(None, switch, &judging.baseline);
            note = format!(
                "baseline: {}'s {} requests through this proxy before the switch, since {}",
                judging.baseline,
                side.requests,
                crate::render::time::format_time(switch.started_ms as f64 / 1000.0)
            );
            Some(side)
        }
        (true, None) => {
            note = "no baseline: the proxy's counts at the switch could not be read".into();
            Some(Side::default())
        }
        (false, _) => None,
    };
    let mut end = instant_after(until);
    // The warm-up: nothing is judged, and the window starts again when it ends (a deploy's
    // baseline stays what the old release answered before the switch).
    let warmup = Duration::from_millis(judging.settings.warmup_ms);
    if !warmup.is_zero() {
        tokio::time::sleep_until(end.min(tokio::time::Instant::now() + warmup)).await;
        let said = match counts(&judging.root, COUNTS_TIMEOUT).await {
            Ok(now) => {
                base = Some(now);
                format!("counts start after the {} ms warm-up", warmup.as_millis())
            }
            Err(why) => {
                format!(
                    "the counts after the warm-up could not be read ({why}): the window holds it"
                )
            }
        };
        // A deploy's note says what its baseline is; a rollout's "counts start now" is replaced.
        note = if judging.baseline_before_switch {
            format!("{note}; {said}")
        } else {
            said
        };
    }
    // An inconclusive end (too little traffic) looks on for at most this long.
    let mut wait_left = Some(Duration::from_millis(judging.settings.inconclusive_wait_ms))
        .filter(|wait| !wait.is_zero());
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let last = tokio::select! {
            _ = tokio::time::sleep_until(end) => {
                // The soak ends by the wall clock, as the planner judges it (see
                // `sleep_until_wall`): a last verdict sent before would end nothing.
                if journal::now() < until {
                    end = instant_after(until);
                    continue;
                }
                true
            }
            _ = ticker.tick() => false,
        };
        let verdict = match counts(&judging.root, COUNTS_TIMEOUT).await {
            Ok(now) => {
                match &base {
                    Some(seen) if !seen.same_proxy(&now) => {
                        note = format!("the proxy restarted (pid {}): counts start fresh", now.pid);
                        base = None;
                    }
                    None if note.is_empty() => {
                        note = format!("counts from the proxy's start (pid {})", now.pid);
                    }
                    _ => {}
                }
                let from = base.as_ref().filter(|b| b.same_proxy(&now));
                let canary = Side::between(from, &now, &judging.canary);
                let baseline = match &before_switch {
                    Some(side) => side.clone(),
                    None => Side::between(from, &now, &judging.baseline),
                };
                if base.is_none() {
                    base = Some(crate::proxy::control::CountsLine {
                        releases: Vec::new(),
                        ..now.clone()
                    });
                }
                judge(
                    &judging.settings,
                    window_ms,
                    &judging.canary,
                    &judging.baseline,
                    &canary,
                    &baseline,
                )
            }
            Err(why) => {
                let mut verdict = judge(
                    &judging.settings,
                    window_ms,
                    &judging.canary,
                    &judging.baseline,
                    &Side::default(),
                    &Side::default(),
                );
                verdict.words = format!("inconclusive: {why}");
                verdict
            }
        };
        let mut verdict = verdict;
        let mut last = last;
        if last && verdict.verdict == Finding::Inconclusive {
            if let Some(wait) = wait_left.take() {
                end += wait;
                last = false;
                let more = format!(
                    "the soak ended inconclusive: looking {} ms more",
                    wait.as_millis()
                );
                note = if note.is_empty() {
                    more
                } else {
                    format!("{note}; {more}")
                };
            }
        }
        if !note.is_empty() {
            verdict.words = format!("{} ({note})", verdict.words);
            note.clear();
        }
        let failed = verdict.verdict == Finding::Fail;
        let _ = sender.send(Message::Analysis { verdict, last });
        if failed || last {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Paused, tokio's clock jumps straight to each timer while the wall clock does not move:
    /// the monotonic clock ahead of the wall clock, as it was when a loaded run lost its
    /// release deadline. The sleep still ends only once the wall clock is there.
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_timer_that_wakes_before_the_wall_clock_sleeps_again() {
        let at = journal::now() + 0.3;
        sleep_until_wall(at).await;
        assert!(journal::now() >= at, "woke {} s early", at - journal::now());
    }
}
