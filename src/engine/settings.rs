//! A rollout's numbers and plan, decided before anything starts: the command line first, then
//! the policy, then the previous rollout (ports), then the defaults, all in one block below.

use crate::defaults;
use std::collections::BTreeMap;
use std::time::Duration;

use super::budgets::{assign_waves, Budgets};
use super::state::{Phase, Process, Rollout, Settings, Slot, SlotState};
use crate::engine::plan as deploy_plan;
use crate::host::fault::Fault;
use crate::host::state::{ReplicaClass, Root};
use crate::policy::RolloutSettings;

/// What the command line may say.
#[derive(Debug, Clone, Default)]
pub struct Args {
    pub replicas: Option<usize>,
    pub ports: Option<(u16, u16)>,
    pub waves: Option<Vec<u64>>,
    pub soak_ms: Option<u64>,
    pub deadline_ms: Option<u64>,
    pub grace_ms: Option<u64>,
    pub drain_ms: Option<u64>,
    pub watch_ms: Option<u64>,
    /// Every replica gets a fresh process, those already on the version included (`rollgate
    /// restart` of a replica root): one at a time within the rollout's budgets.
    pub fresh: bool,
    /// A scale of the other types alone (`rollgate scale SVC worker=3`): web's processes and
    /// every process already on the version stay as they are; only the difference starts and
    /// stops, so no port is needed (issue 80, 4).
    pub types_only: bool,
    /// A scale's counts relative to what runs (`worker=+1`), each decided under the lock
    /// from the processes running then, so two scales at once never count from one number.
    pub scale_by: BTreeMap<String, i64>,
}

/// `A-B` (inclusive), both ports non-zero and A <= B.
pub fn parse_ports(text: &str) -> Result<(u16, u16), Fault> {
    ports_in(text).map_err(|why| Fault::setting("ports", why))
}

fn ports_in(text: &str) -> Result<(u16, u16), String> {
    let (a, b) = text
        .split_once('-')
        .ok_or_else(|| format!("`{text}` is not a port range; write it as 9001-9020"))?;
    let port = |p: &str| {
        p.trim()
            .parse::<u16>()
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| format!("`{p}` in `{text}` is not a port (1 to 65535)"))
    };
    let (a, b) = (port(a)?, port(b)?);
    if a > b {
        return Err(format!(
            "the port range {a}-{b} is empty (first above last)"
        ));
    }
    Ok((a, b))
}

/// A wait such as `500ms`, `30s`, `2m` or `1h`, in milliseconds (at most 24 h).
pub fn parse_wait(text: &str) -> Result<u64, Fault> {
    wait_in(text).map_err(|why| Fault::setting("wait", why))
}

fn wait_in(text: &str) -> Result<u64, String> {
    let digits = text.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let unit = &text[digits.len()..];
    let per_unit: u64 = match unit {
        "ms" => 1,
        "s" => 1000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => {
            return Err(format!(
                "`{text}` is not a duration; write a whole number with ms, s, m or h (30s)"
            ))
        }
    };
    let ms = digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(per_unit))
        .ok_or_else(|| {
            format!("`{text}` is not a duration; write a whole number with ms, s, m or h (30s)")
        })?;
    if Duration::from_millis(ms) > crate::host::MAX_WAIT {
        return Err(format!("`{text}` is longer than 24 h"));
    }
    Ok(ms)
}

/// Comma-separated cumulative percentages, each 1 to 100.
pub fn parse_waves(text: &str) -> Result<Vec<u64>, Fault> {
    waves_in(text).map_err(|why| Fault::setting("waves", why))
}

fn waves_in(text: &str) -> Result<Vec<u64>, String> {
    text.split(',')
        .map(|p| {
            p.trim()
                .parse::<u64>()
                .ok()
                .filter(|p| (1..=100).contains(p))
                .ok_or_else(|| format!("wave `{p}` in `{text}` is not a percentage from 1 to 100"))
        })
        .collect()
}

/// The pool the rollout starts from: `replicas.json`, else the single release `current`
/// names (slot 0), else nothing.
pub fn baseline(root: &Root, service: &str) -> Result<Vec<(usize, Process)>, Fault> {
    if let Some(set) = root.read_replicas()? {
        if set.service != service {
            return Err(Fault::unreadable(
                &root.replicas_path(),
                format!(
                    "{} serves {}, not {service}",
                    root.replicas_path().display(),
                    set.service
                ),
            ));
        }
        return Ok(set
            .replicas
            .into_iter()
            .map(|r| {
                (
                    r.slot,
                    Process {
                        version: r.version,
                        port: r.port,
                        pid: r.pid,
                        start_time: r.start_time,
                        token: String::new(),
                        launch: None,
                    },
                )
            })
            .collect());
    }
    Ok(root
        .read_pointer()?
        .filter(|p| p.service == service)
        .map(|p| {
            (
                0,
                Process {
                    version: p.version,
                    port: p.port,
                    pid: p.pid,
                    start_time: p.start_time,
                    token: String::new(),
                    launch: Some(p.launch),
                },
            )
        })
        .into_iter()
        .collect())
}

/// The resolved numbers and the classes of the slots.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved {
    pub settings: Settings,
    pub classes: BTreeMap<usize, ReplicaClass>,
    /// See [`Args::fresh`].
    pub fresh: bool,
    /// See [`Args::types_only`].
    pub types_only: bool,
}

pub fn resolve(
    args: &Args,
    policy: Option<&RolloutSettings>,
    previous: Option<&Rollout>,
    baseline: &[(usize, Process)],
) -> Result<Resolved, Fault> {
    resolved(args, policy, previous, baseline).map_err(|why| Fault::setting("rollout", why))
}

fn resolved(
    args: &Args,
    policy: Option<&RolloutSettings>,
    previous: Option<&Rollout>,
    baseline: &[(usize, Process)],
) -> Result<Resolved, String> {
    let gate = deploy_plan::resolve_with_watch(
        args.deadline_ms,
        args.grace_ms,
        args.drain_ms,
        args.watch_ms,
        policy,
    )
    .map_err(|e| e.to_string())?;
    deploy_plan::check_bounds(&gate)
        .map_err(|e| e.to_string().replace("; nothing was started", ""))?;
    let running = baseline.iter().map(|(slot, _)| slot + 1).max();
    let replicas = match (args.replicas, policy.and_then(|p| p.replicas)) {
        // Web stays as it runs.
        _ if args.types_only => running.unwrap_or(1),
        (Some(n), _) => n,
        (None, Some(n)) => n as usize,
        (None, None) => running.unwrap_or(1),
    };
    if !(1..=defaults::MAX_REPLICAS).contains(&replicas) {
        return Err(format!(
            "replicas is {replicas}; a rollout moves 1 to {} replicas",
            defaults::MAX_REPLICAS
        ));
    }
    let waves = args
        .waves
        .clone()
        .or_else(|| policy.and_then(|p| p.waves.clone()))
        .unwrap_or_else(|| defaults::WAVES.to_vec());
    if waves.is_empty() || waves.iter().any(|p| !(1..=100).contains(p)) {
        return Err(format!(
            "waves {waves:?}: each wave is a percentage from 1 to 100"
        ));
    }
    let budgets = Budgets::of(
        replicas,
        policy.map_or(defaults::SURGE_PCT, |p| p.max_surge_pct),
        policy.map_or(defaults::UNAVAILABLE_PCT, |p| p.max_unavailable_pct),
    );
    let deadline_ms = gate.deadline.as_millis() as u64;
    let release_deadline_ms = policy
        .and_then(|p| p.release_deadline_ms)
        .unwrap_or(3 * deadline_ms + defaults::RELEASE_SLACK_MS);
    if release_deadline_ms <= deadline_ms {
        return Err(format!(
            "release_deadline_ms is {release_deadline_ms}; it must be above the progress deadline ({deadline_ms} ms)"
        ));
    }
    let max_failure_ratio = policy
        .and_then(|p| p.max_failure_ratio)
        .unwrap_or(defaults::MAX_FAILURE_RATIO);
    if !(0.0..=1.0).contains(&max_failure_ratio) {
        return Err(format!(
            "max_failure_ratio is {max_failure_ratio}; allowed is 0 to 1"
        ));
    }
    let ports = match args.types_only {
        // No web process starts: the ports web runs on are all the run names.
        true => baseline
            .iter()
            .map(|(_, p)| (p.port, p.port))
            .reduce(|(a, b), (c, d)| (a.min(c), b.max(d)))
            .ok_or("nothing of the service is live; nothing to scale")?,
        false => ports_of(args, policy, previous, replicas + budgets.surge, replicas)?,
    };
    let classes = classes_of(policy, replicas)?;
    let soak_ms = args
        .soak_ms
        .or_else(|| policy.and_then(|p| p.soak_ms))
        .unwrap_or(0);
    if Duration::from_millis(soak_ms) > crate::host::MAX_WAIT {
        return Err(format!("soak is {soak_ms} ms; at most 24 h is allowed"));
    }
    Ok(Resolved {
        settings: Settings {
            replicas,
            surge: budgets.surge,
            unavailable: budgets.unavailable,
            progress_deadline_ms: deadline_ms,
            poll_ms: gate.poll.as_millis() as u64,
            min_ready_ms: policy.and_then(|p| p.min_ready_ms).unwrap_or(0),
            soak_ms,
            max_failure_ratio,
            grace_ms: gate.grace.as_millis() as u64,
            drain_ms: gate.drain.as_millis() as u64,
            // Relative until the plan fixes it to a time.
            release_deadline: release_deadline_ms as f64 / 1000.0,
            ports,
            wave_percents: waves,
            // A first install has nothing to go back to: `plan` clears it then.
            watch_ms: gate.watch.as_millis() as u64,
            on_stall: crate::policy::OnStall::Rollback,
            soak_failures: gate.watch_failures,
            keep_fallback: false,
            output: gate.output,
            analysis: gate.analysis,
            stop_first: false,
            launch: gate.launch,
        },
        classes,
        fresh: args.fresh,
        types_only: args.types_only,
    })
}

/// The ports replica processes may take: the command line's, else the policy's, else the
/// previous rollout's; enough for the replicas and the surge beside them.
fn ports_of(
    args: &Args,
    policy: Option<&RolloutSettings>,
    previous: Option<&Rollout>,
    needed: usize,
    replicas: usize,
) -> Result<(u16, u16), String> {
    // A single deploy's "range" is its one port: not a range a rollout can take over.
    let previous_ports = previous
        .filter(|p| p.single.is_none())
        .map(|p| p.settings.ports);
    let from_policy = policy
        .and_then(|p| p.ports.as_deref())
        .map(|range| parse_ports(range).map_err(|e| format!("the policy's ports: {e}")))
        .transpose()?;
    let ports = match (args.ports.or(from_policy), previous_ports) {
        (Some(ports), _) | (None, Some(ports)) => ports,
        (None, None) => {
            return Err(
                "--ports A-B is needed for the first rollout of a root (or the policy's ports): the ports replica processes may take"
                    .into(),
            )
        }
    };
    let available = usize::from(ports.1 - ports.0) + 1;
    if available < needed {
        return Err(format!(
            "the port range {}-{} holds {available} ports; {replicas} replicas with a surge of {} need {needed}",
            ports.0,
            ports.1,
            needed - replicas
        ));
    }
    Ok(ports)
}

/// The policy's replica classes, by slot (a slot the rollout does not have is refused).
fn classes_of(
    policy: Option<&RolloutSettings>,
    replicas: usize,
) -> Result<BTreeMap<usize, ReplicaClass>, String> {
    let mut classes = BTreeMap::new();
    for (key, class) in policy
        .and_then(|p| p.classes.as_ref())
        .into_iter()
        .flatten()
    {
        let slot = key
            .parse::<usize>()
            .ok()
            .filter(|s| *s < replicas)
            .ok_or_else(|| {
                format!(
                    "classes: `{key}` is not a slot; slots are 0 to {}",
                    replicas - 1
                )
            })?;
        let class = match class.as_str() {
            "required" => ReplicaClass::Required,
            "best_effort" => ReplicaClass::BestEffort,
            "left_behind" => ReplicaClass::LeftBehind,
            other => {
                return Err(format!(
                    "classes.{key} is `{other}`; allowed are required, best_effort, left_behind"
                ))
            }
        };
        classes.insert(slot, class);
    }
    Ok(classes)
}

/// The rollout as it starts, or None when every replica that moves already runs `to`.
pub fn plan(
    service: &str,
    to: &str,
    resolved: &Resolved,
    baseline: &[(usize, Process)],
    now: f64,
) -> Option<Rollout> {
    let mut settings = resolved.settings.clone();
    settings.release_deadline += now;
    if baseline.is_empty() {
        settings.watch_ms = 0;
    }
    // Slots beyond the count asked for that serve now are a scale down (surplus); the list
    // runs to the highest, as slots are looked up by position.
    let last = baseline
        .iter()
        .map(|(slot, _)| slot + 1)
        .max()
        .unwrap_or(0)
        .max(settings.replicas);
    let mut slots: Vec<Slot> = (0..last)
        .map(|slot| {
            let live = baseline
                .iter()
                .find(|(s, _)| *s == slot)
                .map(|(_, p)| p.clone());
            let class = resolved
                .classes
                .get(&slot)
                .copied()
                .unwrap_or(ReplicaClass::BestEffort);
            // A left-behind slot keeps what it runs; with nothing running it is a new replica.
            let state = match &live {
                // A scale of the other types: web keeps what it runs, outside every wave.
                Some(l) if resolved.types_only && l.version == to => SlotState::Skipped,
                Some(_) if resolved.types_only => SlotState::LeftBehind,
                Some(_) if slot >= settings.replicas => SlotState::Surplus,
                None if slot >= settings.replicas => SlotState::Removed,
                Some(_) if class == ReplicaClass::LeftBehind => SlotState::LeftBehind,
                Some(l) if l.version == to && !resolved.fresh => SlotState::Skipped,
                _ => SlotState::Pending,
            };
            Slot::new(slot, class, state, live)
        })
        .collect();
    let moving: Vec<usize> = slots
        .iter()
        .filter(|s| s.state == SlotState::Pending)
        .map(|s| s.slot)
        .collect();
    // (A scale of the types decides once its types are planned: `start::with_types`.)
    if moving.is_empty()
        && !slots.iter().any(|s| s.state == SlotState::Surplus)
        && !resolved.types_only
    {
        return None;
    }
    let waves = assign_waves(&moving, &settings.wave_percents);
    for (k, wave) in waves.iter().enumerate() {
        for slot in wave {
            slots[*slot].wave = Some(k);
        }
    }
    Some(Rollout {
        // The rollgate's pid as well as the time: two rollouts started in the same millisecond
        // (on two roots of one host) must not share the token prefix recovery looks for.
        id: format!("r{}.{}", (now * 1000.0) as u64, std::process::id()),
        service: service.into(),
        from: most_common(baseline.iter().map(|(_, p)| p.version.as_str())),
        to: to.into(),
        started_at: now,
        phase: Phase::Running,
        settings,
        waves,
        wave: 0,
        slots,
        soak_until: None,
        pause_reason: None,
        abort_cause: None,
        signed: None,
        hooks: Default::default(),
        single: None,
        unsettled: true,
        post_hook_started: false,
        holds_requests: false,
        last_analysis: None,
        scale: None,
        types_only: resolved.types_only,
    })
}

fn most_common<'a>(versions: impl Iterator<Item = &'a str>) -> Option<String> {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for v in versions {
        *counts.entry(v).or_default() += 1;
    }
    counts
        .into_iter()
        .max_by_key(|(_, n)| *n)
        .map(|(v, _)| v.to_string())
}

/// The plan in one line, for the log.
pub fn describe(rollout: &Rollout) -> String {
    let s = &rollout.settings;
    if rollout.types_only {
        let names = |state: SlotState| {
            let named: Vec<String> = rollout
                .slots
                .iter()
                .filter(|slot| !slot.serves() && slot.state == state)
                .map(Slot::name)
                .collect();
            match named.is_empty() {
                true => "none".to_string(),
                false => named.join(", "),
            }
        };
        return format!(
            "scale {} of {}: starts {}; stops {}; web and the {} other running process(es) stay as they are; release deadline in {} ms",
            rollout.id,
            rollout.to,
            names(SlotState::Pending),
            names(SlotState::Surplus),
            rollout
                .slots
                .iter()
                .filter(|slot| !slot.serves() && slot.state == SlotState::Skipped)
                .count(),
            ((s.release_deadline - rollout.started_at) * 1000.0).round() as u64,
        );
    }
    let web = |wave: &Vec<usize>| wave.iter().filter(|s| rollout.slot(**s).serves()).count();
    let sizes: Vec<String> = rollout.waves.iter().map(|w| web(w).to_string()).collect();
    let moved: Vec<usize> = rollout.waves.iter().flatten().copied().collect();
    let types = rollout
        .types_in_step(&moved)
        .map_or(String::new(), |types| format!("; {types} in step"));
    format!(
        "rollout {} of {} replicas from {} to {}: waves of {} ({}){types}; surge {}, unavailable {}; soak {} ms; min ready {} ms; max failure ratio {}; release deadline in {} ms",
        rollout.id,
        s.replicas,
        rollout.from.as_deref().unwrap_or("nothing"),
        rollout.to,
        sizes.join(" + "),
        s.wave_percents
            .iter()
            .map(|p| format!("{p}%"))
            .collect::<Vec<_>>()
            .join(", "),
        s.surge,
        s.unavailable,
        s.soak_ms,
        s.min_ready_ms,
        s.max_failure_ratio,
        ((s.release_deadline - rollout.started_at) * 1000.0).round() as u64,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn live(version: &str, port: u16) -> Process {
        Process {
            version: version.into(),
            port,
            pid: 1000 + i32::from(port),
            start_time: 1,
            token: String::new(),
            launch: None,
        }
    }

    fn args(ports: &str) -> Args {
        Args {
            ports: Some(parse_ports(ports).unwrap()),
            ..Args::default()
        }
    }

    #[test]
    fn ranges_and_waves_are_parsed_or_named() {
        assert_eq!(parse_ports("9001-9020").unwrap(), (9001, 9020));
        assert!(parse_ports("9020-9001")
            .unwrap_err()
            .to_string()
            .contains("empty"));
        assert!(parse_ports("0-5")
            .unwrap_err()
            .to_string()
            .contains("not a port"));
        assert!(parse_ports("9001")
            .unwrap_err()
            .to_string()
            .contains("9001-9020"));
        assert_eq!(parse_wait("500ms").unwrap(), 500);
        assert_eq!(parse_wait("30s").unwrap(), 30_000);
        assert_eq!(parse_wait("2m").unwrap(), 120_000);
        assert!(parse_wait("25h").unwrap_err().to_string().contains("24 h"));
        assert!(parse_wait("1.5s").is_err());
        assert!(parse_wait("10").is_err());
        assert_eq!(parse_waves("1, 10,50,100").unwrap(), vec![1, 10, 50, 100]);
        assert!(parse_waves("0,100")
            .unwrap_err()
            .to_string()
            .contains("wave `0`"));
    }

    #[test]
    fn defaults_and_refusals() {
        let r = resolve(&args("9001-9020"), None, None, &[]).unwrap();
        let s = &r.settings;
        assert_eq!((s.replicas, s.surge, s.unavailable), (1, 1, 0));
        assert_eq!(s.wave_percents, defaults::WAVES.to_vec());
        // Three 1500 ms progress deadlines plus two minutes.
        assert_eq!(s.release_deadline, 124.5);
        let err = resolve(&Args::default(), None, None, &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("--ports"), "{err}");
        let small = Args {
            replicas: Some(10),
            ..args("9001-9010")
        };
        let err = resolve(&small, None, None, &[]).unwrap_err().to_string();
        assert!(err.contains("need 13"), "{err}");
        // With no --replicas, the pool's size.
        let pool = [(0, live("v1", 1)), (1, live("v1", 2)), (2, live("v1", 3))];
        let r = resolve(&args("9001-9010"), None, None, &pool).unwrap();
        assert_eq!(r.settings.replicas, 3);
    }

    #[test]
    fn the_policy_ports_serve_when_no_range_is_given_and_the_command_line_wins() {
        let policy: crate::policy::RolloutSettings = serde_json::from_str(
            r#"{"progress_deadline_ms": 1000, "poll_ms": 50, "max_unavailable_pct": 0,
                "max_surge_pct": 100, "on_stall": "rollback", "ports": "9101-9110",
                "output_max_bytes": 1048576, "output_keep": 2}"#,
        )
        .unwrap();
        let r = resolve(&Args::default(), Some(&policy), None, &[]).unwrap();
        assert_eq!(r.settings.ports, (9101, 9110));
        assert_eq!(r.settings.output.max_bytes, 1_048_576);
        assert_eq!(r.settings.output.keep, 2);
        // The launch record (flattened into the run's settings) keeps them too, under names of
        // its own: the run's state reads back (it once failed on a duplicate `grace_ms`).
        let graced = crate::policy::RolloutSettings {
            stop_grace_ms: Some(2500),
            ..policy.clone()
        };
        let r = resolve(&Args::default(), Some(&graced), None, &[]).unwrap();
        let text = serde_json::to_string(&r.settings).unwrap();
        let back: super::super::state::Settings = serde_json::from_str(&text).unwrap();
        assert_eq!(back.launch.rotation().keep, 2);
        assert_eq!(back.launch.grace(), Duration::from_millis(2500));
        assert_eq!(back.grace_ms, 2500);
        let r = resolve(&args("9001-9020"), Some(&policy), None, &[]).unwrap();
        assert_eq!(r.settings.ports, (9001, 9020));
        let bad = crate::policy::RolloutSettings {
            ports: Some("9110-9101".into()),
            ..policy
        };
        let err = resolve(&Args::default(), Some(&bad), None, &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("the policy's ports"), "{err}");
    }

    #[test]
    fn the_plan_skips_what_already_runs_the_version_and_keeps_left_behind_slots() {
        let mut r = resolve(
            &Args {
                replicas: Some(5),
                ..args("9001-9020")
            },
            None,
            None,
            &[],
        )
        .unwrap();
        r.classes.insert(3, ReplicaClass::LeftBehind);
        r.classes.insert(4, ReplicaClass::LeftBehind);
        let pool = [
            (0, live("v1", 1)),
            (1, live("v2", 2)),
            (2, live("v1", 3)),
            (3, live("v1", 4)),
        ];
        let plan = plan("edge-svc", "v2", &r, &pool, 1000.0).unwrap();
        let states: Vec<SlotState> = plan.slots.iter().map(|s| s.state).collect();
        assert_eq!(
            states,
            [
                SlotState::Pending,
                SlotState::Skipped,
                SlotState::Pending,
                SlotState::LeftBehind,
                // Left behind with nothing running: a new replica.
                SlotState::Pending,
            ]
        );
        assert_eq!(plan.waves, vec![vec![0], vec![2], vec![4]]);
        assert_eq!(plan.from.as_deref(), Some("v1"));
        assert_eq!(plan.settings.release_deadline, 1124.5);
        let all_there = [(0, live("v2", 1))];
        let one = resolve(&args("9001-9020"), None, None, &all_there).unwrap();
        assert!(super::plan("edge-svc", "v2", &one, &all_there, 0.0).is_none());
    }

    #[test]
    fn a_pool_larger_than_asked_for_is_scaled_down_first() {
        let down = Args {
            replicas: Some(2),
            ..args("9001-9010")
        };
        // Slots 0, 1, 3 and 4 serve; slot 2 is a gap.
        let pool = [
            (0, live("v1", 1)),
            (1, live("v1", 2)),
            (3, live("v1", 4)),
            (4, live("v1", 5)),
        ];
        let r = resolve(&down, None, None, &pool).unwrap();
        let plan = plan("edge-svc", "v2", &r, &pool, 0.0).unwrap();
        let states: Vec<SlotState> = plan.slots.iter().map(|s| s.state).collect();
        use SlotState::*;
        assert_eq!(states, [Pending, Pending, Removed, Surplus, Surplus]);
        assert_eq!(plan.waves.concat(), [0, 1]);
        // Only a scale down, on the version already running: still a rollout to run.
        let same: Vec<(usize, Process)> = pool
            .iter()
            .map(|(slot, p)| (*slot, live("v2", p.port)))
            .collect();
        let plan = super::plan("edge-svc", "v2", &r, &same, 0.0).unwrap();
        assert!(plan.waves.concat().is_empty());
        assert_eq!(plan.count(Surplus), 2);
    }
}
