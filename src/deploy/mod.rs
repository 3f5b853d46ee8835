//! Readiness-gated deploys on one host. Read [`deploy`] top to bottom: refuse what can be
//! refused before anything starts, start the candidate beside the live release, gate it on
//! `/readyz` until the deadline, then switch `current` with one rename or roll back.

mod escalation;
mod journal;
mod lock;
mod plan;
mod probe;
mod process;
mod progress;
mod recover;
pub mod state;
mod status;

use std::collections::VecDeque;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use tokio::signal::unix::{signal, SignalKind};

use crate::policy::{self, EvalOptions};
use plan::{Action, Event, Probe, Settings, Verdict};
use process::Identity;
use state::{Candidate, Pointer, Root, Stage};

pub use escalation::finish_escalated;
pub use status::status;

/// A probe gets at most this long, and never beyond the deadline.
const PROBE_TIMEOUT: Duration = Duration::from_millis(1000);
/// Probe results kept for the rollback's detail.
const PROBES_KEPT: usize = 3;

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
    pub eval: EvalOptions,
}

/// How a deploy ended; the exit code follows from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Promoted,
    RolledBack,
    Escalated,
    /// `abort` did what it was asked.
    Aborted,
}

impl Outcome {
    pub fn exit_code(self) -> u8 {
        match self {
            Outcome::Promoted | Outcome::Aborted => 0,
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

fn refused(message: impl Into<String>) -> DeployError {
    DeployError::Refused(message.into())
}

fn runtime() -> Result<tokio::runtime::Runtime, DeployError> {
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
    let policy = match &request.policy {
        Some(path) => {
            let entry = request
                .policy_entry
                .clone()
                .unwrap_or_else(|| plan::policy_entry_for(&request.service));
            Some(
                policy::load_entry(path, &entry, &request.eval).map_err(|e| {
                    refused(match e {
                        policy::PolicyError::Nickel(_) => {
                            format!("{e}\nthe policy was refused; nothing was deployed")
                        }
                        other => format!("policy refused: {other}"),
                    })
                })?,
            )
        }
        None => None,
    };
    let settings = plan::resolve(
        request.deadline_ms,
        request.grace_ms,
        request.drain_ms,
        policy.as_ref(),
    );
    let root = Root::new(request.root.clone());
    if !root.0.is_dir() {
        return Err(refused(format!(
            "root {} is not a folder",
            root.0.display()
        )));
    }
    let executable = root.executable(&request.version, &request.service);
    check_executable(&executable, &request)?;

    runtime()?.block_on(async {
        let _lock = lock::acquire(&root.lock_path()).map_err(refused)?;
        recover::recover(&root).await?;
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
        gate_and_finish(&root, &request, &settings, live).await
    })
}

fn check_executable(path: &std::path::Path, request: &Request) -> Result<(), DeployError> {
    use std::os::unix::fs::PermissionsExt;
    match std::fs::metadata(path) {
        Err(_) => Err(refused(format!(
            "release {} of {} not found: {} does not exist",
            request.version,
            request.service,
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
) -> Result<Outcome, DeployError> {
    let failed = |what: &str, e: std::io::Error| DeployError::Failed(format!("{what}: {e}"));
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
    };
    root.write_candidate(&candidate).map_err(|e| {
        refused(format!(
            "cannot write {}: {e}",
            root.candidate_path().display()
        ))
    })?;

    let output = root.output_path(&request.version, &request.service);
    let executable = root.executable(&request.version, &request.service);
    let release_dir = root.release_dir(&request.version);
    let mut child = match process::spawn(&process::Launch {
        executable: &executable,
        workdir: &release_dir,
        output: &output,
        port: request.port,
        version: &request.version,
        token: &candidate.token,
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
    let pid = child.id().map(|p| p as i32).unwrap_or(0);
    let identity = Identity::of(pid);
    candidate.pid = Some(pid);
    candidate.start_time = identity.map(|i| i.start_time);
    candidate.stage = Stage::Running;
    root.write_candidate(&candidate)
        .map_err(|e| failed("cannot record the candidate", e))?;
    log(
        root,
        &candidate,
        "candidate_started",
        format!(
            "port {}; pid {pid}; deadline {} ms ({}); poll {} ms",
            request.port,
            settings.deadline.as_millis(),
            settings.deadline_source,
            settings.poll.as_millis()
        ),
        None,
    )?;

    let gate = run_gate(&mut child, request, settings, started).await;
    let elapsed = started.elapsed();
    let identity = identity.unwrap_or(Identity { pid, start_time: 0 });
    match plan::action(&gate.verdict, settings.on_stall) {
        Action::Promote => {
            let detail = format!(
                "ready after {} ms ({} probe{})",
                elapsed.as_millis(),
                gate.probes,
                if gate.probes == 1 { "" } else { "s" }
            );
            switch(root, &candidate, identity, live, detail, elapsed).await
        }
        Action::Escalate => {
            candidate.stage = Stage::Escalated;
            root.write_candidate(&candidate)
                .map_err(|e| failed("cannot record the escalation", e))?;
            log(
                root,
                &candidate,
                "escalated",
                format!(
                    "{}; left running on port {} (pid {pid}) for a person: rollgate promote {svc} --root {root} or rollgate abort {svc} --root {root}; last probes: {}",
                    plan::reason(&gate.verdict, settings),
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
            let reason = plan::reason(&gate.verdict, settings);
            let context = format!("last probes: {}", gate.last_probes());
            // An exited candidate was reaped by the gate: its pid is no longer ours to signal.
            let unreaped = match gate.verdict {
                Verdict::Exited(_) => None,
                _ => Some(&mut child),
            };
            roll_back(
                root,
                &candidate,
                identity,
                unreaped,
                live.as_ref(),
                settings.grace,
                reason,
                context,
                elapsed,
            )
            .await?;
            Ok(Outcome::RolledBack)
        }
    }
}

/// What the gate saw.
struct Gate {
    verdict: Verdict,
    probes: u32,
    recent: VecDeque<Probe>,
}

impl Gate {
    fn last_probes(&self) -> String {
        if self.recent.is_empty() {
            return "none".into();
        }
        self.recent
            .iter()
            .map(Probe::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Waits for the first of: a 200 from `/readyz`, the candidate's exit, the deadline, or a
/// signal to rollgate. Probes run one at a time every `poll`; the deadline and the exit are
/// watched the whole time, so neither waits for a probe.
async fn run_gate(
    child: &mut tokio::process::Child,
    request: &Request,
    settings: &Settings,
    started: Instant,
) -> Gate {
    let deadline = tokio::time::Instant::from_std(started + settings.deadline);
    let mut sigterm = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut sigint = signal(SignalKind::interrupt()).expect("SIGINT handler");
    let mut ticker = tokio::time::interval(settings.poll);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut in_flight: Option<std::pin::Pin<Box<dyn std::future::Future<Output = Probe>>>> = None;
    let mut gate = Gate {
        verdict: Verdict::Stalled,
        probes: 0,
        recent: VecDeque::new(),
    };
    let progress = progress::Progress::new(&request.version, settings.deadline);
    loop {
        let event = tokio::select! {
            biased;
            status = child.wait() => Event::Exited(match status {
                Ok(status) => status.to_string(),
                Err(e) => format!("an unknown status ({e})"),
            }),
            _ = sigterm.recv() => Event::Signal("SIGTERM"),
            _ = sigint.recv() => Event::Signal("SIGINT"),
            _ = tokio::time::sleep_until(deadline) => Event::DeadlinePassed,
            probe = async { in_flight.as_mut().expect("guarded").await }, if in_flight.is_some() => {
                in_flight = None;
                gate.probes += 1;
                if gate.recent.len() == PROBES_KEPT {
                    gate.recent.pop_front();
                }
                gate.recent.push_back(probe.clone());
                Event::Probed(probe)
            }
            _ = ticker.tick(), if in_flight.is_none() => {
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                in_flight = Some(Box::pin(probe::readyz(request.port, left.min(PROBE_TIMEOUT))));
                continue;
            }
        };
        progress.show(started.elapsed(), gate.probes, gate.recent.back());
        if let Some(verdict) = plan::decide(&event) {
            progress.finish();
            gate.verdict = verdict;
            return gate;
        }
    }
}

/// The switch: the new pointer in one rename, then the old release drained (if a proxy serves
/// the root) and stopped with the grace recorded for this deploy, then the log.
async fn switch(
    root: &Root,
    candidate: &Candidate,
    identity: Identity,
    live: Option<Pointer>,
    detail: String,
    elapsed: Duration,
) -> Result<Outcome, DeployError> {
    let pointer = Pointer {
        service: candidate.service.clone(),
        version: candidate.version.clone(),
        port: candidate.port,
        pid: identity.pid,
        start_time: identity.start_time,
        promoted_at: journal::now(),
    };
    root.write_pointer(&pointer).map_err(|e| {
        DeployError::Failed(format!(
            "cannot switch {}: {e}; the old pointer is intact and candidate {} is still running",
            root.pointer_path().display(),
            candidate.version
        ))
    })?;
    // A proxy serving this root finishes the old release's requests before it is stopped.
    let drained = match &live {
        Some(old) => {
            let drain = Duration::from_millis(candidate.drain_ms);
            let answer = crate::proxy::drain::request(&root.0, old.port, drain).await;
            format!("{answer}; ")
        }
        None => String::new(),
    };
    let old = stop_previous(live.as_ref(), Duration::from_millis(candidate.grace_ms)).await;
    log(
        root,
        candidate,
        "promoted",
        format!("{detail}; {drained}{old}"),
        Some(elapsed),
    )?;
    root.clear_candidate().map_err(|e| {
        DeployError::Failed(format!(
            "promoted, but cannot clear the candidate record: {e}"
        ))
    })?;
    Ok(Outcome::Promoted)
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

/// The rollback: stop the candidate's whole group, check the old release still answers, log
/// why. The pointer is never touched.
#[allow(clippy::too_many_arguments)]
async fn roll_back(
    root: &Root,
    candidate: &Candidate,
    identity: Identity,
    child: Option<&mut tokio::process::Child>,
    live: Option<&Pointer>,
    grace: Duration,
    reason: String,
    context: String,
    elapsed: Duration,
) -> Result<(), DeployError> {
    let stopped = process::stop_group(identity, grace).await;
    if let Some(child) = child {
        // The exited leader is our zombie until reaped, so its pid cannot have been reused:
        // clear any stragglers left in its group, then reap it.
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(identity.pid),
            nix::sys::signal::Signal::SIGKILL,
        );
        let _ = tokio::time::timeout(Duration::from_secs(2), child.wait()).await;
    }
    let old = match live {
        None => "no release was live".to_string(),
        Some(old) => match probe::readyz(old.port, PROBE_TIMEOUT).await {
            Probe::Status(200) => format!("old release {} still answering", old.version),
            other => format!(
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
    log(root, candidate, "rolled_back", detail, Some(elapsed))?;
    root.clear_candidate().map_err(|e| {
        DeployError::Failed(format!(
            "rolled back, but cannot clear the candidate record: {e}"
        ))
    })
}

fn log(
    root: &Root,
    candidate: &Candidate,
    event: &str,
    detail: String,
    elapsed: Option<Duration>,
) -> Result<(), DeployError> {
    journal::append(
        &root.log_path(),
        &journal::Entry {
            ts: journal::now(),
            event,
            version: &candidate.version,
            detail,
            service: &candidate.service,
            port: Some(candidate.port),
            pid: candidate.pid,
            elapsed_ms: elapsed.map(|e| e.as_millis() as u64),
        },
    )
    .map_err(|e| {
        DeployError::Failed(format!(
            "cannot append to {}: {e}",
            root.log_path().display()
        ))
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
