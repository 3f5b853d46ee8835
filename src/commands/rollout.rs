//! `rollgate rollout`: N replicas moved in waves by the engine. Read [`rollout`] top to bottom:
//! refuse what can be refused, plan the waves from the pool as it is, then let the executor
//! move it. `rollout pause|resume|abort|status` are here too ([`control`], [`status`]).

use std::path::PathBuf;
use std::time::Duration;

use super::preflight;
use crate::engine::{control, record, recover, run, settings, state, step, view as render};
use crate::error::{self, Error};
use crate::host::signals::Signals;
use crate::host::state::Root;
use crate::host::{journal, lock};
use crate::policy::{self, EvalOptions};
use crate::release;
use crate::render::{table::Layout, Format};
use control::{Ask, Request as ControlRequest};
use run::{Context, Executor};
use state::{Phase, Rollout};
use step::Event;

/// `rollgate rollout SVC VERSION`.
#[derive(Debug, Clone)]
pub struct Request {
    pub service: String,
    pub version: String,
    pub root: PathBuf,
    pub policy: Option<PathBuf>,
    pub policy_entry: Option<String>,
    pub eval: EvalOptions,
    pub args: settings::Args,
}

/// How a rollout command ended; the exit code follows from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RolloutOutcome {
    Completed(String),
    /// Aborted (by a failure, the release deadline or a person), or rolled back.
    Aborted(String),
    /// Paused, by itself or by a person: waiting for `resume` or `abort`.
    Paused(String),
    /// `pause`, `resume` or `abort` did what it was asked.
    Done(String),
}

impl RolloutOutcome {
    pub fn exit_code(&self) -> u8 {
        match self {
            RolloutOutcome::Completed(_) | RolloutOutcome::Done(_) => error::SUCCESS,
            RolloutOutcome::Aborted(_) => error::FAILED,
            RolloutOutcome::Paused(_) => error::WAITING,
        }
    }

    pub fn message(&self) -> &str {
        match self {
            RolloutOutcome::Completed(m)
            | RolloutOutcome::Aborted(m)
            | RolloutOutcome::Paused(m)
            | RolloutOutcome::Done(m) => m,
        }
    }
}

fn refused(message: impl Into<String>) -> Error {
    Error::Refused(message.into())
}

/// The request's policy entry, checked by the contract (None without `--policy`).
fn load_policy(request: &Request) -> Result<Option<policy::RolloutSettings>, Error> {
    preflight::policy_entry(
        request.policy.as_deref(),
        request.policy_entry.as_deref(),
        &request.service,
        &request.eval,
    )
}

/// `rollgate rollout ... --dry-run`: the report, and whether the rollout would be refused.
pub fn dry_run(request: &Request) -> (String, bool) {
    let policy = load_policy(request).map_err(|e| e.to_string());
    match super::dry_run::rollout(request, policy) {
        Ok(report) => (report, false),
        Err(e) => (e.to_string(), true),
    }
}

/// The whole rollout.
pub fn rollout(request: Request) -> Result<RolloutOutcome, Error> {
    crate::host::names::check_name("service", &request.service).map_err(refused)?;
    crate::host::names::check_name("version", &request.version).map_err(refused)?;
    // The policy is evaluated in a forked sandbox: before the runtime starts any thread.
    let policy = load_policy(&request)?;
    let hooks =
        preflight::policy_hooks(policy.as_ref(), request.policy.as_deref()).map_err(refused)?;
    let (root, executable) =
        preflight::release_executable(&request.root, &request.version, &request.service)?;

    crate::engine::runtime()?.block_on(async {
        let mut signals = Signals::install().map_err(refused)?;
        let _lock = lock::acquire(&root.lock_path()).map_err(refused)?;
        recover::recover(&root).await?;
        let previous = state::load(&root).map_err(refused)?;
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
        let baseline = settings::baseline(&root, &request.service).map_err(refused)?;
        let resolved = settings::resolve(
            &request.args,
            policy.as_ref(),
            previous.as_ref(),
            &baseline,
        )
        .map_err(refused)?;
        let now = journal::now();
        let Some(mut planned) = settings::plan(
            &request.service,
            &request.version,
            &resolved,
            &baseline,
            now,
        ) else {
            return Ok(RolloutOutcome::Completed(format!(
                "every replica of {} already runs {}; nothing to do",
                request.service, request.version
            )));
        };
        // Under the lock, like a single deploy: a signed release must pass before anything starts.
        let admitted = release::admit(&root.0, &request.service, &request.version, chrono::Utc::now())
            .map_err(refused)?;
        let (executable, signed) = match admitted {
            Some(a) => (a.executable, Some(a.signed)),
            None => (executable, None),
        };
        planned.signed = signed.clone();
        planned.hooks = hooks;
        let facts = crate::host::hooks::Facts {
            service: planned.service.clone(),
            version: planned.to.clone(),
            previous_version: planned.from.clone(),
            ports: Vec::new(),
            previous_ports: planned.slots.iter().filter_map(|s| Some(s.live.as_ref()?.port)).collect(),
            reason: None,
        };
        if let Some(Err(e)) = planned.hooks.run(crate::host::hooks::Hook::PreDeploy, &root.0, &facts).await {
            return Err(refused(format!("{e}; the rollout was refused, nothing was started")));
        }
        state::save(&root, &planned).map_err(refused)?;
        let _ = std::fs::remove_file(root.0.join(control::REQUEST_FILE));
        record::append(
            &root,
            &journal::Entry {
                ts: now,
                token: Some(&planned.id),
                sequence: signed.as_ref().map(|s| s.sequence),
                manifest_sha256: signed.as_ref().map(|s| s.manifest_sha256.as_str()),
                ..journal::Entry::new(
                    journal::LogEvent::RolloutStarted,
                    &planned.to,
                    &planned.service,
                    settings::describe(&planned),
                )
            },
        )?;
        // A root that had only `current` is now served by the replica set.
        record::write_pool(&root, &planned)?;
        let context = Context {
            root: root.clone(),
            executable,
        };
        let mut executor = Executor::new(context, planned);
        let phase = executor.run(Event::Tick, &mut signals).await?;
        Ok(ending(&root, phase, &request.service))
    })
    .inspect(|outcome| {
        if matches!(outcome, RolloutOutcome::Completed(_)) {
            super::releases::prune_after_promotion(&request.root, policy.as_ref());
        }
    })
}

/// The outcome a finished executor run reports.
fn ending(root: &Root, phase: Phase, service: &str) -> RolloutOutcome {
    let rollout = match state::load(root) {
        Ok(Some(rollout)) => rollout,
        _ => return RolloutOutcome::Aborted("the rollout's state could not be read back".into()),
    };
    let line = render::line(&rollout);
    match phase {
        Phase::Completed => RolloutOutcome::Completed(format!("completed: {line}")),
        Phase::Aborted => RolloutOutcome::Aborted(format!(
            "aborted: {}; {line}",
            rollout
                .abort_cause
                .as_ref()
                .map_or("no cause recorded".into(), |c| c.reason.clone())
        )),
        Phase::Paused | Phase::Running => RolloutOutcome::Paused(format!(
            "paused: {}; {line}\nresume with `rollgate rollout resume {service} --root {root}` or stop with `rollgate rollout abort {service} --root {root} [--rollback]`",
            rollout.pause_reason.as_deref().unwrap_or("no reason recorded"),
            root = root.0.display()
        )),
    }
}

/// `rollgate rollout pause|resume|abort`.
pub fn control(
    service: &str,
    root: PathBuf,
    ask: Ask,
    reason: Option<String>,
    rollback: bool,
) -> Result<RolloutOutcome, Error> {
    let reason = reason.unwrap_or_else(|| format!("{} by a person", past(ask)));
    control::check_reason(&reason).map_err(refused)?;
    let root = Root::existing(root).map_err(refused)?;
    let request = ControlRequest {
        rollout: String::new(),
        ask,
        reason,
        rollback,
    };
    crate::engine::runtime()?.block_on(async {
        let mut signals = Signals::install().map_err(refused)?;
        changeable(&root, service, ask)?;
        let lock = loop {
            match lock::acquire(&root.lock_path()) {
                Ok(lock) => break lock,
                // The rollout's own rollgate holds the lock: ask it.
                Err(_) => match ask_the_executor(&root, service, &request).await? {
                    Asked::Done(outcome) => return Ok(outcome),
                    // It ended (paused, say) without taking the request: act here.
                    Asked::Left => continue,
                },
            }
        };
        // Nobody drives the rollout: this command does, after what a crash may have left. A
        // request left for a rollgate that exited before taking it is void now.
        let _ = std::fs::remove_file(root.0.join(control::REQUEST_FILE));
        // An ended rollout is settled first; then it is refused as ended, like any other (the
        // request lost the race with the rollout's end).
        if let Some(ended) = state::load(&root)
            .map_err(refused)?
            .filter(|r| r.ended_unsettled())
        {
            recover::finish(&root, ended).await?;
        }
        let saved = changeable(&root, service, ask)?;
        let (executor, redo) = recover::adopt(&root, saved, ask == Ask::Resume).await?;
        let phase_before = executor.rollout().phase;
        if ask == Ask::Pause && phase_before == Phase::Paused {
            return Err(refused("the rollout is already paused"));
        }
        let event = match (ask, phase_before) {
            // Its rollgate died while it ran: resuming is continuing.
            (Ask::Resume, Phase::Running) => Event::Tick,
            _ => request.event(),
        };
        let mut executor = executor.redo(redo).await?;
        let phase = executor.run(event, &mut signals).await?;
        drop(lock);
        Ok(match (ask, phase) {
            (Ask::Resume, phase) => ending(&root, phase, service),
            _ => RolloutOutcome::Done(format!(
                "{}: {}",
                past(ask),
                render::line(
                    &state::load(&root)
                        .map_err(refused)?
                        .ok_or_else(|| refused("the rollout's state is gone"))?
                )
            )),
        })
    })
}

fn past(ask: Ask) -> &'static str {
    match ask {
        Ask::Pause => "paused",
        Ask::Resume => "resumed",
        Ask::Abort => "aborted",
    }
}

/// The rollout a control command may change: one of this service that runs or is paused.
fn changeable(root: &Root, service: &str, ask: Ask) -> Result<Rollout, Error> {
    let Some(saved) = state::load(root).map_err(refused)? else {
        return Err(refused(format!(
            "no rollout under {}: nothing to {}",
            root.0.display(),
            ask.as_str()
        )));
    };
    if saved.service != service {
        return Err(refused(format!(
            "the rollout under {} is of {}, not {service}",
            root.0.display(),
            saved.service
        )));
    }
    if saved.single.is_some() {
        return Err(refused(format!(
            "{} under {} is a single deploy, not a rollout: an escalated one is finished with `rollgate promote {service} --root {root}` or `rollgate abort {service} --root {root}`",
            saved.to,
            root.0.display(),
            root = root.0.display()
        )));
    }
    // One that ended with effects still owed is settled first, under the lock.
    if saved.is_over() && !saved.unsettled {
        return Err(refused(format!(
            "rollout {} to {} is {}; only a running or paused rollout can be {}",
            saved.id,
            saved.to,
            if saved.phase == Phase::Completed {
                "completed"
            } else {
                "aborted"
            },
            past(ask)
        )));
    }
    Ok(saved)
}

/// What asking the running rollgate came to.
enum Asked {
    Done(RolloutOutcome),
    /// It let go of the root without taking the request (which is withdrawn).
    Left,
}

/// Leaves the request for the running rollgate and waits until the state shows it was taken.
async fn ask_the_executor(
    root: &Root,
    service: &str,
    request: &ControlRequest,
) -> Result<Asked, Error> {
    let saved = changeable(root, service, request.ask)?;
    match (request.ask, saved.phase) {
        (Ask::Resume, Phase::Running) => {
            return Err(refused(format!(
                "rollout {} is running, not paused",
                saved.id
            )))
        }
        (Ask::Pause, Phase::Paused) => return Err(refused("the rollout is already paused")),
        _ => {}
    }
    let request = &ControlRequest {
        rollout: saved.id.clone(),
        ..request.clone()
    };
    control::send(root, request).map_err(refused)?;
    // Long enough for the executor to finish the action in hand (a drain, a stop).
    let limit = Duration::from_millis(saved.settings.drain_ms + saved.settings.grace_ms + 10_000);
    let asked = tokio::time::Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        // Looked at in this order: once the lock is seen free, no rollgate holds the rollout
        // that could still take the request, so whether it was taken, and the state, are final.
        // (Looked at the other way round, a rollgate could take the request, act on it and exit
        // in between, and its request would read as never taken: a done abort refused.)
        let free = lock::is_free(&root.lock_path());
        let taken = !control::waiting(root);
        let now = state::load(root).map_err(refused)?;
        if now.as_ref().is_some_and(|now| now.id != saved.id) {
            return Err(refused(format!(
                "rollout {} ended before it took the {} request; {} under {} is another",
                saved.id,
                request.ask.as_str(),
                now.map_or(String::new(), |n| n.id),
                root.0.display()
            )));
        }
        if let Some(now) = now.filter(|_| taken) {
            let expected = match request.ask {
                Ask::Pause => now.phase != Phase::Running,
                Ask::Resume => true,
                Ask::Abort => now.is_over(),
            };
            if expected {
                return Ok(Asked::Done(RolloutOutcome::Done(format!(
                    "{}: {}",
                    past(request.ask),
                    render::line(&now)
                ))));
            }
        }
        if !taken && free {
            let _ = std::fs::remove_file(root.0.join(control::REQUEST_FILE));
            return Ok(Asked::Left);
        }
        if asked.elapsed() > limit {
            return Err(Error::Failed(format!(
                "the rollout's rollgate did not take the {} request within {} ms; it stays in {}",
                request.ask.as_str(),
                limit.as_millis(),
                root.0.join(control::REQUEST_FILE).display()
            )));
        }
    }
}

/// `rollgate rollout status`.
pub fn status(
    service: &str,
    root: PathBuf,
    format: Format,
    layout: Layout,
) -> Result<String, Error> {
    let root = Root::existing(root).map_err(refused)?;
    match state::load(&root).map_err(refused)? {
        Some(rollout) if rollout.service == service => {
            Ok(render::status(&rollout, format, layout, journal::now()))
        }
        Some(rollout) => Err(refused(format!(
            "the rollout under {} is of {}, not {service}",
            root.0.display(),
            rollout.service
        ))),
        None => Err(refused(format!(
            "no rollout under {} yet",
            root.0.display()
        ))),
    }
}
