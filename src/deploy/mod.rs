//! Readiness-gated deploys on one host. Read [`deploy`] top to bottom: refuse what can be
//! refused before anything starts, start the candidate beside the live release, gate it on
//! `/readyz` until the deadline, then switch `current` with one rename or roll back.

pub(crate) mod dry_run;
mod escalation;
pub(crate) mod gate;
pub mod hooks;
pub(crate) mod journal;
pub(crate) mod lock;
pub(crate) mod plan;
pub(crate) mod probe;
pub(crate) mod process;
pub(crate) mod progress;
pub mod recover;
pub mod rollback;
pub mod signals;
pub mod state;
mod status;
pub(crate) mod watch;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::policy::{self, EvalOptions};
use crate::proxy::drain;
use crate::release;
use journal::Event as LogEvent;
use plan::{Action, Probe, Settings};
use process::Identity;
use signals::Signals;
use state::{Candidate, Pointer, Root, Stage, WriteError};

pub use escalation::finish_escalated;
pub use plan::check_name;
pub use status::status;
pub use watch::run_watcher;

/// `rollgate deploy`.
#[derive(Debug, Clone)]
pub struct Request {
    pub service: String,
    pub port: u16,
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

/// How a deploy ended; the exit code follows from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Promoted,
    RolledBack,
    Escalated,
    /// `abort` did what it was asked.
    Aborted,
    /// Switched, and a background watcher (this pid) finishes the watch (`--no-wait`).
    Watching(u32),
}

impl Outcome {
    pub fn exit_code(self) -> u8 {
        match self {
            Outcome::Promoted | Outcome::Aborted | Outcome::Watching(_) => 0,
            Outcome::RolledBack => 1,
            Outcome::Escalated => 3,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DeployError {
    /// Nothing was started and nothing changed (exit 2).
    #[error("{0}")]
    Refused(String),
    /// Something failed after the deploy began (exit 1); the message says what state is left.
    #[error("{0}")]
    Failed(String),
}

impl DeployError {
    pub fn exit_code(&self) -> u8 {
        match self {
            DeployError::Refused(_) => 2,
            DeployError::Failed(_) => 1,
        }
    }
}

pub(crate) fn refused(message: impl Into<String>) -> DeployError {
    DeployError::Refused(message.into())
}

pub fn runtime() -> Result<tokio::runtime::Runtime, DeployError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| refused(format!("cannot start the async runtime: {e}")))
}

/// The whole deploy.
pub fn deploy(request: Request) -> Result<Outcome, DeployError> {
    plan::check_name("service", &request.service).map_err(refused)?;
    plan::check_name("version", &request.version).map_err(refused)?;
    if request.port == 0 {
        return Err(refused("port 0 is not a port a release can be probed on"));
    }
    // The policy is evaluated in a forked sandbox: before the runtime starts any thread.
    let policy = load_policy(&request)?;
    let hooks = policy_hooks(policy.as_ref(), request.policy.as_deref()).map_err(refused)?;
    let settings = request
        .resolve(policy.as_ref())
        .map_err(|e| refused(format!("policy refused: {e}")))?;
    plan::check_bounds(&settings).map_err(refused)?;
    // The release must be there before anything starts (it runs from a verified copy if signed).
    let (root, _) = release_executable(&request.root, &request.version, &request.service)?;

    runtime()?.block_on(async {
        let mut signals = Signals::install().map_err(refused)?;
        let _lock = lock::acquire(&root.lock_path()).map_err(refused)?;
        recover::recover(&root).await?;
        // Under the lock and after recovery, which may have raised the floor.
        let admitted =
            release::admit(&root.0, &request.service, &request.version, chrono::Utc::now())
                .map_err(refused)?;
        if let Some(set) = root.read_replicas().map_err(refused)? {
            return Err(refused(format!(
                "{} is served by its replica set ({} replicas in {}); move it with `rollgate rollout {} {} --root {}`",
                root.0.display(),
                set.replicas.len(),
                root.replicas_path().display(),
                request.service,
                request.version,
                root.0.display()
            )));
        }
        let live = root.read_pointer().map_err(refused)?;
        if let Some(live) = &live {
            if live.port == request.port {
                return Err(refused(format!(
                    "port {} is the live release's ({} {}); deploy the candidate beside it on another port",
                    request.port, live.service, live.version
                )));
            }
        }
        if let Err(e) = std::net::TcpListener::bind(("127.0.0.1", request.port)) {
            return Err(refused(format!(
                "port {} is busy on 127.0.0.1 ({e}); pick a free port for the candidate",
                request.port
            )));
        }
        let facts = hooks::Facts {
            service: request.service.clone(),
            version: request.version.clone(),
            previous_version: live.as_ref().map(|l| l.version.clone()),
            ports: vec![request.port],
            previous_ports: live.iter().map(|l| l.port).collect(),
            reason: None,
        };
        if let Some(Err(e)) = hooks.run(hooks::Hook::PreDeploy, &root.0, &facts).await {
            return Err(refused(format!("{e}; the deploy was refused, nothing was started")));
        }
        gate_and_finish(&root, &request, &settings, live, admitted, hooks, &mut signals).await
    })
}

/// The policy's hooks, resolved against the policy file's folder (none without a policy).
pub(crate) fn policy_hooks(
    policy: Option<&policy::RolloutSettings>,
    file: Option<&std::path::Path>,
) -> Result<hooks::Hooks, String> {
    match (policy.and_then(|p| p.hooks.as_ref()), file) {
        (Some(hooks), Some(file)) => hooks::Hooks::from_policy(hooks, file),
        _ => Ok(hooks::Hooks::default()),
    }
}

/// Runs a post hook once an outcome is logged; a failure is logged (and said) but the outcome
/// stands.
pub(crate) async fn after_outcome(
    root: &Root,
    candidate: &Candidate,
    hook: hooks::Hook,
    reason: Option<String>,
) {
    let facts = hooks::Facts {
        service: candidate.service.clone(),
        version: candidate.version.clone(),
        previous_version: candidate.previous.as_ref().map(|p| p.version.clone()),
        ports: vec![candidate.port],
        previous_ports: candidate.previous.iter().map(|p| p.port).collect(),
        reason,
    };
    if let Some(Err(e)) = candidate.hooks.run(hook, &root.0, &facts).await {
        eprintln!("rollgate: {e}; the outcome stands");
        let _ = log(root, candidate, LogEvent::HookFailed, e, None);
    }
}

/// The request's policy entry, checked by the contract (None without `--policy`).
fn load_policy(request: &Request) -> Result<Option<policy::RolloutSettings>, DeployError> {
    policy_entry(
        request.policy.as_deref(),
        request.policy_entry.as_deref(),
        &request.service,
        &request.eval,
    )
}

/// A service's entry of a policy file (`--policy-entry`, else the service name with `-` as
/// `_`), checked by the contract; a refusal quotes Nickel's diagnostic. Deploys and rollouts.
pub(crate) fn policy_entry(
    file: Option<&std::path::Path>,
    entry: Option<&str>,
    service: &str,
    eval: &EvalOptions,
) -> Result<Option<policy::RolloutSettings>, DeployError> {
    let Some(path) = file else {
        return Ok(None);
    };
    let entry = entry.map_or_else(|| plan::policy_entry_for(service), str::to_string);
    policy::load_entry(path, &entry, eval)
        .map(Some)
        .map_err(|e| {
            refused(match e {
                policy::PolicyError::Nickel(_) => {
                    format!("{e}\nthe policy was refused; nothing was started")
                }
                other => format!("policy refused: {other}"),
            })
        })
}

/// `rollgate deploy ... --dry-run`: the report, and whether the deploy would be refused.
pub fn dry_run(request: &Request) -> (String, bool) {
    let policy = load_policy(request).map_err(|e| e.to_string());
    match dry_run::deploy(request, policy) {
        Ok(report) => (report, false),
        Err(e) => (e.to_string(), true),
    }
}

/// The root and the release's executable under it, refused unless both are there.
pub(crate) fn release_executable(
    root: &std::path::Path,
    version: &str,
    service: &str,
) -> Result<(Root, PathBuf), DeployError> {
    let root = Root::new(root.to_path_buf());
    if !root.0.is_dir() {
        return Err(refused(format!(
            "root {} is not a folder",
            root.0.display()
        )));
    }
    let executable = root.executable(version, service);
    check_executable(&executable, version, service)?;
    Ok((root, executable))
}

fn check_executable(
    path: &std::path::Path,
    version: &str,
    service: &str,
) -> Result<(), DeployError> {
    use std::os::unix::fs::PermissionsExt;
    match std::fs::metadata(path) {
        Err(_) => Err(refused(format!(
            "release {version} of {service} not found: {} does not exist",
            path.display()
        ))),
        Ok(m) if !m.is_file() => Err(refused(format!("{} is not a file", path.display()))),
        Ok(m) if m.permissions().mode() & 0o111 == 0 => Err(refused(format!(
            "{} is not executable (chmod +x it)",
            path.display()
        ))),
        Ok(_) => Ok(()),
    }
}

/// Starts the candidate, gates it, and promotes, rolls back or escalates.
async fn gate_and_finish(
    root: &Root,
    request: &Request,
    settings: &Settings,
    live: Option<Pointer>,
    admitted: Option<release::Admitted>,
    hooks: hooks::Hooks,
    signals: &mut Signals,
) -> Result<Outcome, DeployError> {
    // A signed release runs from the verified copy of its executable.
    let (executable, signed) = match admitted {
        Some(admitted) => (admitted.executable, Some(admitted.signed)),
        None => (root.executable(&request.version, &request.service), None),
    };
    // Recorded before the spawn, so a deployer killed right after it still leaves a trace.
    let mut candidate = Candidate {
        service: request.service.clone(),
        version: request.version.clone(),
        port: request.port,
        token: format!("{}-{}", std::process::id(), journal::now()),
        pid: None,
        start_time: None,
        stage: Stage::Spawning,
        deployer_pid: std::process::id(),
        started_at: journal::now(),
        grace_ms: settings.grace.as_millis() as u64,
        drain_ms: settings.drain.as_millis() as u64,
        previous: live.clone(),
        signed,
        probe: settings.probe.clone(),
        watch: None,
        hooks,
    };
    root.write_candidate(&candidate).map_err(|e| {
        refused(format!(
            "cannot write {}: {e}",
            root.candidate_path().display()
        ))
    })?;

    let output = root.output_path(&request.version, &request.service);
    let release_dir = root.release_dir(&request.version);
    let mut child = match process::spawn(&process::Launch {
        executable: &executable,
        workdir: &release_dir,
        output: &output,
        port: request.port,
        version: &request.version,
        token: &candidate.token,
        slot: None,
    }) {
        Ok(child) => child,
        Err(e) => {
            let _ = root.clear_candidate();
            return Err(refused(format!(
                "cannot start {}: {e}",
                executable.display()
            )));
        }
    };
    let started = Instant::now();
    let pid = child.id().map_or(0, |p| p as i32);
    let identity = Identity::of(pid).unwrap_or(Identity { pid, start_time: 0 });
    candidate.pid = Some(pid);
    candidate.start_time = Some(identity.start_time);
    candidate.stage = Stage::Running;
    let spawned = Spawned {
        identity,
        started,
        child: &mut child,
    };
    match gate_spawned(
        root,
        request,
        settings,
        live,
        signals,
        &mut candidate,
        spawned,
    )
    .await
    {
        Ok(outcome) => Ok(outcome),
        Err(error) => Err(abandon(root, &candidate, identity, &mut child, error).await),
    }
}

/// The candidate as the deploy that started it holds it.
struct Spawned<'a> {
    identity: Identity,
    started: Instant,
    child: &'a mut tokio::process::Child,
}

/// Everything after the spawn. Any error here reaches [`abandon`], which decides what is left.
async fn gate_spawned(
    root: &Root,
    request: &Request,
    settings: &Settings,
    live: Option<Pointer>,
    signals: &mut Signals,
    candidate: &mut Candidate,
    spawned: Spawned<'_>,
) -> Result<Outcome, DeployError> {
    let failed = |what: &str, e: std::io::Error| DeployError::Failed(format!("{what}: {e}"));
    let Spawned {
        identity,
        started,
        child,
    } = spawned;
    let pid = identity.pid;
    root.write_candidate(candidate)
        .map_err(|e| failed("cannot record the candidate", e))?;
    log(
        root,
        candidate,
        LogEvent::CandidateStarted,
        format!(
            "port {}; pid {pid}; deadline {} ms ({}); poll {} ms",
            request.port,
            settings.deadline.as_millis(),
            settings.deadline_source,
            settings.poll.as_millis()
        ),
        None,
    )?;

    let progress = progress::Progress::new(&request.version, settings.deadline);
    let timing = gate::Timing {
        deadline: settings.deadline,
        poll: settings.poll,
    };
    let watchers = gate::Watchers {
        signals: Some(signals),
        interrupt: None,
        progress: Some(&progress),
    };
    let subject = candidate.probe_subject(root, &request.version, request.port);
    let gate = gate::run(child, &subject, timing, started, watchers).await;
    let elapsed = started.elapsed();
    match plan::action(&gate.verdict, settings.on_stall) {
        Action::Promote => {
            let detail = format!(
                "ready after {} ms ({} probe{})",
                elapsed.as_millis(),
                gate.probes,
                if gate.probes == 1 { "" } else { "s" }
            );
            // A first release is not watched: there is nothing to switch back to.
            match live {
                Some(previous) if !settings.watch.is_zero() => {
                    let record = state::WatchRecord {
                        until: journal::now() + settings.watch.as_secs_f64(),
                        poll_ms: settings.poll.as_millis() as u64,
                        failures: settings.watch_failures,
                        gate_detail: detail,
                        gate_elapsed_ms: elapsed.as_millis() as u64,
                        switch_detail: String::new(),
                        watcher_pid: None,
                    };
                    watch::switch_and_watch(
                        root,
                        candidate,
                        identity,
                        &previous,
                        record,
                        request.no_wait,
                    )
                    .await
                }
                live => switch(root, candidate, identity, live, detail, elapsed).await,
            }
        }
        Action::Escalate => {
            candidate.stage = Stage::Escalated;
            root.write_candidate(candidate)
                .map_err(|e| failed("cannot record the escalation", e))?;
            log(
                root,
                candidate,
                LogEvent::Escalated,
                format!(
                    "{}; left running on port {} (pid {pid}) for a person: rollgate promote {svc} --root {root} or rollgate abort {svc} --root {root}; last probes: {}",
                    plan::reason(&gate.verdict, settings.deadline),
                    request.port,
                    gate.last_probes(),
                    svc = request.service,
                    root = root.0.display(),
                ),
                Some(elapsed),
            )?;
            Ok(Outcome::Escalated)
        }
        Action::RollBack => {
            let reason = plan::reason(&gate.verdict, settings.deadline);
            let context = format!("last probes: {}", gate.last_probes());
            roll_back(
                root,
                candidate,
                identity,
                Some(child),
                live.as_ref(),
                reason,
                context,
                elapsed,
            )
            .await?;
            Ok(Outcome::RolledBack)
        }
    }
}

/// A failure after the spawn (a log or record that cannot be written): the candidate must not
/// outlive this deploy without an outcome, unless the switch already made it the live release.
/// Returns the error completed with the state that is left.
async fn abandon(
    root: &Root,
    candidate: &Candidate,
    identity: Identity,
    child: &mut tokio::process::Child,
    error: DeployError,
) -> DeployError {
    let version = &candidate.version;
    let left = match root.read_pointer() {
        Ok(Some(pointer)) if pointer.names(identity) => format!(
            "{version} is live (current names it); its record stays in {} so the next deploy or `rollgate promote` finishes the switch",
            root.candidate_path().display()
        ),
        Err(e) => format!(
            "cannot tell whether the switch happened ({e}); candidate {version} (pid {}) is left running and recorded for the next deploy",
            identity.pid
        ),
        Ok(_) => {
            let stopped = process::stop_group(identity, Duration::from_millis(candidate.grace_ms)).await;
            // Our child: reap it so no zombie is left while this process lives on.
            let _ = tokio::time::timeout(Duration::from_secs(2), child.wait()).await;
            match root.clear_candidate() {
                Ok(()) => format!("candidate {version} {stopped}; current unchanged"),
                Err(e) => format!(
                    "candidate {version} {stopped}; current unchanged; its record could not be removed ({e}), the next deploy will"
                ),
            }
        }
    };
    DeployError::Failed(format!("{error}; {left}"))
}

/// The switch: the new pointer in one rename, then [`finish_switch`].
async fn switch(
    root: &Root,
    candidate: &Candidate,
    identity: Identity,
    live: Option<Pointer>,
    detail: String,
    elapsed: Duration,
) -> Result<Outcome, DeployError> {
    let pointer = candidate.pointer(identity, None);
    let durability = match root.write_pointer(&pointer) {
        Ok(()) => String::new(),
        Err(WriteError::NotWritten(e)) => {
            return Err(DeployError::Failed(format!(
                "cannot switch {}: {e}; the old pointer is intact",
                root.pointer_path().display(),
            )))
        }
        // The rename happened: readers see the new release, so the switch goes on.
        Err(error @ WriteError::NotDurable(_)) => format!("; current {error}"),
    };
    finish_switch(
        root,
        candidate,
        live.as_ref(),
        format!("{detail}{durability}"),
        Some(elapsed),
        true,
    )
    .await
}

/// After the rename, whoever performs it (a deploy, `promote`, the end of a watch, or the next
/// deploy after a crash): the previous release drained (if a proxy serves the root, and unless
/// the watch already did) and stopped with the grace recorded for this deploy, the outcome
/// logged once, the record cleared.
async fn finish_switch(
    root: &Root,
    candidate: &Candidate,
    previous: Option<&Pointer>,
    detail: String,
    elapsed: Option<Duration>,
    drain: bool,
) -> Result<Outcome, DeployError> {
    let drained = match previous {
        Some(old) if drain => drain_before_stop(root, old.port, candidate.drain_ms).await,
        _ => String::new(),
    };
    let old = stop_previous(previous, Duration::from_millis(candidate.grace_ms)).await;
    log(
        root,
        candidate,
        LogEvent::Promoted,
        format!("{detail}; {drained}{old}"),
        elapsed,
    )?;
    // Written last: a crash before this line leaves the floor where it was, and whoever
    // finishes this switch after a crash raises it.
    if let Some(signed) = &candidate.signed {
        release::write_floor(&root.0, signed).map_err(|e| {
            DeployError::Failed(format!(
                "promoted, but the release floor was not raised: {e}"
            ))
        })?;
    }
    root.clear_candidate().map_err(|e| {
        DeployError::Failed(format!(
            "promoted, but cannot clear the candidate record: {e}"
        ))
    })?;
    after_outcome(root, candidate, hooks::Hook::PostPromote, None).await;
    Ok(Outcome::Promoted)
}

/// Asks a proxy serving the root to finish the old release's requests. Unless it confirms (or
/// there is no proxy), it may still be routing to the old release, so the old release is kept
/// for the whole drain timeout before it is stopped.
pub(crate) async fn drain_before_stop(root: &Root, port: u16, drain_ms: u64) -> String {
    let limit = Duration::from_millis(drain_ms).min(plan::MAX_WAIT);
    let asked = Instant::now();
    let answer = drain::request(&root.0, port, limit).await;
    if plan::drain_confirmed(&answer) {
        return format!("{answer}; ");
    }
    tokio::time::sleep(limit.saturating_sub(asked.elapsed())).await;
    format!(
        "{answer}; the proxy did not confirm, so the old release was kept for the {} ms drain timeout; ",
        limit.as_millis()
    )
}

async fn stop_previous(live: Option<&Pointer>, grace: Duration) -> String {
    match live {
        None => "first release".into(),
        Some(old) => {
            let stopped = process::stop_group(old.identity(), grace).await;
            format!("old release {} {stopped}", old.version)
        }
    }
}

/// The rollback: stop the candidate's whole group (what its leader left running too), check the
/// old release still answers, log why. The pointer is never touched.
#[allow(clippy::too_many_arguments)]
async fn roll_back(
    root: &Root,
    candidate: &Candidate,
    identity: Identity,
    child: Option<&mut tokio::process::Child>,
    live: Option<&Pointer>,
    reason: String,
    context: String,
    elapsed: Duration,
) -> Result<(), DeployError> {
    let stopped = process::stop_group(identity, Duration::from_millis(candidate.grace_ms)).await;
    if let Some(child) = child {
        let _ = tokio::time::timeout(Duration::from_secs(2), child.wait()).await;
    }
    let old = match live {
        None => "no release was live".to_string(),
        Some(old) => match candidate
            .probe_subject(root, &old.version, old.port)
            .check()
            .await
        {
            (true, _) => format!("old release {} still answering", old.version),
            (false, other) => format!(
                "WARNING old release {} not answering ({other})",
                old.version
            ),
        },
    };
    let output = process::tail(&root.output_path(&candidate.version, &candidate.service), 3);
    let mut detail = format!("{reason}; {old}; candidate {stopped}; {context}");
    if !output.is_empty() {
        detail.push_str(&format!("; candidate output: {output}"));
    }
    log(root, candidate, LogEvent::RolledBack, detail, Some(elapsed))?;
    root.clear_candidate().map_err(|e| {
        DeployError::Failed(format!(
            "rolled back, but cannot clear the candidate record: {e}"
        ))
    })?;
    after_outcome(root, candidate, hooks::Hook::PostRollback, Some(reason)).await;
    Ok(())
}

/// Appends one line for this deploy. An outcome already written under this deploy's token (by
/// a run that crashed before clearing the record) is not written again.
fn log(
    root: &Root,
    candidate: &Candidate,
    event: LogEvent,
    detail: String,
    elapsed: Option<Duration>,
) -> Result<(), DeployError> {
    log_in_phase(root, candidate, event, detail, elapsed, None)
}

/// [`log`], naming where the outcome was decided when it was not the gate (`watch`).
fn log_in_phase(
    root: &Root,
    candidate: &Candidate,
    event: LogEvent,
    detail: String,
    elapsed: Option<Duration>,
    phase: Option<&str>,
) -> Result<(), DeployError> {
    let cannot = |e: std::io::Error| {
        DeployError::Failed(format!(
            "cannot append to {}: {e}",
            root.log_path().display()
        ))
    };
    if event.is_outcome()
        && journal::outcome_for(&root.log_path(), &candidate.token, candidate.started_at)
            .map_err(cannot)?
            .is_some()
    {
        return Ok(());
    }
    journal::append(
        &root.log_path(),
        &journal::Entry {
            port: Some(candidate.port),
            pid: candidate.pid,
            elapsed_ms: elapsed.map(|e| e.as_millis() as u64),
            token: Some(&candidate.token),
            sequence: candidate.signed.as_ref().map(|s| s.sequence),
            manifest_sha256: candidate
                .signed
                .as_ref()
                .map(|s| s.manifest_sha256.as_str()),
            phase,
            ..journal::Entry::new(event, &candidate.version, &candidate.service, detail)
        },
    )
    .map_err(cannot)
}

/// Whether a release on `port` answers `/readyz` with 200 now (for the demo).
pub fn answers_ready(port: u16) -> bool {
    runtime().is_ok_and(|rt| {
        rt.block_on(probe::readyz(port, probe::DEFAULT_TIMEOUT)) == Probe::Status(200)
    })
}

/// Stops a release process group by pid and start time, waiting up to the default grace
/// (for the demo, which leaves nothing running).
pub fn stop_release(pid: i32, start_time: u64) {
    if let Ok(rt) = runtime() {
        rt.block_on(process::stop_group(
            Identity { pid, start_time },
            plan::DEFAULT_GRACE,
        ));
    }
}
