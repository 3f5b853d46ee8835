//! The one start sequence every run takes, a deploy's and a rollout's alike: under the root's
//! lock, after recovering what a dead rollgate left, the run is planned from what the root
//! holds now, admitted (a signed release must pass), announced to the `pre_deploy` hook,
//! recorded before anything is spawned, and driven by the executor to its ending. A failure
//! after the first save is cleaned up here ([`abandon`]), so a candidate never outlives its
//! deploy without an outcome.
//!
//! Commands build a [`Start`] (names checked, policy loaded and resolved: the policy is
//! evaluated in a forked sandbox, before the runtime starts any thread) and call [`start`].

use std::path::PathBuf;
use std::time::Duration;

use super::outcome::{DeployEnding, Ending, Outcome};
use super::plan::Settings as DeploySettings;
use super::run::{Context, Executor};
use super::state::{self, Phase, Rollout};
use super::step::Event;
use super::{control, plan, record, recover, runtime, settings, view};
use crate::error::{refused, Error};
use crate::host::hooks::{Facts, Hook, Hooks};
use crate::host::signals::Signals;
use crate::host::state::{Pointer, Root};
use crate::host::{journal, lock, process};
use crate::{policy, release};

/// A run to start: what every kind shares, and its [`Plan`].
pub struct Start {
    /// The root, known to exist.
    pub root: Root,
    pub service: String,
    pub version: String,
    /// The release's executable under the root (a signed release runs from its verified copy).
    pub executable: PathBuf,
    pub hooks: Hooks,
    pub plan: Plan,
    /// Words for stderr once the run is planned (a restart's, a scale's: "restarting …"):
    /// said only when the engine takes the run, never before it refuses it (issue 81).
    pub announce: Option<String>,
    /// A scale's type counts (`scale.json` as it asks it to be): the run is planned with them,
    /// and they become the root's when it completes — with the processes, never before (a
    /// killed scale left `scale.json` at the new count and the processes at the old: issue 80).
    pub scale: Option<std::collections::BTreeMap<String, usize>>,
    /// What follows the run under the same lock, once it has ended (see [`Tail`]).
    pub tail: Option<Box<dyn Tail>>,
}

/// What the command that started a run has done once the run has ended — keepers given to
/// what runs, old releases pruned — run by the engine before it lets the root's lock go
/// (issue 80, 4): a deploy's path goes one way, command → engine → the tail it was handed,
/// and never takes the lock a second time after the engine (the next deploy could come
/// between). The engine does not know what the tail does; the command layers name it.
pub trait Tail {
    fn after<'a>(
        &'a self,
        root: &'a Root,
        outcome: &'a Outcome,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + 'a>>;
}

/// Where a deploy's candidate goes: a port named, or one of a range, chosen here under the
/// lock after recovery (issue 67, B): a deploy after a killed watch first finishes the dead
/// one's switch, which frees the port the same range then offers again.
#[derive(Debug, Clone, PartialEq)]
pub enum PortChoice {
    Given(u16),
    /// `first..=last` from `source` (`--ports`, the policy's `ports`).
    Range {
        first: u16,
        last: u16,
        source: String,
    },
}

impl PortChoice {
    /// The port: the one given, else the lowest of the range that is neither the live
    /// release's nor its fallback's and is free on 127.0.0.1 now, so the same command deploys
    /// release after release, alternating. A port held by the new process of a deploy whose
    /// rollgate died counts as free (for a dry run, which runs no recovery: the deploy's
    /// recovery stops that process first).
    pub fn decide(&self, root: &Root) -> Result<u16, Error> {
        let (first, last, source) = match self {
            PortChoice::Given(port) => return Ok(*port),
            PortChoice::Range {
                first,
                last,
                source,
            } => (first, last, source),
        };
        let live = root.read_pointer()?;
        // A crash loop's standby is retired before any run plans (a dry run, which retires
        // nothing, counts its port free as the run will find it: issue 81).
        let standby = live
            .as_ref()
            .and_then(|p| p.fallback.as_ref())
            .filter(|f| f.standby)
            .map(|f| f.port);
        let taken: Vec<u16> = live
            .iter()
            .flat_map(|p| {
                let kept = p.fallback.as_ref().filter(|f| !f.standby);
                std::iter::once(p.port).chain(kept.map(|f| f.port))
            })
            .collect();
        let left_by_a_dead_deploy = state::load(root)?
            .filter(|left| left.unsettled_deploy())
            .and_then(|left| left.new_process().map(|p| p.port));
        (*first..=*last)
            .find(|port| {
                !taken.contains(port)
                    && (port_free(*port).is_ok()
                        || left_by_a_dead_deploy == Some(*port)
                        || standby == Some(*port))
            })
            .ok_or_else(|| {
                let taken = match taken.as_slice() {
                    [] => String::new(),
                    ports => format!(
                        " ({} live or kept as the fallback)",
                        ports
                            .iter()
                            .map(u16::to_string)
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                };
                refused(format!(
                    "no port of {source} {first}-{last} is free{taken}: the others are busy on 127.0.0.1"
                ))
            })
    }
}

/// What kind of run, with the numbers only it has.
pub enum Plan {
    /// `rollgate deploy`: one candidate beside the live release, on `port`.
    Deploy {
        port: PortChoice,
        /// Boxed: with its probe, socket, judge and limits, it is large beside a rollout's.
        settings: Box<DeploySettings>,
        /// `--no-wait`: leave the watch to a background watcher and end at the switch.
        no_wait: bool,
    },
    /// `rollgate rollout`: the replica set in waves, planned from the pool as it is under the
    /// lock (the command line, then the policy, then the previous rollout, then the defaults).
    Rollout {
        args: settings::Args,
        /// Boxed: a policy entry is large beside a deploy's numbers.
        policy: Option<Box<policy::RolloutSettings>>,
    },
}

/// What a release runs, read once from its folder when its run is planned: whether it is an
/// image, and which (spawn, stop and the exec probe never read it again); its Procfile's
/// `web:` line, if it has one (else its executable); its other types' lines.
struct Runs {
    image: Option<String>,
    web: Option<Vec<String>>,
    others: Vec<(String, String)>,
}

impl Runs {
    fn of(start: &Start) -> Result<Runs, Error> {
        let folder = start.root.release_dir(&start.version);
        let image = crate::host::container::ImageRelease::of_release(&folder)
            .map_err(|e| refused(format!("{e}; nothing was started")))?
            .map(|image| image.image);
        let procfile = release::procfile::Procfile::of_release(&folder)?;
        Ok(Runs {
            image,
            web: procfile.as_ref().and_then(|p| p.web()),
            others: procfile.map(|p| p.others()).unwrap_or_default(),
        })
    }

    /// The record a run's new processes start from, completed with what the release runs.
    fn fill(&self, launch: &mut crate::host::launch::LaunchRecord) {
        launch.image = self.image.clone();
        launch.command = self.web.clone();
    }
}

/// A planned run, ready for its first save.
struct Prepared {
    rollout: Rollout,
    executable: PathBuf,
    /// The service's held socket (policy `listen`), taken before anything is recorded.
    listen: Option<std::os::fd::OwnedFd>,
    facts: Facts,
    /// A signed release's admission, for the rollout's `rollout_started` record.
    signed: Option<release::Signed>,
}

/// Starts the run and drives it to its ending.
pub fn start(start: Start) -> Result<Outcome, Error> {
    runtime()?.block_on(async {
        let mut signals = Signals::install()?;
        let _lock = lock::acquire(&start.root.lock_path())?;
        recover::recover(&start.root).await?;
        // A service a person stopped stays stopped until they start it.
        if let Some(stopped) = crate::host::stopped::read(&start.root.0)? {
            return Err(refused(format!(
                "{} is {}: run `rollgate start {} --root {}` first; nothing was started",
                start.service,
                stopped.words(),
                start.service,
                start.root.0.display()
            )));
        }
        // A crash-looping release's standby is the run's to replace: retired before the plan
        // (its port free again, its process named by nothing the run writes).
        super::standby::retire_standby(
            &start.root,
            &format!("a run of {} {} began", start.service, start.version),
        )
        .await?;
        // What the release runs, read once from its folder, goes into the plan's own launch
        // record: nothing patches the record after it is planned (issue 80, 5).
        let runs = Runs::of(&start)?;
        let mut prepared = match &start.plan {
            Plan::Deploy { port, settings, .. } => {
                let port = port.decide(&start.root)?;
                let mut settings = settings.as_ref().clone();
                runs.fill(&mut settings.launch);
                prepare_deploy(&start, port, &settings)?
            }
            Plan::Rollout { args, policy } => {
                match prepare_rollout(&start, args, policy.as_deref(), &runs)? {
                    Some(prepared) => prepared,
                    None => {
                        return Ok(Outcome::rollout(
                            Ending::Completed,
                            format!(
                                "every replica of {} already runs {}; nothing to do",
                                start.service, start.version
                            ),
                        ))
                    }
                }
            }
        };
        // Its other types (workers, a clock): slots of the run beside web's.
        with_types(&start, &mut prepared.rollout, &runs.others)?;
        if let Some(outcome) = nothing_to_scale(&start, &prepared.rollout)? {
            return Ok(outcome);
        }
        // Planned whole (its types' counts checked last): the run is taken.
        if let Some(words) = &start.announce {
            eprintln!("{words}");
        }
        let kind = match start.plan {
            Plan::Deploy { .. } => "deploy",
            Plan::Rollout { .. } => "rollout",
        };
        if prepared.rollout.settings.launch.unconfined {
            eprintln!(
                "rollgate: isolation.enabled = false: {} {} runs NOT confined, with rollgate's own privileges",
                start.service, start.version
            );
        } else if let Some(weaker) = crate::host::filesystem::weaker_here() {
            // Never silently weaker: once per deploy, what this kernel cannot hold.
            eprintln!("rollgate: {} {} is confined less than it could be: {weaker}", start.service, start.version);
        }
        match start
            .hooks
            .run(
                Hook::PreDeploy,
                &start.root.0,
                &prepared.facts,
                &prepared.rollout.settings.isolation(),
            )
            .await
        {
            Some(Ok(ran)) => log_hook(&start, &prepared, journal::LogEvent::HookRan, ran)?,
            Some(Err(e)) => {
                let refusal = format!("{e}; the {kind} was refused, nothing was started");
                // On the record: a deploy a hook stopped is an attempt as much as one its gate
                // stopped, though it never reached the log as a candidate.
                log_hook(
                    &start,
                    &prepared,
                    journal::LogEvent::HookFailed,
                    refusal.clone(),
                )?;
                return Err(refused(refusal));
            }
            None => {}
        }
        release_phase(&start, &prepared, kind).await?;
        let outcome = match start.plan {
            Plan::Deploy { no_wait, .. } => {
                run_deploy(&start.root, prepared, no_wait, &mut signals).await
            }
            Plan::Rollout { .. } => run_rollout(&start.root, prepared, &mut signals).await,
        }?;
        if let Some(tail) = &start.tail {
            tail.after(&start.root, &outcome).await;
        }
        Ok(outcome)
    })
}

/// A run's slots for the release's other process types (issue 69), each replacing the live
/// process of its type and place; the live processes of types the release no longer has leave.
/// A deploy moves them in its one wave, a rollout in step with web's waves.
fn with_types(
    start: &Start,
    rollout: &mut super::state::Rollout,
    others: &[(String, String)],
) -> Result<(), Error> {
    let rules = match &start.plan {
        Plan::Deploy { settings, .. } => settings.processes.clone(),
        Plan::Rollout { policy, .. } => super::types::rules_of(policy.as_deref())?,
    };
    let mut scale = match &start.scale {
        Some(asked) => asked.clone(),
        None => start.root.read_scale()?,
    };
    let live = start
        .root
        .read_processes()?
        .filter(|f| f.service == start.service)
        .map(|f| f.processes)
        .unwrap_or_default();
    let scale_by = match &start.plan {
        Plan::Rollout { args, .. } => args.scale_by.clone(),
        Plan::Deploy { .. } => Default::default(),
    };
    for (name, by) in &scale_by {
        let running = live.iter().filter(|p| &p.process_type == name).count();
        let count = running as i64 + by;
        if !(0..=1000).contains(&count) {
            return Err(refused(format!(
                "{name}={by:+}: {running} run, so that asks for {count}; a count is 0 to 1000; nothing was started"
            )));
        }
        scale.insert(name.clone(), count as usize);
    }
    let kinds = super::types::kinds(
        others,
        &rules,
        &scale,
        &rollout.settings.launch,
        rollout.settings.stop_first,
    )
    .map_err(|e| refused(format!("{e}; nothing was started")))?;
    super::types::add_slots(rollout, kinds, &live);
    rollout.scale = match start.scale.is_some() || !scale_by.is_empty() {
        true => Some(scale),
        false => None,
    };
    Ok(())
}

/// A scale of the types that starts and stops nothing (the counts asked are the ones running):
/// ends here, its counts kept (they may differ from the policy's, which now run).
fn nothing_to_scale(start: &Start, rollout: &Rollout) -> Result<Option<Outcome>, Error> {
    let moves = |s: &super::state::Slot| {
        matches!(
            s.state,
            super::state::SlotState::Pending | super::state::SlotState::Surplus
        )
    };
    if !rollout.types_only || rollout.slots.iter().any(moves) {
        return Ok(None);
    }
    if let Some(counts) = &rollout.scale {
        start.root.write_scale(counts).map_err(|e| {
            Error::Failed(format!(
                "cannot write {}: {e}",
                start.root.scale_path().display()
            ))
        })?;
    }
    Ok(Some(Outcome::rollout(
        Ending::Completed,
        format!(
            "{} {} already runs those counts; nothing started or stopped",
            start.service, start.version
        ),
    )))
}

/// The new version's release phase (its Procfile's `release:`), run once before any of its
/// processes starts — not when the version deployed is the one live already (a restart) —
/// confined and bounded as a `pre_deploy` hook is; its failure refuses the run, nothing
/// started, on the record as a refused `pre_deploy` is.
async fn release_phase(start: &Start, prepared: &Prepared, kind: &str) -> Result<(), Error> {
    if prepared.facts.previous_version.as_deref() == Some(start.version.as_str()) {
        return Ok(());
    }
    let folder = start.root.release_dir(&start.version);
    let Some(command) =
        release::procfile::Procfile::of_release(&folder)?.and_then(|p| p.release_phase())
    else {
        return Ok(());
    };
    let hooks = Hooks {
        release: Some(command),
        // The policy's `hooks.timeout_ms`, or its default where the policy has no hooks.
        timeout_ms: match start.hooks.timeout_ms {
            0 => crate::defaults::HOOK_TIMEOUT.as_millis() as u64,
            ms => ms,
        },
        ..start.hooks.clone()
    };
    let isolation = prepared.rollout.settings.isolation();
    match hooks
        .run(Hook::Release, &start.root.0, &prepared.facts, &isolation)
        .await
    {
        Some(Ok(ran)) => log_hook(start, prepared, journal::LogEvent::HookRan, ran),
        Some(Err(e)) => {
            let refusal = format!("{e}; the {kind} was refused, nothing was started");
            log_hook(
                start,
                prepared,
                journal::LogEvent::HookFailed,
                refusal.clone(),
            )?;
            Err(refused(refusal))
        }
        None => Ok(()),
    }
}

/// A user the host's proxy runs as is no service's (a release of it could take the front
/// door): refused before anything starts.
fn not_the_proxys_user(rollout: &Rollout) -> Result<(), Error> {
    match rollout.settings.launch.user.as_deref() {
        Some(name) if !rollout.settings.launch.unconfined => {
            match crate::host::account::why_not_named_user(name) {
                Some(why) => Err(refused(why)),
                None => Ok(()),
            }
        }
        _ => Ok(()),
    }
}

/// The deploy's checks under the lock, and its one-replica plan.
fn prepare_deploy(start: &Start, port: u16, settings: &DeploySettings) -> Result<Prepared, Error> {
    let root = &start.root;
    // After recovery, which may have raised the floor.
    let admitted = release::admit(&root.0, &start.service, &start.version, chrono::Utc::now())?;
    not_a_replica_set(root, &start.service, &start.version)?;
    let live = root.read_pointer()?;
    beside_the_live(live.as_ref(), port)?;
    port_free(port)?;
    let now = journal::now();
    let mut rollout = plan::deploy(&plan::DeployAsked {
        service: &start.service,
        version: &start.version,
        port,
        settings,
        live: live.as_ref(),
        token: format!("{}-{}", std::process::id(), now),
        now,
    });
    not_the_proxys_user(&rollout)?;
    let (executable, signed) = executable_of(start, admitted);
    rollout.signed = signed.clone();
    rollout.hooks = start.hooks.clone();
    Ok(Prepared {
        facts: Facts {
            service: start.service.clone(),
            version: start.version.clone(),
            previous_version: live.as_ref().map(|l| l.version.clone()),
            ports: vec![port],
            previous_ports: live.iter().map(|l| l.port).collect(),
            reason: None,
        },
        listen: {
            judged_by_a_proxy(root, &mut rollout)?;
            held_socket(root, &rollout)?
        },
        rollout,
        executable,
        signed,
    })
}

/// The rollout's plan from the pool as it is (None: every replica already runs the version).
fn prepare_rollout(
    start: &Start,
    args: &settings::Args,
    policy: Option<&policy::RolloutSettings>,
    runs: &Runs,
) -> Result<Option<Prepared>, Error> {
    let root = &start.root;
    let previous = state::load(root)?;
    if let Some(previous) = previous.as_ref().filter(|p| !p.is_over()) {
        return Err(refused(format!(
            "rollout {} of {} to {} is {}; one rollout at a time: `rollgate rollout resume {svc} --root {root}` or `rollgate rollout abort {svc} --root {root}` first",
            previous.id,
            previous.service,
            previous.to,
            if previous.phase == Phase::Paused { "paused" } else { "unfinished (its rollgate died)" },
            svc = previous.service,
            root = root.0.display(),
        )));
    }
    let baseline = settings::baseline(root, &start.service)?;
    let mut resolved = settings::resolve(args, policy, previous.as_ref(), &baseline)?;
    runs.fill(&mut resolved.settings.launch);
    let Some(mut rollout) = settings::plan(
        &start.service,
        &start.version,
        &resolved,
        &baseline,
        journal::now(),
    ) else {
        return Ok(None);
    };
    // A replica root keeps its user: its new replicas start beside the old ones, whose user
    // owns the state (a single deploy changes it stop-first; a rollout cannot yet).
    let live = root.read_pointer()?.filter(|p| p.service == start.service);
    if let Some(live) = live.filter(|l| l.launch.changes_user_from(&rollout.settings.launch)) {
        let said = |user: &Option<String>| {
            user.as_deref()
                .map_or("its own uid".to_string(), |u| format!("user {u}"))
        };
        return Err(refused(format!(
            "{}'s replicas run as {}, and the policy says {}: a rollout cannot change a replica root's user yet (the state belongs to one user at a time, and new replicas start beside the old ones); keep isolation.user as it is; nothing was started",
            start.service,
            said(&live.launch.user),
            said(&rollout.settings.launch.user)
        )));
    }
    not_the_proxys_user(&rollout)?;
    // Under the lock, like a single deploy: a signed release must pass before anything starts.
    let admitted = release::admit(&root.0, &start.service, &start.version, chrono::Utc::now())?;
    let (executable, signed) = executable_of(start, admitted);
    rollout.signed = signed.clone();
    rollout.hooks = start.hooks.clone();
    Ok(Some(Prepared {
        facts: Facts {
            service: rollout.service.clone(),
            version: rollout.to.clone(),
            previous_version: rollout.from.clone(),
            ports: Vec::new(),
            previous_ports: rollout
                .slots
                .iter()
                .filter_map(|s| Some(s.live.as_ref()?.port))
                .collect(),
            reason: None,
        },
        listen: {
            judged_by_a_proxy(root, &mut rollout)?;
            held_socket(root, &rollout)?
        },
        rollout,
        executable,
        signed,
    }))
}

/// The pid of the proxy serving `root`, if one gives its counts (the traffic judge reads them);
/// refused (with why) otherwise.
pub fn proxy_counts(root: &Root) -> Result<u32, Error> {
    crate::proxy::control::counts_now(&root.0, std::time::Duration::from_secs(2))
        .map(|line| line.pid)
        .map_err(|why| refused(format!("the policy asks for analysis, but {why}")))
}

/// A run whose policy asks for `analysis` needs a proxy serving the root to count what users
/// get: refused (exit 2) before anything is recorded when none answers. A service's first
/// release has no old release to be judged against (no baseline, and no proxy yet, most
/// often): it is gated on readiness alone, and the run says so.
fn judged_by_a_proxy(root: &Root, rollout: &mut Rollout) -> Result<(), Error> {
    if rollout.settings.analysis.is_none() {
        return Ok(());
    }
    if rollout.from.is_none() {
        rollout.settings.analysis = None;
        eprintln!(
            "rollgate: the policy asks for analysis, but {} {} is the service's first release: there is no old release to judge it against, so it is gated on readiness alone",
            rollout.service, rollout.to
        );
        return Ok(());
    }
    proxy_counts(root).map(drop).map_err(|e| {
        refused(format!(
            "{e}; the analysis judges the canary by what users get through `rollgate proxy`: start `rollgate proxy --root {}` in front of the service first; nothing was started",
            root.0.display()
        ))
    })
}

/// The service's socket from the root's holder (started now if none answers), when the run's
/// settings ask for one: refused if it cannot be had, before anything is recorded.
fn held_socket(root: &Root, rollout: &Rollout) -> Result<Option<std::os::fd::OwnedFd>, Error> {
    match &rollout.settings.launch.listen {
        Some(spec) => crate::host::listen::obtain_or_hold(&root.0, spec)
            .map(Some)
            .map_err(|e| refused(format!("{e}; nothing was started"))),
        None => Ok(None),
    }
}

/// A pre_deploy hook's line, with the run's token: the line just before the run's start (which
/// is how `log history` pairs it), or the run's only line when the hook refused it.
fn log_hook(
    start: &Start,
    prepared: &Prepared,
    event: journal::LogEvent,
    detail: String,
) -> Result<(), Error> {
    record::append(
        &start.root,
        &journal::Entry {
            token: Some(&prepared.rollout.id),
            ..journal::Entry::new(event, &start.version, &start.service, detail)
        },
    )
}

/// The executable a run starts (a signed release's verified copy) and its admission.
fn executable_of(
    start: &Start,
    admitted: Option<release::Admitted>,
) -> (PathBuf, Option<release::Signed>) {
    match admitted {
        Some(admitted) => (admitted.executable, Some(admitted.signed)),
        None => (start.executable.clone(), None),
    }
}

/// The deploy on the engine: the one-replica rollout, recorded in the same state file.
async fn run_deploy(
    root: &Root,
    prepared: Prepared,
    no_wait: bool,
    signals: &mut Signals,
) -> Result<Outcome, Error> {
    // Recorded before the spawn, so a deployer killed right after it still leaves a trace.
    if let Err(e) = state::save(root, &prepared.rollout) {
        // Half a record (the state without its view) must not read as a deploy that died.
        let _ = state::clear(root);
        return Err(refused(e.to_string()));
    }
    let context = Context {
        root: root.clone(),
        executable: prepared.executable,
        listen: prepared.listen,
    };
    let mut executor = Executor::new(context, prepared.rollout);
    if no_wait {
        executor = executor.detach_at_watch();
    }
    let phase = match executor.run(Event::Tick, signals).await {
        Ok(phase) => phase,
        Err(error) => return Err(abandon(root, executor.rollout(), error).await),
    };
    let ending = match (executor.detached(), phase) {
        (Some(watcher), _) => DeployEnding::Watching(watcher),
        (None, Phase::Completed) => DeployEnding::Promoted,
        (None, Phase::Aborted) => DeployEnding::RolledBack,
        (None, Phase::Paused | Phase::Running) => DeployEnding::Escalated,
    };
    let run = executor.rollout();
    Ok(Outcome::deploy_as_logged(
        ending,
        root,
        &run.id,
        run.started_at,
    ))
}

/// The rollout on the engine: recorded, announced, and the pool handed to the replica set.
async fn run_rollout(
    root: &Root,
    prepared: Prepared,
    signals: &mut Signals,
) -> Result<Outcome, Error> {
    let Prepared {
        rollout,
        executable,
        signed,
        listen,
        ..
    } = prepared;
    state::save(root, &rollout)?;
    // A request left for an earlier rollout is void for this one.
    let _ = std::fs::remove_file(root.0.join(control::REQUEST_FILE));
    record::append(
        root,
        &journal::Entry {
            ts: rollout.started_at,
            token: Some(&rollout.id),
            sequence: signed.as_ref().map(|s| s.sequence),
            manifest_sha256: signed.as_ref().map(|s| s.manifest_sha256.as_str()),
            ..journal::Entry::new(
                journal::LogEvent::RolloutStarted,
                &rollout.to,
                &rollout.service,
                settings::describe(&rollout),
            )
        },
    )?;
    // A root that had only `current` is now served by the replica set.
    record::write_pool(root, &rollout)?;
    let service = rollout.service.clone();
    let context = Context {
        root: root.clone(),
        executable,
        listen,
    };
    let mut executor = Executor::new(context, rollout);
    let phase = executor.run(Event::Tick, signals).await?;
    Ok(rollout_ending(root, phase, &service))
}

/// The outcome a rollout's finished executor run reports, read back from its state.
pub(super) fn rollout_ending(root: &Root, phase: Phase, service: &str) -> Outcome {
    let rollout = match state::load(root) {
        Ok(Some(rollout)) => rollout,
        _ => {
            return Outcome::rollout(
                Ending::Failed,
                "the rollout's state could not be read back".into(),
            )
        }
    };
    let line = view::line(&rollout);
    match phase {
        Phase::Completed => Outcome::rollout(Ending::Completed, format!("completed: {line}")),
        Phase::Aborted => Outcome::rollout(
            Ending::Failed,
            format!(
                "aborted: {}; {line}",
                rollout
                    .abort_cause
                    .as_ref()
                    .map_or("no cause recorded".into(), |c| c.reason.clone())
            ),
        ),
        Phase::Paused | Phase::Running => Outcome::rollout(
            Ending::Waiting,
            format!(
                "paused: {}; {line}\nresume with `rollgate rollout resume {service} --root {root}` or stop with `rollgate rollout abort {service} --root {root} [--rollback]`",
                rollout.pause_reason.as_deref().unwrap_or("no reason recorded"),
                root = root.0.display()
            ),
        ),
    }
}

/// A failure after the deploy was recorded (a log or state file that cannot be written, a
/// candidate that cannot be started): the candidate must not outlive this deploy without an
/// outcome, unless the switch already made it the live release. Returns the error completed
/// with the state that is left.
async fn abandon(root: &Root, rollout: &Rollout, error: Error) -> Error {
    let version = &rollout.to;
    let new = rollout.new_process().filter(|p| p.pid > 0).cloned();
    let state_path = root.0.join(state::ROLLOUT_FILE);
    let left = match (root.read_pointer(), &new) {
        (Ok(Some(pointer)), Some(new)) if pointer.names(new.identity()) => format!(
            "{version} is live (current names it); its record stays in {} so the next deploy or `rollgate promote` finishes the switch",
            state_path.display()
        ),
        (Err(e), Some(new)) => format!(
            "cannot tell whether the switch happened ({e}); candidate {version} (pid {}) is left running and recorded for the next deploy",
            new.pid
        ),
        _ => {
            let stopped = match &new {
                Some(new) => process::stop_group(
                    new.identity(),
                    Duration::from_millis(rollout.settings.grace_ms),
                )
                .await
                .to_string(),
                None => process::Stopped::AlreadyGone.to_string(),
            };
            if error.is_refused() {
                // Nothing of it runs and `current` never named it: its record goes.
                let _ = state::clear(root);
                return error;
            }
            // Its attempt ends with its outcome line, then its record goes; where even that
            // line cannot be written (the disk is full), the record stays, and the next
            // command on the root finishes the attempt with it (issue 67, A).
            let said = format!("candidate {version} {stopped}; current unchanged");
            let logged = record::log_outcome(
                root,
                rollout,
                crate::host::journal::LogEvent::RolledBack,
                format!("{error}; {said}"),
            );
            match logged.and_then(|()| state::clear(root).map_err(Error::from)) {
                Ok(()) => said,
                Err(e) => format!(
                    "{said}; {e}: its record stays in {} and the next command on the root logs its outcome",
                    state_path.display()
                ),
            }
        }
    };
    Error::Failed(format!("{error}; {left}"))
}

/// A deploy moves one release: a root its replica set serves moves by `rollgate rollout`.
pub fn not_a_replica_set(root: &Root, service: &str, version: &str) -> Result<String, Error> {
    match root.read_replicas()? {
        None => Ok("the root is not served by a replica set".into()),
        Some(set) => Err(refused(format!(
            "{} is served by its replica set ({} replicas in {}); move it with `rollgate rollout {service} {version} --root {}`",
            root.0.display(),
            set.replicas.len(),
            root.replicas_path().display(),
            root.0.display()
        ))),
    }
}

/// The candidate starts beside the live release, so never on its port.
pub fn beside_the_live(live: Option<&Pointer>, port: u16) -> Result<String, Error> {
    match live {
        Some(live) if live.port == port => Err(refused(format!(
            "port {port} is the live release's ({} {}); deploy the candidate beside it on another port",
            live.service, live.version
        ))),
        Some(live) => Ok(format!(
            "live release {} on port {} stays until the candidate is ready",
            live.version, live.port
        )),
        None => Ok("no live release: this would be the first".into()),
    }
}

/// The candidate's port is free on 127.0.0.1 now.
pub fn port_free(port: u16) -> Result<String, Error> {
    std::net::TcpListener::bind(("127.0.0.1", port))
        .map(|_| format!("port {port} is free on 127.0.0.1"))
        .map_err(|e| {
            refused(format!(
                "port {port} is busy on 127.0.0.1 ({e}); pick a free port for the candidate"
            ))
        })
}
