//! A person's word about a run in flight, and the background watcher's: [`ask`] and [`watch`].
//!
//! A rollout's `pause`, `resume` and `abort` are asked of the rollgate that drives it (a
//! request file it takes within its control poll, see `control`) or, when none holds the
//! root's lock, acted on here under the lock after what a crash left is recovered. An
//! escalated deploy's `promote` (accept) and `abort` (reject) are one more event for the same
//! planner and executor. Either way the engine alone changes the state; a command only asks.

use std::path::PathBuf;
use std::time::Duration;

use super::control::{self, Request as ControlRequest};
use super::outcome::{DeployEnding, Ending, Outcome};
use super::recover;
use super::run::{Executor, Redo};
use super::start::rollout_ending;
use super::state::{self, Phase, Rollout};
use super::step::Event;
use super::{runtime, view};
use crate::error::{refused, Error};
use crate::host::journal;
use crate::host::lock;
use crate::host::signals::Signals;
use crate::host::state::Root;

/// What a person asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ask {
    /// Pause a rollout (`rollout pause`), with the reason its log and status show.
    Pause { reason: Option<String> },
    /// Resume a paused rollout, or continue one whose rollgate died.
    Resume,
    /// Abort a rollout, leaving the replicas moved so far (or moving them back: `rollback`).
    Abort {
        reason: Option<String>,
        rollback: bool,
    },
    /// Promote an escalated deploy (`rollgate promote`).
    Accept,
    /// Abort an escalated deploy (`rollgate abort`): the candidate is stopped.
    Reject,
}

/// Acts on a person's word about the run of `service` under `root`.
pub fn ask(root: PathBuf, service: &str, ask: Ask) -> Result<Outcome, Error> {
    match ask {
        Ask::Pause { reason } => control_rollout(service, root, control::Ask::Pause, reason, false),
        Ask::Resume => control_rollout(service, root, control::Ask::Resume, None, false),
        Ask::Abort { reason, rollback } => {
            control_rollout(service, root, control::Ask::Abort, reason, rollback)
        }
        Ask::Accept => finish_escalated(service, root, true),
        Ask::Reject => finish_escalated(service, root, false),
    }
}

/// `rollgate rollout pause|resume|abort`.
fn control_rollout(
    service: &str,
    root: PathBuf,
    ask: control::Ask,
    reason: Option<String>,
    rollback: bool,
) -> Result<Outcome, Error> {
    let reason = reason.unwrap_or_else(|| format!("{} by a person", past(ask)));
    control::check_reason(&reason)?;
    let root = Root::existing(root)?;
    let request = ControlRequest {
        rollout: String::new(),
        ask,
        reason,
        rollback,
    };
    runtime()?.block_on(async {
        let mut signals = Signals::install()?;
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
        if let Some(ended) = state::load(&root)?.filter(|r| r.ended_unsettled()) {
            recover::finish(&root, ended).await?;
        }
        let saved = changeable(&root, service, ask)?;
        let (executor, redo) = recover::adopt(&root, saved, ask == control::Ask::Resume).await?;
        let phase_before = executor.rollout().phase;
        if ask == control::Ask::Pause && phase_before == Phase::Paused {
            return Err(refused("the rollout is already paused"));
        }
        let event = match (ask, phase_before) {
            // Its rollgate died while it ran: resuming is continuing.
            (control::Ask::Resume, Phase::Running) => Event::Tick,
            _ => request.event(),
        };
        let mut executor = executor.redo(redo).await?;
        let phase = executor.run(event, &mut signals).await?;
        drop(lock);
        Ok(match (ask, phase) {
            (control::Ask::Resume, phase) => rollout_ending(&root, phase, service),
            _ => done(
                ask,
                &state::load(&root)?.ok_or_else(|| refused("the rollout's state is gone"))?,
            ),
        })
    })
}

/// A person's word taken: what it did, with the rollout's line as it is now.
fn done(ask: control::Ask, now: &Rollout) -> Outcome {
    Outcome::rollout(Ending::Done, format!("{}: {}", past(ask), view::line(now)))
}

fn past(ask: control::Ask) -> &'static str {
    match ask {
        control::Ask::Pause => "paused",
        control::Ask::Resume => "resumed",
        control::Ask::Abort => "aborted",
    }
}

/// The rollout a control command may change: one of this service that runs or is paused.
fn changeable(root: &Root, service: &str, ask: control::Ask) -> Result<Rollout, Error> {
    let Some(saved) = state::load(root)? else {
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
    Done(Outcome),
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
        (control::Ask::Resume, Phase::Running) => {
            return Err(refused(format!(
                "rollout {} is running, not paused",
                saved.id
            )))
        }
        (control::Ask::Pause, Phase::Paused) => {
            return Err(refused("the rollout is already paused"))
        }
        _ => {}
    }
    let request = &ControlRequest {
        rollout: saved.id.clone(),
        ..request.clone()
    };
    control::send(root, request)?;
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
        let now = state::load(root)?;
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
                control::Ask::Pause => now.phase != Phase::Running,
                control::Ask::Resume => true,
                control::Ask::Abort => now.is_over(),
            };
            if expected {
                return Ok(Asked::Done(done(request.ask, &now)));
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

/// `rollgate promote` / `rollgate abort`: finish an escalated deploy by hand.
fn finish_escalated(service: &str, root: PathBuf, promote: bool) -> Result<Outcome, Error> {
    crate::host::names::check_name("service", service)?;
    let root = Root::existing(root)?;
    runtime()?.block_on(async {
        // Installed first and kept to the end: a Ctrl-C or a lost terminal between the rename
        // and the log line must not leave a switch half-recorded.
        let _signals = Signals::install()?;
        let _lock = lock::acquire(&root.lock_path())?;
        let held = state::load(&root)?.filter(|r| r.unsettled_deploy() && r.slot(0).held);
        if held.is_none() {
            // A promote or abort that died after its decision (or any other dead rollgate's
            // work) is finished first; then there is nothing left to decide.
            recover::recover(&root).await?;
        }
        let rollout = match held {
            Some(r) if r.service == service => r,
            Some(r) => {
                return Err(refused(format!(
                    "the escalated candidate under {} is for service {}, not {service}",
                    root.0.display(),
                    r.service
                )))
            }
            None => {
                return Err(refused(format!(
                    "no escalated deploy of {service} waits under {}",
                    root.0.display()
                )))
            }
        };
        decide_escalated(&root, rollout, promote)
            .await
            .map(Outcome::deploy)
    })
}

/// The person's decision on a held deploy, as one event for its executor.
async fn decide_escalated(
    root: &Root,
    rollout: Rollout,
    promote: bool,
) -> Result<DeployEnding, Error> {
    let service = rollout.service.clone();
    // From a file: a start time in the future, far past or not a number gives zero.
    let elapsed_ms = Duration::try_from_secs_f64(journal::now() - rollout.started_at)
        .map_or(0, |d| d.as_millis() as u64);
    let held = rollout.new_process().cloned();
    // An earlier promote renamed the pointer and was interrupted: the candidate is live.
    // Finish that switch; never stop the release the pointer names.
    if recover::is_switched(root, &rollout)? {
        if !promote {
            return Err(refused(format!(
                "the switch to {v} already happened: current names it (pid {pid}), so aborting would stop the live release. \
                 Run `rollgate promote {service} --root {root}` to finish the switch, then roll forward: deploy the release you want live",
                v = rollout.to,
                pid = held.as_ref().map_or(0, |h| h.pid),
                root = root.0.display()
            )));
        }
        let detail =
            "promoted by hand; the switch had happened in an interrupted promote, finished now";
        recover::complete_switch(
            Executor::of_saved(root, rollout),
            detail.into(),
            Some(elapsed_ms),
        )
        .await?;
        return Ok(DeployEnding::Promoted);
    }
    let mut executor = Executor::of_saved(root, rollout);
    let running = held.as_ref().is_some_and(|h| h.identity().is_running());
    if let Some(s) = executor.rollout_mut().single.as_mut() {
        s.gate_elapsed_ms = Some(if running { elapsed_ms } else { 0 });
    }
    let (event, ending) = if !running {
        executor.words_mut().context = Some("found by a person".into());
        let reason = "candidate exited while escalated".to_string();
        (
            Event::Abort {
                reason,
                rollback: false,
            },
            DeployEnding::RolledBack,
        )
    } else if promote {
        let (_, answer) = executor.subject_for_new().check().await;
        if let Some(s) = executor.rollout_mut().single.as_mut() {
            s.gate_detail = Some(format!(
                "promoted by hand after escalation (probe: {answer})"
            ));
        }
        (Event::Accept { slot: 0 }, DeployEnding::Promoted)
    } else {
        executor.words_mut().context = Some("decided by a person".into());
        let reason = "aborted by hand after escalation".to_string();
        (
            Event::Abort {
                reason,
                rollback: false,
            },
            DeployEnding::Aborted,
        )
    };
    executor.handle(event).await?;
    executor.run_post_hook().await;
    match executor.rollout().phase {
        Phase::Completed | Phase::Aborted => Ok(ending),
        _ => Err(Error::Failed(
            "the escalated deploy did not end; its state stays for the next command".into(),
        )),
    }
}

/// `rollgate watch SVC --token T` (started by `deploy --no-wait`): waits for the deployer to
/// let go of the lock, then finishes the watch it recorded, if that deploy is still watching.
/// The watch is the last soak of the deploy's one-replica rollout: after the switch the new
/// release is watched with the previous one kept as the proxy's fallback, and only a release
/// that passed it is logged `promoted`.
pub fn watch(root: PathBuf, service: &str, token: &str) -> Result<Outcome, Error> {
    let root = Root::existing(root)?;
    runtime()?.block_on(async {
        let mut signals = Signals::install()?;
        let started = std::time::Instant::now();
        let _lock = loop {
            match lock::acquire(&root.lock_path()) {
                Ok(lock) => break lock,
                Err(_) if started.elapsed() < Duration::from_secs(30) => {
                    tokio::time::sleep(Duration::from_millis(20)).await
                }
                Err(e) => return Err(e.into()),
            }
        };
        let watching = state::load(&root)?.filter(|r| {
            r.id == token
                && r.service == service
                && r.unsettled_deploy()
                && r.phase == Phase::Running
                && r.soak_until.is_some()
        });
        // Someone else finished this watch first.
        let Some(rollout) = watching else {
            return Ok(Outcome::deploy(DeployEnding::Aborted));
        };
        let mut executor = Executor::of_saved(&root, rollout)
            .redo(Redo::default())
            .await?;
        Ok(Outcome::deploy(
            match executor.run(Event::Tick, &mut signals).await? {
                Phase::Completed => DeployEnding::Promoted,
                _ => DeployEnding::RolledBack,
            },
        ))
    })
}
