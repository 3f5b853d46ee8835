//! What to do next, decided without touching anything: names, settings, the readiness gate's
//! verdicts and the words the log uses for them. Everything here is tested directly.

use crate::defaults;
use std::time::Duration;

use crate::host::probe::{Probe, Spec as ProbeSpec};
use crate::host::MAX_WAIT;
use crate::policy::{OnStall, RolloutSettings};
use crate::proxy::drain::Drain;

/// The policy entry a service reads by default: `edge-svc` → `edge_svc`.
pub fn policy_entry_for(service: &str) -> String {
    service.replace('-', "_")
}

/// The numbers one deploy runs by.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    pub deadline: Duration,
    pub poll: Duration,
    pub on_stall: OnStall,
    pub grace: Duration,
    pub drain: Duration,
    /// Where the deadline came from, for the log.
    pub deadline_source: &'static str,
    pub probe: ProbeSpec,
    /// 0: no watch after the switch.
    pub watch: Duration,
    pub watch_failures: u32,
    /// How the release's output file is bounded.
    pub output: crate::host::output::Rotation,
}

/// Command line first, then the policy, then the defaults. Refused: a bad probe in a policy that
/// did not apply the contract.
pub fn resolve(
    deadline_arg: Option<u64>,
    grace_arg: Option<u64>,
    drain_arg: Option<u64>,
    policy: Option<&RolloutSettings>,
) -> Result<Settings, String> {
    resolve_with_watch(deadline_arg, grace_arg, drain_arg, None, policy)
}

/// [`resolve`], with the command line's `--watch-ms`.
pub fn resolve_with_watch(
    deadline_arg: Option<u64>,
    grace_arg: Option<u64>,
    drain_arg: Option<u64>,
    watch_arg: Option<u64>,
    policy: Option<&RolloutSettings>,
) -> Result<Settings, String> {
    let watch_failures = policy
        .and_then(|p| p.watch_failures)
        .unwrap_or(u64::from(defaults::WATCH_FAILURES));
    if !(1..=100).contains(&watch_failures) {
        return Err(format!(
            "watch_failures is {watch_failures}; it must be an integer from 1 to 100"
        ));
    }
    let probe = match policy.and_then(|p| p.probe.as_ref()) {
        Some(probe) => ProbeSpec::from_policy(probe)?,
        None => ProbeSpec::default(),
    };
    let (deadline, deadline_source) = match (deadline_arg, policy) {
        (Some(ms), _) => (Duration::from_millis(ms), "command line"),
        (None, Some(p)) => (Duration::from_millis(p.progress_deadline_ms), "policy"),
        (None, None) => (defaults::DEADLINE, "default"),
    };
    let output = crate::host::output::Rotation::from_policy(
        policy.and_then(|p| p.output_max_bytes),
        policy.and_then(|p| p.output_keep),
    )?;
    Ok(Settings {
        output,
        deadline,
        poll: policy.map_or(defaults::POLL, |p| Duration::from_millis(p.poll_ms)),
        on_stall: policy.map_or(OnStall::Rollback, |p| p.on_stall),
        grace: first_of(
            grace_arg,
            policy.and_then(|p| p.stop_grace_ms),
            defaults::GRACE,
        ),
        drain: first_of(
            drain_arg,
            policy.and_then(|p| p.drain_timeout_ms),
            defaults::DRAIN,
        ),
        deadline_source,
        probe,
        watch: first_of(watch_arg, policy.and_then(|p| p.watch_ms), defaults::WATCH),
        watch_failures: watch_failures as u32,
    })
}

/// Refuses settings the deployer cannot run by, naming the field and what is allowed. Checked
/// before anything is recorded or spawned.
pub fn check_bounds(s: &Settings) -> Result<(), String> {
    let max = MAX_WAIT.as_millis();
    let within = |field: &str, value: Duration, min: u128| {
        let ms = value.as_millis();
        if ms < min || ms > max {
            Err(format!(
                "{field} is {ms} ms; the deployer runs with {min} ..= {max} ms (24 h); nothing was started"
            ))
        } else {
            Ok(())
        }
    };
    let deadline_field = match s.deadline_source {
        "policy" => "progress_deadline_ms (policy)",
        "command line" => "the deadline-ms argument",
        _ => "the default deadline",
    };
    within(deadline_field, s.deadline, 1)?;
    within("poll_ms (policy)", s.poll, 1)?;
    within("the stop grace (--grace-ms or stop_grace_ms)", s.grace, 0)?;
    within(
        "the drain timeout (--drain-timeout-ms or drain_timeout_ms)",
        s.drain,
        0,
    )?;
    within("the watch (--watch-ms or watch_ms)", s.watch, 0)
}

/// The command line's milliseconds, else the policy's, else the default.
fn first_of(arg: Option<u64>, policy: Option<u64>, default: Duration) -> Duration {
    arg.or(policy).map_or(default, Duration::from_millis)
}

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

/// The watch after a switch: the new release fails it by exiting, or by failing
/// `watch_failures` probes in a row.
#[derive(Debug, Clone)]
pub struct WatchJudge {
    allowed: u32,
    failed_in_a_row: u32,
}

impl WatchJudge {
    pub fn new(watch_failures: u32) -> WatchJudge {
        WatchJudge {
            allowed: watch_failures.max(1),
            failed_in_a_row: 0,
        }
    }

    /// One probe's result; the reason to switch back once too many failed in a row.
    pub fn observe(&mut self, passed: bool, probe: &Probe) -> Option<String> {
        if passed {
            self.failed_in_a_row = 0;
            return None;
        }
        if probe.is_fatal() {
            return Some(format!("{probe} during the watch"));
        }
        self.failed_in_a_row += 1;
        (self.failed_in_a_row >= self.allowed).then(|| {
            format!(
                "failed {} probe{} in a row during the watch (last: {probe})",
                self.failed_in_a_row,
                if self.failed_in_a_row == 1 { "" } else { "s" }
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
        Verdict::Exited(status) => format!("candidate exited with {status} before ready"),
        Verdict::Stalled => format!("not ready after {} ms", deadline.as_millis()),
        Verdict::Interrupted(signal) => format!("interrupted by {signal}"),
        Verdict::Reported(what) => format!("{what} before ready"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(deadline: u64, on_stall: OnStall) -> RolloutSettings {
        RolloutSettings {
            progress_deadline_ms: deadline,
            poll_ms: 250,
            max_unavailable_pct: 0,
            max_surge_pct: 100,
            on_stall,
            stop_grace_ms: Some(700),
            drain_timeout_ms: Some(900),
            probe: None,
            watch_ms: None,
            watch_failures: None,
            hooks: None,
            keep_releases: None,
            ports: None,
            output_max_bytes: None,
            output_keep: None,
            replicas: None,
            waves: None,
            soak_ms: None,
            min_ready_ms: None,
            max_failure_ratio: None,
            release_deadline_ms: None,
            classes: None,
        }
    }

    #[test]
    fn settings_come_from_the_command_line_then_the_policy_then_defaults() {
        let p = policy(4000, OnStall::Escalate);
        let s = resolve(Some(900), None, None, Some(&p)).unwrap();
        assert_eq!(s.deadline, Duration::from_millis(900));
        assert_eq!(s.poll, Duration::from_millis(250));
        assert_eq!(s.on_stall, OnStall::Escalate);
        assert_eq!(s.grace, Duration::from_millis(700));
        assert_eq!(s.drain, Duration::from_millis(900));
        let s = resolve(None, Some(50), Some(40), Some(&p)).unwrap();
        assert_eq!(s.deadline, Duration::from_millis(4000));
        assert_eq!(s.grace, Duration::from_millis(50));
        assert_eq!(s.drain, Duration::from_millis(40));
        let s = resolve(None, None, None, None).unwrap();
        assert_eq!(
            (s.deadline, s.poll, s.on_stall),
            (defaults::DEADLINE, defaults::POLL, OnStall::Rollback)
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
    fn settings_outside_the_deployers_bounds_are_named() {
        let mut p = policy(4000, OnStall::Rollback);
        p.poll_ms = 0;
        let err = check_bounds(&resolve(None, None, None, Some(&p)).unwrap()).unwrap_err();
        assert!(err.starts_with("poll_ms (policy) is 0 ms"), "{err}");
        let err = check_bounds(&resolve(Some(0), None, None, None).unwrap()).unwrap_err();
        assert!(err.starts_with("the deadline-ms argument is 0 ms"), "{err}");
        let p = policy(0, OnStall::Rollback);
        let err = check_bounds(&resolve(None, None, None, Some(&p)).unwrap()).unwrap_err();
        assert!(err.starts_with("progress_deadline_ms (policy)"), "{err}");
        let err = check_bounds(&resolve(None, Some(u64::MAX), None, None).unwrap()).unwrap_err();
        assert!(err.contains("stop grace"), "{err}");
        let err = check_bounds(&resolve(None, None, Some(u64::MAX), None).unwrap()).unwrap_err();
        assert!(err.contains("drain timeout"), "{err}");
        assert!(check_bounds(&resolve(None, Some(0), Some(0), None).unwrap()).is_ok());
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

    #[test]
    fn policy_entry_names() {
        assert_eq!(policy_entry_for("edge-svc"), "edge_svc");
    }
}
