//! The numbers a run is planned by, decided before anything starts: a deploy's [`Settings`]
//! from its command line, then the policy, then the defaults (`defaults.rs`), checked against
//! the bounds the deployer runs with; and the policy entry a service reads. A rollout's
//! numbers and waves are `settings`'s, on the same rule. A deploy's one-replica run is
//! planned here too ([`deploy`]).

use crate::defaults;
use std::time::Duration;

use super::state::{
    Phase, Process, Rollout, Settings as RunSettings, Single, Slot, SlotState,
    NO_RELEASE_DEADLINE_S,
};
use crate::host::fault::Fault;
use crate::host::launch::LaunchRecord;
use crate::host::probe::Spec as ProbeSpec;
use crate::host::state::{Pointer, ReplicaClass};
use crate::host::MAX_WAIT;
use crate::policy::{OnStall, RolloutSettings};

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
    /// How each release process of the run is started: its probe, held socket, confinement,
    /// limits, user and writable folders — decided here, once.
    pub launch: LaunchRecord,
    /// 0: no watch after the switch.
    pub watch: Duration,
    pub watch_failures: u32,
    /// How the release's output file is bounded.
    pub output: crate::host::output::Rotation,
    /// Judge the new release by the proxy's counts, if the policy asks (`analysis`).
    pub analysis: Option<crate::engine::analysis::Analysis>,
    /// The rules of each process type the policy names (`processes`; issue 69).
    pub processes: std::collections::BTreeMap<String, super::types::TypeRules>,
}

/// Command line first, then the policy, then the defaults. Refused: a bad probe in a policy that
/// did not apply the contract.
pub fn resolve(
    deadline_arg: Option<u64>,
    grace_arg: Option<u64>,
    drain_arg: Option<u64>,
    policy: Option<&RolloutSettings>,
) -> Result<Settings, Fault> {
    resolve_with_watch(deadline_arg, grace_arg, drain_arg, None, policy)
}

/// [`resolve`], with the command line's `--watch-ms`.
pub fn resolve_with_watch(
    deadline_arg: Option<u64>,
    grace_arg: Option<u64>,
    drain_arg: Option<u64>,
    watch_arg: Option<u64>,
    policy: Option<&RolloutSettings>,
) -> Result<Settings, Fault> {
    let watch_failures = policy
        .and_then(|p| p.watch_failures)
        .unwrap_or(u64::from(defaults::WATCH_FAILURES));
    if !(1..=100).contains(&watch_failures) {
        return Err(Fault::setting(
            "watch_failures",
            format!("watch_failures is {watch_failures}; it must be an integer from 1 to 100"),
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
    let listen = match policy.and_then(|p| p.listen.as_ref()) {
        Some(asked) => Some(crate::host::listen::Spec::parse(
            &asked.address,
            asked.backlog.map_or(defaults::LISTEN_BACKLOG, |b| {
                b.min(u64::from(u32::MAX)) as u32
            }),
        )?),
        None => None,
    };
    let analysis = policy
        .and_then(|p| p.analysis.as_ref())
        .map(crate::engine::analysis::Analysis::from_policy)
        .transpose()?;
    let unconfined = policy
        .and_then(|p| p.isolation.as_ref())
        .and_then(|i| i.enabled)
        == Some(false);
    let isolation = policy.and_then(|p| p.isolation.as_ref());
    let limits = crate::host::cgroup::Limits {
        memory_mb: isolation.and_then(|i| i.memory_mb),
        pids: isolation.and_then(|i| i.pids),
        cpu_pct: isolation.and_then(|i| i.cpu_pct),
        nofile: isolation.and_then(|i| i.nofile),
    };
    let grace = first_of(
        grace_arg,
        policy.and_then(|p| p.stop_grace_ms),
        defaults::GRACE,
    );
    let launch = LaunchRecord {
        probe,
        listen,
        unconfined,
        limits,
        user: isolation.and_then(|i| i.user.clone()),
        writable: isolation
            .and_then(|i| i.writable.as_ref())
            .map(|w| w.iter().map(std::path::PathBuf::from).collect())
            .unwrap_or_default(),
        // The release is not known here: the engine records its image and its Procfile's
        // command when it admits it.
        image: None,
        command: None,
        crash_loop: crate::host::launch::CrashLoop::from_policy(
            policy.and_then(|p| p.crash_loop.as_ref()),
        )?,
        output: (output != crate::host::output::Rotation::default()).then_some(output),
        grace_ms: (grace != defaults::GRACE).then_some(grace.as_millis() as u64),
        min_ready_ms: policy.and_then(|p| p.min_ready_ms).filter(|ms| *ms > 0),
    };
    Ok(Settings {
        launch,
        analysis,
        output,
        deadline,
        poll: policy.map_or(defaults::POLL, |p| Duration::from_millis(p.poll_ms)),
        on_stall: policy.map_or(OnStall::Rollback, |p| p.on_stall),
        grace,
        drain: first_of(
            drain_arg,
            policy.and_then(|p| p.drain_timeout_ms),
            defaults::DRAIN,
        ),
        deadline_source,
        watch: first_of(watch_arg, policy.and_then(|p| p.watch_ms), defaults::WATCH),
        watch_failures: watch_failures as u32,
        processes: super::types::rules_of(policy)?,
    })
}

/// Refuses settings the deployer cannot run by, naming the field and what is allowed. Checked
/// before anything is recorded or spawned.
pub fn check_bounds(s: &Settings) -> Result<(), Fault> {
    let max = MAX_WAIT.as_millis();
    let within = |field: &str, value: Duration, min: u128| {
        let ms = value.as_millis();
        if ms < min || ms > max {
            Err(Fault::setting(
                field,
                format!(
                    "{field} is {ms} ms; the deployer runs with {min} ..= {max} ms (24 h); nothing was started"
                ),
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

/// What a single deploy is asked to do: `rollgate deploy` is the engine's one-replica rollout
/// (one required slot on the deploy's port, one wave, one surge place, the previous release
/// kept as the proxy's fallback through the watch).
pub struct DeployAsked<'a> {
    pub service: &'a str,
    pub version: &'a str,
    pub port: u16,
    pub settings: &'a Settings,
    pub live: Option<&'a Pointer>,
    /// The deploy's token: the rollout's id, on every line of the deploy.
    pub token: String,
    pub now: f64,
}

/// The one-replica rollout a deploy runs.
pub fn deploy(asked: &DeployAsked) -> Rollout {
    let s = asked.settings;
    let previous = asked.live.map(|live| Process {
        version: live.version.clone(),
        port: live.port,
        pid: live.pid,
        start_time: live.start_time,
        token: String::new(),
        launch: Some(live.launch.clone()),
    });
    // A new user for the service: its folders cannot belong to two users at once, so the
    // live release stops before the new one starts, users' requests held at the proxy.
    let stop_first = asked
        .live
        .is_some_and(|live| live.launch.changes_user_from(&s.launch));
    // A first release is not watched: there is nothing to switch back to.
    let watch_ms = if previous.is_some() {
        s.watch.as_millis() as u64
    } else {
        0
    };
    Rollout {
        id: asked.token.clone(),
        service: asked.service.into(),
        from: previous.as_ref().map(|p| p.version.clone()),
        to: asked.version.into(),
        started_at: asked.now,
        phase: Phase::Running,
        settings: RunSettings {
            replicas: 1,
            surge: usize::from(!stop_first),
            unavailable: usize::from(stop_first),
            progress_deadline_ms: s.deadline.as_millis() as u64,
            poll_ms: s.poll.as_millis() as u64,
            min_ready_ms: 0,
            soak_ms: 0,
            max_failure_ratio: 0.0,
            grace_ms: s.grace.as_millis() as u64,
            drain_ms: s.drain.as_millis() as u64,
            release_deadline: asked.now + NO_RELEASE_DEADLINE_S,
            ports: (asked.port, asked.port),
            wave_percents: vec![100],
            watch_ms,
            on_stall: s.on_stall,
            soak_failures: s.watch_failures,
            // Stopped first, the previous release is no fallback to keep.
            keep_fallback: !stop_first,
            output: s.output,
            analysis: s.analysis.clone(),
            stop_first,
            launch: s.launch.clone(),
        },
        waves: vec![vec![0]],
        wave: 0,
        slots: vec![Slot {
            wave: Some(0),
            ..Slot::new(
                0,
                ReplicaClass::Required,
                SlotState::Pending,
                previous.clone(),
            )
        }],
        soak_until: None,
        pause_reason: None,
        abort_cause: None,
        signed: None,
        hooks: Default::default(),
        single: Some(Single {
            deployer_pid: std::process::id(),
            previous,
            deadline_source: s.deadline_source.to_string(),
            watch_failures: s.watch_failures,
            gate_detail: None,
            gate_elapsed_ms: None,
            last_probes: None,
            switch_detail: String::new(),
            watcher_pid: None,
            settled: false,
        }),
        unsettled: true,
        post_hook_started: false,
        holds_requests: false,
        last_analysis: None,
        scale: None,
        types_only: false,
    }
}

#[cfg(test)]
pub(super) mod tests {
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
            listen: None,
            analysis: None,
            crash_loop: None,
            processes: None,
            schedules: None,
            isolation: None,
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

    /// What a keeper starts the release again with is what its deploy started it with: the
    /// launch record carries the grace, the output bounds and the crash-loop rule.
    #[test]
    fn the_launch_record_keeps_the_grace_the_output_bounds_and_the_crash_loop_rule() {
        let mut p = policy(4000, OnStall::Rollback);
        p.output_keep = Some(2);
        p.crash_loop = Some(crate::policy::CrashLoopPolicy {
            restarts: Some(0),
            within_ms: None,
        });
        let s = resolve(Some(900), Some(2500), None, Some(&p)).unwrap();
        assert_eq!(s.launch.grace(), Duration::from_millis(2500));
        assert_eq!(s.launch.rotation().keep, 2);
        assert_eq!(s.launch.crash_loop.restarts, 0);
        let plain = resolve(None, None, None, None).unwrap();
        assert_eq!(plain.launch.grace(), defaults::GRACE);
        assert_eq!(
            plain.launch.rotation(),
            crate::host::output::Rotation::default()
        );
        assert_eq!(
            plain.launch.crash_loop.restarts,
            defaults::CRASH_LOOP_RESTARTS
        );
        p.crash_loop = Some(crate::policy::CrashLoopPolicy {
            restarts: None,
            within_ms: Some(10),
        });
        assert!(resolve(None, None, None, Some(&p))
            .unwrap_err()
            .to_string()
            .contains("crash_loop.within_ms is 10"));
    }

    #[test]
    fn settings_outside_the_deployers_bounds_are_named() {
        let mut p = policy(4000, OnStall::Rollback);
        p.poll_ms = 0;
        let err = check_bounds(&resolve(None, None, None, Some(&p)).unwrap())
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("poll_ms (policy) is 0 ms"), "{err}");
        let err = check_bounds(&resolve(Some(0), None, None, None).unwrap())
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("the deadline-ms argument is 0 ms"), "{err}");
        let p = policy(0, OnStall::Rollback);
        let err = check_bounds(&resolve(None, None, None, Some(&p)).unwrap())
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("progress_deadline_ms (policy)"), "{err}");
        let err = check_bounds(&resolve(None, Some(u64::MAX), None, None).unwrap())
            .unwrap_err()
            .to_string();
        assert!(err.contains("stop grace"), "{err}");
        let err = check_bounds(&resolve(None, None, Some(u64::MAX), None).unwrap())
            .unwrap_err()
            .to_string();
        assert!(err.contains("drain timeout"), "{err}");
        assert!(check_bounds(&resolve(None, Some(0), Some(0), None).unwrap()).is_ok());
    }

    #[test]
    fn policy_entry_names() {
        assert_eq!(policy_entry_for("edge-svc"), "edge_svc");
    }

    fn deploy_settings() -> Settings {
        crate::engine::plan::resolve_with_watch(Some(600), None, None, Some(2000), None)
            .expect("defaults resolve")
    }

    /// A deploy of `version` on port 9002, with the deploy's token (the voice's tests use it
    /// too).
    pub(in crate::engine) fn planned(
        version: &str,
        live: Option<&Pointer>,
        token: &str,
    ) -> Rollout {
        deploy(&DeployAsked {
            service: "edge-svc",
            version,
            port: 9002,
            settings: &deploy_settings(),
            live,
            token: token.into(),
            now: 100.0,
        })
    }

    pub(in crate::engine) fn live() -> Pointer {
        Pointer {
            service: "edge-svc".into(),
            version: "v1".into(),
            port: 9001,
            pid: 41,
            start_time: 7,
            promoted_at: 1.0,
            fallback: None,
            launch: Default::default(),
        }
    }

    #[test]
    fn a_deploy_is_one_required_replica_on_its_port_kept_as_fallback_through_the_watch() {
        let settings = deploy_settings();
        let pointer = live();
        let r = planned("v2", Some(&pointer), "t1");
        assert_eq!(
            (
                r.settings.replicas,
                r.settings.surge,
                r.settings.unavailable
            ),
            (1, 1, 0)
        );
        assert_eq!(r.settings.ports, (9002, 9002));
        assert_eq!(r.settings.watch_ms, 2000);
        assert!(r.settings.keep_fallback);
        assert_eq!(r.slot(0).class, ReplicaClass::Required);
        assert_eq!(r.slot(0).live.as_ref().map(|p| p.pid), Some(41));
        assert_eq!(r.from.as_deref(), Some("v1"));
        assert_eq!(r.settings.progress_deadline_ms, 600);
        assert_eq!(Duration::from_millis(r.settings.grace_ms), settings.grace);
        // A first release has nothing to watch for.
        let first = planned("v1", None, "t0");
        assert_eq!(first.settings.watch_ms, 0);
        assert!(first.slot(0).live.is_none());
    }

    #[test]
    fn the_new_process_is_told_from_the_live_one_by_its_token_not_its_version() {
        // Deploying the live version again (a restart): both processes run "v1".
        let pointer = live();
        let mut r = planned("v1", Some(&pointer), "4242-100.5");
        assert!(
            r.new_process().is_none(),
            "the live release is not the new one"
        );
        r.slot_mut(0).candidate = Some(Process {
            version: "v1".into(),
            port: 9002,
            pid: 43,
            start_time: 8,
            token: "4242-100.5-0-4242.1".into(),
            launch: None,
        });
        assert_eq!(r.new_process().map(|p| p.pid), Some(43));
        // Swapped in: the previous one is kept as the fallback; the new one is still told apart.
        let s = r.slot_mut(0);
        s.fallback = s.live.take();
        s.live = s.candidate.take();
        assert_eq!(r.new_process().map(|p| p.pid), Some(43));
        // A legacy record's candidate carries the token itself.
        let mut legacy = r.clone();
        legacy.slot_mut(0).live.as_mut().expect("live").token = "4242-100.5".into();
        assert_eq!(legacy.new_process().map(|p| p.pid), Some(43));
        legacy.slot_mut(0).live.as_mut().expect("live").token = "4242-100.55".into();
        assert!(legacy.new_process().is_none(), "another deploy's token");
    }
}
