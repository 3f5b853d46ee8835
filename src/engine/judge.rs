//! What to do next, decided without touching anything: the readiness gate's verdicts, the
//! watch's, and the words the log uses for them. Everything here is tested directly. (The
//! numbers a deploy runs by are `plan`'s.)

use std::time::Duration;

use crate::host::probe::{Probe, Spec as ProbeSpec};
use crate::proxy::control::Drain;

/// Something the gate observed.
#[derive(Debug, Clone, PartialEq)]
pub enum GateEvent {
    Probed(Probe),
    /// The candidate exited; the text is its exit status as Rust prints it
    /// (`exit status: 78`, `signal: 9 (SIGKILL)`).
    Exited(String),
    DeadlinePassed,
    Signal(&'static str),
}

/// How the gate ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    Ready,
    Exited(String),
    Stalled,
    Interrupted(&'static str),
    /// The release said it failed (a notify probe's `ERRNO=`, or its watchdog).
    Reported(String),
    /// The probes passed, but what answered them was not the candidate (another process
    /// listens on its port): said as who holds it.
    Impostor(String),
}

/// The gate's judge: the first of ready (`success_threshold` passing probes in a row), exited,
/// deadline (or a signal to rollgate) ends the gate.
#[derive(Debug, Clone)]
pub struct Judge {
    spec: ProbeSpec,
    passed_in_a_row: u32,
}

impl Judge {
    pub fn new(spec: ProbeSpec) -> Judge {
        Judge {
            spec,
            passed_in_a_row: 0,
        }
    }

    pub fn decide(&mut self, event: &GateEvent) -> Option<Verdict> {
        if let GateEvent::Probed(probe) = event {
            if probe.is_fatal() {
                return Some(Verdict::Reported(probe.to_string()));
            }
            if !self.spec.passes(probe) {
                self.passed_in_a_row = 0;
                return None;
            }
            self.passed_in_a_row += 1;
            return (self.passed_in_a_row >= self.spec.success_threshold).then_some(Verdict::Ready);
        }
        decide(event)
    }
}

/// The gate's verdict on an event other than a probe.
fn decide(event: &GateEvent) -> Option<Verdict> {
    match event {
        GateEvent::Probed(_) => None,
        GateEvent::Exited(status) => Some(Verdict::Exited(status.clone())),
        GateEvent::DeadlinePassed => Some(Verdict::Stalled),
        GateEvent::Signal(name) => Some(Verdict::Interrupted(name)),
    }
}

/// The watch after a switch, or a rollout's soak: a new process fails it by exiting, by a
/// fatal probe (a hang its watchdog saw, an error it reported), or by failing `allowed` probes
/// in a row — one slow answer on a busy host is not a release that stopped being ready.
#[derive(Debug, Clone)]
pub struct WatchJudge {
    allowed: u32,
    failed_in_a_row: u32,
    /// `watch` or `soak`, for the reason.
    during: &'static str,
}

impl WatchJudge {
    /// A single deploy's watch: `watch_failures` in a row switch back.
    pub fn new(watch_failures: u32) -> WatchJudge {
        WatchJudge::during("watch", watch_failures)
    }

    /// A rollout's soak (and its watch): `soak_failures` in a row fail the replica.
    pub fn soak(soak_failures: u32) -> WatchJudge {
        WatchJudge::during("soak", soak_failures)
    }

    fn during(during: &'static str, allowed: u32) -> WatchJudge {
        WatchJudge {
            allowed: allowed.max(1),
            failed_in_a_row: 0,
            during,
        }
    }

    /// One probe's result; the reason it failed once too many failed in a row.
    pub fn observe(&mut self, passed: bool, probe: &Probe) -> Option<String> {
        if passed {
            self.failed_in_a_row = 0;
            return None;
        }
        if probe.is_fatal() {
            return Some(format!("{probe} during the {}", self.during));
        }
        self.failed_in_a_row += 1;
        (self.failed_in_a_row >= self.allowed).then(|| {
            format!(
                "failed {} probe{} in a row during the {} (last: {probe})",
                self.failed_in_a_row,
                if self.failed_in_a_row == 1 { "" } else { "s" },
                self.during
            )
        })
    }
}

/// Whether the old release may be stopped now: the proxy confirmed it routes elsewhere and
/// the old release's requests are done, or no proxy serves the root. Anything else (an error
/// line, no answer, a broken socket) may mean the proxy still sends users there.
pub fn drain_confirmed(answer: &Drain) -> bool {
    matches!(answer, Drain::Drained(_) | Drain::NoProxy)
}

/// The reason as the lesson words it: the part of `detail` before the first `"; "`.
pub fn reason(verdict: &Verdict, deadline: Duration) -> String {
    match verdict {
        Verdict::Ready => format!("ready within {} ms", deadline.as_millis()),
        Verdict::Exited(status) if status.starts_with("killed: ") => {
            format!("candidate {status} before ready")
        }
        Verdict::Exited(status) => format!("candidate exited with {status} before ready"),
        Verdict::Stalled => format!("not ready after {} ms", deadline.as_millis()),
        Verdict::Interrupted(signal) => format!("interrupted by {signal}"),
        Verdict::Reported(what) => format!("{what} before ready"),
        Verdict::Impostor(why) => why.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::plan::resolve;

    #[test]
    fn a_soak_fails_a_replica_only_after_its_failures_in_a_row_or_a_fatal_probe() {
        let timeout = Probe::TimedOut(Duration::from_millis(1000));
        let mut judge = WatchJudge::soak(3);
        assert_eq!(judge.observe(false, &timeout), None);
        assert_eq!(judge.observe(false, &timeout), None);
        // A pass starts the count again.
        assert_eq!(judge.observe(true, &Probe::Status(200)), None);
        assert_eq!(judge.observe(false, &timeout), None);
        assert_eq!(judge.observe(false, &timeout), None);
        assert_eq!(
            judge.observe(false, &timeout).as_deref(),
            Some("failed 3 probes in a row during the soak (last: no answer within 1000 ms)")
        );
        let fatal = Probe::Reported(5);
        assert!(fatal.is_fatal());
        assert_eq!(
            WatchJudge::soak(3).observe(false, &fatal),
            Some(format!("{fatal} during the soak"))
        );
    }

    #[test]
    fn by_default_only_a_200_is_ready() {
        let mut judge = Judge::new(ProbeSpec::default());
        for p in [
            Probe::Status(503),
            Probe::Status(204),
            Probe::Refused,
            Probe::Connected,
            Probe::TimedOut(Duration::from_millis(5)),
        ] {
            assert_eq!(judge.decide(&GateEvent::Probed(p)), None);
        }
        assert_eq!(
            judge.decide(&GateEvent::Probed(Probe::Status(200))),
            Some(Verdict::Ready)
        );
    }

    #[test]
    fn a_success_threshold_counts_passes_in_a_row() {
        let mut judge = Judge::new(ProbeSpec {
            success_threshold: 3,
            ..ProbeSpec::default()
        });
        let ok = GateEvent::Probed(Probe::Status(200));
        assert_eq!(judge.decide(&ok), None);
        assert_eq!(judge.decide(&ok), None);
        assert_eq!(judge.decide(&GateEvent::Probed(Probe::Status(503))), None);
        assert_eq!(judge.decide(&ok), None);
        assert_eq!(judge.decide(&ok), None);
        assert_eq!(judge.decide(&ok), Some(Verdict::Ready));
        assert_eq!(
            judge.decide(&GateEvent::DeadlinePassed),
            Some(Verdict::Stalled)
        );
    }

    #[test]
    fn the_watch_switches_back_only_after_failures_in_a_row() {
        let mut judge = WatchJudge::new(3);
        let bad = Probe::Status(503);
        assert_eq!(judge.observe(false, &bad), None);
        assert_eq!(judge.observe(false, &bad), None);
        assert_eq!(judge.observe(true, &Probe::Status(200)), None);
        assert_eq!(judge.observe(false, &bad), None);
        assert_eq!(judge.observe(false, &bad), None);
        assert_eq!(
            judge.observe(false, &Probe::Refused).as_deref(),
            Some("failed 3 probes in a row during the watch (last: connection refused)")
        );
    }

    #[test]
    fn reasons_use_the_lessons_words() {
        let s = resolve(None, None, None, None).unwrap();
        assert_eq!(
            reason(&Verdict::Stalled, s.deadline),
            "not ready after 1500 ms"
        );
        assert_eq!(
            reason(&Verdict::Exited("exit status: 78".into()), s.deadline),
            "candidate exited with exit status: 78 before ready"
        );
        assert_eq!(
            reason(&Verdict::Interrupted("SIGTERM"), s.deadline),
            "interrupted by SIGTERM"
        );
    }

    #[test]
    fn only_a_confirmed_drain_or_no_proxy_lets_the_old_release_stop_early() {
        assert!(drain_confirmed(&Drain::NoProxy));
        assert!(drain_confirmed(&Drain::Drained(Duration::from_millis(3))));
        assert!(!drain_confirmed(&Drain::Refused(
            "cannot read current".into()
        )));
        assert!(!drain_confirmed(&Drain::Failed("broken pipe".into())));
        assert!(!drain_confirmed(&Drain::TimedOut(Duration::from_secs(1))));
    }
}
