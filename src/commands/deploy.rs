//! Readiness-gated deploys on one host. Read [`deploy`] top to bottom: refuse what can be
//! refused before anything starts, then hand the deploy to the rollout engine as its
//! one-replica case (`engine::single`): it starts the candidate beside the live release, gates
//! it until the deadline, switches `current` with one rename (watching it, with the previous
//! release as the fallback) or rolls back.

use std::path::PathBuf;
use std::time::Duration;

use super::preflight::{self, policy_entry, policy_hooks, release_executable};
use crate::engine::judge::{self as plan, Settings};
use crate::engine::run::{Context, Executor};
use crate::engine::state::{self as rollout_state, Phase, Rollout};
use crate::engine::step::Event;
use crate::engine::{recover, runtime, single};
use crate::error::{self, refused, Error};
use crate::host::probe::Probe;
use crate::host::process::Identity;
use crate::host::signals::Signals;
use crate::host::state::{Pointer, Root};
use crate::host::{hooks, journal, lock, probe, process};
use crate::policy::{self, EvalOptions};
use crate::release;

pub use crate::host::names::check_name;

/// `rollgate deploy`.
#[derive(Debug, Clone)]
pub struct Request {
    pub service: String,
    pub port: PortAsked,
    pub version: String,
    pub deadline_ms: Option<u64>,
    pub root: PathBuf,
    pub policy: Option<PathBuf>,
    pub policy_entry: Option<String>,
    pub grace_ms: Option<u64>,
    pub drain_ms: Option<u64>,
    /// `--watch-ms`: overrides the policy's `watch_ms`.
    pub watch_ms: Option<u64>,
    /// `--no-wait`: leave the watch to a background watcher and exit after the switch.
    pub no_wait: bool,
    pub eval: EvalOptions,
}

impl Request {
    /// The numbers this deploy runs by: its arguments, then the policy, then the defaults.
    pub fn resolve(&self, policy: Option<&policy::RolloutSettings>) -> Result<Settings, String> {
        plan::resolve_with_watch(
            self.deadline_ms,
            self.grace_ms,
            self.drain_ms,
            self.watch_ms,
            policy,
        )
    }
}

/// `rollgate deploy SERVICE ...`'s positional words: `VERSION`, or `PORT VERSION
/// [DEADLINE_MS]` (the form every script written before `--ports` uses).
#[derive(Debug, Clone, PartialEq)]
pub struct Positional {
    pub port: Option<u16>,
    pub version: String,
    pub deadline_ms: Option<u64>,
}

impl Positional {
    pub fn parse(words: &[String]) -> Result<Positional, String> {
        let port = |word: &str| {
            word.parse::<u16>()
                .map_err(|_| format!("`{word}` is not a port (1 to 65535)"))
        };
        match words {
            [version] => Ok(Positional {
                port: None,
                version: version.clone(),
                deadline_ms: None,
            }),
            [p, version] => Ok(Positional {
                port: Some(port(p)?),
                version: version.clone(),
                deadline_ms: None,
            }),
            [p, version, deadline] => Ok(Positional {
                port: Some(port(p)?),
                version: version.clone(),
                deadline_ms: Some(
                    deadline
                        .parse()
                        .map_err(|_| format!("`{deadline}` is not a deadline in milliseconds"))?,
                ),
            }),
            _ => Err("give VERSION, or PORT VERSION [DEADLINE_MS]".into()),
        }
    }
}

/// Where a deploy's candidate port comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum PortAsked {
    /// `PORT` on the command line.
    Given(u16),
    /// Chosen by [`choose_port`] from `--ports` (`range`), else from the policy's `ports`;
    /// without either, `otherwise` (a rollback's: the port the earlier release was live on), or
    /// its refusal.
    Chosen {
        range: Option<String>,
        otherwise: Result<u16, String>,
    },
}

impl PortAsked {
    /// `--ports` if given, else the policy's `ports`, else refused with `refusal`.
    pub fn from_range(range: Option<String>, refusal: String) -> PortAsked {
        PortAsked::Chosen {
            range,
            otherwise: Err(refusal),
        }
    }

    /// The port itself, under the same rule for `deploy`, `rollback` and `config set`.
    pub fn resolve(
        &self,
        root: &std::path::Path,
        policy: Option<&policy::RolloutSettings>,
    ) -> Result<u16, Error> {
        match self {
            PortAsked::Given(port) => Ok(*port),
            PortAsked::Chosen { range, otherwise } => {
                match (range, policy.and_then(|p| p.ports.as_ref())) {
                    (Some(range), _) => choose_port(root, range, "--ports"),
                    (None, Some(range)) => choose_port(root, range, "the policy's ports"),
                    (None, None) => otherwise.clone().map_err(refused),
                }
            }
        }
    }
}

/// The candidate's port from a range (`A-B`, at least two ports; `source` says where it was
/// written): the lowest that is neither the live release's nor its fallback's and is free on
/// 127.0.0.1 now, so the same command deploys release after release, alternating. The deploy
/// checks it again under the lock.
pub fn choose_port(root: &std::path::Path, range: &str, source: &str) -> Result<u16, Error> {
    let (first, last) = crate::engine::settings::parse_ports(range)
        .map_err(|e| refused(format!("{source}: {e}")))?;
    if first == last {
        return Err(refused(format!(
            "{source} {range} holds one port; give at least two, so the candidate can start beside the live release"
        )));
    }
    let live = Root::new(root.to_path_buf())
        .read_pointer()
        .map_err(refused)?;
    let taken: Vec<u16> = live
        .iter()
        .flat_map(|p| std::iter::once(p.port).chain(p.fallback.as_ref().map(|f| f.port)))
        .collect();
    (first..=last)
        .find(|port| !taken.contains(port) && preflight::port_free(*port).is_ok())
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
                "no port of {source} {range} is free{taken}: the others are busy on 127.0.0.1"
            ))
        })
}

/// How a deploy ended; the exit code follows from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeployOutcome {
    Promoted,
    RolledBack,
    Escalated,
    /// `abort` did what it was asked.
    Aborted,
    /// Switched, and a background watcher (this pid) finishes the watch (`--no-wait`).
    Watching(u32),
}

/// How a deploy ended, in the words `rollgate deploy` says it on stderr.
pub fn said(outcome: DeployOutcome) -> String {
    match outcome {
        DeployOutcome::Promoted => "promoted".to_string(),
        DeployOutcome::RolledBack => "rolled back (see deploy.log for why)".to_string(),
        DeployOutcome::Escalated => {
            "escalated: left running, not promoted; run `rollgate promote` or `rollgate abort`"
                .to_string()
        }
        DeployOutcome::Aborted => "aborted: candidate stopped, logged as rolled_back".to_string(),
        DeployOutcome::Watching(pid) => format!(
            "switched; watcher pid {pid} finishes the watch (promoted or switched back); see `rollgate status`"
        ),
    }
}

impl DeployOutcome {
    pub fn exit_code(self) -> u8 {
        match self {
            DeployOutcome::Promoted | DeployOutcome::Aborted | DeployOutcome::Watching(_) => {
                error::SUCCESS
            }
            DeployOutcome::RolledBack => error::FAILED,
            DeployOutcome::Escalated => error::WAITING,
        }
    }
}

/// The whole deploy.
pub fn deploy(request: Request) -> Result<DeployOutcome, Error> {
    crate::host::names::check_name("service", &request.service).map_err(refused)?;
    crate::host::names::check_name("version", &request.version).map_err(refused)?;
    // The policy is evaluated in a forked sandbox: before the runtime starts any thread.
    let policy = load_policy(&request)?;
    let port = request.port.resolve(&request.root, policy.as_ref())?;
    if port == 0 {
        return Err(refused("port 0 is not a port a release can be probed on"));
    }
    let hooks = policy_hooks(policy.as_ref(), request.policy.as_deref()).map_err(refused)?;
    let settings = request
        .resolve(policy.as_ref())
        .map_err(|e| refused(format!("policy refused: {e}")))?;
    plan::check_bounds(&settings).map_err(refused)?;
    // The release must be there before anything starts (it runs from a verified copy if signed).
    let (root, _) = release_executable(&request.root, &request.version, &request.service)?;

    runtime()?
        .block_on(async {
            let mut signals = Signals::install().map_err(refused)?;
            let _lock = lock::acquire(&root.lock_path()).map_err(refused)?;
            recover::recover(&root).await?;
            // Under the lock and after recovery, which may have raised the floor.
            let admitted = release::admit(
                &root.0,
                &request.service,
                &request.version,
                chrono::Utc::now(),
            )
            .map_err(refused)?;
            preflight::not_a_replica_set(&root, &request.service, &request.version)
                .map_err(refused)?;
            let live = root.read_pointer().map_err(refused)?;
            preflight::beside_the_live(live.as_ref(), port).map_err(refused)?;
            preflight::port_free(port).map_err(refused)?;
            let facts = hooks::Facts {
                service: request.service.clone(),
                version: request.version.clone(),
                previous_version: live.as_ref().map(|l| l.version.clone()),
                ports: vec![port],
                previous_ports: live.iter().map(|l| l.port).collect(),
                reason: None,
            };
            if let Some(Err(e)) = hooks.run(hooks::Hook::PreDeploy, &root.0, &facts).await {
                return Err(refused(format!(
                    "{e}; the deploy was refused, nothing was started"
                )));
            }
            run_on_engine(
                &root,
                &request,
                port,
                &settings,
                live,
                admitted,
                hooks,
                &mut signals,
            )
            .await
        })
        .inspect(|outcome| {
            if *outcome == DeployOutcome::Promoted {
                super::releases::prune_after_promotion(&request.root, policy.as_ref());
            }
        })
}

/// The request's policy entry, checked by the contract (None without `--policy`).
fn load_policy(request: &Request) -> Result<Option<policy::RolloutSettings>, Error> {
    policy_entry(
        request.policy.as_deref(),
        request.policy_entry.as_deref(),
        &request.service,
        &request.eval,
    )
}

/// `rollgate deploy ... --dry-run`: the report, and whether the deploy would be refused.
pub fn dry_run(request: &Request) -> (String, bool) {
    let policy = load_policy(request).map_err(|e| e.to_string());
    match super::dry_run::deploy(request, policy) {
        Ok(report) => (report, false),
        Err(e) => (e.to_string(), true),
    }
}

/// Runs the deploy on the engine: the one-replica rollout `engine::single` plans, on the same
/// planner and executor as every rollout, recorded in the same state file.
// Eight inputs of one start sequence; issue 35 folds it into the engine's `start`.
#[allow(clippy::too_many_arguments)]
async fn run_on_engine(
    root: &Root,
    request: &Request,
    port: u16,
    settings: &Settings,
    live: Option<Pointer>,
    admitted: Option<release::Admitted>,
    hooks: hooks::Hooks,
    signals: &mut Signals,
) -> Result<DeployOutcome, Error> {
    // A signed release runs from the verified copy of its executable.
    let (executable, signed) = match admitted {
        Some(admitted) => (admitted.executable, Some(admitted.signed)),
        None => (root.executable(&request.version, &request.service), None),
    };
    let now = journal::now();
    let mut planned = single::plan(&single::Asked {
        service: &request.service,
        version: &request.version,
        port,
        settings,
        live: live.as_ref(),
        token: format!("{}-{}", std::process::id(), now),
        now,
    });
    planned.signed = signed;
    planned.hooks = hooks;
    // Recorded before the spawn, so a deployer killed right after it still leaves a trace.
    if let Err(e) = rollout_state::save(root, &planned) {
        // Half a record (the state without its view) must not read as a deploy that died.
        let _ = rollout_state::clear(root);
        return Err(refused(e));
    }
    let context = Context {
        root: root.clone(),
        executable,
    };
    let mut executor = Executor::new(context, planned);
    if request.no_wait {
        executor = executor.detach_at_watch();
    }
    let phase = match executor.run(Event::Tick, signals).await {
        Ok(phase) => phase,
        Err(error) => return Err(abandon(root, executor.rollout(), error).await),
    };
    Ok(match (executor.detached(), phase) {
        (Some(watcher), _) => DeployOutcome::Watching(watcher),
        (None, Phase::Completed) => DeployOutcome::Promoted,
        (None, Phase::Aborted) => DeployOutcome::RolledBack,
        (None, Phase::Paused | Phase::Running) => DeployOutcome::Escalated,
    })
}

/// A failure after the deploy was recorded (a log or state file that cannot be written, a
/// candidate that cannot be started): the candidate must not outlive this deploy without an
/// outcome, unless the switch already made it the live release. Returns the error completed
/// with the state that is left.
async fn abandon(root: &Root, rollout: &Rollout, error: Error) -> Error {
    let version = &rollout.to;
    let new = rollout.new_process().filter(|p| p.pid > 0).cloned();
    let state_path = root.0.join(rollout_state::ROLLOUT_FILE);
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
                Some(new) => {
                    process::stop_group(new.identity(), Duration::from_millis(rollout.settings.grace_ms))
                        .await
                        .to_string()
                }
                None => process::Stopped::AlreadyGone.to_string(),
            };
            // Nothing of it runs and `current` never named it: its record goes.
            let cleared = rollout_state::clear(root);
            if let Error::Refused(_) = error {
                return error;
            }
            match cleared {
                Ok(()) => format!("candidate {version} {stopped}; current unchanged"),
                Err(e) => format!(
                    "candidate {version} {stopped}; current unchanged; {e}, the next deploy will"
                ),
            }
        }
    };
    Error::Failed(format!("{error}; {left}"))
}

/// Whether a release on `port` answers `/readyz` with 200 now (for the demo).
pub fn answers_ready(port: u16) -> bool {
    runtime().is_ok_and(|rt| {
        rt.block_on(probe::readyz(port, crate::defaults::PROBE_TIMEOUT)) == Probe::Status(200)
    })
}

/// Stops a release process group by pid and start time, waiting up to the default grace
/// (for the demo, which leaves nothing running).
pub fn stop_release(pid: i32, start_time: u64) {
    if let Ok(rt) = runtime() {
        rt.block_on(process::stop_group(
            Identity { pid, start_time },
            crate::defaults::GRACE,
        ));
    }
}
